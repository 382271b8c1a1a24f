//! The Python REPL through its Rust API: shared fixture here, cells and I/O in `cells`,
//! sessions, crashes, signals and limits in `lifecycle`, what the session's phases key
//! on in `phases`. The MCP-level tests live with
//! the server (tests/mcp).

mod bench;
mod cells;
mod lifecycle;
mod phases;
mod probe_cache;
mod site_dirs;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mcp_sandbox_repl::repl::{CellOutcome, CellSink, OutStream, ReplConfig, SessionManager};
use mcp_sandbox_repl::sandbox::Policy;

use crate::common::TempDir;

/// Collects a cell's output.
#[derive(Default)]
pub(super) struct Sink {
    pub(super) stdout: Mutex<Vec<u8>>,
    pub(super) stderr: Mutex<Vec<u8>>,
    pub(super) prompts: Mutex<Vec<String>>,
    pub(super) inputs: Mutex<usize>,
}

/// Start `code` on `s` in a task of its own, its output going to `sink`: for a test that
/// acts on the cell while it runs (interrupt, cancel, restart, a second cell).
pub(super) fn spawn_cell(
    s: &Arc<mcp_sandbox_repl::repl::Session>,
    code: &'static str,
    sink: &Arc<Sink>,
) -> tokio::task::JoinHandle<Result<CellOutcome, mcp_sandbox_repl::repl::ReplError>> {
    let (s, sink) = (s.clone(), sink.clone());
    tokio::spawn(async move { s.execute(code, sink).await })
}

impl CellSink for Sink {
    fn output(&self, stream: OutStream, data: &[u8]) {
        match stream {
            OutStream::Stdout => self.stdout.lock().unwrap().extend_from_slice(data),
            OutStream::Stderr => self.stderr.lock().unwrap().extend_from_slice(data),
        }
    }
    fn awaiting_input(&self, prompt: &str) {
        self.prompts.lock().unwrap().push(prompt.to_string());
    }
    fn input_received(&self) {
        *self.inputs.lock().unwrap() += 1;
    }
}

impl Sink {
    pub(super) fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().unwrap()).into_owned()
    }
    pub(super) fn err(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }
}

pub(super) struct Fixture {
    pub(super) manager: Arc<SessionManager>,
    /// Its workspace `ws` and state dir `state`; dropped after `Drop::drop` closed the
    /// sessions (fields drop in order).
    pub(super) dir: TempDir,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.manager.shutdown();
    }
}

impl Fixture {
    /// A manager under workspace-write on a fresh workspace and state dir (in the system
    /// temp dir, where these tests always ran), its config first given to `configure`.
    pub(super) fn new(tag: &str, configure: impl FnOnce(&mut ReplConfig)) -> Fixture {
        let dir = TempDir::in_system_tmp(&format!("repl-suite-{tag}"));
        let workspace = dir.join("ws");
        std::fs::create_dir_all(&workspace).unwrap();
        let mut cfg = ReplConfig::new(
            crate::common::runtime(),
            workspace,
            Policy::load("workspace-write").unwrap(),
            dir.join("state"),
        );
        configure(&mut cfg);
        Fixture {
            manager: SessionManager::new(cfg),
            dir,
        }
    }
}

pub(super) fn fixture(tag: &str, max_sessions: usize) -> Fixture {
    Fixture::new(tag, |cfg| cfg.max_sessions = max_sessions)
}

pub(super) async fn run(
    manager: &SessionManager,
    session: &str,
    code: &str,
) -> (CellOutcome, Arc<Sink>) {
    let s = manager.get_or_start(session).await.unwrap();
    let sink = Arc::new(Sink::default());
    let out = s.execute(code, sink.clone()).await.unwrap();
    (out, sink)
}

/// Poll until `cond` holds; the 60 s bound only guards a hang (a loaded machine may be
/// slow to get a worker there).
pub(super) async fn wait_for(cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "condition not reached in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Interrupt a busy loop `n` times; each entry is the time from `interrupt()` to the
/// cell reported as interrupted (asserted).
pub(super) async fn time_interrupts(
    s: &Arc<mcp_sandbox_repl::repl::Session>,
    n: usize,
) -> Vec<Duration> {
    let mut out = Vec::new();
    for _ in 0..n {
        let sink = Arc::new(Sink::default());
        let task = {
            let (s, sink) = (s.clone(), sink.clone());
            tokio::spawn(async move {
                s.execute("print('go', flush=True)\nwhile True: pass", sink)
                    .await
            })
        };
        wait_for(|| sink.out().contains("go")).await;
        let t = Instant::now();
        s.interrupt();
        let o = task.await.unwrap().unwrap();
        out.push(t.elapsed());
        assert_eq!(o.status, mcp_sandbox_repl::repl::CellStatus::Interrupted);
    }
    out
}

/// Restart `n` times, `gap` apart (an agent's calls are seconds apart: by then the spare
/// worker is up); each entry is restart plus the next trivial cell answered.
pub(super) async fn time_restarts(
    s: &Arc<mcp_sandbox_repl::repl::Session>,
    n: usize,
    gap: Duration,
) -> Vec<Duration> {
    let mut out = Vec::new();
    for _ in 0..n {
        tokio::time::sleep(gap).await;
        let t = Instant::now();
        s.restart().await.unwrap();
        s.execute("1", Arc::new(Sink::default())).await.unwrap();
        out.push(t.elapsed());
    }
    out
}
