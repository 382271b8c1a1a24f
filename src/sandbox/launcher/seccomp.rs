//! The seccomp filter: [`seccomp_rules`] turns a policy into a pure list of denied
//! syscalls (unit-tested), [`compile_filter`] compiles it (seccompiler's chain for each
//! syscall, found by a binary search on the syscall number: one program) and
//! [`install_seccomp_filter_on_current_thread`] loads it, compiled once per process
//! ([`compiled_for`]: the spawn helper compiles before it forks, its children load). Denials return an errno (EPERM, or ENOSYS for clone3 so
//! that libc falls back to clone, whose flags a filter can inspect); nothing is killed.

use std::collections::BTreeMap;
use std::sync::Arc;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

use super::error::SetupError;
use crate::sandbox::policy::resolve::{NetworkPolicy, ResolvedPolicy};

/// One comparison on a syscall argument (32-bit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArgCheck {
    Eq(u8, u64),
    Ne(u8, u64),
    /// `(arg & mask) == value`
    Masked(u8, u64, u64),
}

/// A denied syscall: denied always when `when` is empty, else when any of the
/// alternatives (each a conjunction of checks) holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyscallDeny {
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
pub(crate) fn seccomp_rules(policy: &ResolvedPolicy) -> Vec<SyscallDeny> {
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
    let socket_when = socket_denied_when(&policy.network);
    if let Some(when) = socket_when {
        rules.push(SyscallDeny {
            name: "socket",
            nr: libc::SYS_socket,
            when,
            errno: eperm,
        });
    }
    if policy.no_preallocation {
        rules.push(SyscallDeny {
            name: "fallocate",
            nr: libc::SYS_fallocate,
            when: Vec::new(),
            errno: libc::EOPNOTSUPP,
        });
    }
    rules
}

/// When `socket` is refused under `network`: any family but AF_UNIX without a network,
/// also IPv4/IPv6 for loopback; in ports and proxy mode only plain TCP sockets of those
/// (Landlock's port rules cover TCP, not SCTP or MPTCP); `None`: never.
fn socket_denied_when(network: &NetworkPolicy) -> Option<Vec<Vec<ArgCheck>>> {
    let unix = libc::AF_UNIX as u64;
    let (inet, inet6) = (libc::AF_INET as u64, libc::AF_INET6 as u64);
    match network {
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
    }
}

fn condition(check: ArgCheck) -> Result<SeccompCondition, seccompiler::BackendError> {
    let (arg, op, value) = match check {
        ArgCheck::Eq(a, v) => (a, SeccompCmpOp::Eq, v),
        ArgCheck::Ne(a, v) => (a, SeccompCmpOp::Ne, v),
        ArgCheck::Masked(a, m, v) => (a, SeccompCmpOp::MaskedEq(m), v),
    };
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
}

/// A filter ready to load: one program (a search tree over the syscall numbers), or
/// one linear program per errno as seccompiler builds them (if the tree could not be
/// made from seccompiler's output).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CompiledFilter(Vec<BpfProgram>);

/// The compiled filter of `rules` (empty: nothing to load).
pub(crate) fn compile_filter(rules: &[SyscallDeny]) -> Result<CompiledFilter, SetupError> {
    if rules.is_empty() {
        return Ok(CompiledFilter(Vec::new()));
    }
    match compile_tree(rules)? {
        Some(tree) => Ok(CompiledFilter(vec![tree])),
        None => Ok(CompiledFilter(compile_linear(rules)?)),
    }
}

/// Compile `rules` with seccompiler into one linear program per errno: every syscall
/// number compared in turn; on x86-64 after [`x32_guard`].
fn compile_linear(rules: &[SyscallDeny]) -> Result<Vec<BpfProgram>, SetupError> {
    let mut by_errno: BTreeMap<i32, BTreeMap<i64, Vec<SeccompRule>>> = BTreeMap::new();
    for rule in rules {
        by_errno
            .entry(rule.errno)
            .or_default()
            .insert(rule.nr, seccomp_rules_of(rule)?);
    }
    let mut programs: Vec<BpfProgram> = x32_guard().into_iter().collect();
    for (errno, map) in by_errno {
        programs.push(program(map, errno)?);
    }
    Ok(programs)
}

