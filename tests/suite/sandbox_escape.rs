//! The escape suite: real escape attempts through `mcp-sandbox-repl run`, each table run
//! under `workspace-write` (every attempt must be denied) and under `danger-full-access`
//! (the control: every attempt must succeed, so the policy is what stops it).
//! Checks are batched into one sandboxed Python script per area for speed; each check
//! reports `ok` or `denied:<ERRNO>` so a failure names the exact operation.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::OnceLock;

use serde_json::json;

use crate::common::{TempDir, bin, report, run_in, stderr, stdout};

const DENY: &str = "workspace-write";
const CONTROL: &str = "danger-full-access";

/// The real interpreter (`python3` on PATH may be a pyenv shim script).
fn python() -> &'static str {
    static PY: OnceLock<String> = OnceLock::new();
    PY.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", crate::common::BASE_EXECUTABLE])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    })
}

/// Helpers every script gets: `check(name, fn)` records "ok" or "denied:ERRNO";
/// `done()` prints the results as one JSON line.
const PRELUDE: &str = r#"
import ctypes, errno, json, os, socket, sys
A = json.loads(sys.argv[1])
R = {}
libc = ctypes.CDLL(None, use_errno=True)
def check(name, f):
    try:
        f()
        R[name] = "ok"
    except OSError as e:
        R[name] = "denied:" + errno.errorcode.get(e.errno, str(e.errno))
    except Exception as e:
        R[name] = "error:" + type(e).__name__ + ":" + str(e)
def sys_ok(rc):
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return rc
def done():
    print(json.dumps(R))
"#;

/// Run `script` (after the prelude) under `policy` with `args`; the last stdout line is the result map.
fn sandboxed(
    policy: &str,
    ws: &Path,
    script: &str,
    args: serde_json::Value,
) -> (BTreeMap<String, String>, Output) {
    let code = format!("{PRELUDE}\n{script}\ndone()\n");
    let out = run_in(
        policy,
        ws,
        false,
        &[python(), "-c", &code, &args.to_string()],
    );
    let text = stdout(&out);
    let last = text.lines().last().unwrap_or_default();
    let map = serde_json::from_str(last).unwrap_or_else(|e| {
        panic!(
            "{policy}: no result line ({e}); stdout: {text}; stderr: {}",
            stderr(&out)
        )
    });
    eprintln!("{policy}: {map:?}");
    (map, out)
}

/// Every named check must be denied under DENY and succeed under CONTROL.
fn assert_table(policy: &str, results: &BTreeMap<String, String>, names: &[&str]) {
    for name in names {
        let got = results.get(*name).map(String::as_str).unwrap_or("missing");
        if policy == DENY {
            assert!(
                got.starts_with("denied:"),
                "{policy}: `{name}` must be denied, got {got}; all: {results:?}"
            );
        } else {
            assert_eq!(
                got, "ok",
                "{policy} (control): `{name}` must succeed; all: {results:?}"
            );
        }
    }
}

/// A directory outside every workspace holding a secret, plus the host's real HOME.
struct Outside {
    dir: TempDir,
    secret: PathBuf,
}

fn outside() -> Outside {
    let dir = TempDir::new("outside");
    let secret = dir.write("secret.txt", "top secret");
    dir.write("victim.txt", "moved by rename_in under the control policy");
    std::fs::create_dir(dir.join("mnt")).unwrap();
    Outside { dir, secret }
}

const FS_SCRIPT: &str = r#"
sec, out, tag, home = A["secret"], A["outside"], A["tag"], A["home"]
def write(p):
    with open(p, "w") as f: f.write("x")
def remove_after(p, f):
    def g():
        f()
        if os.path.lexists(p): os.unlink(p)
    return g
check("write_etc", remove_after("/etc/" + tag, lambda: write("/etc/" + tag)))
check("write_home", remove_after(home + "/" + tag, lambda: write(home + "/" + tag)))
# /dev/shm is the job's own tmpfs (or absent): the host must not see this file.
check("write_host_dev_shm", lambda: write("/dev/shm/" + tag))
check("write_outside_dir", lambda: write(out + "/new.txt"))
check("read_outside_file", lambda: open(sec).read())
def secret_content(p):
    def f():
        if not open(p, "rb").read(): raise OSError(errno.EACCES, "masked (empty)")
    return f
