//! Adapter between the launcher and the isolation mechanisms owned by the sandbox-iso
//! work (cgroup, network namespace, mount view). Everything the launcher needs from
//! them goes through these few functions, in words, so that switching from the
//! placeholders to the real modules is one edit here.
//!
//! Launcher-side functions return `Ok(None)` when applied, `Ok(Some(note))` when the
//! mechanism is not available in this build (the note lands in the report's
//! `unenforced` list), `Err(words)` when applying it failed (fatal before exec).
//!
//! STATUS: the real modules have not landed yet; the placeholders below return notes.

use std::path::PathBuf;

/// The parent's handle on a job's cgroup(s).
#[derive(Debug)]
pub struct JobCgroupHandle {
    _private: (),
}

impl JobCgroupHandle {
    /// Create a cgroup for one job with these limits. `Err` in words.
    pub fn create(
        _name: &str,
        _memory_bytes: Option<u64>,
        _max_pids: Option<u64>,
    ) -> Result<JobCgroupHandle, String> {
        Err("cgroup support is not built yet".into())
    }
    pub fn procs_files(&self) -> Vec<PathBuf> {
        Vec::new()
    }
    pub fn has_memory_limit(&self) -> bool {
        false
    }
    pub fn peak_memory_bytes(&self) -> Option<u64> {
        None
    }
    pub fn memory_limit_hit(&self) -> bool {
        false
    }
    pub fn pids_limit_hit(&self) -> bool {
        false
    }
    pub fn kill_all(&self) {}
}

/// Launcher side: move the calling process into the job's cgroup(s).
pub fn join_cgroup(procs_files: &[PathBuf]) -> Result<Option<String>, String> {
    if procs_files.is_empty() {
        return Ok(None);
    }
    Ok(Some("cgroup limits (not built yet)".into()))
}

/// Launcher side: a private network namespace (loopback up if asked).
pub fn isolate_network(_loopback_up: bool) -> Result<Option<String>, String> {
    Ok(Some("private network namespace (not built yet)".into()))
}

/// What the mount view shows: `read` read-only, `write` writable, `tmp` also at /tmp.
pub struct MountViewSpec<'a> {
    pub read: &'a [PathBuf],
    pub write: &'a [PathBuf],
    pub tmp: &'a PathBuf,
    pub workspace: &'a PathBuf,
}

/// Launcher side: a private mount namespace showing only the policy's paths.
pub fn apply_mount_view(_view: &MountViewSpec<'_>) -> Result<Option<String>, String> {
    Ok(Some("private mount view (not built yet)".into()))
}
