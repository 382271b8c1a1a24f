//! One named session: its worker (replaced after a crash or restart), cells, variables,
//! input bridging and history.
//!
//! Concurrency: the worker's main thread runs one thing at a time. Who holds it is the
//! session's phase ([`phase::Phase`]: idle, a short operation, a cell, closing, closed),
//! changed only by [`phase::Machine::transition`] and published on a watch channel. A
//! call on a session that runs a cell fails at once with [`ReplError::Busy`] instead of
//! queueing behind it; one that finds a short operation (a variable read, the ping that
//! settles snapshots) waits for the phase to change. The hold ([`phase::OpGuard`])
//! travels with the pending call into the worker, so it is released when the worker
//! answers or dies — not when a caller gives up waiting.
//!
//! Locks, in the order they may be taken (a lock is only taken while holding the ones
//! above it; sessions share no lock):
//! 1. `Session::inner` (sync mutex): plain bookkeeping, never held across an await.
//! 2. the phase channel (`phase::Phases`, the watch's own lock): a leaf, held for one
//!    pure transition; taken under `inner` where a transition must be atomic with
//!    `Inner`'s data (numbering a cell, closing, the spare).
//! 3. a worker's locks (`pump::Shared`: `child` → `state`), taken under `inner` by calls
//!    such as `Worker::death` or `Worker::kill`; the worker never calls back into the
//!    session while holding one (the snapshot hook runs unlocked). The sandbox's broker
//!    denials lock (`Worker::take_denials`) is taken alone.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::graph::{CellCode, Graph, Node};
use super::protocol::{Event, Request, WireStatus};
use super::worker::{Reply, SpawnSpec, Worker};
use crate::sandbox::Termination;

use super::cell::{CellOutcome, CellSink, CellStatus};
use super::error::ReplError;
use super::info::{History, SessionInfo, SessionState};
use super::python::PythonInfo;

mod branch;
mod phase;
mod site_dirs;
mod variables;

use phase::{Effect, OpGuard, Phases, Refusal};

const HISTORY_CAP: usize = 1000;

/// The cell to branch from, as the agent named it.
#[derive(Debug, Clone)]
pub struct Parent {
    pub cell: u64,
    /// The id as written (for messages).
    pub text: String,
    /// Replaying from a fresh worker is allowed (it repeats side effects).
    pub replay: bool,
}

/// Everything a session needs to (re)start its worker.
pub(crate) struct SessionEnv {
    pub(crate) spec: SpawnSpec,
    pub(crate) policy_name: String,
    pub(crate) python: PythonInfo,
    pub(crate) repr_limit: usize,
    pub(crate) start_timeout: Duration,
    /// Keep a started, idle worker in reserve for restarts and crash recovery.
    pub(crate) spare: bool,
    /// Snapshots kept at most (0: off).
    pub(crate) max_snapshots: usize,
    /// Memory budget for snapshots, bytes: past it (the session's job cgroups), the
    /// least recently used snapshots are evicted. `None`: count cap only.
    pub(crate) snapshot_memory: Option<u64>,
    /// Where the cell graph is persisted (JSON lines).
    pub(crate) graph_file: Option<PathBuf>,
    /// Cells kept in the graph at most (0: all).
    pub(crate) max_cells: usize,
    /// When this server started (named in the note of a session restored from an
    /// earlier server's graph).
    pub(crate) started: std::time::SystemTime,
}

/// A session's bookkeeping, under `Session::inner` (lock 1 of the order above).
struct Inner {
    worker: Option<Arc<Worker>>,
    /// A started worker nobody has used yet: a restart or the cell after a crash takes
    /// it instead of waiting for a new interpreter to start.
    spare: Option<Arc<Worker>>,
    /// The session's state was lost since the last cell (a worker died, a cancel killed
    /// it, the session expired): the next cell is told so, in these words.
    lost: Option<String>,
    cells: u64,
    /// The running cell and its parent, once handed to its worker (for answers while it
    /// runs).
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
    /// Who holds the worker's main thread (lock 2 of the order above).
    phases: Phases,
    /// Lock 1 of the order above.
    inner: Mutex<Inner>,
    next_id: AtomicU64,
    /// For background tasks that refill the spare worker.
    me: std::sync::Weak<Session>,
}

