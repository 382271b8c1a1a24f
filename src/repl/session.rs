//! One named session: its worker (replaced after a crash or restart), cells, variables,
//! input bridging and history.
//!
//! Locks: `op_lock` (async, per session) serialises the calls that need the worker's
//! main thread — cells and variable operations. A call on a session that runs a cell
//! fails at once with [`ReplError::Busy`] instead of queueing behind it; one that finds
//! the lock held by a short operation (a variable read, the ping that settles snapshots,
//! a restart) waits for it ([`Session::op_guard`]). The guard travels with the pending
//! call into the worker, so it is released when the worker answers or dies — not when a
//! caller gives up waiting. `inner` (sync) guards
//! plain bookkeeping and is never held across an await. Sessions share no lock.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::graph::{CellCode, Graph, Node};
use super::protocol::{Event, Request, WireStatus};
use super::worker::{Reply, SpawnSpec, Worker};
use crate::sandbox::Termination;

use super::{
    CellOutcome, CellSink, CellStatus, History, PythonInfo, ReplError, SessionInfo, SessionState,
};

mod branch;
mod site_dirs;
mod variables;

pub use branch::Parent;
pub use variables::VariablePage;

const HISTORY_CAP: usize = 1000;

/// How often a call waiting for the operation lock looks whether a cell took it.
const OP_RECHECK: Duration = Duration::from_millis(20);

/// Everything a session needs to (re)start its worker.
pub(crate) struct SessionEnv {
    pub spec: SpawnSpec,
    pub policy_name: String,
    pub python: PythonInfo,
    pub repr_limit: usize,
    pub start_timeout: Duration,
    /// Keep a started, idle worker in reserve for restarts and crash recovery.
    pub spare: bool,
    /// Snapshots kept at most (0: off).
    pub max_snapshots: usize,
    /// Memory budget for snapshots, bytes: past it (the session's job cgroups), the
    /// least recently used snapshots are evicted. `None`: count cap only.
    pub snapshot_memory: Option<u64>,
    /// Where the cell graph is persisted (JSON lines).
    pub graph_file: Option<PathBuf>,
    /// Cells kept in the graph at most (0: all).
    pub max_cells: usize,
    /// When this server started (named in the note of a session restored from an
    /// earlier server's graph).
    pub started: std::time::SystemTime,
}

struct Inner {
    worker: Option<Arc<Worker>>,
    /// A started worker nobody has used yet: a restart or the cell after a crash takes
    /// it instead of waiting for a new interpreter to start.
    spare: Option<Arc<Worker>>,
    /// A spare is being started: cells ending meanwhile start no other (each would be
    /// killed on arrival, and every cell of a quick loop started one).
    spare_starting: bool,
    closed: bool,
    /// The session's state was lost since the last cell (a worker died, a cancel killed
    /// it, the session expired): the next cell is told so, in these words.
    lost: Option<String>,
    cells: u64,
    running_cell: u64,
    /// A cell holds the operation lock (not a variable operation).
    cell_active: bool,
    /// An interrupt came before the running cell was handed to its worker: it is sent
    /// right after.
    interrupt_pending: bool,
    /// A cell was promised to a caller (its job exists: it may be cancelled already) and
    /// has not started yet: an interrupt meanwhile is kept for it, not dropped.
    cell_expected: bool,
    /// The running cell and its parent, once numbered (for answers while it runs).
    running: Option<(u64, Option<u64>)>,
    /// The cells, their parents and snapshots; `graph.head` is the head's cell.
    graph: Graph,
    /// Spawned workers replaced as the head by a branch, by pid (their process group):
    /// killed but not reaped, so ending one kills its tree (snapshots, forked heads).
    roots: HashMap<u32, Arc<Worker>>,
    /// The process tree (root pid) the head belongs to.
    head_tree: u32,
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
        let graph = Graph::open(env.max_snapshots, env.max_cells, env.graph_file.clone());
        // Cells from an earlier server's graph: the worker that held their state died
        // with that server. The first cell says so (the graph and history stay).
        let lost = (graph.last_cell() > 0).then(|| restart_note(env.started));
        let session = Arc::new_cyclic(|me| Session {
            name,
            env,
            me: me.clone(),
            op_lock: Arc::new(tokio::sync::Mutex::new(())),
            inner: Mutex::new(Inner {
                worker: Some(worker.clone()),
                spare: None,
                spare_starting: false,
                closed: false,
                lost,
                cells: graph.last_cell(),
                running_cell: 0,
                cell_active: false,
                interrupt_pending: false,
                cell_expected: false,
                running: None,
                head_tree: worker.pid,
                graph,
                roots: HashMap::new(),
                last_active: Instant::now(),
                site_dirs: site_dirs.clone(),
            }),
            next_id: AtomicU64::new(1),
        });
        worker.on_snapshot(session.snapshot_hook());
        session.apply_site_dirs(&worker, &site_dirs);
        Ok(session)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The interpreter the session's workers run.
    pub fn python(&self) -> &super::PythonInfo {
        &self.env.python
    }

