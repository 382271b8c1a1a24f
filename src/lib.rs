//! mcp-sandbox-repl: an MCP server giving agents a persistent Python REPL and
//! background shell jobs, every process locked in by the kernel.
//!
//! Map of the subsystems (imports point down the list; `tests/suite/deps.rs` checks it):
//!
//! - [`cli`] / [`commands`]: argument parsing and the thin bodies of each subcommand
//!   (`serve`, `run`, `doctor`, `policy`, `install`); `commands::serve` turns the flags
//!   into a plain [`server::ServerConfig`]. Nothing below imports `cli`.
//! - [`server`]: MCP only — tools, argument/output schemas, transports (stdio, HTTP),
//!   rendering results. The only module that knows rmcp.
//! - [`app`]: the use cases the tools call (cells, shell jobs, installs, scripts,
//!   sessions, job queries), workspace confinement and per-job temp dirs; domain types
//!   and [`app::AppError`] out, no MCP.
//! - [`repl`]: the persistent Python worker: spawn through the launcher, the typed
//!   worker protocol, interrupt/restart, crash detection.
//! - [`jobs`]: the job store: ids, statuses, spooled output, long-poll, cancel,
//!   persistence; shell jobs.
//! - [`envs`]: uv-managed virtual environments, package installs, one-off scripts.
//! - [`broker`]: the network broker — a per-job HTTP(S) proxy in the job's own empty
//!   network namespace, connecting only to allowed hosts; the sandbox reaches it through
//!   its `ProxyProvider` seam, `app` registers it.
//! - [`sandbox`]: policy files (load, validate, resolve) and the launcher that applies
//!   rlimits → capability drop → no_new_privs → Landlock → seccomp, then execs.
//!   The only module that knows landlock and seccompiler. Three parts named for where
//!   their code runs: `policy/` (pure data), `launcher/` (inside the launcher process),
//!   `parent/` (the server's side: the `Runtime` every spawn goes through, spawn,
//!   zygote, pools); imports go parent → launcher → policy only.
//! - [`names`]: the session-name rule (a leaf).
//! - `libc_compat`: `close_range` and `memfd_create` as system calls, so the binary links
//!   against glibc 2.17 (the manylinux2014 wheels); a leaf nothing imports.

pub mod app;
pub mod broker;
pub mod cli;
pub mod commands;
pub mod envs;
pub mod jobs;
mod libc_compat;
pub mod names;
pub mod repl;
pub mod sandbox;
pub mod server;
#[cfg(test)]
mod test_support;