/// A cell that holds the worker's main thread and has a worker to run on.
struct Acquired {
    guard: OpGuard,
    cell: u64,
    worker: Arc<Worker>,
    /// Why state was lost since the last cell (said once, by this cell).
    earlier_loss: Option<String>,
    replayed: Vec<u64>,
    /// The head this branch moved the session from.
    moved_from: Option<u64>,
    /// What the snapshot this branch forked from shares with its other branches.
    shared: Option<String>,
}

/// A cell handed to its worker.
struct Running {
    cell: u64,
    parent: Option<u64>,
    worker: Arc<Worker>,
    earlier_loss: Option<String>,
    replayed: Vec<u64>,
    moved_from: Option<u64>,
    shared: Option<String>,
    started_ms: u64,
    started: Instant,
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
            phases: Phases::new(),
            inner: Mutex::new(Inner {
                worker: Some(worker.clone()),
                spare: None,
                lost,
                cells: graph.last_cell(),
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
    pub fn python(&self) -> &PythonInfo {
        &self.env.python
    }

    /// The interpreter language of the session's workers.
    pub fn language(&self) -> super::interpreter::Language {
        self.env.spec.language
    }

    /// The session's private temp directory (`{tmp}`, also `TMPDIR` of the worker).
    pub(crate) fn tmp_dir(&self) -> &std::path::Path {
        &self.env.spec.tmp
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn closed(&self) -> ReplError {
        ReplError::Closed {
            session: self.name.clone(),
        }
    }

    /// The error for an op the phase turned away.
    fn refused(&self, why: Refusal) -> ReplError {
        match why {
            Refusal::Busy { cell } => ReplError::Busy {
                session: self.name.clone(),
                cell,
            },
            Refusal::Closed => self.closed(),
            other => ReplError::Protocol {
                detail: format!("the session's phase refused an operation: {other:?}"),
            },
        }
    }

    /// Take the worker's main thread: for a cell (`cell`: numbered here, the number is
    /// returned) or a short operation. [`ReplError::Busy`] while a cell runs, else as
    /// soon as the short operation holding it (if any) is done: two calls made in
    /// parallel (a cell and a variable read) both run; only a running cell turns the
    /// other away.
    async fn acquire(&self, cell: bool) -> Result<(OpGuard, u64), ReplError> {
        // Subscribed before the first try: a change after it wakes the wait below.
        let mut changes = self.phases.subscribe();
        loop {
            let tried = {
                let mut inner = self.inner();
                let ev = if cell {
                    phase::Event::BeginCell {
                        cell: inner.cells + 1,
                    }
                } else {
                    phase::Event::BeginShort
                };
                let tried = self.phases.apply(ev);
                if cell && tried.is_ok() {
                    inner.cells += 1;
                }
                tried.map(|(_, effect)| (effect, inner.cells))
            };
            match tried {
                Ok((Effect::Acquired { op }, cells)) => return Ok((self.phases.guard(op), cells)),
                Ok((other, _)) => {
                    return Err(ReplError::Protocol {
                        detail: format!("the session's phase answered {other:?} to an op"),
                    });
                }
                Err(Refusal::Wait) => {
                    if changes.changed().await.is_err() {
                        return Err(self.closed());
                    }
                }
                Err(why) => return Err(self.refused(why)),
            }
        }
    }

    /// The thread for a short operation, waited for as [`Session::acquire`] says.
    pub(super) async fn acquire_short(&self) -> Result<OpGuard, ReplError> {
        self.acquire(false).await.map(|(guard, _)| guard)
    }

    /// The thread for a short operation if it is free now; `None` if anything holds it.
    fn try_short(&self) -> Option<OpGuard> {
        match self.phases.apply(phase::Event::BeginShort) {
            Ok((_, Effect::Acquired { op })) => Some(self.phases.guard(op)),
            _ => None,
        }
    }

    /// The live worker, starting a fresh one if there is none or it died. The note says
    /// why state was lost since the last cell, if it was (reported once, by a cell).
    fn live_worker(&self, report_loss: bool) -> Result<(Arc<Worker>, Option<String>), ReplError> {
        let mut inner = self.inner();
        if self.phases.now().is_closed() {
            return Err(self.closed());
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

    /// Start a spare worker in the background if the session keeps one and has none (and
    /// none is starting: cells ending meanwhile start no other — each would be killed on
    /// arrival, and every cell of a quick loop started one).
    fn refill_spare(&self) {
        if !self.env.spare {
            return;
        }
        {
            let inner = self.inner();
            if inner.spare.as_ref().is_some_and(|w| w.death().is_none())
                || self.phases.apply(phase::Event::SpareStarting).is_err()
            {
                return;
            }
        }
        let me = self.me.clone();
        // Starting a process blocks for the launcher's setup: keep it off the async threads.
        tokio::task::spawn_blocking(move || {
            if let Some(session) = me.upgrade() {
                let started = Worker::spawn(&session.env.spec);
                session.keep_spare(started);
            }
        });
    }

    /// Put a spare that was started in reserve (unless the session closed meanwhile or
    /// has one); the start is over either way.
    fn keep_spare(&self, started: Result<Worker, ReplError>) {
        let worker = match started {
            Ok(w) => {
                w.on_snapshot(self.snapshot_hook());
                Arc::new(w)
            }
            Err(e) => {
                let _inner = self.inner();
                let _ = self.phases.apply(phase::Event::SpareDone);
                // A session closed meanwhile (shutdown, session_close) took its temp
                // dir away under the start: expected, not worth a warning.
                if self.phases.now().is_closed() {
                    tracing::debug!(session = %self.name, error = %e, "no spare worker: the session closed while it started");
                } else {
                    tracing::warn!(session = %self.name, error = %e, "could not start a spare worker");
                }
                return;
            }
        };
        let mut inner = self.inner();
        let _ = self.phases.apply(phase::Event::SpareDone);
        if !self.phases.now().is_closed()
            && inner.spare.as_ref().is_none_or(|w| w.death().is_some())
        {
            // Under the lock: a concurrent `set_site_dirs` cannot slip in between.
            self.apply_site_dirs(&worker, &inner.site_dirs);
            inner.spare = Some(worker);
        }
        // Otherwise `worker` is dropped here, which kills it.
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

    /// One cell: acquire the thread and a worker → dispatch the request → collect the
    /// answer → record the cell in the graph.
    async fn run_cell(
        &self,
        label: String,
        saved: CellCode,
        parent: Option<Parent>,
        sink: Arc<dyn CellSink>,
        request: impl FnOnce(u64, u64) -> Request,
    ) -> Result<CellOutcome, ReplError> {
        let acquired = self.acquire_cell(parent).await?;
        let (running, rx) = self.dispatch(acquired, sink, request);
        let reply = rx
            .await
            .unwrap_or_else(|_| Reply::Died("the Python worker's I/O task ended".into()));
        let out = self.collect(&running, reply)?;
        Ok(self.record(running, label, saved, out))
    }

    /// Take the thread for the next cell (numbering it) and the worker it runs on: the
    /// head, or for a branch the worker put at `parent`'s state.
    async fn acquire_cell(&self, parent: Option<Parent>) -> Result<Acquired, ReplError> {
        let (guard, cell) = self.acquire(true).await?;
        // Promised before a restart: refused before it picks or makes any worker.
        if self.phases.now().overtaken(guard.op()) {
            return Err(self.overtaken_cell(cell));
        }
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
        // A restart came while the worker was being picked (or a branch made).
        if self.phases.now().overtaken(guard.op()) {
            return Err(self.overtaken_cell(cell));
        }
        match got {
            Ok((worker, earlier_loss, replayed, shared)) => Ok(Acquired {
                guard,
                cell,
                worker,
                earlier_loss,
                replayed,
                moved_from,
                shared,
            }),
            Err(e) => {
                // The number is given back (the guard, dropped after, frees the thread).
                let mut inner = self.inner();
                if inner.cells == cell {
                    inner.cells -= 1;
                }
                Err(e)
            }
        }
    }

    /// The answer for cell number `cell`, overtaken by a restart before it had a worker:
    /// nothing of it ran. Its number was either taken before the restart reset the count
    /// (left alone) or is the first after it (given back).
    fn overtaken_cell(&self, cell: u64) -> ReplError {
        let mut inner = self.inner();
        if inner.cells == cell {
            inner.cells -= 1;
        }
        ReplError::Restarted {
            session: self.name.clone(),
        }
    }

    /// Hand the cell's request to its worker, with the hold on the thread (released when
    /// the worker answers or dies). An interrupt that came before is sent right after:
    /// the phase machine decides whether this or [`Session::interrupt`] sends it.
    fn dispatch(
        &self,
        a: Acquired,
        sink: Arc<dyn CellSink>,
        request: impl FnOnce(u64, u64) -> Request,
    ) -> (Running, oneshot::Receiver<Reply>) {
        let started_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or_default();
        let parent = {
            let mut inner = self.inner();
            let parent = inner.graph.head;
            inner.running = Some((a.cell, parent));
            parent
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let op = a.guard.op();
        let rx = a.worker.call(
            id,
            &request(id, a.cell),
            Some(sink),
            Some(Box::new(a.guard)),
        );
        if let Ok((_, Effect::SendInterrupt)) = self.phases.apply(phase::Event::Dispatched { op }) {
            a.worker.resume();
            a.worker.interrupt();
        }
        let running = Running {
            cell: a.cell,
            parent,
            worker: a.worker,
            earlier_loss: a.earlier_loss,
            replayed: a.replayed,
            moved_from: a.moved_from,
            shared: a.shared,
            started_ms,
            started,
        };
        (running, rx)
    }

    /// The cell's outcome from the worker's answer (a death is recorded: the next cell
    /// runs in a fresh worker and is told so).
    fn collect(&self, r: &Running, reply: Reply) -> Result<CellOutcome, ReplError> {
        let mut out = CellOutcome {
            cell: r.cell,
            parent: r.parent,
            replayed: r.replayed.clone(),
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
            state_lost: r.earlier_loss.is_some(),
            state_note: cell_note(r),
            denied: r.worker.take_denials(),
            elapsed: r.started.elapsed(),
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
            Reply::Died(message) => self.cell_died(&r.worker, &message, &mut out),
        }
        Ok(out)
    }

    /// The worker died in the cell: its answer names the death; only the next cell is
    /// told it runs in a fresh worker.
    fn cell_died(&self, worker: &Arc<Worker>, message: &str, out: &mut CellOutcome) {
        out.status = CellStatus::WorkerDied;
        out.worker_exit = Some(message.to_string());
        match worker.exit_status() {
            Some(Termination::Signaled(sig)) => out.signal = Some(sig),
            Some(Termination::Exited(code)) => out.exit_code = Some(code),
            _ => {}
        }
        out.state_lost = true;
        out.state_note = None;
        let mut inner = self.inner();
        if inner
            .worker
            .as_ref()
            .is_some_and(|w| Arc::ptr_eq(w, worker))
        {
            inner.worker = None;
            inner.lost = Some(lost_note(message));
            Self::head_lost(&mut inner);
        }
    }

    /// Add the cell to the graph (the head moves to it if its worker lives on).
    fn record(&self, r: Running, label: String, saved: CellCode, out: CellOutcome) -> CellOutcome {
        let mut inner = self.inner();
        inner.last_active = Instant::now();
        inner.running = None;
        inner.graph.add(Node {
            cell: r.cell,
            parent: r.parent,
            label,
            code: saved,
            status: out.status,
            started_ms: r.started_ms,
            elapsed_ms: (out.elapsed.as_secs_f64() * 1e6).round() / 1e3,
            replayed: r.replayed,
        });
        let alive = inner
            .worker
            .as_ref()
            .is_some_and(|w| Arc::ptr_eq(w, &r.worker));
        inner.graph.head = alive.then_some(r.cell);
        drop(inner);
        self.refill_spare();
        out
    }

    /// A cell is about to run for a caller who may cancel it before it starts (its job
    /// is answered "running" at once): until it starts, or [`Self::expected_cell_ended`],
    /// an interrupt is kept for it instead of finding nothing to interrupt.
    /// Returns the promise's number, for [`Self::expected_cell_ended`].
    pub fn expect_cell(&self) -> u64 {
        match self.phases.apply(phase::Event::ExpectCell) {
            Ok((_, Effect::Promised { id })) => id,
            _ => 0,
        }
    }

    /// The call that made promise `id` ended, having run its cell or not (refused before
    /// it started): an interrupt kept for it is dropped. A later call's promise is left
    /// alone.
    pub fn expected_cell_ended(&self, id: u64) {
        let _ = self.phases.apply(phase::Event::ExpectedEnded { id });
    }

    /// KeyboardInterrupt in the running cell (also while it waits in `input()`), or in
    /// the expected cell as it starts. Returns false when no cell was running or
    /// expected (nothing to interrupt).
    pub fn interrupt(&self) -> bool {
        self.interrupt_op().is_ok()
    }

    /// Interrupt (see [`Session::interrupt`]); the op of the cell that runs (handed to
    /// its worker or about to be), `None` when it is kept for an expected cell (raised
    /// before any of its code runs) or the closing session ends the cell.
    fn interrupt_op(&self) -> Result<Option<u64>, Refusal> {
        let (now, effect) = self.phases.apply(phase::Event::Interrupt)?;
        if effect == Effect::SendInterrupt {
            // A worker that has no call running any more (the cell just ended, or a
            // restart replaced it) ignores it.
            let worker = self.inner().worker.clone();
            if let Some(w) = worker {
                w.resume();
                w.interrupt();
            }
        }
        Ok(now.running_cell().and(now.held_op()))
    }

    /// Cancel the running cell: continue a stopped worker, KeyboardInterrupt, and if the
    /// same cell still runs `grace` later, kill the worker (the cell ends `worker_died`
    /// with the reason in words; the next call runs in a fresh worker, the spare if one is
    /// kept). False when no cell runs.
    pub fn cancel_cell(&self, grace: Duration) -> bool {
        let op = match self.interrupt_op() {
            Err(_) => return false,
            Ok(None) => return true,
            Ok(Some(op)) => op,
        };
        let me = self.me.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let Some(session) = me.upgrade() else { return };
            let now = session.phases.now();
            let Some(cell) = now.running_cell().filter(|_| now.held_op() == Some(op)) else {
                return;
            };
            let Some(worker) = session.inner().worker.clone() else {
                return;
            };
            let reason = format!(
                "the cell did not respond to KeyboardInterrupt within {}; the worker was restarted",
                seconds_words(grace)
            );
            tracing::info!(session = %session.name, cell, "{reason}");
            // The cell ends `worker_died` with this reason; the next call takes the spare
            // (already started) worker: the killed cell's op ends as its answer is in, so
            // that call is never told "busy".
            worker.kill(&reason);
        });
        true
    }

    /// Wait until op `op` (one a restart killed the worker of) has ended: its cell's
    /// answer is in (the I/O task has seen the death). Bounded, so a bug cannot hang
    /// the caller.
    async fn wait_op_ended(&self, op: Option<u64>) -> Result<(), ReplError> {
        let Some(op) = op else { return Ok(()) };
        let mut changes = self.phases.subscribe();
        let ended = changes.wait_for(|m| m.held_op() != Some(op));
        match tokio::time::timeout(self.env.start_timeout, ended).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(ReplError::Protocol {
                detail: "the stopped worker's cell did not end".into(),
            }),
        }
    }

    /// Why the next cell will run on a fresh state (expiry, crash, restart), if it will:
    /// said by the answers of tools that do not run a cell, without consuming it.
    pub(crate) fn pending_loss(&self) -> Option<String> {
        self.inner().lost.clone()
    }

    /// The state of this session was lost before it started (the session of this name
    /// expired): the first cell says so in `note`.
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
    /// ready. A running cell ends with `worker_died` ("stopped: the session was restarted");
    /// a cell that had taken the thread but no worker yet, or was promised to a caller
    /// (its job answered "running") and had not started, never runs: its call ends
    /// [`ReplError::Restarted`].
    pub async fn restart(&self) -> Result<(), ReplError> {
        let (worker, killed) = {
            let mut inner = self.inner();
            let now = self.phases.now();
            if now.is_closed() {
                return Err(self.closed());
            }
            // Under `inner`, as the worker is replaced: a cell that has not been handed
            // to a worker checks it there before it takes one (`acquire_cell`,
            // `switch_head`).
            let _ = self.phases.apply(phase::Event::Restart);
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
            (worker, now.held_op())
        };
        self.refill_spare();
        // Synchronous: the killed worker's op must have ended (the thread released) before
        // the restart answers, or the next call would find the session busy.
        self.wait_op_ended(killed).await?;
        self.wait_promise_taken().await;
        worker.wait_ready(self.env.start_timeout).await
    }

    /// Wait (bounded) until a cell promised before the restart has taken the thread and
    /// let it go again (overtaken, it never runs), or its call gave up: a call made after
    /// the restart answers is then neither mistaken for it nor told "busy" because of it.
    async fn wait_promise_taken(&self) {
        let mut changes = self.phases.subscribe();
        let gone = changes
            .wait_for(|m| !m.promise_overtaken() && !m.held_op().is_some_and(|op| m.overtaken(op)));
        if tokio::time::timeout(self.env.start_timeout, gone)
            .await
            .is_err()
        {
            tracing::warn!(
                session = %self.name,
                "a cell promised before the restart has not started; should it start after a \
                 later promise, it may run on the new worker"
            );
        }
    }

    /// The running cell and its parent, if a cell runs.
    pub(crate) fn running_cell(&self) -> Option<(u64, Option<u64>)> {
        self.phases.now().running_cell()?;
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

    /// Something holds the worker's main thread (a cell or a short operation).
    fn busy(&self) -> bool {
        self.phases.now().held_op().is_some()
    }

    pub(crate) fn idle_for(&self) -> Duration {
        if self.busy() {
            return Duration::ZERO;
        }
        self.inner().last_active.elapsed()
    }

    /// What the session is doing (cheap: no /proc read, unlike [`Session::info`]).
    pub fn state(&self) -> SessionState {
        let busy = self.busy();
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
        let busy = self.busy();
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
        let _ = self.phases.apply(phase::Event::Close);
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

/// What a cell's answer says about how it came to run where it did: state lost since
/// the last cell, else the head moving to a branch and what the branch shares.
fn cell_note(r: &Running) -> Option<String> {
    if let Some(loss) = &r.earlier_loss {
        return Some(loss.clone());
    }
    let moved = r.moved_from.map(|h| {
        format!(
            "the head moved from c{h} to this branch: cells without `parent` now run here; parent=\"c{h}\" goes back to c{h}'s state"
        )
    });
    let shared = r
        .shared
        .as_ref()
        .map(|s| format!("this branch shares with the parent cell's other branches: {s}"));
    match (moved, shared) {
        (Some(m), Some(s)) => Some(format!("{m}; {s}")),
        (m, s) => m.or(s),
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
