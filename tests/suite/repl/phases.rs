//! The session's phases through real workers: what a cancel's escalation and a restart
//! key on (the phase machine itself is unit-tested in src/repl/session/phase.rs).

use std::sync::Arc;
use std::time::{Duration, Instant};

use mcp_sandbox_repl::repl::{CellStatus, ReplError};

use super::{Sink, fixture, run, spawn_cell, wait_for};

/// A cancel arms a kill for the cell it interrupted, `grace` later. A restart in between
/// numbers cells from 1 again: the next cell may carry the cancelled cell's number, and
/// the kill must not take it for the cancelled one (it is keyed on the op, which a
/// restart never reuses). If the machine is so slow that the new cell starts after the
/// kill was due, the test shows nothing, but it cannot fail wrongly.
#[tokio::test]
async fn a_cancel_before_a_restart_never_kills_the_next_cell_of_that_number() {
    const IGNORES_INTERRUPTS: &str = "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, \
        {signal.SIGINT})\nprint('in C', flush=True)\nsum(range(10**11))";
    let f = fixture("phases-cancel", 4);
    let s = f.manager.get_or_start("default").await.unwrap();
    let sink = Arc::new(Sink::default());
    let stuck = spawn_cell(&s, IGNORES_INTERRUPTS, &sink);
    wait_for(|| sink.out().contains("in C")).await;
    let grace = Duration::from_secs(3);
    let kill_due = Instant::now() + grace;
    assert!(s.cancel_cell(grace));
    s.restart().await.unwrap();
    let o = stuck.await.unwrap().unwrap();
    assert_eq!(o.status, CellStatus::WorkerDied, "{o:?}");
    // Cell 1 again, running until well after the cancelled cell's kill was due.
    let until = kill_due + Duration::from_secs(2);
    let secs = until
        .saturating_duration_since(Instant::now())
        .as_secs_f64();
    let code = format!("import time\ntime.sleep({secs:.3})\n'survived'");
    let (s2, sink2) = (s.clone(), Arc::new(Sink::default()));
    let next = tokio::spawn(async move { s2.execute(&code, sink2).await });
    let o = next.await.unwrap().unwrap();
    assert_eq!(o.cell, 1, "a restart numbers cells from 1 again");
    assert_eq!(
        (o.status, o.value.as_deref()),
        (CellStatus::Ok, Some("'survived'")),
        "{o:?}"
    );
}

/// A cell promised to a caller (its job answered "running") that still waits for the
/// thread when the session is restarted — here behind a variable read stuck in a
/// `__repr__` — never runs: not on the worker the restart starts either. Its call says
/// so, and a call made as soon as the restart answers runs cell 1 with nothing of it
/// (the CI once saw such a cell hold the fresh worker: the next call was told "busy").
#[tokio::test]
async fn a_cell_promised_before_a_restart_never_runs_on_the_fresh_worker() {
    let f = fixture("phases-promised", 4);
    let marker = f.dir.join("ws").join("in-repr");
    let code = format!(
        "import time\nclass Slow:\n    def __repr__(self):\n        open({:?}, 'w').close()\n        \
         time.sleep(3600)\n        return 'slow'\nslow = Slow()",
        marker.display().to_string()
    );
    let (o, _) = run(&f.manager, "default", &code).await;
    assert_eq!(o.status, CellStatus::Ok, "{o:?}");
    let s = f.manager.get_or_start("default").await.unwrap();
    let reading = {
        let s = s.clone();
        tokio::spawn(async move { s.get_variable("slow").await })
    };
    // The read holds the thread until its worker is killed.
    wait_for(|| marker.exists()).await;
    let promise = s.expect_cell();
    let promised = {
        let s = s.clone();
        tokio::spawn(async move {
            let r = s.execute("promised = 1", Arc::new(Sink::default())).await;
            s.expected_cell_ended(promise);
            r
        })
    };
    s.restart().await.unwrap();
    // The restart answers once the overtaken cell has let the thread go: a call made at
    // once runs (not "busy"), on the fresh worker, with nothing of the promised cell.
    let (o, _) = run(&f.manager, "default", "'promised' in globals()").await;
    assert_eq!((o.cell, o.value.as_deref()), (1, Some("False")), "{o:?}");
    let r = promised.await.unwrap();
    assert!(
        matches!(&r, Err(e @ ReplError::Restarted { .. }) if e.to_string().contains("none of it ran")),
        "{r:?}"
    );
    assert!(
        reading.await.unwrap().is_err(),
        "the read died with its worker"
    );
}
