//! The I/O task of one worker: the only reader of its event pipe, stdout, stderr and
//! pidfd, so output ordering against `done` is decided in one place. When the process
//! ends it drains what is left in the pipes, reaps the child, and completes every
//! pending call with the death message — a dead worker never leaves a call waiting.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot, watch};

use super::cell::{CellSink, InstallAnswer, OutStream};
use super::error::exit_words;
use super::protocol::{self, Event};
use super::snapshot::Snapshot;
use super::snapshot::take_snapshot;
use crate::sandbox::{ExitReport, Pidfd, ResolvedPolicy, SandboxedChild, Termination, signal_name};

/// Output that arrives while no cell runs is kept (up to this much) for the next cell.
const ORPHAN_CAP: usize = 1 << 20;
/// Longest protocol line accepted; the worker caps what it sends far below this.
const MAX_LINE: usize = 64 << 20;
/// How much of stderr to keep for the death message of a worker that never got ready.
const STARTUP_TAIL: usize = 2048;

/// Receives a worker's snapshots: `(worker pid, cell, the snapshot or why there is none)`.
pub(crate) type SnapshotHook =
    Arc<dyn Fn(u32, u64, Result<Snapshot, String>) + Send + Sync + 'static>;

/// The answer to one call: the matching event, or the words saying how the worker died.
#[derive(Debug)]
pub(crate) enum Reply {
    Event(Event),
    Died(Arc<str>),
}

/// Something a call holds until the worker answers it or dies (the session's hold on
/// the worker's main thread), dropped then — even if the caller stopped waiting: the
/// next cell never starts while this one still runs.
pub(crate) type Hold = Box<dyn Send>;

pub(super) struct Pending {
    pub(super) tx: oneshot::Sender<Reply>,
    pub(super) sink: Option<Arc<dyn CellSink>>,
    pub(super) hold: Option<Hold>,
}

impl Pending {
    /// Answer the call, releasing its hold first: the caller the answer wakes (on another
    /// thread) may start the next cell at once, and must not find the session busy
    /// because this thread has not yet dropped the hold of the cell that ended.
    pub(super) fn answer(self, reply: Reply) {
        let Pending { tx, hold, .. } = self;
        drop(hold);
        let _ = tx.send(reply);
    }
}

/// What the I/O task and the [`Worker`](super::worker::Worker) handle share, under
/// `Shared::state` (lock 2 of the order on [`Shared`]).
#[derive(Default)]
pub(super) struct State {
    pub(super) pending: HashMap<u64, Pending>,
    /// The call whose cell is running (receives stdout/stderr).
    pub(super) current: Option<u64>,
    /// The worker's interpreter (how messages name it, how it is interrupted).
    pub(super) language: super::interpreter::Language,
    pub(super) awaiting_input: Option<(u64, String)>,
    pub(super) orphan: VecDeque<(OutStream, Vec<u8>)>,
    pub(super) orphan_bytes: usize,
    pub(super) orphan_dropped: usize,
    pub(super) death: Option<Arc<str>>,
    pub(super) kill_reason: Option<String>,
    /// How the process ended, once reaped (for `signal`/`exit_code` in answers).
    pub(super) exit: Option<crate::sandbox::Termination>,
    pub(super) ready: bool,
    pub(super) startup_stderr: Vec<u8>,
    /// Where the worker's snapshots go (set once, right after the start).
    pub(super) on_snapshot: Option<SnapshotHook>,
}

