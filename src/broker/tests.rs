//! The broker's decisions, end to end over real sockets on the host's loopback (the
//! per-job namespace is covered by sandbox::netns and tests/mcp/test_broker.py).

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::upstream::{ProxyTarget, Upstream};
use super::{Rules, accept_loop};
use crate::sandbox::allow::AllowEntry;

/// A broker for `allow` on a host-loopback listener; returns its port and denials.
async fn broker(allow: &[&str], upstream: Upstream) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let denials = Arc::new(Mutex::new(Vec::new()));
    let rules = Arc::new(Rules {
        policy: "test-policy".into(),
        allow: allow
            .iter()
            .map(|a| AllowEntry::parse(a).unwrap())
            .collect(),
        denials: denials.clone(),
        upstream: Arc::new(upstream),
    });
    tokio::spawn(accept_loop(listener, rules));
    (port, denials)
}

/// A server that records the first request head it gets and answers `reply`; then, if
/// `echo`, echoes what follows (a tunnel's payload), else closes.
async fn origin(reply: &'static str, echo: bool) -> (u16, tokio::sync::oneshot::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
        s.write_all(reply.as_bytes()).await.unwrap();
        let mut rest = [0u8; 64];
        if echo && let Ok(n) = s.read(&mut rest).await {
            let _ = s.write_all(&rest[..n]).await;
        }
    });
    (port, rx)
}

async fn exchange(port: u16, request: &[u8]) -> String {
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    c.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn refuses_hosts_not_allowed_in_words() {
    let (port, denials) = broker(&["pypi.org", "127.0.0.1:1"], Upstream::default()).await;
    let answer = exchange(
        port,
        b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    let line = "blocked by policy test-policy: connection to evil.example:443 (allowed: pypi.org, 127.0.0.1:1)";
    assert!(answer.contains(line), "{answer}");
    // An allowed name on another port, a loopback port not listed: refused too.
    let answer = exchange(port, b"CONNECT pypi.org:8443 HTTP/1.1\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    let answer = exchange(
        port,
        b"GET http://127.0.0.1:2/x HTTP/1.1\r\nHost: 127.0.0.1:2\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    let d = denials.lock().unwrap().clone();
    assert_eq!(d.len(), 3, "{d:?}");
    assert_eq!(d[0], line);
}

#[tokio::test]
async fn bad_requests_are_answered_not_relayed() {
    let (port, denials) = broker(&["pypi.org"], Upstream::default()).await;
    let answer = exchange(port, b"GET /simple/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n").await;
    assert!(
        answer.starts_with("HTTP/1.1 400") && answer.contains("absolute http://"),
        "{answer}"
    );
    let answer = exchange(port, b"GET https://pypi.org/ HTTP/1.1\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let answer = exchange(port, b"CONNECT pypi.org HTTP/1.1\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let answer = exchange(port, b"\x16\x03\x01garbage\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let mut huge = b"GET http://pypi.org/ HTTP/1.1\r\nX: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', super::conn::MAX_HEAD + 10));
    let answer = exchange(port, &huge).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert!(denials.lock().unwrap().is_empty());
}

#[tokio::test]
async fn plain_http_is_forwarded_with_index_credentials_and_without_proxy_headers() {
    let (web, head) = origin("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", false).await;
    let entry = format!("127.0.0.1:{web}");
    let upstream = Upstream::from_env(
        [(
            "UV_INDEX_URL".to_string(),
            format!("http://u:p@127.0.0.1:{web}/simple"),
        )]
        .into_iter(),
    );
    let (port, _) = broker(&[&entry], upstream).await;
    let req = format!(
        "GET http://127.0.0.1:{web}/simple/x/?q=1 HTTP/1.1\r\nHost: other.example\r\nProxy-Authorization: Basic leak\r\nProxy-Connection: keep-alive\r\n\r\n"
    );
    let answer = exchange(port, req.as_bytes()).await;
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello"),
        "{answer}"
    );
    let head = head.await.unwrap();
    assert!(
        head.starts_with("GET /simple/x/?q=1 HTTP/1.1\r\n"),
        "{head}"
    );
    assert!(head.contains("Authorization: Basic dTpw\r\n"), "{head}"); // base64("u:p")
    assert!(head.contains("Connection: close\r\n"), "{head}");
    // The Host header is the checked authority, never the client's.
    assert!(
        head.contains(&format!("Host: 127.0.0.1:{web}\r\n")),
        "{head}"
    );
    assert!(!head.contains("other.example"), "{head}");
    assert!(!head.to_ascii_lowercase().contains("proxy-"), "{head}");
}

#[tokio::test]
async fn connect_tunnels_through_the_upstream_proxy_with_its_credentials() {
    // The "upstream proxy" accepts the CONNECT, then echoes the tunnel's bytes.
    let (up, head) = origin("HTTP/1.1 200 Connection established\r\n\r\n", true).await;
    let upstream = Upstream {
        https: Some(ProxyTarget {
            host: "127.0.0.1".into(),
            port: up,
            authorization: Some("Basic c2VjcmV0".into()),
        }),
        ..Upstream::default()
    };
    let (port, _) = broker(&["pypi.org:443"], upstream).await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    c.write_all(b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 39];
    c.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf[..], b"HTTP/1.1 200 Connection established\r\n\r\n");
    c.write_all(b"ping").await.unwrap();
    let mut echo = [0u8; 4];
    c.read_exact(&mut echo).await.unwrap();
    assert_eq!(&echo, b"ping");
    let head = head.await.unwrap();
    assert!(
        head.starts_with("CONNECT pypi.org:443 HTTP/1.1\r\n"),
        "{head}"
    );
    assert!(
        head.contains("Proxy-Authorization: Basic c2VjcmV0\r\n"),
        "{head}"
    );
}

#[tokio::test]
async fn connect_opens_a_tunnel_to_an_allowed_address_and_passes_early_bytes() {
    let (web, head) = origin("pong", true).await;
    let (port, denials) = broker(&[&format!("127.0.0.1:{web}")], Upstream::default()).await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    // The first bytes of the tunnel arrive with the CONNECT (as a TLS client may send them).
    let req = format!("CONNECT 127.0.0.1:{web} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n");
    c.write_all(req.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 39 + 4];
    c.read_exact(&mut answer).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&answer),
        "HTTP/1.1 200 Connection established\r\n\r\npong"
    );
    assert_eq!(head.await.unwrap(), "GET / HTTP/1.1\r\n\r\n");
    assert!(denials.lock().unwrap().is_empty());
}
