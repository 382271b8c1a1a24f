//! Shell tools: run a command (or argv) as a sandboxed job.

use std::collections::BTreeMap;

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;

use super::{DEFAULT_WAIT_SECONDS, reply, session_or_default, wait_window};
use crate::server::handler::SandboxServer;
use crate::server::progress::call_of;
use crate::server::report::{JobReport, failure};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShellArgs {
    /// Shell line, run with sh -c.
    #[serde(default)]
    pub command: Option<String>,
    /// Program and arguments, no shell.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// In the workspace.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// A .env file to load.
    #[serde(default)]
    pub env_file: Option<String>,
    /// Initial input.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Close stdin after `stdin`.
    #[serde(default)]
    pub stdin_eof: bool,
    /// Label for job_list.
    #[serde(default)]
    pub session: Option<String>,
    /// Kill the job after this.
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// Max 60.
    #[serde(default)]
    #[schemars(extend("default" = 3))]
    pub wait_seconds: Option<f64>,
}

#[tool_router(router = shell_tools, vis = "pub(crate)")]
impl SandboxServer {
    #[tool(
        description = include_str!("../../../docs/tools/shell_run.md"),
        output_schema = schema_for_output::<JobReport>(),
        annotations(title = "Run a shell command", read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    pub async fn shell_run(
        &self,
        Parameters(mut args): Parameters<ShellArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        match (&args.command, &args.argv) {
            (Some(_), Some(_)) => return Ok(failure("give either `command` or `argv`, not both")),
            (None, None) => {
                return Ok(failure(
                    "`command` (a shell line) or `argv` (a list) is required",
                ));
            }
            (None, Some(v)) if v.is_empty() => return Ok(failure("`argv` must name a program")),
            _ => {}
        }
        args.session = args
            .session
            .map(|s| session_or_default(Some(s)))
            .transpose()?;
        let wait = wait_window(args.wait_seconds, DEFAULT_WAIT_SECONDS)?;
        let timeout = super::time_limit(args.timeout_seconds)?;
        let call = call_of(&ctx, &self.closing);
        let ShellArgs {
            command,
            argv,
            cwd,
            env,
            env_file,
            stdin,
            stdin_eof,
            session,
            timeout_seconds: _,
            wait_seconds: _,
        } = args;
        let job = crate::app::ShellArgs {
            command,
            argv,
            cwd,
            env,
            env_file,
            stdin,
            stdin_eof,
            session,
            timeout,
        };
        reply(self.app.shell_run(job, wait, &call).await, |v| {
            JobReport::answer(v, &self.app)
        })
    }
}
