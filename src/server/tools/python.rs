//! Python tools: execute code, run a file, interrupt, variables, history.

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;

use super::{DEFAULT_WAIT_SECONDS, reply, session_or_default, wait_window};
use crate::app::VarsRequest;
use crate::server::handler::SandboxServer;
use crate::server::progress::call_of;
use crate::server::render;
use crate::server::report::JobReport;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecArgs {
    /// Python or R source.
    pub code: String,
    #[serde(default)]
    #[schemars(extend("default" = "default"))]
    pub session: Option<String>,
    /// Max 60.
    #[serde(default)]
    #[schemars(extend("default" = 3))]
    pub wait_seconds: Option<f64>,
    /// Run on the state after this cell (e.g. "c3"), not the head.
    #[serde(default)]
    pub parent: Option<String>,
    /// With `parent`: allow re-running cells when no snapshot is left.
    #[serde(default)]
    pub replay: bool,
    /// Interrupt the cell after this.
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    #[serde(default)]
    pub language: Option<crate::repl::Language>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunFileArgs {
    /// `.py` or `.R` file in the workspace.
    pub path: String,
    /// sys.argv[1:].
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    #[schemars(extend("default" = "default"))]
    pub session: Option<String>,
    /// Max 60.
    #[serde(default)]
    #[schemars(extend("default" = 3))]
    pub wait_seconds: Option<f64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SessionArg {
    #[serde(default)]
    #[schemars(extend("default" = "default"))]
    pub session: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct InterruptArgs {
    #[serde(default)]
    #[schemars(extend("default" = "default"))]
    pub session: Option<String>,
    /// Seconds before the worker is restarted instead (default 2, max 60).
    #[serde(default)]
    pub grace_seconds: Option<f64>,
}

#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum VarAction {
    List,
    Get,
    Set,
    Delete,
    Clear,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct VarsArgs {
    pub action: VarAction,
    /// Variable name (get, set, delete).
    #[serde(default)]
    pub name: Option<String>,
    /// JSON value (set).
    #[serde(default)]
    pub value: Option<serde_json::Value>,
    #[serde(default)]
    #[schemars(extend("default" = "default"))]
    pub session: Option<String>,
    #[serde(default)]
    pub cursor: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct HistoryArgs {
    #[serde(default)]
    #[schemars(extend("default" = "default"))]
    pub session: Option<String>,
    /// Only the newest N cells.
    #[serde(default)]
    pub limit: Option<usize>,
    #[serde(default)]
    pub cursor: Option<String>,
}

#[tool_router(router = python_tools, vis = "pub(crate)")]
impl SandboxServer {
    #[tool(
        description = include_str!("../../../docs/tools/python_exec.md"),
        output_schema = schema_for_output::<JobReport>(),
        annotations(title = "Run Python code", read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    pub async fn python_exec(
        &self,
        Parameters(args): Parameters<ExecArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = session_or_default(args.session)?;
        let wait = wait_window(args.wait_seconds, DEFAULT_WAIT_SECONDS)?;
        let timeout = super::time_limit(args.timeout_seconds)?;
        let call = call_of(&ctx, &self.closing);
        if let Some(language) = args.language
            && let Err(e) = self.app.choose_language(&session, language)
        {
            return Ok(crate::server::report::failure(e.to_string()));
        }
        reply(
            self.app
                .python_exec(
                    &session,
                    args.code,
                    args.parent,
                    args.replay,
                    wait,
                    timeout,
                    &call,
                )
                .await,
            |v| JobReport::answer(v, &self.app),
        )
    }

    #[tool(
        description = include_str!("../../../docs/tools/python_run_file.md"),
        output_schema = schema_for_output::<JobReport>(),
        annotations(title = "Run a Python file in a session", read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    pub async fn python_run_file(
        &self,
        Parameters(args): Parameters<RunFileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = session_or_default(args.session)?;
        let wait = wait_window(args.wait_seconds, DEFAULT_WAIT_SECONDS)?;
        let call = call_of(&ctx, &self.closing);
        reply(
            self.app
                .python_run_file(&session, &args.path, args.args, wait, &call)
                .await,
            |v| JobReport::answer(v, &self.app),
        )
    }

    #[tool(
        description = include_str!("../../../docs/tools/python_interrupt.md"),
        annotations(title = "Interrupt Python", read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    pub async fn python_interrupt(
        &self,
        Parameters(args): Parameters<InterruptArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = session_or_default(args.session)?;
        let grace = args
            .grace_seconds
            .map(|g| super::seconds(Some(g), 2.0, 60.0, "grace_seconds"))
            .transpose()?;
        reply(self.app.python_interrupt(&session, grace).await, |job| {
            render::interrupted(&session, job, &self.app)
        })
    }

    #[tool(
        description = include_str!("../../../docs/tools/python_vars.md"),
        annotations(title = "Python variables", read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    pub async fn python_vars(
        &self,
        Parameters(args): Parameters<VarsArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = session_or_default(args.session)?;
        let request = match (args.action, args.name, args.value) {
            (VarAction::Get | VarAction::Set | VarAction::Delete, None, _) => {
                return Ok(crate::server::report::failure(
                    "`name` is required for get, set and delete",
                ));
            }
            (VarAction::Set, Some(_), None) => {
                return Ok(crate::server::report::failure(
                    "`value` (any JSON value) is required for set",
                ));
            }
            (VarAction::List, _, _) => VarsRequest::List(args.cursor),
            (VarAction::Clear, _, _) => VarsRequest::Clear,
            (VarAction::Get, Some(name), _) => VarsRequest::Get(name),
            (VarAction::Delete, Some(name), _) => VarsRequest::Delete(name),
            (VarAction::Set, Some(name), Some(value)) => VarsRequest::Set(name, value),
        };
        reply(
            self.app.python_vars(&session, request).await,
            |(outcome, note)| render::vars(&session, outcome, note, self.app.response_bytes()),
        )
    }

    #[tool(
        description = include_str!("../../../docs/tools/python_history.md"),
        annotations(title = "Session history", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    pub async fn python_history(
        &self,
        Parameters(args): Parameters<HistoryArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = session_or_default(args.session)?;
        reply(
            self.app
                .python_history(&session, args.limit, args.cursor.as_deref())
                .await,
            |(cells, note)| render::history(&session, cells, note, self.app.response_bytes()),
        )
    }
}
