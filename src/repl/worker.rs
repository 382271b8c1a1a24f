//! One worker process: spawn through the launcher, the I/O task that pumps its protocol
//! pipe, stdout and stderr, and death detection.
//!
//! Ownership and shutdown: the [`Worker`] handle owns the request pipe (through a writer
//! task) and can kill the process group. One I/O task per worker owns the event pipe,
//! stdout, stderr and a pidfd; it is the only reader of all four, so output ordering
//! against `done` is decided in one place. When the process ends (pidfd readable) the
//! task drains what is left in the pipes, reaps the child, and completes every pending
//! call with the death message — a dead worker never leaves a call waiting.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::{OwnedMutexGuard, mpsc, oneshot, watch};

use super::protocol::{self, Event, Request};
use super::{CellSink, OutStream, ReplError, exit_words};
use crate::sandbox::{ResolvedPolicy, SandboxCommand, SandboxedChild};

/// The worker driver, embedded so the binary is self-contained.
pub(crate) const WORKER_SOURCE: &str = include_str!("../../python/sandbox_repl_worker.py");
/// Compiles the driver (passed as argv[1]) under a fixed name its tracebacks filter on.
const BOOTSTRAP: &str =
    "import sys;_s=sys.argv.pop(1);exec(compile(_s,'<sandbox-repl-worker>','exec'))";
/// Runs the driver precompiled by the same interpreter (argv[1]: base64 of marshal data).
const BOOTSTRAP_MARSHAL: &str =
    "import sys,marshal,binascii;exec(marshal.loads(binascii.a2b_base64(sys.argv.pop(1))))";
/// Output that arrives while no cell runs is kept (up to this much) for the next cell.
const ORPHAN_CAP: usize = 1 << 20;
/// How much of stderr to keep for the death message of a worker that never got ready.
const STARTUP_TAIL: usize = 2048;

/// What a worker needs to start.
pub(crate) struct SpawnSpec {
    pub python: PathBuf,
    pub workspace: PathBuf,
    pub tmp: PathBuf,
    pub policy: Arc<ResolvedPolicy>,
    /// The driver precompiled by this interpreter, if the probe managed to.
    pub code: Option<Arc<str>>,
}

/// The answer to one call: the matching event, or the words saying how the worker died.
#[derive(Debug)]
pub(crate) enum Reply {
    Event(Event),
    Died(Arc<str>),
}

struct Pending {
    tx: oneshot::Sender<Reply>,
    sink: Option<Arc<dyn CellSink>>,
    /// Keeps the session's operation lock until the worker answers (or dies), even if the
    /// caller stopped waiting: the next cell never starts while this one still runs.
    _guard: Option<OwnedMutexGuard<()>>,
}

#[derive(Default)]
struct State {
    pending: HashMap<u64, Pending>,
    /// The call whose cell is running (receives stdout/stderr).
    current: Option<u64>,
    awaiting_input: Option<(u64, String)>,
    orphan: VecDeque<(OutStream, Vec<u8>)>,
    orphan_bytes: usize,
    orphan_dropped: usize,
    death: Option<Arc<str>>,
    kill_reason: Option<&'static str>,
    ready: bool,
    startup_stderr: Vec<u8>,
}