check("read_etc_shadow", secret_content("/etc/shadow"))
check("list_outside_dir", lambda: os.listdir(out))
os.symlink(sec, "link-read")
check("symlink_read", lambda: open("link-read").read())
os.symlink(out + "/via-link.txt", "link-write")
check("symlink_write", lambda: write("link-write"))
check("hardlink_in", lambda: os.link(sec, "hard"))
# A hardlink to a read-only file would let chmod/chown/writes through it reach the host file.
check("hardlink_readonly_into_ws", remove_after("pw", lambda: os.link("/etc/passwd", "pw")))
write("mine.txt")
check("rename_out", lambda: os.rename("mine.txt", out + "/moved.txt"))
check("rename_in", lambda: os.rename(A["victim"], "stolen.txt"))
def same_mode(p): return lambda: os.chmod(p, os.stat(p).st_mode & 0o7777)
def same_owner(p): return lambda: os.chown(p, os.stat(p).st_uid, os.stat(p).st_gid)
check("chmod_etc_passwd", same_mode("/etc/passwd"))
check("chown_etc_passwd", same_owner("/etc/passwd"))
check("chmod_outside", same_mode(sec))
check("chown_outside", same_owner(sec))
# The job's /tmp is private (or not writable): the host must not see this file.
check("write_host_tmp", lambda: write("/tmp/" + tag))
"#;

const FS_CHECKS: &[&str] = &[
    "write_etc",
    "write_home",
    "write_outside_dir",
    "read_outside_file",
    "read_etc_shadow",
    "list_outside_dir",
    "symlink_read",
    "symlink_write",
    "hardlink_in",
    "hardlink_readonly_into_ws",
    "rename_out",
    "rename_in",
    "chmod_etc_passwd",
    "chown_etc_passwd",
    "chmod_outside",
    "chown_outside",
];

/// Writes to /etc, $HOME and other directories, reads of an unlisted directory,
/// symlink/hardlink/rename tricks through the workspace and chmod/chown outside are all
/// refused; the job's /tmp and /dev/shm are private (nothing reaches the host's). Run with
/// the workspace inside the host's /tmp and outside it (/var/tmp), the two view layouts.
#[test]
fn filesystem_escapes() {
    for base in ["/tmp", "/var/tmp"] {
        for policy in [DENY, CONTROL] {
            let ws = TempDir::new_in(Path::new(base), "esc-fs");
            let o = outside();
            let tag = format!("msr-escape-{}-{policy}", std::process::id());
            let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
            let args = json!({"secret": o.secret, "victim": o.dir.join("victim.txt"), "outside": o.dir.path,
                              "tag": tag, "home": home});
            let (r, _) = sandboxed(policy, &ws.path, FS_SCRIPT, args);
            assert_table(policy, &r, FS_CHECKS);
            let host_tmp = Path::new("/tmp").join(&tag);
            assert_eq!(
                host_tmp.exists(),
                policy == CONTROL,
                "{policy}, workspace in {base}: /tmp/{tag} on the host"
            );
            let _ = std::fs::remove_file(host_tmp);
            let host_shm = Path::new("/dev/shm").join(&tag);
            assert_eq!(
                host_shm.exists(),
                policy == CONTROL,
                "{policy}, workspace in {base}: /dev/shm/{tag} on the host"
            );
            let _ = std::fs::remove_file(host_shm);
            assert_eq!(std::fs::read_to_string(&o.secret).unwrap(), "top secret");
        }
    }
}

const NET_SCRIPT: &str = r#"
def tcp(host, port, fam=socket.AF_INET):
    def f():
        s = socket.socket(fam, socket.SOCK_STREAM); s.settimeout(2); s.connect((host, port)); s.close()
    return f
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
    s.sendto(b"ping", ("127.0.0.1", A["udp"]))
    if s.recv(64) != b"ping": raise OSError(errno.EPROTO, "bad echo")
def dns():
    q = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01"
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
    s.sendto(q, ("127.0.0.1", A["dns"]))
    if s.recv(512)[:2] != b"\x12\x34": raise OSError(errno.EPROTO, "bad answer")
