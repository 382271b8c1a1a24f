//! Limits through `run --json`: the CPU, wall-time and file-size limits end the process
//! and the report names the limit. (Memory and process bombs are in the escape suite.)

use std::time::{Duration, Instant};

use crate::common::{TempDir, report, run_in};

/// A policy file in `ws`: workspace-write's file system with the given `[limits]` body.
fn policy_with_limits(ws: &TempDir, name: &str, limits: &str) -> String {
    let text = format!(
        "[filesystem]\n\
         read = [\"/usr\", \"/bin\", \"/lib\", \"/lib64\", \"/etc\", \"/proc\", \"/dev/zero\"]\n\
         write = [\"{{workspace}}\", \"{{tmp}}\", \"/dev/null\"]\n\
         execute = [\"/usr\", \"/bin\", \"/lib\", \"/lib64\"]\n\
         [environment]\npass = [\"PATH\"]\n\
         [limits]\n{limits}\n"
    );
    ws.write(name, &text).display().to_string()
}

/// A busy loop ends at the CPU limit (SIGXCPU) and the report says `cpu`.
#[test]
fn cpu_limit_ends_process() {
    let ws = TempDir::new("cpu");
    let policy = policy_with_limits(&ws, "cpu.toml", "cpu_seconds = 1");
    let out = run_in(
        &policy,
        &ws.path,
        true,
        &["sh", "-c", "while :; do :; done"],
    );
    let r = report(&out);
    assert_eq!(r["limit"], "cpu", "{r}");
    assert_eq!(r["signal"], "SIGXCPU", "{r}");
    assert_eq!(out.status.code(), Some(128 + libc::SIGXCPU));
    // rusage splits CPU time by tick sampling (and a VM steals some): roughly the limit.
    let cpu = r["user_cpu_ms"].as_u64().unwrap() + r["system_cpu_ms"].as_u64().unwrap();
    assert!(cpu >= 500, "{r}");
    // No wall-clock bound: on a busy machine the loop may wait long for its second of
    // CPU. The loop never ends by itself, so the report above is the limit's doing.
}

/// A sleeping process ends at the wall-time limit and the report says `wall_time`.
#[test]
fn wall_limit_ends_process() {
    let ws = TempDir::new("wall");
    let policy = policy_with_limits(&ws, "wall.toml", "wall_seconds = 1");
    let started = Instant::now();
    let out = run_in(
        &policy,
        &ws.path,
        true,
        &["sh", "-c", "sleep 30 & sleep 30"],
    );
    let r = report(&out);
    assert_eq!(r["limit"], "wall_time", "{r}");
    assert_eq!(r["signal"], "SIGKILL", "{r}");
    // Not before the limit, and before the sleeps would have ended by themselves (a
    // loaded machine may be slow to start and stop the run: no tighter bound holds).
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(30),
        "{took:?}"
    );
}

/// Writing past the file-size limit ends the writer (SIGXFSZ); the file stays capped.
#[test]
fn file_size_limit_ends_process() {
    let ws = TempDir::new("fsize");
    let policy = policy_with_limits(&ws, "fsize.toml", "file_size = \"1MiB\"");
    let out = run_in(
        &policy,
        &ws.path,
        true,
        &["sh", "-c", "head -c 5000000 /dev/zero > big"],
    );
    let r = report(&out);
    assert_eq!(r["limit"], "file_size", "{r}");
    let size = std::fs::metadata(ws.join("big")).unwrap().len();
    assert!(size <= 1 << 20, "file grew to {size}");
}

/// The target is in its job cgroup, with its caps set, from its first instruction. The
/// target here is the first program of the job (exec'd by the launcher, no shell before
/// it): `cat` shows its own cgroups, and `dd` makes one allocation above the memory cap,
/// which the cap ends (with a job left outside its cgroup, or placed there after it
/// started, `dd` would finish). Guards any change that moves the cgroup's making or
/// joining.
#[test]
fn the_target_starts_in_its_job_cgroup_with_the_caps_set() {
    let ws = TempDir::new("placed");
    let policy = policy_with_limits(&ws, "placed.toml", "memory = \"64MiB\"\nprocesses = 32");
    let out = run_in(&policy, &ws.path, true, &["cat", "/proc/self/cgroup"]);
    let r = report(&out);
    assert_eq!(r["exit_code"], 0, "{r}");
    let text = String::from_utf8_lossy(&out.stdout);
    let job = |line: &str| line.contains("/mcp-sandbox-repl/msr-");
    // v1 (a pids and a memory hierarchy) or v2 (one line `0::<path>`).
    let v1 = ["pids", "memory"].map(|c| {
        text.lines().any(|l| {
            l.split(':')
                .nth(1)
                .is_some_and(|cs| cs.split(',').any(|x| x == c))
                && job(l)
        })
    });
    let v2 = text.lines().any(|l| l.starts_with("0::") && job(l));
    assert!(v1 == [true, true] || v2, "not in its job cgroups:\n{text}");
    let out = run_in(
        &policy,
        &ws.path,
        true,
        &["dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"],
    );
    let r = report(&out);
    assert_eq!(r["limit"], "memory", "{r}");
    assert_eq!(r["signal"], "SIGKILL", "{r}");
}
