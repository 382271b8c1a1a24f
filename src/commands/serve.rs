//! `serve`: build the runtime and hand over to the MCP server.

use std::process::ExitCode;

use crate::cli::ServeArgs;

pub fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    crate::server::serve(args)
}
