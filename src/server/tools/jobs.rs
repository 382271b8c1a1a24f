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
use crate::server::handler::SandboxServer;
use crate::server::progress::CallCtx;
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
        let call = CallCtx::from_request(&ctx, &self.closing);
        reply(
            self.backend
                .job_wait(&args.job_id, timeout, args.until_done, &call)
                .await,
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
        let call = CallCtx::from_request(&ctx, &self.closing);
        reply(
            self.backend
                .job_input(&args.job_id, &args.text, args.eof, wait, &call)
                .await,
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
        reply(self.backend.job_cancel(&args.job_id, grace).await)
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
        reply(
            self.backend
                .job_list(args.status, args.kind, session.as_deref()),
        )
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
        reply(self.backend.job_output(args))
    }

    #[tool(
        description = include_str!("../../../docs/tools/job_prune.md"),
        annotations(title = "Prune finished jobs", read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    pub async fn job_prune(
        &self,
        Parameters(args): Parameters<PruneArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        reply(self.backend.job_prune(args))
    }
}
