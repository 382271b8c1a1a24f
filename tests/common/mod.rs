//! Test helpers: the built binary, throwaway workspaces, running `run` and parsing its
//! `--json` report.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// Python code printing the interpreter a job can run: `python3` on PATH may be a venv's
/// (`tests/run` from an activated venv), whose `bin/` a job's view does not hold; its base
/// interpreter is the real one (for a pyenv shim, the version the shim runs).
pub(crate) const BASE_EXECUTABLE: &str =
    "import sys; print(getattr(sys, '_base_executable', sys.executable))";

/// Path of the binary under test.
pub(crate) fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mcp-sandbox-repl"))
}

/// The sandbox runtime the suite's in-process spawns use: the server's (the zygote,
/// resources made ahead of need), re-executing the real binary (this test binary is not
/// it). One for the whole test binary, as a server has one.
pub(crate) fn runtime() -> mcp_sandbox_repl::sandbox::Runtime {
    use mcp_sandbox_repl::sandbox::{Runtime, RuntimeConfig};
    static RUNTIME: std::sync::OnceLock<Runtime> = std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            // As a server does at exit: what was made ahead (job cgroups) is released
            // when the test process ends; a static is never dropped, and each run of the
            // suite left ~100 cgroup directories behind.
            extern "C" fn release() {
                if let Some(rt) = RUNTIME.get() {
                    rt.release_prepared();
                }
            }
            // SAFETY: registers a plain function to run at exit.
            unsafe { libc::atexit(release) };
            Runtime::new(RuntimeConfig {
                launcher_exe: bin(),
                ..RuntimeConfig::server()
            })
        })
        .clone()
}

/// `policy` (a name or a file) resolved for a job in `ws` (its `{tmp}` is `ws/.tmp`), for
/// spawning with [`runtime`] from this multi-threaded test binary.
pub(crate) fn resolved_in(
    ws: &TempDir,
    policy: &str,
) -> std::sync::Arc<mcp_sandbox_repl::sandbox::ResolvedPolicy> {
    use mcp_sandbox_repl::sandbox::{Placeholders, Policy};
    let tmp = ws.join(".tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let placeholders = Placeholders {
        workspace: ws.path.clone(),
        tmp,
        ..Default::default()
    };
    std::sync::Arc::new(
        Policy::load(policy)
            .unwrap()
            .resolve(&placeholders)
            .unwrap(),
    )
}

/// A fresh directory removed on drop (also while a failed test unwinds), by default
/// under /var/tmp/msr-tests: outside /tmp, because the mount view puts each job's private
/// temp dir at /tmp, and outside any other test's workspace.
pub(crate) struct TempDir {
    /// Canonical, so that comparisons with what the child sees hold.
    pub path: PathBuf,
    /// Removes the directory when dropped.
    _guard: tempfile::TempDir,
}

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        let base = Path::new("/var/tmp/msr-tests");
        std::fs::create_dir_all(base).unwrap();
        TempDir::new_in(base, tag)
    }

    /// A fresh directory `msr-test-<tag>-XXXXXX` under `base`, for a test whose directory
    /// must stay where it always was (e.g. the system temp dir).
    pub(crate) fn new_in(base: &Path, tag: &str) -> TempDir {
        let guard = tempfile::Builder::new()
            .prefix(&format!("msr-test-{tag}-"))
            .tempdir_in(base.canonicalize().unwrap())
            .unwrap();
        TempDir {
            path: guard.path().to_path_buf(),
            _guard: guard,
        }
    }

    /// [`TempDir::new_in`] the system temp dir (`$TMPDIR` or /tmp).
    pub(crate) fn in_system_tmp(tag: &str) -> TempDir {
        TempDir::new_in(&std::env::temp_dir(), tag)
    }

    pub(crate) fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.path.join(p)
    }

    /// Write a file inside the directory and return its path.
    pub(crate) fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

/// `mcp-sandbox-repl run --policy POLICY --workspace WS [--json] -- ARGS...`
pub(crate) fn run_in(policy: &str, ws: &Path, json: bool, args: &[&str]) -> Output {
    run_cmd(policy, ws, json, args).output().unwrap()
}

/// The `Command` for `run`, to add environment variables before starting it.
pub(crate) fn run_cmd(policy: &str, ws: &Path, json: bool, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin());
    cmd.arg("run")
        .arg("--policy")
        .arg(policy)
        .arg("--workspace")
        .arg(ws);
    if json {
        cmd.arg("--json");
    }
    cmd.arg("--").args(args.iter().map(OsStr::new));
    cmd
}

/// `run --json` under workspace-write in `ws` of a command that prints `ready` and sleeps,
/// once it has printed it: the child and the rest of its stdout.
pub(crate) fn run_until_ready(
    ws: &Path,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
) {
    let mut run = run_cmd(
        "workspace-write",
        ws,
        true,
        &["sh", "-c", "echo ready; exec sleep 600"],
    )
    .stdout(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let mut out = std::io::BufReader::new(run.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line, "ready\n");
    (run, out)
}

/// Send `signal` (named `name`) to `run` (from [`run_until_ready`]): it must end with exit
/// status 128 + `signal` and a JSON report naming the signal.
pub(crate) fn signal_run_and_check(
    mut run: std::process::Child,
    mut out: std::io::BufReader<std::process::ChildStdout>,
    signal: i32,
    name: &str,
) {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(run.id() as i32, signal) };
    let status = run.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert_eq!(status.code(), Some(128 + signal), "{rest}");
    let r: serde_json::Value = serde_json::from_str(rest.trim()).unwrap();
    assert_eq!(r["signal"], name);
}

