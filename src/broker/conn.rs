//! One client connection of a job's broker: read the request head (bounded, parsed with
//! httparse), decide, then either refuse in words (403 + a denial line) or connect —
//! directly, or through the server's upstream proxy — and relay bytes both ways until
//! either side closes or nothing moves for the idle timeout.
//!
//! CONNECT opens a tunnel (TLS stays end to end); any other method must carry an
//! absolute `http://` URI and is forwarded in origin form with `Connection: close` (to
//! an upstream proxy: the checked absolute URI, rebuilt from its checked parts), so one
//! connection never reaches more than the one destination that was checked.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::upstream::{IndexAuth, ProxyTarget};
use super::{Permit, Rules};
use crate::sandbox::policy::allow::{UrlParts, is_local_address, normalize};

/// Longest request (or upstream response) head accepted, the blank line included.
pub(crate) const MAX_HEAD: usize = 16 * 1024;
const MAX_HEADERS: usize = 64;
/// How long a connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long writing a refusal may take (it fits any socket buffer).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a request ends without a relay: the status and words sent to the client.
#[derive(Debug)]
pub(crate) struct Refusal {
    code: u16,
    reason: &'static str,
    body: String,
}

pub(crate) fn refuse(code: u16, reason: &'static str, body: impl Into<String>) -> Refusal {
    Refusal {
        code,
        reason,
        body: body.into(),
    }
}

/// A parsed request head.
struct Head {
    method: String,
    target: String,
    headers: Vec<(String, Vec<u8>)>,
}

/// Serve one admitted connection to the end; errors are answered to the client.
pub(crate) async fn serve(
    mut client: TcpStream,
    peer: SocketAddr,
    rules: Arc<Rules>,
    permit: Permit,
) {
    if let Err(r) = handle(&mut client, peer, &rules).await {
        answer(client, r).await;
    }
    drop(permit);
}

/// Answer `refusal` (one line of words) and close.
pub(crate) async fn answer(mut client: TcpStream, r: Refusal) {
    let body = format!("{}\n", r.body);
    let msg = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        r.code,
        r.reason,
        body.len()
    );
    let _ = tokio::time::timeout(ANSWER_TIMEOUT, async {
        let _ = client.write_all(msg.as_bytes()).await;
        let _ = client.shutdown().await;
    })
    .await;
}

