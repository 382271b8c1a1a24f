//! The broker's decisions, end to end over real sockets on the host's loopback (the
//! per-job namespace is covered by sandbox::parent::netns and tests/mcp/test_broker.py).

use std::os::unix::fs::MetadataExt;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::upstream::Upstream;
use super::{Budget, Limits, Rules, Trusted, accept_loop};
use crate::sandbox::policy::allow::AllowEntry;

type Denials = Arc<Mutex<Vec<String>>>;

/// Generous limits: nothing in a test meets them unless it means to.
fn roomy() -> Limits {
    Limits {
        per_job: 64,
        total: 256,
        head_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(60),
    }
}

/// The job is an install whose trusted process is this test process.
fn trusting_me() -> Option<Trusted> {
    let ns = std::fs::metadata("/proc/self/ns/net").unwrap();
    let pid = OnceLock::new();
    pid.set(std::process::id()).unwrap();
    Some(Trusted {
        pid,
        netns: (ns.dev(), ns.ino()),
    })
}

/// A broker on a host-loopback listener sharing `budget`; returns its port and denials.
async fn broker_with(
    allow: &[&str],
    upstream: Upstream,
    budget: Arc<Budget>,
    trusted: Option<Trusted>,
) -> (u16, Denials) {
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
        port,
        budget,
        open: AtomicUsize::new(0),
        trusted,
    });
    tokio::spawn(accept_loop(listener, rules));
    (port, denials)
}

/// A broker for `allow` with roomy limits, not an install.
async fn broker(allow: &[&str], upstream: Upstream) -> (u16, Denials) {
    broker_with(allow, upstream, Arc::new(Budget::new(roomy())), None).await
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
    // The job is an install and this process its trusted installer.
    let budget = Arc::new(Budget::new(roomy()));
    let (port, _) = broker_with(&[&entry], upstream, budget, trusting_me()).await;
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
    let upstream = proxy_env("HTTPS_PROXY", &format!("http://s%40cret:pw@127.0.0.1:{up}"));
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
        head.contains("Proxy-Authorization: Basic c0BjcmV0OnB3\r\n"), // base64("s@cret:pw")
        "{head}"
    );
}

#[tokio::test]
async fn connect_opens_a_tunnel_to_an_allowed_address_and_passes_early_bytes() {
    tunnel_through_an_entry_for("127.0.0.1").await;
}

/// A CONNECT to `host`:(an origin's port), allowed by an entry naming the same: the
/// tunnel opens, and the first bytes of it, sent with the CONNECT (as a TLS client may
/// send them), reach the origin, whose answer comes back.
async fn tunnel_through_an_entry_for(host: &str) {
    let (web, head) = origin("pong", true).await;
    let (port, denials) = broker(&[&format!("{host}:{web}")], Upstream::default()).await;
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let req = format!("CONNECT {host}:{web} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n");
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

/// The broker resolves host names itself (`connect_checked`): through the C library linked
/// into the binary, statically (.cargo/config.toml) — its built-in `files` source answers
/// `localhost` from /etc/hosts. Fails if the static build cannot resolve names.
#[tokio::test]
async fn connect_resolves_a_host_name_through_the_linked_c_library() {
    tunnel_through_an_entry_for("localhost").await;
}

/// A server that records every request head it gets and answers each `200 ok`.
async fn recorder() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                seen.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf).into_owned());
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
            });
        }
    });
    (port, heads)
}

/// The server's environment naming one upstream proxy.
fn proxy_env(var: &str, url: &str) -> Upstream {
    Upstream::from_env([(var.to_string(), url.to_string())].into_iter())
}

fn index_upstream(port: u16) -> Upstream {
    Upstream::from_env(
        [(
            "UV_INDEX_URL".to_string(),
            format!("http://u:p@127.0.0.1:{port}/simple"),
        )]
        .into_iter(),
    )
}

/// Send `method path` to the index at `web` through the broker at `port`; the answer.
async fn ask(port: u16, web: u16, method: &str, path: &str) -> String {
    let req = format!(
        "{method} http://127.0.0.1:{web}{path} HTTP/1.1\r\nHost: 127.0.0.1:{web}\r\nContent-Length: 0\r\n\r\n"
    );
    exchange(port, req.as_bytes()).await
}

