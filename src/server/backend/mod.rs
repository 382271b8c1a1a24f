//! The glue between MCP tools and the subsystems: one [`Backend`] per server holds the
//! Python [`SessionManager`] and the [`JobStore`]; every execution is a job.
//!
//! Python: `python_exec` creates a job, registers a [`python::PyControl`] (cancel →
//! interrupt, input → the pending `input()`), and spawns a task running the cell with a
//! [`python::JobSink`] that spools output into the job. Shell: `jobs::start_shell_job`.
//! Either way the tool then waits on the store for up to its window ([`Backend::follow`]):
//! a quick job answers inline, a slow one answers with its id and the output so far.
//!
//! Shutdown: sessions first (workers and their process groups are killed, so running
//! cells end at once), then the store (kills shell job groups, records the rest).

mod envs;
mod jobs;
mod python;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::Value;
use tokio::sync::OnceCell;

use super::progress::CallCtx;
use super::report::{JobReport, OutputPart, structured};
use super::tools::ToolError;
use crate::cli::ServeArgs;
use crate::jobs::store::WaitFor;
use crate::jobs::{Excerpt, JobSnapshot, JobStore, StoreConfig};
use crate::repl::{CellOutcome, ReplConfig, SessionManager};
use crate::sandbox::{Placeholders, Policy, ResolvedPolicy};

type R = Result<CallToolResult, ToolError>;

pub struct Backend {
    sessions: Arc<SessionManager>,
    store: Arc<JobStore>,
    policy: Policy,
    workspace: PathBuf,
    state_dir: PathBuf,
    response_bytes: usize,
    /// The server's policy resolved for the workspace on first use (needs the
    /// interpreter's prefixes); each shell job gets a copy with its own `{tmp}`.
    shell_policy: OnceCell<(Arc<ResolvedPolicy>, Placeholders)>,
    /// The job currently running in each session, to point a caller at it when busy.
    running: Mutex<std::collections::HashMap<String, String>>,
    /// uv venvs, installs and scripts (built on first use: needs the interpreter).
    envs: OnceCell<Arc<crate::envs::EnvManager>>,
    /// `--uv`: the uv executable, if configured.
    uv: Option<PathBuf>,
    /// Set when shutdown begins, so a background prewarm does not leave a worker behind.
    stopping: std::sync::atomic::AtomicBool,
}

impl Backend {
    /// Build from the server flags: workspace, policy, state dir, store, sessions.
    pub fn new(args: &ServeArgs) -> Result<Backend, String> {
        let workspace = match &args.workspace {
            Some(w) => w.clone(),
            None => std::env::current_dir()
                .map_err(|e| format!("cannot read the current directory: {e}"))?,
        };
        let workspace = workspace.canonicalize().map_err(|e| {
            format!(
                "workspace {} is not usable: {e}; pass an existing directory with --workspace",
                workspace.display()
            )
        })?;
        let policy_name = args
            .policy
            .clone()
            .unwrap_or_else(|| args.sandbox_state.policy_name().to_string());
        let mut policy = Policy::load(&policy_name).map_err(|e| e.to_string())?;
        let state_dir = args
            .state_dir
            .clone()
            .unwrap_or_else(crate::jobs::default_state_dir);
        std::fs::create_dir_all(&state_dir).map_err(|e| {
            format!(
                "cannot create the state directory {}: {e}; pass --state-dir",
                state_dir.display()
            )
        })?;
        let store = JobStore::open(StoreConfig {
            state_dir: state_dir.clone(),
            disk_cap: args.disk_cap,
            response_bytes: args.response_bytes,
        })
        .map_err(|e| e.to_string())?;
        crate::envs::allow_session_venvs(&mut policy, &state_dir).map_err(|e| e.to_string())?;
        let mut cfg = ReplConfig::new(workspace.clone(), policy.clone(), state_dir.clone());
        cfg.python = args.python.clone();
        cfg.max_sessions = args.max_sessions;
        cfg.idle_ttl = Duration::from_secs(args.session_ttl);
        cfg.max_snapshots = args.max_snapshots;
        cfg.repr_limit = args.response_bytes.min(20_000);
        Ok(Backend {
            sessions: SessionManager::new(cfg),
            store,
            policy,
            workspace,
            state_dir,
            response_bytes: args.response_bytes,
            shell_policy: OnceCell::new(),
            running: Mutex::new(Default::default()),
            stopping: Default::default(),
            envs: OnceCell::new(),
            uv: args.uv.clone(),
        })
    }

