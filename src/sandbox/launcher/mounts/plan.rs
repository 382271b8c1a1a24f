//! The plan of a mount view, computed before any mount is made: which host directory
//! is bound where, writable or not, in what order, and which symlinks recreate the
//! paths the policy named through a symlink (`/bin -> usr/bin`). Pure apart from
//! `stat`/`canonicalize` of the policy's paths, and unit-tested.

use std::path::{Path, PathBuf};

/// Paths the view always provides itself; policy entries for them are not bound.
pub(crate) const OWN_DEVICES: &[(&str, u32, u32)] = &[
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
];

/// Secret files a root-uid job could read through a listed directory (DAC lets uid 0
/// read root-owned 0640 files even without capabilities): the view covers each that
/// exists with an empty device node. `*` matches within one path component.
pub(crate) const MASKED: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/ssh/ssh_host_*_key",
    "/etc/sudoers",
    "/etc/security/opasswd",
];

/// One bind mount of the view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bind {
    /// Host path (canonical).
    pub src: PathBuf,
    /// Path inside the view.
    pub dst: PathBuf,
    pub writable: bool,
    pub is_dir: bool,
    /// Not a bind: an empty read-only tmpfs covering `dst` (a hidden path; `src` unused).
    pub mask: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Plan {
    /// Parents before children; among binds to the same place the writable one is kept.
    pub binds: Vec<Bind>,
    /// (path in view, target): the policy named a path through a symlink.
    pub symlinks: Vec<(PathBuf, PathBuf)>,
    /// Whether the view builds its own minimal /dev (false when a policy entry covers /dev).
    pub own_dev: bool,
    /// Whether the view mounts its own /proc (false when a policy entry covers /proc).
    pub own_proc: bool,
    /// The policy lists /dev/shm: the job gets a private tmpfs there, not the host's
    /// (shared with every process of the machine).
    pub private_shm: bool,
}

/// What a policy path becomes after looking at the host file system.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub given: PathBuf,
    pub canonical: PathBuf,
    pub is_dir: bool,
    pub writable: bool,
}

/// Look the policy's paths up on the host; nonexistent ones are skipped (nothing to bind).
///
/// A path *beneath a writable directory* whose resolution goes through a symlink is
/// skipped too: the job (or an earlier one) may have planted that symlink — replace
/// `{workspace}/.venv` by a link to `/root` and the next launch would bind `/root`.
pub(crate) fn entries(read: &[PathBuf], write: &[PathBuf]) -> Vec<Entry> {
    let tagged = read
        .iter()
        .map(|p| (p, false))
        .chain(write.iter().map(|p| (p, true)));
    let resolved: Vec<Entry> = tagged
        .filter_map(|(given, writable)| {
            let canonical = std::fs::canonicalize(given).ok()?;
            let is_dir = std::fs::metadata(&canonical).ok()?.is_dir();
            Some(Entry {
                given: given.clone(),
                canonical,
                is_dir,
                writable,
            })
        })
        .collect();
    let roots: Vec<(PathBuf, PathBuf)> = resolved
        .iter()
        .filter(|e| e.writable && e.is_dir)
        .map(|e| (e.given.clone(), e.canonical.clone()))
        .collect();
    resolved
        .into_iter()
        .filter(|e| {
            let planted = through_planted_symlink(e, &roots);
            if planted {
                tracing::warn!(path = %e.given.display(), resolves_to = %e.canonical.display(),
                    "policy path beneath a writable directory resolves through a symlink; left out of the view");
            }
            !planted
        })
        .collect()
}

/// Whether `e` lies strictly beneath a writable root (given or canonical spelling) but
/// does not resolve to the same place beneath that root's canonical path.
fn through_planted_symlink(e: &Entry, roots: &[(PathBuf, PathBuf)]) -> bool {
    roots.iter().any(|(given, canonical)| {
        [given, canonical].iter().any(|root| {
            e.given
                .strip_prefix(root)
                .is_ok_and(|rel| !rel.as_os_str().is_empty() && canonical.join(rel) != e.canonical)
        })
    })
}

fn is_special(path: &Path) -> bool {
    path.starts_with("/proc")
        || path == Path::new("/dev/shm")
        || path == Path::new("/dev")
        || OWN_DEVICES
            .iter()
            .any(|(name, _, _)| path == Path::new("/dev").join(name))
        || path == Path::new("/dev/stdin")
        || path == Path::new("/dev/stdout")
        || path == Path::new("/dev/stderr")
        || path == Path::new("/dev/fd")
}

