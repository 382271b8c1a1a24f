//! `run`: one command under a policy, stdio passed through, a report at the end.

use std::process::ExitCode;

use crate::cli::RunArgs;

pub fn run(_args: RunArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`run` is being built (owned by the sandbox work)")
}
