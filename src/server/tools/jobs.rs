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
use crate::app::OutputStream;
use crate::jobs::{JobFilter, JobKind, JobStatus, Stream};
use crate::server::handler::SandboxServer;
use crate::server::progress::call_of;
use crate::server::render;
use crate::server::report::JobReport;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WaitArgs {
    pub job_id: String,
    /// Longest wait (max 300).
    #[serde(default)]
    #[schemars(extend("default" = 30))]
    pub timeout_seconds: Option<f64>,
    #[serde(default)]
    pub until_done: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct InputArgs {
    pub job_id: String,
    /// Text to send.
    pub text: String,
    /// Close the input after the text.
    #[serde(default)]
    pub eof: bool,
    /// Max 60.
    #[serde(default)]
    #[schemars(extend("default" = 3))]
    pub wait_seconds: Option<f64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelArgs {
    pub job_id: String,
    /// Seconds before the soft stop becomes a kill (default 2, max 60).
    #[serde(default)]
    pub grace_seconds: Option<f64>,
}

#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StatusFilter {
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
    pub(crate) fn statuses(self) -> Vec<JobStatus> {
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

impl From<StreamArg> for OutputStream {
    fn from(s: StreamArg) -> OutputStream {
        match s {
            StreamArg::Stdout => OutputStream::Stdout,
            StreamArg::Stderr => OutputStream::Stderr,
            StreamArg::Result => OutputStream::Result,
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
pub(crate) struct ListArgs {
    #[serde(default)]
    pub status: Option<StatusFilter>,
    #[serde(default)]
    pub kind: Option<KindFilter>,
    #[serde(default)]
    pub session: Option<String>,
    /// The previous page's `next_cursor`.
    #[serde(default)]
    pub cursor: Option<String>,
    /// Jobs per page (default 50, max 500).
    #[serde(default)]
    pub limit: Option<usize>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StreamArg {
    #[default]
    Stdout,
    Stderr,
    /// The job's result as text: value, full traceback, display items (or an install's
    /// report); answers that cut one of these point here.
    Result,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OutputArgs {
    pub job_id: String,
    #[serde(default)]
    pub stream: StreamArg,
    /// Read from here; with `pattern`, continue here.
    #[serde(default)]
    #[schemars(extend("default" = 0))]
    pub offset: Option<u64>,
    /// Bytes to read (max 20 KB).
    #[serde(default)]
    pub length: Option<u64>,
    /// Regex to search for.
    #[serde(default)]
    pub pattern: Option<String>,
    /// Lines around each match.
    #[serde(default)]
    #[schemars(extend("default" = 2))]
    pub context_lines: Option<usize>,
    /// From 1.
    #[serde(default)]
    pub image: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PruneArgs {
    #[serde(default)]
    pub job_id: Option<String>,
    #[serde(default)]
    pub status: Option<StatusFilter>,
    #[serde(default)]
    pub kind: Option<KindFilter>,
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
            |v| JobReport::answer(v, &self.app),
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
            |v| JobReport::answer(v, &self.app),
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
        reply(self.app.job_cancel(&args.job_id, grace).await, |v| {
            JobReport::answer(v, &self.app)
        })
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
            self.app.job_list_page(
                &filter(None, args.status, args.kind, session),
                args.cursor.as_deref(),
                args.limit,
            ),
            render::jobs,
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
        if args.pattern.is_some() && args.length.is_some() {
            return Ok(crate::server::report::failure(
                "give either `pattern` (search, `offset` = where to continue) or `length` (read a range), not both",
            ));
        }
        if let Some(index) = args.image {
            if args.pattern.is_some() || args.offset.is_some() || args.length.is_some() {
                return Ok(crate::server::report::failure(
                    "give `image` alone: it fetches one image of a finished cell",
                ));
            }
            return reply(
                self.app
                    .job_image(&args.job_id, index, crate::server::budget::IMAGE_BYTES)
                    .await,
                |img| render::image(&args.job_id, img),
            );
        }
        let stream = OutputStream::from(args.stream);
        if let Some(pattern) = &args.pattern {
            let stream = match stream {
                OutputStream::Stdout => Stream::Stdout,
                OutputStream::Stderr => Stream::Stderr,
                OutputStream::Result => {
                    return Ok(crate::server::report::failure(
                        "search reads stdout or stderr; read the result stream by offset",
                    ));
                }
            };
            let context = args.context_lines.unwrap_or(2);
            let from = args.offset.unwrap_or(0);
            return reply(
                self.app
                    .job_search(&args.job_id, stream, pattern, context, from),
                |found| {
                    render::hits(
                        &args.job_id,
                        stream,
                        pattern,
                        found,
                        self.app.response_bytes(),
                    )
                },
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
