//! Landlock: [`landlock_rules`] turns a policy into a pure plan (file-system rules, TCP
//! ports, scopes; unit-tested); [`install_landlock_on_current_thread`] applies it and
//! fails closed unless the kernel fully enforced it (or the policy says best effort).

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath,
    Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope,
};

use super::error::SetupError;
use crate::sandbox::policy::Scoping;
use crate::sandbox::policy::resolve::{NetworkPolicy, ResolvedPolicy};

/// What a file-system rule grants beneath a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FsGrant {
    Read,
    Write,
    Execute,
}

/// Everything Landlock is asked to enforce for one policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LandlockPlan {
    /// `None`: the file system is not restricted.
    pub fs: Option<Vec<(PathBuf, FsGrant)>>,
    /// `Some((connect, bind))`: TCP restricted to these ports.
    pub tcp: Option<(Vec<u16>, Vec<u16>)>,
    pub scope_abstract_unix: bool,
    pub scope_signals: bool,
}

impl LandlockPlan {
    pub(crate) fn is_empty(&self) -> bool {
        self.fs.is_none() && self.tcp.is_none() && !self.scope_abstract_unix && !self.scope_signals
    }

    /// The Landlock ABI this plan needs to be fully enforced.
    pub(crate) fn required_abi(&self) -> i32 {
        let mut abi = 0;
        if self.fs.is_some() {
            abi = 1;
        }
        if self.tcp.is_some() {
            abi = 4;
        }
        if self.scope_abstract_unix || self.scope_signals {
            abi = 6;
        }
        abi
    }

    /// What a kernel with Landlock ABI `abi` cannot enforce of this plan, in words.
    pub(crate) fn unenforced(&self, abi: i32) -> Vec<String> {
        let mut out = Vec::new();
        if abi < 1 && self.fs.is_some() {
            out.push("file-system rules (kernel has no Landlock)".to_string());
        } else if abi < 3 && self.fs.is_some() {
            out.push(format!("file truncation control (Landlock ABI {abi} < 3)"));
        }
        if abi < 4 && self.tcp.is_some() {
            out.push(format!("TCP port rules (Landlock ABI {abi} < 4)"));
        }
        if abi < 6 && self.scope_abstract_unix {
            out.push(format!(
                "abstract unix socket scoping (Landlock ABI {abi} < 6)"
            ));
        }
        if abi < 6 && self.scope_signals {
            out.push(format!("signal scoping (Landlock ABI {abi} < 6)"));
        }
        out
    }
}

/// The Landlock plan of `policy`.
pub(crate) fn landlock_rules(policy: &ResolvedPolicy) -> LandlockPlan {
    let fs = (!policy.filesystem_unrestricted()).then(|| {
        let mut rules = Vec::new();
        for (set, grant) in [
            (&policy.read, FsGrant::Read),
            (&policy.write, FsGrant::Write),
            (&policy.execute, FsGrant::Execute),
        ] {
            rules.extend(set.iter().map(|p| (p.clone(), grant)));
        }
        rules
    });
    let tcp = match &policy.network {
        NetworkPolicy::Ports { connect, bind } => Some((connect.clone(), bind.clone())),
        // No port at all here; the launcher adds the broker's port of this job.
        NetworkPolicy::Proxy { .. } => Some((Vec::new(), Vec::new())),
        _ => None,
    };
    LandlockPlan {
        fs,
        tcp,
        scope_abstract_unix: policy.abstract_unix_sockets == Scoping::Scoped,
        scope_signals: policy.signals == Scoping::Scoped,
    }
}

/// The Landlock ABI of the running kernel (0 if Landlock is missing or disabled).
pub(crate) fn kernel_abi() -> i32 {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) only
    // returns the ABI version; no memory is passed.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32,
        )
    };
    if v < 0 { 0 } else { v as i32 }
}

