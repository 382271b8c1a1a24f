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
    tracing::debug!(?reason, "stdio client finished");
    Ok(())
}

/// How HTTP requests are authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpAuth {
    /// The bearer token given on the command line.
    Token(String),
    /// A random token made at start and written `0600` to `<state>/http-token`.
    Generate,
    /// No token (`--no-auth`): loopback only, chosen explicitly.
    NoAuth,
}

/// Where a generated token is written (inside the state dir, which sandboxed code never sees).
pub const TOKEN_FILE: &str = "http-token";

/// Why an HTTP listen address or auth combination is refused.
pub fn check_bind(listen: SocketAddr, auth: &HttpAuth) -> Result<(), ServerError> {
    match auth {
        HttpAuth::Token(t) if t.trim().is_empty() => Err(ServerError::Config(
            "the bearer token is empty; pass a non-empty --token (or MCP_SANDBOX_TOKEN), or none to get a generated one".into(),
        )),
        HttpAuth::NoAuth if !listen.ip().is_loopback() => Err(ServerError::Config(format!(
            "refusing --no-auth on {listen}: anyone who can reach it could run code; \
             drop --no-auth (a token is generated), or listen on 127.0.0.1"
        ))),
        _ => Ok(()),
    }
}

/// A fresh random token: 32 bytes from the kernel's CSPRNG, hex-encoded.
pub fn generate_token() -> Result<String, ServerError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| {
        ServerError::Config(format!(
            "cannot generate the HTTP bearer token: the system random source failed ({e}); pass --token"
        ))
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Write `token` to `path`, readable by the owner only (mode 0600 even if the file existed).
pub fn write_token_file(path: &std::path::Path, token: &str) -> Result<(), ServerError> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let fail = |e: std::io::Error| {
        ServerError::Config(format!(
            "cannot write the generated HTTP token to {}: {e}; check the state dir's permissions or pass --token",
            path.display()
        ))
    };
    // Never write through a symlink someone planted there.
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(fail)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(fail)?;
    file.write_all(token.as_bytes()).map_err(fail)?;
    file.write_all(b"\n").map_err(fail)
}

/// True when the `Authorization` header carries `Bearer <token>` (the scheme in any case,
/// RFC 9110 §11.1). Compared in constant time so the token cannot be guessed byte by byte.
pub fn authorized(header: Option<&[u8]>, token: &str) -> bool {
    let Some(value) = header else { return false };
    let Some((scheme, given)) = value.split_at_checked(7) else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return false;
    }
    let given = given.trim_ascii_start();
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