#[tokio::test]
async fn credentials_go_only_to_the_installers_own_reads_under_the_index_path() {
    let (web, heads) = recorder().await;
    let entry = format!("127.0.0.1:{web}");
    let budget = Arc::new(Budget::new(roomy()));
    let (port, denials) = broker_with(&[&entry], index_upstream(web), budget, trusting_me()).await;
    // Qualifying: GET and HEAD under /simple, from the trusted process (this one).
    for (method, path) in [("GET", "/simple/pkg/"), ("HEAD", "/simple/pkg/p-1.tar.gz")] {
        let answer = ask(port, web, method, path).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    // Not qualifying: other methods, other paths, ways out of the path.
    let refused = [
        ("POST", "/simple/pkg/"),
        ("PUT", "/simple/pkg/"),
        ("TRACE", "/simple/"),
        ("DELETE", "/simple/pkg/"),
        ("GET", "/upload"),
        ("GET", "/"),
        ("GET", "/simple/../echo"),
        ("GET", "/simple/%2e%2e/echo"),
        ("GET", "/simplex/"),
    ];
    for (method, path) in refused {
        let answer = ask(port, web, method, path).await;
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "{method} {path}: {answer}"
        );
    }
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 2 + refused.len(), "{heads:?}");
    for head in &heads {
        let lent = head.contains("Authorization: Basic dTpw\r\n");
        let qualifies = head.starts_with("GET /simple/pkg/ ")
            || head.starts_with("HEAD /simple/pkg/p-1.tar.gz ");
        assert_eq!(lent, qualifies, "{head}");
    }
    let d = denials.lock().unwrap().clone();
    assert!(
        d.iter().any(
            |l| l.starts_with("index credentials withheld from POST http://127.0.0.1:")
                && l.ends_with("/simple/pkg/: only GET and HEAD get them")
        ),
        "{d:?}"
    );
    assert!(
        d.iter().any(|l| l.contains("GET http://127.0.0.1:")
            && l.contains("/upload: only requests under http://127.0.0.1:")),
        "{d:?}"
    );
}

#[tokio::test]
async fn credentials_never_go_to_another_process_or_a_job_that_is_no_install() {
    let (web, heads) = recorder().await;
    let entry = format!("127.0.0.1:{web}");
    let budget = Arc::new(Budget::new(roomy()));
    // An install whose trusted process is this one: a child process's GET under the
    // index path, the most a build hook could try, goes without.
    let (port, denials) = broker_with(
        &[&entry],
        index_upstream(web),
        budget.clone(),
        trusting_me(),
    )
    .await;
    let req = format!("GET http://127.0.0.1:{web}/simple/pkg/ HTTP/1.1\r\n\r\n");
    let code = format!(
        "import socket\ns = socket.create_connection(('127.0.0.1', {port}))\ns.sendall({req:?}.encode())\n\
         print(s.recv(100).decode().split()[1])"
    );
    let out = tokio::process::Command::new("python3")
        .args(["-c", &code])
        .output()
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "200",
        "{out:?}"
    );
    // Not an install at all (a session, a shell job, a script): the same GET from the
    // very process that would be trusted goes without too.
    let (port2, denials2) = broker_with(&[&entry], index_upstream(web), budget, None).await;
    let answer = ask(port2, web, "GET", "/simple/pkg/").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 2, "{heads:?}");
    assert!(
        heads
            .iter()
            .all(|h| !h.to_ascii_lowercase().contains("authorization")),
        "{heads:?}"
    );
    let d = denials.lock().unwrap().clone();
    assert!(d.iter().any(|l| l.contains("another process's")), "{d:?}");
    let d = denials2.lock().unwrap().clone();
    assert!(
        d.iter().any(|l| l.contains("this job is not an install")),
        "{d:?}"
    );
}