    /// The interpreter language of the session's workers.
    pub fn language(&self) -> super::Language {
        self.env.spec.language
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

    /// The live worker, starting a fresh one if there is none or it died. The note says
    /// why state was lost since the last cell, if it was (reported once, by a cell).
    fn live_worker(&self, report_loss: bool) -> Result<(Arc<Worker>, Option<String>), ReplError> {
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
            let lost = if report_loss { inner.lost.take() } else { None };
            return Ok((w, lost));
        }
        if let Some(dead) = inner.worker.take() {
            if inner.lost.is_none() {
                let how = dead
                    .death()
                    .unwrap_or_else(|| "the Python worker ended".into());
                inner.lost = Some(lost_note(&how));
            }
            Self::head_lost(&mut inner);
        }
        let worker = self.fresh_worker(&mut inner)?;
        inner.head_tree = worker.pid;
        inner.worker = Some(worker.clone());
        let lost = if report_loss { inner.lost.take() } else { None };
        drop(inner);
        self.refill_spare_after(&worker);
        Ok((worker, lost))
    }

    /// Refill the spare once `worker` is ready (or failed to start): a spare started at
    /// the same moment would compete with it for the CPU, delaying the cell that waits on
    /// it (the first `python_exec` of a server pays for two interpreter starts otherwise).
    fn refill_spare_after(&self, worker: &Arc<Worker>) {
        if !self.env.spare {
            return;
        }
        let me = self.me.clone();
        let worker = worker.clone();
        let timeout = self.env.start_timeout;
        tokio::spawn(async move {
            // Ready or not, the spare is wanted: a failed start is retried from it.
            let _ = worker.wait_ready(timeout).await;
            drop(worker);
            if let Some(session) = me.upgrade() {
                session.refill_spare();
            }
        });
    }

