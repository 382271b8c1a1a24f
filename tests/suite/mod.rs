//! Integration suites, one file per area.

mod deps;
mod doctor;
mod envs;
mod fail_closed;
mod jobs;
mod jobs_bench;
mod launch_errors;
mod limits;
mod mcp;
mod own_cgroup;
mod pidns_init;
mod policy_cli;
mod repl;
mod run_cli;
mod run_limits;
mod run_network;
mod sandbox_escape;
mod userns;
