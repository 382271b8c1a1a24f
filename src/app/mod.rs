//! The application layer: the use cases the tools call — run a cell, run a shell job,
//! install, script, sessions, job queries — over the subsystems below (repl, jobs, envs,
//! sandbox). It returns domain types ([`JobView`], `jobs::JobSummary`, ...) and
//! [`AppError`]; it knows nothing of MCP (the server renders and maps errors).
//!
//! One [`App`] per server holds the Python [`SessionManager`] and the [`JobStore`]; every
//! execution is a job. It owns workspace confinement ([`workspace::Workspace`]), per-job
//! temp dirs ([`tmp`]) and policy resolution.
//!
//! Python: `python_exec` creates a job, registers a [`python::PyControl`] (cancel →
//! interrupt, input → the pending `input()`), and spawns a task running the cell with a
//! [`python::JobSink`] that spools output into the job. Shell: `jobs::start_shell_job`.
//! Either way the call then waits on the store for up to its window ([`App::follow`]):
//! a quick job answers inline, a slow one answers with its id and the output so far.
//!
//! Shutdown: sessions first (workers and their process groups are killed, so running
//! cells end at once), then the store (kills shell job groups, records the rest).

mod call;
mod config;
mod envs;
mod error;
pub(crate) mod images;
mod jobs;
mod lifecycle;
mod owners;
mod python;
pub(crate) mod result;
pub(crate) mod scripts;
pub(crate) mod settings;
pub(crate) mod tmp;
pub(crate) mod workspace;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OnceCell, watch};

pub use call::{Call, ProgressSink};
pub use config::Config;
pub use envs::{EnvInfo, EnvInfoRequest, InstallArgs, ScriptArgs};
pub use error::{AppError, AppResult};
pub use jobs::{Chunk, OutputStream, ShellArgs};
pub use lifecycle::Lifecycle;
pub use python::{VarsOutcome, VarsRequest};
pub use settings::{ClientSandbox, SandboxRequest, Settings, Sources};

use crate::jobs::store::WaitFor;
use crate::jobs::{JobKind, JobSnapshot, JobStatus, JobStore, StoreConfig};
use crate::names::DEFAULT_SESSION;
use crate::repl::{ReplConfig, SessionManager};
use crate::sandbox::{Placeholders, Policy, ResolvedPolicy};
use settings::State;
use workspace::Workspace;

/// A job as a call answers it: the snapshot, plus what the sandbox blocked in words
/// (found in the output of a job that failed).
#[derive(Debug, Clone)]
pub struct JobView {
    pub snapshot: JobSnapshot,
    pub denied: Vec<String>,
    /// A Python cell still running: its cell number and the cell it runs on top of
    /// (finished cells carry both in their result).
    pub running_cell: Option<(u64, Option<u64>)>,
}

/// The server's policy resolved for the workspace, for one settings generation.
#[derive(Clone)]
struct BasePolicy {
    /// Its `{tmp}` is `<state>/shell-tmp`: what denials are explained against.
    policy: Arc<ResolvedPolicy>,
    placeholders: Placeholders,
    /// What every shell job runs under when its `{tmp}` is a tmpfs in a view of its own
    /// (see [`App::job_policy`]), resolved once.
    shared: Option<Arc<ResolvedPolicy>>,
}

