//! Job use cases: long-poll, input, cancel, list, the output pager, prune, and shell jobs.

use std::collections::BTreeMap;
use std::time::Duration;

use super::result::{self, ResultImage};
use super::{App, AppError, Call, JobView};
use crate::jobs::search::{Found, Limits};
use crate::jobs::store::WaitFor;
use crate::jobs::{
    Excerpt, JobFilter, JobKind, JobSnapshot, JobSummary, ShellRequest, Stream, start_shell_job,
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
    /// End the job (TERM, then KILL) after this long, in words.
    pub timeout: Option<Duration>,
}

/// Which stream of a job to read: its two output streams or its result (see
/// [`super::result`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    Stdout,
    Stderr,
    Result,
}

impl OutputStream {
    pub fn as_str(self) -> &'static str {
        match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
            OutputStream::Result => "result",
        }
    }
}

/// A byte range of one stream of a job, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub job_id: String,
    pub stream: OutputStream,
    /// Offset of the first byte returned.
    pub offset: u64,
    /// Offset just past the last byte returned; read on from here.
    pub end: u64,
    /// Bytes in the stream so far.
    pub total: u64,
    /// True when `end == total` and nothing more will be written.
    pub eof: bool,
    /// The bytes as UTF-8, or (`base64`) their base64 when they are not text.
    pub text: String,
    pub base64: bool,
}

/// Most search hits one call returns.
const MAX_HITS: usize = 200;
/// A search counts matches up to this many; beyond, it says "at least".
const COUNT_CAP: u64 = 1_000_000;

/// How long job_cancel waits for the job to report its end.
const CANCEL_SETTLE: Duration = Duration::from_secs(5);

