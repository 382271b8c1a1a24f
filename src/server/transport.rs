//! Transports: stdio (the default) and streamable HTTP with bearer-token auth.
//!
//! The stdio transport is our own ([`stdio`]): a line validator in front of rmcp that
//! answers every malformed line itself, and one writer task for stdout.
//!
//! Both run one [`SandboxServer`] per MCP connection over the same shared [`App`], so
//! sessions and jobs outlive a single HTTP connection. Both return when the client goes
//! away (stdin closes) or when `shutdown` is cancelled by a signal; the caller then tears
//! the app down.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::{Request, Response, StatusCode, body::Incoming};
use rmcp::ServiceExt;
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use tokio_util::sync::CancellationToken;

pub mod stdio;

use super::ServerError;
use super::handler::SandboxServer;
use crate::app::App;

/// Serve one client on stdin/stdout until it disconnects or `shutdown` fires.
pub async fn serve_stdio(app: Arc<App>, shutdown: CancellationToken) -> Result<(), ServerError> {
    // Stdin closing means the client is gone: cancel `closing` at once so tool calls still
    // waiting on jobs return now (rmcp would otherwise wait for them before it exits).
    let closing = shutdown.child_token();
    let transport =
        stdio::StdioTransport::start(tokio::io::stdin(), tokio::io::stdout(), closing.clone());
    let server = SandboxServer::new(app, closing);
    let running = server
        .serve_with_ct(transport, shutdown.child_token())
        .await
        .map_err(|e| {
            ServerError::Transport(format!("MCP initialization over stdio failed: {e}"))
        })?;
    let reason = running
        .waiting()
        .await
        .map_err(|e| ServerError::Transport(format!("the stdio service task failed: {e}")))?;
    tracing::info!(?reason, "stdio client finished");
    Ok(())
}

/// Why an HTTP listen address or token combination is refused.
pub fn check_bind(listen: SocketAddr, token: Option<&str>) -> Result<(), ServerError> {
    if let Some(t) = token
        && t.trim().is_empty()
    {
        return Err(ServerError::Config(
            "the bearer token is empty; pass a non-empty --token (or MCP_SANDBOX_TOKEN)".into(),
        ));
    }
    if !listen.ip().is_loopback() && token.is_none() {
        return Err(ServerError::Config(format!(
            "refusing to listen on {listen} without a bearer token: anyone who can reach it could run code; \
             pass --token (or MCP_SANDBOX_TOKEN), or listen on 127.0.0.1"
        )));
    }
    Ok(())
}

/// True when the `Authorization` header carries exactly `Bearer <token>`.
/// Compared in constant time so the token cannot be guessed byte by byte.
pub fn authorized(header: Option<&[u8]>, token: &str) -> bool {
    let Some(value) = header else { return false };
    let Some(given) = value.strip_prefix(b"Bearer ") else {
        return false;
    };
    let expected = token.as_bytes();
    if given.len() != expected.len() {
        return false;
    }
    given
        .iter()
        .zip(expected)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
        == 0
}

type HttpBody = BoxBody<Bytes, Infallible>;

fn plain(status: StatusCode, text: &str) -> Response<HttpBody> {
    let mut resp = Response::new(Full::new(Bytes::from(text.to_owned())).boxed());
    *resp.status_mut() = status;
    if status == StatusCode::UNAUTHORIZED
        && let Ok(v) = hyper::header::HeaderValue::from_str("Bearer")
    {
        resp.headers_mut()
            .insert(hyper::header::WWW_AUTHENTICATE, v);
    }
    resp
}

/// Serve streamable HTTP on `listen` (path `/mcp`) until `shutdown` fires.
pub async fn serve_http(
    app: Arc<App>,
    listen: SocketAddr,
    token: Option<String>,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    check_bind(listen, token.as_deref())?;
    let mut config = StreamableHttpServerConfig::default();
    config.cancellation_token = shutdown.child_token();
    if !listen.ip().is_loopback() {
        // Host-header checks guard loopback servers against DNS rebinding; a server on a
        // public address is protected by its bearer token instead.
        config = config.disable_allowed_hosts();
    }
    let factory_app = app.clone();
    let factory_shutdown = shutdown.clone();
    let service = StreamableHttpService::new(
        move || {
            Ok(SandboxServer::new(
                factory_app.clone(),
                factory_shutdown.child_token(),
            ))
        },
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| ServerError::Transport(format!("cannot listen on {listen}: {e}")))?;
    tracing::info!(%listen, auth = token.is_some(), "streamable HTTP server listening on /mcp");
    let token: Option<Arc<str>> = token.map(Arc::from);
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => { tracing::warn!("accept failed: {e}"); continue; }
            },
        };
        let service = service.clone();
        let token = token.clone();
        let conn_shutdown = shutdown.clone();
        tokio::spawn(async move {
            let handler = hyper::service::service_fn(move |req: Request<Incoming>| {
                let service = service.clone();
                let token = token.clone();
                async move { Ok::<_, Infallible>(route(service, token, req).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, handler);
            tokio::select! {
                r = conn => if let Err(e) = r { tracing::debug!(%peer, "HTTP connection ended: {e}") },
                _ = conn_shutdown.cancelled() => {}
            }
        });
    }
    Ok(())
}

async fn route(
    service: StreamableHttpService<SandboxServer, LocalSessionManager>,
    token: Option<Arc<str>>,
    req: Request<Incoming>,
) -> Response<HttpBody> {
    if req.uri().path() != "/mcp" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: the MCP endpoint is /mcp\n",
        );
    }
    if let Some(token) = token.as_deref() {
        let header = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        if !authorized(header, token) {
            return plain(
                StatusCode::UNAUTHORIZED,
                "unauthorized: send `Authorization: Bearer <token>` with the server's token\n",
            );
        }
    }
    service.handle(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_token_must_match_exactly() {
        assert!(authorized(Some(b"Bearer s3cret"), "s3cret"));
        assert!(!authorized(Some(b"Bearer s3cre"), "s3cret"));
        assert!(!authorized(Some(b"Bearer s3cretX"), "s3cret"));
        assert!(!authorized(Some(b"bearer s3cret"), "s3cret"));
        assert!(!authorized(Some(b"s3cret"), "s3cret"));
        assert!(!authorized(None, "s3cret"));
    }

    #[test]
    fn non_loopback_needs_a_token() {
        let public: SocketAddr = "0.0.0.0:8765".parse().unwrap_or_else(|_| unreachable!());
        let local: SocketAddr = "127.0.0.1:8765".parse().unwrap_or_else(|_| unreachable!());
        assert!(check_bind(public, None).is_err());
        assert!(check_bind(public, Some("t")).is_ok());
        assert!(check_bind(local, None).is_ok());
        assert!(check_bind(local, Some(" ")).is_err());
    }
}
