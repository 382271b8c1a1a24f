//! Jobs confined within the server's *own* cgroup, the real binary run the way a
//! container or a systemd unit runs it: started inside a cgroup made for it (this test
//! makes one, as a runtime does), as uid 65534 (`setpriv`) so that it may create nothing
//! anywhere else in the hierarchy.
//!
//! - Delegated (the cgroup owned by uid 65534, as systemd's `Delegate=yes` or a
//!   delegating runtime leaves it): each job gets a cgroup of its own under it, with the
//!   policy's memory and process caps, and the memory cap kills a hog there.
//! - Not delegated: `doctor` says per-job limits are not enforced, why, what holds each
//!   job instead, and the limits of the server's own cgroup that still hold the server
//!   and all its jobs together (set by the test, as a runtime sets a pod's); `/readyz`
//!   says the same beside "ready".
//! - cgroup v2 only (a private mount namespace in which the one cgroup file system is a
//!   cgroup2 mount, the server's cgroup a fresh directory of it): the server looks for
//!   the controllers there and says exactly which one it is not offered. On a hybrid host
//!   (this one) pids and memory are bound to v1 and cannot be offered to any v2 cgroup;
//!   where they are, the test checks the server moved itself into its leaf and enabled
//!   them for its jobs instead.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{TempDir, bin, report, stderr, stdout, unshare_private_mounts};

const NOBODY: u32 = 65534;
const AS_NOBODY: [&str; 4] = ["--reuid=65534", "--regid=65534", "--clear-groups", "--"];

/// This process's cgroup path in the v1 hierarchy of `controller` (None on pure v2).
fn v1_path(controller: &str) -> Option<String> {
    std::fs::read_to_string("/proc/self/cgroup")
        .unwrap()
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
            ctrls
                .split(',')
                .any(|c| c == controller)
                .then(|| path.to_string())
        })
}

/// A cgroup made for one server (one directory per v1 hierarchy, pids and memory), the
/// way a container runtime makes one for a container: removed, with anything left in
/// it, on drop.
struct ServerCgroup {
    pids: PathBuf,
    memory: PathBuf,
}

