//! For the in-process tests only (`tests/suite/mcp/`): the MCP handler over an app,
//! without a transport, so a test serves it over a `tokio::io::duplex` pair to rmcp's
//! own client in the same process — the protocol shape (schemas, errors, capabilities)
//! checked without spawning the binary. Not part of the API.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::handler::SandboxServer;
use crate::app::App;

/// The handler a stdio server gives its one connection, over `app`. Dropping the last
/// handle (rmcp does when the connection ends) stops the connection's waits, as it does
/// for stdio; the app outlives it (call [`App::shutdown`] to end its workers and jobs).
pub fn handler(app: Arc<App>) -> impl rmcp::ServerHandler {
    SandboxServer::new(app, CancellationToken::new())
}
