//! What one resolved policy actually gets on this machine: each protection the policy
//! asks for, matched against the probed [`KernelSupport`] and the launcher's rules
//! (which mechanism carries which limit), as "enforced" or "not enforced, because".

use serde::Serialize;

use super::KernelSupport;
use crate::sandbox::landlock::landlock_rules;
use crate::sandbox::resolve::{NetworkPolicy, ResolvedPolicy};

/// One protection of a policy and whether this machine enforces it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Item {
    /// What the policy asks for, in words.
    pub what: String,
    /// The mechanism that enforces it here (or would).
    pub how: String,
    pub enforced: bool,
    /// Why not, and what to do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why_not: Option<String>,
}

fn yes(what: impl Into<String>, how: impl Into<String>) -> Item {
    Item {
        what: what.into(),
        how: how.into(),
        enforced: true,
        why_not: None,
    }
}

fn check(
    what: impl Into<String>,
    how: impl Into<String>,
    ok: bool,
    why_not: impl FnOnce() -> String,
) -> Item {
    Item {
        what: what.into(),
        how: how.into(),
        enforced: ok,
        why_not: (!ok).then(why_not),
    }
}

/// Every protection `policy` asks for, in launcher order, with its status here.
pub fn enforcement(k: &KernelSupport, policy: &ResolvedPolicy) -> Vec<Item> {
    let mut items = Vec::new();
    let abi = k.landlock_abi.unwrap_or(0) as i32;
    let no_landlock = || {
        k.landlock_error
            .clone()
            .unwrap_or_else(|| "Landlock unavailable".into())
    };
    let admin = k.is_root;
    let limits = &policy.limits;
    let pids_cgroup = k.cgroup.pids.ok;
    let cgroup_why = |p: &super::Probe| p.error.clone().unwrap_or_default();

    if limits.processes.is_some() || limits.memory_bytes.is_some() {
        items.push(check(
            "job cgroup (kill-all, accounting)",
            "cgroup",
            pids_cgroup,
            || cgroup_why(&k.cgroup.pids),
        ));
    }
    let plan = landlock_rules(policy);
    if !policy.filesystem_unrestricted() {
        items.push(check(
            "paths outside the policy do not exist (pathname unix sockets, chmod/chown/utimes outside writable paths)",
            "private mount namespace, read-only binds",
            k.namespaces.mount.ok && admin,
            || k.namespaces.mount.error.clone().unwrap_or_else(|| "needs root (CAP_SYS_ADMIN) in the launcher".into()),
        ));
        items.push(check(
            "file-system read/write/execute rules",
            "Landlock",
            abi >= 1,
            no_landlock,
        ));
        items.push(check(
            "truncate only where writable",
            "Landlock ABI 3",
            abi >= 3,
            || format!("Landlock ABI {abi} < 3"),
        ));
        items.push(check(
            "/proc shows only the job's own processes",
            "procfs hidepid=ptraceable in the mount view + Landlock ptrace scoping",
            k.namespaces.mount.ok && admin && abi >= 1,
            || "needs the mount view and Landlock".into(),
        ));
    }
    match &policy.network {
        NetworkPolicy::None => {
            items.push(check(
                "no network at all",
                "empty network namespace",
                k.namespaces.network.ok && admin,
                || {
                    k.namespaces
                        .network
                        .error
                        .clone()
                        .unwrap_or_else(|| "needs root (CAP_SYS_ADMIN)".into())
                },
            ));
            items.push(check(
                "no sockets but AF_UNIX",
                "seccomp",
                k.seccomp_filter.ok && policy.syscall_filter,
                || {
                    k.seccomp_filter
                        .error
                        .clone()
                        .unwrap_or_else(|| "policy turns the syscall filter off".into())
                },
            ));
        }
        NetworkPolicy::Loopback => items.push(check(
            "loopback only (host listeners unreachable)",
            "network namespace with lo up",
            k.namespaces.network.ok && admin,
            || {
                k.namespaces
                    .network
                    .error
                    .clone()
                    .unwrap_or_else(|| "needs root (CAP_SYS_ADMIN)".into())
            },
        )),
        NetworkPolicy::Ports { .. } => items.push(check(
            "TCP only to/on listed ports",
            "Landlock ABI 4",
            abi >= 4,
            || format!("Landlock ABI {abi} < 4"),
        )),
        NetworkPolicy::Full => {}
    }
    if plan.scope_abstract_unix {
        items.push(check(
            "abstract unix sockets outside the job unreachable",
            "Landlock ABI 6 scope",
            abi >= 6,
            || format!("Landlock ABI {abi} < 6"),
        ));
    }
    if plan.scope_signals {
        items.push(check(
            "no signals to processes outside the job",
            "Landlock ABI 6 scope",
            abi >= 6,
            || format!("Landlock ABI {abi} < 6"),
        ));
    }
    if policy.drop_capabilities {
        items.push(yes(
            "every capability dropped, no_new_privs",
            "capset/prctl",
        ));
    }
    if policy.syscall_filter {
        items.push(check(
            "escape syscalls refused (ptrace, mount, unshare, setns, bpf, keyctl, io_uring, modules, kexec)",
            "seccomp",
            k.seccomp_filter.ok,
            || k.seccomp_filter.error.clone().unwrap_or_default(),
        ));
    }
    if let Some(mem) = limits.memory_bytes {
        let how = if k.cgroup.memory.ok {
            "memory cgroup"
        } else {
            "RLIMIT_AS (address space; coarser)"
        };
        items.push(yes(format!("memory ≤ {}", size(mem)), how));
    }
    if let Some(n) = limits.processes {
        let item = if pids_cgroup {
            yes(format!("≤ {n} processes"), "pids cgroup")
        } else if k.is_root {
            check(format!("≤ {n} processes"), "pids cgroup", false, || {
                format!(
                    "{}; RLIMIT_NPROC does not bind root",
                    cgroup_why(&k.cgroup.pids)
                )
            })
        } else {
            yes(
                format!("≤ {n} processes"),
                "RLIMIT_NPROC (counts every process of this uid)",
            )
        };
        items.push(item);
    }
    for (limit, what, how) in [
        (
            limits.cpu_seconds.map(|n| format!("{n} s")),
            "CPU time",
            "RLIMIT_CPU",
        ),
        (
            limits.file_size_bytes.map(size),
            "file size",
            "RLIMIT_FSIZE",
        ),
        (
            limits.open_files.map(|n| n.to_string()),
            "open files",
            "RLIMIT_NOFILE",
        ),
        (
            limits.wall_seconds.map(|n| format!("{n} s")),
            "wall-clock time",
            "timer in the parent, kills the cgroup / group",
        ),
    ] {
        if let Some(n) = limit {
            items.push(yes(format!("{what} ≤ {n}"), how));
        }
    }
    items
}

/// Bytes in words: "4 GiB", "512 MiB", or plain bytes.
fn size(bytes: u64) -> String {
    for (unit, name) in [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")] {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{} {name}", bytes / unit);
        }
    }
    format!("{bytes} bytes")
}