pub struct App {
    sessions: Arc<SessionManager>,
    store: Arc<JobStore>,
    /// The policy and workspace new sessions and jobs get; the client may change them
    /// ([`App::apply_sandbox_request`], [`App::apply_roots`]).
    settings: Mutex<State>,
    state_dir: PathBuf,
    response_bytes: usize,
    /// The server's policy resolved for the workspace on first use (needs the
    /// interpreter's prefixes), for the settings generation it was resolved from.
    shell_policy: Mutex<Option<(u64, BasePolicy)>>,
    /// The job currently running in each session, to point a caller at it when busy.
    running: Mutex<HashMap<String, String>>,
    /// uv venvs, installs and scripts (built on first use: needs the interpreter).
    envs: OnceCell<Arc<crate::envs::EnvManager>>,
    /// The uv executable, if configured.
    uv: Option<PathBuf>,
    /// Disk bounds of the package stores.
    env_disk: crate::envs::DiskCaps,
    /// Whose app this is (`Config::principal`): part of every store's key.
    principal: Option<String>,
    /// The sandbox runtime every spawn goes through (`Config::sandbox`).
    sandbox: crate::sandbox::Runtime,
    /// Set when shutdown begins, so a background prewarm does not leave a worker behind.
    stopping: AtomicBool,
    /// Turns `true` once what earlier servers left has been swept.
    settled: watch::Receiver<bool>,
    /// The drain flag (shared by every app of the server).
    lifecycle: Arc<Lifecycle>,
    /// How the default session's prewarm went (for `/readyz`).
    warmth: Mutex<lifecycle::Warmth>,
    /// Whether this host enforces the server's policy, once checked (for `/readyz`); when
    /// it does but not with a cgroup per job, the words saying so.
    enforceable: Mutex<Option<Result<Option<String>, String>>>,
    /// This server's ownership record in the state dir, locked while it lives.
    _owner: owners::Registration,
}

/// Sweep what earlier servers left ([`sweep_leftovers`]) on a thread of its own, off the
/// path to the first answer (it reads cgroup trees, and kills and waits for leftover
/// processes); the receiver turns `true` when it is done ([`App::settled`]).
fn sweep_in_background(
    state_dir: &std::path::Path,
    sandbox: &crate::sandbox::Runtime,
) -> watch::Receiver<bool> {
    let sandbox = sandbox.clone();
    let (done, settled) = watch::channel(false);
    let state_dir = state_dir.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("sweep".into())
        .spawn(move || {
            sweep_leftovers(&state_dir, &sandbox);
            let _ = done.send(true);
        });
    if let Err(e) = spawned {
        // Nothing is lost: the next server sweeps again.
        tracing::warn!("cannot start the thread that sweeps what earlier servers left: {e}");
        return watch::channel(true).1;
    }
    settled
}