struct Shared {
    state: Mutex<State>,
    /// For the amounts of limits in death messages.
    policy: Arc<ResolvedPolicy>,
    /// `None` once reaped; kill only signals a child that has not been reaped, so a
    /// recycled pid is never hit.
    child: Mutex<Option<SandboxedChild>>,
    ready: watch::Sender<bool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running worker process.
pub(crate) struct Worker {
    pub pid: u32,
    requests: mpsc::UnboundedSender<Vec<u8>>,
    shared: Arc<Shared>,
    ready_rx: watch::Receiver<bool>,
}

impl Worker {
    /// Start the worker; returns as soon as the process exists (it reports `ready` later;
    /// requests sent before then are queued in the pipe).
    pub fn spawn(spec: &SpawnSpec) -> Result<Worker, ReplError> {
        let io_err = |what: &'static str| {
            move |source| ReplError::Io {
                what: what.into(),
                source,
            }
        };
        let (req_r, req_w) = std::io::pipe().map_err(io_err("create the worker request pipe"))?;
        let (ev_r, ev_w) = std::io::pipe().map_err(io_err("create the worker event pipe"))?;
        let mut cmd = SandboxCommand::new(spec.policy.clone(), &spec.python);
        match &spec.code {
            Some(code) => cmd.arg("-c").arg(BOOTSTRAP_MARSHAL).arg(&**code),
            None => cmd.arg("-c").arg(BOOTSTRAP).arg(WORKER_SOURCE),
        };
        cmd.current_dir(&spec.workspace)
            .env("PYTHONIOENCODING", "utf-8")
            .env("TMPDIR", &spec.tmp)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .pass_fd(OwnedFd::from(req_r), 3)
            .pass_fd(OwnedFd::from(ev_w), 4)
            .enforce_wall_time(false);
        let mut child = cmd.spawn()?;
        let pid = child.pid;
        let stdout = child.stdout.take().map(OwnedFd::from);
        let stderr = child.stderr.take().map(OwnedFd::from);
        let (ready, ready_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            state: Mutex::default(),
            policy: spec.policy.clone(),
            child: Mutex::new(Some(child)),
            ready,
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let worker = Worker {
            pid,
            requests: tx,
            shared: shared.clone(),
            ready_rx,
        };
        let pipes = (|| -> std::io::Result<_> {
            let out = stdout.ok_or_else(|| std::io::Error::other("no stdout pipe"))?;
            let err = stderr.ok_or_else(|| std::io::Error::other("no stderr pipe"))?;
            Ok((
                pipe::Sender::from_owned_fd(OwnedFd::from(req_w))?,
                pipe::Receiver::from_owned_fd(OwnedFd::from(ev_r))?,
                pipe::Receiver::from_owned_fd(out)?,
                pipe::Receiver::from_owned_fd(err)?,
                pidfd_open(pid)?,
            ))
        })();
        let (req_tx, ev_rx, out_rx, err_rx, pidfd) = match pipes {
            Ok(p) => p,
            Err(source) => {
                worker.kill("setup failed");
                return Err(ReplError::Io {
                    what: "attach to the worker's pipes".into(),
                    source,
                });
            }
        };
        tokio::spawn(write_requests(rx, req_tx));
        tokio::spawn(pump(shared, ev_rx, out_rx, err_rx, pidfd));
        Ok(worker)
    }

    /// Send `req`; the returned receiver gets the matching event or the death message.
    /// `sink` receives the output of the cell this request starts.
    pub fn call(
        &self,
        id: u64,
        req: &Request,
        sink: Option<Arc<dyn CellSink>>,
        guard: Option<OwnedMutexGuard<()>>,
    ) -> oneshot::Receiver<Reply> {
        let (tx, rx) = oneshot::channel();
        let mut st = lock(&self.shared.state);
        if let Some(death) = &st.death {
            let _ = tx.send(Reply::Died(death.clone()));
            return rx;
        }
        if let Some(sink) = &sink {
            // Output printed between cells belongs to this one, in front of its own.
            if st.orphan_dropped > 0 {
                let note = format!(
                    "[{} bytes of output printed between cells were dropped]\n",
                    st.orphan_dropped
                );
                sink.output(OutStream::Stderr, note.as_bytes());
                st.orphan_dropped = 0;
            }
            for (stream, data) in st.orphan.drain(..) {
                sink.output(stream, &data);
            }
            st.orphan_bytes = 0;
            st.current = Some(id);
        }
        st.pending.insert(
            id,
            Pending {
                tx,
                sink,
                _guard: guard,
            },
        );
        drop(st);
        let _ = self.requests.send(protocol::encode(req));
        rx
    }

    /// Send a request that has no answer (`input_reply`, `shutdown`).
    pub fn send(&self, req: &Request) {
        let _ = self.requests.send(protocol::encode(req));
    }

    /// Wait until the worker reported `ready` (or died, or `timeout` passed).
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), ReplError> {
        let mut rx = self.ready_rx.clone();
        let died = |s: &Shared| lock(&s.state).death.clone();
        let waited = tokio::time::timeout(timeout, async {
            loop {
                if *rx.borrow_and_update() {
                    return Ok(());
                }
                if let Some(d) = died(&self.shared) {
                    return Err(ReplError::WorkerDied {
                        message: d.to_string(),
                    });
                }
                if rx.changed().await.is_err() {
                    return Err(ReplError::WorkerDied {
                        message: died(&self.shared)
                            .map(|d| d.to_string())
                            .unwrap_or_default(),
                    });
                }
            }
        })
        .await;
        waited.unwrap_or_else(|_| {
            Err(ReplError::WorkerDied {
                message: format!("the Python worker did not start within {timeout:?}"),
            })
        })
    }

