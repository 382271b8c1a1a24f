//! Job glue: long-poll, input, cancel, list, the output pager, prune, and shell jobs.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::json;

use super::{Backend, R, listing};
use crate::jobs::store::WaitFor;
use crate::jobs::{JobFilter, JobKind, JobStatus, ShellRequest, Stream, start_shell_job};
use crate::server::progress::CallCtx;
use crate::server::tools::ToolError;
use crate::server::tools::jobs::{KindFilter, OutputArgs, PruneArgs, StatusFilter, StreamArg};
use crate::server::tools::shell::ShellArgs;

fn statuses(f: Option<StatusFilter>) -> Option<Vec<JobStatus>> {
    f.map(|f| match f {
        StatusFilter::Running => vec![JobStatus::Running],
        StatusFilter::AwaitingInput => vec![JobStatus::AwaitingInput],
        StatusFilter::Completed => vec![JobStatus::Completed],
        StatusFilter::Failed => vec![JobStatus::Failed],
        StatusFilter::Cancelled => vec![JobStatus::Cancelled],
        StatusFilter::Lost => vec![JobStatus::Lost],
        StatusFilter::Finished => vec![
            JobStatus::Completed,
            JobStatus::Failed,
            JobStatus::Cancelled,
            JobStatus::Lost,
        ],
    })
}

fn kinds(f: Option<KindFilter>) -> Option<Vec<JobKind>> {
    f.map(|k| {
        vec![match k {
            KindFilter::Python => JobKind::Python,
            KindFilter::Shell => JobKind::Shell,
            KindFilter::Install => JobKind::Install,
            KindFilter::Script => JobKind::Script,
        }]
    })
}

/// How long job_cancel waits for the job to report its end.
const CANCEL_SETTLE: Duration = Duration::from_secs(5);

impl Backend {
    pub async fn job_wait(
        &self,
        id: &str,
        timeout: Duration,
        until_done: bool,
        call: &CallCtx,
    ) -> R {
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
        call: &CallCtx,
    ) -> R {
        self.store.send_input(id, text, eof)?;
        self.follow(id, wait, WaitFor::Settled, call, false).await
    }

    pub async fn job_cancel(&self, id: &str, grace: Option<Duration>) -> R {
        self.store.cancel_within(id, grace)?;
        self.follow(
            id,
            CANCEL_SETTLE.max(grace.unwrap_or_default() + Duration::from_secs(3)),
            WaitFor::Settled,
            &CallCtx::detached(),
            false,
        )
        .await
    }

    pub fn job_list(
        &self,
        status: Option<StatusFilter>,
        kind: Option<KindFilter>,
        session: Option<&str>,
    ) -> R {
        let filter = JobFilter {
            status: statuses(status),
            kind: kinds(kind),
            session: session.map(str::to_string),
            ..Default::default()
        };
        let jobs = self.store.list(&filter);
        let mut text = format!("{} job(s)\n", jobs.len());
        for j in &jobs {
            let exit = j
                .exit_code
                .map(|c| format!(" exit {c}"))
                .unwrap_or_default();
            let sess = j
                .session
                .as_deref()
                .map(|s| format!(" [{s}]"))
                .unwrap_or_default();
            let _ = writeln!(
                text,
                "{} {:?}{sess} {}{exit} · {} ms · out {} B, err {} B · {}",
                j.id, j.kind, j.status, j.elapsed_ms, j.stdout_bytes, j.stderr_bytes, j.label
            );
        }
        Ok(listing(text, &json!({ "jobs": jobs })))
    }

    pub fn job_output(&self, args: OutputArgs) -> R {
        let stream = match args.stream {
            StreamArg::Stdout => Stream::Stdout,
            StreamArg::Stderr => Stream::Stderr,
        };
        if let Some(pattern) = &args.pattern {
            let context = args.context_lines.unwrap_or(2);
            let hits = self
                .store
                .search(&args.job_id, stream, pattern, context, 50)?;
            let mut text = format!(
                "{} match(es) of {pattern:?} in {stream} of job {}\n",
                hits.len(),
                args.job_id
            );
            for h in &hits {
                let _ = writeln!(text, "--- line {} (byte {}) ---", h.line, h.offset);
                for l in &h.before {
                    let _ = writeln!(text, "  {l}");
                }
                let _ = writeln!(text, "> {}", h.text);
                for l in &h.after {
                    let _ = writeln!(text, "  {l}");
                }
            }
            return Ok(listing(
                text,
                &json!({ "job_id": args.job_id, "stream": stream, "hits": hits }),
            ));
        }
        let cap = self.response_bytes as u64;
        let len = args.length.unwrap_or(cap).min(cap);
        let chunk = self
            .store
            .read(&args.job_id, stream, args.offset.unwrap_or(0), len)?;
        let more = if chunk.end < chunk.total {
            format!(
                "; {} more bytes: call job_output with offset {}",
                chunk.total - chunk.end,
                chunk.end
            )
        } else if chunk.eof {
            "; end of output".to_string()
        } else {
            "; the job is still writing".to_string()
        };
        let text = format!(
            "{stream} of job {} bytes [{}..{}) of {}{more}\n{}",
            chunk.id, chunk.offset, chunk.end, chunk.total, chunk.text
        );
        Ok(listing(text, &chunk))
    }

    pub fn job_prune(&self, args: PruneArgs) -> R {
        let filter = JobFilter {
            ids: args.job_id.clone().map(|j| vec![j]),
            status: statuses(args.status),
            kind: kinds(args.kind),
            session: args.session.clone(),
            ..Default::default()
        };
        if let Some(id) = &args.job_id {
            let s = self.store.summary(id)?;
            if !s.status.is_finished() {
                return Err(ToolError(format!(
                    "job {id} is still {}; cancel it first (job_cancel) or wait for it",
                    s.status
                )));
            }
        }
        let pruned = self.store.prune(&filter)?;
        Ok(listing(
            format!("pruned {} job(s): {}", pruned.len(), pruned.join(", ")),
            &json!({ "pruned": pruned }),
        ))
    }

    pub async fn shell_run(&self, args: ShellArgs, wait: Duration, call: &CallCtx) -> R {
        let (policy, tmp) = self.job_policy().await?;
        let cwd = self.resolve_path(args.cwd.as_deref().unwrap_or("."));
        let req = ShellRequest {
            command: args.command,
            argv: args.argv,
            cwd: Some(cwd),
            env: args.env,
            // Relative to the workspace; read beneath it only (jobs::dotenv::load_beneath).
            env_file: args.env_file.as_deref().map(|f| self.resolve_path(f)),
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
