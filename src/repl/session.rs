//! One named session: its worker (replaced after a crash or restart), cells, variables,
//! input bridging and history.
//!
//! Locks: `op_lock` (async, per session) serialises the calls that need the worker's
//! main thread — cells and variable operations. It is taken with `try_lock`, so a call
//! on a busy session fails at once with [`ReplError::Busy`] instead of queueing, and
//! its guard travels with the pending call into the worker, so it is released when the
//! worker answers or dies — not when a caller gives up waiting. `inner` (sync) guards
//! plain bookkeeping and is never held across an await. Sessions share no lock.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::protocol::{Event, Request, WireStatus};
use super::worker::{Reply, SpawnSpec, Worker};
use super::{
    CellOutcome, CellSink, CellStatus, HistoryEntry, PythonInfo, ReplError, SessionInfo,
    SessionState,
};

mod site_dirs;
mod variables;

const HISTORY_CAP: usize = 1000;

/// Everything a session needs to (re)start its worker.
pub(crate) struct SessionEnv {
    pub spec: SpawnSpec,
    pub policy_name: String,
    pub python: PythonInfo,
    pub repr_limit: usize,
    pub start_timeout: Duration,
    /// Keep a started, idle worker in reserve for restarts and crash recovery.
    pub spare: bool,
}

struct Inner {
    worker: Option<Arc<Worker>>,
    /// A started worker nobody has used yet: a restart or the cell after a crash takes
    /// it instead of waiting for a new interpreter to start.
    spare: Option<Arc<Worker>>,
    closed: bool,
    /// A worker died on its own: the next cell is told its state was lost.
    state_lost: bool,
    cells: u64,
    running_cell: u64,
    history: VecDeque<HistoryEntry>,
    last_active: Instant,
    /// The start-up hook: directories every new worker adds to `sys.path` (`site_dirs`).
    site_dirs: Vec<PathBuf>,
}

/// A named, persistent Python session.
pub struct Session {
    name: String,
    env: SessionEnv,
    op_lock: Arc<tokio::sync::Mutex<()>>,
    inner: Mutex<Inner>,
    next_id: AtomicU64,
    /// For background tasks that refill the spare worker.
    me: std::sync::Weak<Session>,
}

