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
        },
        transport: match transport {
            Transport::Stdio => server::Transport::Stdio,
            Transport::Http => server::Transport::Http { listen, token },
        },
    }
}
