//! `run` through the real binary: file-system confinement, environment allow-list,
//! dropped privileges, descriptor hygiene, exit status passthrough, the JSON report and
//! failures reported in words. (Sockets, ptrace, mounts, symlinks and bombs are in the
//! escape suite.)

use std::os::fd::AsRawFd;

use crate::common::{
    TempDir, report, run_cmd, run_in, run_until_ready, sh, signal_run_and_check, stderr, stdout,
};

/// Try to create a file at each path; print WROTE or DENIED per path.
fn probe_writes(paths: &[String]) -> String {
    paths
        .iter()
        .map(|p| format!("(echo x > '{p}') 2>/dev/null && echo 'WROTE {p}' || echo 'DENIED {p}'; "))
        .collect()
}

/// workspace-write: the workspace and the private temp dir are writable; /etc, $HOME and
/// other directories are not, and nothing lands in them or in the host's /tmp or
/// /dev/shm (inside the sandbox /tmp is the job's private temp dir, /dev/shm a private
/// tmpfs).
#[test]
fn workspace_write_confines_writes() {
    let ws = TempDir::new("ww");
    let outside = TempDir::new("outside");
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let tag = format!("msr-probe-{}", std::process::id());
    let denied: Vec<String> = vec![
        format!("/etc/{tag}"),
        format!("{home}/{tag}"),
        format!("/tmp/{tag}"),
        format!("/dev/shm/{tag}"),
        format!("/var/tmp/{tag}"),
        outside.join(&tag).display().to_string(),
    ];
    let mut script = probe_writes(&[ws.join("inside").display().to_string()]);
    script.push_str("(echo x > \"$TMPDIR/t\") && echo 'WROTE tmpdir'; ");
    script.push_str(&probe_writes(&denied));
    let out = sh("workspace-write", &ws.path, &script);
    let text = stdout(&out);
    assert!(
        text.contains(&format!("WROTE {}", ws.join("inside").display())),
        "{text}"
    );
    assert!(text.contains("WROTE tmpdir"), "{text}");
    // /tmp and /dev/shm are the job's own (its temp dir, a private tmpfs): written there,
    // nothing reaches the host's.
    let private = [format!("/tmp/{tag}"), format!("/dev/shm/{tag}")];
    for p in &private {
        assert!(
            !std::path::Path::new(p).exists(),
            "{p} was created on the host"
        );
    }
    for p in denied.iter().filter(|p| !private.contains(p)) {
        assert!(
            text.contains(&format!("DENIED {p}")),
            "{p} not denied:\n{text}"
        );
        assert!(!std::path::Path::new(p).exists(), "{p} was created");
    }
    assert_eq!(std::fs::read_to_string(ws.join("inside")).unwrap(), "x\n");
}

/// read-only: the workspace is readable but neither writable nor chmod-able.
#[test]
fn read_only_denies_workspace_writes() {
    let ws = TempDir::new("ro");
    ws.write("data.txt", "hello\n");
    let script =
        "cat data.txt; echo x > new.txt || echo DENIED; chmod 600 data.txt || echo NOCHMOD";
    let out = sh("read-only", &ws.path, script);
    assert_eq!(stdout(&out), "hello\nDENIED\nNOCHMOD\n");
    assert!(!ws.join("new.txt").exists());
}

/// A directory the policy leaves out (here one under /var/tmp) cannot be listed or read.
#[test]
fn unlisted_directory_is_not_readable() {
    let ws = TempDir::new("rd");
    let secret_dir = TempDir::new("secret");
    secret_dir.write("secret.txt", "s3cret\n");
    let script = format!(
        "cat '{0}/secret.txt' || echo NOREAD; ls '{0}' || echo NOLIST",
        secret_dir.path.display()
    );
    let out = sh("workspace-write", &ws.path, &script);
    assert_eq!(stdout(&out), "NOREAD\nNOLIST\n", "stderr: {}", stderr(&out));
}

