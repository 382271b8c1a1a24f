//! cgroup v2 preparation: enabling the pids and memory controllers for the job cgroups
//! under the server's own cgroup, within the no-internal-processes rule.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use super::fs::{PARENT_DIR, SERVER_LEAF, io, mkdir_ok_exists};
use super::layout::Layout;
use crate::sandbox::launcher::cgroup::CgroupError;

/// The outcome of preparing the v2 parent, kept by a `CgroupHost`.
pub(super) type V2Parent = OnceLock<Result<PathBuf, Arc<CgroupError>>>;

/// v2: the prepared parent directory (controllers enabled), or why it could not be;
/// prepared once into `prepared` when given (a runtime's host), else anew (tests' fake
/// layouts).
pub(super) fn v2_parent(
    layout: &Layout,
    prepared: Option<&V2Parent>,
) -> Result<PathBuf, CgroupError> {
    let own = layout.v2_own.clone().ok_or(CgroupError::NoController {
        controller: "pids",
        what: "process",
    })?;
    let controllers: Vec<&str> = ["pids", "memory"]
        .into_iter()
        .filter(|c| layout.v2_controllers.iter().any(|h| h == c))
        .collect();
    let prepare = || {
        prepare_v2(
            &own,
            &controllers,
            std::process::id(),
            layout.v2_at_namespace_root,
        )
        .map_err(Arc::new)
    };
    let result = match prepared {
        Some(once) => once.get_or_init(prepare).clone(),
        None => prepare(),
    };
    result.map_err(|reason| CgroupError::NotDelegated {
        dir: own,
        controllers: controllers.join(" "),
        reason,
    })
}

/// Enable `controllers` for `<own>/mcp-sandbox-repl/*`, moving this process (`pid`) into a
/// leaf first if the no-internal-processes rule requires it. Other processes in `own`
/// (an init such as tini that started the server) are moved into the same leaf only when
/// `own` is the root of this process's cgroup namespace (`ns_root`): then they are all
/// the container's; anywhere else they may be anyone's, and the server refuses instead.
pub(crate) fn prepare_v2(
    own: &Path,
    controllers: &[&str],
    pid: u32,
    ns_root: bool,
) -> Result<PathBuf, CgroupError> {
    let enable: String = controllers.iter().map(|c| format!("+{c} ")).collect();
    let enable = enable.trim_end();
    let subtree = own.join("cgroup.subtree_control");
    let already = std::fs::read_to_string(&subtree).unwrap_or_default();
    let missing = controllers
        .iter()
        .any(|c| !already.split_whitespace().any(|h| h == *c));
    if missing && let Err(first) = std::fs::write(&subtree, enable) {
        // EBUSY: processes live in `own`. Move ourselves out if we are the only one.
        let procs = std::fs::read_to_string(own.join("cgroup.procs")).map_err(io("read", own))?;
        let others: Vec<&str> = procs
            .split_whitespace()
            .filter(|p| *p != pid.to_string())
            .collect();
        if !others.is_empty() && !ns_root {
            return Err(CgroupError::NotDelegated {
                dir: own.to_path_buf(),
                controllers: controllers.join(" "),
                reason: Arc::new(CgroupError::Shared {
                    source: first,
                    others: others.len(),
                }),
            });
        }
        let leaf = own.join(SERVER_LEAF);
        mkdir_ok_exists(&leaf)?;
        let into = leaf.join("cgroup.procs");
        std::fs::write(&into, pid.to_string()).map_err(io("move the server into", &leaf))?;
        // The container's other processes (a few passes: one may fork meanwhile); one that
        // exits in between is no error.
        for _ in 0..8 {
            let left = std::fs::read_to_string(own.join("cgroup.procs")).unwrap_or_default();
            if left.trim().is_empty() {
                break;
            }
            for other in left.split_whitespace() {
                match std::fs::write(&into, other) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                    Err(e) => return Err(io("move the container's processes into", &leaf)(e)),
                }
            }
        }
        std::fs::write(&subtree, enable).map_err(io("enable controllers in", &subtree))?;
    }
    let parent = own.join(PARENT_DIR);
    mkdir_ok_exists(&parent)?;
    let sub = parent.join("cgroup.subtree_control");
    if !controllers.is_empty() {
        std::fs::write(&sub, enable).map_err(io("enable controllers in", &sub))?;
    }
    Ok(parent)
}