/// x86-64's x32 ABI shares the architecture value of the seccomp data and marks its
/// syscall numbers with this bit. seccompiler matches numbers alone, so on a kernel
/// built with x32 support x32's `unshare` or `socket` would pass a filter that denies
/// the 64-bit ones: every x32 syscall is refused first, with ENOSYS (what a kernel
/// without x32 answers).
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// AUDIT_ARCH_X86_64 (linux/audit.h).
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
/// Offsets in `struct seccomp_data`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;

/// With the syscall number in the accumulator: return ENOSYS for an x32 syscall, else
/// fall through. Nothing on other architectures.
fn x32_check() -> Vec<sock_filter> {
    if !cfg!(target_arch = "x86_64") {
        return Vec::new();
    }
    vec![
        jump(BPF_JMP | BPF_JGE_K, X32_SYSCALL_BIT, 0, 1),
        jump(
            BPF_RET,
            libc::SECCOMP_RET_ERRNO | (libc::ENOSYS as u32 & libc::SECCOMP_RET_DATA),
            0,
            0,
        ),
    ]
}

/// A program of its own that refuses x32 syscalls and allows everything else (loaded
/// beside the linear programs, which cannot hold the check); `None` off x86-64.
fn x32_guard() -> Option<BpfProgram> {
    let check = x32_check();
    if check.is_empty() {
        return None;
    }
    let mut guard = vec![
        jump(BPF_LD_W_ABS, DATA_ARCH, 0, 0),
        // Another architecture: nothing to check here (seccompiler's programs refuse it).
        jump(BPF_JMP | BPF_JEQ_K, AUDIT_ARCH_X86_64, 0, 3),
        jump(BPF_LD_W_ABS, DATA_NR, 0, 0),
    ];
    guard.extend(check);
    guard.push(jump(BPF_RET, libc::SECCOMP_RET_ALLOW, 0, 0));
    Some(guard)
}

/// seccompiler's rules for one denial (its alternatives).
fn seccomp_rules_of(rule: &SyscallDeny) -> Result<Vec<SeccompRule>, SetupError> {
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
    Ok(compiled)
}

/// seccompiler's program for `map` (syscall → alternatives), denying with `errno`.
fn program(map: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<BpfProgram, SetupError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(SetupError::SeccompArch)?;
    let filter = SeccompFilter::new(
        map,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch,
    )
    .map_err(SetupError::SeccompFilter)?;
    BpfProgram::try_from(filter).map_err(SetupError::SeccompFilter)
}

/// Instructions of a seccompiler program before its first syscall chain: the check of
/// the architecture (3) and the load of the syscall number (1).
const PROLOGUE: usize = 4;

/// One program for all of `rules`: the syscall number is found by binary search (`JGE`
/// on the sorted numbers) and each leaf is seccompiler's own chain for one syscall,
/// which returns its verdict (its errno, or allow) on every path. The kernel walks a
/// filter once per syscall number when it loads it (to cache the always-allowed ones):
/// a tree of 48 denials costs ~6 comparisons per number where the linear chain costs
/// ~100, and one program replaces one per errno. `None` when seccompiler's output is
/// not shaped as expected (the caller loads the linear programs then).
fn compile_tree(rules: &[SyscallDeny]) -> Result<Option<BpfProgram>, SetupError> {
    let mut sorted: Vec<&SyscallDeny> = rules.iter().collect();
    sorted.sort_by_key(|r| r.nr);
    if sorted.windows(2).any(|w| w[0].nr == w[1].nr) || sorted.iter().any(|r| r.nr < 0) {
        return Ok(None);
    }
    let mut prologue: Option<Vec<sock_filter>> = None;
    let mut leaves: Vec<(u32, Vec<sock_filter>)> = Vec::new();
    for rule in sorted {
        let mut map = BTreeMap::new();
        map.insert(rule.nr, seccomp_rules_of(rule)?);
        let mut one = program(map, rule.errno)?;
        if one.len() <= PROLOGUE + 1 {
            return Ok(None);
        }
        let chain = one.split_off(PROLOGUE);
        // The same prologue for every syscall, and a chain that ends in a return and
        // jumps nowhere outside itself: then it may stand anywhere in a program.
        match &prologue {
            None => prologue = Some(one),
            Some(p) if *p == one => {}
            Some(_) => return Ok(None),
        }
        if !self_contained(&chain) {
            return Ok(None);
        }
        let Ok(nr) = u32::try_from(rule.nr) else {
            return Ok(None);
        };
        leaves.push((nr, chain));
    }
    let Some(mut out) = prologue else {
        return Ok(None);
    };
    // The prologue leaves the syscall number in the accumulator.
    out.extend(x32_check());
    out.reserve(tree_len(&leaves));
    if !append_tree(&leaves, &mut out) || out.len() >= 4096 {
        return Ok(None);
    }
    Ok(Some(out))
}

