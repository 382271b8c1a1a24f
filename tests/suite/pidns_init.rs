//! The PID namespace's init is the spawning process's own child (`launcher::pidns`): no
//! supervisor outside the namespace, and the target's end — exit code, signal, rusage —
//! still comes back as the target's own, through the init's exit word. Both routes that
//! clone: the zygote (the server's) and `run`'s fork.

use std::time::Duration;

use mcp_sandbox_repl::sandbox::Termination;

use crate::common::{TempDir, run_until_ready, signal_run_and_check};

/// The `NSpid` numbers of `pid` (host first, innermost last).
fn ns_pids(pid: u32) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    line.split_whitespace()
        .skip(1)
        .map(|n| n.parse().unwrap())
        .collect()
}

/// A `workspace-write` job (a PID namespace) running `script` through the zygote.
fn job(ws: &TempDir, script: &str) -> mcp_sandbox_repl::sandbox::SandboxedChild {
    let policy = crate::common::resolved_in(ws, "workspace-write");
    let mut cmd = crate::common::runtime().command(policy, "sh");
    cmd.args(["-c", script]).current_dir(&ws.path);
    cmd.spawn().unwrap()
}

#[test]
fn a_jobs_own_child_is_the_init_of_its_pid_namespace_and_reports_the_targets_signal() {
    let ws = TempDir::new("pidns-init-zygote");
    let child = job(&ws, "echo up > up; exec sleep 600");
    for _ in 0..3000 {
        if ws.join("up").exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // The server's child is pid 1 of the job's namespace (no supervisor outside it) ...
    let init = ns_pids(child.pid);
    assert_eq!((init.len(), init.last()), (2, Some(&1)), "{init:?}");
    // ... and the target, pid 2, is found behind it.
    let target = child.main_pid();
    assert_ne!(target, child.pid);
    assert_eq!(ns_pids(target).last(), Some(&2));
    child.signal_group(libc::SIGTERM).unwrap();
    let report = child.wait_blocking();
    assert_eq!(report.termination, Termination::Signaled("SIGTERM".into()));
}

#[test]
fn the_targets_exit_code_signal_and_memory_come_back_through_the_init() {
    let ws = TempDir::new("pidns-init-end");
    assert_eq!(
        job(&ws, "exit 7").wait_blocking().termination,
        Termination::Exited(7)
    );
    // Killed by a signal of its own: the init itself exits 0, the word says SIGKILL.
    assert_eq!(
        job(&ws, "kill -KILL $$").wait_blocking().termination,
        Termination::Signaled("SIGKILL".into())
    );
    // The rusage is the init's with the target it reaped: the target's 64 MiB show.
    let report = job(
        &ws,
        "exec /usr/bin/python3 -c 'b = bytearray(64 << 20); b[::4096] = b\"x\" * len(b[::4096])'",
    )
    .wait_blocking();
    assert_eq!(report.termination, Termination::Exited(0));
    assert!(
        report.peak_rss_bytes >= 64 << 20,
        "peak RSS {} bytes",
        report.peak_rss_bytes
    );
}

/// `run`'s child is the command's init too, and a signal it forwards still ends the
/// command as that signal (exit status 128 + N).
#[test]
fn the_child_of_run_is_the_init_of_the_commands_pid_namespace() {
    let ws = TempDir::new("pidns-init-run");
    let (run, out) = run_until_ready(&ws.path);
    let id = run.id();
    let children = std::fs::read_to_string(format!("/proc/{id}/task/{id}/children")).unwrap();
    let kids: Vec<u32> = children
        .split_whitespace()
        .map(|c| c.parse().unwrap())
        .collect();
    assert_eq!(kids.len(), 1, "{kids:?}");
    let init = ns_pids(kids[0]);
    assert_eq!((init.len(), init.last()), (2, Some(&1)), "{init:?}");
    signal_run_and_check(run, out, libc::SIGINT, "SIGINT");
}
