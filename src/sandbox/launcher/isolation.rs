//! Adapter between the launcher and the isolation mechanisms of `cgroup`, `netns` and
//! `mounts` (which take plain parameters, not policy types): the launcher's steps, and
//! [`mount_view_of`], the view a policy asks for (the parent makes views ahead by it).
//!
//! Launcher-side functions return `Ok(None)` when applied, `Ok(Some(note))` when the
//! mechanism is not available and the policy allows best effort (the note lands in the
//! report's list of what was not enforced), `Err(SetupError)` when it is fatal.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use super::cgroup;
use super::error::SetupError;
use super::mounts::{self, MountView};
use super::netns;
use crate::sandbox::policy::resolve::ResolvedPolicy;

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
pub(crate) fn join_cgroup(
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

/// Launcher side: a private network namespace (loopback up if asked), unless the init
/// made it for this job (`made_by_init`: it is ours already).
pub(crate) fn isolate_network(
    loopback_up: bool,
    made_by_init: bool,
    best_effort: bool,
) -> Result<Option<String>, SetupError> {
    outcome(
        netns::isolate_network(loopback_up, made_by_init),
        best_effort,
        "private network namespace",
    )
}

/// The mount view `policy` asks for (`None`: the whole host file system). Executable
/// paths must exist in the view as well (bound read-only); the view makes its
/// `workspace` writable, so it is named only where the policy makes it writable.
pub(crate) fn mount_view_of(policy: &ResolvedPolicy) -> Option<MountView> {
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

/// Launcher side: a private mount namespace showing only the policy's paths (made by
/// the init for this job, `made_by_init`, or here).
pub(crate) fn apply_mount_view(
    view: &MountView,
    made_by_init: bool,
    best_effort: bool,
) -> Result<Option<String>, SetupError> {
    outcome(
        mounts::apply_mount_view(view, made_by_init),
        best_effort,
        "private mount view",
    )
}

/// Launcher side: join the view made ahead of need for this job (`ns`, owned from here).
pub(crate) fn enter_prepared_view(
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
