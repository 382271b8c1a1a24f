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
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

mod conns;
mod log_limit;
pub(crate) mod sessions;
pub(crate) mod stdio;

use conns::Connections;
use log_limit::{Throttle, left_out};
use sessions::{BoundedSessions, Principal, SessionLimits, with_admission};

use super::ServerError;
use super::handler::SandboxServer;
use super::tasks::TaskBook;
use super::tenants::Tenants;
use crate::app::App;

/// Serve one client on stdin/stdout until it disconnects or `shutdown` fires.
pub(crate) async fn serve_stdio(
    app: Arc<App>,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    // Stdin closing means the client is gone: cancel `closing` at once so tool calls still
    // waiting on jobs return now (rmcp would otherwise wait for them before it exits).
    let closing = shutdown.child_token();
    let (input, output) = stdio::std_streams();
    let transport = stdio::StdioTransport::start(input, output, closing.clone());
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

/// The start-up warning of a server on a non-loopback address: who can run code here.
fn exposed_warning(listen: SocketAddr, auth: &HttpAuth) -> String {
    match auth {
        HttpAuth::Router(cell) => format!(
            "listening on {listen}, not a loopback address, with --router-auth: no token is \
             checked, so whoever can reach this port and names cell {cell:?} in {SANDBOX_ID_HEADER} \
             can run code here. Let only the router in (a NetworkPolicy, a firewall): it is the \
             one that authenticates callers"
        ),
        _ => format!(
            "listening on {listen}, not a loopback address: whoever can reach this port and \
             holds a token can run code here (plain HTTP: tokens travel in clear text). Prefer \
             127.0.0.1 behind a TLS-terminating proxy, or a network that lets only that in"
        ),
    }
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
    /// A tokens file (`--tokens`): one principal per token, each with its own app.
    Tokens(std::path::PathBuf),
    /// Behind a trusted front (`--router-auth`): no token; every request must name this
    /// cell (the string) in [`SANDBOX_ID_HEADER`]. The front authenticates the caller.
    Router(String),
}

/// The header a sandbox router routes on and forwards (agent-sandbox's `sandbox-router`).
pub(crate) const SANDBOX_ID_HEADER: &str = "x-sandbox-id";

/// The longest cell id (a Kubernetes object name is at most 253 characters).
const MAX_CELL_ID: usize = 253;

/// Where a generated token is written (inside the state dir, which sandboxed code never sees).
pub(crate) const TOKEN_FILE: &str = "http-token";

/// Why an HTTP listen address or auth combination is refused.
pub(crate) fn check_bind(listen: SocketAddr, auth: &HttpAuth) -> Result<(), ServerError> {
    match auth {
        HttpAuth::Token(t) if t.trim().is_empty() => Err(ServerError::Config(
            "the bearer token is empty; pass a non-empty --token (or MCP_SANDBOX_TOKEN), or none to get a generated one".into(),
        )),
        HttpAuth::NoAuth if !listen.ip().is_loopback() => Err(ServerError::Config(format!(
            "refusing --no-auth on {listen}: anyone who can reach it could run code; \
             drop --no-auth (a token is generated), or listen on 127.0.0.1"
        ))),
        HttpAuth::Router(cell) if !valid_cell_id(cell) => Err(ServerError::Config(format!(
            "the cell id {:?} (--cell-id or MCP_SANDBOX_CELL_ID) cannot be matched against X-Sandbox-ID: \
             give 1 to {MAX_CELL_ID} visible ASCII characters without spaces (on Kubernetes, the pod's name)",
            cell.chars().take(80).collect::<String>()
        ))),
        _ => Ok(()),
    }
}

/// A cell id an `X-Sandbox-ID` header can carry: visible ASCII, no spaces, not too long.
fn valid_cell_id(cell: &str) -> bool {
    !cell.is_empty() && cell.len() <= MAX_CELL_ID && cell.bytes().all(|b| b.is_ascii_graphic())
}

/// Whether a request routed to this cell names it (`--router-auth`): `Err` is the refusal
/// in words, with its status (403 without the header: the request did not come through
/// the front; 421 naming another cell: the front misrouted it).
fn check_cell(header: Option<&[u8]>, cell: &str) -> Result<(), (StatusCode, String)> {
    let Some(given) = header else {
        return Err((
            StatusCode::FORBIDDEN,
            "forbidden: this cell serves only requests through its sandbox router, which names the cell in the X-Sandbox-ID header; the request has none\n".to_string(),
        ));
    };
    if given == cell.as_bytes() {
        return Ok(());
    }
    let shown: String = String::from_utf8_lossy(given)
        .chars()
        .take(80)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    Err((
        StatusCode::MISDIRECTED_REQUEST,
        format!(
            "misdirected request: this is cell {cell:?}, but the request's X-Sandbox-ID names {shown:?}; the router sent it to the wrong cell: retry through the router\n"
        ),
    ))
}

/// A fresh random token: 32 bytes from the kernel's CSPRNG, hex-encoded.
pub(crate) fn generate_token() -> Result<String, ServerError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| {
        ServerError::Config(format!(
            "cannot generate the HTTP bearer token: the system random source failed ({e}); pass --token"
        ))
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Write `token` to `path`, readable by the owner only (mode 0600 even if the file existed).
pub(crate) fn write_token_file(path: &std::path::Path, token: &str) -> Result<(), ServerError> {
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
pub(crate) fn authorized(header: Option<&[u8]>, token: &str) -> bool {
    bearer(header).is_some_and(|given| tokens_equal(given, token))
}

/// The token of an `Authorization: Bearer <token>` header (the scheme in any case).
pub(crate) fn bearer(header: Option<&[u8]>) -> Option<&str> {
    let (scheme, given) = header?.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    std::str::from_utf8(given.trim_ascii_start()).ok()
}

/// Whether `given` is `expected`, compared in constant time (for equal lengths) so a
/// token cannot be guessed byte by byte.
pub(crate) fn tokens_equal(given: &str, expected: &str) -> bool {
    let (given, expected) = (given.as_bytes(), expected.as_bytes());
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// The browser origins allowed to call us: our own address (and, on loopback, the
/// `localhost` / `127.0.0.1` / `[::1]` spellings of it). A request without `Origin` (any
/// non-browser client) passes; any other origin gets 403 (DNS rebinding).
pub(crate) fn allowed_origins(listen: SocketAddr) -> Vec<String> {
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

/// JSON-RPC error codes the HTTP layer answers with itself.
const PARSE_ERROR: i32 = -32700;
const INVALID_REQUEST: i32 = -32600;

fn too_large() -> String {
    format!(
        "invalid request: the request body is over the limit of {MAX_BODY} bytes (4 MiB) per \
         message; send large data as a file in the workspace"
    )
}

/// A JSON-RPC error (id null: the request could not be read) as the HTTP answer.
fn json_rpc_error(status: StatusCode, code: i32, message: &str) -> Response<HttpBody> {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": { "code": code, "message": message },
    });
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *resp.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str("application/json") {
        resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    resp
}

/// rmcp answers a body that is not JSON with 415 and a body over the limit with 413, in
/// plain text; the spec wants a JSON-RPC parse error (-32700, HTTP 400) for the first, and
/// both should say what to do. Other answers pass unchanged.
async fn protocol_errors(resp: Response<HttpBody>) -> Response<HttpBody> {
    let status = resp.status();
    if status != StatusCode::UNSUPPORTED_MEDIA_TYPE && status != StatusCode::PAYLOAD_TOO_LARGE {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let Ok(collected) = body.collect().await;
    let text = String::from_utf8_lossy(&collected.to_bytes()).into_owned();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return json_rpc_error(status, INVALID_REQUEST, &too_large());
    }
    if text.starts_with("fail to deserialize") {
        let why = text
            .trim_start_matches("fail to deserialize request body")
            .trim();
        return json_rpc_error(
            StatusCode::BAD_REQUEST,
            PARSE_ERROR,
            &format!(
                "parse error: the body is not one JSON-RPC message ({why}); send a JSON object \
                 with Content-Type: application/json"
            ),
        );
    }
    Response::from_parts(parts, Full::new(Bytes::from(text)).boxed())
}

fn plain(status: StatusCode, text: &str) -> Response<HttpBody> {
    // (also the body of every refusal in words: 401, 404, 413, 503)
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

/// The HTTP transport's budgets (the `--http-*` flags; the README's HTTP section).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpBudgets {
    /// Connections open at once; `None`: [`conns::cap_for`] picks one from the open-file limit.
    pub max_connections: Option<usize>,
    /// Time to send a complete request head (the first, or the next on a kept-alive
    /// connection); then the connection is closed.
    pub header_timeout: Duration,
    /// MCP sessions.
    pub sessions: SessionLimits,
}

impl Default for HttpBudgets {
    fn default() -> Self {
        HttpBudgets {
            max_connections: None,
            header_timeout: Duration::from_secs(10),
            sessions: SessionLimits::default(),
        }
    }
}

/// The largest request body read (rmcp's limit too, set to this).
const MAX_BODY: usize = 4 * 1024 * 1024;

/// After a failed accept for want of descriptors or memory: the pause before the next one
/// (the short one when an idle connection was closed to make room: time for its task to
/// close the socket).
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
const ACCEPT_PAUSE_FREED: Duration = Duration::from_millis(5);

static ACCEPT_FAILED: Throttle = Throttle::new(log_limit::EVERY);
static CONN_REFUSED: Throttle = Throttle::new(log_limit::EVERY);
static CONN_FAILED: Throttle = Throttle::new(log_limit::EVERY);
static SESSION_REFUSED: Throttle = Throttle::new(log_limit::EVERY);

/// Everything a connection's requests need.
#[derive(Clone)]
struct Router {
    /// The server's own app: its readiness is the cell's.
    app: Arc<App>,
    service: StreamableHttpService<SandboxServer, BoundedSessions>,
    sessions: BoundedSessions,
    token: Option<Arc<str>>,
    /// `--router-auth`: the cell id every request must name.
    cell: Option<Arc<str>>,
    tenants: Option<Arc<Tenants>>,
}

/// Serve streamable HTTP on `listen` (path `/mcp`) until `shutdown` fires.
pub(crate) async fn serve_http(
    app: Arc<App>,
    tenants: Option<Arc<Tenants>>,
    listen: SocketAddr,
    auth: HttpAuth,
    budgets: HttpBudgets,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    check_bind(listen, &auth)?;
    let mut config = StreamableHttpServerConfig::default()
        .with_allowed_origins(allowed_origins(listen))
        .with_max_request_body_bytes(MAX_BODY)
        .enforce_origin_validation();
    config.cancellation_token = shutdown.child_token();
    if !listen.ip().is_loopback() {
        // Host-header checks guard loopback servers against DNS rebinding; a server on a
        // public address is protected by its bearer token instead.
        config = config.disable_allowed_hosts();
        tracing::warn!("{}", exposed_warning(listen, &auth));
    }
    let factory_app = app.clone();
    let factory_tenants = tenants.clone();
    let factory_shutdown = shutdown.clone();
    let task_book = Arc::new(TaskBook::new(shutdown.child_token()));
    let sessions = BoundedSessions::new(budgets.sessions.clone());
    let service = StreamableHttpService::new(
        move || {
            Ok(
                SandboxServer::new(factory_app.clone(), factory_shutdown.child_token())
                    .with_tenants(factory_tenants.clone())
                    .with_task_book(task_book.clone()),
            )
        },
        Arc::new(sessions.clone()),
        config,
    );
    // The port is taken first (a server that cannot have it, another listening there, fails
    // before touching that one's token file) and opened for connections only once the token file is
    // written: a client that connects as soon as the port answers finds the token there.
    // The address is announced once it answers.
    let socket = take_port(listen)?;
    let cell: Option<Arc<str>> = match &auth {
        HttpAuth::Router(cell) => Some(Arc::from(cell.as_str())),
        _ => None,
    };
    // A generated token is good for this run only: its file goes when the server stops.
    let (token, token_file): (Option<Arc<str>>, _) = match auth {
        HttpAuth::Token(t) => (Some(Arc::from(t)), None),
        HttpAuth::Generate => {
            let t = generate_token()?;
            let path = app.state_dir().join(TOKEN_FILE);
            write_token_file(&path, &t)?;
            (Some(Arc::from(t)), Some(path))
        }
        HttpAuth::NoAuth | HttpAuth::Tokens(_) | HttpAuth::Router(_) => (None, None),
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
    let nofile = conns::nofile_limit();
    let conns = Connections::new(conns::cap_for(budgets.max_connections, nofile));
    let url = format!("http://{listen}/mcp");
    let limits = format!(
        "at most {} connections and {} MCP sessions",
        conns.cap(),
        budgets.sessions.max_total
    );
    match (&token, &token_file) {
        (None, _) if tenants.is_some() => tracing::info!(
            "MCP over streamable HTTP at {url}; every client authenticates with its principal's token from the tokens file ({} principal(s); SIGHUP re-reads it; {limits})",
            tenants.as_ref().map_or(0, |t| t.len())
        ),
        (Some(_), None) => {
            tracing::info!(
                "MCP over streamable HTTP at {url} (bearer token from --token; {limits})"
            )
        }
        (Some(_), Some(path)) => tracing::info!(
            "MCP over streamable HTTP at {url}; send `Authorization: Bearer <token>` with the token in {} (generated for this run; pass --token to choose one; {limits})",
            path.display()
        ),
        (None, _) if cell.is_some() => tracing::info!(
            "MCP over streamable HTTP at {url} behind a trusted router (--router-auth): no bearer token; every request must carry X-Sandbox-ID: {} ({limits})",
            cell.as_deref().unwrap_or_default()
        ),
        (None, _) => tracing::warn!(
            "MCP over streamable HTTP at {url} WITHOUT authentication (--no-auth): any local process can run code through it ({limits})"
        ),
    }
    if let (Some(n), Some(limit)) = (budgets.max_connections, nofile)
        && n as u64 >= limit / 2
    {
        tracing::warn!(
            "--http-max-connections {n} is more than half this process's open-file limit ({limit}): idle connections could leave sessions and jobs without descriptors; accepts pause and the longest-idle connection is closed when the limit is reached"
        );
    }
    let router = Router {
        app: app.clone(),
        service,
        sessions,
        token,
        cell,
        tenants,
    };
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    accept_failed(&e, &conns, nofile, &shutdown).await;
                    continue;
                }
            },
        };
        let Some(slot) = conns.admit() else {
            refuse_connection(stream, peer, conns.cap());
            continue;
        };
        tokio::spawn(serve_connection(
            stream,
            peer,
            slot,
            router.clone(),
            budgets.header_timeout,
            shutdown.clone(),
        ));
    }
    if let Some(path) = token_file {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// A failed `accept`. Out of descriptors (or kernel memory) the pending connection stays
/// queued and the listener stays ready, so trying again at once would spin: the
/// longest-idle connection is closed to make room and accepts pause briefly. One line per
/// [`log_limit::EVERY`], however often it happens.
async fn accept_failed(
    e: &std::io::Error,
    conns: &Connections,
    nofile: Option<u64>,
    shutdown: &CancellationToken,
) {
    let out_of_room = matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    );
    // A connection reset before it was accepted, or a signal: nothing to wait for.
    if matches!(
        e.raw_os_error(),
        Some(libc::ECONNABORTED | libc::EINTR | libc::EAGAIN | libc::EPROTO)
    ) {
        return;
    }
    let freed = out_of_room && conns.evict_oldest_idle();
    let pause = if freed {
        ACCEPT_PAUSE_FREED
    } else {
        ACCEPT_PAUSE
    };
    if let Some(n) = ACCEPT_FAILED.ready() {
        let limit = nofile.map_or_else(|| "none".to_string(), |n| n.to_string());
        let what = match (out_of_room, freed) {
            (true, true) => "closed the longest-idle HTTP connection to make room",
            (true, false) => "no HTTP connection is idle to close",
            (false, _) => "",
        };
        tracing::warn!(
            "cannot accept an HTTP connection: {e} (open connections {}, open-file limit {limit}); {what}{}pausing accepts for {} ms{}",
            conns.open(),
            if what.is_empty() { "" } else { "; " },
            pause.as_millis(),
            left_out(n)
        );
    }
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(pause) => {}
    }
}

/// At the cap with every connection busy: a 503 in words if the socket takes it, then close.
fn refuse_connection(stream: tokio::net::TcpStream, peer: SocketAddr, cap: usize) {
    let words = format!(
        "server busy: all {cap} HTTP connections are answering requests (--http-max-connections); retry shortly\n"
    );
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n",
        words.len()
    );
    let _ = stream.try_write(format!("{head}{words}").as_bytes());
    if let Some(n) = CONN_REFUSED.ready() {
        tracing::warn!(
            "refused an HTTP connection from {peer}: all {cap} connections are answering requests (--http-max-connections){}",
            left_out(n)
        );
    }
}

