//! Without root: the real binary run as uid 65534 (`setpriv`), no capability, no cgroup it
//! may create. Where the kernel lets an unprivileged process make a user namespace, the
//! launcher makes one of its own (mapping only uid 65534) and builds the job's PID
//! namespace, mount view and network namespace inside it, as root builds them; Landlock,
//! seccomp, rlimits and the capability drop are unchanged. Skipped, saying why, where
//! unprivileged user namespaces are disabled.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

use crate::common::{TempDir, bin, stderr, stdout};

const NOBODY: [&str; 4] = ["--reuid=65534", "--regid=65534", "--clear-groups", "--"];
const NO_SYS_ADMIN: [&str; 3] = ["--inh-caps=-sys_admin", "--bounding-set=-sys_admin", "--"];

/// Why this host cannot run the test (`None`: it can): no `setpriv`, or unprivileged user
/// namespaces disabled (`unshare --user` as uid 65534 refused).
fn userns_unavailable() -> Option<String> {
    let tried = Command::new("setpriv")
        .args(NOBODY)
        .args(["unshare", "--user", "--map-current-user", "true"])
        .output();
    match tried {
        Err(e) => Some(format!("setpriv (util-linux) cannot run: {e}")),
        Ok(o) if !o.status.success() => Some(format!(
            "unprivileged user namespaces are disabled here (uid 65534: unshare --user: {}; \
             see the sysctls kernel.unprivileged_userns_clone, user.max_user_namespaces, \
             kernel.apparmor_restrict_unprivileged_userns)",
            stderr(&o).trim()
        )),
        Ok(_) => None,
    }
}

/// A directory tree uid 65534 may write: `ws` (the workspace), `state`, `home`, and
/// `outside`, writable by anyone on the host (so only the sandbox keeps the job out).
struct Tree {
    root: TempDir,
}

impl Tree {
    fn new() -> Tree {
        let root = TempDir::new("userns");
        for d in ["", "ws", "state", "home", "outside"] {
            let p = root.join(d);
            std::fs::create_dir_all(&p).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        Tree { root }
    }

    fn ws(&self) -> std::path::PathBuf {
        self.root.join("ws")
    }

    /// The binary under `setpriv` with `setpriv_args`, with this tree's state dir and home.
    fn setpriv(&self, setpriv_args: &[&str], args: &[&str]) -> Output {
        Command::new("setpriv")
            .args(setpriv_args)
            .arg(bin())
            .args(args)
            .current_dir(self.ws())
            .env("HOME", self.root.join("home"))
            .env("MCP_SANDBOX_STATE_DIR", self.root.join("state"))
            .env_remove("MCP_SANDBOX_WORKSPACE")
            .output()
            .unwrap()
    }

    /// The binary as uid 65534, with this tree's state dir and home.
    fn nobody(&self, args: &[&str]) -> Output {
        self.setpriv(&NOBODY, args)
    }

    /// The binary as root with CAP_SYS_ADMIN dropped from every set (a container's
    /// default capabilities), with this tree's state dir and home.
    fn root_without_sys_admin(&self, args: &[&str]) -> Output {
        self.setpriv(&NO_SYS_ADMIN, args)
    }

    fn run(&self, policy: &str, script: &str) -> Output {
        let ws = self.ws();
        let ws = ws.to_str().unwrap();
        self.nobody(&[
            "run",
            "--policy",
            policy,
            "--workspace",
            ws,
            "--",
            "sh",
            "-c",
            script,
        ])
    }
}

/// The stdout of `out`, which must have succeeded.
fn succeeded(out: &Output) -> String {
    let text = stdout(out);
    assert!(out.status.success(), "{text}\n{}", stderr(out));
    text
}

/// The value of the `key value` line of `out`'s stdout.
fn key_line(out: &Output, key: &str) -> String {
    let text = stdout(out);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key} ")))
        .unwrap_or_else(|| panic!("no `{key}` line in:\n{text}\n{}", stderr(out)))
        .trim()
        .to_string()
}