/// What of `plan` a kernel with Landlock ABI `abi` leaves unenforced; an error unless
/// the policy allows best effort.
pub(crate) fn check_support(
    plan: &LandlockPlan,
    abi: i32,
    policy_name: &str,
    best_effort: bool,
) -> Result<Vec<String>, SetupError> {
    let missing = plan.unenforced(abi);
    if missing.is_empty() || best_effort {
        return Ok(missing);
    }
    if abi == 0 {
        return Err(SetupError::LandlockMissing {
            policy: policy_name.to_string(),
        });
    }
    Err(SetupError::LandlockAbi {
        abi,
        policy: policy_name.to_string(),
        required: plan.required_abi(),
        missing: missing.join(", "),
    })
}

/// What `grant` allows beneath a path under Landlock ABI `target`.
fn fs_access(grant: FsGrant, target: ABI) -> BitFlags<AccessFs> {
    let read = AccessFs::ReadFile | AccessFs::ReadDir;
    match grant {
        FsGrant::Read => read,
        // Writing does not imply executing: that is the `execute` set's job.
        FsGrant::Write => AccessFs::from_all(target) & !AccessFs::Execute,
        FsGrant::Execute => read | AccessFs::Execute,
    }
}

/// The plan's file-system rules grouped by path, in the order each path first appears,
/// each with every grant it has.
fn grants_by_path(rules: &[(PathBuf, FsGrant)]) -> Vec<(&PathBuf, Vec<FsGrant>)> {
    let mut out: Vec<(&PathBuf, Vec<FsGrant>)> = Vec::new();
    for (path, grant) in rules {
        match out.iter_mut().find(|(p, _)| *p == path) {
            Some((_, grants)) => {
                if !grants.contains(grant) {
                    grants.push(*grant);
                }
            }
            None => out.push((path, vec![*grant])),
        }
    }
    out
}

/// `path` opened with `O_PATH` (nothing is read, a device is not opened), by `open(2)`
/// itself: landlock's `PathFd` goes through std's `custom_flags`, which masks the flags
/// with `O_ACCMODE` — and musl's `O_ACCMODE` includes `O_PATH`, so a musl build opened
/// `/dev/tty` for reading (ENXIO without a terminal) instead of as a path.
fn open_path(path: &Path) -> std::io::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    nix::fcntl::open(
        path,
        OFlag::O_PATH | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(std::io::Error::from)
}

/// Whether the descriptor is a directory (`fstat`; a failed stat counts as not one, so
/// the rule keeps only the accesses valid on a file).
fn is_dir(fd: &OwnedFd) -> bool {
    nix::sys::stat::fstat(fd).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
}

/// Apply `plan` to the calling thread. `best_effort`: enforce what the kernel supports
/// and return what it does not; otherwise anything unenforced is an error.
pub(crate) fn install_landlock_on_current_thread(
    plan: &LandlockPlan,
    policy_name: &str,
    best_effort: bool,
) -> Result<Vec<String>, SetupError> {
    if plan.is_empty() {
        return Ok(Vec::new());
    }
    let abi = kernel_abi();
    let missing = check_support(plan, abi, policy_name, best_effort)?;
    if abi == 0 {
        return Ok(missing);
    }
    let target = ABI::from(abi.min(6));
    let mut created = ruleset(plan, abi, target)?;
    if let Some(rules) = &plan.fs {
        created = add_path_rules(created, rules, target)?;
    }
    if let (Some((connect, bind)), true) = (&plan.tcp, abi >= 4) {
        created = add_port_rules(created, connect, bind)?;
    }
    let status = created.restrict_self().map_err(SetupError::Landlock)?;
    enforced(status.ruleset, missing, policy_name, best_effort)
}