/// Jobs per `job_list` page unless the caller asks for fewer or more (up to the max);
/// a page also stops where the response cap would be passed.
const LIST_PAGE: usize = 50;
const LIST_PAGE_MAX: usize = 500;

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
        // A Python cell says when it asks again (awaiting_input); a process reading its
        // stdin does not, so its answer comes with the output the input produced.
        let until = match self.store.summary(id)?.kind {
            JobKind::Python => WaitFor::Settled,
            _ => WaitFor::Output,
        };
        self.store.send_input(id, text, eof)?;
        self.follow(id, wait, until, call, false).await
    }

    /// Cancel a job; a Python cell that ignores KeyboardInterrupt for `grace` loses its
    /// worker (see [`super::python::DEFAULT_CANCEL_GRACE`]).
    pub async fn job_cancel(&self, id: &str, grace: Option<Duration>) -> Result<JobView, AppError> {
        self.store.cancel_within(id, grace)?;
        self.follow(
            id,
            CANCEL_SETTLE.max(grace.unwrap_or_default() + Duration::from_secs(3)),
            WaitFor::Finished,
            &Call::detached(),
            false,
        )
        .await
    }

    /// A job as one answer from its start: both output streams from byte 0 (cut to
    /// the answer budget, as one long window would have), its state and result. Advances
    /// nothing. What a task following the job ends with.
    pub async fn job_whole(&self, id: &str) -> Result<JobView, AppError> {
        let mut snap = self.store.peek(id)?;
        let (out, err) = (snap.stdout.end, snap.stderr.end);
        let (b_out, b_err) = crate::jobs::excerpt::split_budget(self.response_bytes, out, err);
        snap.stdout = self.store.excerpt(id, Stream::Stdout, 0, out, b_out)?;
        snap.stderr = self.store.excerpt(id, Stream::Stderr, 0, err, b_err)?;
        if snap.status == crate::jobs::JobStatus::Failed {
            // Resolved once; needed to explain denials in words.
            let _ = self.shell_policy().await;
        }
        Ok(self.view(snap))
    }

    pub fn job_list(&self, filter: &JobFilter) -> Vec<JobSummary> {
        self.store.list(filter)
    }

    /// One page of jobs, newest first, after `cursor`, within the response cap.
    pub fn job_list_page(
        &self,
        filter: &JobFilter,
        cursor: Option<&str>,
        limit: Option<usize>,
    ) -> Result<crate::jobs::JobPage, AppError> {
        let limit = limit.unwrap_or(LIST_PAGE).clamp(1, LIST_PAGE_MAX);
        Ok(self
            .store
            .list_page(filter, cursor, limit, self.response_bytes)?)
    }

    /// Lines of `stream` matching `pattern` from byte `offset` on, with `context` lines
    /// around each: every match counted (up to a cap), the first ones shown within the
    /// answer budget, and the cursor to continue from.
    pub fn job_search(
        &self,
        id: &str,
        stream: Stream,
        pattern: &str,
        context: usize,
        offset: u64,
    ) -> Result<Found, AppError> {
        let limits = Limits {
            start: offset,
            context,
            max_hits: MAX_HITS,
            text_budget: self.response_bytes * 3 / 4,
            count_cap: COUNT_CAP,
        };
        Ok(self.store.search_from(id, stream, pattern, &limits)?)
    }

    /// Bytes `[offset, offset + len)` of `stream`, `len` capped at the response size.
    pub fn job_read(
        &self,
        id: &str,
        stream: OutputStream,
        offset: u64,
        len: Option<u64>,
    ) -> Result<Chunk, AppError> {
        let cap = self.response_bytes as u64;
        let len = len.unwrap_or(cap).min(cap);
        let s = match stream {
            OutputStream::Stdout => Stream::Stdout,
            OutputStream::Stderr => Stream::Stderr,
            OutputStream::Result => return self.read_result(id, offset, len),
        };
        let c = self.store.read(id, s, offset, len)?;
        Ok(Chunk {
            job_id: c.id,
            stream,
            offset: c.offset,
            end: c.end,
            total: c.total,
            eof: c.eof,
            text: c.text,
            base64: c.base64,
        })
    }

    /// A finished job's stored result; an error in words if it has none.
    fn finished_result(&self, id: &str) -> Result<JobSnapshot, AppError> {
        let snap = self.store.peek(id)?;
        if !snap.status.is_finished() {
            return Err(AppError::NoResult {
                id: snap.id,
                why: " yet: it is written when the job finishes (job_wait until_done)",
            });
        }
        if snap.result.is_none() {
            return Err(AppError::NoResult {
                id: snap.id,
                why: ": it ended without a value, traceback or display output",
            });
        }
        Ok(snap)
    }

    fn read_result(&self, id: &str, offset: u64, len: u64) -> Result<Chunk, AppError> {
        let snap = self.finished_result(id)?;
        let layout = result::layout(
            snap.kind,
            snap.result.as_ref().unwrap_or(&serde_json::Value::Null),
        );
        let total = layout.text.len() as u64;
        if offset > total {
            return Err(AppError::ResultPastEnd {
                id: snap.id,
                offset,
                total,
            });
        }
        let (text, offset, end) = result::slice(&layout.text, offset, len);
        Ok(Chunk {
            job_id: snap.id,
            stream: OutputStream::Result,
            offset,
            end,
            total,
            eof: end == total,
            text,
            base64: false,
        })
    }

    /// Image `index` (1-based) of a finished cell, within `budget` bytes of base64: one
    /// over it is scaled down (on a blocking thread: decoding a large image takes a while),
    /// and says how big the original is.
    pub async fn job_image(
        &self,
        id: &str,
        index: usize,
        budget: usize,
    ) -> Result<ResultImage, AppError> {
        let snap = self.finished_result(id)?;
        let mut img = result::image(
            snap.result.as_ref().unwrap_or(&serde_json::Value::Null),
            index,
        )
        .map_err(|of| AppError::NoImage {
            id: snap.id.clone(),
            index,
            of,
        })?;
        let (mime, data) = (img.mime.clone(), std::mem::take(&mut img.data));
        let fitted = tokio::task::spawn_blocking(move || super::images::fit(&mime, &data, budget))
            .await
            .unwrap_or_else(|e| Err(super::images::FitError::Aborted(e.to_string())))
            .map_err(|why| AppError::ImageUnfit {
                id: snap.id,
                index,
                why,
            })?;
        img.data = fitted.data;
        img.size = fitted.size;
        img.original = fitted.original;
        Ok(img)
    }

    /// Bytes `[offset, end)` of an output stream in about `budget` bytes of text (head
    /// and tail, the exact range left out named), for an answer sharing its budget.
    pub fn job_excerpt(
        &self,
        id: &str,
        stream: Stream,
        offset: u64,
        end: u64,
        budget: usize,
    ) -> Result<Excerpt, AppError> {
        Ok(self.store.excerpt(id, stream, offset, end, budget)?)
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
        self.admit_job()?;
        // Opened beneath the workspace (a refusal reads the same whatever lies outside);
        // the job gets the real path of what was opened.
        let cwd = self
            .workspace()?
            .dir(args.cwd.as_deref().unwrap_or("."), "cwd")?;
        // Relative to the workspace; the server reads it itself, beneath the workspace
        // only (again through openat2 in jobs::dotenv::load_beneath).
        let env_file = args
            .env_file
            .as_deref()
            .map(|f| self.workspace()?.file(f, "env_file"))
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
            private_tmp: tmp.clone(),
        };
        let handle = match start_shell_job(&self.sandbox, &self.store, req, policy) {
            Ok(h) => h,
            Err(e) => {
                if let Some(tmp) = tmp {
                    let _ = std::fs::remove_dir_all(&tmp);
                }
                return Err(e.into());
            }
        };
        let id = handle.id().to_string();
        self.arm_timeout(&id, args.timeout);
        if args.stdin.is_some() || args.stdin_eof {
            self.store
                .send_input(&id, args.stdin.as_deref().unwrap_or(""), args.stdin_eof)?;
        }
        self.follow(&id, wait, WaitFor::Settled, call, true).await
    }
}

impl App {
    /// The caller's time limit on a job: once `timeout` passes, a job still running is
    /// ended as by job_cancel and fails with "timed out after N s" leading its message.
    pub(super) fn arm_timeout(&self, id: &str, timeout: Option<Duration>) {
        let Some(after) = timeout else { return };
        let store = self.store.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            if let Err(e) = store.time_out(&id, after) {
                tracing::debug!(job = %id, error = %e, "the time limit found no job to end");
            }
        });
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

    /// Name job `id` also by `handle` (an MCP task id), durably: the name outlives a
    /// restart of the server as long as the job is kept.
    pub fn job_add_handle(&self, id: &str, handle: &str) -> Result<(), AppError> {
        Ok(self.store.add_handle(id, handle)?)
    }

    /// The job `handle` names (given by [`job_add_handle`](Self::job_add_handle), in this
    /// server or an earlier one on the same state dir), if the job is still kept.
    pub fn job_of_handle(&self, handle: &str) -> Option<crate::jobs::handles::HandleRecord> {
        self.store.job_of_handle(handle)
    }
}