/// `doctor --json`'s report in `out`, and its `workspace-write` policy entry.
fn doctor_workspace_write(out: &Output) -> (serde_json::Value, serde_json::Value) {
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", stdout(out), stderr(out)));
    let ww = report["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "workspace-write")
        .unwrap()
        .clone();
    (report, ww)
}

fn host_link(ns: &str) -> String {
    std::fs::read_link(format!("/proc/self/ns/{ns}"))
        .unwrap()
        .display()
        .to_string()
}

/// `workspace-write` as uid 65534: the job runs, in a user namespace that maps only its
/// own uid, as pid 2 of its own PID namespace (its /proc lists no host process), in a
/// network namespace of its own with no interface but `lo`, with writes outside the
/// workspace refused (a host directory anyone may write included), no capability left
/// and the escape syscalls still refused.
#[test]
fn unprivileged_workspace_write_runs_confined_in_a_user_namespace() {
    if let Some(why) = userns_unavailable() {
        eprintln!("SKIPPED unprivileged_workspace_write_runs_confined_in_a_user_namespace: {why}");
        return;
    }
    let tree = Tree::new();
    let outside = tree.root.join("outside").join("escaped");
    let script = format!(
        "echo pid $$; \
         echo uidmap $(cat /proc/self/uid_map); \
         echo userns $(readlink /proc/self/ns/user); \
         echo netns $(readlink /proc/self/ns/net); \
         echo procs $(ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '); \
         echo ifaces $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ' '); \
         echo x > inside && echo WROTE inside; \
         (echo x > '{outside}') 2>/dev/null && echo WROTE outside || echo DENIED outside; \
         (echo x > /var/tmp/msr-userns-{pid}) 2>/dev/null && echo WROTE vartmp || echo DENIED vartmp; \
         echo capeff $(grep CapEff /proc/self/status | cut -f2); \
         unshare --user true 2>/dev/null && echo UNSHARED || echo NO-UNSHARE; \
         python3 -c 'import socket; socket.socket(socket.AF_INET)' 2>/dev/null && echo INET || echo NO-INET",
        outside = outside.display(),
        pid = std::process::id(),
    );
    let out = tree.run("workspace-write", &script);
    let text = succeeded(&out);
    let line = |key: &str| key_line(&out, key);
    assert_eq!(line("pid"), "2", "{text}");
    assert_eq!(
        line("uidmap").split_whitespace().collect::<Vec<_>>(),
        ["65534", "65534", "1"],
        "{text}"
    );
    assert_ne!(
        line("userns"),
        host_link("user"),
        "no user namespace of its own"
    );
    assert_ne!(
        line("netns"),
        host_link("net"),
        "the host's network namespace"
    );
    let procs: Vec<u32> = line("procs")
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(
        !procs.is_empty() && procs.iter().all(|&p| p < 10),
        "host processes visible: {procs:?}"
    );
    assert_eq!(line("ifaces"), "lo", "{text}");
    assert!(text.contains("WROTE inside"), "{text}");
    assert_eq!(
        std::fs::read_to_string(tree.ws().join("inside")).unwrap(),
        "x\n"
    );
    assert!(text.contains("DENIED outside"), "{text}");
    assert!(!outside.exists(), "wrote outside the workspace");
    assert!(text.contains("DENIED vartmp"), "{text}");
    assert_eq!(line("capeff"), "0000000000000000", "{text}");
    assert!(text.contains("NO-UNSHARE"), "{text}");
    assert!(text.contains("NO-INET"), "{text}");
}

/// A `loopback` policy as uid 65534: the job's own `lo` works, a listener on the host's
/// loopback is out of reach (the network namespace, not only seccomp, keeps it out).
#[test]
fn unprivileged_loopback_job_cannot_reach_the_host() {
    if let Some(why) = userns_unavailable() {
        eprintln!("SKIPPED unprivileged_loopback_job_cannot_reach_the_host: {why}");
        return;
    }
    let tree = Tree::new();
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host.local_addr().unwrap().port();
    let policy = tree.root.join("lo.toml");
    std::fs::write(
        &policy,
        "kernel_support = \"required\"\n\
         [filesystem]\n\
         read = [\"/usr\", \"/bin\", \"/lib\", \"/lib64\", \"/etc\", \"/proc\", \"/dev/urandom\"]\n\
         write = [\"{workspace}\", \"{tmp}\", \"/dev/null\"]\n\
         execute = [\"/usr\", \"/bin\", \"/lib\", \"/lib64\"]\n\
         [network]\nmode = \"loopback\"\n\
         [process]\ndrop_capabilities = true\nsyscall_filter = true\n",
    )
    .unwrap();
    std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o644)).unwrap();
    let probe = format!(
        "import socket\n\
         own = socket.socket(); own.bind(('127.0.0.1', 0)); own.listen()\n\
         socket.create_connection(own.getsockname(), timeout=5).close(); print('own-lo')\n\
         try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5); print('HOST-REACHED')\n\
         except OSError as e:\n    print('host-unreachable', e)\n"
    );
    let out = tree.run(
        policy.to_str().unwrap(),
        &format!("python3 -c \"{}\"", probe.replace('"', "\\\"")),
    );
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(text.contains("own-lo"), "{text}");
    assert!(
        text.contains("host-unreachable"),
        "{text}\n{}",
        stderr(&out)
    );
    drop(host);
}

