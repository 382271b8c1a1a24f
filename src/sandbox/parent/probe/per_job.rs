//! One sentence for `doctor` and `/readyz`: whether each job's memory and process limits
//! are held by a cgroup of the job's own (made under the server's own cgroup, which is
//! what "delegated" means for a server that is not root), and if not, why, what holds
//! each job instead, and which cgroup limit still holds the server and all its jobs
//! together (the ones its container or unit was given).

use super::CgroupSupport;
use super::enforcement::size;
use crate::sandbox::parent::cgroup::{CgroupVersion, PARENT_DIR};

/// Whether jobs get a cgroup each (the pids and the memory probe both created one).
pub(crate) fn enforced(cg: &CgroupSupport) -> bool {
    cg.pids.ok && cg.memory.ok
}

/// The sentence (see the module). `is_root`: as root a process limit cannot fall back to
/// RLIMIT_NPROC (it does not bind root), so such policies are refused instead.
pub(crate) fn words(cg: &CgroupSupport, is_root: bool) -> String {
    if enforced(cg) {
        let dirs = own_dirs(cg);
        let whose = if is_root {
            "own cgroup"
        } else {
            "own delegated cgroup"
        };
        let each: Vec<String> = dirs
            .iter()
            .map(|d| format!("{d}/{PARENT_DIR}/<job>"))
            .collect();
        return format!(
            "per-job memory and process limits: enforced via the server's {whose} {} (each job in {})",
            dirs.join(" and "),
            each.join(" and ")
        );
    }
    let why = cg
        .pids
        .error
        .clone()
        .or_else(|| cg.memory.error.clone())
        .unwrap_or_else(|| "no job cgroup could be made".into());
    let partial = if cg.pids.ok {
        " (a policy without a memory limit still gets a per-job process limit)"
    } else {
        ""
    };
    let instead = if is_root {
        "instead: memory through RLIMIT_AS per job (address space; coarser); a policy with a \
         process limit is refused as root (RLIMIT_NPROC does not bind root) unless it runs \
         best effort"
    } else {
        "instead: RLIMIT_AS per job for memory (address space; coarser) and RLIMIT_NPROC for \
         processes (it counts every process of the server's uid, not one job's)"
    };
    format!(
        "per-job memory and process limits: not enforced{partial}: {why}; {instead}; {}",
        together(cg)
    )
}

/// The cgroup limits that hold the server and all its jobs together, or that none does.
fn together(cg: &CgroupSupport) -> String {
    let a = &cg.ambient;
    let mut held = Vec::new();
    if let Some(m) = &a.memory_bytes {
        held.push(format!(
            "memory ≤ {} (set at {})",
            size(m.value),
            m.dir.display()
        ));
    }
    if let Some(p) = &a.processes {
        held.push(format!(
            "≤ {} processes (set at {})",
            p.value,
            p.dir.display()
        ));
    }
    if held.is_empty() {
        let at = own_dirs(cg);
        let at = if at.is_empty() {
            "no cgroup of its own was found".to_string()
        } else {
            format!("none is set at {} or above", at.join(" or "))
        };
        return format!("no cgroup limit holds the server and its jobs together either ({at})");
    }
    format!(
        "together, the server and all its jobs stay within its own cgroup's {}",
        held.join(" and ")
    )
}

/// The server's own cgroup directories jobs go under (v2: one; v1: pids, memory).
fn own_dirs(cg: &CgroupSupport) -> Vec<String> {
    let mut dirs: Vec<String> = match cg.version {
        CgroupVersion::V2 => cg.pids_dir.iter().cloned().collect(),
        _ => [&cg.pids_dir, &cg.memory_dir]
            .into_iter()
            .flatten()
            .cloned()
            .collect(),
    };
    dirs.dedup();
    dirs
}

#[cfg(test)]
mod tests {
    use super::super::Probe;
    use super::*;
    use crate::sandbox::parent::cgroup::ambient::{AmbientLimit, AmbientLimits};

    fn support(pids: bool, memory: bool, ambient: AmbientLimits) -> CgroupSupport {
        let p = |ok: bool, e: &str| Probe {
            ok,
            error: (!ok).then(|| e.to_string()),
        };
        CgroupSupport {
            version: CgroupVersion::V1,
            hybrid: true,
            pids_dir: Some("/sys/fs/cgroup/pids/cell".into()),
            memory_dir: Some("/sys/fs/cgroup/memory/cell".into()),
            pids: p(
                pids,
                "cannot create /sys/fs/cgroup/pids/cell/mcp-sandbox-repl: Read-only file system (os error 30)",
            ),
            memory: p(memory, "no memory"),
            v2_controllers: Vec::new(),
            ambient,
            per_job: String::new(),
        }
    }

    #[test]
    fn enforced_names_the_own_cgroups() {
        let w = words(&support(true, true, AmbientLimits::default()), false);
        assert_eq!(
            w,
            "per-job memory and process limits: enforced via the server's own delegated cgroup \
             /sys/fs/cgroup/pids/cell and /sys/fs/cgroup/memory/cell (each job in \
             /sys/fs/cgroup/pids/cell/mcp-sandbox-repl/<job> and \
             /sys/fs/cgroup/memory/cell/mcp-sandbox-repl/<job>)"
        );
        assert!(
            words(&support(true, true, AmbientLimits::default()), true).contains("own cgroup /sys")
        );
    }

    #[test]
    fn not_enforced_says_why_what_instead_and_what_holds_together() {
        let ambient = AmbientLimits {
            memory_bytes: Some(AmbientLimit {
                value: 2 << 30,
                dir: "/sys/fs/cgroup/memory/cell".into(),
            }),
            processes: None,
        };
        let w = words(&support(false, false, ambient), false);
        assert!(
            w.starts_with("per-job memory and process limits: not enforced: cannot create /sys/fs/cgroup/pids/cell/mcp-sandbox-repl: Read-only"),
            "{w}"
        );
        assert!(w.contains("RLIMIT_NPROC for processes"), "{w}");
        assert!(
            w.ends_with("together, the server and all its jobs stay within its own cgroup's memory ≤ 2 GiB (set at /sys/fs/cgroup/memory/cell)"),
            "{w}"
        );
        let w = words(&support(true, false, AmbientLimits::default()), true);
        assert!(w.contains("not enforced (a policy without a memory limit still gets a per-job process limit): no memory"), "{w}");
        assert!(w.contains("refused as root"), "{w}");
        assert!(
            w.ends_with("no cgroup limit holds the server and its jobs together either (none is set at /sys/fs/cgroup/pids/cell or /sys/fs/cgroup/memory/cell or above)"),
            "{w}"
        );
    }
}