const BPF_CLASS_MASK: u16 = 0x07;
const BPF_JMP: u16 = 0x05;
const BPF_RET: u16 = 0x06;
const BPF_JA: u16 = 0x00;
const BPF_JGE_K: u16 = 0x35;

/// Whether every jump of `chain` lands inside it and its last instruction returns.
fn self_contained(chain: &[sock_filter]) -> bool {
    let len = chain.len();
    let ends_in_ret = chain
        .last()
        .is_some_and(|i| i.code & BPF_CLASS_MASK == BPF_RET);
    ends_in_ret
        && chain.iter().enumerate().all(|(at, i)| {
            if i.code & BPF_CLASS_MASK != BPF_JMP {
                return true;
            }
            let next = at + 1;
            if i.code & 0xf0 == BPF_JA {
                return next + (i.k as usize) < len;
            }
            next + usize::from(i.jt) < len && next + usize::from(i.jf) < len
        })
}

/// Instructions of the search tree over `leaves` ([`append_tree`]).
fn tree_len(leaves: &[(u32, Vec<sock_filter>)]) -> usize {
    match leaves {
        [] => 0,
        [(_, chain)] => chain.len(),
        _ => {
            let mid = leaves.len() / 2;
            let left = tree_len(&leaves[..mid]);
            let split = if left <= usize::from(u8::MAX) { 1 } else { 2 };
            split + left + tree_len(&leaves[mid..])
        }
    }
}

