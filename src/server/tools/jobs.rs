//! Job tools: wait (long-poll), input, cancel, list, output (pager), prune.

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;

use super::{
    DEFAULT_POLL_SECONDS, DEFAULT_WAIT_SECONDS, MAX_POLL_SECONDS, reply, seconds,
    session_or_default, wait_window,
};
use crate::jobs::{JobFilter, JobKind, JobStatus, Stream};
use crate::server::handler::SandboxServer;
use crate::server::progress::call_of;
use crate::server::render;
use crate::server::report::JobReport;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitArgs {
    /// The job id returned by python_exec, shell_run, ...
    pub job_id: String,
    /// Longest time to wait, in seconds (default 30, max 300).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// Wait for completion or an input request instead of returning at the first new output.
    #[serde(default)]
    pub until_done: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputArgs {
    /// The job that is waiting for input.
    pub job_id: String,
    /// The text to send (for Python `input()`: the line, without newline).
    pub text: String,
    /// Close the job's stdin after the text (shell jobs).
    #[serde(default)]
    pub eof: bool,
    /// Seconds to wait afterwards for the job to progress (default 3, max 60).
    #[serde(default)]
    pub wait_seconds: Option<f64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelArgs {
    /// The job id.
    pub job_id: String,
    /// Seconds the job has to end after the soft stop (Python: KeyboardInterrupt; shell:
    /// SIGTERM) before it is killed (Python: the worker is restarted, losing the
    /// session's state). Default 2, max 60.
    #[serde(default)]
    pub grace_seconds: Option<f64>,
}

#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StatusFilter {
    Running,
    AwaitingInput,
    Completed,
    Failed,
    Cancelled,
    Lost,
    /// Any status but running / awaiting_input.
    Finished,
}

#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KindFilter {
    Python,
    Shell,
    Install,
    Script,
}

/// The statuses a filter selects (`finished`: every status that is not running or
/// awaiting input). A thin mapping: the argument schema keeps its own variant list.
impl StatusFilter {
    pub fn statuses(self) -> Vec<JobStatus> {
        match self {
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
        }
    }
}

impl From<KindFilter> for JobKind {
    fn from(k: KindFilter) -> JobKind {
        match k {
            KindFilter::Python => JobKind::Python,
            KindFilter::Shell => JobKind::Shell,
            KindFilter::Install => JobKind::Install,
            KindFilter::Script => JobKind::Script,
        }
    }
}

impl From<StreamArg> for Stream {
    fn from(s: StreamArg) -> Stream {
        match s {
            StreamArg::Stdout => Stream::Stdout,
            StreamArg::Stderr => Stream::Stderr,
        }
    }
}