check("tcp_127", tcp("127.0.0.1", A["tcp"]))
check("tcp_ipv6_loopback", tcp("::1", A["tcp6"], socket.AF_INET6))
check("udp_127", udp)
check("dns_127", dns)
check("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close())
check("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close())
check("raw_icmp", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close())
check("vsock", lambda: socket.socket(40, socket.SOCK_STREAM, 0).close())
"#;

const NET_CHECKS: &[&str] = &[
    "tcp_127",
    "tcp_ipv6_loopback",
    "udp_127",
    "dns_127",
    "netlink",
    "packet",
    "raw_icmp",
    "vsock",
];

/// A UDP socket on 127.0.0.1 answering every datagram with itself (also the fake DNS server).
fn udp_echo() -> u16 {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = sock.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = sock.recv_from(&mut buf) {
            let _ = sock.send_to(&buf[..n], from);
        }
    });
    port
}

/// TCP, UDP and DNS to listeners the test starts on 127.0.0.1 and ::1, and netlink,
/// packet, raw and vsock sockets are all refused.
#[test]
fn network_escapes() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp6 = TcpListener::bind("[::1]:0").unwrap();
    let (udp, dns) = (udp_echo(), udp_echo());
    for policy in [DENY, CONTROL] {
        let ws = TempDir::new("esc-net");
        let args = json!({"tcp": tcp.local_addr().unwrap().port(), "tcp6": tcp6.local_addr().unwrap().port(),
                          "udp": udp, "dns": dns});
        let (r, _) = sandboxed(policy, &ws.path, NET_SCRIPT, args);
        assert_table(policy, &r, NET_CHECKS);
    }
}

const UNIX_SCRIPT: &str = r#"
def conn(addr):
    def f():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(2); s.connect(addr); s.close()
    return f
check("unix_pathname_outside", conn(A["path"]))
check("unix_abstract_outside", conn("\0" + A["abstract"]))
"#;

/// A pathname unix socket outside the workspace (as /run/docker.sock would be) and an
/// abstract unix socket, both listened on by the test, cannot be connected.
#[test]
fn unix_socket_escapes() {
    let o = outside();
    let path = o.dir.join("daemon.sock");
    let _pathname = UnixListener::bind(&path).unwrap();
    let abstract_name = format!("msr-test-{}", std::process::id());
    let _abstract = abstract_listener(&abstract_name);
    for policy in [DENY, CONTROL] {
        let ws = TempDir::new("esc-unix");
        let (r, _) = sandboxed(
            policy,
            &ws.path,
            UNIX_SCRIPT,
            json!({"path": path, "abstract": abstract_name}),
        );
        assert_table(
            policy,
            &r,
            &["unix_pathname_outside", "unix_abstract_outside"],
        );
    }
}

fn abstract_listener(name: &str) -> UnixListener {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    UnixListener::bind_addr(&addr).unwrap()
}

const PROC_SCRIPT: &str = r#"
import signal
pid = A["sleeper"]
def read(p): return lambda: open(p, "rb").read()
def ppid(p): return int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
# The job's parent is its PID namespace's init, whose parent is the launcher; the server
# is the first ancestor that is not one of those (as far as this /proc shows ancestors).
server = os.getppid()
try:
    server = ppid("self")
    while b"__sandbox-launch" in open(f"/proc/{server}/cmdline", "rb").read():
        server = ppid(server)
except (OSError, ValueError, IndexError):
    pass
for who, p in (("server", server), ("test", A["test"])):
    for f in ("environ", "cmdline", "maps"):
        check(f"proc_{who}_{f}", read(f"/proc/{p}/{f}"))
def seize():
    sys_ok(libc.ptrace(0x4206, pid, None, None))
    libc.ptrace(17, pid, None, None)
check("ptrace_outside", seize)
check("kill_outside", lambda: os.kill(pid, signal.SIGCONT))
def mount():
    sys_ok(libc.mount(b"none", A["mnt"].encode(), b"tmpfs", 0, None))
    libc.umount2(A["mnt"].encode(), 2)
check("mount", mount)
check("unshare", lambda: sys_ok(libc.unshare(0x04000000)))
def setns():
    fd = os.open("/proc/self/ns/uts", os.O_RDONLY)
    sys_ok(libc.setns(fd, 0))
check("setns", setns)
def bpf():
    attr = ctypes.create_string_buffer(128)
    ctypes.memmove(attr, (ctypes.c_uint32 * 4)(2, 4, 4, 1), 16)
    os.close(sys_ok(libc.syscall(321, 0, attr, 128)))