#[tokio::test]
async fn a_head_of_16_kib_is_accepted_and_one_byte_more_refused_in_words() {
    let (web, heads) = recorder().await;
    let entry = format!("127.0.0.1:{web}");
    let (port, _) = broker(&[&entry], Upstream::default()).await;
    // A head of exactly `len` bytes, the blank line included.
    let head_of = |len: usize| {
        let start = format!("GET http://127.0.0.1:{web}/ HTTP/1.1\r\nX-Pad: ");
        let pad = len - start.len() - 4;
        format!("{start}{}\r\n\r\n", "a".repeat(pad))
    };
    for len in [15 * 1024, super::conn::MAX_HEAD] {
        let head = head_of(len);
        assert_eq!(head.len(), len);
        let answer = exchange(port, head.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{len}: {answer}");
    }
    for len in [super::conn::MAX_HEAD + 1, 17 * 1024, 20 * 1024] {
        let answer = exchange(port, head_of(len).as_bytes()).await;
        assert!(
            answer.starts_with("HTTP/1.1 431")
                && answer.contains("the request head exceeds 16384 bytes"),
            "{len}: {answer}"
        );
    }
    assert_eq!(heads.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn plain_http_to_an_upstream_proxy_carries_the_checked_uri() {
    let (up, head) = origin("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false).await;
    let upstream = proxy_env("http_proxy", &format!("127.0.0.1:{up}"));
    let (port, _) = broker(&["example.org", "[2001:db8::1]:8080"], upstream).await;
    let answer = exchange(
        port,
        b"GET http://EXAMPLE.org.:80/a/b?c=d#frag HTTP/1.1\r\nHost: evil.example\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let head = head.await.unwrap();
    assert!(
        head.starts_with("GET http://example.org/a/b?c=d HTTP/1.1\r\nHost: example.org\r\n"),
        "{head}"
    );
    assert!(
        !head.contains("evil") && !head.contains("EXAMPLE") && !head.contains("frag"),
        "{head}"
    );
}

#[tokio::test]
async fn an_ipv6_target_goes_upstream_bracketed_with_its_port() {
    let (up, head) = origin("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false).await;
    let upstream = proxy_env("http_proxy", &format!("127.0.0.1:{up}"));
    let (port, _) = broker(&["[2001:db8::1]:8080"], upstream).await;
    let answer = exchange(port, b"GET http://[2001:DB8::1]:8080 HTTP/1.1\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let head = head.await.unwrap();
    assert!(
        head.starts_with("GET http://[2001:db8::1]:8080/ HTTP/1.1\r\nHost: [2001:db8::1]:8080\r\n"),
        "{head}"
    );
}

/// Connect and wait until the broker has accepted (its answer to a partial head is
/// still pending): the connection holds a place in the budget.
async fn hold(port: u16) -> TcpStream {
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    c.write_all(b"CONNECT half").await.unwrap();
    c
}

/// Until `port` admits a connection: the answer of the first that was (by the hang guard).
async fn until_admitted(port: u16) -> String {
    for _ in 0..600 {
        let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        // A complete head the rules refuse (403): admitted, answered, closed.
        c.write_all(b"CONNECT nowhere.invalid:443 HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out).await;
        let answer = String::from_utf8_lossy(&out).into_owned();
        if answer.starts_with("HTTP/1.1 403") {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the broker never admitted a connection again");
}

/// Until the server's brokers hold `n` connections (by the hang guard).
async fn until_open(budget: &Budget, n: usize) {
    for _ in 0..600 {
        if budget.open.load(std::sync::atomic::Ordering::Acquire) == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the brokers never held {n} connections");
}

/// Connect, send nothing, and read the answer to the end.
async fn answer_to_a_bare_connection(port: u16) -> String {
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_job_at_its_budget_is_refused_in_words_and_others_are_not() {
    let budget = Arc::new(Budget::new(Limits {
        per_job: 3,
        total: 5,
        ..roomy()
    }));
    let (a, a_denials) =
        broker_with(&["pypi.org"], Upstream::default(), budget.clone(), None).await;
    let (b, b_denials) =
        broker_with(&["pypi.org"], Upstream::default(), budget.clone(), None).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(hold(a).await);
    }
    until_open(&budget, 3).await;
    // A fourth of job A: answered at once (it sent nothing), 429 in words.
    let answer = answer_to_a_bare_connection(a).await;
    assert!(
        answer.starts_with("HTTP/1.1 429 Too Many Requests")
            && answer.contains("this job already holds 3 connections through the broker"),
        "{answer}"
    );
    let d = a_denials.lock().unwrap().clone();
    assert!(
        d.iter().any(|l| l.contains("the most one job may hold")),
        "{d:?}"
    );
    // Job B still gets in: two more fit the total of five ...
    let _b_held = [hold(b).await, hold(b).await];
    until_open(&budget, 5).await;
    // ... and then the server's total is reached: B is refused with 503, in words.
    let answer = answer_to_a_bare_connection(b).await;
    assert!(
        answer.starts_with("HTTP/1.1 503")
            && answer.contains("the most all jobs together may hold"),
        "{answer}"
    );
    assert!(
        b_denials
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("5 connections"))
    );
    // A closed connection gives its place back.
    drop(held.pop());
    until_admitted(a).await;
}

#[tokio::test]
async fn a_head_that_never_ends_and_an_idle_tunnel_are_closed() {
    let budget = Arc::new(Budget::new(Limits {
        head_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(300),
        ..roomy()
    }));
    let (web, _head) = origin("pong", true).await;
    let entry = format!("127.0.0.1:{web}");
    let (port, _) = broker_with(&[&entry], Upstream::default(), budget, None).await;
    // Half a head, then nothing: answered 408 in words, and closed.
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    c.write_all(b"GET http://127.0.0.1/ HTTP/1.1\r\nX: ")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), c.read_to_end(&mut out))
        .await
        .expect("the broker kept a connection that never sent its head")
        .unwrap();
    let answer = String::from_utf8_lossy(&out);
    assert!(
        answer.starts_with("HTTP/1.1 408") && answer.contains("no complete request head"),
        "{answer}"
    );
    // A tunnel that goes quiet (the origin answered once, then holds the connection
    // open): closed by the broker, not kept forever.
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    c.write_all(format!("CONNECT 127.0.0.1:{web} HTTP/1.1\r\n\r\nping").as_bytes())
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), c.read_to_end(&mut out))
        .await
        .expect("the broker kept an idle tunnel open")
        .unwrap();
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200 Connection established"));
}

#[test]
fn budgets_follow_the_open_file_limit() {
    let l = Limits::for_open_files(1024);
    assert_eq!((l.per_job, l.total), (128, 256));
    let l = Limits::for_open_files(1 << 20);
    assert_eq!(
        (l.per_job, l.total),
        (super::MAX_CONNECTIONS_PER_JOB, super::MAX_CONNECTIONS_TOTAL)
    );
    let l = Limits::for_open_files(0);
    assert!(l.per_job >= 1 && l.total >= 2);
}