impl ServerCgroup {
    /// Under this test's own cgroups; `delegate`: owned by uid 65534 (the directory and
    /// its membership files, as systemd delegates).
    fn new(tag: &str, delegate: bool) -> ServerCgroup {
        let name = format!("msr-owncg-{tag}-{}", std::process::id());
        let dir = |c: &str| {
            let own = v1_path(c).expect("this test needs cgroup v1 pids and memory hierarchies");
            Path::new("/sys/fs/cgroup")
                .join(c)
                .join(own.trim_start_matches('/'))
                .join(&name)
        };
        let cg = ServerCgroup {
            pids: dir("pids"),
            memory: dir("memory"),
        };
        for d in [&cg.pids, &cg.memory] {
            std::fs::create_dir(d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
            if delegate {
                for f in ["", "cgroup.procs", "tasks"] {
                    std::os::unix::fs::chown(d.join(f), Some(NOBODY), Some(NOBODY)).unwrap();
                }
            }
        }
        cg
    }

    /// The limits a runtime would set on the container's cgroup.
    fn limit(&self, memory_bytes: u64, processes: u64) {
        std::fs::write(
            self.memory.join("memory.limit_in_bytes"),
            memory_bytes.to_string(),
        )
        .unwrap();
        std::fs::write(self.pids.join("pids.max"), processes.to_string()).unwrap();
    }

    /// `bin() args` as uid 65534, started inside this cgroup (moved there between fork
    /// and exec, by root, as a runtime places a container's first process).
    fn nobody(&self, tree: &Tree, args: &[&str]) -> Command {
        let mut cmd = Command::new("setpriv");
        cmd.args(AS_NOBODY)
            .arg(bin())
            .args(args)
            .current_dir(tree.ws())
            .env("HOME", tree.root.join("home"))
            .env("MCP_SANDBOX_STATE_DIR", tree.root.join("state"))
            .env_remove("MCP_SANDBOX_WORKSPACE");
        let files = [
            self.pids.join("cgroup.procs"),
            self.memory.join("cgroup.procs"),
        ];
        // SAFETY: between fork and exec the child only opens and writes two files.
        unsafe {
            cmd.pre_exec(move || {
                for f in &files {
                    std::fs::write(f, "0")?;
                }
                Ok(())
            });
        }
        cmd
    }

    /// `run <flags> --policy <policy> -- sh -c <script>` in the tree's workspace, as
    /// [`ServerCgroup::nobody`] starts it.
    fn run(&self, tree: &Tree, flags: &[&str], policy: &str, script: &str) -> Output {
        let ws = tree.ws();
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.extend([
            "--policy",
            policy,
            "--workspace",
            ws.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            script,
        ]);
        self.nobody(tree, &args).output().unwrap()
    }

    /// `doctor --json`'s `kernel.cgroup`, as [`ServerCgroup::nobody`] starts it.
    fn doctor_cgroup(&self, tree: &Tree) -> serde_json::Value {
        let out = self.nobody(tree, &["doctor", "--json"]).output().unwrap();
        doctor_json(&out)["kernel"]["cgroup"].clone()
    }
}

/// The tree and the server's cgroup (`delegate`: owned by uid 65534) of a v1 test, or
/// `None`, said on stderr, where this host has no cgroup v1 pids hierarchy (the v2-only
/// test covers that).
fn v1_setup(test: &str, tag: &str, delegate: bool) -> Option<(Tree, ServerCgroup)> {
    if v1_path("pids").is_none() {
        eprintln!("SKIPPED {test}: no cgroup v1 pids hierarchy (see the v2 test)");
        return None;
    }
    Some((
        Tree::new(&format!("owncg-{tag}")),
        ServerCgroup::new(tag, delegate),
    ))
}

impl Drop for ServerCgroup {
    fn drop(&mut self) {
        for d in [&self.pids, &self.memory] {
            // Deepest first: job cgroups a failed test left, then the server's.
            let mut dirs: Vec<PathBuf> = walk(d);
            dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            for dir in dirs {
                if let Ok(list) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                    for pid in list.split_whitespace().filter_map(|p| p.parse().ok()) {
                        // SAFETY: kill(2) of a process left in the test's own cgroup.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
                let deadline = Instant::now() + Duration::from_secs(10);
                while std::fs::remove_dir(&dir).is_err() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
}

fn walk(d: &Path) -> Vec<PathBuf> {
    let mut out = vec![d.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(d) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(walk(&e.path()));
            }
        }
    }
    out
}

/// Directories uid 65534 may write: the workspace, state dir and home.
struct Tree {
    root: TempDir,
}

impl Tree {
    fn new(tag: &str) -> Tree {
        let root = TempDir::new(tag);
        for d in ["", "ws", "state", "home"] {
            let p = root.join(d);
            std::fs::create_dir_all(&p).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        Tree { root }
    }

    fn ws(&self) -> PathBuf {
        self.root.join("ws")
    }

    /// workspace-write with small caps, reading /sys/fs/cgroup too (so the job can show
    /// the cgroup it sits in), written where uid 65534 can read it.
    fn small_policy(&self) -> String {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/workspace-write.toml"),
        )
        .unwrap()
        .replace("memory = \"4GiB\"", "memory = \"64MiB\"")
        .replace("processes = 512", "processes = 48")
        .replace(
            "\"/etc\", \"/proc\",",
            "\"/etc\", \"/proc\", \"/sys/fs/cgroup\",",
        );
        assert!(text.contains("64MiB") && text.contains("= 48") && text.contains("/sys/fs/cgroup"));
        let path = self.root.join("small.toml");
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }
}

fn doctor_json(out: &Output) -> serde_json::Value {
    serde_json::from_str(&stdout(out)).unwrap_or_else(|e| {
        panic!(
            "doctor --json: {e}: {}; stderr: {}",
            stdout(out),
            stderr(out)
        )
    })
}

/// Delegated: a job's cgroup is made under the server's own, with the policy's caps, and
/// a memory hog is killed there by the cap (SIGKILL from the cgroup's OOM killer, not the
/// MemoryError RLIMIT_AS would give); `doctor` says the limits are enforced via that
/// cgroup; nothing is left in it afterwards.
#[test]
fn delegated_own_cgroup_holds_each_jobs_limits() {
    let Some((tree, cg)) = v1_setup("delegated_own_cgroup_holds_each_jobs_limits", "deleg", true)
    else {
        return;
    };
    let policy = tree.small_policy();

    let k = &cg.doctor_cgroup(&tree);
    assert_eq!(k["pids"]["ok"], true, "{k}");
    assert_eq!(k["memory"]["ok"], true, "{k}");
    let words = k["per_job"].as_str().unwrap();
    assert!(
        words.starts_with(&format!(
            "per-job memory and process limits: enforced via the server's own delegated cgroup {} and {}",
            cg.pids.display(),
            cg.memory.display()
        )),
        "{words}"
    );

    // The job shows where it sits and the caps its cgroup holds.
    let script = "p=$(grep -E '(^|[:,])pids[:,]' /proc/self/cgroup | cut -d: -f3); \
                  m=$(grep -E '(^|[:,])memory[:,]' /proc/self/cgroup | cut -d: -f3); \
                  echo pids=$p; echo memory=$m; \
                  echo pids.max=$(cat /sys/fs/cgroup/pids$p/pids.max); \
                  echo memory.limit=$(cat /sys/fs/cgroup/memory$m/memory.limit_in_bytes)";
    let out = cg.run(&tree, &[], &policy, script);
    let text = stdout(&out);
    eprintln!("doctor: {words}\njob: {text}");
    assert!(out.status.success(), "{text}; stderr: {}", stderr(&out));
    let rel = |d: &Path, c: &str| {
        d.strip_prefix(Path::new("/sys/fs/cgroup").join(c))
            .unwrap()
            .display()
            .to_string()
    };
    for (c, d) in [("pids", &cg.pids), ("memory", &cg.memory)] {
        let under = format!("{c}=/{}/mcp-sandbox-repl/msr-", rel(d, c));
        assert!(
            text.contains(&under),
            "the job is not in a cgroup of its own under the server's: {under:?} in {text}"
        );
    }
    assert!(text.contains("pids.max=48\n"), "{text}");
    assert!(
        text.contains(&format!("memory.limit={}\n", 64u64 << 20)),
        "{text}"
    );

    // The memory cap is the cgroup's: the hog is SIGKILLed and the report says memory.
    let hog = "x=$(head -c 400000000 /dev/zero | tr '\\0' a); echo ${#x}";
    let out = cg.run(&tree, &["--json"], &policy, hog);
    let r = report(&out);
    eprintln!("hog: {r}");
    assert_eq!(r["limit"], "memory", "{r}; stderr: {}", stderr(&out));
    assert_eq!(r["signal"], "SIGKILL", "{r}");

    // Every job cgroup went with its job.
    for d in [&cg.pids, &cg.memory] {
        let left: Vec<PathBuf> = walk(&d.join("mcp-sandbox-repl"))
            .into_iter()
            .skip(1)
            .collect();
        assert!(left.is_empty(), "job cgroups left: {left:?}");
    }
}

/// `GET /readyz` of a server at `port` once it answers 200 (up to a generous guard).
fn readyz_when_ready(port: u16, server: &mut std::process::Child) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(server.try_wait().unwrap().is_none(), "the server exited");
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            let _ = s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let mut text = String::new();
            let _ = s.read_to_string(&mut text);
            if text.starts_with("HTTP/1.1 200") {
                return text;
            }
            assert!(
                text.is_empty() || text.contains("starting"),
                "not ready for another reason: {text}"
            );
        }
        assert!(Instant::now() < deadline, "/readyz never turned 200");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Not delegated (the server's cgroup is root's): `doctor` and `/readyz` say the per-job
/// limits are not enforced, why, what holds each job instead (rlimits), and the limits
/// the server's own cgroup sets for it and all its jobs together.
#[test]
fn undelegated_own_cgroup_is_named_with_what_holds_jobs_together() {
    let Some((tree, cg)) = v1_setup(
        "undelegated_own_cgroup_is_named_with_what_holds_jobs_together",
        "undeleg",
        false,
    ) else {
        return;
    };
    cg.limit(3 << 30, 2000);

    let k = &cg.doctor_cgroup(&tree);
    assert_eq!(k["pids"]["ok"], false, "{k}");
    let words = k["per_job"].as_str().unwrap();
    let expected_start = format!(
        "per-job memory and process limits: not enforced: cannot create {}/mcp-sandbox-repl",
        cg.pids.display()
    );
    assert!(words.starts_with(&expected_start), "{words}");
    assert!(words.contains("Permission denied"), "{words}");
    assert!(
        words.contains("instead: RLIMIT_AS per job for memory"),
        "{words}"
    );
    let together = format!(
        "together, the server and all its jobs stay within its own cgroup's memory ≤ 3 GiB (set at {}) and ≤ 2000 processes (set at {})",
        cg.memory.display(),
        cg.pids.display()
    );
    assert!(words.ends_with(&together), "{words}");

    // /readyz: ready (the policy runs on rlimits off root), and says so in the same words.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let ws = tree.ws();
    let mut server = cg
        .nobody(
            &tree,
            &[
                "--transport",
                "http",
                "--listen",
                &listen,
                "--no-auth",
                "--workspace",
                ws.to_str().unwrap(),
            ],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let answer = readyz_when_ready(port, &mut server);
    let _ = server.kill();
    let _ = server.wait();
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    eprintln!("/readyz: {answer}");
    assert!(
        body.starts_with("ready\nper-job memory and process limits: not enforced: cannot create"),
        "{answer}"
    );
    assert!(body.contains(&together), "{answer}");
}

/// Run `bin() args` as root in a private mount namespace whose only cgroup file system is
/// a cgroup2 mount at /sys/fs/cgroup, this process placed first in `own` (a directory
/// of that hierarchy, as the host mounts it at `host_mount`).
fn in_v2_only_view(own: &Path, args: &[&str], ws: &Path) -> Output {
    let mut cmd = Command::new(bin());
    cmd.args(args).current_dir(ws);
    let procs = own.join("cgroup.procs");
    // SAFETY: between fork and exec the child only writes one file and makes the
    // unshare/mount/umount2 system calls on static strings, in its own new mount
    // namespace.
    unsafe {
        cmd.pre_exec(move || {
            std::fs::write(&procs, "0")?;
            let (cg, cg2) = (c"/sys/fs/cgroup", c"cgroup2");
            let ok = unshare_private_mounts()
                && libc::umount2(cg.as_ptr(), libc::MNT_DETACH) == 0
                && libc::mount(cg2.as_ptr(), cg.as_ptr(), cg2.as_ptr(), 0, std::ptr::null()) == 0;
            if ok {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    cmd.output().unwrap()
}

/// cgroup v2 only: the server's cgroup is a fresh directory of a cgroup2 hierarchy. If
/// that hierarchy offers pids and memory, `doctor` moves itself into its leaf, enables
/// both for `mcp-sandbox-repl/` and says the limits are enforced there; if it does not
/// (this hybrid host: they are bound to v1), `doctor` and a refused `run` name the
/// controller it is not offered and the cgroup it looked in.
#[test]
fn v2_own_cgroup_is_used_or_its_missing_controller_named() {
    let Some(mount) = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.contains(" - cgroup2 "))
        .and_then(|l| l.split(' ').nth(4).map(PathBuf::from))
    else {
        panic!("this test needs a cgroup2 mount (every kernel since 4.5 has one)");
    };
    let own = mount.join(format!("msr-owncg-v2-{}", std::process::id()));
    std::fs::create_dir(&own).unwrap();
    let _cleanup = V2Dir(own.clone());
    let offered = std::fs::read_to_string(own.join("cgroup.controllers")).unwrap();
    let has = |c: &str| offered.split_whitespace().any(|o| o == c);
    let ws = TempDir::new("owncg-v2");
    let in_view = Path::new("/sys/fs/cgroup").join(own.file_name().unwrap());

    let out = in_v2_only_view(&own, &["doctor", "--json"], &ws.path);
    let k = &doctor_json(&out)["kernel"]["cgroup"];
    assert_eq!(k["version"], "v2", "{k}");
    assert_eq!(k["pids_dir"], in_view.display().to_string(), "{k}");
    let words = k["per_job"].as_str().unwrap();
    eprintln!("v2 doctor: {words}");
    if has("pids") && has("memory") {
        assert!(
            words.starts_with(
                "per-job memory and process limits: enforced via the server's own cgroup"
            ),
            "{words}"
        );
        let leaf = own.join("mcp-sandbox-repl.server");
        assert!(leaf.is_dir(), "the server did not move into its leaf");
        let enabled = std::fs::read_to_string(own.join("cgroup.subtree_control")).unwrap();
        assert!(
            enabled.contains("pids") && enabled.contains("memory"),
            "{enabled}"
        );
    } else {
        let missing = if has("pids") { "memory" } else { "pids" };
        let named = format!(
            "the cgroup v2 hierarchy offers no {missing} controller to the server's cgroup {}",
            in_view.display()
        );
        assert!(
            words.starts_with(&format!(
                "per-job memory and process limits: not enforced: {named}"
            )),
            "{words}"
        );
        let out = in_v2_only_view(
            &own,
            &["run", "--policy", "workspace-write", "--", "true"],
            &ws.path,
        );
        assert!(!out.status.success(), "ran as root without a pids cgroup");
        assert!(stderr(&out).contains(&named), "{}", stderr(&out));
    }
}

/// Removes a v2 test cgroup and whatever the server made in it (deepest first).
struct V2Dir(PathBuf);

impl Drop for V2Dir {
    fn drop(&mut self) {
        let mut dirs = walk(&self.0);
        dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for d in dirs {
            if let Ok(list) = std::fs::read_to_string(d.join("cgroup.procs")) {
                // Back to the root, not killed: a process of this test could be there.
                for pid in list.split_whitespace() {
                    let _ = std::fs::write(self.0.parent().unwrap().join("cgroup.procs"), pid);
                }
            }
            let _ = std::fs::remove_dir(&d);
        }
    }
}
