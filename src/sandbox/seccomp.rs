//! The seccomp filter: [`seccomp_rules`] turns a policy into a pure list of denied
//! syscalls (unit-tested), [`install_seccomp_filter_on_current_thread`] compiles it with
//! seccompiler and loads it. Denials return an errno (EPERM, or ENOSYS for clone3 so
//! that libc falls back to clone, whose flags a filter can inspect); nothing is killed.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::error::SetupError;
use super::resolve::{NetworkPolicy, ResolvedPolicy};

/// One comparison on a syscall argument (32-bit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgCheck {
    Eq(u8, u64),
    Ne(u8, u64),
    /// `(arg & mask) == value`
    Masked(u8, u64, u64),
}

/// A denied syscall: denied always when `when` is empty, else when any of the
/// alternatives (each a conjunction of checks) holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyscallDeny {
    pub name: &'static str,
    pub nr: i64,
    pub when: Vec<Vec<ArgCheck>>,
    pub errno: i32,
}

/// Escape primitives denied whenever the policy has a syscall filter.
const ALWAYS_DENIED: &[(&str, i64)] = &[
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("pidfd_getfd", libc::SYS_pidfd_getfd),
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("chroot", libc::SYS_chroot),
    ("bpf", libc::SYS_bpf),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("acct", libc::SYS_acct),
    ("syslog", libc::SYS_syslog),
    ("quotactl", libc::SYS_quotactl),
    ("iopl", libc::SYS_iopl),
    ("ioperm", libc::SYS_ioperm),
    ("vhangup", libc::SYS_vhangup),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
];

/// Namespace-creating clone flags.
const CLONE_NS_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];

/// Socket types other than SOCK_STREAM (the low 4 bits of `type`).
const NON_STREAM_TYPES: &[u64] = &[2, 3, 4, 5, 6, 10];

/// The syscalls `policy` denies, and when. Empty when the policy has no syscall filter.
pub fn seccomp_rules(policy: &ResolvedPolicy) -> Vec<SyscallDeny> {
    if !policy.syscall_filter {
        return Vec::new();
    }
    let eperm = libc::EPERM;
    let mut rules: Vec<SyscallDeny> = ALWAYS_DENIED
        .iter()
        .map(|&(name, nr)| SyscallDeny {
            name,
            nr,
            when: Vec::new(),
            errno: eperm,
        })
        .collect();
    rules.push(SyscallDeny {
        name: "personality",
        nr: libc::SYS_personality,
        // Only querying (0xffffffff) and the default persona (0) are allowed.
        when: vec![vec![ArgCheck::Ne(0, 0), ArgCheck::Ne(0, 0xffff_ffff)]],
        errno: eperm,
    });
    rules.push(SyscallDeny {
        name: "clone",
        nr: libc::SYS_clone,
        when: CLONE_NS_FLAGS
            .iter()
            .map(|&f| vec![ArgCheck::Masked(0, f, f)])
            .collect(),
        errno: eperm,
    });
    rules.push(SyscallDeny {
        name: "clone3",
        nr: libc::SYS_clone3,
        when: Vec::new(),
        errno: libc::ENOSYS,
    });
    let unix = libc::AF_UNIX as u64;
    let (inet, inet6) = (libc::AF_INET as u64, libc::AF_INET6 as u64);
    let socket_when: Option<Vec<Vec<ArgCheck>>> = match &policy.network {
        NetworkPolicy::None => Some(vec![vec![ArgCheck::Ne(0, unix)]]),
        NetworkPolicy::Loopback => Some(vec![vec![
            ArgCheck::Ne(0, unix),
            ArgCheck::Ne(0, inet),
            ArgCheck::Ne(0, inet6),
        ]]),
        // The proxy mode's namespace holds only the broker's listener; Landlock lets
        // TCP connect to its port alone, and only plain TCP sockets may be made.
        NetworkPolicy::Ports { .. } | NetworkPolicy::Proxy { .. } => {
            let mut when = vec![vec![
                ArgCheck::Ne(0, unix),
                ArgCheck::Ne(0, inet),
                ArgCheck::Ne(0, inet6),
            ]];
            for domain in [inet, inet6] {
                for &t in NON_STREAM_TYPES {
                    when.push(vec![ArgCheck::Eq(0, domain), ArgCheck::Masked(1, 0xf, t)]);
                }
                // Only plain TCP: Landlock's port rules cover TCP, not SCTP or MPTCP.
                when.push(vec![
                    ArgCheck::Eq(0, domain),
                    ArgCheck::Ne(2, 0),
                    ArgCheck::Ne(2, libc::IPPROTO_TCP as u64),
                ]);
            }
            Some(when)
        }
        NetworkPolicy::Full => None,
    };
    if let Some(when) = socket_when {
        rules.push(SyscallDeny {
            name: "socket",
            nr: libc::SYS_socket,
            when,
            errno: eperm,
        });
    }
    rules
}

fn condition(check: ArgCheck) -> Result<SeccompCondition, seccompiler::BackendError> {
    let (arg, op, value) = match check {
        ArgCheck::Eq(a, v) => (a, SeccompCmpOp::Eq, v),
        ArgCheck::Ne(a, v) => (a, SeccompCmpOp::Ne, v),
        ArgCheck::Masked(a, m, v) => (a, SeccompCmpOp::MaskedEq(m), v),
    };
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
}

