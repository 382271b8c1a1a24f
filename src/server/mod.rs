//! The MCP layer: tools, their argument and output schemas, transports, rendering.
//! The only module that knows rmcp. The use cases themselves live in [`crate::app`]; a
//! tool checks its arguments, calls the app and renders the answer ([`report`],
//! [`render`]); an [`AppError`](crate::app::AppError) becomes a tool error in words.
//!
//! Flow: [`serve`] builds the tokio runtime, the shared [`App`] (sessions and job
//! store) and one transport. Shutdown flows one way: a signal (SIGTERM/SIGINT) or the
//! client closing stdin ends the transport; then the app kills every session worker
//! and every job's process group before the runtime is dropped, so nothing outlives the
//! server.

mod args_check;
pub(crate) mod budget;
pub(crate) mod client_state;
mod drain;
pub(crate) mod handler;
pub(crate) mod progress;
pub(crate) mod render;
pub(crate) mod report;
pub(crate) mod resources;
pub(crate) mod schema;
pub(crate) mod shapes;
pub(crate) mod tasks;
pub(crate) mod tenants;
#[doc(hidden)]
pub mod testing;
pub(crate) mod tools;
pub(crate) mod transport;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::app::App;

/// How the server is reached.
#[derive(Debug, Clone)]
pub enum Transport {
    /// MCP over stdin/stdout.
    Stdio,
    /// Streamable HTTP on `listen`, authenticated as `auth` says.
    Http {
        listen: SocketAddr,
        auth: transport::HttpAuth,
        /// Connection and session limits.
        budgets: transport::HttpBudgets,
        /// What running jobs get after a SIGTERM before they are killed (zero: no drain).
        drain: std::time::Duration,
    },
}

/// Everything `serve` needs: the app's settings and the transport.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub app: crate::app::Config,
    pub transport: Transport,
    /// Said on stderr once Ctrl-C is handled: a person, not a client, started the server
    /// at a terminal (stdio with stdin a TTY), so this says what it is.
    pub terminal_hint: Option<String>,
}

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
pub fn serve(config: ServerConfig) -> anyhow::Result<ExitCode> {
    init_logging();
    // Sandboxed code runs as our uid: it must not read our memory, environment (the HTTP
    // token) or ptrace us.
    if let Err(e) = crate::sandbox::harden_current_process() {
        tracing::warn!("cannot make the server non-dumpable: {e}");
    }
    // Declared before the runtime, so dropped after it: stdin and stdout get their
    // blocking mode back once nothing of the runtime reads or writes them.
    let _stdio_flags =
        matches!(config.transport, Transport::Stdio).then(transport::stdio::StdioFlags::save);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(ServerError::Runtime)?;
    let result = runtime.block_on(run(config));
    // `run` has shut the app down (workers killed, job records written). What may still
    // block is tokio's stdin reader, parked in read(2) until the client writes or closes:
    // waiting for it (a `shutdown_timeout`) cost every SIGTERM its whole timeout.
    runtime.shutdown_background();
    result?;
    Ok(ExitCode::SUCCESS)
}

async fn run(config: ServerConfig) -> anyhow::Result<()> {
    // The app's error is one sentence; its sources are already in it.
    let app = Arc::new(App::new(&config.app).map_err(|e| ServerError::Config(e.to_string()))?);
    let shutdown = CancellationToken::new();
    app.load_jobs_in_background();
    if matches!(config.transport, Transport::Http { .. }) {
        // For `/readyz` (an HTTP cell's probe): whether this host enforces the policy.
        let app = app.clone();
        tokio::spawn(async move { app.check_enforcement().await });
    }
    if app.settings_are_fixed() {
        // Nothing the client says can change where the default session runs: start its
        // worker now, while the client is still starting and sending `initialize`.
        let app = app.clone();
        tokio::spawn(async move { app.prewarm().await });
    }
    let served = match config.transport {
        Transport::Stdio => {
            // A stdio server's one client is the process that started it: its SIGTERM
            // means now (no drain; nothing else could follow the jobs).
            drain::spawn_signal_watch(shutdown.clone(), None);
            if let Some(hint) = &config.terminal_hint {
                // Once the handlers are in place: a Ctrl-C from now on ends it quietly.
                eprintln!("{hint}");
            }
            transport::serve_stdio(app.clone(), shutdown.clone()).await
        }
        Transport::Http {
            listen,
            auth,
            budgets,
            drain,
        } => {
            let tenants = match &auth {
                transport::HttpAuth::Tokens(path) => {
                    let t = tenants::Tenants::load(path, config.app.clone(), &app)?;
                    Some(Arc::new(t))
                }
                _ => None,
            };
            if let Some(t) = &tenants {
                spawn_reload_on_sighup(t.clone(), shutdown.clone());
            }
            let drain = drain::Drain {
                window: drain,
                app: app.clone(),
                tenants: tenants.clone(),
            };
            drain::spawn_signal_watch(shutdown.clone(), Some(drain));
            let served = transport::serve_http(
                app.clone(),
                tenants.clone(),
                listen,
                auth,
                budgets,
                shutdown.clone(),
            )
            .await;
            for principal_app in tenants.iter().flat_map(|t| t.apps()) {
                principal_app.shutdown().await;
            }
            served
        }
    };
    let stopped_by_signal = shutdown.is_cancelled();
    shutdown.cancel();
    app.shutdown().await;
    match served {
        // Asked to stop by a signal (Ctrl-C at a terminal, SIGTERM: only the signal watch
        // cancels `shutdown` before the transport returns) before a client finished the
        // handshake: a clean exit, not "initialization failed: Cancelled".
        Err(e) if stopped_by_signal => {
            tracing::debug!("stopped by a signal: {e}");
            Ok(())
        }
        served => served.map_err(anyhow::Error::from),
    }
}

/// SIGHUP re-reads the tokens file: new principals and tokens apply at once, removed ones
/// can no longer authenticate; a file that does not read keeps the old table (logged).
fn spawn_reload_on_sighup(tenants: Arc<tenants::Tenants>, shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    tokio::spawn(async move {
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            tracing::warn!(
                "cannot install a SIGHUP handler: the tokens file is read at start only"
            );
            return;
        };
        loop {
            tokio::select! {
                _ = hup.recv() => match tenants.reload() {
                    Ok(n) => tracing::info!("SIGHUP: tokens file re-read, {n} principal(s)"),
                    Err(e) => tracing::warn!("SIGHUP: {e}; the previous principals stay in force"),
                },
                _ = shutdown.cancelled() => return,
            }
        }
    });
}

/// Logs go to stderr only: stdout is the MCP stream. `RUST_LOG` picks the level (default
/// warn, plus the transport's start-up line: where the HTTP server listens and its token,
/// and the signals and drain of `drain`).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "warn,mcp_sandbox_repl::server::transport=info,mcp_sandbox_repl::server::drain=info",
        )
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