/// Order and prune the binds. `tmp`: the job's private temp dir, also bound at /tmp —
/// unless another bind lies under /tmp (a workspace in the host's /tmp, say). Landlock
/// grants a rule to everything beneath the rule's directory *in the view*, so a path
/// mounted below the alias would inherit the private tmp's full rights (write, execute)
/// whatever its own rule says; then /tmp stays a read-only directory of mount points and
/// the job uses $TMPDIR (the private tmp at its own path).
pub(crate) fn plan(entries: &[Entry], tmp: Option<&Path>) -> Plan {
    // Only a strict ancestor (e.g. "/") makes the host's /dev or /proc part of the view.
    let covers = |dir: &str| {
        entries.iter().any(|e| {
            e.is_dir && Path::new(dir) != e.canonical && Path::new(dir).starts_with(&e.canonical)
        })
    };
    let own_dev = !covers("/dev");
    let own_proc = !covers("/proc");
    let private_shm = own_dev && entries.iter().any(|e| e.canonical == Path::new("/dev/shm"));
    let mut binds: Vec<Bind> = entries
        .iter()
        .filter(|e| !(is_special(&e.canonical) && is_own(&e.canonical, own_dev, own_proc)))
        .map(|e| Bind {
            src: e.canonical.clone(),
            dst: e.canonical.clone(),
            writable: e.writable,
            is_dir: e.is_dir,
            mask: false,
        })
        .collect();
    let nested_under_tmp = |b: &Bind| b.dst.starts_with("/tmp") && Some(b.src.as_path()) != tmp;
    if let Some(tmp) = tmp.filter(|_| !binds.iter().any(nested_under_tmp)) {
        binds.push(Bind {
            src: tmp.to_path_buf(),
            dst: PathBuf::from("/tmp"),
            writable: true,
            is_dir: true,
            mask: false,
        });
    }
    // Parents first (a path sorts before its children); writable first among equals.
    binds.sort_by(|a, b| a.dst.cmp(&b.dst).then(b.writable.cmp(&a.writable)));
    binds.dedup_by(|later, earlier| later.dst == earlier.dst);
    // Drop a bind its nearest bound ancestor already provides (same source, same mode).
    let mut kept: Vec<Bind> = Vec::with_capacity(binds.len());
    for bind in binds {
        let ancestor = kept.iter().rev().find(|k| bind.dst.starts_with(&k.dst));
        // The private tmp is never folded into a parent: it may become its own tmpfs.
        let redundant = Some(bind.src.as_path()) != tmp
            && ancestor.is_some_and(|a| {
                a.writable == bind.writable
                    && bind
                        .dst
                        .strip_prefix(&a.dst)
                        .is_ok_and(|rel| a.src.join(rel) == bind.src)
            });
        if !redundant {
            kept.push(bind);
        }
    }
    let mut symlinks: Vec<(PathBuf, PathBuf)> = entries
        .iter()
        .filter(|e| e.given != e.canonical && !kept.iter().any(|b| e.given.starts_with(&b.dst)))
        .map(|e| (e.given.clone(), e.canonical.clone()))
        .collect();
    symlinks.sort();
    symlinks.dedup();
    Plan {
        binds: kept,
        symlinks,
        own_dev,
        own_proc,
        private_shm,
    }
}

/// Cover each of `hidden` (canonical paths) that would be visible — strictly beneath a
/// bind — with a mask, placed after its parents and before the binds beneath it, so a
/// listed path inside a hidden one (the private tmp inside the state dir) stays visible.
/// A hidden path that is itself bound stays bound (the policy lists it).
pub(crate) fn hide(plan: &mut Plan, hidden: &[PathBuf]) {
    for h in hidden {
        let Ok(h) = std::fs::canonicalize(h) else {
            continue;
        };
        let visible = plan
            .binds
            .iter()
            .any(|b| !b.mask && h.starts_with(&b.dst) && h != b.dst);
        if !visible || plan.binds.iter().any(|b| b.dst == h) {
            continue;
        }
        let at = plan
            .binds
            .iter()
            .position(|b| b.dst > h)
            .unwrap_or(plan.binds.len());
        plan.binds.insert(
            at,
            Bind {
                src: PathBuf::new(),
                dst: h,
                writable: false,
                is_dir: true,
                mask: true,
            },
        );
    }
}