/// Append the search tree over `leaves` (sorted by syscall number) to `out`; the
/// accumulator holds the syscall number on entry. False if it cannot be encoded.
fn append_tree(leaves: &[(u32, Vec<sock_filter>)], out: &mut Vec<sock_filter>) -> bool {
    match leaves {
        [] => false,
        [(_, chain)] => {
            out.extend_from_slice(chain);
            true
        }
        _ => {
            let mid = leaves.len() / 2;
            let left = tree_len(&leaves[..mid]);
            let at_or_above = leaves[mid].0;
            // nr >= leaves[mid]: the right half; else the left half, which follows.
            match u8::try_from(left) {
                Ok(skip) => out.push(jump(BPF_JMP | BPF_JGE_K, at_or_above, skip, 0)),
                Err(_) => {
                    let Ok(skip) = u32::try_from(left) else {
                        return false;
                    };
                    out.push(jump(BPF_JMP | BPF_JGE_K, at_or_above, 0, 1));
                    out.push(jump(BPF_JMP | BPF_JA, skip, 0, 0));
                }
            }
            append_tree(&leaves[..mid], out) && append_tree(&leaves[mid..], out)
        }
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// Load `filter` on the calling thread (no_new_privs must be set, or the caller must
/// hold CAP_SYS_ADMIN).
pub(crate) fn install_compiled(filter: &CompiledFilter) -> Result<(), SetupError> {
    for program in &filter.0 {
        seccompiler::apply_filter(program).map_err(SetupError::SeccompLoad)?;
    }
    Ok(())
}

/// How many distinct filters a [`FilterCache`] keeps (a server uses a handful of policies).
const COMPILED_KEEP: usize = 16;

/// Filters compiled by their rules: the zygote compiles each policy's once and hands the
/// compiled program to the children it forks (`run_spec`).
#[derive(Default)]
pub(crate) struct FilterCache {
    compiled: Vec<(Vec<SyscallDeny>, Arc<CompiledFilter>)>,
}

impl FilterCache {
    /// The compiled filter of `rules`, compiled at most once while it stays among the
    /// last [`COMPILED_KEEP`] used.
    pub(crate) fn compiled_for(
        &mut self,
        rules: &[SyscallDeny],
    ) -> Result<Arc<CompiledFilter>, SetupError> {
        let cache = &mut self.compiled;
        if let Some(at) = cache.iter().position(|(r, _)| r.as_slice() == rules) {
            let hit = cache.remove(at);
            let filter = hit.1.clone();
            cache.push(hit);
            return Ok(filter);
        }
        let filter = Arc::new(compile_filter(rules)?);
        if cache.len() >= COMPILED_KEEP {
            cache.remove(0);
        }
        cache.push((rules.to_vec(), filter.clone()));
        Ok(filter)
    }
}

/// Load the filter for `rules` on the calling thread (no_new_privs must be set, or the
/// caller must hold CAP_SYS_ADMIN): `precompiled` when the zygote compiled it, else
/// compiled here.
pub(crate) fn install_seccomp_filter_on_current_thread(
    rules: &[SyscallDeny],
    precompiled: Option<&CompiledFilter>,
) -> Result<(), SetupError> {
    if rules.is_empty() {
        return Ok(());
    }
    match precompiled {
        Some(filter) => install_compiled(filter),
        None => install_compiled(&compile_filter(rules)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::policy::resolve::test_fixture::resolved;

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
        compile_filter(&rules).unwrap();
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
        compile_filter(&rules).unwrap();
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
        compile_filter(&rules).unwrap();
    }

    #[test]
    fn full_network_keeps_escape_rules_only() {
        let p = resolved("ci").with_network(NetworkPolicy::Full);
        let rules = seccomp_rules(&p);
        assert!(find(&rules, "socket").is_none() && find(&rules, "ptrace").is_some());
    }

    #[test]
    fn preallocation_is_refused_only_when_asked() {
        let mut p = resolved("workspace-write");
        assert!(find(&seccomp_rules(&p), "fallocate").is_none());
        p.no_preallocation = true;
        let rules = seccomp_rules(&p);
        let rule = find(&rules, "fallocate").expect("a fallocate rule");
        assert!(rule.when.is_empty() && rule.errno == libc::EOPNOTSUPP);
    }

    /// A classic-BPF interpreter for what seccompiler and the tree emit (loads of the
    /// seccomp data, `K` jumps, `AND`, returns), over `struct seccomp_data`.
    fn run(prog: &[sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let mut data = Vec::new();
        data.extend_from_slice(&nr.to_ne_bytes());
        data.extend_from_slice(&arch.to_ne_bytes());
        data.extend_from_slice(&0u64.to_ne_bytes());
        for a in args {
            data.extend_from_slice(&a.to_ne_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = &prog[pc];
            pc += 1;
            match i.code {
                0x20 => {
                    let at = i.k as usize;
                    acc = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
                }
                0x54 => acc &= i.k,
                0x05 => pc += i.k as usize,
                0x15 | 0x25 | 0x35 | 0x45 => {
                    let hit = match i.code {
                        0x15 => acc == i.k,
                        0x25 => acc > i.k,
                        0x35 => acc >= i.k,
                        _ => acc & i.k != 0,
                    };
                    pc += usize::from(if hit { i.jt } else { i.jf });
                }
                0x06 => return i.k,
                other => panic!("instruction {other:#x} not interpreted"),
            }
        }
    }

    /// What a stack of programs answers: the most restrictive action (the kernel
    /// compares actions as signed: kill-process < errno < allow); for two errnos, the
    /// last loaded one's.
    fn verdict(progs: &[BpfProgram], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let action = |v: u32| (v & libc::SECCOMP_RET_ACTION_FULL) as i32;
        let mut out = libc::SECCOMP_RET_ALLOW;
        for p in progs {
            let v = run(p, nr, arch, args);
            if action(v) <= action(out) {
                out = v;
            }
        }
        out
    }

    fn policies() -> Vec<ResolvedPolicy> {
        let ww = resolved("workspace-write");
        vec![
            ww.clone(),
            resolved("read-only"),
            resolved("ci"),
            ww.with_network(NetworkPolicy::Loopback),
            ww.with_network(NetworkPolicy::Full),
            ww.with_network(NetworkPolicy::Ports {
                connect: vec![443],
                bind: vec![],
            }),
            ww.with_network(NetworkPolicy::Proxy { allow: vec![] }),
            ResolvedPolicy {
                no_preallocation: true,
                ..ww.clone()
            },
        ]
    }

    /// The one-program tree answers every syscall number and argument pattern exactly
    /// as seccompiler's linear programs do, for every policy shape.
    #[test]
    fn tree_answers_as_the_linear_programs_do() {
        let arch = 0xc000_003e; // AUDIT_ARCH_X86_64
        let mut args_set: Vec<[u64; 6]> = vec![[0; 6], [u64::MAX; 6]];
        for a0 in [0u64, 1, 2, 10, 16, 0xffff_ffff] {
            for a1 in [0u64, 1, 2, 3, 5, 0x80001, 0x80002] {
                for a2 in [0u64, 6, 17, 132, 262] {
                    args_set.push([a0, a1, a2, 0, 0, 0]);
                }
            }
        }
        for &f in CLONE_NS_FLAGS {
            args_set.push([f | libc::SIGCHLD as u64, 0, 0, 0, 0, 0]);
        }
        let mut denied_seen = 0;
        for policy in policies() {
            let rules = seccomp_rules(&policy);
            let linear = compile_linear(&rules).unwrap();
            let errnos: std::collections::BTreeSet<i32> = rules.iter().map(|r| r.errno).collect();
            assert_eq!(
                linear.len(),
                errnos.len() + usize::from(cfg!(target_arch = "x86_64")),
                "the x32 guard, then EPERM, ENOSYS (and EOPNOTSUPP): a linear program each"
            );
            let tree = compile_tree(&rules)
                .unwrap()
                .expect("seccompiler's output as expected");
            let compiled = compile_filter(&rules).unwrap();
            assert_eq!(compiled, CompiledFilter(vec![tree.clone()]));
            assert!(tree.len() < linear.iter().map(Vec::len).sum::<usize>() + 2 * rules.len());
            for nr in 0..1024u32 {
                // Every argument pattern for the syscalls with rules, two for the others.
                let named = rules.iter().any(|r| r.nr == i64::from(nr));
                let args_here = if named { &args_set[..] } else { &args_set[..2] };
                for args in args_here {
                    let want = verdict(&linear, nr, arch, *args);
                    assert_eq!(run(&tree, nr, arch, *args), want, "nr {nr} args {args:?}");
                    if want != libc::SECCOMP_RET_ALLOW {
                        denied_seen += 1;
                    }
                }
            }
            // Another architecture is killed by both.
            let other = verdict(&linear, 0, 0x4000_0003, [0; 6]);
            assert_eq!(run(&tree, 0, 0x4000_0003, [0; 6]), other);
            assert_eq!(other, libc::SECCOMP_RET_KILL_PROCESS);
        }
        assert!(
            denied_seen > 1000,
            "the comparison saw denials: {denied_seen}"
        );
        let clone3 = run(
            &compile_tree(&seccomp_rules(&resolved("ci")))
                .unwrap()
                .unwrap(),
            libc::SYS_clone3 as u32,
            arch,
            [0; 6],
        );
        assert_eq!(clone3, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32);
    }

    /// x32 syscalls (the 64-bit numbers with the x32 bit) are refused by both forms,
    /// whatever the number: `unshare`, `socket`, `read` alike.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x32_syscalls_are_refused_by_both_forms() {
        let arch = AUDIT_ARCH_X86_64;
        let enosys = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
        for policy in policies() {
            let rules = seccomp_rules(&policy);
            let linear = compile_linear(&rules).unwrap();
            let tree = compile_tree(&rules).unwrap().unwrap();
            for nr in [0, 41, 272, 435, 0x3fff_ffff] {
                let x32 = X32_SYSCALL_BIT | nr;
                assert_eq!(run(&tree, x32, arch, [0; 6]), enosys, "tree, x32 {nr}");
                assert_eq!(
                    verdict(&linear, x32, arch, [0; 6]),
                    enosys,
                    "linear, x32 {nr}"
                );
            }
            // The 64-bit `read` is still allowed by both.
            assert_eq!(run(&tree, 0, arch, [0; 6]), libc::SECCOMP_RET_ALLOW);
            assert_eq!(verdict(&linear, 0, arch, [0; 6]), libc::SECCOMP_RET_ALLOW);
        }
    }

    /// The tree loads in the kernel, and the kernel answers with it as the rules say.
    #[test]
    fn tree_loads_and_denies_in_the_kernel() {
        let rules = seccomp_rules(&resolved("workspace-write"));
        let mut cache = FilterCache::default();
        let filter = cache.compiled_for(&rules).unwrap();
        assert_eq!(filter.0.len(), 1);
        assert!(
            Arc::ptr_eq(&filter, &cache.compiled_for(&rules).unwrap()),
            "compiled once"
        );
        // SAFETY: a fork in a test: the child only makes syscalls and _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            // SAFETY: prctl and raw syscalls in the forked child, which then _exits.
            let code = unsafe {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                if install_compiled(&filter).is_err() {
                    1
                } else if libc::syscall(libc::SYS_clone3, 0usize, 0usize) != -1
                    || errno() != libc::ENOSYS
                {
                    2
                } else if libc::unshare(0) != -1 || errno() != libc::EPERM {
                    3
                } else if libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) != -1
                    || errno() != libc::EPERM
                {
                    4
                } else if libc::getpid() <= 0 || libc::personality(0xffff_ffff) == -1 {
                    5
                } else if libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) < 0 {
                    6
                } else {
                    0
                }
            };
            // SAFETY: _exit in the forked child.
            unsafe { libc::_exit(code) }
        }
        let mut status = 0;
        // SAFETY: waiting for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "status {status}");
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "step that failed in the child"
        );
    }

    /// Halves longer than a jump offset can span (255) are jumped over with `JA`.
    #[test]
    fn tree_spans_long_halves() {
        let deny = |nr: u32| libc::SECCOMP_RET_ERRNO | nr;
        let leaves: Vec<(u32, Vec<sock_filter>)> = [3u32, 40, 41, 300, 301]
            .into_iter()
            .map(|nr| {
                let mut chain = vec![
                    jump(BPF_JMP | 0x10, nr, 0, 1),
                    jump(BPF_RET, deny(nr), 0, 0),
                ];
                // Padding never reached: it makes each leaf 202 instructions long.
                chain.resize(202, jump(BPF_RET, libc::SECCOMP_RET_ALLOW, 0, 0));
                (nr, chain)
            })
            .collect();
        let mut prog = vec![jump(0x20, 0, 0, 0)];
        assert!(append_tree(&leaves, &mut prog));
        assert_eq!(prog.len(), 1 + tree_len(&leaves));
        assert!(
            prog.iter().any(|i| i.code == BPF_JMP | BPF_JA),
            "a long jump was needed"
        );
        for nr in 0..400u32 {
            let want = if leaves.iter().any(|(n, _)| *n == nr) {
                deny(nr)
            } else {
                libc::SECCOMP_RET_ALLOW
            };
            assert_eq!(run(&prog, nr, 0, [0; 6]), want, "nr {nr}");
        }
    }

    #[test]
    fn danger_has_no_filter() {
        assert!(seccomp_rules(&resolved("danger-full-access")).is_empty());
    }
}