/// The store filter for list and prune arguments.
fn filter(
    ids: Option<String>,
    status: Option<StatusFilter>,
    kind: Option<KindFilter>,
    session: Option<String>,
) -> JobFilter {
    JobFilter {
        ids: ids.map(|j| vec![j]),
        status: status.map(StatusFilter::statuses),
        kind: kind.map(|k| vec![k.into()]),
        session,
        ..Default::default()
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// Only jobs with this status.
    #[serde(default)]
    pub status: Option<StatusFilter>,
    /// Only jobs of this kind.
    #[serde(default)]
    pub kind: Option<KindFilter>,
    /// Only jobs of this Python session.
    #[serde(default)]
    pub session: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StreamArg {
    #[default]
    Stdout,
    Stderr,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputArgs {
    /// The job id.
    pub job_id: String,
    /// stdout (default) or stderr.
    #[serde(default)]
    pub stream: StreamArg,
    /// Byte offset to start reading at (default 0).
    #[serde(default)]
    pub offset: Option<u64>,
    /// Number of bytes to read (default and max: the response cap).
    #[serde(default)]
    pub length: Option<u64>,
    /// Search for this regular expression (or plain text) instead of reading a range.
    #[serde(default)]
    pub pattern: Option<String>,
    /// Lines of context around each match (default 2).
    #[serde(default)]
    pub context_lines: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PruneArgs {
    /// Prune only this job.
    #[serde(default)]
    pub job_id: Option<String>,
    /// Only finished jobs with this status.
    #[serde(default)]
    pub status: Option<StatusFilter>,
    /// Only jobs of this kind.
    #[serde(default)]
    pub kind: Option<KindFilter>,
    /// Only jobs of this session.
    #[serde(default)]
    pub session: Option<String>,
}

#[tool_router(router = job_tools, vis = "pub(crate)")]
impl SandboxServer {
    #[tool(
        description = include_str!("../../../docs/tools/job_wait.md"),
        output_schema = schema_for_output::<JobReport>(),
        annotations(title = "Wait for a job", read_only_hint = true, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    pub async fn job_wait(
        &self,
        Parameters(args): Parameters<WaitArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let timeout = seconds(
            args.timeout_seconds,
            DEFAULT_POLL_SECONDS,
            MAX_POLL_SECONDS,
            "timeout_seconds",
        )?;
        let call = call_of(&ctx, &self.closing);
        reply(
            self.app
                .job_wait(&args.job_id, timeout, args.until_done, &call)
                .await,
            JobReport::result_of,
        )
    }

    #[tool(
        description = include_str!("../../../docs/tools/job_input.md"),
        output_schema = schema_for_output::<JobReport>(),
        annotations(title = "Send input to a job", read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    pub async fn job_input(
        &self,
        Parameters(args): Parameters<InputArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let wait = wait_window(args.wait_seconds, DEFAULT_WAIT_SECONDS)?;
        let call = call_of(&ctx, &self.closing);
        reply(
            self.app
                .job_input(&args.job_id, &args.text, args.eof, wait, &call)
                .await,
            JobReport::result_of,
        )
    }

    #[tool(
        description = include_str!("../../../docs/tools/job_cancel.md"),
        output_schema = schema_for_output::<JobReport>(),
        annotations(title = "Cancel a job", read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    pub async fn job_cancel(
        &self,
        Parameters(args): Parameters<CancelArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let grace = args
            .grace_seconds
            .map(|g| super::seconds(Some(g), 2.0, 60.0, "grace_seconds"))
            .transpose()?;
        reply(
            self.app.job_cancel(&args.job_id, grace).await,
            JobReport::result_of,
        )
    }

    #[tool(
        description = include_str!("../../../docs/tools/job_list.md"),
        annotations(title = "List jobs", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    pub async fn job_list(
        &self,
        Parameters(args): Parameters<ListArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = args
            .session
            .map(|s| session_or_default(Some(s)))
            .transpose()?;
        let jobs = self
            .app
            .job_list(&filter(None, args.status, args.kind, session));
        Ok(render::jobs(jobs))
    }

    #[tool(
        description = include_str!("../../../docs/tools/job_output.md"),
        annotations(title = "Read job output", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    pub async fn job_output(
        &self,
        Parameters(args): Parameters<OutputArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        if args.pattern.is_some() && (args.offset.is_some() || args.length.is_some()) {
            return Ok(crate::server::report::failure(
                "give either `pattern` (search) or `offset`/`length` (range), not both",
            ));
        }
        let stream = Stream::from(args.stream);
        if let Some(pattern) = &args.pattern {
            let context = args.context_lines.unwrap_or(2);
            return reply(
                self.app.job_search(&args.job_id, stream, pattern, context),
                |hits| render::hits(&args.job_id, stream, pattern, hits),
            );
        }
        reply(
            self.app
                .job_read(&args.job_id, stream, args.offset.unwrap_or(0), args.length),
            render::chunk,
        )
    }

    #[tool(
        description = include_str!("../../../docs/tools/job_prune.md"),
        annotations(title = "Prune finished jobs", read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    pub async fn job_prune(
        &self,
        Parameters(args): Parameters<PruneArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let filter = filter(args.job_id, args.status, args.kind, args.session);
        reply(self.app.job_prune(&filter), render::pruned)
    }
}
