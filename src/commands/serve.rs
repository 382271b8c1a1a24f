//! `serve`: turn the command line into the server's plain config, check it (a bad value
//! fails at start in one line, not at the first call) and hand over to the MCP server
//! (nothing below `commands/` sees the CLI types).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use crate::app;
use crate::cli::{SandboxState, ServeArgs, SpawnRoute, Transport};
use crate::server::transport::{HttpAuth, HttpBudgets};
use crate::server::{self, ServerConfig, ServerError};

/// A start-up value that cannot work; the text says which flag and what to pass.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("--{flag} {value} is out of range: {expected}")]
    OutOfRange {
        flag: &'static str,
        value: u64,
        expected: &'static str,
    },
    #[error("--workspace {}: {why}; pass an existing directory", path.display())]
    Workspace { path: PathBuf, why: String },
    #[error("--python {}: {why}; pass a working Python 3 interpreter", path.display())]
    Python { path: PathBuf, why: String },
}

pub fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    // The soft open-file limit up to the hard one, before the spawn helper forks (jobs
    // get the old soft limit back unless their policy sets one). Raising a soft limit
    // up to the hard one needs no privilege; should it fail, the broker's budgets are
    // computed from the limit there is (logged at start).
    let inherited_open_files = crate::sandbox::launcher::rlimits::raise_open_files_limit()
        .ok()
        .filter(|(before, now)| before != now)
        .map(|(before, _)| before);
    let config = config(args, inherited_open_files)?;
    check_paths(&config)?;
    // The one sandbox runtime of this server (every principal's app shares it).
    let sandbox = config.app.sandbox.clone();
    // Still single-threaded here: the spawn helper is a fork, not an exec.
    sandbox.start_zygote_early();
    let served = server::serve(config);
    sandbox.release_prepared();
    served
}

/// The sandbox runtime the flags describe: a zygote and resources made ahead unless a
/// hidden benchmark flag says otherwise.
fn sandbox_runtime(
    route: SpawnRoute,
    no_made_ahead: bool,
    inherited_open_files: Option<u64>,
) -> crate::sandbox::Runtime {
    crate::sandbox::Runtime::new(crate::sandbox::RuntimeConfig {
        route: route.into(),
        made_ahead: !no_made_ahead,
        inherited_open_files,
        ..crate::sandbox::RuntimeConfig::server()
    })
}

impl From<SpawnRoute> for crate::sandbox::Route {
    fn from(route: SpawnRoute) -> Self {
        match route {
            SpawnRoute::Fork => crate::sandbox::Route::Fork,
            SpawnRoute::Zygote => crate::sandbox::Route::Zygote,
            SpawnRoute::Reexec => crate::sandbox::Route::Reexec,
        }
    }
}

/// Ranges of the numeric flags (what a server can work with).
const MAX_SESSIONS: (u64, u64) = (1, 1024);
const SESSION_TTL: (u64, u64) = (1, 30 * 24 * 3600);
const RESPONSE_BYTES: (u64, u64) = (1_000, 10_000_000);
const MIN_DISK_CAP: u64 = 1024 * 1024;
const MAX_CELLS: (u64, u64) = (1, 10_000_000);

fn in_range(
    flag: &'static str,
    value: u64,
    range: (u64, u64),
    expected: &'static str,
) -> Result<(), StartError> {
    if value < range.0 || value > range.1 {
        return Err(StartError::OutOfRange {
            flag,
            value,
            expected,
        });
    }
    Ok(())
}

