//! Integration suites, one file per area.

mod policy_cli;
mod run_cli;
mod run_limits;
mod sandbox_escape;
mod doctor;
mod limits;