check("bpf", bpf)
check("keyctl", lambda: sys_ok(libc.syscall(250, 0, ctypes.c_int(-3), 1)))
def io_uring():
    params = ctypes.create_string_buffer(120)
    os.close(sys_ok(libc.syscall(425, 4, params)))
check("io_uring", io_uring)
def sysctl_same_value():
    # Writes back the current value: harmless under the control, yet a real sysctl write
    # (a root-uid job could otherwise set e.g. kernel.core_pattern by plain DAC).
    p = "/proc/sys/kernel/domainname"
    v = open(p).read()
    with open(p, "w") as f: f.write(v)
check("sysctl_write", sysctl_same_value)
def leave_cgroup():
    with open(A["own_cgroup_procs"], "w") as f: f.write("0")
check("leave_job_cgroup", leave_cgroup)
"#;

const PROC_CHECKS: &[&str] = &[
    "proc_server_environ",
    "proc_server_cmdline",
    "proc_server_maps",
    "proc_test_environ",
    "proc_test_cmdline",
    "proc_test_maps",
    "ptrace_outside",
    "kill_outside",
    "mount",
    "unshare",
    "setns",
    "bpf",
    "keyctl",
    "io_uring",
    "leave_job_cgroup",
    "sysctl_write",
];

/// The `cgroup.procs` of the test's own pids cgroup (outside any job cgroup).
fn own_cgroup_procs() -> String {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    for line in own.lines() {
        let mut it = line.splitn(3, ':');
        let (_, ctrls, path) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        if ctrls.split(',').any(|c| c == "pids") {
            return format!("/sys/fs/cgroup/pids{path}/cgroup.procs").replace("//", "/");
        }
    }
    let path = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
    format!("/sys/fs/cgroup{path}/cgroup.procs").replace("//", "/")
}

/// The server's (and the test's) /proc environ, cmdline and maps are unreadable; ptrace
/// and signals to an outside process (the test's own sleep), mount, unshare, setns, bpf,
/// keyctl and io_uring all fail; the job cannot move itself out of its cgroup (which
/// would lift its memory and process caps) nor write a sysctl.
#[test]
fn process_and_kernel_escapes() {
    let sleeper = Sleeper::start();
    let o = outside();
    for policy in [DENY, CONTROL] {
        let ws = TempDir::new("esc-proc");
        let args = json!({"sleeper": sleeper.0.id(), "test": std::process::id(), "mnt": o.dir.join("mnt"),
                          "own_cgroup_procs": own_cgroup_procs()});
        let (r, _) = sandboxed(policy, &ws.path, PROC_SCRIPT, args);
        assert_table(policy, &r, PROC_CHECKS);
        assert!(sleeper.alive(), "the outside process survived");
    }
}

struct Sleeper(Child);