/// danger-full-access is the control: the same writes succeed, so the policy is the cause.
#[test]
fn danger_full_access_allows_outside_writes() {
    let ws = TempDir::new("dfa");
    let outside = TempDir::new("dfa-out");
    let target = outside.join("f").display().to_string();
    let out = sh(
        "danger-full-access",
        &ws.path,
        &probe_writes(std::slice::from_ref(&target)),
    );
    assert_eq!(stdout(&out), format!("WROTE {target}\n"));
    let out = sh(
        "danger-full-access",
        &ws.path,
        "grep CapEff /proc/self/status",
    );
    assert_ne!(stdout(&out).trim(), "CapEff:\t0000000000000000");
}

/// Only allow-listed variables reach the child; HOME and TMPDIR point at the private tmp.
#[test]
fn environment_is_an_allow_list() {
    let ws = TempDir::new("env");
    let out = run_cmd("workspace-write", &ws.path, false, &["env"])
        .env("MSR_TEST_SECRET", "hunter2")
        .env("AWS_SECRET_ACCESS_KEY", "hunter3")
        .output()
        .unwrap();
    let env = stdout(&out);
    assert!(
        !env.contains("hunter2") && !env.contains("hunter3"),
        "{env}"
    );
    assert!(env.lines().any(|l| l.starts_with("PATH=")), "{env}");
    let home = env.lines().find_map(|l| l.strip_prefix("HOME=")).unwrap();
    let tmpdir = env.lines().find_map(|l| l.strip_prefix("TMPDIR=")).unwrap();
    assert_eq!(home, tmpdir);
    assert_ne!(home, std::env::var("HOME").unwrap_or_default());
    // The private tmp dir is removed after the run.
    assert!(
        !std::path::Path::new(tmpdir).exists(),
        "{tmpdir} left behind"
    );
}

