//! mcp-sandbox-repl: an MCP server giving agents a persistent Python REPL and
//! background shell jobs, every process locked in by the kernel.
//!
//! Map of the subsystems (dependencies point down the list):
//!
//! - [`cli`] / [`commands`]: argument parsing and the thin bodies of each subcommand
//!   (`serve`, `run`, `doctor`, `policy`, `install`).
//! - [`server`]: MCP only — tools, argument/output schemas, transports (stdio, HTTP),
//!   rendering results. The only module that knows rmcp.
//! - [`repl`]: the persistent Python worker: spawn through the launcher, the typed
//!   worker protocol, interrupt/restart, crash detection.
//! - [`jobs`]: the job store: ids, statuses, spooled output, long-poll, cancel,
//!   persistence; shell jobs.
//! - [`envs`]: uv-managed virtual environments, package installs, one-off scripts.
//! - [`sandbox`]: policy files (load, validate, resolve) and the launcher that applies
//!   rlimits → capability drop → no_new_privs → Landlock → seccomp, then execs.
//!   The only module that knows landlock and seccompiler.

pub mod app;
pub mod cli;
pub mod commands;
pub mod envs;
pub mod jobs;
pub mod names;
pub mod repl;
pub mod sandbox;
pub mod server;
