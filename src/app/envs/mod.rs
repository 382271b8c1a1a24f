//! Environment glue: uv installs and one-off scripts run as jobs like any other, with
//! uv's progress forwarded as MCP progress notifications; after an install the session
//! runs the venv's activation code so it can import the packages without losing state.
//!
//! Progress: the install's [`EnvSink`] pushes steps into an unbounded channel (the sink
//! is called from the output pump and must not block); a forwarder task sends each as a
//! notification on the request that started the install, and ends when the install
//! drops the sink. The job is followed with a context that keeps the request's
//! cancellation but sends no time-based progress, so the client sees only uv's steps,
//! strictly increasing.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;

use super::{Backend, R, listing};
use crate::envs::install;
use crate::envs::{
    Canceller, EnvConfig, EnvManager, EnvSink, InstallRequest, OutStream as EnvStream,
    PackageSources, Progress, ScriptRequest, ScriptSource, Venv, VenvLocation,
};
use crate::jobs::store::WaitFor;
use crate::jobs::{JobControl, JobHandle, JobKind, JobOutcome, JobStatus, Stream};
use crate::repl::{CellSink, CellStatus, OutStream, Session};
use crate::sandbox::{Placeholders, ResolvedPolicy};
use crate::server::progress::CallCtx;
use crate::server::tools::ToolError;
use crate::server::tools::env::{EnvInfoArgs, EnvInstallArgs, RunScriptArgs};
use outcome::{install_outcome, script_outcome};

mod outcome;

/// Spools uv's output into the job and forwards progress steps to the request.
struct EnvJobSink {
    handle: JobHandle,
    progress: Option<mpsc::UnboundedSender<Progress>>,
}

impl EnvSink for EnvJobSink {
    fn output(&self, stream: EnvStream, data: &[u8]) {
        let s = match stream {
            EnvStream::Stdout => Stream::Stdout,
            EnvStream::Stderr => Stream::Stderr,
        };
        self.handle.append(s, data);
    }
    fn progress(&self, p: &Progress) {
        if let Some(tx) = &self.progress {
            let _ = tx.send(p.clone());
        }
    }
}

/// job_cancel on an install or script kills its process group.
struct EnvControl(Canceller);

impl JobControl for EnvControl {
    fn cancel(&self) {
        self.0.cancel();
    }
    fn send_input(&self, _text: &str, _eof: bool) -> Result<(), String> {
        Err("installs and one-off scripts do not read input".into())
    }
}

/// The activation cell's output is not shown anywhere.
struct QuietCell;

impl CellSink for QuietCell {
    fn output(&self, _stream: OutStream, _data: &[u8]) {}
    fn awaiting_input(&self, _prompt: &str) {}
    fn input_received(&self) {}
}

/// A forwarder of progress steps to `call`; returns the sender for the sink.
fn forward_progress(call: &CallCtx) -> mpsc::UnboundedSender<Progress> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Progress>();
    let call = call.clone();
    tokio::spawn(async move {
        while let Some(p) = rx.recv().await {
            call.progress(p.progress, p.message).await;
        }
    });
    tx
}

/// The request's cancellation without time-based progress (see the module docs).
fn quiet(call: &CallCtx) -> CallCtx {
    let mut q = CallCtx::detached();
    q.ct = call.ct.clone();
    q.closing = call.closing.clone();
    q
}

impl Backend {
    /// The environment manager, built on first use (it needs the REPL's interpreter).
    pub(super) async fn envs(&self) -> Result<Arc<EnvManager>, ToolError> {
        self.envs
            .get_or_try_init(|| async {
                let python = self.sessions.python().await?.executable.clone();
                Ok::<_, ToolError>(EnvManager::new(EnvConfig {
                    state_dir: self.state_dir.clone(),
                    workspace: self.workspace.clone(),
                    python,
                    uv: self.uv.clone(),
                    uv_cache: None,
                    python_downloads: false,
                    sources: PackageSources::default(),
                }))
            })
            .await
            .cloned()
    }