/// The server config the flags describe; `--policy` wins over `--sandbox-state`.
/// Numbers out of range, and flags that only make sense with HTTP given with stdio, are
/// refused here rather than ignored.
pub fn config(
    args: ServeArgs,
    inherited_open_files: Option<u64>,
) -> Result<ServerConfig, ServerError> {
    let ServeArgs {
        spawn_route,
        no_made_ahead,
        sandbox_state,
        policy,
        workspace,
        python,
        interpreter,
        state_dir,
        uv,
        transport,
        listen,
        token,
        no_auth,
        allow_broad_workspace,
        max_sessions,
        session_ttl,
        max_snapshots,
        snapshot_memory,
        snapshot_idle_ms,
        max_cells,
        response_bytes,
        disk_cap,
        env_disk_cap,
        env_disk_total,
        keep_jobs,
        keep_hours,
        http_max_connections,
        http_header_timeout,
        http_max_sessions,
        http_handshake_timeout,
        http_session_idle,
        tokens,
        router_auth,
        cell_id,
        drain_seconds,
    } = args;
    in_range(
        "max-sessions",
        max_sessions as u64,
        MAX_SESSIONS,
        "1 to 1024 sessions",
    )
    .map_err(|e| ServerError::Config(e.to_string()))?;
    in_range(
        "session-ttl",
        session_ttl,
        SESSION_TTL,
        "1 second to 30 days",
    )
    .map_err(|e| ServerError::Config(e.to_string()))?;
    in_range(
        "max-cells",
        max_cells as u64,
        MAX_CELLS,
        "1 to 10000000 cells",
    )
    .map_err(|e| ServerError::Config(e.to_string()))?;
    in_range(
        "response-bytes",
        response_bytes as u64,
        RESPONSE_BYTES,
        "1000 to 10000000 bytes",
    )
    .map_err(|e| ServerError::Config(e.to_string()))?;
    in_range(
        "disk-cap",
        disk_cap,
        (MIN_DISK_CAP, u64::MAX),
        "at least 1048576 bytes (1 MiB)",
    )
    .map_err(|e| ServerError::Config(e.to_string()))?;
    for (flag, value) in [
        ("env-disk-cap", env_disk_cap),
        ("env-disk-total", env_disk_total),
    ] {
        in_range(
            flag,
            value,
            (MIN_DISK_CAP, u64::MAX),
            "at least 1048576 bytes (1 MiB)",
        )
        .map_err(|e| ServerError::Config(e.to_string()))?;
    }
    if let Some(s) = drain_seconds {
        in_range(
            "drain-seconds",
            s,
            (0, MAX_DRAIN_SECONDS),
            "0 to 86400 seconds",
        )
        .map_err(|e| ServerError::Config(e.to_string()))?;
    }
    let sources = app::Sources {
        inherit_sandbox: sandbox_state == SandboxState::Inherit && policy.is_none(),
        workspace_from_roots: workspace.is_none(),
    };
    let http = http_budgets(
        http_max_connections,
        http_header_timeout,
        http_max_sessions,
        http_handshake_timeout,
        http_session_idle,
    )
    .map_err(|e| ServerError::Config(e.to_string()))?;
    let transport = match transport {
        Transport::Stdio if http.is_some() => {
            return Err(ServerError::Config(
                "the --http-* limits are for --transport http; stdio has one client and no connections to limit: drop them (or their MCP_SANDBOX_HTTP_* variables), or add --transport http".into(),
            ));
        }
        Transport::Stdio if token.is_some() => {
            return Err(ServerError::Config(
                "--token (or MCP_SANDBOX_TOKEN) is for --transport http; stdio needs no token: drop it, or add --transport http".into(),
            ));
        }
        Transport::Stdio if tokens.is_some() => {
            return Err(ServerError::Config(
                "--tokens (or MCP_SANDBOX_TOKENS) is for --transport http; stdio has one client, the local principal: drop it, or add --transport http".into(),
            ));
        }
        Transport::Stdio if no_auth => {
            return Err(ServerError::Config(
                "--no-auth is for --transport http; stdio has no authentication to turn off: drop it".into(),
            ));
        }
        Transport::Stdio if router_auth || cell_id.is_some() => {
            return Err(ServerError::Config(
                "--router-auth and --cell-id (or MCP_SANDBOX_ROUTER_AUTH, MCP_SANDBOX_CELL_ID) are for --transport http behind a sandbox router; stdio has one client: drop them, or add --transport http".into(),
            ));
        }
        Transport::Stdio if drain_seconds.is_some() => {
            return Err(ServerError::Config(
                "--drain-seconds (or MCP_SANDBOX_DRAIN_SECONDS) is for --transport http: a stdio server stops when its one client sends SIGTERM or closes stdin, at once: drop it, or add --transport http".into(),
            ));
        }
        Transport::Stdio => server::Transport::Stdio,
        Transport::Http if cell_id.is_some() && !router_auth => {
            return Err(ServerError::Config(
                "--cell-id (or MCP_SANDBOX_CELL_ID) names this cell for --router-auth, which is not on: add --router-auth (behind a trusted front), or drop the cell id".into(),
            ));
        }
        Transport::Http => server::Transport::Http {
            listen,
            auth: match (token, no_auth, tokens, cell_id) {
                (_, _, Some(path), _) => HttpAuth::Tokens(path),
                (_, _, None, Some(cell)) => HttpAuth::Router(cell),
                (Some(t), _, None, None) => HttpAuth::Token(t),
                (None, true, None, None) => HttpAuth::NoAuth,
                (None, false, None, None) => HttpAuth::Generate,
            },
            budgets: http.unwrap_or_default(),
            drain: Duration::from_secs(drain_seconds.unwrap_or(DRAIN_SECONDS)),
        },
    };
    Ok(ServerConfig {
        app: app::Config {
            workspace,
            policy: policy.unwrap_or_else(|| sandbox_state.policy_name().to_string()),
            python,
            interpreter,
            state_dir,
            uv,
            max_sessions,
            session_ttl: Duration::from_secs(session_ttl),
            max_snapshots,
            snapshot_memory,
            snapshot_idle: Duration::from_millis(snapshot_idle_ms),
            max_cells,
            response_bytes,
            disk_cap,
            env_disk: crate::envs::DiskCaps {
                session: env_disk_cap,
                total: env_disk_total,
            },
            allow_broad_workspace,
            sources,
            retention: crate::jobs::Retention {
                max_jobs: keep_jobs,
                max_age: Duration::from_secs(keep_hours.saturating_mul(3600)),
            },
            max_running_jobs: None,
            principal: None,
            sandbox: sandbox_runtime(spawn_route, no_made_ahead, inherited_open_files),
        },
        terminal_hint: terminal_hint(&transport),
        transport,
    })
}

