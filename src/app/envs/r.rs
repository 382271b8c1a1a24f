//! R packages for an R session, two ways into one install (`envs::r_install`, into the
//! session library, which the running session already has on `.libPaths()`):
//! `env_install` runs it as a job of its own; `install.packages()` typed in a cell asks
//! for it through the worker protocol (`install_request`), and [`CellInstaller`] runs it
//! for that cell — its output in the cell's output, its progress on the cell's call —
//! and answers the waiting cell (`install_reply`). Either way the installer, not the
//! session, gets the network (the broker, to the CRAN mirror only).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{EnvJob, EnvJobSink, forward_progress};
use crate::app::settings::Settings;
use crate::app::tmp::TmpDir;
use crate::app::{App, AppError, Call, JobView};
use crate::envs::Canceller;
use crate::envs::r_install::{self, RInstallReport};
use crate::jobs::store::WaitFor;
use crate::jobs::{JobHandle, JobKind, JobOutcome, JobStatus};
use crate::repl::{InstallAnswer, Session};
use crate::sandbox::{Placeholders, ResolvedPolicy, Runtime};

/// Everything one R install of a session needs, resolved.
struct Plan {
    rscript: PathBuf,
    library: PathBuf,
    policy: ResolvedPolicy,
    repo: String,
    /// The install's private `{tmp}`, removed when the plan's install ends.
    tmp: TmpDir,
}

/// The session's policy (with a `{tmp}` of the install's own), its library and R.
fn plan(
    settings: &Settings,
    state_dir: &Path,
    sandbox: &Runtime,
    s: &Session,
) -> Result<Plan, AppError> {
    let library = crate::repl::r_session_library(s.tmp_dir());
    let base = state_dir.join("env-tmp");
    let tmp = TmpDir(crate::app::tmp::create_job_tmp(
        &base,
        sandbox.instance_id(),
    )?);
    let ph = Placeholders {
        workspace: settings.workspace()?.root().to_path_buf(),
        tmp: tmp.0.clone(),
        python: s.python().prefixes.clone(),
        venv: None,
        uv_cache: None,
    };
    Ok(Plan {
        rscript: s.python().executable.clone(),
        library,
        policy: settings.policy.resolve(&ph)?,
        repo: r_install::cran_mirror(),
        tmp,
    })
}

impl Plan {
    async fn run(
        self,
        sandbox: &Runtime,
        packages: &[String],
        sink: Arc<EnvJobSink>,
        cancel: &Canceller,
    ) -> Result<RInstallReport, crate::envs::EnvError> {
        let Plan {
            rscript,
            library,
            policy,
            repo,
            tmp,
        } = self;
        let r = r_install::install(
            sandbox, &rscript, &library, packages, &repo, &policy, sink, cancel,
        )
        .await;
        drop(tmp);
        r
    }
}

/// Runs the installs an R cell asks for (`install.packages()`), for the cell's job and
/// call. Made when an R cell starts; resolves the policy only when asked.
pub(crate) struct CellInstaller {
    pub(crate) sandbox: Runtime,
    pub(crate) settings: Arc<Settings>,
    pub(crate) state_dir: PathBuf,
    pub(crate) session: Weak<Session>,
    pub(crate) call: Call,
    pub(crate) handle: JobHandle,
}

impl CellInstaller {
    /// Start installing `packages`; `answer` gets the outcome in words when it ends.
    /// Returns what cancels it (the cell ended first: interrupted, cancelled, killed).
    pub(crate) fn start(&self, packages: Vec<String>, answer: InstallAnswer) -> Canceller {
        let cancel = Canceller::new();
        let prepared = r_install::validate(&packages)
            .map_err(AppError::from)
            .and_then(|()| {
                let s = self.session.upgrade().ok_or(AppError::BadRequest(
                    "the session was closed during the install",
                ))?;
                plan(&self.settings, &self.state_dir, &self.sandbox, &s)
            });
        let plan = match prepared {
            Ok(plan) => plan,
            Err(e) => {
                answer.send(false, e.to_string());
                return cancel;
            }
        };
        let sink = Arc::new(EnvJobSink::new(
            self.handle.clone(),
            Some(forward_progress(&self.call)),
        ));
        let sandbox = self.sandbox.clone();
        let task_cancel = cancel.clone();
        tokio::spawn(async move {
            let (ok, message) = match plan.run(&sandbox, &packages, sink, &task_cancel).await {
                Err(e) => (false, e.to_string()),
                Ok(report) if report.ok => (
                    true,
                    format!(
                        "installed {} into the session library from {}; library() loads it now",
                        report.installed.join(", "),
                        report.repository
                    ),
                ),
                Ok(report) => (
                    false,
                    report
                        .message
                        .unwrap_or_else(|| "install.packages() failed".into()),
                ),
            };
            answer.send(ok, message);
        });
        cancel
    }
}

impl App {
    /// What an R cell of `session` uses to install packages (None for a Python session).
    pub(crate) fn cell_installer(
        &self,
        session: &Arc<Session>,
        handle: &JobHandle,
        call: &Call,
    ) -> Option<CellInstaller> {
        (session.language() == crate::repl::Language::R).then(|| CellInstaller {
            sandbox: self.sandbox.clone(),
            settings: self.settings(),
            state_dir: self.state_dir.clone(),
            session: Arc::downgrade(session),
            call: call.clone(),
            handle: handle.clone(),
        })
    }

    /// Install R `packages` into session `session`'s library (the session is started
    /// first if it is not open), as a job with progress.
    pub(super) async fn r_install(
        &self,
        session: &str,
        packages: Vec<String>,
        wait: Duration,
        call: &Call,
    ) -> Result<JobView, AppError> {
        self.admit_job()?;
        r_install::validate(&packages)?;
        let s = self.session(session).await?;
        let plan = plan(&self.settings(), &self.state_dir, &self.sandbox, &s)?;
        let label = format!("install {} (R)", packages.join(" "));
        let EnvJob {
            handle,
            id,
            cancel,
            sink,
        } = self.env_job(JobKind::Install, session, &label, None, Some(call))?;
        let session = session.to_string();
        let sandbox = self.sandbox.clone();
        tokio::spawn(async move {
            let r = plan.run(&sandbox, &packages, sink, &cancel).await;
            let outcome = match r {
                Err(e) => JobOutcome {
                    status: JobStatus::Failed,
                    message: Some(e.to_string()),
                    ..Default::default()
                },
                Ok(report) => {
                    let message = report.message.clone().or_else(|| {
                        Some(format!(
                            "installed into session {session:?}'s library; library() loads it now, no restart needed"
                        ))
                    });
                    JobOutcome {
                        status: if report.ok {
                            JobStatus::Completed
                        } else {
                            JobStatus::Failed
                        },
                        exit_code: report.exit_code,
                        message,
                        result: serde_json::to_value(&report).ok(),
                        ..Default::default()
                    }
                }
            };
            handle.finish(outcome);
        });
        self.follow(&id, wait, WaitFor::Settled, call, true).await
    }
}
