//! The interpreter probe's answer remembered in the state dir: a later manager on the
//! same state dir uses it without probing when the candidate is the interpreter itself,
//! and only as a guess (checked by the probe before any cell runs) when it is a shim.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mcp_sandbox_repl::repl::{CellStatus, ReplConfig, SessionManager};
use mcp_sandbox_repl::sandbox::Policy;

use super::run;
use crate::common::TempDir;

/// A scratch dir with a workspace `ws` (its state dir is `state`), removed on drop.
fn dirs(tag: &str) -> TempDir {
    let d = TempDir::in_system_tmp(&format!("repl-probe-{tag}"));
    std::fs::create_dir_all(d.join("ws")).unwrap();
    d
}

fn manager(d: &TempDir, python: &Path) -> Arc<SessionManager> {
    let mut cfg = ReplConfig::new(
        crate::common::runtime(),
        d.join("ws"),
        Policy::load("workspace-write").unwrap(),
        d.join("state"),
    );
    cfg.python = Some(python.to_path_buf());
    SessionManager::new(cfg)
}

/// Rewrite the remembered version of every entry (what only a probe would correct).
fn tamper_version(d: &TempDir) {
    let file = d.join("state/python-probe.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    for e in v["entries"].as_array_mut().unwrap() {
        e["version"] = "9.9.9".into();
    }
    std::fs::write(&file, serde_json::to_vec(&v).unwrap()).unwrap();
}

async fn version_seen(m: &SessionManager) -> String {
    let (o, _) = run(m, "default", "import sys; sys.version.split()[0]").await;
    assert_eq!(o.status, CellStatus::Ok, "{o:?}");
    let listed = m
        .list()
        .into_iter()
        .find(|i| i.name == "default")
        .unwrap()
        .python;
    format!("{} | {listed}", o.value.unwrap_or_default())
}

async fn real_python() -> PathBuf {
    mcp_sandbox_repl::repl::discover_python(None, Path::new("/"))
        .await
        .unwrap()
        .executable
}

#[tokio::test]
async fn the_interpreter_itself_is_not_probed_again() {
    let d = dirs("trusted");
    let python = real_python().await;
    let first = manager(&d, &python);
    let real = version_seen(&first).await;
    first.shutdown();
    tamper_version(&d);
    // A later server believes the file (no probe ran to correct the version) ...
    let second = manager(&d, &python);
    let seen = version_seen(&second).await;
    second.shutdown();
    assert!(
        seen.ends_with("(9.9.9)"),
        "the remembered answer was not used: {seen}"
    );
    // ... and the worker is the same interpreter all the same.
    assert_eq!(seen.split(" | ").next(), real.split(" | ").next());
}

#[tokio::test]
async fn a_shims_remembered_answer_is_checked_before_a_cell_runs() {
    let d = dirs("shim");
    let python = real_python().await;
    let shim = d.join("python3-shim");
    std::fs::write(
        &shim,
        format!("#!/bin/sh\nexec {} \"$@\"\n", python.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    let first = manager(&d, &shim);
    let real = version_seen(&first).await;
    first.shutdown();
    tamper_version(&d);
    let second = manager(&d, &shim);
    second.prewarm("default").await.unwrap();
    let seen = version_seen(&second).await;
    second.shutdown();
    assert_eq!(seen, real, "a cell ran on an unchecked guess");
    assert!(!seen.contains("9.9.9"), "{seen}");
}

/// A pyenv shim (`$PYENV_ROOT/shims/python3` exec'ing `$PYENV_ROOT/libexec/pyenv exec`)
/// whose version files, directories and variables are unchanged is not run again by a
/// later server: its remembered answer is used as is (issue 28: ~180 ms on the way to the
/// first cell). A changed version file makes it run again.
#[tokio::test]
async fn a_pyenv_shims_remembered_answer_is_used_without_running_it_while_unchanged() {
    let d = dirs("pyenv");
    let python = real_python().await;
    let root = d.join("pyenv");
    for sub in ["shims", "libexec", "versions"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    let runs = d.join("runs");
    let shim = root.join("shims/python3");
    std::fs::write(
        &shim,
        format!(
            "#!/usr/bin/env bash\nset -e\nprogram=\"${{0##*/}}\"\nexport PYENV_ROOT=\"{r}\"\nexec \"{r}/libexec/pyenv\" exec \"$program\" \"$@\"\n",
            r = root.display()
        ),
    )
    .unwrap();
    // pyenv itself: counts its runs, then execs the real interpreter.
    std::fs::write(
        root.join("libexec/pyenv"),
        format!(
            "#!/bin/sh\necho run >> {}\nshift 2\nexec {} \"$@\"\n",
            runs.display(),
            python.display()
        ),
    )
    .unwrap();
    std::fs::write(root.join("version"), "3\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    for f in [&shim, &root.join("libexec/pyenv")] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let count = || {
        std::fs::read_to_string(&runs)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let first = manager(&d, &shim);
    let real = version_seen(&first).await;
    first.shutdown();
    assert_eq!(count(), 1, "the first server probes through the shim once");
    let second = manager(&d, &shim);
    assert_eq!(version_seen(&second).await, real);
    second.shutdown();
    assert_eq!(count(), 1, "the unchanged shim was run again");
    // Another global version: the shim may choose another interpreter, so it runs.
    std::fs::write(root.join("version"), "3.0\n").unwrap();
    let third = manager(&d, &shim);
    assert_eq!(version_seen(&third).await, real);
    third.shutdown();
    assert_eq!(
        count(),
        2,
        "a changed pyenv version file did not make the shim run"
    );
}