/// The ruleset the plan handles: file-system accesses, TCP (ABI 4+), scopes (ABI 6+).
fn ruleset(plan: &LandlockPlan, abi: i32, target: ABI) -> Result<RulesetCreated, SetupError> {
    let err = SetupError::Landlock;
    let mut ruleset = Ruleset::default().set_compatibility(CompatLevel::BestEffort);
    if plan.fs.is_some() {
        ruleset = ruleset
            .handle_access(AccessFs::from_all(target))
            .map_err(err)?;
    }
    if plan.tcp.is_some() && abi >= 4 {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(target))
            .map_err(err)?;
    }
    if abi >= 6 {
        let mut scopes = BitFlags::<Scope>::EMPTY;
        if plan.scope_abstract_unix {
            scopes |= Scope::AbstractUnixSocket;
        }
        if plan.scope_signals {
            scopes |= Scope::Signal;
        }
        if !scopes.is_empty() {
            ruleset = ruleset.scope(scopes).map_err(err)?;
        }
    }
    ruleset.create().map_err(err)
}

/// One rule per path with the union of its grants: Landlock unions the accesses of
/// every rule on the same object of a layer, so this enforces exactly what a rule per
/// grant would, with one open (and one stat) per path instead of one per grant.
fn add_path_rules(
    mut created: RulesetCreated,
    rules: &[(PathBuf, FsGrant)],
    target: ABI,
) -> Result<RulesetCreated, SetupError> {
    for (path, grants) in grants_by_path(rules) {
        let fd = match open_path(path) {
            Ok(fd) => fd,
            // A path that does not exist on this machine (e.g. /lib32) grants nothing.
            Err(_) if !path.exists() => continue,
            Err(source) => {
                return Err(SetupError::LandlockPath {
                    path: path.clone(),
                    source,
                });
            }
        };
        let mut access = BitFlags::<AccessFs>::EMPTY;
        for grant in grants {
            access |= fs_access(grant, target);
        }
        // The open descriptor, not the path again: what the rule is attached to.
        if !is_dir(&fd) {
            access &= AccessFs::from_file(target);
        }
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(SetupError::Landlock)?;
    }
    Ok(created)
}

/// TCP connect and bind allowed to these ports only.
fn add_port_rules(
    mut created: RulesetCreated,
    connect: &[u16],
    bind: &[u16],
) -> Result<RulesetCreated, SetupError> {
    for &port in connect {
        created = created
            .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
            .map_err(SetupError::Landlock)?;
    }
    for &port in bind {
        created = created
            .add_rule(NetPort::new(port, AccessNet::BindTcp))
            .map_err(SetupError::Landlock)?;
    }
    Ok(created)
}

