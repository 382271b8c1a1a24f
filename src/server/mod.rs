//! The MCP layer: tools, their argument and output schemas, transports, rendering.
//! The only module that knows rmcp.

use std::process::ExitCode;

use crate::cli::ServeArgs;

pub fn serve(_args: ServeArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("the MCP server is being built")
}
