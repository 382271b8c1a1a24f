//! The policies uv processes run under: the session's policy, plus network and write
//! access to exactly the paths the operation must change (the venv, the uv cache).
//!
//! Session code itself never gets these grants: the session policy sees the venv
//! only through its `{venv}` read rule, and keeps its own network setting.

use std::path::PathBuf;

use crate::sandbox::ResolvedPolicy;

/// What a uv process may do beyond the session's policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    /// Paths the process may write (created before the policy is built: Landlock
    /// rules name existing paths).
    pub write: Vec<PathBuf>,
    /// Paths the process may read (and execute from), e.g. the uv binary, a
    /// find-links directory, an inline script.
    pub read: Vec<PathBuf>,
    /// Whether the process may use the network (package resolution and downloads).
    pub network: bool,
}

/// The session policy extended by `grants`.
///
/// ADAPTER (marked so it is easy to find): the sandbox subsystem is to provide
/// `ResolvedPolicy::with_write(path)`, `.with_read(path)` and
/// `.with_network(NetworkPolicy)`. Until those land in `main` this returns the session
/// policy unchanged, which is only correct while the launcher is the unsandboxed stub.
/// When they land, replace the body with:
/// ```ignore
/// let mut p = base.clone();
/// for w in &grants.write { p = p.with_write(w); }
/// for r in &grants.read { p = p.with_read(r); }
/// if grants.network { p = p.with_network(NetworkPolicy::Allow); }
/// p
/// ```
pub fn extend(base: &ResolvedPolicy, grants: &Grants) -> ResolvedPolicy {
    let _ = grants;
    base.clone()
}