/// One worker's shared half. Two locks, in this order (a lock is only taken while
/// holding the ones before it):
/// 1. `child`: the process handle, held while it is signalled (kill, stop, continue) or
///    taken to be reaped; `state` may be taken under it (a kill records its reason).
/// 2. `state`: calls, output attribution, death. A [`CellSink`] is called under it (the
///    output printed between cells, handed to the next call), so a sink's own locks come
///    after it; the snapshot hook and the answer to a call run after it is released.
///
/// The session takes both under its own `inner` (session.rs), never the other way round:
/// nothing here calls into the session while holding either.
pub(super) struct Shared {
    /// Lock 2.
    pub(super) state: Mutex<State>,
    /// For the amounts of limits in death messages.
    pub(super) policy: Arc<ResolvedPolicy>,
    /// Lock 1. `None` once reaped; kill only signals a child that has not been reaped,
    /// so a recycled pid is never hit.
    pub(super) child: Mutex<Option<SandboxedChild>>,
    pub(super) ready: watch::Sender<bool>,
    pub(super) pid: u32,
    /// A pidfd for a worker forked from a snapshot (not our child): how it is killed.
    pub(super) sigfd: Option<Pidfd>,
    /// What the network broker of the worker's process tree refused (proxy mode); each
    /// cell takes the lines added since the previous one.
    pub(super) denials: Option<crate::sandbox::parent::proxy::Denials>,
    /// A root replaced as the head by a branch: when it dies its group is not killed
    /// (its snapshots and the new head live on) and it is not reaped (so its process
    /// group id stays reserved until `Worker::end_tree`).
    pub(super) retired: AtomicBool,
    /// The snapshot control socket (snapshots on).
    pub(super) control: Option<OwnedFd>,
    /// The request channel (weak: the [`Worker`](super::worker::Worker) handle owns it,
    /// and its end closes the worker's fd 3), for answers the I/O side starts
    /// (`install_reply`).
    pub(super) requests: mpsc::WeakUnboundedSender<Vec<u8>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) async fn write_requests(
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
    mut pipe: pipe::Sender,
) {
    while let Some(line) = rx.recv().await {
        if pipe.write_all(&line).await.is_err() {
            break;
        }
    }
    // Dropping the pipe closes the worker's fd 3: its reader thread then ends the worker.
}

impl Shared {
    fn output(&self, stream: OutStream, data: &[u8]) {
        let mut st = lock(&self.state);
        if !st.ready && stream == OutStream::Stderr {
            st.startup_stderr.extend_from_slice(data);
            let excess = st.startup_stderr.len().saturating_sub(STARTUP_TAIL);
            st.startup_stderr.drain(..excess);
        }
        let sink = st
            .current
            .and_then(|id| st.pending.get(&id))
            .and_then(|p| p.sink.clone());
        match sink {
            Some(sink) => {
                drop(st);
                sink.output(stream, data);
            }
            None if st.orphan_bytes + data.len() <= ORPHAN_CAP => {
                st.orphan_bytes += data.len();
                st.orphan.push_back((stream, data.to_vec()));
            }
            None => {
                tracing::warn!(
                    bytes = data.len(),
                    "dropping worker output printed between cells (buffer full)"
                );
                st.orphan_dropped += data.len();
            }
        }
    }

    fn event(&self, ev: Event) {
        let mut st = lock(&self.state);
        match ev {
            Event::Ready { .. } => {
                st.ready = true;
                st.startup_stderr = Vec::new();
                drop(st);
                self.ready.send_replace(true);
            }
            Event::Snapshot {
                cell, held, note, ..
            } => {
                drop(st);
                let snap = match (&self.control, held) {
                    (Some(control), true) => {
                        take_snapshot(control, cell).map_err(|e| e.to_string())
                    }
                    (None, true) => Err("no control socket".to_string()),
                    (_, false) => Err(note.unwrap_or_else(|| "not taken".into())),
                };
                let hook = lock(&self.state).on_snapshot.clone();
                match hook {
                    Some(hook) => hook(self.pid, cell, snap),
                    None => drop(snap), // nobody keeps it: it exits
                }
            }
            Event::InputRequest { id, prompt, secret } => {
                let sink = st.pending.get(&id).and_then(|p| p.sink.clone());
                st.awaiting_input = Some((id, prompt.clone()));
                drop(st);
                match sink {
                    Some(sink) if secret => sink.awaiting_secret_input(&prompt),
                    Some(sink) => sink.awaiting_input(&prompt),
                    None => {}
                }
            }
            Event::InstallRequest { id, packages } => {
                let sink = st.pending.get(&id).and_then(|p| p.sink.clone());
                drop(st);
                let answer = InstallAnswer::new(id, self.requests.clone());
                match sink {
                    Some(sink) => sink.install_packages(packages, answer),
                    None => answer.send(false, "no cell of this session is running".into()),
                }
            }
            other => {
                let Some(id) = other.id() else { return };
                if st.current == Some(id) {
                    st.current = None;
                    st.awaiting_input = None;
                }
                if let Some(p) = st.pending.remove(&id) {
                    drop(st);
                    p.answer(Reply::Event(other));
                } else {
                    tracing::debug!(id, "worker answered a call nobody waits for");
                }
            }
        }
    }
}

