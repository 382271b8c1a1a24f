//! The per-session start-up hook: site directories every worker of a session puts on
//! `sys.path` before its first cell — the first worker, the spare after a restart, a
//! fresh worker after a crash, the session started again after a close.

use mcp_sandbox_repl::repl::CellStatus;

use super::{fixture, run};

#[tokio::test]
async fn every_worker_of_a_session_gets_its_site_dirs() {
    let f = fixture("sitedirs", 4);
    let ws = f.dir.join("ws");
    let (a, b) = (ws.join("site-a"), ws.join("site-b"));
    for (dir, module) in [(&a, "hook_a"), (&b, "hook_b")] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(format!("{module}.py")), "value = 7\n").unwrap();
    }
    // A .pth file is processed (site.addsitedir), as for a venv's site-packages.
    std::fs::create_dir_all(ws.join("extra")).unwrap();
    std::fs::write(ws.join("extra/hook_pth.py"), "").unwrap();
    std::fs::write(
        a.join("extra.pth"),
        format!("{}\n", ws.join("extra").display()),
    )
    .unwrap();
    let check = |module: &str, dir: &std::path::Path| {
        format!(
            "import sys, {module}, hook_pth\n({module}.value, sys.path.count({:?}), [k for k in dir() if k in ('site', 'importlib')])",
            dir.display().to_string()
        )
    };
    let expect = Some("(7, 1, [])");

    f.manager.set_site_dirs("default", vec![a.clone()]);
    let (o, _) = run(&f.manager, "default", &check("hook_a", &a)).await;
    assert_eq!(
        (o.status, o.cell, o.value.as_deref()),
        (CellStatus::Ok, 1, expect),
        "{o:?}"
    );

    let s = f.manager.get("default").unwrap();
    s.restart().await.unwrap();
    let (o, _) = run(&f.manager, "default", &check("hook_a", &a)).await;
    assert_eq!(o.value.as_deref(), expect, "after a restart: {o:?}");

    for _ in 0..2 {
        let (o, _) = run(&f.manager, "default", "import os; os._exit(3)").await;
        assert_eq!(o.status, CellStatus::WorkerDied);
    }
    let (o, _) = run(&f.manager, "default", &check("hook_a", &a)).await;
    assert_eq!(
        (o.value.as_deref(), o.state_lost),
        (expect, true),
        "after a crash: {o:?}"
    );

    // Changed on an open session: the spare and later workers get the new set.
    f.manager
        .set_site_dirs("default", vec![a.clone(), b.clone()]);
    s.restart().await.unwrap();
    let (o, _) = run(&f.manager, "default", &check("hook_b", &b)).await;
    assert_eq!(o.value.as_deref(), expect, "a second directory: {o:?}");

    f.manager.close("default").unwrap();
    let (o, _) = run(&f.manager, "default", &check("hook_b", &b)).await;
    assert_eq!(o.value.as_deref(), expect, "after a close: {o:?}");

    // A directory that vanished is skipped (logged); the worker stays usable.
    f.manager
        .set_site_dirs("gone", vec![ws.join("no-such-dir")]);
    let (o, _) = run(&f.manager, "gone", "1 + 1").await;
    assert_eq!(o.value.as_deref(), Some("2"), "{o:?}");
    let (o, _) = run(&f.manager, "other", "import hook_a").await;
    assert_eq!(
        o.status,
        CellStatus::Error,
        "another session has its own dirs"
    );
}
