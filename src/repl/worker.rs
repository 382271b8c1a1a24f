//! One worker process: spawn through the launcher and the handle the session holds
//! (calls, input replies, interrupt, kill). Its I/O task lives in `pump`.
//!
//! Ownership and shutdown: the [`Worker`] handle owns the request pipe (through a writer
//! task) and can kill the process group; dropping it kills the worker. The I/O task owns
//! the event pipe, stdout, stderr and a pidfd, and ends when the process has ended.

use crate::sandbox::Io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot, watch};

use super::cell::{CellSink, OutStream};
use super::error::ReplError;
use super::interpreter::Language;
use super::protocol::{self, Request};
use super::pump::{Hold, Pending, Shared, kill_group, lock, pump, write_requests};
pub(crate) use super::pump::{Reply, SnapshotHook};
use super::python::WORKER_SOURCE;
use super::snapshot::{self, Forked};
use crate::sandbox::launcher::pidns::host_pid;
use crate::sandbox::parent::proxy::Denials;
use crate::sandbox::{Pidfd, ResolvedPolicy, SandboxedChild};

/// Reads the driver from the request pipe (fd 3) ahead of the first request: argv[1] says
/// what follows (`m`: the driver precompiled by this interpreter, marshal data; `s`: its
/// source, compiled under a fixed name its tracebacks filter on), argv[2] how many bytes.
/// Through the pipe rather than argv, the ~60 KB never cross the launcher's two execs
/// and its JSON (where argv bytes took ~400 KB).
const BOOTSTRAP: &str = "import os,sys\n\
k,n=sys.argv.pop(1),int(sys.argv.pop(1));b=b''\n\
while len(b)<n:\n c=os.read(3,n-len(b))\n if not c:raise SystemExit('sandbox-repl: the worker driver did not arrive')\n b+=c\n\
exec(__import__('marshal').loads(b) if k=='m' else compile(b,'<sandbox-repl-worker>','exec'))";
/// What a worker needs to start.
pub(crate) struct SpawnSpec {
    pub(crate) sandbox: crate::sandbox::Runtime,
    pub(crate) python: PathBuf,
    pub(crate) workspace: PathBuf,
    pub(crate) tmp: PathBuf,
    pub(crate) policy: Arc<ResolvedPolicy>,
    /// The driver precompiled by this interpreter (marshal data), if the probe managed to.
    pub(crate) code: Option<Arc<[u8]>>,
    /// Pass a snapshot control socket (fd 5): the worker snapshots each cell.
    pub(crate) snapshots: bool,
    /// Idle time after a cell before its snapshot is taken (told to the worker).
    pub(crate) snapshot_idle: std::time::Duration,
    /// Which worker runs (`python` is then the interpreter to start: Python or Rscript).
    pub(crate) language: Language,
}

/// The server's ends of a worker's descriptors.
struct Fds {
    requests: OwnedFd,
    events: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    control: Option<OwnedFd>,
}

/// A running worker process.
pub(crate) struct Worker {
    pub(crate) pid: u32,
    requests: mpsc::UnboundedSender<Vec<u8>>,
    shared: Arc<Shared>,
    ready_rx: watch::Receiver<bool>,
}

