//! Command-line interface: clap arguments for every mode, and dispatch.
//! Every server flag has an environment-variable twin so MCP client configs can use either.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::commands;

/// Who starts this server, how to connect one and how to try it: the paragraph of
/// `--help`, and what a person who starts it at a terminal reads (one line).
pub const ABOUT_CLIENTS: &str = "This is an MCP server: an MCP client (Codex, Claude Code, \
Claude Desktop, Cursor, VS Code) starts it and speaks JSON-RPC with it over stdin and \
stdout, so run by hand it only waits for that client. Connect a client with \
`mcp-sandbox-repl install --client codex|claude|claude-desktop|cursor|vscode` (see \
\"Connect a client\" in the README); try it with `mcp-sandbox-repl --transport http`, \
then point an MCP client or the MCP Inspector at the URL it prints. Ctrl-C quits.";

#[derive(Debug, Parser)]
#[command(
    name = "mcp-sandbox-repl",
    version,
    about = "MCP server: a persistent Python REPL and shell jobs, every process locked in by the kernel",
    after_help = ABOUT_CLIENTS,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// With no subcommand the server starts (same as `serve`).
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the MCP server (the default).
    Serve(Box<ServeArgs>),
    /// Run one command under a policy and report how it ended (the CI runner).
    Run(RunArgs),
    /// Report what this kernel supports and what each shipped policy enforces here.
    Doctor(DoctorArgs),
    /// Inspect policies.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Write MCP client configuration for this server.
    Install(InstallArgs),
}

/// The coarse sandbox choice, as in other MCP REPL servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SandboxState {
    ReadOnly,
    WorkspaceWrite,
    DangerFullAccess,
    /// Use what the client asks for; behaves as workspace-write until it does.
    Inherit,
}

