//! `serve`: turn the command line into the server's plain config and hand over to the
//! MCP server (nothing below `commands/` sees the CLI types).

use std::process::ExitCode;
use std::time::Duration;

use crate::app;
use crate::cli::{ServeArgs, Transport};
use crate::server::transport::HttpAuth;
use crate::server::{self, ServerConfig, ServerError};

pub fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    server::serve(config(args)?)
}

/// The server config the flags describe; `--policy` wins over `--sandbox-state`. Flags
/// that only make sense with HTTP are refused with stdio rather than ignored.
pub fn config(args: ServeArgs) -> Result<ServerConfig, ServerError> {
    let ServeArgs {
        sandbox_state,
        policy,
        workspace,
        python,
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
        response_bytes,
        disk_cap,
        keep_jobs,
        keep_hours,
    } = args;
    let transport = match transport {
        Transport::Stdio if token.is_some() => {
            return Err(ServerError::Config(
                "--token (or MCP_SANDBOX_TOKEN) is for --transport http; stdio needs no token: drop it, or add --transport http".into(),
            ));
        }
        Transport::Stdio if no_auth => {
            return Err(ServerError::Config(
                "--no-auth is for --transport http; stdio has no authentication to turn off: drop it".into(),
            ));
        }
        Transport::Stdio => server::Transport::Stdio,
        Transport::Http => server::Transport::Http {
            listen,
            auth: match (token, no_auth) {
                (Some(t), _) => HttpAuth::Token(t),
                (None, true) => HttpAuth::NoAuth,
                (None, false) => HttpAuth::Generate,
            },
        },
    };
    Ok(ServerConfig {
        app: app::Config {
            workspace,
            policy: policy.unwrap_or_else(|| sandbox_state.policy_name().to_string()),
            python,
            state_dir,
            uv,
            max_sessions,
            session_ttl: Duration::from_secs(session_ttl),
            max_snapshots,
            snapshot_memory,
            response_bytes,
            disk_cap,
            allow_broad_workspace,
            retention: crate::jobs::Retention {
                max_jobs: keep_jobs,
                max_age: Duration::from_secs(keep_hours.saturating_mul(3600)),
            },
        },
        transport,
    })
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
        config(cli.serve).map_err(|e| e.to_string())
    }

    fn parse(args: &[&str]) -> ServerConfig {
        try_parse(args).unwrap()
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
            server::Transport::Http { listen, auth } => {
                assert_eq!(listen.port(), 9);
                assert_eq!(auth, HttpAuth::Token("t".into()));
            }
            other => panic!("{other:?}"),
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
