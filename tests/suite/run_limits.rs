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