/// Move the calling process into a mount namespace of its own with every mount private
/// to it, so that what it mounts next no other process sees. False, with errno set, if a
/// step failed. Only system calls on static strings: fit for a `pre_exec` closure.
///
/// # Safety
/// Only between fork and exec (a `pre_exec` closure): it changes the mount namespace of
/// the calling process.
pub(crate) unsafe fn unshare_private_mounts() -> bool {
    let none = std::ptr::null();
    // SAFETY: unshare(2) and mount(2) with a static string and null pointers, in the
    // child the caller forked.
    unsafe {
        libc::unshare(libc::CLONE_NEWNS) == 0
            && libc::mount(
                none,
                c"/".as_ptr(),
                none,
                libc::MS_REC | libc::MS_PRIVATE,
                none.cast(),
            ) == 0
    }
}

/// `sh -c SCRIPT` under `policy` in `ws`.
pub(crate) fn sh(policy: &str, ws: &Path, script: &str) -> Output {
    run_in(policy, ws, false, &["sh", "-c", script])
}

pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The `--json` report: the last line of stdout.
pub(crate) fn report(o: &Output) -> serde_json::Value {
    let out = stdout(o);
    let line = out.lines().last().unwrap_or_default();
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("no JSON report ({e}); stdout: {out}; stderr: {}", stderr(o)))
}

/// Host pids of live (not zombie) processes whose environment holds `var` (`NAME=value`).
/// Jobs run in PID namespaces of their own, so `$$` or `os.getpid()` inside a job is not
/// the pid seen here: tests mark a job's processes with a variable and find them so.
pub(crate) fn pids_with_env(var: &str) -> Vec<u32> {
    let needle = var.as_bytes();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        panic!("/proc is not readable")
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let live = stat_fields(*pid).is_some_and(|f| f[0] != "Z" && f[0] != "X");
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            live && env.split(|&b| b == 0).any(|kv| kv == needle)
        })
        .collect()
}

/// Like [`pids_with_env`], waiting (up to 30 s, a bound and not a measurement) for one.
pub(crate) fn wait_for_pids_with_env(var: &str) -> Vec<u32> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let pids = pids_with_env(var);
        if !pids.is_empty() {
            return pids;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no process with {var} appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Fields of /proc/PID/stat after the command name: state ppid pgrp session ...
pub(crate) fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// The process group of `pid`, as seen from here.
pub(crate) fn pgid_of(pid: u32) -> Option<i32> {
    stat_fields(pid)?.get(2)?.parse().ok()
}

/// A variable unique to this test process and call, to mark a job's processes with.
pub(crate) fn unique_marker(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "MSR_TEST_MARK={tag}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The job whose `/proc/self/cgroup` was saved in `saved` had job cgroups, and none of
/// them is left.
pub(crate) fn assert_job_cgroups_gone(saved: &Path) {
    let dirs = job_cgroup_dirs(&std::fs::read_to_string(saved).unwrap());
    assert!(
        !dirs.is_empty(),
        "the job had no cgroup ({})",
        saved.display()
    );
    for dir in &dirs {
        assert!(!dir.exists(), "{} is left", dir.display());
    }
}

/// The host directories of the job cgroups named in `cgroups` (a job's own
/// `/proc/self/cgroup`: v1 lines `N:controllers:path`, v2 `0::path`), found under the
/// mount points of their hierarchies in this process's mountinfo.
pub(crate) fn job_cgroup_dirs(cgroups: &str) -> Vec<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    // (mount point, root within the hierarchy, controllers; empty for cgroup2)
    let mounts: Vec<(PathBuf, String, Vec<String>)> = mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let f: Vec<&str> = left.split_whitespace().collect();
            let r: Vec<&str> = right.split_whitespace().collect();
            let controllers = match *r.first()? {
                "cgroup2" => Vec::new(),
                "cgroup" => r.get(2)?.split(',').map(str::to_string).collect(),
                _ => return None,
            };
            Some((PathBuf::from(f.get(4)?), f.get(3)?.to_string(), controllers))
        })
        .collect();
    cgroups
        .lines()
        .filter(|l| l.contains("/mcp-sandbox-repl/msr-"))
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
            let wanted: Vec<&str> = ctrls.split(',').filter(|c| !c.is_empty()).collect();
            let (point, root, _) = mounts.iter().find(|(_, _, have)| match wanted.is_empty() {
                true => have.is_empty(),
                false => !have.is_empty() && wanted.iter().all(|w| have.iter().any(|h| h == w)),
            })?;
            let rel = Path::new(path).strip_prefix(root.as_str()).ok()?;
            Some(point.join(rel))
        })
        .collect()
}
