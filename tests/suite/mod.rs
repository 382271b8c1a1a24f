//! Integration suites, one file per area.

mod policy_cli;
mod repl;
mod run_cli;
mod run_limits;
mod run_network;