async fn handle(client: &mut TcpStream, peer: SocketAddr, rules: &Rules) -> Result<(), Refusal> {
    let limits = rules.budget.limits;
    let (head, leftover) = tokio::time::timeout(limits.head_timeout, read_head(client))
        .await
        .map_err(|_| {
            refuse(
                408,
                "Request Timeout",
                format!(
                    "no complete request head within {} s",
                    limits.head_timeout.as_secs()
                ),
            )
        })??;
    let tunnel = head.method.eq_ignore_ascii_case("CONNECT");
    let (host, port, path) = if tunnel {
        let (h, p) = split_authority(&head.target).ok_or_else(|| {
            refuse(
                400,
                "Bad Request",
                format!("CONNECT target {:?} is not host:port", head.target),
            )
        })?;
        (h, p, String::new())
    } else {
        let url = UrlParts::parse(&head.target)
            .filter(|u| u.scheme == "http" && u.user.is_none())
            .ok_or_else(|| {
                refuse(
                    400,
                    "Bad Request",
                    format!(
                        "this is a forward proxy: send an absolute http:// URI, or CONNECT host:port for TLS (got {:?})",
                        head.target
                    ),
                )
            })?;
        // Origin form: no fragment (never part of a request), a leading `/`.
        let rest = url.rest.split('#').next().unwrap_or_default();
        let rest = if rest.starts_with('/') {
            rest.to_string()
        } else {
            format!("/{rest}")
        };
        (url.host.clone(), url.port_or_default(), rest)
    };
    let Some(entry) = rules.entry_for(&host, port) else {
        return Err(refuse(403, "Forbidden", rules.deny(&host, port, None)));
    };
    let local_ok = entry.names_local_explicitly();
    let upstream = rules.upstream.proxy_for(&host, tunnel);
    let mut server = match &upstream {
        Some(p) => connect_to(&p.host, p.port).await?,
        None => connect_checked(rules, &host, port, local_ok).await?,
    };
    if tunnel {
        if let Some(p) = &upstream {
            open_upstream_tunnel(&mut server, p, &host, port, limits.head_timeout).await?;
        }
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .map_err(|e| refuse(502, "Bad Gateway", e.to_string()))?;
        if !leftover.is_empty() {
            server
                .write_all(&leftover)
                .await
                .map_err(|e| refuse(502, "Bad Gateway", e.to_string()))?;
        }
    } else {
        // Host is always the checked authority: a different Host header could reach
        // another site served from the same address (a CDN) over plain HTTP.
        let default_port = port == 80;
        let host_value = match (default_port, host.contains(':')) {
            (true, true) => format!("[{host}]"),
            (true, false) => host.clone(),
            (false, _) => authority(&host, port),
        };
        // To an upstream proxy, the absolute URI made of the checked parts (normalized
        // host, the port only when not 80), never the client's own text.
        let target = match &upstream {
            Some(_) => format!("http://{host_value}{path}"),
            None => path.clone(),
        };
        let mut out = format!("{} {target} HTTP/1.1\r\n", head.method).into_bytes();
        out.extend_from_slice(format!("Host: {host_value}\r\n").as_bytes());
        let mut has_auth = false;
        for (name, value) in &head.headers {
            let lower = name.to_ascii_lowercase();
            if matches!(
                lower.as_str(),
                "host" | "proxy-authorization" | "proxy-connection" | "connection" | "keep-alive"
            ) {
                continue;
            }
            has_auth |= lower == "authorization";
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        if !has_auth
            && let Some(auth) =
                lend_credentials(rules, peer, &head.method, &host, port, &path).await
        {
            out.extend_from_slice(format!("Authorization: {auth}\r\n").as_bytes());
        }
        if let Some(auth) = upstream.as_ref().and_then(|p| p.authorization.as_ref()) {
            out.extend_from_slice(format!("Proxy-Authorization: {auth}\r\n").as_bytes());
        }
        out.extend_from_slice(b"Connection: close\r\n\r\n");
        out.extend_from_slice(&leftover);
        server
            .write_all(&out)
            .await
            .map_err(|e| refuse(502, "Bad Gateway", e.to_string()))?;
    }
    relay(client, &mut server, limits.idle_timeout).await;
    Ok(())
}

/// The index credentials for this request, if it is the installer's own read of its
/// index: a GET or HEAD under the index URL's path, on a connection held by the job's
/// trusted process (uv itself). Any other request to an index host goes without them,
/// and the job's denials say why.
async fn lend_credentials(
    rules: &Rules,
    peer: SocketAddr,
    method: &str,
    host: &str,
    port: u16,
    path: &str,
) -> Option<String> {
    let indexes: Vec<&IndexAuth> = rules.upstream.indexes_at(host, port).collect();
    let first = indexes.first()?;
    let covering = indexes.iter().find(|i| i.covers(path));
    let read = matches!(method, "GET" | "HEAD");
    let why = match (read, covering, &rules.trusted) {
        (false, _, _) => "only GET and HEAD get them".to_string(),
        (true, None, _) => format!("only requests under {} get them", first.url()),
        (true, Some(_), None) => {
            "only the installer (uv itself, not its build hooks) gets them, and this job is not \
             an install"
                .to_string()
        }
        (true, Some(index), Some(trusted)) => {
            let pid = trusted.pid.get().copied();
            let netns = trusted.netns;
            let server_port = rules.port;
            let held = match (pid, peer) {
                (Some(pid), SocketAddr::V4(peer)) => tokio::task::spawn_blocking(move || {
                    super::peer::holds_connection(pid, netns, peer, server_port)
                })
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or(false),
                _ => false,
            };
            if held {
                return Some(index.authorization.clone());
            }
            "only the installer (uv itself) gets them, and this connection is another \
             process's (a build hook's, a script's)"
                .to_string()
        }
    };
    let shown = if port == 80 {
        host.to_string()
    } else {
        authority(host, port)
    };
    rules.note(&format!(
        "index credentials withheld from {method} http://{shown}{}: {why}",
        path.split('?').next().unwrap_or_default()
    ));
    None
}

/// Relay bytes both ways until both sides have closed, a write fails, or nothing moved
/// either way for `idle` (then both are closed).
async fn relay(client: &mut TcpStream, server: &mut TcpStream, idle: Duration) {
    let (mut cr, mut cw) = client.split();
    let (mut sr, mut sw) = server.split();
    let mut up = vec![0u8; 16 * 1024];
    let mut down = vec![0u8; 16 * 1024];
    let (mut client_open, mut server_open) = (true, true);
    let timer = tokio::time::sleep(idle);
    tokio::pin!(timer);
    while client_open || server_open {
        tokio::select! {
            r = cr.read(&mut up), if client_open => match r {
                Ok(0) => {
                    client_open = false;
                    let _ = sw.shutdown().await;
                }
                Ok(n) => {
                    if !matches!(tokio::time::timeout(idle, sw.write_all(&up[..n])).await, Ok(Ok(()))) {
                        return;
                    }
                }
                Err(_) => return,
            },
            r = sr.read(&mut down), if server_open => match r {
                Ok(0) => {
                    server_open = false;
                    let _ = cw.shutdown().await;
                }
                Ok(n) => {
                    if !matches!(tokio::time::timeout(idle, cw.write_all(&down[..n])).await, Ok(Ok(()))) {
                        return;
                    }
                }
                Err(_) => return,
            },
            () = &mut timer => {
                tracing::debug!("broker: closing a connection idle for {} s", idle.as_secs());
                return;
            }
        }
        timer.as_mut().reset(tokio::time::Instant::now() + idle);
    }
}

/// Read until the end of the head; returns it and any bytes after it. A head (request
/// line, headers and the blank line) longer than [`MAX_HEAD`] bytes is refused, however
/// the bytes arrive.
async fn read_head(client: &mut TcpStream) -> Result<(Head, Vec<u8>), Refusal> {
    let too_long = || {
        refuse(
            431,
            "Request Header Fields Too Large",
            format!("the request head exceeds {MAX_HEAD} bytes or {MAX_HEADERS} headers"),
        )
    };
    let mut buf: Vec<u8> = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client
            .read(&mut chunk)
            .await
            .map_err(|e| refuse(400, "Bad Request", e.to_string()))?;
        if n == 0 {
            return Err(refuse(
                400,
                "Bad Request",
                "connection closed before the request head ended",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(len)) if len <= MAX_HEAD => {
                let head = Head {
                    method: req.method.unwrap_or_default().to_string(),
                    target: req.path.unwrap_or_default().to_string(),
                    headers: req
                        .headers
                        .iter()
                        .map(|h| (h.name.to_string(), h.value.to_vec()))
                        .collect(),
                };
                return Ok((head, buf[len..].to_vec()));
            }
            Ok(httparse::Status::Complete(_)) | Err(httparse::Error::TooManyHeaders) => {
                return Err(too_long());
            }
            // Not complete within MAX_HEAD bytes: longer than that.
            Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => return Err(too_long()),
            Ok(httparse::Status::Partial) => {}
            Err(e) => {
                return Err(refuse(
                    400,
                    "Bad Request",
                    format!("malformed request: {e}"),
                ));
            }
        }
    }
}

/// `host:port` of a CONNECT target (IPv6 in brackets); the host normalized.
fn split_authority(target: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = target.strip_prefix('[') {
        let (h, p) = rest.split_once("]:")?;
        (h, p)
    } else {
        target.rsplit_once(':')?
    };
    if host.is_empty() || host.contains(['/', '@', ' ']) {
        return None;
    }
    let port: u16 = port.parse().ok().filter(|&p| p != 0)?;
    Some((normalize(host), port))
}

fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Resolve `host` ourselves and connect to an address the rules allow: a name that
/// resolves to a loopback/private/link-local address is refused unless the entry names
/// that address (or `localhost`) itself.
async fn connect_checked(
    rules: &Rules,
    host: &str,
    port: u16,
    local_ok: bool,
) -> Result<TcpStream, Refusal> {
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::lookup_host((host, port)))
            .await
            .map_err(|_| {
                refuse(
                    504,
                    "Gateway Timeout",
                    format!("resolving {host} timed out"),
                )
            })?
            .map_err(|e| refuse(502, "Bad Gateway", format!("cannot resolve {host}: {e}")))?
            .collect(),
    };
    let usable: Vec<SocketAddr> = addrs
        .iter()
        .copied()
        .filter(|a| local_ok || !is_local_address(a.ip()))
        .collect();
    if usable.is_empty() {
        let why = format!(
            "it resolves to a local address ({}), which only an entry naming that address reaches",
            addrs
                .first()
                .map(|a| a.ip().to_string())
                .unwrap_or_default()
        );
        return Err(refuse(403, "Forbidden", rules.deny(host, port, Some(&why))));
    }
    let mut last = String::new();
    for addr in usable {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last = format!("{addr}: {e}"),
            Err(_) => last = format!("{addr}: timed out"),
        }
    }
    Err(refuse(
        502,
        "Bad Gateway",
        format!("cannot connect to {}: {last}", authority(host, port)),
    ))
}

