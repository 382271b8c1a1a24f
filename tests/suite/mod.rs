//! Integration suites, one file per area.

mod doctor;
mod limits;
mod policy_cli;
mod run_cli;
mod run_limits;
mod run_network;
mod sandbox_escape;
