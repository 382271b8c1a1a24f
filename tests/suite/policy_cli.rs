//! `policy list|show|check` and bad input to `run`: each mistake gives one clear line
//! naming the problem and a non-zero exit.

use std::process::Command;

use crate::common::{TempDir, bin, run_in, stderr, stdout};

fn policy(args: &[&str]) -> std::process::Output {
    Command::new(bin())
        .arg("policy")
        .args(args)
        .output()
        .unwrap()
}

/// The one error line of a failed command.
fn one_error_line(o: &std::process::Output) -> String {
    assert_ne!(
        o.status.code(),
        Some(0),
        "expected failure; stdout: {}",
        stdout(o)
    );
    let err = stderr(o);
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "expected one line, got:\n{err}"
    );
    err
}

#[test]
fn list_shows_the_shipped_policies() {
    let out = policy(&["list"]);
    let text = stdout(&out);
    for name in ["read-only", "workspace-write", "danger-full-access", "ci"] {
        assert!(
            text.lines().any(|l| l.starts_with(name)),
            "{name} missing:\n{text}"
        );
    }
}

#[test]
fn show_resolves_the_workspace() {
    let ws = TempDir::new("show");
    let out = policy(&[
        "show",
        "workspace-write",
        "--workspace",
        ws.path.to_str().unwrap(),
    ]);
    let text = stdout(&out);
    let value: toml::Value = toml::from_str(&text).unwrap();
    let write = value["write"].as_array().unwrap();
    assert!(
        write
            .iter()
            .any(|p| p.as_str() == Some(ws.path.to_str().unwrap())),
        "{text}"
    );
    assert_eq!(value["network"]["mode"].as_str(), Some("none"));
}

#[test]
fn check_accepts_good_and_names_bad_keys() {
    let dir = TempDir::new("check");
    let good = dir.write("good.toml", "[network]\nmode = \"loopback\"\n");
    assert!(policy(&["check", good.to_str().unwrap()]).status.success());

    let bad = dir.write("bad.toml", "[filesystem]\nreed = [\"/usr\"]\n");
    let err = one_error_line(&policy(&["check", bad.to_str().unwrap()]));
    assert!(
        err.contains("bad.toml") && err.contains("reed") && err.contains("`read`"),
        "{err}"
    );

    let rel = dir.write("rel.toml", "[filesystem]\nwrite = [\"data\"]\n");
    let err = one_error_line(&policy(&["check", rel.to_str().unwrap()]));
    assert!(
        err.contains("filesystem.write[0]") && err.contains("relative path"),
        "{err}"
    );

    let zero = dir.write("zero.toml", "[limits]\nmemory = 0\n");
    let err = one_error_line(&policy(&["check", zero.to_str().unwrap()]));
    assert!(
        err.contains("limits.memory") && err.contains("0 makes no sense"),
        "{err}"
    );

    let syntax = dir.write("syntax.toml", "[limits\n");
    one_error_line(&policy(&["check", syntax.to_str().unwrap()]));
}

#[test]
fn run_bad_input() {
    let ws = TempDir::new("bad");
    let err = one_error_line(&run_in("no-such-policy", &ws.path, false, &["true"]));
    assert!(
        err.contains("read-only, workspace-write, danger-full-access, ci"),
        "{err}"
    );

    let missing = ws.join("missing");
    let err = one_error_line(&run_in("ci", &missing, false, &["true"]));
    assert!(err.contains("does not exist"), "{err}");

    let zero = ws.write("zero.toml", "[limits]\nmemory = \"0GiB\"\n");
    let err = one_error_line(&run_in(zero.to_str().unwrap(), &ws.path, false, &["true"]));
    assert!(err.contains("limits.memory"), "{err}");

    // No command at all: clap's usage error, non-zero.
    let out = Command::new(bin()).args(["run", "--"]).output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("required"), "{}", stderr(&out));
}
