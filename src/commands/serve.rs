//! `serve`: turn the command line into the server's plain config and hand over to the
//! MCP server (nothing below `commands/` sees the CLI types).

use std::process::ExitCode;
use std::time::Duration;

use crate::app;
use crate::cli::{ServeArgs, Transport};
use crate::server::{self, ServerConfig};

pub fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    server::serve(config(args))
}

/// The server config the flags describe; `--policy` wins over `--sandbox-state`.
pub fn config(args: ServeArgs) -> ServerConfig {
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
        max_sessions,
        session_ttl,
        response_bytes,
        disk_cap,
        keep_jobs,
        keep_hours,
    } = args;
    ServerConfig {
        app: app::Config {
            workspace,
            policy: policy.unwrap_or_else(|| sandbox_state.policy_name().to_string()),
            python,
            state_dir,
            uv,
            max_sessions,
            session_ttl: Duration::from_secs(session_ttl),
            response_bytes,
            disk_cap,
            retention: crate::jobs::Retention {
                max_jobs: keep_jobs,
                max_age: Duration::from_secs(keep_hours.saturating_mul(3600)),
            },
        },
        transport: match transport {
            Transport::Stdio => server::Transport::Stdio,
            Transport::Http => server::Transport::Http { listen, token },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    fn parse(args: &[&str]) -> ServerConfig {
        let cli =
            Cli::try_parse_from(std::iter::once("mcp-sandbox-repl").chain(args.iter().copied()))
                .unwrap();
        config(cli.serve)
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
            server::Transport::Http { listen, token } => {
                assert_eq!(listen.port(), 9);
                assert_eq!(token.as_deref(), Some("t"));
            }
            other => panic!("{other:?}"),
        }
    }
}