/// Compile `rules` into one BPF program per errno.
fn compile(rules: &[SyscallDeny]) -> Result<Vec<BpfProgram>, SetupError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(SetupError::SeccompArch)?;
    let mut by_errno: BTreeMap<i32, BTreeMap<i64, Vec<SeccompRule>>> = BTreeMap::new();
    for rule in rules {
        let rule_err = |source| SetupError::SeccompRule {
            syscall: rule.name.to_string(),
            source,
        };
        let mut compiled = Vec::new();
        for alt in &rule.when {
            let conds = alt
                .iter()
                .map(|c| condition(*c))
                .collect::<Result<Vec<_>, _>>()
                .map_err(rule_err)?;
            compiled.push(SeccompRule::new(conds).map_err(rule_err)?);
        }
        by_errno
            .entry(rule.errno)
            .or_default()
            .insert(rule.nr, compiled);
    }
    by_errno
        .into_iter()
        .map(|(errno, map)| {
            let filter = SeccompFilter::new(
                map,
                SeccompAction::Allow,
                SeccompAction::Errno(errno as u32),
                arch,
            )
            .map_err(SetupError::SeccompFilter)?;
            BpfProgram::try_from(filter).map_err(SetupError::SeccompFilter)
        })
        .collect()
}

/// Load the filter for `rules` on the calling thread (no_new_privs must be set, or the
/// caller must hold CAP_SYS_ADMIN).
pub fn install_seccomp_filter_on_current_thread(rules: &[SyscallDeny]) -> Result<(), SetupError> {
    if rules.is_empty() {
        return Ok(());
    }
    for program in compile(rules)? {
        seccompiler::apply_filter(&program).map_err(SetupError::SeccompLoad)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::resolve::test_fixture::resolved;

    fn find<'a>(rules: &'a [SyscallDeny], name: &str) -> Option<&'a SyscallDeny> {
        rules.iter().find(|r| r.name == name)
    }

    #[test]
    fn workspace_write_denies_escapes_and_inet() {
        let rules = seccomp_rules(&resolved("workspace-write"));
        for name in [
            "ptrace",
            "mount",
            "unshare",
            "setns",
            "bpf",
            "keyctl",
            "io_uring_setup",
        ] {
            assert!(
                find(&rules, name).is_some_and(|r| r.when.is_empty()),
                "{name}"
            );
        }
        let socket = find(&rules, "socket").unwrap();
        assert_eq!(
            socket.when,
            vec![vec![ArgCheck::Ne(0, libc::AF_UNIX as u64)]]
        );
        assert_eq!(find(&rules, "clone3").unwrap().errno, libc::ENOSYS);
        assert_eq!(
            find(&rules, "clone").unwrap().when.len(),
            CLONE_NS_FLAGS.len()
        );
        compile(&rules).unwrap();
    }

    #[test]
    fn proxy_mode_allows_only_tcp_sockets() {
        let p = resolved("workspace-write").with_network(NetworkPolicy::Proxy {
            allow: vec!["pypi.org".into()],
        });
        let rules = seccomp_rules(&p);
        let socket = find(&rules, "socket").unwrap();
        for domain in [libc::AF_INET, libc::AF_INET6] {
            let dgram = vec![ArgCheck::Eq(0, domain as u64), ArgCheck::Masked(1, 0xf, 2)];
            let raw = vec![ArgCheck::Eq(0, domain as u64), ArgCheck::Masked(1, 0xf, 3)];
            assert!(socket.when.contains(&dgram) && socket.when.contains(&raw));
        }
        // Netlink, packet, vsock: every family but unix and inet is refused.
        assert!(socket.when.contains(&vec![
            ArgCheck::Ne(0, libc::AF_UNIX as u64),
            ArgCheck::Ne(0, libc::AF_INET as u64),
            ArgCheck::Ne(0, libc::AF_INET6 as u64),
        ]));
        compile(&rules).unwrap();
    }

    #[test]
    fn ports_allow_only_tcp() {
        let p = resolved("workspace-write").with_network(NetworkPolicy::Ports {
            connect: vec![443],
            bind: vec![],
        });
        let rules = seccomp_rules(&p);
        let socket = find(&rules, "socket").unwrap();
        let dgram = vec![
            ArgCheck::Eq(0, libc::AF_INET as u64),
            ArgCheck::Masked(1, 0xf, 2),
        ];
        assert!(socket.when.contains(&dgram));
        assert!(
            !socket
                .when
                .contains(&vec![ArgCheck::Ne(0, libc::AF_UNIX as u64)])
        );
        compile(&rules).unwrap();
    }

    #[test]
    fn full_network_keeps_escape_rules_only() {
        let p = resolved("ci").with_network(NetworkPolicy::Full);
        let rules = seccomp_rules(&p);
        assert!(find(&rules, "socket").is_none() && find(&rules, "ptrace").is_some());
    }

    #[test]
    fn danger_has_no_filter() {
        assert!(seccomp_rules(&resolved("danger-full-access")).is_empty());
    }
}
