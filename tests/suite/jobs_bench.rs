//! Micro-benchmark of shell jobs at the Rust API level (ignored: run with
//! `cargo nextest run --run-ignored only -E 'test(bench_shell_jobs)' --no-capture`).
//! Spawn latency of `true` and throughput of a 200 MB output, each as a ratio against
//! running the same command directly with std::process. The MCP-level numbers come
//! from tests/bench/shell.py.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcp_sandbox_repl::jobs::{
    JobStatus, JobStore, ShellRequest, StoreConfig, WaitFor, start_shell_job,
};
use mcp_sandbox_repl::sandbox::{Placeholders, Policy, Termination};

const RUNS: usize = 30;
const BIG: u64 = 200_000_000;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn direct(cmd: &str) -> Duration {
    let t = Instant::now();
    let mut child = Command::new("/bin/sh")
        .args(["-c", cmd])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    while out.read(&mut buf).unwrap() > 0 {}
    assert!(child.wait().unwrap().success());
    t.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark"]
async fn bench_shell_jobs() {
    let dir = crate::common::TempDir::in_system_tmp("jobs-bench");
    std::fs::create_dir_all(dir.join("ws")).unwrap();
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    let ph = Placeholders {
        workspace: dir.join("ws"),
        tmp: dir.join("tmp"),
        ..Placeholders::default()
    };
    let policy_name = std::env::var("BENCH_POLICY").unwrap_or_else(|_| "workspace-write".into());
    let policy = Arc::new(Policy::load(&policy_name).unwrap().resolve(&ph).unwrap());
    let store = JobStore::open(StoreConfig {
        state_dir: dir.join("state"),
        disk_cap: 1 << 32,
        response_bytes: 20_000,
        retention: Default::default(),
        max_running: None,
    })
    .unwrap();
    let job = |cmd: &str| {
        let store = store.clone();
        let policy = policy.clone();
        let cmd = cmd.to_string();
        async move {
            let t = Instant::now();
            let h = start_shell_job(
                &crate::common::runtime(),
                &store,
                ShellRequest::command(cmd),
                policy,
            )
            .unwrap();
            let s = store
                .wait_for(h.id(), Duration::from_secs(300), WaitFor::Settled)
                .await
                .unwrap();
            assert_eq!(s.status, JobStatus::Completed, "{s:?}");
            t.elapsed()
        }
    };

    let launcher = || {
        let policy = policy.clone();
        async move {
            let t = Instant::now();
            let mut cmd = crate::common::runtime().command(policy, "/bin/sh");
            cmd.args(["-c", "true"]);
            cmd.stdin(mcp_sandbox_repl::sandbox::Io::Null)
                .stdout(mcp_sandbox_repl::sandbox::Io::Piped)
                .stderr(mcp_sandbox_repl::sandbox::Io::Piped);
            let report = cmd.spawn().unwrap().wait().await;
            assert_eq!(report.termination, Termination::Exited(0));
            t.elapsed()
        }
    };
    let (mut j, mut l, mut d) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        j.push(job("true").await);
        l.push(launcher().await);
        d.push(direct("true"));
    }
    let (jt, lt, dt) = (median(j), median(l), median(d));

    let big = format!("head -c {BIG} /dev/zero");
    let jb = median(vec![job(&big).await, job(&big).await, job(&big).await]);
    let db = median(vec![direct(&big), direct(&big), direct(&big)]);
    let to_file = format!("{big} > {}", dir.join("direct.out").display());
    let df = median(vec![direct(&to_file), direct(&to_file), direct(&to_file)]);
    let mbps = |d: Duration| BIG as f64 / 1e6 / d.as_secs_f64();

    println!("policy: {policy_name}");
    println!(
        "spawn `true`: job {:.2} ms, launcher alone {:.2} ms, direct {:.2} ms; job/direct {:.1}x, job/launcher {:.2}x",
        ms(jt),
        ms(lt),
        ms(dt),
        ms(jt) / ms(dt),
        ms(jt) / ms(lt)
    );
    println!(
        "200 MB output: job {:.0} MB/s; direct to a pipe {:.0} MB/s ({:.2}x); direct to a file {:.0} MB/s ({:.2}x)",
        mbps(jb),
        mbps(db),
        mbps(jb) / mbps(db),
        mbps(df),
        mbps(jb) / mbps(df)
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
