//! The limits the server's *own* cgroup already imposes (set by whoever started it: a
//! container runtime, a systemd unit): where the server cannot make a cgroup per job,
//! these are the only cgroup limits its jobs still run under — together with the server
//! itself and each other, not each on its own. Read only; nothing here writes.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::layout::{CgroupVersion, Layout};

/// One cgroup limit and the directory that sets it (the tightest between the server's
/// own cgroup and the top of the hierarchy visible here).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct AmbientLimit {
    pub value: u64,
    pub dir: PathBuf,
}

/// The memory and process limits of the server's own cgroup and its ancestors.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct AmbientLimits {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<AmbientLimit>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes: Option<AmbientLimit>,
}

/// v1 reports "no memory limit" as a huge page-aligned number (2^63 - 4096 on x86-64);
/// anything at or past 2^62 bytes is no limit.
const UNLIMITED_FROM: u64 = 1 << 62;

impl AmbientLimits {
    /// Read from the cgroup directories `layout` names (v2: the one; v1: pids and memory).
    pub(crate) fn read(layout: &Layout) -> AmbientLimits {
        let (mem_dir, mem_mount, pids_dir, pids_mount, mem_file) = match layout.version {
            CgroupVersion::V2 => (
                layout.v2_own.as_deref(),
                layout.v2_mount.as_deref(),
                layout.v2_own.as_deref(),
                layout.v2_mount.as_deref(),
                "memory.max",
            ),
            CgroupVersion::V1 | CgroupVersion::None => (
                layout.v1_memory.as_deref(),
                v1_mount(layout, "memory"),
                layout.v1_pids.as_deref(),
                v1_mount(layout, "pids"),
                "memory.limit_in_bytes",
            ),
        };
        AmbientLimits {
            memory_bytes: mem_dir.and_then(|d| tightest(d, mem_mount, mem_file)),
            processes: pids_dir.and_then(|d| tightest(d, pids_mount, "pids.max")),
        }
    }
}

fn v1_mount<'a>(layout: &'a Layout, controller: &str) -> Option<&'a Path> {
    layout
        .v1
        .iter()
        .find(|c| c.name == controller)
        .map(|c| c.mount.as_path())
}

/// The smallest `file` value from `dir` up to `top` (inclusive; `dir` alone without it).
/// "max", a missing file or a value past [`UNLIMITED_FROM`] is no limit.
fn tightest(dir: &Path, top: Option<&Path>, file: &str) -> Option<AmbientLimit> {
    let mut best: Option<AmbientLimit> = None;
    let mut at = Some(dir);
    while let Some(d) = at {
        let value = std::fs::read_to_string(d.join(file))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .filter(|v| *v < UNLIMITED_FROM);
        if let Some(value) = value
            && best.as_ref().is_none_or(|b| value < b.value)
        {
            best = Some(AmbientLimit {
                value,
                dir: d.to_path_buf(),
            });
        }
        if top.is_none_or(|t| d == t) {
            break;
        }
        at = d.parent().filter(|p| top.is_some_and(|t| p.starts_with(t)));
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::scratch_dir;

    fn v2(mount: &Path, own: &Path) -> Layout {
        Layout {
            version: CgroupVersion::V2,
            hybrid: false,
            v1: Vec::new(),
            v1_pids: None,
            v1_memory: None,
            v2_mount: Some(mount.to_path_buf()),
            v2_own: Some(own.to_path_buf()),
            v2_controllers: vec!["pids".into(), "memory".into()],
            v2_at_namespace_root: false,
        }
    }

    /// The tightest limit on the way up wins, named with its directory; "max" and v1's
    /// huge "unlimited" are no limit; nothing above the mount is read.
    #[test]
    fn tightest_limit_up_to_the_mount() {
        let scratch = scratch_dir("ambient");
        let root = scratch.path().join("cg");
        let own = root.join("pod/ctr");
        std::fs::create_dir_all(&own).unwrap();
        std::fs::write(scratch.path().join("memory.max"), "1\n").unwrap(); // above the mount
        std::fs::write(root.join("memory.max"), "max\n").unwrap();
        std::fs::write(root.join("pod/memory.max"), "1073741824\n").unwrap();
        std::fs::write(own.join("memory.max"), "2147483648\n").unwrap();
        std::fs::write(own.join("pids.max"), "max\n").unwrap();
        std::fs::write(root.join("pod/pids.max"), "9223372036854771712\n").unwrap();
        let a = AmbientLimits::read(&v2(&root, &own));
        assert_eq!(
            a.memory_bytes,
            Some(AmbientLimit {
                value: 1 << 30,
                dir: root.join("pod")
            })
        );
        assert_eq!(a.processes, None, "max and a huge value are no limit");
    }

    /// The machine's own cgroups read without error (whatever limits they hold).
    #[test]
    fn reads_this_machine() {
        let layout = Layout::detect();
        let a = AmbientLimits::read(&layout);
        for l in [&a.memory_bytes, &a.processes].into_iter().flatten() {
            assert!(l.value > 0 && l.dir.exists(), "{a:?}");
        }
    }
}
