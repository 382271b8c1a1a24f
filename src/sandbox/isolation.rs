//! Adapter between the launcher and the isolation mechanisms of `cgroup`, `netns` and
//! `mounts` (which take plain parameters, not policy types). Everything the launcher
//! and the spawn side need from them goes through these few functions.
//!
//! Launcher-side functions return `Ok(None)` when applied, `Ok(Some(note))` when the
//! mechanism is not available and the policy allows best effort (the note lands in the
//! report's list of what was not enforced), `Err(SetupError)` when it is fatal.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use super::cgroup::{self, CgroupError, JobCgroup};
use super::error::SetupError;
use super::mounts::{self, MountView};
use super::netns;
use super::resolve::ResolvedPolicy;

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
    pub fn current_memory_bytes(&self) -> Option<u64> {
        self.inner.current_memory_bytes()
    }
    pub fn pids_limit_hit(&self) -> bool {
        self.inner.pids_limit_hit()
    }
    pub fn kill_all(&self) {
        self.inner.kill_all()
    }
}

/// Server start: kill and remove the job cgroups of `owners`, servers known to have ended
/// (see `cgroup::sweep_owned_by`), never those of `own` (this server's instance id);
/// returns what was removed.
pub fn sweep_cgroups_of(own: &str, owners: &[String]) -> Vec<PathBuf> {
    cgroup::sweep_owned_by(cgroup::layout(), own, owners)
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

/// The mount view `policy` asks for (`None`: the whole host file system). Executable
/// paths must exist in the view as well (bound read-only); the view makes its
/// `workspace` writable, so it is named only where the policy makes it writable.
pub fn mount_view_of(policy: &ResolvedPolicy) -> Option<MountView> {
    if policy.filesystem_unrestricted() {
        return None;
    }
    let mut read = policy.read.clone();
    for p in &policy.execute {
        if !read.contains(p) {
            read.push(p.clone());
        }
    }
    let workspace = match policy.write.contains(&policy.workspace) {
        true => policy.workspace.clone(),
        false => PathBuf::new(),
    };
    Some(MountView {
        read,
        write: policy.write.clone(),
        tmp: policy.tmp.clone(),
        tmp_size: policy.limits.tmp_size_bytes,
        hide: policy.hide.clone(),
        workspace,
    })
}

/// Launcher side: a private mount namespace showing only the policy's paths.
pub fn apply_mount_view(view: &MountView, best_effort: bool) -> Result<Option<String>, SetupError> {
    outcome(
        mounts::apply_mount_view(view),
        best_effort,
        "private mount view",
    )
}

/// Launcher side: join the view made ahead of need for this job (`ns`, owned from here).
pub fn enter_prepared_view(
    ns: &OwnedFd,
    mount_proc: bool,
    workspace: &Path,
    best_effort: bool,
) -> Result<Option<String>, SetupError> {
    outcome(
        mounts::enter_prepared_view(ns, mount_proc, workspace),
        best_effort,
        "private mount view",
    )
}
