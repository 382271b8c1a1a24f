//! `doctor`: what this kernel supports and what each shipped policy enforces here.

use std::process::ExitCode;

use crate::cli::DoctorArgs;

pub fn doctor(_args: DoctorArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`doctor` is being built (owned by the sandbox work)")
}
