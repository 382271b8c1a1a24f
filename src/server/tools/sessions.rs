//! Session tools: list, restart, close.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;

use super::python::SessionArg;
use super::{reply, session_or_default};
use crate::server::handler::SandboxServer;
use crate::server::render;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoArgs {}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CloseArgs {
    pub session: String,
}

#[tool_router(router = session_tools, vis = "pub(crate)")]
impl SandboxServer {
    #[tool(
        description = include_str!("../../../docs/tools/session_list.md"),
        annotations(title = "List sessions", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    pub async fn session_list(
        &self,
        Parameters(_args): Parameters<NoArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(render::sessions(self.app.session_list()))
    }

    #[tool(
        description = include_str!("../../../docs/tools/session_restart.md"),
        annotations(title = "Restart a session", read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    pub async fn session_restart(
        &self,
        Parameters(args): Parameters<SessionArg>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = session_or_default(args.session)?;
        reply(self.app.session_restart(&session).await, |()| {
            render::restarted(&session)
        })
    }

    #[tool(
        description = include_str!("../../../docs/tools/session_close.md"),
        annotations(title = "Close a session", read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    pub async fn session_close(
        &self,
        Parameters(args): Parameters<CloseArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = session_or_default(Some(args.session))?;
        reply(self.app.session_close(&session), |()| {
            render::closed(&session)
        })
    }
}
