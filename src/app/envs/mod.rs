//! Environment use cases: uv installs and one-off scripts run as jobs like any other,
//! with uv's progress forwarded to the caller's progress sink; after an install the session
//! runs the venv's activation code so it can import the packages without losing state.
//! Each runs for one session, with that session's own uv cache, admitted by the session's
//! stores first ([`EnvManager::admit`]): a full store refuses it in words, before any job.
//!
//! Progress: the install's [`EnvSink`] pushes steps into an unbounded channel (the sink
//! is called from the output pump and must not block); a forwarder task sends each as a
//! notification on the request that started the install, and ends when the install
//! drops the sink. The job is followed with the same call, so heartbeats come between
//! uv's steps while the install is silent; the call keeps the amounts strictly increasing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::{App, AppError, Call, JobView};
use crate::envs::install;
use crate::envs::{
    Canceller, EnvConfig, EnvError, EnvManager, EnvSink, InstallRequest, Lease,
    OutStream as EnvStream, PackageSources, Progress, ScriptRequest, ScriptSource, Uv, Venv,
    VenvLocation,
};
use crate::jobs::store::WaitFor;
use crate::jobs::{JobControl, JobHandle, JobKind, JobOutcome, JobStatus, Stream};
use crate::repl::Session;
use crate::sandbox::{Placeholders, ResolvedPolicy};
use outcome::{install_outcome, script_outcome};

mod outcome;
mod r;

pub(super) use r::CellInstaller;

/// Which venv a session's env call is about.
#[derive(Debug, Clone, Default)]
pub struct EnvInfoRequest {
    /// Create the session's venv now if it has none yet.
    pub create: bool,
    /// A venv at this path inside the workspace instead of a managed one.
    pub venv_path: Option<String>,
    /// The workspace's existing `.venv` instead of a managed one.
    pub use_workspace_venv: bool,
}

/// What `env_info` found.
#[derive(Debug)]
pub struct EnvInfo {
    /// uv, or why it is not usable.
    pub uv: Result<Uv, EnvError>,
    /// The session's venv, if it has one.
    pub venv: Option<Venv>,
    /// uv's cache directory.
    pub uv_cache: PathBuf,
}

/// A package install into a session's venv.
#[derive(Debug, Clone, Default)]
pub struct InstallArgs {
    /// Requirement strings (PEP 508).
    pub packages: Vec<String>,
    pub upgrade: bool,
    pub venv_path: Option<String>,
    pub use_workspace_venv: bool,
}

/// A one-off script in a transient environment.
#[derive(Debug, Clone, Default)]
pub struct ScriptArgs {
    /// The session it runs for: its uv cache (and disk bound) is the session's.
    pub session: String,
    /// Inline source; this or `path`.
    pub code: Option<String>,
    /// A script file inside the workspace; this or `code`.
    pub path: Option<String>,
    pub dependencies: Vec<String>,
    pub python_version: Option<String>,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Relative to the workspace unless absolute.
    pub cwd: Option<String>,
    pub timeout: Option<Duration>,
    /// Report wall time, CPU time and peak RSS of the whole process tree.
    pub benchmark: bool,
}

/// Spools uv's output into the job and forwards progress steps to the request.
/// An environment job just made: its handle (cancellable through `cancel`), its id, and
/// the sink its install or script writes to.
struct EnvJob {
    handle: JobHandle,
    id: String,
    cancel: Canceller,
    sink: Arc<EnvJobSink>,
}

impl App {
    /// A new job of `kind` for `session`, cancellable, with `note` (the admission's words)
    /// first on its stderr; its progress goes to `progress`'s caller, if any.
    fn env_job(
        &self,
        kind: JobKind,
        session: &str,
        label: &str,
        note: Option<&str>,
        progress: Option<&Call>,
    ) -> Result<EnvJob, AppError> {
        let handle = self.store.create(kind, Some(session), label)?;
        if let Some(note) = note {
            handle.append(Stream::Stderr, format!("{note}\n").as_bytes());
        }
        let cancel = Canceller::new();
        handle.set_control(Arc::new(EnvControl(cancel.clone())));
        let sink = Arc::new(EnvJobSink::new(
            handle.clone(),
            progress.map(forward_progress),
        ));
        Ok(EnvJob {
            id: handle.id().to_string(),
            handle,
            cancel,
            sink,
        })
    }