/// With `tmp_size` (workspace-write), `{tmp}` is a tmpfs made in the view alone: no host
/// directory exists for it even while the command runs, yet it is writable at its own
/// path and at /tmp, and a planted host directory of another job's name is not it.
#[test]
fn tmpfs_tmp_exists_in_the_view_only() {
    use std::io::{BufRead, Write};
    let ws = TempDir::new("viewtmp");
    let script = "echo \"$TMPDIR\"; echo data > \"$TMPDIR/f\" && cat /tmp/f; \
                  stat -f -c %T \"$TMPDIR\"; read _; echo done";
    let mut child = run_cmd("workspace-write", &ws.path, false, &["sh", "-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let tmpdir = lines.next().unwrap().unwrap();
    assert!(
        tmpdir.starts_with('/') && tmpdir.contains("mcp-sandbox-run-"),
        "{tmpdir}"
    );
    assert_eq!(lines.next().unwrap().unwrap(), "data");
    assert_eq!(lines.next().unwrap().unwrap(), "tmpfs");
    // The command is still running (it waits for a line): nothing of it on the host.
    assert!(
        !std::path::Path::new(&tmpdir).exists(),
        "{tmpdir} exists on the host"
    );
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "done");
    assert!(child.wait().unwrap().success());
}

/// No capabilities, no_new_privs set, a seccomp filter installed.
#[test]
fn privileges_are_dropped() {
    let ws = TempDir::new("caps");
    for policy in ["workspace-write", "read-only", "ci"] {
        let out = sh(
            policy,
            &ws.path,
            "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status",
        );
        let text = stdout(&out);
        for line in [
            "CapInh:\t0000000000000000",
            "CapPrm:\t0000000000000000",
            "CapEff:\t0000000000000000",
            "CapBnd:\t0000000000000000",
            "CapAmb:\t0000000000000000",
            "NoNewPrivs:\t1",
            "Seccomp:\t2",
        ] {
            assert!(text.contains(line), "{policy}: missing {line:?} in\n{text}");
        }
    }
}

/// A descriptor the parent holds without close-on-exec does not reach the child.
#[test]
fn parent_descriptors_do_not_leak() {
    let ws = TempDir::new("fds");
    let file = std::fs::File::open("/etc/hostname").unwrap();
    // SAFETY: dup2 onto a high, unused descriptor number; the copy has no CLOEXEC.
    let leaked = unsafe { libc::dup2(file.as_raw_fd(), 77) };
    assert_eq!(leaked, 77);
    let out = sh("workspace-write", &ws.path, "ls /proc/$$/fd");
    // SAFETY: closing the descriptor we created above.
    unsafe { libc::close(77) };
    let fds: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    assert!(!fds.contains(&"77".to_string()), "fd 77 leaked: {fds:?}");
    assert!(
        fds.iter().all(|f| f.parse::<i32>().is_ok_and(|n| n <= 3)),
        "{fds:?}"
    );
}

/// Exit codes pass through; a signal becomes 128 + N and is named in the report.
#[test]
fn exit_status_passthrough() {
    let ws = TempDir::new("exit");
    let out = sh("workspace-write", &ws.path, "exit 7");
    assert_eq!(out.status.code(), Some(7));
    let out = run_in(
        "workspace-write",
        &ws.path,
        true,
        &["sh", "-c", "kill -TERM $$"],
    );
    assert_eq!(out.status.code(), Some(143));
    let r = report(&out);
    assert_eq!(r["signal"], "SIGTERM");
    assert_eq!(r["exit_code"], serde_json::Value::Null);
}

/// When `run` returns nothing of the command is left: no job cgroup (removed at once,
/// its emptiness being the proof that the command is gone), and with a background
/// process left behind, neither that process nor its cgroup — while the exit status is
/// still the command's own.
#[test]
fn nothing_of_the_command_outlives_run() {
    let ws = TempDir::new("run-leaves-nothing");
    let out = sh(
        "workspace-write",
        &ws.path,
        "cat /proc/self/cgroup > cgroup",
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    crate::common::assert_job_cgroups_gone(&ws.join("cgroup"));
    let mark = crate::common::unique_marker("run-bg");
    let script = format!("export {mark}; cat /proc/self/cgroup > cgroup; sleep 100 & exit 3");
    let out = sh("workspace-write", &ws.path, &script);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let left = crate::common::pids_with_env(&mark);
    assert!(left.is_empty(), "{left:?} outlived run");
    crate::common::assert_job_cgroups_gone(&ws.join("cgroup"));
}

/// `run` hands no process to whoever inherits its orphans: when it exits, its command's
/// init has been reaped, also when `run`'s parent is a subreaper that never reaps (a
/// container's `tail -f /dev/null` or `sleep infinity` as pid 1), where a left init
/// would stay a zombie — one per `run`. Here that parent is a Python subreaper that waits
/// for `run` alone and then lists the children it inherited.
#[test]
fn run_leaves_no_orphan_to_its_parent() {
    let ws = TempDir::new("run-no-orphan");
    let script = r#"
import ctypes, os, subprocess, sys
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
for command in (["/bin/true"], ["sh", "-c", "sleep 600 & exit 3"]):
    subprocess.run([sys.argv[1], "run", "--workspace", sys.argv[2], "--", *command], check=False)
me, inherited = str(os.getpid()), []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        continue
    if fields[1] == me:
        inherited.append(f"{pid} ({fields[0]})")
print(" ".join(inherited))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(crate::common::bin())
        .arg(&ws.path)
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).trim(),
        "",
        "processes `run` left to its parent (pid, state)"
    );
}

/// Everything the command writes to stderr reaches ours (through `run`'s pipe, read to
/// its end once the command has ended), also far more than a pipe holds, written just
/// before it exits; and the denial explanation still follows.
#[test]
fn all_of_stderr_passes_before_run_returns() {
    let ws = TempDir::new("run-stderr-all");
    let out = sh(
        "workspace-write",
        &ws.path,
        "head -c 300000 /dev/zero | tr '\\0' x >&2; echo x > /etc/x",
    );
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.starts_with(&"x".repeat(300_000)),
        "{}",
        &err[..200.min(err.len())]
    );
    assert!(
        err.contains("blocked by policy workspace-write: write to /etc/x"),
        "{}",
        &err[300_000.min(err.len())..]
    );
}

