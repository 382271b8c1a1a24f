//! The MCP layer: tools, their argument and output schemas, transports, rendering.
//! The only module that knows rmcp.
//!
//! Flow: [`serve`] builds the tokio runtime, the shared [`backend::Backend`] (sessions and
//! job store) and one transport. Shutdown flows one way: a signal (SIGTERM/SIGINT) or the
//! client closing stdin ends the transport; then the backend kills every session worker
//! and every job's process group before the runtime is dropped, so nothing outlives the
//! server.

mod args_check;
pub mod backend;
pub mod handler;
pub mod progress;
pub mod report;
pub mod tools;
pub mod transport;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::cli::{ServeArgs, Transport};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Transport(String),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// Run the MCP server until the client leaves or a signal arrives.
pub fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    // Sandboxed code runs as our uid: it must not read our memory, environment (the HTTP
    // token) or ptrace us.
    if let Err(e) = crate::sandbox::harden_current_process() {
        tracing::warn!("cannot make the server non-dumpable: {e}");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(ServerError::Runtime)?;
    let result = runtime.block_on(run(args));
    // Anything still blocking (a stuck reader thread) must not keep the process alive.
    runtime.shutdown_timeout(Duration::from_millis(200));
    result?;
    Ok(ExitCode::SUCCESS)
}

async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let backend = Arc::new(backend::Backend::new(&args).map_err(ServerError::Config)?);
    let shutdown = CancellationToken::new();
    spawn_signal_watch(shutdown.clone());
    let served = match args.transport {
        Transport::Stdio => transport::serve_stdio(backend.clone(), shutdown.clone()).await,
        Transport::Http => {
            transport::serve_http(
                backend.clone(),
                args.listen,
                args.token.clone(),
                shutdown.clone(),
            )
            .await
        }
    };
    shutdown.cancel();
    backend.shutdown().await;
    served.map_err(anyhow::Error::from)
}

/// SIGTERM / SIGINT cancel `shutdown`; the transports return and the backend is torn down.
fn spawn_signal_watch(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::warn!(
                "cannot install signal handlers; SIGTERM will kill the server without cleanup"
            );
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
            _ = shutdown.cancelled() => {}
        }
        shutdown.cancel();
    });
}

/// Logs go to stderr only: stdout is the MCP stream. `RUST_LOG` picks the level (default warn).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
