//! Environment tools: a session's uv venv (info / create), package installs as jobs,
//! one-off scripts in transient environments.

use std::collections::BTreeMap;

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;

use super::{MAX_WAIT_SECONDS, reply, seconds, session_or_default};
use crate::app::{EnvInfoRequest, InstallArgs, ScriptArgs};
use crate::server::handler::SandboxServer;
use crate::server::progress::call_of;
use crate::server::render;
use crate::server::report::JobReport;

/// Installs and scripts resolve packages: wait longer than a cell by default.
pub(crate) const ENV_WAIT_SECONDS: f64 = 30.0;
/// Longest `timeout_seconds` a script may ask for.
pub(crate) const MAX_SCRIPT_TIMEOUT: f64 = 24.0 * 3600.0;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EnvInfoArgs {
    #[serde(default)]
    #[schemars(extend("default" = "default"))]
    pub session: Option<String>,
    /// Create the venv now.
    #[serde(default)]
    pub create: bool,
    /// Venv to use or create (first use only).
    #[serde(default)]
    pub venv_path: Option<String>,
    /// Use the workspace's .venv.
    #[serde(default)]
    pub use_workspace_venv: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EnvInstallArgs {
    /// Requirement strings, e.g. "numpy>=2".
    pub packages: Vec<String>,
    #[serde(default)]
    #[schemars(extend("default" = "default"))]
    pub session: Option<String>,
    /// Upgrade installed packages.
    #[serde(default)]
    pub upgrade: bool,
    /// Max 60.
    #[serde(default)]
    #[schemars(extend("default" = 30))]
    pub wait_seconds: Option<f64>,
    /// Venv to use or create (first use only).
    #[serde(default)]
    pub venv_path: Option<String>,
    /// Use the workspace's .venv.
    #[serde(default)]
    pub use_workspace_venv: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunScriptArgs {
    /// Script source (or `path`).
    #[serde(default)]
    pub code: Option<String>,
    /// Workspace file (or `code`).
    #[serde(default)]
    pub path: Option<String>,
    /// Requirements.
    #[serde(default)]
    pub dependencies: Vec<String>,
    /// E.g. "3.11".
    #[serde(default)]
    pub python_version: Option<String>,
    /// sys.argv[1:].
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// In the workspace.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Kill the process tree after this.
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    #[serde(default)]
    pub benchmark: bool,
    #[serde(default)]
    #[schemars(extend("default" = "default"))]
    pub session: Option<String>,
    /// Max 60.
    #[serde(default)]
    #[schemars(extend("default" = 30))]
    pub wait_seconds: Option<f64>,
}

#[tool_router(router = env_tools, vis = "pub(crate)")]
impl SandboxServer {
    #[tool(
        description = include_str!("../../../docs/tools/env_info.md"),
        annotations(title = "Session environment", read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    pub async fn env_info(
        &self,
        Parameters(args): Parameters<EnvInfoArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = session_or_default(args.session)?;
        let request = EnvInfoRequest {
            create: args.create,
            venv_path: args.venv_path,
            use_workspace_venv: args.use_workspace_venv,
        };
        reply(self.app.env_info(&session, request).await, |info| {
            render::env_info(&session, info)
        })
    }

    #[tool(
        description = include_str!("../../../docs/tools/env_install.md"),
        output_schema = schema_for_output::<JobReport>(),
        annotations(title = "Install packages", read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = true)
    )]
    pub async fn env_install(
        &self,
        Parameters(args): Parameters<EnvInstallArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = session_or_default(args.session.clone())?;
        let wait = seconds(
            args.wait_seconds,
            ENV_WAIT_SECONDS,
            MAX_WAIT_SECONDS,
            "wait_seconds",
        )?;
        let call = call_of(&ctx, &self.closing);
        let install = InstallArgs {
            packages: args.packages,
            upgrade: args.upgrade,
            venv_path: args.venv_path,
            use_workspace_venv: args.use_workspace_venv,
        };
        reply(
            self.app.env_install(&session, install, wait, &call).await,
            |v| JobReport::answer(v, &self.app),
        )
    }

    #[tool(
        description = include_str!("../../../docs/tools/python_run_script.md"),
        output_schema = schema_for_output::<JobReport>(),
        annotations(title = "Run a one-off script", read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = true)
    )]
    pub async fn python_run_script(
        &self,
        Parameters(args): Parameters<RunScriptArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let wait = seconds(
            args.wait_seconds,
            ENV_WAIT_SECONDS,
            MAX_WAIT_SECONDS,
            "wait_seconds",
        )?;
        if let Some(t) = args.timeout_seconds
            && !(t.is_finite() && t > 0.0 && t <= MAX_SCRIPT_TIMEOUT)
        {
            return Err(ErrorData::invalid_params(
                format!("`timeout_seconds` must be > 0 and at most {MAX_SCRIPT_TIMEOUT}, got {t}"),
                None,
            ));
        }
        let session = session_or_default(args.session)?;
        let call = call_of(&ctx, &self.closing);
        let script = ScriptArgs {
            session,
            code: args.code,
            path: args.path,
            dependencies: args.dependencies,
            python_version: args.python_version,
            args: args.args,
            env: args.env,
            cwd: args.cwd,
            timeout: args.timeout_seconds.map(std::time::Duration::from_secs_f64),
            benchmark: args.benchmark,
        };
        reply(self.app.python_run_script(script, wait, &call).await, |v| {
            JobReport::answer(v, &self.app)
        })
    }
}