/// Stdio with stdin a terminal: a person, not a client, started the server; the line that
/// says what it is (on stderr: stdout is the protocol's). It then waits for JSON-RPC as asked.
fn terminal_hint(transport: &server::Transport) -> Option<String> {
    use std::io::IsTerminal;
    (matches!(transport, server::Transport::Stdio) && std::io::stdin().is_terminal())
        .then(|| format!("mcp-sandbox-repl: {}", crate::cli::ABOUT_CLIENTS))
}

/// Seconds running jobs get after a SIGTERM (HTTP): below Kubernetes' default grace
/// period of 30 s, so the kill that follows the drain is ours, not the kubelet's.
const DRAIN_SECONDS: u64 = 20;
/// The longest drain: a day.
const MAX_DRAIN_SECONDS: u64 = 24 * 3600;

/// Ranges of the HTTP transport's limits.
const HTTP_MAX_CONNECTIONS: (u64, u64) = (1, 1_000_000);
const HTTP_MAX_SESSIONS: (u64, u64) = (1, 100_000);
const HTTP_SHORT_TIMEOUT: (u64, u64) = (1, 3600);
const HTTP_SESSION_IDLE: (u64, u64) = (1, 30 * 24 * 3600);

/// The HTTP transport's limits, if any was given (`None`: all defaults); each in range.
fn http_budgets(
    max_connections: Option<usize>,
    header_timeout: Option<u64>,
    max_sessions: Option<usize>,
    handshake_timeout: Option<u64>,
    session_idle: Option<u64>,
) -> Result<Option<HttpBudgets>, StartError> {
    if max_connections.is_none()
        && header_timeout.is_none()
        && max_sessions.is_none()
        && handshake_timeout.is_none()
        && session_idle.is_none()
    {
        return Ok(None);
    }
    let mut b = HttpBudgets::default();
    if let Some(n) = max_connections {
        in_range(
            "http-max-connections",
            n as u64,
            HTTP_MAX_CONNECTIONS,
            "1 to 1000000 connections",
        )?;
        b.max_connections = Some(n);
    }
    if let Some(s) = header_timeout {
        in_range(
            "http-header-timeout",
            s,
            HTTP_SHORT_TIMEOUT,
            "1 to 3600 seconds",
        )?;
        b.header_timeout = Duration::from_secs(s);
    }
    if let Some(n) = max_sessions {
        in_range(
            "http-max-sessions",
            n as u64,
            HTTP_MAX_SESSIONS,
            "1 to 100000 sessions",
        )?;
        b.sessions.max_total = n;
    }
    if let Some(s) = handshake_timeout {
        in_range(
            "http-handshake-timeout",
            s,
            HTTP_SHORT_TIMEOUT,
            "1 to 3600 seconds",
        )?;
        b.sessions.handshake = Duration::from_secs(s);
    }
    if let Some(s) = session_idle {
        in_range(
            "http-session-idle",
            s,
            HTTP_SESSION_IDLE,
            "1 second to 30 days",
        )?;
        b.sessions.idle = Duration::from_secs(s);
    }
    Ok(Some(b))
}

