//! Where the cgroup hierarchies are and where this process sits in them: parsed from
//! `/proc/self/mountinfo` and `/proc/self/cgroup` (pure functions, unit-tested on
//! samples of v1, hybrid and v2 machines).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::fs::read_kernel_file;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CgroupVersion {
    /// Controllers on v1 hierarchies (possibly with an empty v2 mount beside: "hybrid").
    V1,
    /// The unified hierarchy.
    V2,
    /// No cgroup filesystem found.
    None,
}

/// One v1 controller hierarchy and this process's cgroup directory in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct V1Controller {
    pub name: String,
    pub mount: PathBuf,
    pub own_dir: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Layout {
    /// Which hierarchy job cgroups use.
    pub version: CgroupVersion,
    /// v1 controllers and a cgroup2 mount both present.
    pub hybrid: bool,
    /// Every mounted v1 controller.
    pub v1: Vec<V1Controller>,
    /// This process's cgroup dir in the v1 pids / memory hierarchies.
    pub v1_pids: Option<PathBuf>,
    pub v1_memory: Option<PathBuf>,
    /// The cgroup2 mount point, if any.
    pub v2_mount: Option<PathBuf>,
    /// This process's cgroup dir in the unified hierarchy.
    pub v2_own: Option<PathBuf>,
    /// Controllers available to `v2_own` (its `cgroup.controllers`).
    pub v2_controllers: Vec<String>,
    /// This process sits at the root of its cgroup namespace (`0::/` in /proc/self/cgroup):
    /// read with the rest of the layout, not again when the v2 parent is prepared.
    #[serde(skip)]
    pub v2_at_namespace_root: bool,
}

impl Layout {
    /// Read this process's layout from /proc.
    pub(crate) fn detect() -> Layout {
        let mountinfo = read_kernel_file(Path::new("/proc/self/mountinfo")).unwrap_or_default();
        let cgroup = read_kernel_file(Path::new("/proc/self/cgroup")).unwrap_or_default();
        let mut layout = Layout::parse(&mountinfo, &cgroup);
        if let Some(own) = &layout.v2_own {
            layout.v2_controllers = read_kernel_file(&own.join("cgroup.controllers"))
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect();
        }
        layout.choose_version();
        layout
    }

    /// Parse the two /proc files (controllers of the v2 cgroup are read separately).
    pub(crate) fn parse(mountinfo: &str, proc_cgroup: &str) -> Layout {
        let mut layout = Layout {
            version: CgroupVersion::None,
            hybrid: false,
            v1: Vec::new(),
            v1_pids: None,
            v1_memory: None,
            v2_mount: None,
            v2_own: None,
            v2_controllers: Vec::new(),
            v2_at_namespace_root: false,
        };
        // /proc/self/cgroup: "id:controllers:path"; v2 is "0::path".
        let mut own_v1: Vec<(Vec<&str>, &str)> = Vec::new();
        let mut own_v2: Option<&str> = None;
        for line in proc_cgroup.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if id == "0" && ctrls.is_empty() {
                own_v2 = Some(path);
                layout.v2_at_namespace_root = path == "/";
            } else {
                own_v1.push((ctrls.split(',').collect(), path));
            }
        }
        for line in mountinfo.lines() {
            // "id parent dev root mount opts [optional...] - fstype source superopts"; only
            // cgroup lines are taken apart (a container has hundreds of others).
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mut right = right.split(' ');
            let (Some(fstype @ ("cgroup" | "cgroup2")), Some(_), Some(superopts)) =
                (right.next(), right.next(), right.next())
            else {
                continue;
            };
            let mut left = left.split(' ').skip(3);
            let (Some(root), Some(mount)) = (left.next(), left.next()) else {
                continue;
            };
            let mount = unescape(mount);
            match fstype {
                "cgroup2" if layout.v2_mount.is_none() => {
                    layout.v2_mount = Some(PathBuf::from(&mount));
                    layout.v2_own = own_v2.map(|p| own_dir(Path::new(&mount), root, p));
                }
                "cgroup" => {
                    for opt in superopts
                        .split(',')
                        .filter(|o| !o.starts_with("name=") && !matches!(*o, "rw" | "ro"))
                    {
                        let Some((_, path)) = own_v1.iter().find(|(c, _)| c.contains(&opt)) else {
                            continue;
                        };
                        let dir = own_dir(Path::new(&mount), root, path);
                        if opt == "pids" {
                            layout.v1_pids = Some(dir.clone());
                        }
                        if opt == "memory" {
                            layout.v1_memory = Some(dir.clone());
                        }
                        layout.v1.push(V1Controller {
                            name: opt.to_string(),
                            mount: PathBuf::from(&mount),
                            own_dir: dir,
                        });
                    }
                }
                _ => {}
            }
        }
        layout.hybrid = !layout.v1.is_empty() && layout.v2_mount.is_some();
        layout.choose_version();
        layout
    }

    fn choose_version(&mut self) {
        let v2_has_pids = self.v2_controllers.iter().any(|c| c == "pids");
        self.version = if self.v1_pids.is_some() && !v2_has_pids {
            CgroupVersion::V1
        } else if v2_has_pids || (self.v2_mount.is_some() && self.v1.is_empty()) {
            CgroupVersion::V2
        } else if !self.v1.is_empty() {
            CgroupVersion::V1
        } else {
            CgroupVersion::None
        };
    }
}