/// What the kernel made of the ruleset: fully enforced, or (partly) not — a note under
/// `best_effort`, else the launch fails closed.
fn enforced(
    status: RulesetStatus,
    mut missing: Vec<String>,
    policy_name: &str,
    best_effort: bool,
) -> Result<Vec<String>, SetupError> {
    match status {
        RulesetStatus::FullyEnforced => Ok(missing),
        other if best_effort => {
            if missing.is_empty() {
                missing.push(format!("part of the Landlock ruleset ({other:?})"));
            }
            Ok(missing)
        }
        other => Err(SetupError::LandlockPartial {
            status: format!("{other:?}"),
            policy: policy_name.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::policy::resolve::test_fixture::resolved;

    /// A rule's path is opened as a path only: `O_PATH` kept (a musl build lost it to
    /// std's `O_ACCMODE` mask and opened `/dev/tty` for reading), nothing read.
    #[test]
    fn rule_paths_are_opened_with_o_path() {
        for path in ["/dev/null", "/etc", "/dev/tty"] {
            let fd = open_path(Path::new(path)).unwrap();
            let flags = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL).unwrap();
            assert_ne!(
                flags & libc::O_PATH,
                0,
                "{path} opened without O_PATH: {flags:#o}"
            );
        }
    }

    #[test]
    fn workspace_write_plan() {
        let plan = landlock_rules(&resolved("workspace-write"));
        let fs = plan.fs.as_ref().unwrap();
        assert!(fs.contains(&("/w".into(), FsGrant::Write)));
        assert!(fs.contains(&("/etc".into(), FsGrant::Read)));
        assert!(
            !fs.iter()
                .any(|(p, _)| p.starts_with("/root") || p.starts_with("/tmp"))
        );
        assert!(plan.scope_abstract_unix && plan.scope_signals && plan.tcp.is_none());
        assert_eq!(plan.required_abi(), 6);
        assert!(plan.unenforced(7).is_empty());
        assert_eq!(plan.unenforced(5).len(), 2);
    }

    #[test]
    fn proxy_plan_handles_tcp_with_no_port_of_its_own() {
        let p = resolved("workspace-write").with_network(NetworkPolicy::Proxy {
            allow: vec!["pypi.org".into()],
        });
        let plan = landlock_rules(&p);
        // The launcher adds the broker's port; nothing else may be connected or bound.
        assert_eq!(plan.tcp, Some((Vec::new(), Vec::new())));
        assert_eq!(plan.required_abi(), 6);
    }

    #[test]
    fn ports_plan() {
        let p = resolved("workspace-write").with_network(NetworkPolicy::Ports {
            connect: vec![443],
            bind: vec![8080],
        });
        let plan = landlock_rules(&p);
        assert_eq!(plan.tcp, Some((vec![443], vec![8080])));
        assert!(plan.unenforced(3).iter().any(|m| m.contains("TCP port")));
    }

    #[test]
    fn missing_kernel_support_fails_closed_in_words() {
        let plan = landlock_rules(&resolved("workspace-write"));
        assert_eq!(
            check_support(&plan, 0, "workspace-write", false)
                .unwrap_err()
                .to_string(),
            "this kernel has no Landlock; policy workspace-write requires it"
        );
        let e = check_support(&plan, 5, "ci", false).unwrap_err();
        assert_eq!(e.step(), "landlock");
        let e = e.to_string();
        assert!(
            e.contains("ABI is 5") && e.contains("needs ABI 6") && e.contains("signal"),
            "{e}"
        );
        assert_eq!(check_support(&plan, 5, "ci", true).unwrap().len(), 2);
        assert!(check_support(&plan, 7, "ci", false).unwrap().is_empty());
    }

    #[test]
    fn rules_are_grouped_one_per_path_with_every_grant() {
        let plan = landlock_rules(&resolved("workspace-write"));
        let fs = plan.fs.as_ref().unwrap();
        let grouped = grants_by_path(fs);
        // Every path once, in first-seen order, and no grant lost or invented.
        let paths: Vec<&PathBuf> = grouped.iter().map(|(p, _)| *p).collect();
        let mut unique = paths.clone();
        unique.dedup();
        assert_eq!(paths.len(), unique.len());
        assert!(paths.len() < fs.len(), "workspace-write names paths twice");
        for (path, grant) in fs {
            let (_, grants) = grouped.iter().find(|(p, _)| *p == path).unwrap();
            assert!(grants.contains(grant), "{path:?} lost {grant:?}");
        }
        let total: usize = grouped.iter().map(|(_, g)| g.len()).sum();
        assert_eq!(total, fs.len());
        let usr = grouped
            .iter()
            .find(|(p, _)| p.as_path() == Path::new("/usr"));
        assert_eq!(usr.unwrap().1, vec![FsGrant::Read, FsGrant::Execute]);
        let w = grouped.iter().find(|(p, _)| p.as_path() == Path::new("/w"));
        assert_eq!(w.unwrap().1, vec![FsGrant::Write, FsGrant::Execute]);
        // A union of grants is what two rules on the same object add up to.
        let target = ABI::V6;
        let both = fs_access(FsGrant::Read, target) | fs_access(FsGrant::Execute, target);
        assert!(both.contains(AccessFs::Execute) && both.contains(AccessFs::ReadDir));
        assert!(!both.contains(AccessFs::WriteFile));
        assert!(!fs_access(FsGrant::Write, target).contains(AccessFs::Execute));
    }

    #[test]
    fn danger_plan_is_empty() {
        assert!(landlock_rules(&resolved("danger-full-access")).is_empty());
    }
}