/// What servers of this state dir that ended without cleaning up (killed) left behind:
/// their job cgroups (any process still in one is killed first) and their temp files in
/// `state_dir`; only servers whose ownership record is free (`owners`) are taken for
/// ended. Said at info level, since it means an earlier server did not end cleanly.
fn sweep_leftovers(state_dir: &std::path::Path, sandbox: &crate::sandbox::Runtime) {
    let ended = owners::ended(state_dir, crate::sandbox::parent::instance::is_id);
    let ids: Vec<String> = ended.iter().map(|e| e.id.clone()).collect();
    let cgroups = sandbox.sweep_cgroups_of(&ids);
    let mut files = tmp::sweep_closed_sessions(state_dir);
    for e in ended {
        files.extend(tmp::sweep_owner(state_dir, &e.id));
        e.forget();
    }
    if !cgroups.is_empty() || !files.is_empty() {
        let show = |v: &[PathBuf]| {
            v.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        tracing::info!(
            "swept what an earlier server left: {} job cgroup(s) [{}], {} temp path(s) [{}]",
            cgroups.len(),
            show(&cgroups),
            files.len(),
            show(&files)
        );
    }
}

impl App {
    /// Build from the config: workspace, policy, state dir, store, sessions.
    pub fn new(cfg: &Config) -> Result<App, AppError> {
        // Proxy-mode jobs get their network through the broker, served on this runtime.
        crate::broker::install(&cfg.sandbox);
        let workspace = match &cfg.workspace {
            Some(w) => w.clone(),
            None => std::env::current_dir().map_err(AppError::CurrentDir)?,
        };
        let workspace = workspace
            .canonicalize()
            .map_err(|error| AppError::Workspace {
                path: workspace.clone(),
                error,
            })?;
        if !workspace.is_dir() {
            return Err(AppError::WorkspaceNotADirectory { path: workspace });
        }
        let policy = Policy::load(&cfg.policy)?;
        let state_dir = cfg
            .state_dir
            .clone()
            .unwrap_or_else(crate::jobs::default_state_dir);
        std::fs::create_dir_all(&state_dir).map_err(|error| AppError::StateDir {
            path: state_dir.clone(),
            error,
        })?;
        let state_dir = state_dir
            .canonicalize()
            .map_err(|error| AppError::StateDir {
                path: state_dir.clone(),
                error,
            })?;
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .and_then(|h| PathBuf::from(h).canonicalize().ok());
        // A broad --workspace is refused at once; a broad directory the server was merely
        // started in (clients launch servers from `/` or `~`) only once it is clear the
        // client names no other: the first tool call that needs a workspace says so.
        let broad_start = match workspace::check_breadth(
            &workspace,
            &state_dir,
            home.as_deref(),
            cfg.allow_broad_workspace,
        ) {
            Ok(()) => None,
            Err(AppError::BroadWorkspace { why, .. })
                if cfg.workspace.is_none() && cfg.sources.workspace_from_roots =>
            {
                tracing::info!(
                    "started in {} ({why}): waiting for the client to name the workspace",
                    workspace.display()
                );
                Some(why)
            }
            Err(e) => return Err(e),
        };
        // Recorded before the sweep starts and before any job: no server, in any PID
        // namespace, takes this one for ended while it lives.
        let owner = owners::register(&state_dir, cfg.sandbox.instance_id())?;
        let settled = sweep_in_background(&state_dir, &cfg.sandbox);
        let store = JobStore::open(StoreConfig {
            state_dir: state_dir.clone(),
            disk_cap: cfg.disk_cap,
            response_bytes: cfg.response_bytes,
            retention: cfg.retention,
            max_running: cfg.max_running_jobs,
        })?;
        let settings = State::new(
            cfg.sources.clone(),
            policy,
            workspace.clone(),
            state_dir.clone(),
            broad_start,
        )?;
        let policy = settings.current.policy.clone();
        let mut repl = ReplConfig::new(cfg.sandbox.clone(), workspace, policy, state_dir.clone());
        repl.python = cfg.python.clone();
        repl.interpreter = cfg.interpreter;
        repl.max_sessions = cfg.max_sessions;
        repl.idle_ttl = cfg.session_ttl;
        repl.max_snapshots = cfg.max_snapshots;
        repl.snapshot_memory = cfg.snapshot_memory;
        repl.snapshot_idle = cfg.snapshot_idle;
        repl.max_cells = cfg.max_cells;
        repl.repr_limit = cfg.response_bytes.min(20_000);
        Ok(App {
            sessions: SessionManager::new(repl),
            store,
            settings: Mutex::new(settings),
            state_dir,
            response_bytes: cfg.response_bytes,
            shell_policy: Mutex::new(None),
            running: Mutex::new(HashMap::new()),
            stopping: AtomicBool::new(false),
            settled,
            lifecycle: Arc::new(Lifecycle::default()),
            warmth: Mutex::new(lifecycle::Warmth::default()),
            enforceable: Mutex::new(None),
            _owner: owner,
            envs: OnceCell::new(),
            uv: cfg.uv.clone(),
            env_disk: cfg.env_disk,
            principal: cfg.principal.clone(),
            sandbox: cfg.sandbox.clone(),
        })
    }

    /// Returns once what earlier servers left (job cgroups and their processes, temp
    /// files) has been swept: the start-up does not wait for it, the first tool call does,
    /// so no call sees a half-swept state dir.
    pub async fn settled(&self) {
        let mut settled = self.settled.clone();
        // An error means the sweeping thread is gone: nothing is left to wait for.
        let _ = settled.wait_for(|done| *done).await;
    }

    /// What new sessions and jobs get now.
    pub fn settings(&self) -> Arc<Settings> {
        self.lock_settings().current.clone()
    }

    /// Where the settings may come from (fixed at start).
    pub fn sources(&self) -> Sources {
        self.lock_settings().sources.clone()
    }

    fn lock_settings(&self) -> std::sync::MutexGuard<'_, State> {
        self.settings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The workspace new jobs run in, or why there is none yet.
    fn workspace(&self) -> Result<Workspace, AppError> {
        self.settings().workspace().cloned()
    }

    /// The client asked for a sandbox (honoured only under `--sandbox-state inherit`):
    /// sessions and jobs started from now on run under it.
    pub fn apply_sandbox_request(
        &self,
        request: SandboxRequest,
    ) -> Result<Arc<Settings>, AppError> {
        let mut state = self.lock_settings();
        if !state.sources.inherit_sandbox {
            return Err(AppError::SandboxNotInherited);
        }
        let next = state.apply_request(request)?;
        self.publish(&next);
        Ok(next)
    }

    /// The sandbox state the client sent with a tool call (today's Codex; honoured only
    /// under `--sandbox-state inherit`): new sessions and jobs run under it, and so does
    /// the session each later call uses ([`App::session`] starts it again if needed).
    /// `None` when it repeats the last one.
    pub fn apply_client_sandbox(
        &self,
        state: ClientSandbox,
    ) -> Result<Option<Arc<Settings>>, AppError> {
        let mut state_now = self.lock_settings();
        if !state_now.sources.inherit_sandbox {
            return Err(AppError::SandboxNotInherited);
        }
        let next = state_now.apply_client_sandbox(state)?;
        if let Some(next) = &next {
            self.publish(next);
        }
        Ok(next)
    }

    /// The client sends its sandbox state with every call: a session started under
    /// another sandbox is started again when a call uses it.
    fn sessions_follow_client(&self) -> bool {
        self.lock_settings().per_call
    }

    /// The client's roots (file paths): the first becomes the workspace of sessions and
    /// jobs started from now on (only when no `--workspace` was given).
    pub fn apply_roots(&self, roots: Vec<PathBuf>) -> Result<Arc<Settings>, AppError> {
        let mut state = self.lock_settings();
        if !state.sources.workspace_from_roots {
            return Ok(state.current.clone());
        }
        let next = state.apply_roots(roots)?;
        self.publish(&next);
        Ok(next)
    }

    /// Whether the client has answered for its roots (see [`App::apply_roots`]).
    pub fn roots_answered(&self) -> bool {
        self.lock_settings().roots_answered
    }

    /// Hand new settings to the session manager (called with the settings lock held, so
    /// two changes cannot publish out of order).
    fn publish(&self, next: &Settings) {
        self.sessions
            .set_sandbox(next.policy.clone(), next.workspace.root().to_path_buf());
    }

    /// The workspace new sessions and jobs get now, or why there is none yet (started in
    /// `/` or `$HOME` with no `--workspace`, and no client has named one).
    pub fn workspace_root(&self) -> Result<PathBuf, AppError> {
        Ok(self.workspace()?.root().to_path_buf())
    }

    /// The server's state dir (job tables, spooled output, the generated HTTP token).
    pub fn state_dir(&self) -> &std::path::Path {
        &self.state_dir
    }

    /// Approximate cap, in bytes, on the text of one response.
    pub fn response_bytes(&self) -> usize {
        self.response_bytes
    }

    /// Neither the client's roots nor its sandbox state can change the workspace or the
    /// policy (`--workspace` given, `--sandbox-state` not `inherit`): the default session
    /// may start before the client has said anything.
    pub fn settings_are_fixed(&self) -> bool {
        let sources = self.sources();
        !sources.workspace_from_roots && !sources.inherit_sandbox
    }

    /// Start the default session's worker ahead of the first call (best effort: a failure
    /// is reported again, in words, when a call first needs the session), and read the
    /// job table from its index.
    pub async fn prewarm(&self) {
        if self.stopping.load(Ordering::SeqCst) {
            return;
        }
        // The job table too: read on a thread of its own, off the start-up path.
        self.store.load_in_background();
        let warmth = match self.session_for(DEFAULT_SESSION, true).await {
            Ok(s) => match s.wait_ready().await {
                Ok(()) => lifecycle::Warmth::Warm,
                Err(e) => {
                    tracing::debug!("prewarming the default session failed: {e}");
                    lifecycle::Warmth::Failed(e.to_string())
                }
            },
            Err(e) => {
                tracing::debug!("prewarming the default session failed: {e}");
                lifecycle::Warmth::Failed(e.to_string())
            }
        };
        self.set_warmth(warmth);
        // Shutdown may have closed every session while this one was starting.
        if self.stopping.load(Ordering::SeqCst) {
            let _ = self.sessions.close(DEFAULT_SESSION);
        }
    }

    /// Kill every worker and job; returns when all have been told and recorded.
    pub async fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.sessions.shutdown();
        self.store.shutdown().await;
    }

    /// The policy resolved for the workspace (its `{tmp}` is `<state>/shell-tmp`); what
    /// denials are explained against.
    async fn shell_policy(&self) -> Result<Arc<ResolvedPolicy>, AppError> {
        Ok(self.resolved_base().await?.policy)
    }

    /// The current settings' policy resolved, cached per settings generation.
    async fn resolved_base(&self) -> Result<BasePolicy, AppError> {
        let settings = self.settings();
        settings.workspace()?;
        {
            let cached = self.shell_policy.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((generation, base)) = &*cached
                && *generation == settings.generation
            {
                return Ok(base.clone());
            }
        }
        let tmp = self.state_dir.join("shell-tmp");
        tmp::create_dir(&tmp)?;
        let (python, venv) = match self.sessions.python().await {
            Ok(info) => (info.prefixes.clone(), info.venv.clone()),
            Err(_) => (Vec::new(), None),
        };
        let ph = Placeholders {
            workspace: settings.workspace.root().to_path_buf(),
            tmp,
            python,
            venv,
            uv_cache: None,
        };
        let policy = settings.policy.resolve(&ph).map(Arc::new)?;
        // A tmpfs `{tmp}` in the job's own view is a name only (`sandbox::launcher::mounts`): no
        // host directory, and one name serves every job, each seeing its own tmpfs there.
        let in_view = !policy.filesystem_unrestricted() && policy.limits.tmp_size_bytes.is_some();
        let shared = match in_view {
            true => {
                let name = ph.tmp.join(format!("{}-job", self.sandbox.instance_id()));
                let ph = Placeholders {
                    tmp: name,
                    ..ph.clone()
                };
                Some(settings.policy.resolve(&ph).map(Arc::new)?)
            }
            false => None,
        };
        let base = BasePolicy {
            policy,
            placeholders: ph,
            shared,
        };
        *self.shell_policy.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((settings.generation, base.clone()));
        Ok(base)
    }

    /// The policy of one shell job and the host directory to remove when it ends. Its
    /// `{tmp}` is private: a tmpfs in the job's own view where the policy has one (then
    /// the policy is shared by every job of the generation, which lets the sandbox make
    /// their views ahead of need), else a fresh directory no other job or session sees.
    async fn job_policy(&self) -> Result<(Arc<ResolvedPolicy>, Option<PathBuf>), AppError> {
        let base = self.resolved_base().await?;
        if let Some(shared) = base.shared {
            return Ok((shared, None));
        }
        let tmp = tmp::create_job_tmp(&base.placeholders.tmp, self.sandbox.instance_id())?;
        let ph = Placeholders {
            tmp: tmp.clone(),
            ..base.placeholders
        };
        match self.settings().policy.resolve(&ph) {
            Ok(policy) => Ok((Arc::new(policy), Some(tmp))),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                Err(e.into())
            }
        }
    }

    /// Wait on a job for up to `window`, reporting progress, and return what we have.
    /// If the caller cancels the request, `cancel_job` decides whether the job goes too.
    async fn follow(
        &self,
        id: &str,
        window: Duration,
        until: WaitFor,
        call: &Call,
        cancel_job: bool,
    ) -> Result<JobView, AppError> {
        let wait = self.store.wait_for(id, window, until);
        tokio::pin!(wait);
        // Progress (when asked for): on new output, and a heartbeat at least every
        // HEARTBEAT while the call waits in silence, so clients keep the call alive.
        const TICK: Duration = Duration::from_millis(500);
        const HEARTBEAT: Duration = Duration::from_secs(1);
        let started = tokio::time::Instant::now();
        let mut tick = tokio::time::interval_at(started + TICK, TICK);
        let mut last_bytes = 0u64;
        let mut last_sent = started;
        let awaited = match until {
            WaitFor::Output => "new output or its end",
            WaitFor::Settled => "its end or an input request",
            WaitFor::Finished => "its end",
        };
        let snap = loop {
            tokio::select! {
                snap = &mut wait => break snap?,
                _ = call.closing.cancelled() => {
                    return Err(AppError::ShuttingDown { id: id.to_string() });
                }
                _ = call.ct.cancelled() => {
                    if cancel_job {
                        let _ = self.store.cancel(id);
                    }
                    let fate = if cancel_job { "was cancelled" } else { "keeps running" };
                    return Err(AppError::RequestCancelled { id: id.to_string(), fate });
                }
                _ = tick.tick(), if call.wants_progress() => {
                    if let Ok(s) = self.store.summary(id) {
                        let bytes = s.stdout_bytes + s.stderr_bytes;
                        let now = tokio::time::Instant::now();
                        if bytes != last_bytes || now - last_sent >= HEARTBEAT {
                            last_bytes = bytes;
                            last_sent = now;
                            let waited = (now - started).as_secs_f64();
                            call.progress(waited, format!(
                                "job {id} {}: waited {waited:.0} s for {awaited}; {bytes} bytes of output",
                                s.status
                            )).await;
                        }
                    }
                }
            }
        };
        if snap.status == JobStatus::Failed {
            // Resolved once; needed to explain denials in words.
            let _ = self.shell_policy().await;
        }
        Ok(self.view(snap))
    }

    /// The snapshot with its denials explained; a finished Python job frees its session.
    fn view(&self, snapshot: JobSnapshot) -> JobView {
        let cached = self
            .shell_policy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(_, base)| base.policy.clone());
        let denied = denials(&snapshot, cached.as_deref());
        if snapshot.status.is_finished()
            && let Some(session) = &snapshot.session
        {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            if running.get(session) == Some(&snapshot.id) {
                running.remove(session);
            }
        }
        let running_cell = match (&snapshot.session, snapshot.kind, snapshot.result.is_none()) {
            (Some(session), JobKind::Python, true) => self
                .sessions
                .get(session)
                .ok()
                .and_then(|s| s.running_cell()),
            _ => None,
        };
        JobView {
            snapshot,
            denied,
            running_cell,
        }
    }
}

