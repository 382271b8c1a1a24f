//! Job use cases: long-poll, input, cancel, list, the output pager, prune, and shell jobs.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{App, AppError, Call, JobView};
use crate::jobs::store::WaitFor;
use crate::jobs::{
    JobFilter, JobSummary, OutputChunk, SearchHit, ShellRequest, Stream, start_shell_job,
};

/// A shell job as the caller asks for it (paths relative to the workspace).
#[derive(Debug, Clone, Default)]
pub struct ShellArgs {
    /// A shell command line, run with `sh -c`.
    pub command: Option<String>,
    /// The program and its arguments, run without a shell.
    pub argv: Option<Vec<String>>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub env_file: Option<String>,
    /// Text written to stdin at start.
    pub stdin: Option<String>,
    /// Close stdin after `stdin`.
    pub stdin_eof: bool,
    /// A session label for list filters.
    pub session: Option<String>,
}

/// Most search hits one call returns.
const MAX_HITS: usize = 50;

/// How long job_cancel waits for the job to report its end.
const CANCEL_SETTLE: Duration = Duration::from_secs(5);

impl App {
    pub async fn job_wait(
        &self,
        id: &str,
        timeout: Duration,
        until_done: bool,
        call: &Call,
    ) -> Result<JobView, AppError> {
        let until = if until_done {
            WaitFor::Settled
        } else {
            WaitFor::Output
        };
        self.follow(id, timeout, until, call, false).await
    }

    pub async fn job_input(
        &self,
        id: &str,
        text: &str,
        eof: bool,
        wait: Duration,
        call: &Call,
    ) -> Result<JobView, AppError> {
        self.store.send_input(id, text, eof)?;
        self.follow(id, wait, WaitFor::Settled, call, false).await
    }

    /// Cancel a job; a Python cell that ignores KeyboardInterrupt for `grace` loses its
    /// worker (see [`super::python::DEFAULT_CANCEL_GRACE`]).
    pub async fn job_cancel(&self, id: &str, grace: Option<Duration>) -> Result<JobView, AppError> {
        self.store.cancel_within(id, grace)?;
        self.follow(
            id,
            CANCEL_SETTLE.max(grace.unwrap_or_default() + Duration::from_secs(3)),
            WaitFor::Settled,
            &Call::detached(),
            false,
        )
        .await
    }

    pub fn job_list(&self, filter: &JobFilter) -> Vec<JobSummary> {
        self.store.list(filter)
    }

    /// Lines of `stream` matching `pattern`, with `context` lines around each.
    pub fn job_search(
        &self,
        id: &str,
        stream: Stream,
        pattern: &str,
        context: usize,
    ) -> Result<Vec<SearchHit>, AppError> {
        Ok(self.store.search(id, stream, pattern, context, MAX_HITS)?)
    }

    /// Bytes `[offset, offset + len)` of `stream`, `len` capped at the response size.
    pub fn job_read(
        &self,
        id: &str,
        stream: Stream,
        offset: u64,
        len: Option<u64>,
    ) -> Result<OutputChunk, AppError> {
        let cap = self.response_bytes as u64;
        let len = len.unwrap_or(cap).min(cap);
        Ok(self.store.read(id, stream, offset, len)?)
    }

    /// Remove the finished jobs `filter` selects; a single job named by id must be finished.
    pub fn job_prune(&self, filter: &JobFilter) -> Result<Vec<String>, AppError> {
        if let Some([id]) = filter.ids.as_deref() {
            let s = self.store.summary(id)?;
            if !s.status.is_finished() {
                return Err(AppError::StillRunning {
                    id: id.clone(),
                    status: s.status,
                });
            }
        }
        Ok(self.store.prune(filter)?)
    }

    pub async fn shell_run(
        &self,
        args: ShellArgs,
        wait: Duration,
        call: &Call,
    ) -> Result<JobView, AppError> {
        // Opened beneath the workspace (a refusal reads the same whatever lies outside);
        // the job gets the real path of what was opened.
        let cwd = self
            .workspace()
            .dir(args.cwd.as_deref().unwrap_or("."), "cwd")?;
        // Relative to the workspace; the server reads it itself, beneath the workspace
        // only (again through openat2 in jobs::dotenv::load_beneath).
        let env_file = args
            .env_file
            .as_deref()
            .map(|f| self.workspace().file(f, "env_file"))
            .transpose()?;
        let (policy, tmp) = self.job_policy().await?;
        let req = ShellRequest {
            command: args.command,
            argv: args.argv,
            cwd: Some(cwd),
            env: args.env,
            env_file,
            session: args.session,
            stdin: true,
            cancel_grace: None,
            private_tmp: Some(tmp.clone()),
        };
        let handle = match start_shell_job(&self.store, req, policy) {
            Ok(h) => h,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(e.into());
            }
        };
        let id = handle.id().to_string();
        if args.stdin.is_some() || args.stdin_eof {
            self.store
                .send_input(&id, args.stdin.as_deref().unwrap_or(""), args.stdin_eof)?;
        }
        self.follow(&id, wait, WaitFor::Settled, call, true).await
    }
}

/// For watchers beside the agent's own calls (resource subscriptions): nothing here
/// advances what `job_wait` hands out.
impl App {
    /// The job's current state and byte counts.
    pub fn job_summary(&self, id: &str) -> Result<JobSummary, AppError> {
        Ok(self.store.summary(id)?)
    }

    /// Wait until the job changes or `timeout` passes.
    pub async fn job_changed(&self, id: &str, timeout: Duration) -> Result<(), AppError> {
        Ok(self.store.changed(id, timeout).await?)
    }
}