fn is_own(path: &Path, own_dev: bool, own_proc: bool) -> bool {
    if path.starts_with("/proc") {
        own_proc
    } else {
        own_dev
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(given: &str, canonical: &str, writable: bool) -> Entry {
        Entry {
            given: given.into(),
            canonical: canonical.into(),
            is_dir: true,
            writable,
        }
    }

    fn dsts(p: &Plan) -> Vec<(String, bool)> {
        p.binds
            .iter()
            .map(|b| (b.dst.display().to_string(), b.writable))
            .collect()
    }

    #[test]
    fn parents_first_writable_wins_redundant_children_dropped() {
        let p = plan(
            &[
                e("/usr", "/usr", false),
                e("/usr/lib", "/usr/lib", false),
                e("/work/ws", "/work/ws", false),
                e("/work/ws", "/work/ws", true),
                e("/work/ws/ro", "/work/ws/ro", false),
                e("/etc", "/etc", false),
            ],
            Some(Path::new("/tmp/job/tmp")),
        );
        assert_eq!(
            dsts(&p),
            vec![
                ("/etc".into(), false),
                ("/tmp".into(), true),
                ("/usr".into(), false),
                ("/work/ws".into(), true),
                ("/work/ws/ro".into(), false),
            ]
        );
        assert!(p.own_dev && p.own_proc);
    }

    #[test]
    fn hidden_paths_are_masked_between_parent_and_children() {
        let scratch = crate::test_support::scratch_dir_in(Path::new("/var/tmp"), "plan-hide");
        let base = scratch.path().to_path_buf();
        let state = base.join("ws/state");
        std::fs::create_dir_all(state.join("tmp/1")).unwrap();
        let base = base.canonicalize().unwrap();
        let (ws, state) = (base.join("ws"), base.join("ws/state"));
        let tmp = state.join("tmp/1");
        let s = |p: &Path| p.to_str().unwrap().to_string();
        let mut p = plan(
            &[e(&s(&ws), &s(&ws), true), e(&s(&tmp), &s(&tmp), true)],
            Some(&tmp),
        );
        hide(
            &mut p,
            &[state.clone(), base.join("nope"), "/elsewhere".into()],
        );
        let got: Vec<(String, bool)> = p.binds.iter().map(|b| (s(&b.dst), b.mask)).collect();
        assert_eq!(
            got,
            vec![
                ("/tmp".into(), false),
                (s(&ws), false),
                (s(&state), true),
                (s(&tmp), false),
            ]
        );
    }

    #[test]
    fn no_tmp_alias_over_other_binds_under_tmp() {
        // A workspace in the host's /tmp: the alias would hand it tmp's Landlock rights.
        let p = plan(
            &[
                e("/tmp/job/tmp", "/tmp/job/tmp", true),
                e("/tmp/ws", "/tmp/ws", false),
            ],
            Some(Path::new("/tmp/job/tmp")),
        );
        assert_eq!(
            dsts(&p),
            vec![("/tmp/job/tmp".into(), true), ("/tmp/ws".into(), false)]
        );
        // The private tmp alone under /tmp: aliased.
        let p = plan(
            &[e("/tmp/job/tmp", "/tmp/job/tmp", true)],
            Some(Path::new("/tmp/job/tmp")),
        );
        assert_eq!(
            dsts(&p),
            vec![("/tmp".into(), true), ("/tmp/job/tmp".into(), true)]
        );
    }

    #[test]
    fn symlinked_paths_become_symlinks_and_special_paths_are_provided() {
        let p = plan(
            &[
                e("/bin", "/usr/bin", false),
                e("/usr", "/usr", false),
                e("/proc", "/proc", false),
                Entry {
                    given: "/dev/null".into(),
                    canonical: "/dev/null".into(),
                    is_dir: false,
                    writable: true,
                },
            ],
            None,
        );
        assert_eq!(dsts(&p), vec![("/usr".into(), false)]);
        assert!(!p.private_shm);
        assert_eq!(
            p.symlinks,
            vec![(PathBuf::from("/bin"), PathBuf::from("/usr/bin"))]
        );
    }

    /// `.venv` in the workspace replaced by a link to /root must not bring /root in;
    /// a workspace reached through a symlink itself is fine.
    #[test]
    fn symlinks_planted_beneath_writable_dirs_are_not_followed() {
        let scratch = crate::test_support::scratch_dir("plan-planted");
        let base = scratch.path().to_path_buf();
        let ws = base.join("ws");
        std::fs::create_dir_all(ws.join("real-venv")).unwrap();
        std::os::unix::fs::symlink("/root", ws.join(".venv")).unwrap();
        std::os::unix::fs::symlink(&ws, base.join("ws-link")).unwrap();
        let read = vec![
            ws.join(".venv"),
            ws.join("real-venv"),
            base.join("ws-link/real-venv"),
        ];
        let got: Vec<PathBuf> = entries(&read, &[base.join("ws-link")])
            .into_iter()
            .map(|e| e.given)
            .collect();
        assert_eq!(
            got,
            vec![
                ws.join("real-venv"),
                base.join("ws-link/real-venv"),
                base.join("ws-link")
            ]
        );
    }

    #[test]
    fn a_policy_covering_dev_or_root_keeps_its_own() {
        let p = plan(&[e("/", "/", false)], None);
        assert!(!p.own_dev && !p.own_proc);
        assert_eq!(dsts(&p), vec![("/".into(), false)]);
    }
}