impl Sleeper {
    fn start() -> Sleeper {
        Sleeper(Command::new("sleep").arg("60").spawn().unwrap())
    }
    fn alive(&self) -> bool {
        Path::new(&format!("/proc/{}", self.0.id())).exists()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// workspace-write with a 128 MiB memory cap (written next to the workspace).
fn small_memory_policy(dir: &TempDir) -> String {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/workspace-write.toml"),
    )
    .unwrap();
    let text = text
        .lines()
        .map(|l| {
            if l.starts_with("memory =") {
                "memory = \"128MiB\""
            } else {
                l
            }
        })
        .collect::<Vec<_>>();
    dir.write("small-memory.toml", &text.join("\n"))
        .display()
        .to_string()
}

/// A memory bomb ends at the cap (killed by the kernel's OOM killer inside the job's
/// cgroup) and the report names the memory limit.
#[test]
fn memory_bomb_ends_at_cap() {
    let ws = TempDir::new("esc-mem");
    let pol = TempDir::new("esc-mem-policy");
    let policy = small_memory_policy(&pol);
    let bomb = "b = []\nwhile True: b.append(b'x' * (8 << 20))";
    let out = run_in(&policy, &ws.path, true, &[python(), "-c", bomb]);
    let r = report(&out);
    assert_eq!(r["limit"], "memory", "{r}; stderr: {}", stderr(&out));
    assert_eq!(r["signal"], "SIGKILL", "{r}");
    assert!(r["peak_rss_bytes"].as_u64().unwrap() <= 140 << 20, "{r}");
    // No wall-clock bound (a loaded machine may be slow to get there): the bomb never
    // ends by itself, so the report above is the cap's doing.
}

/// A fork bomb under workspace-write, run as root (where RLIMIT_NPROC does not bind),
/// is stopped by the pids cgroup: it ends, the report says `processes`, nothing of it
/// survives, and the machine still starts processes.
#[test]
fn fork_bomb_contained_as_root() {
    // SAFETY: geteuid takes no arguments and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test proves containment as root; run it as root"
    );
    let ws = TempDir::new("esc-fork");
    // Every process forks until a fork fails, then exits: exponential growth up to the cap.
    let bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        os._exit(3)";
    let out = run_in(DENY, &ws.path, true, &[python(), "-c", bomb]);
    let r = report(&out);
    // No wall-clock bound (a loaded machine may take a while to run 512 processes to
    // their failed fork): the report names the cap that ended it.
    assert_eq!(r["limit"], "processes", "{r}; stderr: {}", stderr(&out));
    let mut child = Command::new("true")
        .spawn()
        .expect("the machine still starts processes");
    assert!(child.wait().unwrap().success());
    let mut survivors = String::new();
    let mut ps = Command::new("pgrep")
        .args(["-f", "os._exit\\(3\\)"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    ps.stdout
        .take()
        .unwrap()
        .read_to_string(&mut survivors)
        .unwrap();
    ps.wait().unwrap();
    assert!(
        survivors.trim().is_empty(),
        "bomb processes survived: {survivors}"
    );
}

/// With `network = "loopback"` the job can serve and reach itself on 127.0.0.1, but not a
/// listener of the host.
#[test]
fn loopback_policy_reaches_itself_not_the_host() {
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    let ws = TempDir::new("esc-lo");
    let pol = TempDir::new("esc-lo-policy");
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/workspace-write.toml"),
    )
    .unwrap()
    .replace("mode = \"none\"", "mode = \"loopback\"");
    let policy = pol.write("loopback.toml", &text).display().to_string();
    let script = r#"
def own():
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen()
    c = socket.create_connection(srv.getsockname(), timeout=2); c.close()
check("own_loopback", own)
def host():
    socket.create_connection(("127.0.0.1", A["port"]), timeout=2).close()
check("host_listener", host)
"#;
    let (r, _) = sandboxed(
        &policy,
        &ws.path,
        script,
        json!({"port": host.local_addr().unwrap().port()}),
    );
    assert_eq!(r["own_loopback"], "ok", "{r:?}");
    assert!(r["host_listener"].starts_with("denied:"), "{r:?}");
}

#[allow(dead_code)]
fn binary() -> PathBuf {
    bin()
}

/// A policy path inside the workspace (`{workspace}/.venv`, as a venv found next to the
/// project would be) that a job replaced by a symlink to a secret directory does not
/// bring that directory into the next job's view.
#[test]
fn symlink_planted_for_a_policy_path_does_not_escape() {
    let o = outside();
    let ws = TempDir::new_in(Path::new("/var/tmp"), "esc-planted");
    let pol = TempDir::new("esc-planted-policy");
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/workspace-write.toml"),
    )
    .unwrap()
    .replace("\"{python}\",", "\"{python}\", \"{workspace}/.venv\",");
    assert!(text.contains("{workspace}/.venv"));
    let policy = pol.write("venv-in-ws.toml", &text).display().to_string();
    // The first job plants the link (it may: the workspace is writable) ...
    let plant = format!("ln -s {} .venv", o.dir.path.display());
    let out = run_in(&policy, &ws.path, false, &["sh", "-c", &plant]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(ws.join(".venv").is_symlink());
    // ... the next job tries to read through it, by the link and by the target's path.
    let script = r#"check("via_link", lambda: open(".venv/secret.txt").read())
check("via_target", lambda: open(A["secret"]).read())"#;
    let (r, _) = sandboxed(&policy, &ws.path, script, json!({"secret": o.secret}));
    assert!(r["via_link"].starts_with("denied:"), "{r:?}");
    assert!(r["via_target"].starts_with("denied:"), "{r:?}");
}
