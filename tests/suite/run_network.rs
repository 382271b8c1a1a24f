//! Network modes that are the launcher's own (Landlock TCP ports, the loopback
//! namespace). `none` and the socket families it denies are in the escape suite.

use std::net::TcpListener;

use crate::common::{TempDir, run_in, stderr, stdout};

const FS: &str = "[filesystem]\n\
    read = [\"/usr\", \"/bin\", \"/lib\", \"/lib64\", \"/etc\", \"/proc\", \"{python}\"]\n\
    write = [\"{workspace}\", \"{tmp}\", \"/dev/null\"]\n\
    execute = [\"/usr\", \"/bin\", \"/lib\", \"/lib64\", \"{python}\"]\n\
    [environment]\npass = [\"PATH\", \"PYENV_ROOT\", \"PYENV_VERSION\"]\n";

/// Python that tries each probe and prints one word per line.
const PROBE: &str = r#"
import socket, sys
def attempt(name, fn):
    try:
        fn(); print(name, "OK")
    except OSError as e:
        print(name, "DENIED", e.errno)
allowed, other = int(sys.argv[1]), int(sys.argv[2])
attempt("allowed", lambda: socket.create_connection(("127.0.0.1", allowed), timeout=2).close())
attempt("other", lambda: socket.create_connection(("127.0.0.1", other), timeout=2).close())
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close())
attempt("bind", lambda: socket.socket().bind(("127.0.0.1", 0)))
"#;

/// mode = "ports": TCP to the listed port works; another port, UDP and binding are denied.
#[test]
fn ports_mode_allows_only_listed_tcp_ports() {
    let ws = TempDir::new("ports");
    let allowed = TcpListener::bind("127.0.0.1:0").unwrap();
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let (pa, po) = (
        allowed.local_addr().unwrap().port(),
        other.local_addr().unwrap().port(),
    );
    let policy = ws.write(
        "ports.toml",
        &format!("{FS}[network]\nmode = \"ports\"\nconnect = [{pa}]\n"),
    );
    let script = ws.write("probe.py", PROBE);
    let out = run_in(
        policy.to_str().unwrap(),
        &ws.path,
        false,
        &[
            "python3",
            script.to_str().unwrap(),
            &pa.to_string(),
            &po.to_string(),
        ],
    );
    let text = stdout(&out);
    assert_eq!(
        text,
        "allowed OK\nother DENIED 13\nudp DENIED 1\nbind DENIED 13\n",
        "stderr: {}",
        stderr(&out)
    );
}

/// mode = "loopback": the job's own loopback works, the host's listeners are unreachable.
#[test]
fn loopback_mode_is_a_private_network() {
    let ws = TempDir::new("loop");
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host.local_addr().unwrap().port();
    let policy = ws.write("lo.toml", &format!("{FS}[network]\nmode = \"loopback\"\n"));
    let script = ws.write(
        "lo.py",
        "import socket, sys\n\
         s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n\
         c = socket.create_connection(s.getsockname()); a, _ = s.accept()\n\
         c.send(b'ping'); print(a.recv(4).decode())\n\
         try:\n    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=2)\n    print('host reachable')\n\
         except OSError:\n    print('host unreachable')\n",
    );
    let out = run_in(
        policy.to_str().unwrap(),
        &ws.path,
        false,
        &["python3", script.to_str().unwrap(), &port.to_string()],
    );
    assert_eq!(
        stdout(&out),
        "ping\nhost unreachable\n",
        "stderr: {}",
        stderr(&out)
    );
}

/// The server's jobs join network namespaces made ahead of need: each job still gets
/// one of its own (six jobs alive at once, six namespaces), `lo` up under `loopback`,
/// and the host's loopback listeners out of reach.
#[test]
fn pooled_namespaces_are_fresh_per_job_with_loopback_up() {
    use mcp_sandbox_repl::sandbox::Io;
    use std::io::{BufRead, BufReader, Write};
    let ws = TempDir::new("netpool");
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    let host_port = host.local_addr().unwrap().port();
    let file = ws.write("lo.toml", &format!("{FS}[network]\nmode = \"loopback\"\n"));
    // The server's route: the zygote, namespaces made ahead of need.
    let policy = crate::common::resolved_in(&ws, file.to_str().unwrap());
    let probe = ws.write(
        "lo.py",
        "import os, socket, sys\n\
         own = socket.socket(); own.bind(('127.0.0.1', 0)); own.listen()\n\
         socket.create_connection(own.getsockname(), timeout=2).close()\n\
         try:\n    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=2); host = 'reached'\n\
         except OSError:\n    host = 'unreachable'\n\
         print(os.readlink('/proc/self/ns/net'), 'lo-up', host, flush=True)\n\
         sys.stdin.read()\n",
    );
    let mut jobs = Vec::new();
    for _ in 0..6 {
        let mut cmd = crate::common::runtime().command(policy.clone(), "python3");
        cmd.arg(probe.to_str().unwrap())
            .arg(host_port.to_string())
            .current_dir(&ws.path)
            .stdin(Io::Piped)
            .stdout(Io::Piped)
            .stderr(Io::Null);
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        jobs.push((child, line));
    }
    let own = std::fs::read_link("/proc/self/ns/net").unwrap();
    let mut seen = std::collections::HashSet::new();
    for (_, line) in &jobs {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            words.get(1..),
            Some(&["lo-up", "unreachable"][..]),
            "{line}"
        );
        assert_ne!(
            Some(words[0]),
            own.to_str(),
            "a job ran in the host's namespace"
        );
        assert!(seen.insert(words[0].to_string()), "two jobs share {line}");
    }
    for (mut child, _) in jobs {
        child.stdin.take().unwrap().write_all(b"").unwrap();
    }
}
