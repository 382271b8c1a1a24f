//! Setup failures in words: what the launcher writes to its status pipe is exactly the
//! `Display` of its typed `SetupError`, and the parent reports it with the step's words.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use mcp_sandbox_repl::sandbox::{LaunchError, ResolvedPolicy, SetupError};

use crate::common::TempDir;

fn policy(ws: &TempDir) -> Arc<ResolvedPolicy> {
    crate::common::resolved_in(ws, "workspace-write")
}

/// An unknown command fails in the launcher's exec step; the words the parent gets are
/// the launcher's `SetupError::NotFound`, character for character.
#[test]
fn launcher_failure_crosses_the_pipe_as_the_typed_errors_words() {
    let ws = TempDir::new("launch-notfound");
    let policy = policy(&ws);
    let program = "no-such-program-\u{1F600}";
    let mut cmd = crate::common::runtime().command(policy.clone(), program);
    cmd.env("PATH", "/usr/bin:/bin");
    let err = match cmd.spawn() {
        Ok(_) => panic!("{program} started"),
        Err(e) => e,
    };
    let LaunchError::Launcher(words) = &err else {
        panic!("not a launcher failure: {err:?}");
    };
    let expected = SetupError::NotFound {
        program: program.into(),
        path: "/usr/bin:/bin".into(),
    };
    assert_eq!(expected.step(), "exec");
    assert_eq!(words, &expected.to_string());
    assert_eq!(err.to_string(), format!("sandbox setup failed: {expected}"));
}

/// A working directory the sandbox cannot enter fails at its own step, naming the path.
#[test]
fn working_directory_failure_names_the_step_and_path() {
    let ws = TempDir::new("launch-cwd");
    let mut cmd = crate::common::runtime().command(policy(&ws), "true");
    let missing = ws.join("does-not-exist");
    cmd.current_dir(&missing);
    let err = match cmd.spawn() {
        Ok(_) => panic!("started in a missing directory"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.starts_with("sandbox setup failed: cannot enter the working directory")
            && err.contains(&missing.display().to_string()),
        "{err}"
    );
}

/// Hostile input on the parent side: a descriptor aimed at stdin/stdout/stderr is
/// refused before anything starts, as a typed setup error.
#[test]
fn descriptor_for_stdio_is_refused_before_spawn() {
    let ws = TempDir::new("launch-fd");
    let mut cmd = crate::common::runtime().command(policy(&ws), "true");
    let fd = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
    cmd.pass_fd(fd, 1);
    match cmd.spawn() {
        Err(LaunchError::Setup(e)) => {
            assert_eq!(e.step(), "descriptors");
            assert!(e.to_string().contains("reserved for stdio"), "{e}");
        }
        Err(e) => panic!("wrong error: {e:?}"),
        Ok(_) => panic!("a descriptor replaced stdout"),
    }
}