    /// The server policy resolved for uv work (the envs module adds the grants).
    async fn env_policy(
        &self,
        envs: &EnvManager,
        venv: Option<&Venv>,
    ) -> Result<ResolvedPolicy, ToolError> {
        let tmp = self.state_dir.join("env-tmp");
        std::fs::create_dir_all(&tmp)
            .map_err(|e| ToolError(format!("cannot create {}: {e}", tmp.display())))?;
        let python = match self.sessions.python().await {
            Ok(info) => info.prefixes.clone(),
            Err(_) => Vec::new(),
        };
        let ph = Placeholders {
            workspace: self.workspace.clone(),
            tmp,
            python,
            venv: venv.map(|v| v.root().to_path_buf()),
            uv_cache: Some(envs.config().uv_cache_dir()),
        };
        self.policy
            .resolve(&ph)
            .map_err(|e| ToolError(e.to_string()))
    }

    fn venv_location(
        &self,
        venv_path: Option<&str>,
        workspace_venv: bool,
    ) -> Result<Option<VenvLocation>, ToolError> {
        match (venv_path, workspace_venv) {
            (Some(_), true) => Err(ToolError(
                "give `venv_path` or `use_workspace_venv`, not both".into(),
            )),
            (Some(p), false) => Ok(Some(VenvLocation::Path(
                self.inside_workspace(p, "venv_path")?,
            ))),
            (None, true) => Ok(Some(VenvLocation::Workspace)),
            (None, false) => Ok(None),
        }
    }

    /// The session `name`, started if it is not open. A session started here whose venv
    /// already exists (a managed one left by an earlier server run, or one chosen
    /// earlier in this run) gets its site-packages through the repl's start-up hook, so
    /// its packages import without another env_install.
    pub(super) async fn session(&self, name: &str) -> Result<Arc<Session>, ToolError> {
        if let Ok(s) = self.sessions.get(name) {
            return Ok(s);
        }
        if let Ok(envs) = self.envs().await
            && let Some(v) = envs.session_venv(name).await
        {
            self.sessions
                .set_site_dirs(name, vec![v.site_packages().to_path_buf()]);
        }
        Ok(self.sessions.get_or_start(name).await?)
    }

    pub async fn env_info(&self, session: &str, args: EnvInfoArgs) -> R {
        let envs = self.envs().await?;
        let location = self.venv_location(args.venv_path.as_deref(), args.use_workspace_venv)?;
        let uv = envs
            .uv()
            .map(|u| json!({ "path": u.path, "version": u.version }));
        let venv = if args.create {
            let policy = self.env_policy(&envs, None).await?;
            Some(
                envs.ensure_session_venv(session, location.as_ref(), &policy)
                    .await?,
            )
        } else {
            envs.session_venv(session).await
        };
        let mut text = String::new();
        match &uv {
            Ok(u) => {
                let _ = writeln!(
                    text,
                    "uv: {} ({})",
                    u["version"].as_str().unwrap_or("?"),
                    u["path"]
                );
            }
            Err(e) => {
                let _ = writeln!(text, "uv: missing: {e}");
            }
        }
        match &venv {
            Some(v) => {
                let _ = writeln!(text, "session {session:?} venv: {}", v.root().display());
                let _ = writeln!(
                    text,
                    "python: {} ({})",
                    v.python().display(),
                    v.python_version.as_deref().unwrap_or("?")
                );
                let _ = writeln!(text, "site-packages: {}", v.site_packages().display());
            }
            None => {
                let _ = writeln!(
                    text,
                    "session {session:?} has no venv yet: env_install creates it (or env_info with create=true)"
                );
            }
        }
        let _ = writeln!(text, "uv cache: {}", envs.config().uv_cache_dir().display());
        let value = json!({
            "session": session,
            "uv": uv.as_ref().ok(),
            "uv_error": uv.as_ref().err().map(ToString::to_string),
            "venv": venv.as_ref().map(|v| json!({
                "root": v.root(),
                "python": v.python(),
                "python_version": v.python_version,
                "site_packages": v.site_packages(),
            })),
            "uv_cache": envs.config().uv_cache_dir(),
        });
        Ok(listing(text, &value))
    }