/// Serve one connection until it ends, is evicted (closed gracefully: at once when no
/// request is in progress) or the server shuts down.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    slot: conns::ConnSlot,
    router: Router,
    header_timeout: Duration,
    shutdown: CancellationToken,
) {
    let busy = slot.busy.clone();
    let handler = hyper::service::service_fn(move |req: Request<Incoming>| {
        let router = router.clone();
        let guard = conns::Busy::enter(&busy);
        async move {
            let response = route(router, req).await;
            Ok::<_, Infallible>(response.map(|body| conns::Tracked::new(body, guard)))
        }
    });
    let io = hyper_util::rt::TokioIo::new(stream);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_timeout);
    let conn = builder.serve_connection(io, handler);
    tokio::pin!(conn);
    let mut evicted = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r
                    && let Some(n) = CONN_FAILED.ready()
                {
                    tracing::debug!(%peer, "HTTP connection ended: {e}{}", left_out(n));
                }
                break;
            }
            _ = slot.evict.cancelled(), if !evicted => {
                evicted = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = shutdown.cancelled() => break,
        }
    }
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

async fn route(router: Router, req: Request<Incoming>) -> Response<HttpBody> {
    // Probes first, before any authentication: an orchestrator's kubelet holds no token
    // and sends no X-Sandbox-ID. They answer nothing but a status and a one-line reason.
    match req.uri().path() {
        "/mcp" => {}
        path @ ("/healthz" | "/readyz") => return probe(&router.app, path, req.method()),
        _ => {
            return plain(
                StatusCode::NOT_FOUND,
                "not found: the MCP endpoint is /mcp (health: /healthz, readiness: /readyz)\n",
            );
        }
    }
    if let Some(cell) = router.cell.as_deref()
        && let Err((status, words)) = check_cell(
            req.headers().get(SANDBOX_ID_HEADER).map(|v| v.as_bytes()),
            cell,
        )
    {
        return plain(status, &words);
    }
    let header = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let principal = if let Some(tenants) = &router.tenants {
        match bearer(header).and_then(|t| tenants.principal_of(t)) {
            Some(p) => p,
            None => {
                return plain(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized: send `Authorization: Bearer <token>` with your principal's token from the server's tokens file\n",
                );
            }
        }
    } else {
        if let Some(token) = router.token.as_deref()
            && !authorized(header, token)
        {
            return plain(
                StatusCode::UNAUTHORIZED,
                "unauthorized: send `Authorization: Bearer <token>` with the server's token (the file named in its start-up log, or its --token)\n",
            );
        }
        // A single token (or none): every client is the server's one local principal.
        Principal::local()
    };
    // An MCP session belongs to the principal that opened it: presented by another, it
    // is as unknown as a session that never was (rmcp's own 404 words).
    if let Some(id) = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        && router
            .sessions
            .principal_of(id)
            .is_some_and(|owner| owner != principal)
    {
        return plain(StatusCode::NOT_FOUND, "Not Found: Session not found");
    }
    let mut req = req;
    req.extensions_mut().insert(principal.clone());
    // rmcp checks Host and Origin (403 for a cross-origin browser request) before MCP.
    // Only a POST without a session id can start a session (an `initialize`): its body is
    // read here to see, and a new session admitted before rmcp creates it.
    if req.method() != hyper::Method::POST || req.headers().contains_key("mcp-session-id") {
        return protocol_errors(router.service.handle(req).await).await;
    }
    let (parts, body) = req.into_parts();
    let bytes = match http_body_util::Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return json_rpc_error(StatusCode::PAYLOAD_TOO_LARGE, INVALID_REQUEST, &too_large());
        }
        Err(e) => {
            return plain(
                StatusCode::BAD_REQUEST,
                &format!("bad request: the request body could not be read: {e}\n"),
            );
        }
    };
    let starts_session = is_initialize(&bytes);
    let req = Request::from_parts(parts, Full::new(bytes));
    if !starts_session {
        return protocol_errors(router.service.handle(req).await).await;
    }
    let quota = router
        .tenants
        .as_ref()
        .map(|t| t.mcp_session_quota(&principal, router.sessions.limits().max_total));
    match router.sessions.admit(principal, quota) {
        Ok(admission) => {
            protocol_errors(with_admission(admission, router.service.handle(req)).await).await
        }
        Err(refused) => {
            if let Some(n) = SESSION_REFUSED.ready() {
                tracing::warn!("refused a new MCP session: {refused}{}", left_out(n));
            }
            let mut resp = plain(StatusCode::SERVICE_UNAVAILABLE, &format!("{refused}\n"));
            let retry = router.sessions.limits().handshake.as_secs().to_string();
            if let Ok(v) = hyper::header::HeaderValue::from_str(&retry) {
                resp.headers_mut().insert(hyper::header::RETRY_AFTER, v);
            }
            resp
        }
    }
}

