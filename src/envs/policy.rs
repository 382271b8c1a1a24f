//! The policies uv processes run under: the session's policy, plus network and write
//! access to exactly the paths the operation must change (the venv, the uv cache).
//!
//! Session code itself never gets these grants: the session policy sees the venv
//! only through its `{venv}` read rule, and keeps its own network setting.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::sandbox::{NetworkPolicy, ResolvedPolicy};

/// What a uv process may do beyond the session's policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    /// Paths the process may write (created before the policy is built: Landlock
    /// rules name existing paths).
    pub write: Vec<PathBuf>,
    /// Paths the process may read, e.g. a find-links directory, an inline script,
    /// TLS roots.
    pub read: Vec<PathBuf>,
    /// Programs the process may execute: the uv binary, the base interpreter.
    pub execute: Vec<PathBuf>,
    /// Whether the process may use the network (package resolution and downloads).
    pub network: bool,
}

/// The session policy extended by `grants`.
pub fn extend(base: &ResolvedPolicy, grants: &Grants) -> ResolvedPolicy {
    let mut p = base.clone();
    for w in &grants.write {
        p = p.with_write(w);
    }
    for r in &grants.read {
        p = p.with_read(r);
    }
    for x in &grants.execute {
        p = p.with_execute(x);
    }
    if grants.network {
        p = p.with_network(NetworkPolicy::Full);
    }
    p
}

/// `PATH` for a uv process: the directory of `python` first, then the entries of
/// `path` the policy lets it execute from. uv searches PATH for interpreters and stops
/// at the first one it cannot run (a pyenv shim outside the sandbox's execute set), so
/// the entries it could never use are left out.
pub fn sandbox_path(policy: &ResolvedPolicy, python: &Path, path: Option<&OsStr>) -> OsString {
    let mut dirs: Vec<PathBuf> = python.parent().map(Path::to_path_buf).into_iter().collect();
    for dir in path.map(std::env::split_paths).into_iter().flatten() {
        let allowed = policy.filesystem_unrestricted()
            || policy.execute.iter().any(|root| dir.starts_with(root));
        if allowed && !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    std::env::join_paths(dirs).unwrap_or_default()
}
