//! The launcher's cgroup step: join the job's cgroup(s) the parent made
//! (`parent::cgroup`), and the error every cgroup operation reports.

use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "no usable cgroup hierarchy with the {controller} controller (checked /proc/self/mountinfo and \
         /proc/self/cgroup); mount cgroup v2 with {controller} delegated, or a cgroup v1 {controller} \
         hierarchy, or use a policy without a {what} limit"
    )]
    NoController {
        controller: &'static str,
        what: &'static str,
    },
    /// v2: the controller is not in the server's cgroup's `cgroup.controllers` (not
    /// enabled in its parent, or bound to a v1 hierarchy on a hybrid host).
    #[error(
        "the cgroup v2 hierarchy offers no {controller} controller to the server's cgroup {dir} \
         (its cgroup.controllers: {offered}): its parent does not enable {controller} in \
         cgroup.subtree_control, or (hybrid host) {controller} is bound to a cgroup v1 hierarchy; \
         delegate a cgroup with pids and memory enabled (e.g. systemd Delegate=yes, or a \
         container runtime's own cgroup namespace), or use a policy without a {what} limit"
    )]
    NotOffered {
        controller: &'static str,
        what: &'static str,
        dir: PathBuf,
        offered: String,
    },
    #[error(
        "cgroup v2 is not delegated to this server: cannot enable {controllers} in {dir}: {reason}; \
         run the server in its own cgroup (e.g. `systemd-run --scope -p Delegate=yes ...`) or as the \
         only process of a container"
    )]
    NotDelegated {
        dir: PathBuf,
        controllers: String,
        /// Why enabling them failed (shared: the outcome is prepared once per process).
        reason: std::sync::Arc<CgroupError>,
    },
    #[error(
        "cannot {action} {path}: {source}; is the cgroup filesystem writable (root or delegated)?"
    )]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// Controllers cannot be enabled where other processes live (no-internal-processes).
    #[error("{source}; other processes share the cgroup ({others} of them)")]
    Shared {
        source: std::io::Error,
        others: usize,
    },
    #[error("cannot join cgroup {path}: {source}; the job cannot be limited, refusing to run it")]
    Join {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Launcher child: move the calling process into every given membership file.
/// Writing "0" means "the writer". On v1 the files are `tasks` (moves only the calling
/// thread): the kernel then skips the global threadgroup lock whose RCU grace period
/// makes a `cgroup.procs` write cost ~10 ms here, against ~0.2 ms. That is only the
/// whole process if it is single-threaded — as the launcher is; otherwise the
/// `cgroup.procs` beside it is used.
pub(crate) fn join_current(procs_files: &[PathBuf]) -> Result<(), CgroupError> {
    // Looked at once: a launcher starts no thread between its joins.
    let single_threaded = procs_files.iter().any(|p| p.ends_with("tasks"))
        && std::fs::read_dir("/proc/self/task")
            .map(|d| d.count() == 1)
            .unwrap_or(false);
    for path in procs_files {
        let procs;
        let path = if path.ends_with("tasks") && !single_threaded {
            procs = path.with_file_name("cgroup.procs");
            &procs
        } else {
            path
        };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|source| CgroupError::Join {
                path: path.clone(),
                source,
            })?;
        file.write_all(b"0").map_err(|source| CgroupError::Join {
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
}
