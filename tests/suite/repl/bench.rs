//! Micro-benchmark of the REPL at the Rust API level, through the real launcher and the
//! workspace-write policy (ignored: run with
//! `cargo nextest run --run-ignored only -E 'test(bench_repl)' --no-capture`).
//! Prints a markdown table for docs/benchmarks.md. The MCP-level numbers come from
//! tests/bench/server.py.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Sink, fixture, time_interrupts, time_restarts};

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn p95(v: &mut [Duration]) -> Duration {
    v.sort();
    v[(v.len() * 95 / 100).min(v.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

#[tokio::test]
#[ignore = "benchmark: run explicitly"]
async fn bench_repl() {
    let f = fixture("bench", 4);
    let python = f.manager.python().await.unwrap().executable.clone();

    // Interpreter start for scale: the real executable (not a shim), as the worker uses.
    let mut pass = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        std::process::Command::new(&python)
            .args(["-c", "pass"])
            .status()
            .unwrap();
        pass.push(t.elapsed());
    }

    let (mut spawn, mut first) = (Vec::new(), Vec::new());
    for i in 0..5 {
        let t = Instant::now();
        let s = f.manager.get_or_start(&format!("b{i}")).await.unwrap();
        spawn.push(t.elapsed());
        let o = s.execute("1", Arc::new(Sink::default())).await.unwrap();
        first.push(t.elapsed());
        assert_eq!(o.value.as_deref(), Some("1"));
        f.manager.close(&format!("b{i}")).unwrap();
    }

    let s = f.manager.get_or_start("default").await.unwrap();
    s.execute("1", Arc::new(Sink::default())).await.unwrap();
    let mut trivial = Vec::new();
    for _ in 0..500 {
        let t = Instant::now();
        let o = s.execute("1", Arc::new(Sink::default())).await.unwrap();
        trivial.push(t.elapsed());
        assert_eq!(o.value.as_deref(), Some("1"));
    }

    let mut interrupt = time_interrupts(&s, 10).await;
    let mut restart = time_restarts(&s, 10, Duration::from_millis(500)).await;

    println!("| What (Rust API, real launcher, workspace-write) | Result |");
    println!("|---|---|");
    println!(
        "| `{} -c pass` (median of 10) | {} |",
        python.display(),
        ms(median(&mut pass))
    );
    println!(
        "| new session → worker ready (median of 5) | {} |",
        ms(median(&mut spawn))
    );
    println!(
        "| new session → first cell answered (median of 5) | {} |",
        ms(median(&mut first))
    );
    println!(
        "| trivial cell ×500: median / p95 | {} / {} |",
        ms(median(&mut trivial)),
        ms(p95(&mut trivial))
    );
    println!(
        "| interrupt → KeyboardInterrupt reported (median of 10) | {} |",
        ms(median(&mut interrupt))
    );
    println!(
        "| restart → next cell answered (median of 10) | {} |",
        ms(median(&mut restart))
    );
}