async fn connect_to(host: &str, port: u16) -> Result<TcpStream, Refusal> {
    match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((host, port))).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(refuse(
            502,
            "Bad Gateway",
            format!(
                "cannot reach the upstream proxy {}: {e}",
                authority(host, port)
            ),
        )),
        Err(_) => Err(refuse(
            504,
            "Gateway Timeout",
            "the upstream proxy did not answer",
        )),
    }
}

/// Ask the upstream proxy for a tunnel to `host:port` (with its credentials).
async fn open_upstream_tunnel(
    server: &mut TcpStream,
    proxy: &ProxyTarget,
    host: &str,
    port: u16,
    answer_within: Duration,
) -> Result<(), Refusal> {
    let target = authority(host, port);
    let mut req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(auth) = &proxy.authorization {
        req.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
    }
    req.push_str("\r\n");
    let bad = |m: String| refuse(502, "Bad Gateway", m);
    server
        .write_all(req.as_bytes())
        .await
        .map_err(|e| bad(e.to_string()))?;
    // Read byte by byte up to the blank line: nothing after it may be consumed.
    let mut buf = Vec::with_capacity(256);
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if buf.len() > MAX_HEAD {
            return Err(bad("the upstream proxy's answer is too long".into()));
        }
        let n = tokio::time::timeout(answer_within, server.read(&mut byte))
            .await
            .map_err(|_| bad("the upstream proxy did not answer the CONNECT".into()))?
            .map_err(|e| bad(e.to_string()))?;
        if n == 0 {
            return Err(bad("the upstream proxy closed the connection".into()));
        }
        buf.push(byte[0]);
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(&buf) {
        Ok(httparse::Status::Complete(_)) if resp.code.is_some_and(|c| (200..300).contains(&c)) => {
            Ok(())
        }
        Ok(_) => Err(bad(format!(
            "the upstream proxy refused the tunnel to {target}: {} {}",
            resp.code.unwrap_or(0),
            resp.reason.unwrap_or("")
        ))),
        Err(e) => Err(bad(format!(
            "the upstream proxy's answer is malformed: {e}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_targets() {
        assert_eq!(
            split_authority("PyPI.org:443"),
            Some(("pypi.org".into(), 443))
        );
        assert_eq!(split_authority("[::1]:8000"), Some(("::1".into(), 8000)));
        assert_eq!(split_authority("pypi.org"), None);
        assert_eq!(split_authority("pypi.org:0"), None);
        assert_eq!(split_authority("a@b:443"), None);
        assert_eq!(split_authority(":443"), None);
    }
}