/// The --json report has every field, after the command's own output.
#[test]
fn json_report_fields() {
    let ws = TempDir::new("json");
    let out = run_in("ci", &ws.path, true, &["sh", "-c", "echo hello"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).starts_with("hello\n"));
    let r = report(&out);
    let keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
    for key in [
        "exit_code",
        "signal",
        "wall_ms",
        "user_cpu_ms",
        "system_cpu_ms",
        "peak_rss_bytes",
        "limit",
        "policy",
        "denied",
        "unenforced",
    ] {
        assert!(keys.contains(&key), "missing {key} in {r}");
    }
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["policy"], "ci");
    assert_eq!(r["limit"], serde_json::Value::Null);
    assert!(r["peak_rss_bytes"].as_u64().unwrap() > 100_000, "{r}");
}

/// The report's CPU time counts the job's background work too: an orphan that burned at
/// least 0.3 s of CPU and was reaped by the namespace's init before the command ended
/// (the command waits until it is gone) is in `user_cpu_ms + system_cpu_ms`, although the
/// command itself only slept. Fails when the init reports the target's own use alone.
#[test]
fn json_report_counts_the_cpu_of_orphans_reaped_before_the_end() {
    let ws = TempDir::new("orphancpu");
    // The real interpreter (`python3` on PATH may be a pyenv shim or a venv's).
    let py = std::process::Command::new("python3")
        .args(["-c", crate::common::BASE_EXECUTABLE])
        .output()
        .unwrap();
    let python = String::from_utf8(py.stdout).unwrap().trim().to_string();
    let script = format!(
        "( {python} -c 'import time\nwhile time.process_time() < 0.3: pass' & echo $! > pid ); \
         p=$(cat pid); while kill -0 $p 2>/dev/null; do sleep 0.05; done"
    );
    let out = run_in("workspace-write", &ws.path, true, &["sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let r = report(&out);
    let cpu = r["user_cpu_ms"].as_u64().unwrap() + r["system_cpu_ms"].as_u64().unwrap();
    assert!(cpu >= 300, "the orphan's 0.3 s of CPU is missing: {r}");
}

/// A denied write is explained in words after the command's own error: on stderr in plain
/// mode, and under `denied` (not `unenforced`) in the JSON report; a command that
/// succeeds reports no denial.
#[test]
fn denials_are_reported_in_words() {
    let ws = TempDir::new("denied");
    let cmd = ["sh", "-c", "echo x > /etc/x"];
    let out = run_in("workspace-write", &ws.path, false, &cmd);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("Read-only file system"), "{err}");
    assert!(
        err.contains("blocked by policy workspace-write: write to /etc/x"),
        "{err}"
    );
    assert!(!std::path::Path::new("/etc/x").exists());
    let out = run_in("workspace-write", &ws.path, true, &cmd);
    let r = report(&out);
    let denied = r["denied"].as_array().unwrap();
    assert_eq!(denied.len(), 1, "{r}");
    assert!(
        denied[0]
            .as_str()
            .unwrap()
            .starts_with("blocked by policy workspace-write: write to /etc/x"),
        "{r}"
    );
    assert!(r["unenforced"].is_array(), "{r}");
    let out = run_in(
        "workspace-write",
        &ws.path,
        true,
        &["sh", "-c", "echo x > ok"],
    );
    assert_eq!(report(&out)["denied"].as_array().unwrap().len(), 0);
}

/// stdin reaches the command; stdout and stderr are passed through separately.
#[test]
fn stdio_passthrough() {
    use std::io::Write;
    let ws = TempDir::new("stdio");
    let mut child = run_cmd(
        "workspace-write",
        &ws.path,
        false,
        &["sh", "-c", "cat; echo err >&2"],
    )
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"piped in\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(stdout(&out), "piped in\n");
    assert_eq!(stderr(&out), "err\n");
}

/// Failures before exec come back in words, with a non-zero exit.
#[test]
fn setup_failures_are_reported_in_words() {
    let ws = TempDir::new("setup");
    let out = run_in("workspace-write", &ws.path, false, &["no-such-command-xyz"]);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(
        err.contains("sandbox setup failed: command not found: \"no-such-command-xyz\""),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");

    // A program outside the policy's execute set is refused by Landlock, in words.
    let policy = ws.write(
        "noexec.toml",
        "[filesystem]\nread = [\"/usr\", \"/lib\", \"/lib64\", \"/etc\", \"{workspace}\"]\n\
         execute = [\"/usr\", \"/lib\", \"/lib64\"]\nwrite = [\"{tmp}\"]\n",
    );
    std::fs::copy("/bin/true", ws.join("mytrue")).unwrap();
    let out = run_in(policy.to_str().unwrap(), &ws.path, false, &["./mytrue"]);
    let err = stderr(&out);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        err.contains("cannot execute \"./mytrue\"") && err.contains("blocked by policy noexec"),
        "{err}"
    );
}

/// `run` started by `route` (the hidden `--spawn-route`) under `policy` in `ws`.
fn run_cmd_by(
    route: &str,
    policy: &str,
    ws: &std::path::Path,
    args: &[&str],
) -> std::process::Command {
    let mut cmd = std::process::Command::new(crate::common::bin());
    cmd.args([
        "run",
        "--spawn-route",
        route,
        "--policy",
        policy,
        "--workspace",
    ])
    .arg(ws)
    .arg("--")
    .args(args);
    cmd
}

/// The server's paths: a fork of its zygote, and the fallback, the launcher re-executed as
/// a separate program (a multi-threaded parent cannot apply the sandbox after fork). Same
/// confinement, same words on failure.
#[test]
fn reexec_launcher_path_confines_too() {
    for route in ["zygote", "reexec"] {
        let ws = TempDir::new("reexec");
        let script = "echo ok > inside; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; \
                      (echo x > /etc/msr-reexec) 2>/dev/null || echo DENIED";
        let out = run_cmd_by(route, "workspace-write", &ws.path, &["sh", "-c", script])
            .output()
            .unwrap();
        assert_eq!(
            stdout(&out),
            "CapEff:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\nDENIED\n",
            "route {route}; stderr: {}",
            stderr(&out)
        );
        assert!(ws.join("inside").exists());
        let out = run_cmd_by(route, "workspace-write", &ws.path, &["no-such-command-xyz"])
            .output()
            .unwrap();
        assert!(
            stderr(&out).contains("command not found: \"no-such-command-xyz\""),
            "route {route}: {}",
            stderr(&out)
        );
    }
}

/// SIGTERM sent to `run` (a CI timeout, Ctrl-C) reaches the sandboxed command, which
/// leads its own session and would otherwise never see it.
#[test]
fn terminal_signals_are_forwarded_to_the_command() {
    let ws = TempDir::new("forward");
    let (child, out) = run_until_ready(&ws.path);
    signal_run_and_check(child, out, libc::SIGTERM, "SIGTERM");
}

/// The binary is linked statically (.cargo/config.toml: a static PIE on glibc): it asks
/// for no program interpreter, so no start pays the dynamic loader (docs/benchmarks.md).
/// Fails for a dynamically linked build — e.g. one made with `RUSTFLAGS` set in the
/// environment, which replaces the config's flags.
#[cfg(target_env = "gnu")]
#[test]
fn the_binary_is_linked_statically() {
    let elf = std::fs::read(crate::common::bin()).unwrap();
    assert_eq!(&elf[..4], b"\x7fELF");
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    let types: Vec<u32> = (0..phnum)
        .map(|i| {
            let o = phoff + i * phentsize;
            u32::from_le_bytes(elf[o..o + 4].try_into().unwrap())
        })
        .collect();
    const PT_INTERP: u32 = 3;
    assert!(
        !types.contains(&PT_INTERP),
        "the binary is dynamically linked (it names a program interpreter): build it \
         without RUSTFLAGS in the environment, which replaces .cargo/config.toml's flags"
    );
    // Still position-independent: its load address stays random (ELF type ET_DYN).
    assert_eq!(u16_at(0x10), 3, "not a PIE");
}