/// `doctor` as uid 65534 reports the namespaces as made in a user namespace and
/// `workspace-write` as enforced there: it no longer refuses to start.
#[test]
fn unprivileged_doctor_reports_the_user_namespace() {
    if let Some(why) = userns_unavailable() {
        eprintln!("SKIPPED unprivileged_doctor_reports_the_user_namespace: {why}");
        return;
    }
    let tree = Tree::new();
    let out = tree.nobody(&["doctor", "--json"]);
    let (report, ww) = doctor_workspace_write(&out);
    assert_eq!(
        report["kernel"]["namespaces"]["in_user_namespace"], true,
        "{report}"
    );
    assert_eq!(ww["refuses_to_start"], false, "{ww}");
    let how = |prefix: &str| -> serde_json::Value {
        ww["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["how"].as_str().unwrap().starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} item: {ww}"))
            .clone()
    };
    for prefix in [
        "PID namespace per job",
        "private mount namespace",
        "empty network namespace",
        "procfs hidepid",
    ] {
        let item = how(prefix);
        assert_eq!(item["enforced"], true, "{item}");
        assert!(
            item["how"]
                .as_str()
                .unwrap()
                .contains("in a user namespace"),
            "{item}"
        );
    }
}

/// Root without CAP_SYS_ADMIN (podman's default capabilities): the launcher takes the
/// user-namespace path as uid 65534 does, mapping uid 0 to itself. `doctor` says so and
/// finds `workspace-write` enforced; `run --policy workspace-write` runs the job as pid 2
/// of its own PID namespace, with only `lo`, no capability, writes outside the workspace
/// refused and the escape syscalls still refused. Before, both refused: "needs
/// CAP_SYS_ADMIN: run the server as root".
#[test]
fn root_without_cap_sys_admin_runs_workspace_write_in_a_user_namespace() {
    let tried = Command::new("setpriv")
        .args(NO_SYS_ADMIN)
        .args(["unshare", "--user", "--map-root-user", "true"])
        .output();
    match tried {
        Ok(o) if o.status.success() => {}
        other => {
            eprintln!(
                "SKIPPED root_without_cap_sys_admin_runs_workspace_write_in_a_user_namespace: \
                 no user namespace without CAP_SYS_ADMIN here: {other:?}"
            );
            return;
        }
    }
    let tree = Tree::new();
    let out = tree.root_without_sys_admin(&["doctor", "--json"]);
    let (report, ww) = doctor_workspace_write(&out);
    assert_eq!(report["kernel"]["is_root"], true, "{report}");
    assert_eq!(
        report["kernel"]["namespaces"]["in_user_namespace"], true,
        "{report}"
    );
    assert_eq!(ww["refuses_to_start"], false, "{ww}");
    let text = stdout(&tree.root_without_sys_admin(&["doctor"]));
    assert!(
        text.contains("mapping only uid 0 to itself: root, no CAP_SYS_ADMIN"),
        "{text}"
    );

    let ws = tree.ws();
    let outside = tree.root.join("outside").join("escaped");
    let script = format!(
        "echo pid $$; \
         echo uidmap $(cat /proc/self/uid_map); \
         echo ifaces $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ' '); \
         echo x > inside && echo WROTE inside; \
         (echo x > '{outside}') 2>/dev/null && echo WROTE outside || echo DENIED outside; \
         echo capeff $(grep CapEff /proc/self/status | cut -f2); \
         unshare --user true 2>/dev/null && echo UNSHARED || echo NO-UNSHARE",
        outside = outside.display(),
    );
    let out = tree.root_without_sys_admin(&[
        "run",
        "--policy",
        "workspace-write",
        "--workspace",
        ws.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let text = succeeded(&out);
    let line = |key: &str| key_line(&out, key);
    assert_eq!(line("pid"), "2", "{text}");
    assert_eq!(
        line("uidmap").split_whitespace().collect::<Vec<_>>(),
        ["0", "0", "1"],
        "{text}"
    );
    assert_eq!(line("ifaces"), "lo", "{text}");
    assert!(text.contains("WROTE inside"), "{text}");
    assert!(text.contains("DENIED outside"), "{text}");
    assert!(!outside.exists(), "wrote outside the workspace");
    assert_eq!(line("capeff"), "0000000000000000", "{text}");
    assert!(text.contains("NO-UNSHARE"), "{text}");
}