impl Worker {
    /// Start the worker; returns as soon as the process exists (it reports `ready` later;
    /// requests sent before then are queued in the pipe).
    pub(super) fn spawn(spec: &SpawnSpec) -> Result<Worker, ReplError> {
        let io_err = |what: &'static str| {
            move |source| ReplError::Io {
                what: what.into(),
                source,
            }
        };
        let (req_r, req_w) = std::io::pipe().map_err(io_err("create the worker request pipe"))?;
        let (ev_r, ev_w) = std::io::pipe().map_err(io_err("create the worker event pipe"))?;
        let control = if spec.snapshots {
            Some(
                snapshot::control_pair()
                    .map_err(io_err("create the worker's snapshot control socket"))?,
            )
        } else {
            None
        };
        let mut cmd = spec.sandbox.command(spec.policy.clone(), &spec.python);
        let driver: Vec<u8> = match spec.language {
            Language::Python => {
                let (kind, driver): (&str, &[u8]) = match &spec.code {
                    Some(code) => ("m", code),
                    None => ("s", WORKER_SOURCE.as_bytes()),
                };
                cmd.arg("-c")
                    .arg(BOOTSTRAP)
                    .arg(kind)
                    .arg(driver.len().to_string())
                    .env("PYTHONIOENCODING", "utf-8");
                driver.to_vec()
            }
            Language::R => super::r::prepare(&mut cmd, &spec.tmp),
        };
        cmd.current_dir(&spec.workspace)
            .env("TMPDIR", &spec.tmp)
            .stdin(Io::Null)
            .stdout(Io::Piped)
            .stderr(Io::Piped)
            .pass_fd(OwnedFd::from(req_r), 3)
            .pass_fd(OwnedFd::from(ev_w), 4)
            .enforce_wall_time(false);
        let control = match control {
            Some((ours, theirs)) => {
                cmd.env(
                    "SANDBOX_REPL_SNAPSHOT_IDLE_MS",
                    spec.snapshot_idle.as_millis().to_string(),
                );
                cmd.pass_fd(theirs, 5);
                Some(ours)
            }
            None => None,
        };
        let mut child = cmd.spawn()?;
        let pid = child.pid;
        let stdout = child.stdout.take().map(OwnedFd::from);
        let stderr = child.stderr.take().map(OwnedFd::from);
        let (Some(stdout), Some(stderr)) = (stdout, stderr) else {
            child.kill_all();
            tokio::spawn(child.wait()); // reap it
            return Err(ReplError::Io {
                what: "attach to the worker's pipes".into(),
                source: std::io::Error::other("no stdout or stderr pipe"),
            });
        };
        let fds = Fds {
            requests: req_w.into(),
            events: ev_r.into(),
            stdout,
            stderr,
            control,
        };
        let denials = child.network_denials();
        let worker = Self::attach(pid, Some(child), None, fds, spec.policy.clone(), denials)?;
        lock(&worker.shared.state).language = spec.language;
        // First on the pipe, ahead of any request (the channel keeps the order).
        let _ = worker.requests.send(driver);
        Ok(worker)
    }

    /// A live worker a snapshot forked (see [`Snapshot::fork_live`]): not our child, so it
    /// is watched and signalled through a pidfd, and killing it kills it alone (its
    /// process tree is killed through the root it descends from).
    /// `reference` is a process (host pid) of the same process tree: the snapshot reports
    /// the pid it forked as its PID namespace numbers it.
    /// `denials`: those of the tree's network broker (its root's), shared.
    pub(super) fn adopt(
        mut forked: Forked,
        reference: Option<u32>,
        policy: Arc<ResolvedPolicy>,
        denials: Option<Denials>,
    ) -> Result<Worker, ReplError> {
        if let Some(reference) = reference {
            forked.pid = host_pid(reference, forked.pid).ok_or_else(|| ReplError::Io {
                what: format!("find the forked worker {} (its namespace pid)", forked.pid),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            })?;
        }
        // The pid cannot have been reused: the snapshot that forked it reaps it only when
        // it gets its next message, which the server sends.
        let sigfd = Pidfd::open(forked.pid).map_err(|source| ReplError::Io {
            what: format!("watch the forked worker {}", forked.pid),
            source,
        })?;
        let fds = Fds {
            requests: forked.requests,
            events: forked.events,
            stdout: forked.stdout,
            stderr: forked.stderr,
            control: Some(forked.control),
        };
        Self::attach(forked.pid, None, Some(sigfd), fds, policy, denials)
    }

    fn attach(
        pid: u32,
        child: Option<SandboxedChild>,
        sigfd: Option<Pidfd>,
        fds: Fds,
        policy: Arc<ResolvedPolicy>,
        denials: Option<Denials>,
    ) -> Result<Worker, ReplError> {
        let exit_fd = match (&child, &sigfd) {
            (Some(child), _) => child.exit_fd(),
            (None, Some(pidfd)) => pidfd.exit_fd(),
            (None, None) => Err(std::io::Error::other(
                "neither a child nor a pidfd to watch",
            )),
        };
        let (ready, ready_rx) = watch::channel(false);
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            requests: tx.downgrade(),
            state: Mutex::default(),
            policy,
            child: Mutex::new(child),
            ready,
            pid,
            sigfd,
            denials,
            retired: AtomicBool::new(false),
            control: fds.control,
        });
        let worker = Worker {
            pid,
            requests: tx,
            shared: shared.clone(),
            ready_rx,
        };
        let pipes = (|| -> std::io::Result<_> {
            Ok((
                pipe::Sender::from_owned_fd(fds.requests)?,
                pipe::Receiver::from_owned_fd(fds.events)?,
                pipe::Receiver::from_owned_fd(fds.stdout)?,
                pipe::Receiver::from_owned_fd(fds.stderr)?,
                exit_fd?,
            ))
        })();
        let (req_tx, ev_rx, out_rx, err_rx, pidfd) = match pipes {
            Ok(p) => p,
            Err(source) => {
                worker.kill("setup failed");
                if let Some(child) = lock(&worker.shared.child).take() {
                    tokio::spawn(child.wait()); // reap it
                }
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

    /// What the network broker of this worker's tree refused since the last call
    /// (proxy mode), taken: each line is reported once.
    pub(super) fn take_denials(&self) -> Vec<String> {
        self.shared
            .denials
            .as_ref()
            .map(|d| std::mem::take(&mut *d.lock().unwrap_or_else(|p| p.into_inner())))
            .unwrap_or_default()
    }

    /// The broker denials of this worker's tree (shared with the workers forked from it).
    pub(super) fn network_denials(&self) -> Option<Denials> {
        self.shared.denials.clone()
    }

    /// Where this worker's snapshots go: `hook(worker pid, cell, snapshot or why none)`.
    pub(super) fn on_snapshot(&self, hook: SnapshotHook) {
        lock(&self.shared.state).on_snapshot = Some(hook);
    }

    /// Whether this worker was spawned (the root of its process tree), not forked from a
    /// snapshot.
    pub(super) fn is_root(&self) -> bool {
        self.shared.sigfd.is_none()
    }

    /// Memory held by this spawned worker's process tree (it, its snapshots and the
    /// workers forked from them), from its job cgroup; `None` for a worker forked from a
    /// snapshot (its tree's root holds the cgroup), after the tree ended, or without a
    /// memory cgroup.
    pub(super) fn tree_memory_bytes(&self) -> Option<u64> {
        lock(&self.shared.child).as_ref()?.cgroup_memory_bytes()
    }

    /// Retire this worker, leaving its process tree (snapshots, the worker that replaces
    /// it) alive. A forked worker is killed. A root is *stopped* (SIGSTOP), not killed:
    /// in its PID namespace the root's death would end the namespace and every snapshot
    /// in it; stopped, it holds its (copy-on-write) memory like one more snapshot until
    /// [`Worker::end_tree`] kills the whole tree.
    pub(super) fn kill_alone(&self, reason: &'static str) {
        if self.is_root() {
            self.shared.retired.store(true, Ordering::SeqCst);
            let child = lock(&self.shared.child);
            if let Some(child) = child.as_ref() {
                lock(&self.shared.state)
                    .kill_reason
                    .get_or_insert_with(|| reason.to_string());
                if let Err(e) = child.signal_target(libc::SIGSTOP) {
                    tracing::warn!(error = %e, "could not stop a retired Python worker");
                }
            }
        } else {
            kill_group(&self.shared, reason);
        }
    }

    /// Kill everything in this root's process tree (its group and cgroup) and reap it.
    pub(super) fn end_tree(&self, reason: &'static str) {
        kill_group(&self.shared, reason);
        if self.shared.retired.load(Ordering::SeqCst)
            && let Some(child) = lock(&self.shared.child).take()
        {
            std::thread::spawn(move || child.wait_blocking());
        }
    }

    /// Send `req`; the returned receiver gets the matching event or the death message.
    /// `sink` receives the output of the cell this request starts.
    pub(super) fn call(
        &self,
        id: u64,
        req: &Request,
        sink: Option<Arc<dyn CellSink>>,
        hold: Option<Hold>,
    ) -> oneshot::Receiver<Reply> {
        let (tx, rx) = oneshot::channel();
        let mut st = lock(&self.shared.state);
        if let Some(death) = st.death.clone() {
            drop(st);
            Pending { tx, sink, hold }.answer(Reply::Died(death));
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
        st.pending.insert(id, Pending { tx, sink, hold });
        drop(st);
        let _ = self.requests.send(protocol::encode(req));
        rx
    }

    /// Send a request that has no answer (`input_reply`, `shutdown`).
    pub(super) fn send(&self, req: &Request) {
        let _ = self.requests.send(protocol::encode(req));
    }

    /// Wait until the worker reported `ready` (or died, or `timeout` passed).
    pub(super) async fn wait_ready(&self, timeout: Duration) -> Result<(), ReplError> {
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
            let worker = lock(&self.shared.state).language.worker_words();
            Err(ReplError::WorkerDied {
                message: format!("{worker} did not start within {timeout:?}"),
            })
        })
    }

    pub(super) fn death(&self) -> Option<Arc<str>> {
        lock(&self.shared.state).death.clone()
    }

    /// `(call id, prompt)` of the `input()` the running cell waits in, if any.
    pub(super) fn awaiting_input(&self) -> Option<(u64, String)> {
        lock(&self.shared.state).awaiting_input.clone()
    }

    /// Answer the pending `input()` (`None` = end of input). False if none is pending.
    pub(super) fn reply_input(&self, text: Option<String>) -> bool {
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

    /// The pid of the Python process itself (in a PID namespace the server's child is the
    /// launcher supervising it), for its memory use.
    pub(super) fn python_pid(&self) -> u32 {
        lock(&self.shared.child)
            .as_ref()
            .map_or(self.pid, |c| c.main_pid())
    }

    /// SIGCONT to the worker (its process group, or a forked worker alone): a stopped
    /// worker (SIGSTOP) would keep a SIGINT pending and the cancel would be lost.
    pub(super) fn resume(&self) {
        let result = match (lock(&self.shared.child).as_ref(), &self.shared.sigfd) {
            (Some(child), _) => child.signal_group(libc::SIGCONT),
            (None, Some(pidfd)) => pidfd.signal(libc::SIGCONT),
            (None, None) => Ok(()),
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "could not continue the Python worker");
        }
    }

    /// KeyboardInterrupt in the running cell, through the protocol: the worker's reader
    /// thread raises it in the main thread (`pthread_kill`), or at the start of the cell
    /// if it has not started yet, so an interrupt sent just after the cell is never lost
    /// and one sent between cells interrupts nothing. False when no cell runs.
    /// An R worker reads no request while its cell runs: it gets SIGINT first (R raises
    /// its interrupt condition in the cell), then the request, which ends a wait for
    /// input and tells a worker whose cell already ended to drop the signal.
    pub(super) fn interrupt(&self) -> bool {
        let (id, language) = {
            let st = lock(&self.shared.state);
            (st.current, st.language)
        };
        let Some(id) = id else {
            return false;
        };
        if language.interrupt_by_signal()
            && let Some(child) = lock(&self.shared.child).as_ref()
            && let Err(e) = child.signal_target(libc::SIGINT)
        {
            tracing::warn!(error = %e, "could not interrupt the R worker");
        }
        self.send(&Request::Interrupt { id });
        true
    }

    /// Kill the whole process group; pending calls get a death message naming `reason`.
    pub(super) fn kill(&self, reason: &str) {
        kill_group(&self.shared, reason);
    }

    /// How the process ended (signal or exit code), once it is dead and reaped.
    pub(super) fn exit_status(&self) -> Option<crate::sandbox::Termination> {
        lock(&self.shared.state).exit.clone()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.end_tree("the session was closed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run the bootstrap outside any sandbox with `driver` on fd 3 (a pipe held open
    /// until the first event, then closed, so the driver ends after its start; at once
    /// unless `hold`) and fd 4 into a file; the events written.
    fn bootstrap_events(
        python: &std::path::Path,
        kind: &str,
        driver: &[u8],
        claimed: usize,
        hold: bool,
    ) -> (String, String) {
        let dir = tempfile::tempdir().unwrap();
        let (input, events) = (dir.path().join("driver"), dir.path().join("events"));
        std::fs::write(&input, driver).unwrap();
        std::fs::write(&events, "").unwrap();
        let feed = if hold {
            "cat \"$IN\"; while [ ! -s \"$EV\" ]; do sleep 0.01; done"
        } else {
            "cat \"$IN\""
        };
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "({feed}) | \"$PY\" -c \"$0\" \"$@\" 3<&0 0</dev/null 4>>\"$EV\""
            ))
            .arg(BOOTSTRAP)
            .arg(kind)
            .arg(claimed.to_string())
            .env("PY", python)
            .env("IN", &input)
            .env("EV", &events)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.success(), hold, "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (std::fs::read_to_string(&events).unwrap(), stderr)
    }

    #[tokio::test]
    async fn the_bootstrap_runs_the_driver_sent_down_the_pipe() {
        let info = super::super::python::discover_python(None, std::path::Path::new("/"))
            .await
            .unwrap();
        let code = info.driver_code().expect("the probe compiled the driver");
        for (kind, driver) in [("m", &*code), ("s", WORKER_SOURCE.as_bytes())] {
            let (events, _) = bootstrap_events(&info.executable, kind, driver, driver.len(), true);
            assert!(
                events.starts_with("{\"ev\":\"ready\""),
                "{kind}: {events:?}"
            );
        }
        // Cut short (the server died mid-way): the worker fails with words, says nothing.
        let cut = &WORKER_SOURCE.as_bytes()[..100];
        let (events, stderr) =
            bootstrap_events(&info.executable, "s", cut, WORKER_SOURCE.len(), false);
        assert_eq!(events, "");
        assert!(
            stderr.contains("the worker driver did not arrive"),
            "{stderr}"
        );
    }
}