/// The workspace is a directory and `--python` runs (probed once: `sys.version_info`;
/// skipped when an earlier server's probe of it is remembered and still trusted).
pub fn check_paths(config: &ServerConfig) -> Result<(), StartError> {
    if let Some(ws) = &config.app.workspace {
        let why = match std::fs::metadata(ws) {
            Ok(m) if m.is_dir() => None,
            Ok(_) => Some("not a directory".to_string()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(why) = why {
            return Err(StartError::Workspace {
                path: ws.clone(),
                why,
            });
        }
    }
    let state_dir =
        || (config.app.state_dir.clone()).unwrap_or_else(crate::jobs::default_state_dir);
    // Checked by an earlier server and unchanged since: no interpreter start here.
    if let Some(py) = &config.app.python
        && !crate::repl::known_python3(py, &state_dir())
    {
        probe_python(py).map_err(|why| StartError::Python {
            path: py.clone(),
            why,
        })?;
    }
    Ok(())
}

/// Run `python -c ...` once: it must start and say it is Python 3.
fn probe_python(python: &Path) -> Result<(), String> {
    const LIMIT: Duration = Duration::from_secs(30);
    let mut child = Command::new(python)
        .args(["-I", "-c", "import sys; print(sys.version_info[0])"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run it ({e})"))?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() < LIMIT => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("it did not answer within {}s", LIMIT.as_secs()));
            }
            Err(e) => return Err(format!("cannot wait for it ({e})")),
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("cannot read its answer ({e})"))?;
    let major = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && major == "3" {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    if out.status.success() {
        Err(format!(
            "it is not Python 3 (sys.version_info[0] = {major:?})"
        ))
    } else {
        Err(format!("it failed ({}): {last}", out.status))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    fn try_parse(args: &[&str]) -> Result<ServerConfig, String> {
        let cli =
            Cli::try_parse_from(std::iter::once("mcp-sandbox-repl").chain(args.iter().copied()))
                .map_err(|e| e.to_string())?;
        config(cli.serve, None).map_err(|e| e.to_string())
    }

    fn parse(args: &[&str]) -> ServerConfig {
        try_parse(args).unwrap()
    }

    fn refused(args: &[&str]) -> String {
        try_parse(args).unwrap_err()
    }

    #[test]
    fn numbers_out_of_range_and_token_on_stdio_are_refused() {
        let e = refused(&["--max-sessions", "0"]);
        assert!(e.contains("--max-sessions 0 is out of range"), "{e}");
        assert!(refused(&["--session-ttl", "0"]).contains("--session-ttl"));
        assert!(refused(&["--response-bytes", "10"]).contains("--response-bytes"));
        assert!(refused(&["--disk-cap", "5"]).contains("--disk-cap"));
        let e = refused(&["--token", "secret"]);
        assert!(
            e.contains("--token (or MCP_SANDBOX_TOKEN) is for --transport http"),
            "{e}"
        );
        assert!(
            !e.contains("secret"),
            "the token leaked into the message: {e}"
        );
        // Edges are accepted.
        parse(&[
            "--max-sessions",
            "1",
            "--session-ttl",
            "1",
            "--response-bytes",
            "1000",
        ]);
    }

    #[test]
    fn http_limits_are_checked_and_for_http_only() {
        let e = refused(&["--http-max-sessions", "5"]);
        assert!(e.contains("--transport http"), "{e}");
        let e = refused(&["--transport", "http", "--http-header-timeout", "0"]);
        assert!(e.contains("--http-header-timeout 0 is out of range"), "{e}");
        let e = refused(&["--transport", "http", "--http-max-connections", "0"]);
        assert!(e.contains("--http-max-connections"), "{e}");
        let c = parse(&[
            "--transport",
            "http",
            "--http-max-sessions",
            "3",
            "--http-handshake-timeout",
            "2",
            "--http-session-idle",
            "7",
        ]);
        let server::Transport::Http { budgets, .. } = c.transport else {
            panic!("not http")
        };
        assert_eq!(budgets.sessions.max_total, 3);
        assert_eq!(budgets.sessions.handshake, Duration::from_secs(2));
        assert_eq!(budgets.sessions.idle, Duration::from_secs(7));
        assert_eq!(budgets.max_connections, None);
        assert_eq!(
            budgets.header_timeout,
            HttpBudgets::default().header_timeout
        );
    }

    #[test]
    fn sources_follow_the_flags() {
        let c = parse(&["--sandbox-state", "inherit"]);
        assert!(c.app.sources.inherit_sandbox);
        assert_eq!(c.app.policy, "workspace-write");
        assert!(
            !parse(&["--sandbox-state", "inherit", "--policy", "ci"])
                .app
                .sources
                .inherit_sandbox
        );
        assert!(!parse(&[]).app.sources.inherit_sandbox);
        assert!(
            parse(&[]).app.sources.workspace_from_roots
                || std::env::var_os("MCP_SANDBOX_WORKSPACE").is_some()
        );
        assert!(
            !parse(&["--workspace", "/tmp"])
                .app
                .sources
                .workspace_from_roots
        );
    }

    #[test]
    fn workspace_and_python_are_checked() {
        let mut c = parse(&["--workspace", "/etc/passwd"]);
        let e = check_paths(&c).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
        c.app.workspace = Some("/nonexistent-ws-xyz".into());
        assert!(
            check_paths(&c)
                .unwrap_err()
                .to_string()
                .contains("--workspace")
        );
        c.app.workspace = None;
        c.app.python = Some("/nonexistent-python-xyz".into());
        let e = check_paths(&c).unwrap_err().to_string();
        assert!(
            e.starts_with("--python /nonexistent-python-xyz: cannot run it"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
        // Something that runs but is not Python.
        c.app.python = Some("/bin/false".into());
        assert!(
            check_paths(&c)
                .unwrap_err()
                .to_string()
                .contains("it failed")
        );
    }

    #[test]
    fn flags_become_the_plain_config() {
        let c = parse(&["--sandbox-state", "read-only", "--session-ttl", "7"]);
        assert_eq!(c.app.policy, "read-only");
        assert_eq!(c.app.session_ttl, Duration::from_secs(7));
        assert!(matches!(c.transport, server::Transport::Stdio));
        // --policy wins over --sandbox-state; HTTP carries its address and token.
        let c = parse(&[
            "--sandbox-state",
            "read-only",
            "--policy",
            "workspace-write",
            "--transport",
            "http",
            "--listen",
            "127.0.0.1:9",
            "--token",
            "t",
        ]);
        assert_eq!(c.app.policy, "workspace-write");
        match c.transport {
            server::Transport::Http {
                listen,
                auth,
                budgets,
                drain,
            } => {
                assert_eq!(listen.port(), 9);
                assert_eq!(auth, HttpAuth::Token("t".into()));
                assert_eq!(budgets, HttpBudgets::default());
                assert_eq!(drain, Duration::from_secs(DRAIN_SECONDS));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn disk_cap_takes_sizes_in_words_like_the_env_caps() {
        assert_eq!(parse(&[]).app.disk_cap, 2 << 30, "the default is 2 GiB");
        assert_eq!(parse(&["--disk-cap", "512MiB"]).app.disk_cap, 512 << 20);
        assert_eq!(parse(&["--disk-cap", "2147483648"]).app.disk_cap, 2 << 30);
        assert!(try_parse(&["--disk-cap", "lots"]).is_err());
    }

    #[test]
    fn router_auth_names_its_cell_and_the_drain_is_http_only() {
        let http = ["--transport", "http", "--router-auth", "--cell-id", "pod-1"];
        let c = parse(&http);
        assert!(matches!(
            c.transport,
            server::Transport::Http { auth: HttpAuth::Router(ref cell), .. } if cell == "pod-1"
        ));
        let c = parse(&["--transport", "http", "--drain-seconds", "0"]);
        assert!(matches!(
            c.transport,
            server::Transport::Http { drain, .. } if drain.is_zero()
        ));
        const { assert!(DRAIN_SECONDS < 30, "below Kubernetes' default grace period") };
        for bad in [
            &["--router-auth", "--cell-id", "a"][..],
            &["--drain-seconds", "5"],
            &["--transport", "http", "--cell-id", "a"],
            &["--transport", "http", "--drain-seconds", "86401"],
        ] {
            assert!(try_parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn snapshot_memory_takes_a_size_and_refuses_nonsense() {
        assert_eq!(parse(&[]).app.snapshot_memory, None);
        let c = parse(&["--snapshot-memory", "64MiB"]);
        assert_eq!(c.app.snapshot_memory, Some(64 << 20));
        assert_eq!(
            parse(&["--snapshot-memory", "1048576"]).app.snapshot_memory,
            Some(1 << 20)
        );
        for bad in ["0", "lots", "5 parsecs", "-1"] {
            let e = try_parse(&[&format!("--snapshot-memory={bad}")]).unwrap_err();
            assert!(e.contains("--snapshot-memory"), "{bad}: {e}");
        }
    }

    #[test]
    fn http_without_token_generates_one_and_no_auth_is_explicit() {
        let c = parse(&["--transport", "http"]);
        assert!(matches!(
            c.transport,
            server::Transport::Http {
                auth: HttpAuth::Generate,
                ..
            }
        ));
        let c = parse(&["--transport", "http", "--no-auth"]);
        assert!(matches!(
            c.transport,
            server::Transport::Http {
                auth: HttpAuth::NoAuth,
                ..
            }
        ));
        assert!(try_parse(&["--transport", "http", "--no-auth", "--token", "t"]).is_err());
    }

    #[test]
    fn http_only_flags_are_refused_with_stdio() {
        let e = try_parse(&["--token", "t"]).unwrap_err();
        assert!(e.contains("--transport http"), "{e}");
        let e = try_parse(&["--no-auth"]).unwrap_err();
        assert!(e.contains("--no-auth"), "{e}");
    }
}
