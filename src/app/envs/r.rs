//! `env_install` for an R session: `install.packages()` as a job (`envs::r_install`)
//! into the session library, which the running session already has on `.libPaths()`.

use std::sync::Arc;
use std::time::Duration;

use super::{EnvControl, EnvJobSink, forward_progress};
use crate::app::{App, AppError, Call, JobView};
use crate::envs::Canceller;
use crate::envs::r_install;
use crate::jobs::store::WaitFor;
use crate::jobs::{JobKind, JobOutcome, JobStatus};
use crate::sandbox::Placeholders;

impl App {
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
        let library = crate::repl::r_session_library(s.tmp_dir());
        let rscript = s.python().executable.clone();
        let base = self.state_dir.join("env-tmp");
        let tmp = crate::app::tmp::TmpDir(crate::app::tmp::create_job_tmp(
            &base,
            self.sandbox.instance_id(),
        )?);
        let ph = Placeholders {
            workspace: self.workspace()?.root().to_path_buf(),
            tmp: tmp.0.clone(),
            python: s.python().prefixes.clone(),
            venv: None,
            uv_cache: None,
        };
        let policy = self.settings().policy.resolve(&ph)?;
        let repo = r_install::cran_mirror();
        let label = format!("install {} (R)", packages.join(" "));
        let handle = self.store.create(JobKind::Install, Some(session), &label)?;
        let cancel = Canceller::new();
        handle.set_control(Arc::new(EnvControl(cancel.clone())));
        let id = handle.id().to_string();
        let sink = Arc::new(EnvJobSink {
            handle: handle.clone(),
            progress: Some(forward_progress(call)),
        });
        let session = session.to_string();
        let sandbox = self.sandbox.clone();
        tokio::spawn(async move {
            let _tmp = tmp;
            let r = r_install::install(
                &sandbox, &rscript, &library, &packages, &repo, &policy, sink, &cancel,
            )
            .await;
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