impl SandboxState {
    /// The shipped policy this state stands for.
    pub fn policy_name(self) -> &'static str {
        match self {
            SandboxState::ReadOnly => "read-only",
            SandboxState::WorkspaceWrite | SandboxState::Inherit => "workspace-write",
            SandboxState::DangerFullAccess => "danger-full-access",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    Stdio,
    Http,
}

/// How the sandbox starts a launcher (hidden flags for benchmarks and the tests of the
/// fallback paths; see `sandbox::Route`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SpawnRoute {
    /// Fork this single-threaded process (`run`'s default).
    Fork,
    /// Through the zygote (the server's default).
    Zygote,
    /// Re-execute the launcher per job.
    Reexec,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// How launchers are started (for benchmarks: the server's fallback is `reexec`).
    #[arg(long, value_enum, hide = true, default_value = "zygote")]
    pub spawn_route: SpawnRoute,
    /// Make each job's cgroup, network namespace and view on its spawn path instead of
    /// ahead of need (the benchmark's ablation).
    #[arg(long, hide = true)]
    pub no_made_ahead: bool,
    /// Coarse sandbox choice; `--policy` wins over it.
    #[arg(
        long,
        value_enum,
        env = "MCP_SANDBOX_STATE",
        default_value = "workspace-write"
    )]
    pub sandbox_state: SandboxState,
    /// A shipped policy name or a policy file path.
    #[arg(long, env = "MCP_SANDBOX_POLICY")]
    pub policy: Option<String>,
    /// The directory sandboxed code may write to (default: the current directory).
    #[arg(long, env = "MCP_SANDBOX_WORKSPACE")]
    pub workspace: Option<PathBuf>,
    /// Allow a workspace that is `/`, your home directory or a parent of the state dir
    /// (refused by default: sandboxed code could write anywhere under it).
    #[arg(long, env = "MCP_SANDBOX_ALLOW_BROAD_WORKSPACE")]
    pub allow_broad_workspace: bool,
    /// Python interpreter for workers (default: nearest `.venv` upward from the workspace, else `python3` on PATH).
    #[arg(long, env = "MCP_SANDBOX_PYTHON")]
    pub python: Option<PathBuf>,
    /// Language of a session whose first call names none: python or r (R sessions need `Rscript` and jsonlite).
    #[arg(long, env = "MCP_SANDBOX_INTERPRETER", default_value = "python")]
    pub interpreter: crate::repl::Language,
    /// Where job tables, spooled output and session venvs live (default: $XDG_STATE_HOME/mcp-sandbox-repl).
    #[arg(long, env = "MCP_SANDBOX_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// `uv` executable (default: `uv` on PATH).
    #[arg(long, env = "MCP_SANDBOX_UV")]
    pub uv: Option<PathBuf>,
    /// stdio (default) or streamable HTTP.
    #[arg(
        long,
        value_enum,
        env = "MCP_SANDBOX_TRANSPORT",
        default_value = "stdio"
    )]
    pub transport: Transport,
    /// Address for the HTTP transport (loopback by default).
    #[arg(long, env = "MCP_SANDBOX_LISTEN", default_value = "127.0.0.1:8765")]
    pub listen: SocketAddr,
    /// Bearer token required by the HTTP transport (default: a random one, written 0600 to
    /// `<state dir>/http-token`). An error with stdio.
    #[arg(long, env = "MCP_SANDBOX_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Serve HTTP without a bearer token (loopback only): any local process could run code.
    #[arg(long, env = "MCP_SANDBOX_NO_AUTH", conflicts_with = "token")]
    pub no_auth: bool,
    /// HTTP: a tokens file (TOML, mode 0600): one principal per token, each with its own
    /// sessions, jobs, stores, workspace and quotas; re-read on SIGHUP (docs/security.md).
    #[arg(long, env = "MCP_SANDBOX_TOKENS", conflicts_with_all = ["token", "no_auth"])]
    pub tokens: Option<std::path::PathBuf>,
    /// HTTP behind a trusted front (agent-sandbox's sandbox-router): no bearer token, but
    /// every request must carry `X-Sandbox-ID` equal to `--cell-id`; the front
    /// authenticates callers and only it may reach this port (docs/security.md).
    #[arg(long, env = "MCP_SANDBOX_ROUTER_AUTH", conflicts_with_all = ["token", "no_auth", "tokens"], requires = "cell_id")]
    pub router_auth: bool,
    /// HTTP with --router-auth: this cell's own name, as the front sends it in
    /// `X-Sandbox-ID` (on Kubernetes, the pod's name from the Downward API).
    #[arg(long, env = "MCP_SANDBOX_CELL_ID")]
    pub cell_id: Option<String>,
    /// HTTP: on SIGTERM, seconds running jobs get to finish while new ones are refused and
    /// `/readyz` answers 503; then everything is killed. SIGINT or a second SIGTERM skips
    /// the wait; 0: no drain [default: 20, below Kubernetes' 30 s grace period].
    #[arg(long, env = "MCP_SANDBOX_DRAIN_SECONDS")]
    pub drain_seconds: Option<u64>,
    /// HTTP: most TCP connections open at once (default: 256, or a quarter of the
    /// server's open-file limit if that is lower). At the cap a new connection closes the
    /// longest-idle one (no request in progress); if every one is busy it gets 503.
    #[arg(long, env = "MCP_SANDBOX_HTTP_MAX_CONNECTIONS")]
    pub http_max_connections: Option<usize>,
    /// HTTP: seconds a connection may take to send a complete request head, the first
    /// one or the next on a kept-alive connection; then it is closed [default: 10].
    #[arg(long, env = "MCP_SANDBOX_HTTP_HEADER_TIMEOUT")]
    pub http_header_timeout: Option<u64>,
    /// HTTP: most MCP sessions open at once (one per connected client; not Python
    /// sessions). A new client over it gets 503 in words [default: 128].
    #[arg(long, env = "MCP_SANDBOX_HTTP_MAX_SESSIONS")]
    pub http_max_sessions: Option<usize>,
    /// HTTP: seconds a new MCP session has to send `notifications/initialized` after
    /// `initialize`; then it is closed [default: 30].
    #[arg(long, env = "MCP_SANDBOX_HTTP_HANDSHAKE_TIMEOUT")]
    pub http_handshake_timeout: Option<u64>,
    /// HTTP: seconds an MCP session may go without any message (a request, a notification,
    /// an answer or progress of its own calls); then it is closed [default: 300].
    #[arg(long, env = "MCP_SANDBOX_HTTP_SESSION_IDLE")]
    pub http_session_idle: Option<u64>,
    /// Maximum number of live Python sessions (the prewarmed `default` counts once used).
    #[arg(long, env = "MCP_SANDBOX_MAX_SESSIONS", default_value_t = 8)]
    pub max_sessions: usize,
    /// Idle seconds after which a session is closed.
    #[arg(long, env = "MCP_SANDBOX_SESSION_TTL", default_value_t = 3600)]
    pub session_ttl: u64,
    /// Snapshots (forked copies of a session's state after each cell, for branching with
    /// `python_exec parent=...`) kept per session; the least recently used is evicted.
    /// 0 turns snapshots off.
    #[arg(long, env = "MCP_SANDBOX_MAX_SNAPSHOTS", default_value_t = 8)]
    pub max_snapshots: usize,
    /// Memory budget for a session's snapshots, as the kernel counts it for the session's
    /// cgroups ("64MiB", "2G", bytes): past it the least recently used snapshots are
    /// evicted. Default: half the policy's memory limit (none without one).
    #[arg(long, env = "MCP_SANDBOX_SNAPSHOT_MEMORY", value_parser = parse_byte_size)]
    pub snapshot_memory: Option<u64>,
    /// Idle milliseconds after a cell before its snapshot is taken. A call that arrives
    /// sooner skips that cell's snapshot (it stays branchable by replay), so a snapshot
    /// never delays a call. 0: snapshot every cell right after its answer (the next call
    /// may wait for the fork).
    #[arg(long, env = "MCP_SANDBOX_SNAPSHOT_IDLE_MS", default_value_t = 200)]
    pub snapshot_idle_ms: u64,
    /// Cells a session keeps in its history and graph file; past it the oldest are
    /// dropped (except those whose snapshot is held and the head's line).
    #[arg(long, env = "MCP_SANDBOX_MAX_CELLS", default_value_t = 10_000)]
    pub max_cells: usize,
    /// Approximate cap, in bytes, on the text of one tool response.
    #[arg(long, env = "MCP_SANDBOX_RESPONSE_BYTES", default_value_t = 20_000)]
    pub response_bytes: usize,
    /// Cap on disk used by spooled job output ("2GiB", "512M", bytes); the oldest finished
    /// jobs are evicted first.
    #[arg(long, env = "MCP_SANDBOX_DISK_CAP", default_value = "2GiB", value_parser = parse_byte_size)]
    pub disk_cap: u64,
    /// Disk one session's package stores may take — its uv cache, its venv and what its
    /// running installs and scripts write ("16GiB", "512M", bytes). A job that passes it is
    /// killed; past it the session's uv cache is cleared before the next install.
    #[arg(long, env = "MCP_SANDBOX_ENV_DISK_CAP", default_value = "16GiB", value_parser = parse_byte_size)]
    pub env_disk_cap: u64,
    /// Disk the package stores of all sessions may take together (the least recently
    /// used idle sessions' uv caches are cleared first).
    #[arg(long, env = "MCP_SANDBOX_ENV_DISK_TOTAL", default_value = "64GiB", value_parser = parse_byte_size)]
    pub env_disk_total: u64,
    /// Most jobs kept (the oldest finished ones are removed first, printed output or not).
    #[arg(long, env = "MCP_SANDBOX_KEEP_JOBS", default_value_t = 10_000)]
    pub keep_jobs: usize,
    /// Hours a finished job is kept.
    #[arg(long, env = "MCP_SANDBOX_KEEP_HOURS", default_value_t = 168)]
    pub keep_hours: u64,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// How the launcher is started (for benchmarks and tests of the server's paths).
    #[arg(long, value_enum, hide = true, default_value = "fork")]
    pub spawn_route: SpawnRoute,
    /// A shipped policy name or a policy file path.
    #[arg(long, default_value = "workspace-write")]
    pub policy: String,
    /// The workspace directory (default: the current directory).
    #[arg(long)]
    pub workspace: Option<PathBuf>,
    /// Print a machine-readable JSON report on stdout after the command ends
    /// (the command's own stdout is still passed through before it).
    #[arg(long)]
    pub json: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<OsString>,
}