    /// A uv job of `session` (an install or a script) admitted against its stores: the
    /// manager, the job's policy and `{tmp}`, its claim on the stores and the job itself.
    async fn uv_job(
        &self,
        kind: JobKind,
        session: &str,
        label: &str,
        progress: Option<&Call>,
    ) -> Result<UvJob, AppError> {
        let envs = self.envs().await?;
        envs.uv()?;
        let (policy, tmp) = self.env_policy(&envs, session, None).await?;
        let lease = envs.admit(session, &policy).await?;
        let job = self.env_job(kind, session, label, lease.note.as_deref(), progress)?;
        Ok(UvJob {
            envs,
            policy,
            tmp,
            lease,
            job,
        })
    }
}

/// What [`App::uv_job`] admitted.
struct UvJob {
    envs: Arc<EnvManager>,
    policy: ResolvedPolicy,
    tmp: Option<super::tmp::TmpDir>,
    lease: Lease,
    job: EnvJob,
}

/// End a uv job: its claim on the stores ends before the answer (the session's next job
/// may clear its cache), and the stores are measured as it left them after the answer
/// (the session's next job is admitted on these figures, or measures itself while they
/// are not in).
async fn finish_uv_job(lease: Lease, handle: JobHandle, outcome: JobOutcome) {
    let ended = lease.end();
    handle.finish(outcome);
    ended.measure().await;
}

struct EnvJobSink {
    handle: JobHandle,
    progress: Option<mpsc::UnboundedSender<Progress>>,
    /// Told the venv once uv says an install's packages are in place
    /// ([`EnvSink::installed`]); set by [`EnvJobSink::when_installed`].
    in_place: std::sync::Mutex<Option<oneshot::Sender<Venv>>>,
}

impl EnvJobSink {
    fn new(handle: JobHandle, progress: Option<mpsc::UnboundedSender<Progress>>) -> Self {
        EnvJobSink {
            handle,
            progress,
            in_place: std::sync::Mutex::new(None),
        }
    }

    /// The venv, once uv says the packages are in place; an error once the install
    /// ended without saying so (see [`EnvJobSink::close`]).
    fn when_installed(&self) -> oneshot::Receiver<Venv> {
        let (tx, rx) = oneshot::channel();
        *self.waiter() = Some(tx);
        rx
    }

    /// The install ended: whoever waits in [`EnvJobSink::when_installed`] stops waiting.
    fn close(&self) {
        self.waiter().take();
    }