/// The directory of cgroup `path` in a hierarchy mounted at `mount` whose mount root is `root`
/// (not "/" inside some containers: the cgroup path is then relative to that root).
fn own_dir(mount: &Path, root: &str, path: &str) -> PathBuf {
    let rel = path
        .strip_prefix(root)
        .filter(|_| root != "/")
        .unwrap_or(path);
    let rel = rel.trim_start_matches('/');
    if rel.is_empty() {
        mount.to_path_buf()
    } else {
        mount.join(rel)
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal `\ooo`.
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            out.push(
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0'),
            );
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTINFO: &str = "\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_CGROUP: &str =
        "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n";

    #[test]
    fn hybrid_v1_is_detected_with_own_dirs() {
        let l = Layout::parse(HYBRID_MOUNTINFO, HYBRID_CGROUP);
        assert_eq!(l.version, CgroupVersion::V1);
        assert!(l.hybrid);
        assert_eq!(l.v1_pids, Some(PathBuf::from("/sys/fs/cgroup/pids")));
        assert_eq!(
            l.v1_memory,
            Some(PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"))
        );
        assert_eq!(l.v2_own, Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert!(l.v2_at_namespace_root, "0::/");
        assert_eq!(
            l.v1.len(),
            3,
            "cpu, memory, pids (name=systemd is no controller)"
        );
    }

    #[test]
    fn pure_v2_with_container_root() {
        let mi = "30 1 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let l = Layout::parse(mi, "0::/docker/abc/sub\n");
        assert_eq!(l.version, CgroupVersion::V2);
        assert!(!l.hybrid);
        assert_eq!(l.v2_own, Some(PathBuf::from("/sys/fs/cgroup/sub")));
        assert!(!l.v2_at_namespace_root, "0::/docker/abc/sub");
        let l = Layout::parse(
            "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
            "0::/user.slice/x.scope\n",
        );
        assert_eq!(
            l.v2_own,
            Some(PathBuf::from("/sys/fs/cgroup/user.slice/x.scope"))
        );
    }

    /// Optional fields before the separator, escaped mount points and lines of other
    /// file systems (or cut short) are read as before.
    #[test]
    fn optional_fields_escapes_and_other_lines() {
        let mi = "\
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
28 27 0:5 / /dev rw shared:2 master:3 - devtmpfs udev rw
39 31 0:36 / /sys/fs/cgroup/p\\040ids rw,nosuid shared:12 master:4 - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/memory - cgroup cgroup
41 31 0:38 / - cgroup2 cgroup2 rw
garbage
";
        let l = Layout::parse(mi, "8:pids:/a\n4:memory:/b\n");
        assert_eq!(l.v1_pids, Some(PathBuf::from("/sys/fs/cgroup/p ids/a")));
        assert_eq!(l.v1_memory, None, "a line cut short is skipped");
        assert_eq!(l.v2_mount, None, "so is one without its mount point");
        assert_eq!(l.version, CgroupVersion::V1);
    }

    #[test]
    fn nothing_mounted_is_none() {
        assert_eq!(
            Layout::parse("27 1 254:0 / / rw - ext4 /dev/vda rw\n", "").version,
            CgroupVersion::None
        );
    }

    #[test]
    fn mountinfo_octal_escapes_are_decoded() {
        assert_eq!(unescape(r"/a\040b\\"), r"/a b\\");
    }
}
