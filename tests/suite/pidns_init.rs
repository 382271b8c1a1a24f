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
    job_with(ws, script, false)
}

/// [`job`], taking a view made ahead of need if one is ready (`view_made_ahead`).
fn job_with(
    ws: &TempDir,
    script: &str,
    view_made_ahead: bool,
) -> mcp_sandbox_repl::sandbox::SandboxedChild {
    let policy = crate::common::resolved_in(ws, "workspace-write");
    let mut cmd = crate::common::runtime().command(policy, "sh");
    cmd.args(["-c", script])
        .current_dir(&ws.path)
        .view_made_ahead(view_made_ahead);
    cmd.spawn().unwrap()
}

/// Waits (a hang guard, not a measurement) for `file` in `ws` to exist.
fn wait_for(ws: &TempDir, file: &str) {
    for _ in 0..3000 {
        if ws.join(file).exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{file} never appeared");
}

/// The namespace `kind` (`mnt`, `net`) process `pid` lives in, as `kind:[inode]`.
fn ns_of(pid: u32, kind: &str) -> String {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).unwrap();
    link.to_string_lossy().into_owned()
}

/// How process `holder` holds namespace `ns` (`kind:[inode]`): it lives in it
/// (`"lives"`), keeps a descriptor of it (`"keeps"`), or not at all (`"no"`).
fn how_held(holder: u32, kind: &str, ns: &str) -> &'static str {
    if ns_of(holder, kind) == ns {
        return "lives";
    }
    let fds = std::fs::read_dir(format!("/proc/{holder}/fd")).unwrap();
    let kept = fds
        .flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == ns));
    if kept { "keeps" } else { "no" }
}

/// The init `init` holds the mount and network namespaces of its target `target`, which
/// are the job's own (not this process's): the target's end then drops a reference
/// only, and their teardown comes with the init's exit, after its word. Returns how the
/// mount namespace is held.
fn assert_the_init_holds_the_namespaces(init: u32, target: u32) -> &'static str {
    let me = std::process::id();
    for kind in ["mnt", "net"] {
        let ns = ns_of(target, kind);
        assert_ne!(
            ns,
            ns_of(me, kind),
            "the job has no {kind} namespace of its own"
        );
        let held = how_held(init, kind, &ns);
        assert_ne!(held, "no", "the init {init} does not hold the job's {ns}");
    }
    let mount = how_held(init, "mnt", &ns_of(target, "mnt"));
    if mount == "lives" {
        // In the view with its target, the init keeps nothing of the host's tree: the
        // target's pivot_root moved the init's root too (it started from `/`).
        use std::os::unix::fs::MetadataExt;
        let root = |pid: u32| {
            let m = std::fs::metadata(format!("/proc/{pid}/root/")).unwrap();
            (m.dev(), m.ino())
        };
        assert_eq!(root(init), root(target), "the init's root is not the view");
        assert_ne!(
            root(init),
            root(std::process::id()),
            "the init kept the host's root"
        );
    }
    mount
}

#[test]
fn a_jobs_own_child_is_the_init_of_its_pid_namespace_and_reports_the_targets_signal() {
    let ws = TempDir::new("pidns-init-zygote");
    let child = job(&ws, "echo up > up; exec sleep 600");
    wait_for(&ws, "up");
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
    let kids = children(id);
    assert_eq!(kids.len(), 1, "{kids:?}");
    let init = ns_pids(kids[0]);
    assert_eq!((init.len(), init.last()), (2, Some(&1)), "{init:?}");
    // The init made the command's namespaces and lives in them itself.
    let target = children(kids[0]);
    assert_eq!(target.len(), 1, "{target:?}");
    assert_eq!(
        assert_the_init_holds_the_namespaces(kids[0], target[0]),
        "lives"
    );
    signal_run_and_check(run, out, libc::SIGINT, "SIGINT");
}

/// The children of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    children
        .split_whitespace()
        .map(|c| c.parse().unwrap())
        .collect()
}

/// A server's job: its init holds the job's namespaces — the mount namespace it made
/// itself (the target built its view in it), and a view made ahead of need by keeping
/// its descriptor (the server's shell jobs; the network namespace made ahead likewise).
#[test]
fn the_init_holds_the_jobs_namespaces_made_by_it_or_ahead() {
    let ws = TempDir::new("pidns-init-holds");
    let child = job(&ws, "echo up > up; exec sleep 600");
    wait_for(&ws, "up");
    let held = assert_the_init_holds_the_namespaces(child.pid, child.main_pid());
    assert_eq!(held, "lives");
    child.kill_all();
    child.wait_blocking();
    // A view made ahead: the first spawns ask the pool for one, a later one takes it
    // (a bound on tries, not a measurement).
    for attempt in 0..200 {
        let _ = std::fs::remove_file(ws.join("up"));
        let child = job_with(&ws, "echo up > up; exec sleep 600", true);
        wait_for(&ws, "up");
        let held = assert_the_init_holds_the_namespaces(child.pid, child.main_pid());
        child.kill_all();
        child.wait_blocking();
        if held == "keeps" {
            return;
        }
        assert!(attempt < 199, "no job ever took a view made ahead");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `wait_blocking_before_exit` (what `run` calls) answers on the init's exit word: the
/// target's status, the job's cgroup removed at once (nothing of the job is left), and
/// the init not reaped — it ends by itself, handed back to be reaped here.
#[test]
fn a_wait_before_exit_answers_on_the_word_and_leaves_the_init() {
    let ws = TempDir::new("pidns-init-leave");
    let child = job(&ws, "cat /proc/self/cgroup > cgroup; exit 3");
    let (report, init) = child.wait_blocking_before_exit();
    assert_eq!(report.termination, Termination::Exited(3));
    crate::common::assert_job_cgroups_gone(&ws.join("cgroup"));
    let status = init.reap().expect("the init was reaped by the wait");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{status:#x}"
    );
}

/// With a process of the job left behind (a background `sleep`), the cgroup cannot be
/// removed at once: everything is killed and the init reaped before the wait returns
/// (unless the init's own exit, right after its word, emptied the namespace first: then
/// the cgroup goes at once); either way nothing of the job is left and the report is
/// still the target's.
#[test]
fn a_wait_before_exit_kills_what_is_left_and_reaps_the_init() {
    let ws = TempDir::new("pidns-init-left");
    let mark = crate::common::unique_marker("left");
    let child = job(
        &ws,
        &format!("export {mark}; cat /proc/self/cgroup > cgroup; sleep 600 & exit 3"),
    );
    let (report, init) = child.wait_blocking_before_exit();
    assert_eq!(report.termination, Termination::Exited(3));
    assert!(
        crate::common::pids_with_env(&mark).is_empty(),
        "the background sleep survived"
    );
    // Reaped already, or left to us.
    let _ = init.reap();
    crate::common::assert_job_cgroups_gone(&ws.join("cgroup"));
}