/// Read everything already in a non-blocking pipe, without waiting for more.
fn drain_now(rx: &pipe::Receiver, stream: OutStream, shared: &Shared, buf: &mut [u8]) {
    loop {
        // SAFETY: reading into a buffer we own from a descriptor `rx` keeps open. A raw
        // read (not tokio's try_read) sees bytes whose readiness event is not yet known.
        let n = unsafe { libc::read(rx.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            return;
        }
        shared.output(stream, &buf[..n as usize]);
    }
}

/// The I/O task of one worker (see the module docs).
pub(super) async fn pump(
    shared: Arc<Shared>,
    events: pipe::Receiver,
    mut out: pipe::Receiver,
    mut err: pipe::Receiver,
    pidfd: AsyncFd<OwnedFd>,
) {
    let mut events = BufReader::with_capacity(1 << 16, events);
    let mut line = Vec::new();
    let mut obuf = vec![0u8; 1 << 16];
    let mut ebuf = vec![0u8; 1 << 16];
    let (mut ev_open, mut out_open, mut err_open) = (true, true, true);
    // Set when the event pipe closed: a worker that is still alive shortly after is broken.
    let mut broken_at: Option<tokio::time::Instant> = None;
    loop {
        let room = MAX_LINE.saturating_sub(line.len()) as u64;
        let next_line = async {
            let mut limited = (&mut events).take(room);
            limited.read_until(b'\n', &mut line).await
        };
        tokio::select! {
            r = next_line, if ev_open => match r {
                Ok(_) if line.ends_with(b"\n") => {
                    if !handle_line(&shared, &line, &out, &err, &mut obuf) {
                        // Corrupted: nothing after it is believed (a line that follows the
                        // garbage, a cell's end included, must not answer the call).
                        ev_open = false;
                    }
                    line.clear();
                }
                Ok(n) if n > 0 && line.len() >= MAX_LINE => {
                    // Only a broken (or tampered-with) worker sends this; never buffer it.
                    ev_open = false;
                    line = Vec::new();
                    kill_group(&shared, "it sent a protocol line over 64 MiB");
                }
                _ => {
                    // The worker closed its event pipe: it is ending, or broken.
                    ev_open = false;
                    broken_at = Some(tokio::time::Instant::now() + Duration::from_millis(500));
                }
            },
            _ = tokio::time::sleep_until(broken_at.unwrap_or_else(tokio::time::Instant::now)), if broken_at.is_some() => {
                broken_at = None;
                kill_group(&shared, "it closed its protocol pipe");
            },
            r = out.read(&mut obuf), if out_open => match r {
                Ok(n) if n > 0 => shared.output(OutStream::Stdout, &obuf[..n]),
                _ => out_open = false,
            },
            r = err.read(&mut ebuf), if err_open => match r {
                Ok(n) if n > 0 => shared.output(OutStream::Stderr, &ebuf[..n]),
                _ => err_open = false,
            },
            r = pidfd.readable() => {
                if let Ok(mut guard) = r {
                    guard.retain_ready();
                }
                break;
            }
        }
    }
    // The process is gone. What it wrote before dying is still in the pipes.
    let leftover = ev_open.then_some((events, line));
    drain_after_exit(&shared, leftover, &out, &err, &mut obuf, &mut ebuf);
    reap_and_answer(&shared).await;
}

/// Handle what a dead worker left in its pipes: the rest of the event stream (if it was
/// still open: `events` and the line read so far), then stdout and stderr.
fn drain_after_exit(
    shared: &Shared,
    leftover: Option<(BufReader<pipe::Receiver>, Vec<u8>)>,
    out: &pipe::Receiver,
    err: &pipe::Receiver,
    obuf: &mut [u8],
    ebuf: &mut [u8],
) {
    if let Some((events, mut line)) = leftover {
        let mut rest = Vec::new();
        let _ = drain_all(events.get_ref(), &mut rest);
        line.extend_from_slice(events.buffer());
        line.extend_from_slice(&rest);
        for l in line.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            if !handle_line(shared, l, out, err, obuf) {
                break;
            }
        }
    }
    drain_now(out, OutStream::Stdout, shared, obuf);
    drain_now(err, OutStream::Stderr, shared, ebuf);
}