#[derive(Debug, Clone, Args)]
pub struct DoctorArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Workspace used to resolve policies (default: the current directory).
    #[arg(long)]
    pub workspace: Option<PathBuf>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum PolicyCommand {
    /// Print a policy fully resolved for a workspace.
    Show {
        /// A shipped policy name or a policy file path.
        name: String,
        #[arg(long)]
        workspace: Option<PathBuf>,
    },
    /// Validate a policy file.
    Check { file: PathBuf },
    /// List the shipped policies.
    List,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Client {
    /// Claude Code (`~/.claude.json`).
    Claude,
    /// Claude Desktop (`$XDG_CONFIG_HOME/Claude/claude_desktop_config.json`).
    ClaudeDesktop,
    /// Codex (`$CODEX_HOME/config.toml`, default `~/.codex/config.toml`).
    Codex,
    /// Cursor (`~/.cursor/mcp.json`).
    Cursor,
    /// VS Code (`.vscode/mcp.json` in the workspace).
    Vscode,
}

#[derive(Debug, Clone, Args)]
pub struct InstallArgs {
    /// Which client's configuration to write.
    #[arg(long, value_enum)]
    pub client: Client,
    /// Show the change as a unified diff instead of writing it.
    #[arg(long)]
    pub print: bool,
    /// Name of the server entry in the client configuration (default: `sandbox-repl`, or
    /// `sandbox-repl-r` with `--interpreter r`).
    #[arg(long)]
    pub name: Option<String>,
    /// Language of the entry's sessions: python or r (an entry per interpreter, side by side).
    #[arg(long)]
    pub interpreter: Option<crate::repl::Language>,
    /// Sandbox state passed to the server (default: `inherit` for codex, which tells the
    /// server its sandbox; `workspace-write` for the others).
    #[arg(long, value_enum)]
    pub sandbox_state: Option<SandboxState>,
    /// Workspace passed to the server (default: the client's working directory; for
    /// vscode also where `.vscode/mcp.json` is written, default the current directory).
    #[arg(long)]
    pub workspace: Option<PathBuf>,
    /// Do not copy TLS, proxy and uv index variables from this environment into the entry.
    #[arg(long)]
    pub no_env: bool,
}

/// `run`'s arguments alone: what `mcp-sandbox-repl run ...` parses to, without building
/// the whole interface first (the server's ~35 flags twice, each with its environment
/// variable and default: most of clap's time in a `run`, which is on CI's path).
#[derive(Debug, Parser)]
#[command(name = "mcp-sandbox-repl run")]
struct RunAlone {
    #[command(flatten)]
    args: RunArgs,
}

/// `argv` parsed as `run` by [`RunAlone`] when it starts with `run` and parses; `None`
/// otherwise: then the whole interface parses it, and its help and errors are the ones
/// printed (as they were before this shortcut).
fn run_args_alone(argv: &[OsString]) -> Option<RunArgs> {
    if argv.get(1).is_none_or(|a| a != "run") {
        return None;
    }
    RunAlone::try_parse_from(&argv[1..]).ok().map(|r| r.args)
}

/// Parse arguments, run the chosen mode, turn errors into one clear line and a non-zero exit.
pub fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    if let Some(args) = run_args_alone(&argv) {
        return finish(commands::run::run(args));
    }
    let cli = Cli::parse_from(argv);
    finish(match cli.command {
        None => commands::serve::serve(cli.serve),
        Some(Command::Serve(args)) => commands::serve::serve(*args),
        Some(Command::Run(args)) => commands::run::run(args),
        Some(Command::Doctor(args)) => commands::doctor::doctor(args),
        Some(Command::Policy(cmd)) => commands::policy::policy(cmd),
        Some(Command::Install(args)) => commands::install::install(args),
    })
}