    /// The spare worker if it is alive, else a newly started one (both have had the
    /// start-up hook).
    fn fresh_worker(&self, inner: &mut Inner) -> Result<Arc<Worker>, ReplError> {
        match inner.spare.take() {
            Some(w) if w.death().is_none() => Ok(w),
            _ => {
                let w = Arc::new(Worker::spawn(&self.env.spec)?);
                w.on_snapshot(self.snapshot_hook());
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
            let mut inner = self.inner();
            if inner.closed
                || inner.spare_starting
                || inner.spare.as_ref().is_some_and(|w| w.death().is_none())
            {
                return;
            }
            inner.spare_starting = true;
        }
        let me = self.me.clone();
        // Starting a process blocks for the launcher's setup: keep it off the async threads.
        tokio::task::spawn_blocking(move || {
            let Some(session) = me.upgrade() else { return };
            let worker = match Worker::spawn(&session.env.spec) {
                Ok(w) => {
                    w.on_snapshot(session.snapshot_hook());
                    Arc::new(w)
                }
                Err(e) => {
                    let mut inner = session.inner();
                    inner.spare_starting = false;
                    // A session closed meanwhile (shutdown, session_close) took its temp
                    // dir away under the start: expected, not worth a warning.
                    if inner.closed {
                        tracing::debug!(session = %session.name, error = %e, "no spare worker: the session closed while it started");
                    } else {
                        tracing::warn!(session = %session.name, error = %e, "could not start a spare worker");
                    }
                    return;
                }
            };
            let mut inner = session.inner();
            inner.spare_starting = false;
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
        self.execute_on(code, None, sink).await
    }

    /// Run `code` as the next cell on the state right after cell `parent` (see
    /// docs/branching.md), or on the head when `parent` is `None`.
    pub async fn execute_on(
        &self,
        code: &str,
        parent: Option<Parent>,
        sink: Arc<dyn CellSink>,
    ) -> Result<CellOutcome, ReplError> {
        let repr_limit = self.env.repr_limit;
        let saved = CellCode::Execute {
            code: code.to_string(),
        };
        self.run_cell(code.to_string(), saved, parent, sink, |id, cell| {
            Request::Execute {
                id,
                cell,
                code: code.to_string(),
                repr_limit,
            }
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
        // Quoted as a shell would, so the history keeps each argument exactly.
        let label = std::iter::once("run_file".to_string())
            .chain(
                std::iter::once(path)
                    .chain(argv.iter().map(String::as_str))
                    .map(|a| {
                        shlex::try_quote(a).map_or_else(|_| format!("{a:?}"), |q| q.into_owned())
                    }),
            )
            .collect::<Vec<_>>()
            .join(" ");
        let repr_limit = self.env.repr_limit;
        let saved = CellCode::RunFile {
            path: full.clone(),
            argv: argv.clone(),
        };
        self.run_cell(label, saved, None, sink, |id, cell| Request::RunFile {
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
        saved: CellCode,
        parent: Option<Parent>,
        sink: Arc<dyn CellSink>,
        request: impl FnOnce(u64, u64) -> Request,
    ) -> Result<CellOutcome, ReplError> {
        let guard = self.op_guard().await?;
        let cell = {
            let mut inner = self.inner();
            inner.cells += 1;
            inner.running_cell = inner.cells;
            inner.cell_active = true;
            // An interrupt kept while this cell was expected is its own; any other is stale.
            let expected = std::mem::take(&mut inner.cell_expected);
            inner.interrupt_pending &= expected;
            inner.cells
        };
        // A branch moves the head: the answer says from where, and how to go back.
        let moved_from = {
            let head = self.inner().graph.head;
            parent.as_ref().and_then(|p| head.filter(|&h| h != p.cell))
        };
        let got = match parent {
            None => self
                .live_worker(true)
                .map(|(w, lost)| (w, lost, Vec::new(), None)),
            Some(p) => self
                .branch_to(&p)
                .await
                .map(|(w, replayed, shared)| (w, None, replayed, shared)),
        };
        let (worker, earlier_loss, replayed, shared) = match got {
            Ok(w) => w,
            Err(e) => {
                let mut inner = self.inner();
                inner.cells -= 1;
                inner.cell_active = false;
                return Err(e);
            }
        };
        let started_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or_default();
        let parent = {
            let mut inner = self.inner();
            let parent = inner.graph.head;
            inner.running = Some((cell, parent));
            parent
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let rx = {
            // Under `inner`, like `interrupt`: an interrupt is either sent by it (the call
            // is registered) or left pending for us.
            let mut inner = self.inner();
            let rx = worker.call(id, &request(id, cell), Some(sink), Some(guard));
            if std::mem::take(&mut inner.interrupt_pending) {
                worker.resume();
                worker.interrupt();
            }
            rx
        };
        let reply = rx
            .await
            .unwrap_or_else(|_| Reply::Died("the Python worker's I/O task ended".into()));
        {
            let mut inner = self.inner();
            inner.cell_active = false;
            inner.interrupt_pending = false;
        }
        let elapsed = started.elapsed();
        let mut out = CellOutcome {
            cell,
            parent,
            replayed: replayed.clone(),
            status: CellStatus::Ok,
            value: None,
            value_chars: None,
            value_truncated: false,
            error: None,
            display: Vec::new(),
            new_variables: Vec::new(),
            worker_exit: None,
            signal: None,
            exit_code: None,
            state_lost: earlier_loss.is_some(),
            state_note: earlier_loss.or_else(|| {
                let moved = moved_from.map(|h| {
                    format!(
                        "the head moved from c{h} to this branch: cells without `parent` now run here; parent=\"c{h}\" goes back to c{h}'s state"
                    )
                });
                let shared = shared.map(|s| {
                    format!("this branch shares with the parent cell's other branches: {s}")
                });
                match (moved, shared) {
                    (Some(m), Some(s)) => Some(format!("{m}; {s}")),
                    (m, s) => m.or(s),
                }
            }),
            denied: worker.take_denials(),
            elapsed,
        };
        match reply {
            Reply::Event(Event::Done {
                status,
                value,
                error,
                display,
                new_variables,
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
                out.new_variables = new_variables;
            }
            Reply::Event(other) => {
                return Err(ReplError::Protocol {
                    detail: format!("expected `done` for a cell, got {other:?}"),
                });
            }
            Reply::Died(message) => {
                out.status = CellStatus::WorkerDied;
                out.worker_exit = Some(message.to_string());
                match worker.exit_status() {
                    Some(Termination::Signaled(sig)) => out.signal = Some(sig),
                    Some(Termination::Exited(code)) => out.exit_code = Some(code),
                    _ => {}
                }
                // This cell's own answer names the death; only the next cell is told
                // it runs in a fresh worker.
                out.state_lost = true;
                out.state_note = None;
                let mut inner = self.inner();
                if inner
                    .worker
                    .as_ref()
                    .is_some_and(|w| Arc::ptr_eq(w, &worker))
                {
                    inner.worker = None;
                    inner.lost = Some(lost_note(&message));
                    Self::head_lost(&mut inner);
                }
            }
        }
        let mut inner = self.inner();
        inner.last_active = Instant::now();
        inner.running = None;
        inner.graph.add(Node {
            cell,
            parent,
            label,
            code: saved,
            status: out.status,
            started_ms,
            elapsed_ms: (elapsed.as_secs_f64() * 1e6).round() / 1e3,
            replayed,
        });
        let alive = inner
            .worker
            .as_ref()
            .is_some_and(|w| Arc::ptr_eq(w, &worker));
        inner.graph.head = alive.then_some(cell);
        drop(inner);
        self.refill_spare();
        Ok(out)
    }

    /// A cell is about to run for a caller who may cancel it before it starts (its job
    /// is answered "running" at once): until it starts, or [`Self::expected_cell_ended`],
    /// an interrupt is kept for it instead of finding nothing to interrupt.
    pub fn expect_cell(&self) {
        let mut inner = self.inner();
        inner.cell_expected = true;
        inner.interrupt_pending = false;
    }

    /// The call of an expected cell ended, having run it or not (refused before it
    /// started): an interrupt kept for it is dropped.
    pub fn expected_cell_ended(&self) {
        let mut inner = self.inner();
        if std::mem::take(&mut inner.cell_expected) {
            inner.interrupt_pending = false;
        }
    }

    /// KeyboardInterrupt in the running cell (also while it waits in `input()`), or in
    /// the expected cell as it starts. Returns false when no cell was running or
    /// expected (nothing to interrupt).
    pub fn interrupt(&self) -> bool {
        let mut inner = self.inner();
        if inner.cell_expected && !inner.cell_active {
            inner.interrupt_pending = true;
            return true;
        }
        if !inner.cell_active || self.op_lock.try_lock().is_ok() {
            return false;
        }
        let worker = inner.worker.clone();
        match worker {
            Some(w) => {
                w.resume();
                if !w.interrupt() {
                    inner.interrupt_pending = true;
                }
            }
            None => inner.interrupt_pending = true,
        }
        true
    }

    /// Cancel the running cell: continue a stopped worker, KeyboardInterrupt, and if the
    /// same cell still runs `grace` later, kill the worker (the cell ends `worker_died`
    /// with the reason in words; the next call runs in a fresh worker, the spare if one is
    /// kept). False when no cell runs.
    pub fn cancel_cell(&self, grace: Duration) -> bool {
        if !self.interrupt() {
            return false;
        }
        let cell = self.inner().running_cell;
        let me = self.me.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let Some(session) = me.upgrade() else { return };
            let worker = {
                let inner = session.inner();
                let running = session.op_lock.try_lock().is_err()
                    && inner.cell_active
                    && inner.running_cell == cell;
                match inner.worker.clone() {
                    Some(w) if running => w,
                    _ => return,
                }
            };
            let reason = format!(
                "the cell did not respond to KeyboardInterrupt within {}; the worker was restarted",
                seconds_words(grace)
            );
            tracing::info!(session = %session.name, cell, "{reason}");
            // The cell ends `worker_died` with this reason; the next call takes the spare
            // (already started) worker. Nothing holds the session's lock meanwhile, so
            // that call is never told "busy".
            worker.kill(&reason);
        });
        true
    }

    /// The operation lock for a cell or a variable operation: [`ReplError::Busy`] while a
    /// cell runs, else as soon as the short operation holding it (if any) is done. Two
    /// calls made in parallel (a cell and a variable read, a cell and `python_history`)
    /// both run; only a running cell turns the other away.
    pub(crate) async fn op_guard(&self) -> Result<tokio::sync::OwnedMutexGuard<()>, ReplError> {
        loop {
            if let Ok(guard) = self.op_lock.clone().try_lock_owned() {
                return Ok(guard);
            }
            if self.inner().cell_active {
                return Err(self.busy());
            }
            // Queued for the lock, and looking again now and then: a cell that took it
            // first means busy, not a wait as long as that cell.
            let wait = self.op_lock.clone().lock_owned();
            if let Ok(guard) = tokio::time::timeout(OP_RECHECK, wait).await {
                return Ok(guard);
            }
        }
    }

    /// The operation lock, waited for (a killed worker's cell releases it as soon as the
    /// I/O task has seen the death). Bounded, so a bug cannot hang the caller.
    async fn wait_op_lock(&self) -> Result<tokio::sync::OwnedMutexGuard<()>, ReplError> {
        tokio::time::timeout(self.env.start_timeout, self.op_lock.clone().lock_owned())
            .await
            .map_err(|_| ReplError::Protocol {
                detail: "the stopped worker's cell did not end".into(),
            })
    }

    /// The state of this session was lost before it started (the session of this name
    /// expired): the first cell says so in `note`.
    /// Why the next cell will run on a fresh state (expiry, crash, restart), if it will:
    /// said by the answers of tools that do not run a cell, without consuming it.
    pub fn pending_loss(&self) -> Option<String> {
        self.inner().lost.clone()
    }

    pub(crate) fn mark_state_lost(&self, note: String) {
        self.inner().lost = Some(note);
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
            for (_, root) in inner.roots.drain() {
                root.end_tree("the session was restarted");
            }
            inner.lost = None;
            inner.cells = 0;
            inner.graph.clear();
            inner.last_active = Instant::now();
            let worker = self.fresh_worker(&mut inner)?;
            inner.head_tree = worker.pid;
            inner.worker = Some(worker.clone());
            worker
        };
        self.refill_spare();
        // Synchronous: the killed worker's cell must have ended (its lock released) before
        // the restart answers, or the next call would find the session busy.
        let guard = self.wait_op_lock().await?;
        let ready = worker.wait_ready(self.env.start_timeout).await;
        drop(guard);
        ready
    }

    /// The running cell and its parent, if a cell runs.
    pub fn running_cell(&self) -> Option<(u64, Option<u64>)> {
        if self.op_lock.try_lock().is_ok() {
            return None;
        }
        self.inner().running
    }

    /// Wait until the current worker is ready (for callers that want a warm session).
    pub async fn wait_ready(&self) -> Result<(), ReplError> {
        let (worker, _) = self.live_worker(false)?;
        worker.wait_ready(self.env.start_timeout).await
    }

    /// The cells run since the session started or was last restarted (last 1000), as a
    /// graph: parents, snapshots, the head; and how many older ones retention dropped.
    pub fn history(&self) -> History {
        let inner = self.inner();
        let mut cells = inner.graph.entries();
        let skip = cells.len().saturating_sub(HISTORY_CAP);
        cells.drain(..skip);
        History {
            cells,
            dropped: inner.graph.dropped_note(),
        }
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
        let pid = live.map(|w| w.python_pid());
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
            memory_bytes: pid.and_then(rss_bytes),
            held_memory_bytes: Self::trees_memory(&inner),
            idle_seconds: if busy {
                0
            } else {
                inner.last_active.elapsed().as_secs()
            },
            cells: inner.cells,
            snapshots: inner.graph.held_count(),
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
        for (_, root) in inner.roots.drain() {
            root.end_tree("the session was closed");
        }
        inner.graph.close("the session was closed");
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

/// The note for the first cell after state was lost because a worker ended.
fn lost_note(how: &str) -> String {
    format!(
        "the previous worker ended ({how}); this ran in a fresh worker and earlier state is lost"
    )
}

/// The note for the first cell of a session restored from an earlier server's graph.
fn restart_note(started: std::time::SystemTime) -> String {
    let at = chrono::DateTime::<chrono::Utc>::from(started)
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    format!(
        "the server restarted at {at}; variables are gone; workspace files, the venv and the \
         history remain (python_history shows the earlier cells); this ran in a fresh worker"
    )
}

/// "2 s", "0.5 s".
fn seconds_words(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s} s")
    }
}