    pub fn death(&self) -> Option<Arc<str>> {
        lock(&self.shared.state).death.clone()
    }

    /// `(call id, prompt)` of the `input()` the running cell waits in, if any.
    pub fn awaiting_input(&self) -> Option<(u64, String)> {
        lock(&self.shared.state).awaiting_input.clone()
    }

    /// Answer the pending `input()` (`None` = end of input). False if none is pending.
    pub fn reply_input(&self, text: Option<String>) -> bool {
        let mut st = lock(&self.shared.state);
        let Some((id, _)) = st.awaiting_input.take() else {
            return false;
        };
        let sink = st.pending.get(&id).and_then(|p| p.sink.clone());
        drop(st);
        self.send(&Request::InputReply { id, text });
        if let Some(sink) = sink {
            sink.input_received();
        }
        true
    }

    /// SIGINT to the worker process (not its children): KeyboardInterrupt in running code.
    pub fn interrupt(&self) {
        let child = lock(&self.shared.child);
        if child.is_some() {
            // SAFETY: plain syscall on a pid we have not reaped yet (checked above).
            unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGINT) };
        }
    }

    /// Kill the whole process group; pending calls get a death message naming `reason`.
    pub fn kill(&self, reason: &'static str) {
        lock(&self.shared.state).kill_reason.get_or_insert(reason);
        let child = lock(&self.shared.child);
        if let Some(child) = child.as_ref() {
            child.kill_all();
            // The child leads its own process group (pgid == pid).
            // SAFETY: plain syscall; the group leader has not been reaped (checked above).
            unsafe { libc::killpg(self.pid as libc::pid_t, libc::SIGKILL) };
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill("the session was closed");
    }
}

fn pidfd_open(pid: u32) -> std::io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: `owned` is a valid descriptor the AsyncFd owns until it is dropped.
    unsafe { AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into())
}

async fn write_requests(mut rx: mpsc::UnboundedReceiver<Vec<u8>>, mut pipe: pipe::Sender) {
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
            Event::InputRequest { id, prompt } => {
                let sink = st.pending.get(&id).and_then(|p| p.sink.clone());
                st.awaiting_input = Some((id, prompt.clone()));
                drop(st);
                if let Some(sink) = sink {
                    sink.awaiting_input(&prompt);
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
                    let _ = p.tx.send(Reply::Event(other));
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
async fn pump(
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
        tokio::select! {
            r = events.read_until(b'\n', &mut line), if ev_open => match r {
                Ok(_) if line.ends_with(b"\n") => {
                    handle_line(&shared, &line, &out, &err, &mut obuf);
                    line.clear();
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
    if ev_open {
        let mut rest = Vec::new();
        let _ = drain_all(events.get_ref(), &mut rest);
        line.extend_from_slice(events.buffer());
        line.extend_from_slice(&rest);
        for l in line.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            handle_line(&shared, l, &out, &err, &mut obuf);
        }
    }
    drain_now(&out, OutStream::Stdout, &shared, &mut obuf);
    drain_now(&err, OutStream::Stderr, &shared, &mut ebuf);
    let child = lock(&shared.child).take();
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
    let mut message = match (st.kill_reason, &report) {
        (Some(reason), _) => format!("the Python worker was stopped: {reason}"),
        (None, Some(report)) => exit_words(report, &shared.policy),
        (None, None) => "the Python worker ended".to_string(),
    };
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
        let _ = p.tx.send(Reply::Died(message.clone()));
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

fn handle_line(
    shared: &Shared,
    line: &[u8],
    out: &pipe::Receiver,
    err: &pipe::Receiver,
    buf: &mut [u8],
) {
    let ev = match protocol::decode(line) {
        Ok(ev) => ev,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring a malformed line from the Python worker");
            return;
        }
    };
    if matches!(ev, Event::Done { .. } | Event::InputRequest { .. }) {
        // The worker flushed fds 1/2 before writing this line: take what is in the
        // pipes now so it is attributed to the cell that printed it.
        drain_now(out, OutStream::Stdout, shared, buf);
        drain_now(err, OutStream::Stderr, shared, buf);
    }
    shared.event(ev);
}

fn kill_group(shared: &Shared, reason: &'static str) {
    let child = lock(&shared.child);
    if let Some(child) = child.as_ref() {
        lock(&shared.state).kill_reason.get_or_insert(reason);
        child.kill_all();
        // SAFETY: see Worker::kill.
        unsafe { libc::killpg(child.pid as libc::pid_t, libc::SIGKILL) };
    }
}