/// A mode's result as the process's exit: an error as one clear line and status 2.
fn finish(result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("mcp-sandbox-repl: error: {err:#}");
            ExitCode::from(2)
        }
    }
}

/// A byte size as policies write it ("512MiB", "2G", "4096").
fn parse_byte_size(text: &str) -> Result<u64, String> {
    let size = match text.trim().parse::<u64>() {
        Ok(n) => crate::sandbox::policy::ByteSize::Bytes(n),
        Err(_) => crate::sandbox::policy::ByteSize::Text(text.to_string()),
    };
    crate::sandbox::policy::parse_size(&size).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<OsString> {
        std::iter::once("mcp-sandbox-repl")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect()
    }

    /// `run` parsed alone gives what the whole interface gives, flag for flag.
    #[test]
    fn run_alone_parses_as_the_whole_interface() {
        for args in [
            &["run", "--", "/bin/true"][..],
            &[
                "run",
                "--policy",
                "ci",
                "--workspace",
                "/w",
                "--json",
                "--",
                "sh",
                "-c",
                "x y",
            ],
            &["run", "--spawn-route", "reexec", "--", "a", "--policy", "b"],
            &["run", "--policy=read-only", "--", "--"],
        ] {
            let alone = run_args_alone(&argv(args)).expect("parsed alone");
            let Some(Command::Run(whole)) = Cli::try_parse_from(argv(args)).unwrap().command else {
                panic!("not run: {args:?}");
            };
            assert_eq!(format!("{alone:?}"), format!("{whole:?}"), "{args:?}");
        }
    }

    /// Anything else goes to the whole interface: other modes, `run` asking for help or
    /// wrongly given (its error message is the whole interface's, as before).
    #[test]
    fn the_rest_parses_whole() {
        for args in [
            &[][..],
            &["serve"],
            &["--policy", "ci"],
            &["doctor", "--json"],
            &["run"],
            &["run", "--help"],
            &["run", "--version"],
            &["run", "/bin/true"],
            &["run", "--nope", "--", "x"],
            &["run", "--spawn-route", "nope", "--", "x"],
        ] {
            assert!(run_args_alone(&argv(args)).is_none(), "{args:?}");
        }
    }
}
