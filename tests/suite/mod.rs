//! Integration suites, one file per area.

mod policy_cli;
mod run_cli;
mod run_limits;
mod run_network;
//! Integration suites, one module per area.
mod jobs;
mod jobs_bench;