/// What the sandbox blocked, in words: the network broker's refusals (any job in proxy
/// mode), and, for a job that failed, denials its output or traceback shows (the kernel
/// itself only answers EACCES/EROFS/EPERM), once the policy to explain them is known.
fn denials(snap: &JobSnapshot, policy: Option<&ResolvedPolicy>) -> Vec<String> {
    // What a network broker refused, recorded in the job's result (every kind of job).
    let mut broker: Vec<String> = snap
        .result
        .as_ref()
        .and_then(|r| r.get("denied"))
        .and_then(serde_json::Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if let Some(policy) = policy {
        broker.extend(explained_denials(snap, policy));
    }
    broker
}

/// Denials found in a failed job's output or traceback, in words.
fn explained_denials(snap: &JobSnapshot, policy: &ResolvedPolicy) -> Vec<String> {
    let traceback = match snap.kind {
        JobKind::Install | JobKind::Script => None,
        JobKind::Python | JobKind::Shell => snap
            .result
            .as_ref()
            .and_then(|r| r.get("error"))
            .filter(|e| !e.is_null())
            .map(|e| {
                e.get("traceback")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            }),
    };
    if snap.status != JobStatus::Failed && traceback.is_none() {
        return Vec::new();
    }
    let mut text = String::new();
    for part in [&snap.stderr, &snap.stdout] {
        text.push_str(&part.head);
        text.push('\n');
        if let Some(tail) = &part.tail {
            text.push_str(tail);
            text.push('\n');
        }
    }
    if let Some(tb) = traceback {
        text.push_str(&tb);
    }
    crate::sandbox::explain_denials(policy, &text)
}