/// The browser origins allowed to call us: our own address (and, on loopback, the
/// `localhost` / `127.0.0.1` / `[::1]` spellings of it). A request without `Origin` (any
/// non-browser client) passes; any other origin gets 403 (DNS rebinding).
pub fn allowed_origins(listen: SocketAddr) -> Vec<String> {
    let port = listen.port();
    let mut hosts = vec![match listen.ip() {
        std::net::IpAddr::V4(ip) => ip.to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
    }];
    if listen.ip().is_loopback() {
        for h in ["localhost", "127.0.0.1", "[::1]"] {
            if !hosts.iter().any(|x| x == h) {
                hosts.push(h.to_string());
            }
        }
    }
    hosts
        .iter()
        .flat_map(|h| [format!("http://{h}:{port}"), format!("https://{h}:{port}")])
        .collect()
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
    auth: HttpAuth,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    check_bind(listen, &auth)?;
    let mut config = StreamableHttpServerConfig::default()
        .with_allowed_origins(allowed_origins(listen))
        .enforce_origin_validation();
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
    // The port is taken first (a server that cannot have it, another listening there, fails
    // before touching that one's token file) and opened for connections only once the token file is
    // written: a client that connects as soon as the port answers finds the token there.
    // The address is announced once it answers.
    let socket = take_port(listen)?;
    // A generated token is good for this run only: its file goes when the server stops.
    let (token, token_file): (Option<Arc<str>>, _) = match auth {
        HttpAuth::Token(t) => (Some(Arc::from(t)), None),
        HttpAuth::Generate => {
            let t = generate_token()?;
            let path = app.state_dir().join(TOKEN_FILE);
            write_token_file(&path, &t)?;
            (Some(Arc::from(t)), Some(path))
        }
        HttpAuth::NoAuth => (None, None),
    };
    let listener = match socket.listen(1024) {
        Ok(l) => l,
        Err(e) => {
            if let Some(path) = &token_file {
                let _ = std::fs::remove_file(path);
            }
            return Err(cannot_listen(listen, e));
        }
    };
    let url = format!("http://{listen}/mcp");
    match (&token, &token_file) {
        (Some(_), None) => {
            tracing::info!("MCP over streamable HTTP at {url} (bearer token from --token)")
        }
        (Some(_), Some(path)) => tracing::info!(
            "MCP over streamable HTTP at {url}; send `Authorization: Bearer <token>` with the token in {} (generated for this run; pass --token to choose one)",
            path.display()
        ),
        (None, _) => tracing::warn!(
            "MCP over streamable HTTP at {url} WITHOUT authentication (--no-auth): any local process can run code through it"
        ),
    }
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
    if let Some(path) = token_file {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

fn cannot_listen(listen: SocketAddr, e: std::io::Error) -> ServerError {
    ServerError::Transport(format!("cannot listen on {listen}: {e}"))
}

/// `listen`'s address, bound but not yet accepting connections (`listen()` opens it).
fn take_port(listen: SocketAddr) -> Result<tokio::net::TcpSocket, ServerError> {
    let socket = if listen.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(|e| cannot_listen(listen, e))?;
    // As TcpListener::bind does: a restart may reuse a port still in TIME_WAIT.
    socket
        .set_reuseaddr(true)
        .map_err(|e| cannot_listen(listen, e))?;
    socket.bind(listen).map_err(|e| cannot_listen(listen, e))?;
    Ok(socket)
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
                "unauthorized: send `Authorization: Bearer <token>` with the server's token (the file named in its start-up log, or its --token)\n",
            );
        }
    }
    // rmcp checks Host and Origin (403 for a cross-origin browser request) before MCP.
    service.handle(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The port answers only after `listen()`: what is made between (the token file) is
    /// there for a client that connects as soon as it answers.
    #[tokio::test]
    async fn a_taken_port_refuses_connections_until_it_listens() {
        let socket = take_port("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = socket.local_addr().unwrap();
        let early = tokio::net::TcpStream::connect(addr).await;
        assert_eq!(
            early.map(|_| ()).unwrap_err().kind(),
            std::io::ErrorKind::ConnectionRefused
        );
        let listener = socket.listen(16).unwrap();
        // A second server cannot take it now (and so never reaches the token file).
        assert!(take_port(addr).is_err());
        let (client, accepted) =
            tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        client.unwrap();
        accepted.unwrap();
    }

    #[test]
    fn bearer_token_must_match_exactly() {
        assert!(authorized(Some(b"Bearer s3cret"), "s3cret"));
        assert!(!authorized(Some(b"Bearer s3cre"), "s3cret"));
        assert!(!authorized(Some(b"Bearer s3cretX"), "s3cret"));
        assert!(authorized(Some(b"bearer s3cret"), "s3cret"));
        assert!(authorized(Some(b"BEARER s3cret"), "s3cret"));
        assert!(!authorized(Some(b"Bearers3cret"), "s3cret"));
        assert!(!authorized(Some(b"Basic s3cret"), "s3cret"));
        assert!(!authorized(Some(b"Bearer "), "s3cret"));
        assert!(!authorized(Some(b"s3cret"), "s3cret"));
        assert!(!authorized(None, "s3cret"));
    }

    #[test]
    fn no_auth_is_loopback_only_and_tokens_are_not_empty() {
        let public: SocketAddr = "0.0.0.0:8765".parse().unwrap_or_else(|_| unreachable!());
        let local: SocketAddr = "127.0.0.1:8765".parse().unwrap_or_else(|_| unreachable!());
        assert!(check_bind(public, &HttpAuth::NoAuth).is_err());
        assert!(check_bind(public, &HttpAuth::Generate).is_ok());
        assert!(check_bind(public, &HttpAuth::Token("t".into())).is_ok());
        assert!(check_bind(local, &HttpAuth::NoAuth).is_ok());
        assert!(check_bind(local, &HttpAuth::Token(" ".into())).is_err());
    }

    #[test]
    fn generated_tokens_are_long_random_and_private() {
        let a = generate_token().unwrap();
        let b = generate_token().unwrap();
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        let scratch = crate::test_support::scratch_dir("tok");
        let dir = scratch.path();
        let path = dir.join(TOKEN_FILE);
        // A planted symlink is replaced, not followed.
        let target = dir.join("target");
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        write_token_file(&path, &a).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), a);
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }

    #[test]
    fn origins_are_our_own_address_only() {
        let local: SocketAddr = "127.0.0.1:8765".parse().unwrap_or_else(|_| unreachable!());
        let o = allowed_origins(local);
        assert!(o.contains(&"http://localhost:8765".to_string()));
        assert!(o.contains(&"http://[::1]:8765".to_string()));
        assert!(!o.iter().any(|x| x.contains("evil") || x.ends_with(":*")));
    }
}
