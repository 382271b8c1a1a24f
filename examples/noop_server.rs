//! Bench-only baseline: the smallest rmcp stdio server with one no-op tool (`noop`).
//!
//! `tests/bench/all.py` measures it beside the real server in the same run, so that
//! "spawn → initialized" and "trivial tool call" have a floor: what rmcp, tokio and the
//! MCP round trip cost with no work behind them. Built by `cargo build --release
//! --examples`; not part of the test run.

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::transport::stdio;
use rmcp::{ErrorData, ServerHandler, ServiceExt, tool, tool_handler, tool_router};

#[derive(Clone)]
struct Noop {
    tool_router: ToolRouter<Self>,
}

#[tool_router(router = tool_router)]
impl Noop {
    fn new() -> Self {
        Self {
            tool_router: Self::tool_router(),
        }
    }

    /// Does nothing and answers "ok".
    #[tool(name = "noop", description = "Does nothing and answers ok.")]
    async fn noop(&self) -> Result<CallToolResult, ErrorData> {
        Ok(CallToolResult::success(vec![ContentBlock::text("ok")]))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Noop {}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let service = Noop::new().serve(stdio()).await?;
    service.waiting().await?;
    Ok(())
}