/// Reap the dead worker (killing what it left in its group), say how it ended, and
/// answer every pending call with that.
async fn reap_and_answer(shared: &Shared) {
    let retired = shared.retired.load(Ordering::SeqCst);
    let child = if retired {
        None
    } else {
        lock(&shared.child).take()
    };
    let report = match child {
        Some(child) => {
            // Whatever the worker started dies with it (the group leader is not reaped
            // yet, so its process group id cannot have been reused).
            child.kill_all();
            Some(child.wait().await)
        }
        None => None,
    };
    let mut st = lock(&shared.state);
    st.exit = report.as_ref().map(|r| r.termination.clone());
    let mut message = match (st.kill_reason.as_deref(), &report) {
        (Some(reason), _) => format!("the Python worker was stopped: {reason}"),
        (None, Some(report)) => exit_words(report, &shared.policy),
        (None, None) => forked_exit_words(shared.pid, &shared.policy),
    };
    message = st.language.reword(&message);
    if !st.ready && !st.startup_stderr.is_empty() {
        message.push_str(&format!(
            " before it was ready; its last output: {}",
            String::from_utf8_lossy(&st.startup_stderr).trim()
        ));
    }
    let message: Arc<str> = message.into();
    st.death = Some(message.clone());
    st.current = None;
    st.awaiting_input = None;
    let pending: Vec<Pending> = st.pending.drain().map(|(_, p)| p).collect();
    drop(st);
    shared.ready.send_replace(false);
    for p in pending {
        p.answer(Reply::Died(message.clone()));
    }
}

fn drain_all(rx: &pipe::Receiver, into: &mut Vec<u8>) -> std::io::Result<()> {
    let mut buf = [0u8; 8192];
    loop {
        // SAFETY: see drain_now.
        let n = unsafe { libc::read(rx.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            return Ok(());
        }
        into.extend_from_slice(&buf[..n as usize]);
    }
}

/// Act on one event line; `false` when it is not a protocol event (the worker is being
/// killed for it, and nothing after it on the stream may be believed).
fn handle_line(
    shared: &Shared,
    line: &[u8],
    out: &pipe::Receiver,
    err: &pipe::Receiver,
    buf: &mut [u8],
) -> bool {
    let ev = match protocol::decode(line) {
        Ok(ev) => ev,
        Err(e) => {
            // Only something other than the worker's own sender writes such a line (user
            // code that found the event descriptor): the stream can no longer be trusted,
            // and a call whose answer was glued to the garbage would wait forever.
            tracing::warn!(error = %e, "the Python worker's event stream is corrupted");
            kill_group(shared, &protocol_fault(line));
            return false;
        }
    };
    if matches!(
        ev,
        Event::Done { .. } | Event::InputRequest { .. } | Event::InstallRequest { .. }
    ) {
        // The worker flushed fds 1/2 before writing this line: take what is in the
        // pipes now so it is attributed to the cell that printed it.
        drain_now(out, OutStream::Stdout, shared, buf);
        drain_now(err, OutStream::Stderr, shared, buf);
    }
    shared.event(ev);
    true
}

/// The kill reason for a line on the event pipe that is not a protocol event.
fn protocol_fault(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    let head: String = text.chars().take(80).collect();
    let more = if head.len() < text.len() { "…" } else { "" };
    format!(
        "protocol fault: its event stream was corrupted (a line that is not a protocol event: \
         {head:?}{more}); code in the cell probably wrote to the worker's private event \
         descriptor"
    )
}

/// Kill a root's whole process tree (group and cgroup), or a forked worker alone.
pub(super) fn kill_group(shared: &Shared, reason: &str) {
    let child = lock(&shared.child);
    if let Some(child) = child.as_ref() {
        lock(&shared.state)
            .kill_reason
            .get_or_insert_with(|| reason.to_string());
        // The process group and the cgroup (also what left the group with setsid).
        child.kill_all();
    } else if let Some(fd) = &shared.sigfd {
        lock(&shared.state)
            .kill_reason
            .get_or_insert_with(|| reason.to_string());
        let _ = fd.signal(libc::SIGKILL);
    }
}

/// How a worker forked from a snapshot ended. It is not our child: its exit status is
/// read from /proc while it is a zombie (its snapshot reaps it only on the next message).
fn forked_exit_words(pid: u32, policy: &ResolvedPolicy) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces): state is the first,
    // exit_code (field 52) the last.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let status = match (fields.first(), fields.last()) {
        (Some(&"Z"), Some(code)) => code.parse::<i32>().ok(),
        _ => None,
    };
    let Some(status) = status else {
        return "the Python worker ended (exit status unknown)".to_string();
    };
    let termination = if libc::WIFSIGNALED(status) {
        Termination::Signaled(signal_name(libc::WTERMSIG(status)))
    } else {
        Termination::Exited(libc::WEXITSTATUS(status))
    };
    exit_words(
        &ExitReport {
            termination,
            ..Default::default()
        },
        policy,
    )
}