    /// Start the default session's worker ahead of the first call (best effort: a failure
    /// is reported again, in words, when a tool first needs the session).
    pub async fn prewarm(&self) {
        use std::sync::atomic::Ordering;
        if self.stopping.load(Ordering::SeqCst) {
            return;
        }
        let name = crate::server::tools::DEFAULT_SESSION;
        match self.session(name).await {
            Ok(s) => {
                if let Err(e) = s.wait_ready().await {
                    tracing::debug!("prewarming the default session failed: {e}");
                }
            }
            Err(e) => tracing::debug!("prewarming the default session failed: {}", e.0),
        }
        // Shutdown may have closed every session while this one was starting.
        if self.stopping.load(Ordering::SeqCst) {
            let _ = self.sessions.close(name);
        }
    }

    /// Kill every worker and job; returns when all have been told and recorded.
    pub async fn shutdown(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.sessions.shutdown();
        self.store.shutdown().await;
    }

    /// `p` as a path inside the workspace, for arguments the server hands on with extra
    /// rights (a venv gets written, a script gets a read grant): a path outside (absolute,
    /// `..`, or through a symlink in the workspace) would open the host to a tool call.
    /// The longest existing prefix is resolved; what is left must be plain names.
    fn inside_workspace(&self, p: &str, what: &str) -> Result<PathBuf, ToolError> {
        let refuse = || {
            ToolError(format!(
                "{what} {p} is outside the workspace {}; give a path inside it",
                self.workspace.display()
            ))
        };
        let path = self.resolve_path(p);
        let mut existing = path.as_path();
        let mut rest = Vec::new();
        // A dangling symlink counts as existing (and then fails to resolve): it would be
        // followed by whoever creates the path.
        while existing.symlink_metadata().is_err() {
            let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
                return Err(refuse());
            };
            rest.push(name.to_owned());
            existing = parent;
        }
        let mut real = existing.canonicalize().map_err(|_| refuse())?;
        if !real.starts_with(&self.workspace) || (real == self.workspace && rest.is_empty()) {
            return Err(refuse());
        }
        for name in rest.iter().rev() {
            if name == ".." || name == "." {
                return Err(refuse());
            }
            real.push(name);
        }
        Ok(real)
    }

    fn resolve_path(&self, p: &str) -> PathBuf {
        let path = Path::new(p);
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.workspace.join(path)
        }
    }

    /// The policy resolved for the workspace (its `{tmp}` is `<state>/shell-tmp`); what
    /// denials are explained against.
    async fn shell_policy(&self) -> Result<Arc<ResolvedPolicy>, ToolError> {
        Ok(self.resolved_base().await?.0.clone())
    }

    async fn resolved_base(&self) -> Result<&(Arc<ResolvedPolicy>, Placeholders), ToolError> {
        self.shell_policy
            .get_or_try_init(|| async {
                let tmp = self.state_dir.join("shell-tmp");
                sweep_dead_job_tmps(&tmp);
                std::fs::create_dir_all(&tmp)
                    .map_err(|e| ToolError(format!("cannot create {}: {e}", tmp.display())))?;
                let (python, venv) = match self.sessions.python().await {
                    Ok(info) => (info.prefixes.clone(), info.venv.clone()),
                    Err(_) => (Vec::new(), None),
                };
                let ph = Placeholders {
                    workspace: self.workspace.clone(),
                    tmp,
                    python,
                    venv,
                    uv_cache: None,
                };
                let policy = self
                    .policy
                    .resolve(&ph)
                    .map(Arc::new)
                    .map_err(|e| ToolError(e.to_string()))?;
                Ok((policy, ph))
            })
            .await
    }

    /// A policy for one shell job: the server's, with a fresh private `{tmp}` that no other
    /// job or session sees; the job removes it when it ends (`ShellRequest::private_tmp`).
    async fn job_policy(&self) -> Result<(Arc<ResolvedPolicy>, PathBuf), ToolError> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let (_, base) = self.resolved_base().await?;
        let tmp = base.tmp.join(format!(
            "{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&tmp)
            .map_err(|e| ToolError(format!("cannot create {}: {e}", tmp.display())))?;
        let ph = Placeholders {
            tmp: tmp.clone(),
            ..base.clone()
        };
        match self.policy.resolve(&ph) {
            Ok(policy) => Ok((Arc::new(policy), tmp)),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                Err(ToolError(e.to_string()))
            }
        }
    }

    /// Wait on a job for up to `window`, reporting progress, and render what we have.
    /// If the client cancels the request, `cancel_job` decides whether the job goes too.
    async fn follow(
        &self,
        id: &str,
        window: Duration,
        until: WaitFor,
        call: &CallCtx,
        cancel_job: bool,
    ) -> R {
        let wait = self.store.wait_for(id, window, until);
        tokio::pin!(wait);
        const TICK: Duration = Duration::from_millis(500);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + TICK, TICK);
        let mut last_bytes = 0u64;
        let snap = loop {
            tokio::select! {
                snap = &mut wait => break snap?,
                _ = call.closing.cancelled() => {
                    return Err(ToolError(format!("the server is shutting down; job {id} is being stopped")));
                }
                _ = call.ct.cancelled() => {
                    if cancel_job {
                        let _ = self.store.cancel(id);
                    }
                    return Err(ToolError(format!("request cancelled; job {id} {}",
                        if cancel_job { "was cancelled" } else { "keeps running" })));
                }
                _ = tick.tick() => {
                    if let Ok(s) = self.store.summary(id) {
                        let bytes = s.stdout_bytes + s.stderr_bytes;
                        if bytes != last_bytes {
                            last_bytes = bytes;
                            call.progress(s.elapsed_ms as f64 / 1000.0,
                                format!("job {id} {}: {bytes} bytes of output", s.status)).await;
                        }
                    }
                }
            }
        };
        if snap.status == crate::jobs::JobStatus::Failed {
            // Resolved once; needed to explain denials in words.
            let _ = self.shell_policy().await;
        }
        Ok(self.render(snap))
    }

    /// A job snapshot as the MCP result (text + structured + images).
    fn render(&self, snap: JobSnapshot) -> CallToolResult {
        let mut report = JobReport {
            job_id: snap.id.clone(),
            kind: serde_plain(&snap.kind),
            session: snap.session.clone(),
            status: snap.status.as_str().to_string(),
            prompt: snap.prompt.clone(),
            stdout: part(snap.stdout),
            stderr: part(snap.stderr),
            elapsed_ms: snap.elapsed_ms,
            exit_code: snap.exit_code,
            signal: snap.signal.clone(),
            message: snap.message.clone(),
            ..Default::default()
        };
        let mut images = Vec::new();
        if let Some(result) = &snap.result {
            match snap.kind {
                crate::jobs::JobKind::Install | crate::jobs::JobKind::Script => {
                    report.result = Some(result.clone())
                }
                _ => python::fill_python_result(&mut report, result, &mut images),
            }
        } else if let Some(session) = &snap.session
            && let Ok(s) = self.sessions.get(session)
            && let Some((cell, parent)) = s.running_cell()
        {
            // A cell still running: its id and parent come from the session.
            report.cell = Some(crate::repl::cell_name(cell));
            report.parent = Some(parent.map(crate::repl::cell_name));
        }
        if let Some((policy, _)) = self.shell_policy.get() {
            report.explain_denials(policy);
        }
        if report.is_finished()
            && let Some(session) = &report.session
        {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            if running.get(session) == Some(&report.job_id) {
                running.remove(session);
            }
        }
        report.with_next_step().into_result(images)
    }
}

/// Remove job temp dirs (`<pid>-<n>`) left by servers that are no longer running (killed
/// before their jobs ended); those of a live server sharing the state dir stay.
fn sweep_dead_job_tmps(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name.to_str().and_then(|n| n.split('-').next());
        let alive = pid.is_some_and(|p| Path::new("/proc").join(p).exists());
        if !alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn part(e: Excerpt) -> OutputPart {
    OutputPart {
        offset: e.offset,
        end: e.end,
        text: e.head,
        tail: e.tail,
        omitted: e.omitted,
    }
}

/// The snake_case name serde gives a unit enum variant.
fn serde_plain<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        _ => String::new(),
    }
}

/// A plain-text + structured result for list-style tools.
fn listing<T: serde::Serialize>(text: String, value: &T) -> CallToolResult {
    structured(vec![ContentBlock::text(text)], value, false)
}

/// The structured result of a Python cell as stored in the job (`JobOutcome::result`).
pub(crate) fn cell_result(outcome: &CellOutcome) -> Value {
    serde_json::to_value(outcome).unwrap_or(Value::Null)
}
