//! One sentence for `doctor` and `/readyz`: whether each job's memory and process limits
//! are held by a cgroup of the job's own (made under the server's own cgroup, which is
//! what "delegated" means for a server that is not root), and if not, why, what holds
//! each job instead, and which cgroup limit still holds the server and all its jobs
//! together (the ones its container or unit was given).

use crate::sandbox::parent::cgroup::ambient::AmbientLimits;
use crate::sandbox::parent::cgroup::{CgroupVersion, PARENT_DIR};

/// What the sentence is made of: the cgroup probes' outcome (`None`: a job cgroup with
/// that cap was made) and where the server's own cgroup is.
pub(crate) struct Inputs<'a> {
    pub version: CgroupVersion,
    pub pids_dir: Option<&'a str>,
    pub memory_dir: Option<&'a str>,
    pub pids_error: Option<&'a str>,
    pub memory_error: Option<&'a str>,
    pub ambient: &'a AmbientLimits,
    /// As root a process limit cannot fall back to RLIMIT_NPROC (it does not bind root),
    /// so such policies are refused instead.
    pub is_root: bool,
}

/// The sentence (see the module).
pub(crate) fn words(i: &Inputs) -> String {
    if i.pids_error.is_none() && i.memory_error.is_none() {
        let dirs = own_dirs(i);
        let whose = if i.is_root {
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
    let why = i
        .pids_error
        .or(i.memory_error)
        .unwrap_or("no job cgroup could be made");
    let partial = if i.pids_error.is_none() {
        " (a policy without a memory limit still gets a per-job process limit)"
    } else {
        ""
    };
    let instead = if i.is_root {
        "instead: memory through RLIMIT_AS per job (address space; coarser); a policy with a \
         process limit is refused as root (RLIMIT_NPROC does not bind root) unless it runs \
         best effort"
    } else {
        "instead: RLIMIT_AS per job for memory (address space; coarser) and RLIMIT_NPROC for \
         processes (it counts every process of the server's uid, not one job's)"
    };
    format!(
        "per-job memory and process limits: not enforced{partial}: {why}; {instead}; {}",
        together(i)
    )
}

/// The cgroup limits that hold the server and all its jobs together, or that none does.
fn together(i: &Inputs) -> String {
    let a = i.ambient;
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
        let at = own_dirs(i);
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
fn own_dirs(i: &Inputs) -> Vec<String> {
    let mut dirs: Vec<String> = match i.version {
        CgroupVersion::V2 => i.pids_dir.iter().map(|d| d.to_string()).collect(),
        _ => [i.pids_dir, i.memory_dir]
            .into_iter()
            .flatten()
            .map(str::to_string)
            .collect(),
    };
    dirs.dedup();
    dirs
}

/// Bytes in words: "4 GiB", "512 MiB", or plain bytes.
pub(crate) fn size(bytes: u64) -> String {
    for (unit, name) in [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")] {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{} {name}", bytes / unit);
        }
    }
    format!("{bytes} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::parent::cgroup::ambient::AmbientLimit;

    const RO: &str = "cannot create /sys/fs/cgroup/pids/cell/mcp-sandbox-repl: Read-only file system (os error 30)";

    fn inputs<'a>(pids: bool, memory: bool, ambient: &'a AmbientLimits, root: bool) -> Inputs<'a> {
        Inputs {
            version: CgroupVersion::V1,
            pids_dir: Some("/sys/fs/cgroup/pids/cell"),
            memory_dir: Some("/sys/fs/cgroup/memory/cell"),
            pids_error: (!pids).then_some(RO),
            memory_error: (!memory).then_some("no memory"),
            ambient,
            is_root: root,
        }
    }

    #[test]
    fn enforced_names_the_own_cgroups() {
        let none = AmbientLimits::default();
        assert_eq!(
            words(&inputs(true, true, &none, false)),
            "per-job memory and process limits: enforced via the server's own delegated cgroup \
             /sys/fs/cgroup/pids/cell and /sys/fs/cgroup/memory/cell (each job in \
             /sys/fs/cgroup/pids/cell/mcp-sandbox-repl/<job> and \
             /sys/fs/cgroup/memory/cell/mcp-sandbox-repl/<job>)"
        );
        assert!(words(&inputs(true, true, &none, true)).contains("own cgroup /sys"));
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
        let w = words(&inputs(false, false, &ambient, false));
        assert!(
            w.starts_with(&format!(
                "per-job memory and process limits: not enforced: {RO}"
            )),
            "{w}"
        );
        assert!(w.contains("RLIMIT_NPROC for processes"), "{w}");
        assert!(
            w.ends_with("together, the server and all its jobs stay within its own cgroup's memory ≤ 2 GiB (set at /sys/fs/cgroup/memory/cell)"),
            "{w}"
        );
        let none = AmbientLimits::default();
        let w = words(&inputs(true, false, &none, true));
        assert!(w.contains("not enforced (a policy without a memory limit still gets a per-job process limit): no memory"), "{w}");
        assert!(w.contains("refused as root"), "{w}");
        assert!(
            w.ends_with("no cgroup limit holds the server and its jobs together either (none is set at /sys/fs/cgroup/pids/cell or /sys/fs/cgroup/memory/cell or above)"),
            "{w}"
        );
    }
}
