//! The parent's side of a job's cgroup: the handle spawn and child hold, and the sweep of
//! what ended servers left.

use std::path::PathBuf;

use super::cgroup::{self, CgroupError, CgroupHost, JobCgroup};

/// The parent's handle on a job's cgroup(s). Dropping it kills what is left and removes it.
#[derive(Debug)]
pub(crate) struct JobCgroupHandle {
    inner: JobCgroup,
    has_memory: bool,
}

impl JobCgroupHandle {
    /// Create a cgroup for one job with these limits.
    pub(crate) fn create(
        host: &CgroupHost,
        name: &str,
        memory_bytes: Option<u64>,
        max_pids: Option<u64>,
    ) -> Result<JobCgroupHandle, CgroupError> {
        JobCgroup::create(host, name, memory_bytes, max_pids).map(|inner| JobCgroupHandle {
            inner,
            has_memory: memory_bytes.is_some(),
        })
    }
    pub(crate) fn procs_files(&self) -> Vec<PathBuf> {
        self.inner.procs_files()
    }
    pub(crate) fn has_memory_limit(&self) -> bool {
        self.has_memory
    }
    pub(crate) fn memory_limit_hit(&self) -> bool {
        self.inner.memory_limit_hit()
    }
    pub(crate) fn current_memory_bytes(&self) -> Option<u64> {
        self.inner.current_memory_bytes()
    }
    pub(crate) fn pids_limit_hit(&self) -> bool {
        self.inner.pids_limit_hit()
    }
    pub(crate) fn kill_all(&self) {
        self.inner.kill_all()
    }
    /// Remove the cgroup now if nothing is left in it (see `JobCgroup::remove_if_empty`).
    pub(crate) fn remove_if_empty(&self) -> bool {
        self.inner.remove_if_empty()
    }
}

/// Server start: kill and remove the job cgroups of `owners`, servers known to have ended
/// (see `cgroup::sweep_owned_by`), never those of `own` (this server's instance id);
/// returns what was removed.
pub(crate) fn sweep_cgroups_of(host: &CgroupHost, own: &str, owners: &[String]) -> Vec<PathBuf> {
    cgroup::sweep_owned_by(host.layout(), own, owners)
}

/// Server exit: kill and remove what is left of this server's own job cgroups.
pub(crate) fn remove_own_cgroups(host: &CgroupHost, own: &str) -> Vec<PathBuf> {
    cgroup::remove_own(host.layout(), own)
}
