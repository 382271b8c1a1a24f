//! `install --client claude|codex|cursor`: write MCP client configuration.

use std::process::ExitCode;

use crate::cli::InstallArgs;

pub fn install(_args: InstallArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`install` is being built (owned by the server work)")
}