impl Session {
    /// Create the session and start its worker at once (the first cell then does not
    /// pay for the interpreter's start). Its workers add `site_dirs` to `sys.path`.
    pub(crate) fn start(
        name: String,
        env: SessionEnv,
        site_dirs: Vec<PathBuf>,
    ) -> Result<Arc<Session>, ReplError> {
        let worker = Arc::new(Worker::spawn(&env.spec)?);
        let session = Arc::new_cyclic(|me| Session {
            name,
            env,
            me: me.clone(),
            op_lock: Arc::new(tokio::sync::Mutex::new(())),
            inner: Mutex::new(Inner {
                worker: Some(worker.clone()),
                spare: None,
                closed: false,
                state_lost: false,
                cells: 0,
                running_cell: 0,
                history: VecDeque::new(),
                last_active: Instant::now(),
                site_dirs: site_dirs.clone(),
            }),
            next_id: AtomicU64::new(1),
        });
        session.apply_site_dirs(&worker, &site_dirs);
        Ok(session)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The session's private temp directory (`{tmp}`, also `TMPDIR` of the worker).
    pub fn tmp_dir(&self) -> &std::path::Path {
        &self.env.spec.tmp
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn busy(&self) -> ReplError {
        ReplError::Busy {
            session: self.name.clone(),
            cell: self.inner().running_cell,
        }
    }

    /// The live worker, starting a fresh one if there is none or it died. The flag says
    /// whether state was lost since the last cell (reported once, by a cell).
    fn live_worker(&self, report_loss: bool) -> Result<(Arc<Worker>, bool), ReplError> {
        let mut inner = self.inner();
        if inner.closed {
            return Err(ReplError::Closed {
                session: self.name.clone(),
            });
        }
        if let Some(w) = &inner.worker
            && w.death().is_none()
        {
            let w = w.clone();
            let lost = report_loss && std::mem::take(&mut inner.state_lost);
            return Ok((w, lost));
        }
        if inner.worker.take().is_some() {
            inner.state_lost = true;
        }
        let worker = self.fresh_worker(&mut inner)?;
        inner.worker = Some(worker.clone());
        let lost = report_loss && std::mem::take(&mut inner.state_lost);
        drop(inner);
        self.refill_spare();
        Ok((worker, lost))
    }

    /// The spare worker if it is alive, else a newly started one (both have had the
    /// start-up hook).
    fn fresh_worker(&self, inner: &mut Inner) -> Result<Arc<Worker>, ReplError> {
        match inner.spare.take() {
            Some(w) if w.death().is_none() => Ok(w),
            _ => {
                let w = Arc::new(Worker::spawn(&self.env.spec)?);
                self.apply_site_dirs(&w, &inner.site_dirs);
                Ok(w)
            }
        }
    }

    /// Start a spare worker in the background if the session keeps one and has none.
    fn refill_spare(&self) {
        if !self.env.spare {
            return;
        }
        {
            let inner = self.inner();
            if inner.closed || inner.spare.as_ref().is_some_and(|w| w.death().is_none()) {
                return;
            }
        }
        let me = self.me.clone();
        // Starting a process blocks for the launcher's setup: keep it off the async threads.
        tokio::task::spawn_blocking(move || {
            let Some(session) = me.upgrade() else { return };
            let worker = match Worker::spawn(&session.env.spec) {
                Ok(w) => Arc::new(w),
                Err(e) => {
                    tracing::warn!(session = %session.name, error = %e, "could not start a spare worker");
                    return;
                }
            };
            let mut inner = session.inner();
            if !inner.closed && inner.spare.as_ref().is_none_or(|w| w.death().is_some()) {
                // Under the lock: a concurrent `set_site_dirs` cannot slip in between.
                session.apply_site_dirs(&worker, &inner.site_dirs);
                inner.spare = Some(worker);
            }
            // Otherwise `worker` is dropped here, which kills it.
        });
    }

    /// Run `code` as the next cell; output goes to `sink` as it is printed.
    pub async fn execute(
        &self,
        code: &str,
        sink: Arc<dyn CellSink>,
    ) -> Result<CellOutcome, ReplError> {
        let repr_limit = self.env.repr_limit;
        self.run_cell(code.to_string(), sink, |id, cell| Request::Execute {
            id,
            cell,
            code: code.to_string(),
            repr_limit,
        })
        .await
    }

    /// Run a `.py` file (relative to the workspace) as `__main__` with `sys.argv = [path, *argv]`,
    /// in the session's namespace (its variables stay afterwards).
    pub async fn run_file(
        &self,
        path: &str,
        argv: Vec<String>,
        sink: Arc<dyn CellSink>,
    ) -> Result<CellOutcome, ReplError> {
        let full: PathBuf = self.env.spec.workspace.join(path);
        let full = full.to_string_lossy().into_owned();
        let label = std::iter::once(format!("run_file {path}"))
            .chain(argv.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ");
        let repr_limit = self.env.repr_limit;
        self.run_cell(label, sink, |id, cell| Request::RunFile {
            id,
            cell,
            path: full.clone(),
            argv: argv.clone(),
            repr_limit,
        })
        .await
    }

    async fn run_cell(
        &self,
        label: String,
        sink: Arc<dyn CellSink>,
        request: impl FnOnce(u64, u64) -> Request,
    ) -> Result<CellOutcome, ReplError> {
        let guard = self
            .op_lock
            .clone()
            .try_lock_owned()
            .map_err(|_| self.busy())?;
        let (worker, state_lost) = self.live_worker(true)?;
        let cell = {
            let mut inner = self.inner();
            inner.cells += 1;
            inner.running_cell = inner.cells;
            inner.cells
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let rx = worker.call(id, &request(id, cell), Some(sink), Some(guard));
        let reply = rx
            .await
            .unwrap_or_else(|_| Reply::Died("the Python worker's I/O task ended".into()));
        let elapsed = started.elapsed();
        let mut out = CellOutcome {
            cell,
            status: CellStatus::Ok,
            value: None,
            value_chars: None,
            value_truncated: false,
            error: None,
            display: Vec::new(),
            worker_exit: None,
            state_lost,
            elapsed,
        };
        match reply {
            Reply::Event(Event::Done {
                status,
                value,
                error,
                display,
                ..
            }) => {
                out.status = match status {
                    WireStatus::Ok => CellStatus::Ok,
                    WireStatus::Error => CellStatus::Error,
                    WireStatus::Interrupted => CellStatus::Interrupted,
                };
                if let Some(v) = value {
                    out.value = Some(v.repr);
                    out.value_chars = Some(v.chars);
                    out.value_truncated = v.truncated;
                }
                out.error = error;
                out.display = display;
            }
            Reply::Event(other) => {
                return Err(ReplError::Protocol {
                    detail: format!("expected `done` for a cell, got {other:?}"),
                });
            }
            Reply::Died(message) => {
                out.status = CellStatus::WorkerDied;
                out.worker_exit = Some(message.to_string());
                out.state_lost = true;
                let mut inner = self.inner();
                if inner
                    .worker
                    .as_ref()
                    .is_some_and(|w| Arc::ptr_eq(w, &worker))
                {
                    inner.worker = None;
                    inner.state_lost = true;
                }
            }
        }
        let mut inner = self.inner();
        inner.last_active = Instant::now();
        inner.history.push_back(HistoryEntry {
            cell,
            code: label,
            status: out.status,
            elapsed_ms: (elapsed.as_secs_f64() * 1e6).round() / 1e3,
        });
        if inner.history.len() > HISTORY_CAP {
            inner.history.pop_front();
        }
        drop(inner);
        self.refill_spare();
        Ok(out)
    }

    /// KeyboardInterrupt in the running cell (also while it waits in `input()`).
    /// Returns false when no cell was running (nothing to interrupt).
    pub fn interrupt(&self) -> bool {
        if self.op_lock.try_lock().is_ok() {
            return false;
        }
        match self.inner().worker.clone() {
            Some(w) => {
                w.interrupt();
                true
            }
            None => false,
        }
    }

    /// Answer the pending `input()`: `eof` makes it raise EOFError instead.
    pub fn send_input(&self, text: &str, eof: bool) -> Result<(), ReplError> {
        let worker = self.inner().worker.clone();
        let not_waiting = || ReplError::NotAwaitingInput {
            session: self.name.clone(),
        };
        let worker = worker.ok_or_else(not_waiting)?;
        let text = (!eof).then(|| text.to_string());
        if worker.reply_input(text) {
            Ok(())
        } else {
            Err(not_waiting())
        }
    }

    /// Kill the worker's whole process group and start a fresh one; waits until it is
    /// ready. A running cell ends with `worker_died` ("stopped: the session was restarted").
    pub async fn restart(&self) -> Result<(), ReplError> {
        let worker = {
            let mut inner = self.inner();
            if inner.closed {
                return Err(ReplError::Closed {
                    session: self.name.clone(),
                });
            }
            if let Some(old) = inner.worker.take() {
                old.kill("the session was restarted");
            }
            inner.state_lost = false;
            inner.cells = 0;
            inner.history.clear();
            inner.last_active = Instant::now();
            let worker = self.fresh_worker(&mut inner)?;
            inner.worker = Some(worker.clone());
            worker
        };
        self.refill_spare();
        worker.wait_ready(self.env.start_timeout).await
    }

    /// Wait until the current worker is ready (for callers that want a warm session).
    pub async fn wait_ready(&self) -> Result<(), ReplError> {
        let (worker, _) = self.live_worker(false)?;
        worker.wait_ready(self.env.start_timeout).await
    }

    /// The cells run since the session started or was last restarted (last 1000).
    pub fn history(&self) -> Vec<HistoryEntry> {
        self.inner().history.iter().cloned().collect()
    }

    pub fn idle_for(&self) -> Duration {
        if self.op_lock.try_lock().is_err() {
            return Duration::ZERO;
        }
        self.inner().last_active.elapsed()
    }

    /// What the session is doing (cheap: no /proc read, unlike [`Session::info`]).
    pub fn state(&self) -> SessionState {
        let busy = self.op_lock.try_lock().is_err();
        let inner = self.inner();
        Self::state_of(&inner, busy)
    }

    fn state_of(inner: &Inner, busy: bool) -> SessionState {
        match inner.worker.as_ref().filter(|w| w.death().is_none()) {
            None => SessionState::Dead,
            Some(w) if w.awaiting_input().is_some() => SessionState::AwaitingInput,
            Some(_) if busy => SessionState::Busy,
            Some(_) => SessionState::Idle,
        }
    }

    pub fn info(&self) -> SessionInfo {
        let busy = self.op_lock.try_lock().is_err();
        let inner = self.inner();
        let live = inner.worker.as_ref().filter(|w| w.death().is_none());
        let state = Self::state_of(&inner, busy);
        let pid = live.map(|w| w.pid);
        SessionInfo {
            name: self.name.clone(),
            state,
            policy: self.env.policy_name.clone(),
            python: format!(
                "{} ({})",
                self.env.python.executable.display(),
                self.env.python.version
            ),
            worker_pid: pid,
            memory_bytes: live.map(|w| w.python_pid()).and_then(rss_bytes),
            idle_seconds: if busy {
                0
            } else {
                inner.last_active.elapsed().as_secs()
            },
            cells: inner.cells,
        }
    }

    /// Kill the worker (the session object is being dropped by its manager).
    pub(crate) fn close(&self) {
        let mut inner = self.inner();
        inner.closed = true;
        if let Some(w) = inner.worker.take() {
            w.kill("the session was closed");
        }
        if let Some(w) = inner.spare.take() {
            w.kill("the session was closed");
        }
    }
}

/// VmRSS of `pid` in bytes, from /proc.
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("name", &self.name)
            .field("policy", &self.env.policy_name)
            .finish()
    }
}
