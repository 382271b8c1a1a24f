//! Test helpers: the built binary, throwaway workspaces, running `run` and parsing its
//! `--json` report.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// Path of the binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mcp-sandbox-repl"))
}

/// A fresh directory removed on drop, under /var/tmp/msr-tests: outside /tmp, because
/// the mount view puts each job's private temp dir at /tmp, and outside any other
/// test's workspace.
pub struct TempDir {
    pub path: PathBuf,
}

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = PathBuf::from("/var/tmp/msr-tests").join(format!(
            "msr-test-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).unwrap();
        // Canonical, so that comparisons with what the child sees hold.
        TempDir {
            path: path.canonicalize().unwrap(),
        }
    }

    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.path.join(p)
    }

    /// Write a file inside the directory and return its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// `mcp-sandbox-repl run --policy POLICY --workspace WS [--json] -- ARGS...`
pub fn run_in(policy: &str, ws: &Path, json: bool, args: &[&str]) -> Output {
    run_cmd(policy, ws, json, args).output().unwrap()
}

/// The `Command` for `run`, to add environment variables before starting it.
pub fn run_cmd(policy: &str, ws: &Path, json: bool, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin());
    cmd.arg("run")
        .arg("--policy")
        .arg(policy)
        .arg("--workspace")
        .arg(ws);
    if json {
        cmd.arg("--json");
    }
    cmd.arg("--").args(args.iter().map(OsStr::new));
    cmd
}

/// `sh -c SCRIPT` under `policy` in `ws`.
pub fn sh(policy: &str, ws: &Path, script: &str) -> Output {
    run_in(policy, ws, false, &["sh", "-c", script])
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The `--json` report: the last line of stdout.
pub fn report(o: &Output) -> serde_json::Value {
    let out = stdout(o);
    let line = out.lines().last().unwrap_or_default();
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("no JSON report ({e}); stdout: {out}; stderr: {}", stderr(o)))
}
