//! Adapter between the launcher and the isolation mechanisms of `cgroup`, `netns` and
//! `mounts` (which take plain parameters, not policy types). Everything the launcher
//! and the spawn side need from them goes through these few functions.
//!
//! Launcher-side functions return `Ok(None)` when applied, `Ok(Some(note))` when the
//! mechanism is not available and the policy allows best effort (the note lands in the
//! report's list of what was not enforced), `Err(SetupError)` when it is fatal.

use std::path::PathBuf;

use super::cgroup::{self, CgroupError, JobCgroup};
use super::error::SetupError;
use super::mounts::{self, MountView};
use super::netns;

/// The parent's handle on a job's cgroup(s). Dropping it kills what is left and removes it.
#[derive(Debug)]
pub struct JobCgroupHandle {
    inner: JobCgroup,
    has_memory: bool,
}

impl JobCgroupHandle {
    /// Create a cgroup for one job with these limits.
    pub fn create(
        name: &str,
        memory_bytes: Option<u64>,
        max_pids: Option<u64>,
    ) -> Result<JobCgroupHandle, CgroupError> {
        JobCgroup::create(name, memory_bytes, max_pids).map(|inner| JobCgroupHandle {
            inner,
            has_memory: memory_bytes.is_some(),
        })
    }
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.inner.procs_files()
    }
    pub fn has_memory_limit(&self) -> bool {
        self.has_memory
    }
    pub fn peak_memory_bytes(&self) -> Option<u64> {
        self.inner.peak_memory_bytes()
    }
    pub fn memory_limit_hit(&self) -> bool {
        self.inner.memory_limit_hit()
    }
    pub fn pids_limit_hit(&self) -> bool {
        self.inner.pids_limit_hit()
    }
    pub fn kill_all(&self) {
        self.inner.kill_all()
    }
}

/// Server start: kill and remove the job cgroups of servers that are no longer running;
/// returns what was removed.
pub fn sweep_orphaned_cgroups() -> Vec<PathBuf> {
    cgroup::sweep_orphaned(cgroup::layout())
}

fn outcome<E: std::fmt::Display + Into<SetupError>>(
    result: Result<(), E>,
    best_effort: bool,
    what: &str,
) -> Result<Option<String>, SetupError> {
    match result {
        Ok(()) => Ok(None),
        Err(e) if best_effort => Ok(Some(format!("{what} ({e})"))),
        Err(e) => Err(e.into()),
    }
}

/// Launcher side: move the calling process into the job's cgroup(s).
pub fn join_cgroup(
    procs_files: &[PathBuf],
    best_effort: bool,
) -> Result<Option<String>, SetupError> {
    if procs_files.is_empty() {
        return Ok(None);
    }
    outcome(
        cgroup::join_current(procs_files),
        best_effort,
        "cgroup limits",
    )
}

/// Launcher side: a private network namespace (loopback up if asked).
pub fn isolate_network(loopback_up: bool, best_effort: bool) -> Result<Option<String>, SetupError> {
    outcome(
        netns::isolate_network(loopback_up),
        best_effort,
        "private network namespace",
    )
}

/// What the mount view shows: `read` read-only, `write` writable, `tmp` also at /tmp.
pub struct MountViewSpec<'a> {
    pub read: &'a [PathBuf],
    pub write: &'a [PathBuf],
    pub tmp: &'a PathBuf,
    /// Make `tmp` a tmpfs of this size in the view instead of binding the host directory.
    pub tmp_size: Option<u64>,
    /// Covered by an empty read-only directory (listed paths beneath stay visible).
    pub hide: &'a [PathBuf],
    pub workspace: &'a PathBuf,
}

/// Launcher side: a private mount namespace showing only the policy's paths.
pub fn apply_mount_view(
    view: &MountViewSpec<'_>,
    best_effort: bool,
) -> Result<Option<String>, SetupError> {
    // Executable paths must be visible too; the view binds them read-only.
    let view = MountView {
        read: view.read.to_vec(),
        write: view.write.to_vec(),
        tmp: view.tmp.clone(),
        tmp_size: view.tmp_size,
        hide: view.hide.to_vec(),
        workspace: view.workspace.clone(),
    };
    outcome(
        mounts::apply_mount_view(&view),
        best_effort,
        "private mount view",
    )
}