    fn waiter(&self) -> std::sync::MutexGuard<'_, Option<oneshot::Sender<Venv>>> {
        self.in_place.lock().unwrap_or_else(|e| e.into_inner())
    }
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
    fn installed(&self, venv: &Venv) {
        let tx = self.waiter().take();
        if let Some(tx) = tx {
            let _ = tx.send(venv.clone());
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

/// A forwarder of progress steps to `call`; returns the sender for the sink.
fn forward_progress(call: &Call) -> mpsc::UnboundedSender<Progress> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Progress>();
    let call = call.clone();
    tokio::spawn(async move {
        while let Some(p) = rx.recv().await {
            call.progress(p.progress, p.message).await;
        }
    });
    tx
}

impl App {
    /// The environment manager, built on first use (it needs the REPL's interpreter).
    pub(super) async fn envs(&self) -> Result<Arc<EnvManager>, AppError> {
        self.envs
            .get_or_try_init(|| async {
                let info = self.sessions.python().await?;
                Ok::<_, AppError>(EnvManager::new(EnvConfig {
                    state_dir: self.state_dir.clone(),
                    workspace: self.workspace()?.root().to_path_buf(),
                    python: info.executable.clone(),
                    python_version: Some(info.version.clone()),
                    uv: self.uv.clone(),
                    uv_cache: None,
                    disk: self.env_disk,
                    python_downloads: false,
                    sources: PackageSources::default(),
                    principal: self.principal.clone(),
                    sandbox: self.sandbox.clone(),
                }))
            })
            .await
            .cloned()
    }

    /// The server policy resolved for uv work of `session` (the envs module adds the
    /// grants), with a private `{tmp}` (HOME, TMPDIR) of its own: nothing one script or
    /// install leaves there (a `.pth` in its user site) is seen by the next. Where the
    /// policy makes `{tmp}` a tmpfs of the job's own view, it is a name only (no host
    /// directory; each job sees its own tmpfs there) and one name serves every job of
    /// the session, so an install's view is the same each time and the sandbox can make
    /// it ahead of need; otherwise a fresh host directory, removed when the guard drops.
    /// `{uv_cache}` is the session's own cache.
    async fn env_policy(
        &self,
        envs: &EnvManager,
        session: &str,
        venv: Option<&Venv>,
    ) -> Result<(ResolvedPolicy, Option<super::tmp::TmpDir>), AppError> {
        let uv_cache = envs.cache_dir(session)?;
        let base = self.state_dir.join("env-tmp");
        super::tmp::create_dir(&base)?;
        let python = match self.sessions.python().await {
            Ok(info) => info.prefixes.clone(),
            Err(_) => Vec::new(),
        };
        let mut ph = Placeholders {
            workspace: self.workspace()?.root().to_path_buf(),
            tmp: base.join(format!("{}-{session}-job", self.sandbox.instance_id())),
            python,
            venv: venv.map(|v| v.root().to_path_buf()),
            uv_cache: Some(uv_cache),
        };
        let policy = self.settings().policy.resolve(&ph)?;
        if !policy.filesystem_unrestricted() && policy.limits.tmp_size_bytes.is_some() {
            return Ok((policy, None));
        }
        let tmp = super::tmp::TmpDir(super::tmp::create_job_tmp(
            &base,
            self.sandbox.instance_id(),
        )?);
        ph.tmp = tmp.0.clone();
        Ok((self.settings().policy.resolve(&ph)?, Some(tmp)))
    }

    /// Where the venv goes. A `venv_path` is made beneath the workspace now when it will
    /// be used (`create`): by the server, through descriptors (`Workspace::create_dir`),
    /// so nothing later creates it by path (that could follow a swapped-in symlink).
    fn venv_location(
        &self,
        venv_path: Option<&str>,
        workspace_venv: bool,
        create: bool,
    ) -> Result<Option<VenvLocation>, AppError> {
        match (venv_path, workspace_venv) {
            (Some(_), true) => Err(AppError::BadRequest(
                "give `venv_path` or `use_workspace_venv`, not both",
            )),
            (Some(p), false) if create => Ok(Some(VenvLocation::Path(
                self.workspace()?.create_dir(p, "venv_path")?,
            ))),
            (Some(p), false) => Ok(Some(VenvLocation::Path(
                self.workspace()?.dir(p, "venv_path")?,
            ))),
            (None, true) => Ok(Some(VenvLocation::Workspace)),
            (None, false) => Ok(None),
        }
    }

    /// The session `name`, started if it is not open. A session started here whose venv
    /// already exists (a managed one left by an earlier server run, or one chosen
    /// earlier in this run) gets its site-packages through the repl's start-up hook, so
    /// its packages import without another env_install.
    pub(super) async fn session(&self, name: &str) -> Result<Arc<Session>, AppError> {
        self.session_for(name, false).await
    }

    /// [`App::session`], or with `spare` a start ahead of use that does not count toward
    /// the session limit until used (the prewarm).
    pub(super) async fn session_for(
        &self,
        name: &str,
        spare: bool,
    ) -> Result<Arc<Session>, AppError> {
        // Nothing starts before the workspace is known (started in `/` or `$HOME`).
        self.settings().workspace()?;
        if !spare && self.sessions_follow_client() {
            // The client's sandbox comes with every call: a session it finds idle under
            // another one starts again under the client's (a busy one is left alone: the
            // call is told it is busy).
            let policy = self.settings().policy.name.clone();
            self.sessions
                .restart_outdated(name, &format!("the client's sandbox changed to {policy}"));
        }
        if !spare
            && !self.sessions.stale_spare(name)
            && let Ok(s) = self.sessions.get(name)
        {
            return Ok(s);
        }
        if let Ok(envs) = self.envs().await
            && let Some(v) = envs.session_venv(name).await
        {
            self.sessions
                .set_site_dirs(name, vec![v.site_packages().to_path_buf()]);
        }
        if spare {
            return Ok(self.sessions.prewarm(name).await?);
        }
        Ok(self.sessions.get_or_start(name).await?)
    }

    pub async fn env_info(&self, session: &str, req: EnvInfoRequest) -> Result<EnvInfo, AppError> {
        let envs = self.envs().await?;
        let location =
            self.venv_location(req.venv_path.as_deref(), req.use_workspace_venv, req.create)?;
        let uv = envs.uv().cloned();
        let venv = if req.create {
            let (policy, _tmp) = self.env_policy(&envs, session, None).await?;
            let lease = envs.admit(session, &policy).await?;
            let venv = envs
                .ensure_session_venv(session, location.as_ref(), &policy, &lease)
                .await;
            lease.release().await;
            Some(venv?)
        } else {
            envs.session_venv(session).await
        };
        Ok(EnvInfo {
            uv,
            venv,
            uv_cache: envs.cache_dir(session)?,
        })
    }

    pub async fn env_install(
        &self,
        session: &str,
        args: InstallArgs,
        wait: Duration,
        call: &Call,
    ) -> Result<JobView, AppError> {
        if self.sessions.language_of(session) == crate::repl::Language::R {
            return self.r_install(session, args.packages, wait, call).await;
        }
        self.admit_job()?;
        let req = InstallRequest {
            packages: args.packages,
            upgrade: args.upgrade,
        };
        install::validate(&req)?;
        let location =
            self.venv_location(args.venv_path.as_deref(), args.use_workspace_venv, true)?;
        let label = format!("install {}", req.packages.join(" "));
        let UvJob {
            envs,
            policy,
            tmp,
            lease,
            job:
                EnvJob {
                    handle,
                    id,
                    cancel,
                    sink,
                },
        } = self
            .uv_job(JobKind::Install, session, &label, Some(call))
            .await?;
        let sessions = self.sessions.clone();
        let session = session.to_string();
        // The session is activated once uv has said the packages are in place and has
        // exited (its stderr ended), while its PID namespace and sandbox still exit
        // (about a millisecond); the outcome waits for both. Activating the session's
        // own venv is what a success does anyway, and harmless if the install then
        // fails (its result is not reported then).
        let in_place = sink.when_installed();
        let early = tokio::spawn({
            let sessions = sessions.clone();
            let session = session.clone();
            async move {
                let venv = in_place.await.ok()?;
                Some(activate(&sessions, &session, &venv).await)
            }
        });
        tokio::spawn(async move {
            let _tmp = tmp;
            let r = envs
                .install(
                    &session,
                    location.as_ref(),
                    &req,
                    &policy,
                    &lease,
                    sink.clone(),
                    &cancel,
                )
                .await;
            sink.close();
            drop(sink);
            let outcome = match r {
                Err(e) => JobOutcome {
                    status: JobStatus::Failed,
                    message: Some(e.to_string()),
                    ..Default::default()
                },
                Ok((venv, report)) => {
                    let activation = if !report.ok {
                        None
                    } else if let Ok(Some(done)) = early.await {
                        done
                    } else {
                        activate(&sessions, &session, &venv).await
                    };
                    install_outcome(&session, &venv, report, activation)
                }
            };
            finish_uv_job(lease, handle, outcome).await;
        });
        self.follow(&id, wait, WaitFor::Settled, call, true).await
    }

    pub async fn python_run_script(
        &self,
        args: ScriptArgs,
        wait: Duration,
        call: &Call,
    ) -> Result<JobView, AppError> {
        self.admit_job()?;
        let record = super::scripts::arguments_of(&args);
        let source = match (args.code, args.path) {
            (Some(_), Some(_)) => {
                return Err(AppError::BadRequest("give `code` or `path`, not both"));
            }
            (None, None) => {
                return Err(AppError::BadRequest(
                    "`code` (inline source) or `path` (a script file) is required",
                ));
            }
            (Some(code), None) => ScriptSource::Code(code),
            (None, Some(path)) => ScriptSource::Path(self.workspace()?.file(&path, "path")?),
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
            timeout: args.timeout,
            cwd: args
                .cwd
                .map(|c| self.workspace()?.dir(&c, "cwd"))
                .transpose()?,
        };
        let UvJob {
            envs,
            policy,
            tmp,
            lease,
            job:
                EnvJob {
                    handle,
                    id,
                    cancel,
                    sink,
                },
        } = self
            .uv_job(JobKind::Script, &args.session, &label, None)
            .await?;
        // Kept so the agent can list, read and rerun it (resources `script://...`).
        if let Err(e) = super::scripts::save(&self.state_dir, &id, &label, record) {
            tracing::warn!("cannot save script {id} for a rerun: {e}");
        }
        let benchmark = args.benchmark;
        tokio::spawn(async move {
            let _tmp = tmp;
            let r = envs.run_script(&req, &policy, &lease, sink, &cancel).await;
            let outcome = match r {
                Err(e) => JobOutcome {
                    status: JobStatus::Failed,
                    message: Some(e.to_string()),
                    ..Default::default()
                },
                Ok(report) => script_outcome(report, benchmark),
            };
            finish_uv_job(lease, handle, outcome).await;
        });
        self.follow(&id, wait, WaitFor::Settled, call, true).await
    }
}

/// Make the session see the venv's packages, starting its worker if it has none yet:
/// the running worker by an `add_site_dirs` request (no cell: an install leaves no trace
/// in the history), every later one (restart, crash, the spare; the session started
/// again after a close) by the repl's start-up hook.
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
        s.add_site_dirs_now(&[venv.site_packages().to_path_buf()])
            .await
            .map_err(|e| e.to_string()),
    )
}