    pub async fn env_install(
        &self,
        session: &str,
        args: EnvInstallArgs,
        wait: Duration,
        call: &CallCtx,
    ) -> R {
        let req = InstallRequest {
            packages: args.packages,
            upgrade: args.upgrade,
        };
        install::validate(&req)?;
        let envs = self.envs().await?;
        envs.uv()?;
        let location = self.venv_location(args.venv_path.as_deref(), args.use_workspace_venv)?;
        let policy = self.env_policy(&envs, None).await?;
        let label = format!("install {}", req.packages.join(" "));
        let handle = self.store.create(JobKind::Install, Some(session), &label)?;
        let cancel = Canceller::new();
        handle.set_control(Arc::new(EnvControl(cancel.clone())));
        let id = handle.id().to_string();
        let sink = Arc::new(EnvJobSink {
            handle: handle.clone(),
            progress: Some(forward_progress(call)),
        });
        let sessions = self.sessions.clone();
        let session = session.to_string();
        tokio::spawn(async move {
            let r = envs
                .install(&session, location.as_ref(), &req, &policy, sink, &cancel)
                .await;
            let outcome = match r {
                Err(e) => JobOutcome {
                    status: JobStatus::Failed,
                    message: Some(e.to_string()),
                    ..Default::default()
                },
                Ok((venv, report)) => {
                    let activation = if report.ok {
                        activate(&sessions, &session, &venv).await
                    } else {
                        None
                    };
                    install_outcome(&session, &venv, report, activation)
                }
            };
            handle.finish(outcome);
        });
        self.follow(&id, wait, WaitFor::Settled, &quiet(call), true)
            .await
    }

    pub async fn python_run_script(
        &self,
        args: RunScriptArgs,
        wait: Duration,
        call: &CallCtx,
    ) -> R {
        let source = match (args.code, args.path) {
            (Some(_), Some(_)) => return Err(ToolError("give `code` or `path`, not both".into())),
            (None, None) => {
                return Err(ToolError(
                    "`code` (inline source) or `path` (a script file) is required".into(),
                ));
            }
            (Some(code), None) => ScriptSource::Code(code),
            (None, Some(path)) => ScriptSource::Path(self.inside_workspace(&path, "path")?),
        };
        let label = match &source {
            ScriptSource::Code(c) => format!(
                "script: {}",
                c.lines()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .trim()
            ),
            ScriptSource::Path(p) => format!("script {}", p.display()),
        };
        let req = ScriptRequest {
            source,
            dependencies: args.dependencies,
            python_version: args.python_version,
            args: args.args,
            env: args.env.into_iter().collect(),
            timeout: args.timeout_seconds.map(Duration::from_secs_f64),
            cwd: args.cwd.map(|c| self.resolve_path(&c)),
        };
        let envs = self.envs().await?;
        envs.uv()?;
        let policy = self.env_policy(&envs, None).await?;
        let handle = self.store.create(JobKind::Script, None, &label)?;
        let cancel = Canceller::new();
        handle.set_control(Arc::new(EnvControl(cancel.clone())));
        let id = handle.id().to_string();
        let sink = Arc::new(EnvJobSink {
            handle: handle.clone(),
            progress: None,
        });
        let benchmark = args.benchmark;
        tokio::spawn(async move {
            let outcome = match envs.run_script(&req, &policy, sink, &cancel).await {
                Err(e) => JobOutcome {
                    status: JobStatus::Failed,
                    message: Some(e.to_string()),
                    ..Default::default()
                },
                Ok(report) => script_outcome(report, benchmark),
            };
            handle.finish(outcome);
        });
        self.follow(&id, wait, WaitFor::Settled, call, true).await
    }
}

/// Make the session see the venv's packages, starting its worker if it has none yet:
/// the running worker by the activation cell, every later one (restart, crash, the
/// spare; the session started again after a close) by the repl's start-up hook.
async fn activate(
    sessions: &crate::repl::SessionManager,
    session: &str,
    venv: &Venv,
) -> Option<Result<(), String>> {
    sessions.set_site_dirs(session, vec![venv.site_packages().to_path_buf()]);
    let s = match sessions.get_or_start(session).await {
        Ok(s) => s,
        Err(e) => return Some(Err(e.to_string())),
    };
    Some(
        match s
            .execute(&venv.activation_code(), Arc::new(QuietCell))
            .await
        {
            Ok(o) if o.status == CellStatus::Ok => Ok(()),
            Ok(o) => Err(o
                .error
                .map(|e| format!("{}: {}", e.ename, e.evalue))
                .unwrap_or_else(|| format!("{:?}", o.status))),
            Err(e) => Err(e.to_string()),
        },
    )
}
