//! Containment through the job cgroup: what a job leaves behind does not outlive it.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcp_sandbox_repl::envs::{self, Canceller, EnvSink, OutStream, Progress};
use mcp_sandbox_repl::sandbox::ResolvedPolicy;

use crate::common::{TempDir, pids_with_env, sh, stat_fields, unique_marker};

/// Starts a daemon that leaves the job's process group and session (double fork +
/// setsid), marked with `mark` (a job cannot see its pids as the host does), says so in
/// `daemon.pid`, and then stays alive itself.
fn daemon_then_stay(mark: &str) -> String {
    format!(
        "export {mark}; (setsid sh -c 'echo up > daemon.pid; exec sleep 300' \
         </dev/null >/dev/null 2>&1 &); exec sleep 300"
    )
}

/// `workspace-write` (which has memory and process limits, so a job cgroup) for `ws`.
fn cgroup_policy(ws: &TempDir) -> Arc<ResolvedPolicy> {
    let policy = crate::common::resolved_in(ws, "workspace-write");
    assert!(
        policy.limits.processes.is_some() && policy.limits.memory_bytes.is_some(),
        "the test needs a policy with a job cgroup"
    );
    policy
}

/// The daemon's host pid once it has started (waits up to 30 s): the marked process
/// that leads its own session.
fn daemon_pid(ws: &Path, mark: &str) -> u32 {
    let file = ws.join("daemon.pid");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if file.exists() {
            let leader = pids_with_env(mark)
                .into_iter()
                .find(|&p| stat_fields(p).is_some_and(|f| f.get(3) == Some(&p.to_string())));
            if let Some(pid) = leader {
                return pid;
            }
        }
        assert!(Instant::now() < deadline, "the daemon never started");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `pid` runs (exists and is not a zombie), per /proc/PID/stat.
fn running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
    !state.is_some_and(|s| s.starts_with('Z') || s.starts_with('X'))
}

/// Waits (up to 30 s, a bound and not a measurement) for `pid` to stop running.
fn gone(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while running(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    !running(pid)
}

/// A daemon that leaves the job's process group (double fork + setsid) is still killed
/// when the job ends: the cgroup, not the process group, bounds the job.
#[test]
fn daemonized_grandchild_does_not_outlive_the_job() {
    let ws = TempDir::new("limits-daemon");
    let mark = unique_marker("daemon");
    // The daemon says it started, then becomes a long sleep in its own session.
    let script = format!(
        "export {mark}; setsid sh -c 'echo up > daemon.pid; exec sleep 300' </dev/null >/dev/null 2>&1 & \
         while [ ! -s daemon.pid ]; do sleep 0.01; done; exit 0"
    );
    let out = sh("workspace-write", &ws.path, &script);
    assert!(out.status.success(), "{out:?}");
    assert!(ws.join("daemon.pid").exists(), "the daemon started");
    // The daemon sleeps 300 s: a generous poll (a bound, not a measurement) still tells
    // "killed with the job" from "survived it" on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pids_with_env(&mark).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let left = pids_with_env(&mark);
    assert!(left.is_empty(), "daemon {left:?} survived the job");
}

/// The kill handle repl and envs use (`GroupKiller::kill_all`) reaches a daemon that left
/// the process group and session — through the job cgroup, at once: the main process is
/// not reaped yet (so nothing else has swept the cgroup), and the daemon is already gone.
#[test]
fn group_kill_reaches_a_setsid_daemon_through_the_cgroup() {
    let ws = TempDir::new("limits-killer");
    let mark = unique_marker("killer");
    let mut cmd = crate::common::runtime().command(cgroup_policy(&ws), "sh");
    cmd.args(["-c", &daemon_then_stay(&mark)])
        .current_dir(&ws.path);
    let child = cmd.spawn().unwrap();
    let daemon = daemon_pid(&ws.path, &mark);
    assert!(running(daemon), "daemon {daemon} is not running");
    child.killer().kill_all();
    assert!(gone(daemon), "daemon {daemon} survived the group kill");
    // Only now is the main process reaped (and the cgroup swept a second time).
    let report = child.wait_blocking();
    assert_eq!(
        report.termination,
        mcp_sandbox_repl::sandbox::Termination::Signaled("SIGKILL".into())
    );
}

/// Discards what a uv-like run prints.
struct Discard;

impl EnvSink for Discard {
    fn output(&self, _: OutStream, _: &[u8]) {}
    fn progress(&self, _: &Progress) {}
}

/// Cancelling an envs process (an install or script run) kills what it daemonized too:
/// envs goes through the sandbox's group-and-cgroup kill, not a bare killpg.
#[tokio::test(flavor = "multi_thread")]
async fn cancelled_envs_process_leaves_no_setsid_daemon() {
    let ws = TempDir::new("limits-envs-cancel");
    let mark = unique_marker("envs");
    let mut cmd = crate::common::runtime().command(cgroup_policy(&ws), "sh");
    cmd.args(["-c", &daemon_then_stay(&mark)])
        .current_dir(&ws.path);
    let cancel = Canceller::new();
    let canceller = cancel.clone();
    let ws_path = ws.path.clone();
    let watcher = tokio::task::spawn_blocking(move || {
        let pid = daemon_pid(&ws_path, &mark);
        canceller.cancel();
        pid
    });
    let outcome = envs::process::run(cmd, Arc::new(Discard), None, &cancel, None, None)
        .await
        .unwrap();
    let daemon = watcher.await.unwrap();
    assert!(outcome.cancelled, "{outcome:?}");
    assert!(gone(daemon), "daemon {daemon} survived the cancelled run");
}
