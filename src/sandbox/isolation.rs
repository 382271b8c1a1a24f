//! Adapter between the launcher and the isolation mechanisms owned by the sandbox-iso
//! work (cgroup, network namespace, mount view). Everything the launcher needs from
//! them goes through these few functions, in words, so that switching from the
//! placeholders to the real modules is one edit here.
//!
//! Launcher-side functions return `Ok(None)` when applied, `Ok(Some(note))` when the
//! mechanism is not available in this build (the note lands in the report's
//! `unenforced` list), `Err(words)` when applying it failed (fatal before exec).
//!
//! STATUS: wired to the real modules (`cgroup`, `netns`, `mounts`).

use std::path::PathBuf;

use super::{cgroup, mounts, netns};

/// The parent's handle on a job's cgroup(s).
#[derive(Debug)]
pub struct JobCgroupHandle {
    inner: cgroup::JobCgroup,
    memory: bool,
}

impl JobCgroupHandle {
    /// Create a cgroup for one job with these limits. `Err` in words.
    pub fn create(
        name: &str,
        memory_bytes: Option<u64>,
        max_pids: Option<u64>,
    ) -> Result<JobCgroupHandle, String> {
        let inner =
            cgroup::JobCgroup::create(name, memory_bytes, max_pids).map_err(|e| e.to_string())?;
        Ok(JobCgroupHandle {
            inner,
            memory: memory_bytes.is_some(),
        })
    }
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.inner.procs_files()
    }
    pub fn has_memory_limit(&self) -> bool {
        self.memory
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

/// Launcher side: move the calling process into the job's cgroup(s).
pub fn join_cgroup(procs_files: &[PathBuf]) -> Result<Option<String>, String> {
    cgroup::join_current(procs_files)
        .map(|()| None)
        .map_err(|e| e.to_string())
}

/// Launcher side: a private network namespace (loopback up if asked).
pub fn isolate_network(loopback_up: bool) -> Result<Option<String>, String> {
    netns::isolate_network(loopback_up)
        .map(|()| None)
        .map_err(|e| e.to_string())
}

/// What the mount view shows: `read` read-only, `write` writable, `tmp` also at /tmp.
pub struct MountViewSpec<'a> {
    pub read: &'a [PathBuf],
    pub write: &'a [PathBuf],
    pub tmp: &'a PathBuf,
    pub workspace: &'a PathBuf,
}

/// Launcher side: a private mount namespace showing only the policy's paths.
pub fn apply_mount_view(view: &MountViewSpec<'_>) -> Result<Option<String>, String> {
    let view = mounts::MountView {
        read: view.read.to_vec(),
        write: view.write.to_vec(),
        tmp: view.tmp.clone(),
        workspace: view.workspace.clone(),
    };
    mounts::apply_mount_view(&view)
        .map(|()| None)
        .map_err(|e| e.to_string())
}
