//! `policy show|check|list`.

use std::process::ExitCode;

use crate::cli::PolicyCommand;

pub fn policy(_cmd: PolicyCommand) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`policy` is being built (owned by the sandbox work)")
}