/// `GET /healthz`: 200 while the process serves. `GET /readyz`: 200 when a `python_exec`
/// is answered now, else 503 with the reason ([`App::readiness`]). HEAD too; other
/// methods 405.
fn probe(app: &App, path: &str, method: &hyper::Method) -> Response<HttpBody> {
    if method != hyper::Method::GET && method != hyper::Method::HEAD {
        let mut resp = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("method not allowed: {path} answers GET\n"),
        );
        resp.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET, HEAD"),
        );
        return resp;
    }
    let mut resp = match (path, app.readiness()) {
        ("/healthz", _) => plain(StatusCode::OK, "ok\n"),
        (_, Ok(())) => match app.readiness_note() {
            // Ready, but jobs get no cgroup each: say so (and what holds them instead).
            Some(note) => plain(StatusCode::OK, &format!("ready\n{note}\n")),
            None => plain(StatusCode::OK, "ready\n"),
        },
        (_, Err(why)) => plain(StatusCode::SERVICE_UNAVAILABLE, &format!("{why}\n")),
    };
    resp.headers_mut().insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-store"),
    );
    resp
}

/// Whether a POST body is an `initialize` request (the one message that opens a session).
fn is_initialize(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Probe {
        method: Option<String>,
    }
    serde_json::from_slice::<Probe>(body).is_ok_and(|p| p.method.as_deref() == Some("initialize"))
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

    /// Only an `initialize` request (the message that opens a session) is admitted against
    /// the session cap; notifications, other requests, batches and garbage are not.
    #[test]
    fn only_an_initialize_request_starts_a_session() {
        assert!(is_initialize(
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#
        ));
        assert!(!is_initialize(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#
        ));
        assert!(!is_initialize(
            br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#
        ));
        assert!(!is_initialize(
            br#"[{"jsonrpc":"2.0","id":1,"method":"initialize"}]"#
        ));
        assert!(!is_initialize(b"initialize"));
        assert!(!is_initialize(b""));
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
    fn the_exposed_warning_says_who_can_run_code() {
        let listen: SocketAddr = "0.0.0.0:8888".parse().unwrap();
        let routed = exposed_warning(listen, &HttpAuth::Router("cell-a".into()));
        assert!(
            routed.contains("no token is checked") && routed.contains("\"cell-a\""),
            "{routed}"
        );
        assert!(!routed.contains("holds a token"), "{routed}");
        let token = exposed_warning(listen, &HttpAuth::Generate);
        assert!(token.contains("holds a token"), "{token}");
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
    fn router_mode_wants_this_cells_id_exactly() {
        assert!(check_cell(Some(b"cell-a"), "cell-a").is_ok());
        let (status, words) = check_cell(None, "cell-a").unwrap_err();
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(
            words.contains("X-Sandbox-ID") && words.contains("router"),
            "{words}"
        );
        for wrong in [&b"cell-b"[..], b"CELL-A", b"cell-a2", b"", b"cell-\x1b[2Ja"] {
            let (status, words) = check_cell(Some(wrong), "cell-a").unwrap_err();
            assert_eq!(status, StatusCode::MISDIRECTED_REQUEST);
            assert!(
                words.contains("\"cell-a\"") && words.contains("wrong cell"),
                "{words}"
            );
            assert!(
                !words.contains('\x1b'),
                "control characters are not echoed: {words}"
            );
        }
        let long = vec![b'x'; 10_000];
        let (_, words) = check_cell(Some(&long), "cell-a").unwrap_err();
        assert!(words.len() < 400, "an echoed id is cut short");
        let any: SocketAddr = "0.0.0.0:8765".parse().unwrap_or_else(|_| unreachable!());
        assert!(check_bind(any, &HttpAuth::Router("pod-7f9c".into())).is_ok());
        for bad in ["", "two words", "tab\there", "é", &"x".repeat(254)] {
            assert!(
                check_bind(any, &HttpAuth::Router(bad.into())).is_err(),
                "{bad:?}"
            );
        }
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
