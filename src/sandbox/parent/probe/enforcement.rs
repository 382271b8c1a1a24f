//! What one resolved policy actually gets on this machine: each protection the policy
//! asks for, matched against the probed [`KernelSupport`] and the launcher's rules
//! (which mechanism carries which limit), as "enforced" or "not enforced, because".

use serde::Serialize;

use super::KernelSupport;
use crate::sandbox::launcher::landlock::landlock_rules;
use crate::sandbox::policy::resolve::{NetworkPolicy, ResolvedPolicy};

/// One protection of a policy and whether this machine enforces it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Item {
    /// What the policy asks for, in words.
    pub what: String,
    /// The mechanism that enforces it here (or would).
    pub how: String,
    pub enforced: bool,
    /// Whether the launcher refuses to start the policy when this is not enforced
    /// (fail closed) rather than carrying on without it.
    pub required: bool,
    /// Why not, and what to do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why_not: Option<String>,
}

fn yes(what: impl Into<String>, how: impl Into<String>) -> Item {
    Item {
        what: what.into(),
        how: how.into(),
        enforced: true,
        required: true,
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
        required: true,
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
    // The launcher makes one job cgroup with every capped controller, or none at all.
    let pids_cgroup = k.cgroup.pids.ok && (limits.memory_bytes.is_none() || k.cgroup.memory.ok);
    // Without a cgroup the launcher carries on with rlimits, except as root with a
    // process cap (RLIMIT_NPROC does not bind root): then it refuses (fail closed).
    let cgroup_required = k.is_root && limits.processes.is_some();
    let cgroup_why = |p: &super::Probe| p.error.clone().unwrap_or_default();

    if limits.processes.is_some() || limits.memory_bytes.is_some() {
        let mut item = check(
            "job cgroup (kill-all, accounting)",
            "cgroup",
            pids_cgroup,
            || {
                let why = cgroup_why(&k.cgroup.pids);
                if why.is_empty() {
                    cgroup_why(&k.cgroup.memory)
                } else {
                    why
                }
            },
        );
        item.required = cgroup_required;
        items.push(item);
    }
    let plan = landlock_rules(policy);
    if !policy.filesystem_unrestricted() {
        // The launcher splits into a PID namespace only where the job has a mount view
        // (whose fresh /proc shows that namespace).
        items.push(check(
            "no process of the job outlives the server (double-forked daemons included)",
            "PID namespace per job",
            k.namespaces.pid.ok && admin,
            || {
                k.namespaces
                    .pid
                    .error
                    .clone()
                    .unwrap_or_else(|| "needs root (CAP_SYS_ADMIN) in the launcher".into())
            },
        ));
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
        let mut proc_item = check(
            "/proc shows only the job's own processes",
            "procfs hidepid=ptraceable in the mount view + Landlock ptrace scoping",
            k.namespaces.mount.ok && k.namespaces.procfs_hidepid.ok && admin && abi >= 1,
            || "needs the mount view, a new procfs and Landlock".into(),
        );
        // Without a new procfs the view binds the host's /proc (read-only) and carries on.
        proc_item.required = k.namespaces.procfs_hidepid.ok;
        items.push(proc_item);
    }
    let netns_missing = || {
        k.namespaces
            .network
            .error
            .clone()
            .unwrap_or_else(|| "needs root (CAP_SYS_ADMIN)".into())
    };
    match &policy.network {
        NetworkPolicy::None => {
            items.push(check(
                "no network at all",
                "empty network namespace",
                k.namespaces.network.ok && admin,
                netns_missing,
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
            netns_missing,
        )),
        NetworkPolicy::Ports { .. } => items.push(check(
            "TCP only to/on listed ports",
            "Landlock ABI 4",
            abi >= 4,
            || format!("Landlock ABI {abi} < 4"),
        )),
        NetworkPolicy::Proxy { .. } => {
            items.push(check(
                "only the server's proxy reachable (host listeners unreachable)",
                "empty network namespace joined from the broker",
                k.namespaces.network.ok && admin,
                netns_missing,
            ));
            items.push(check(
                "TCP connect to the proxy port only; no UDP, raw, netlink or vsock sockets",
                "Landlock ABI 4 + seccomp",
                abi >= 4 && k.seccomp_filter.ok && policy.syscall_filter,
                || format!("Landlock ABI {abi} < 4, or no seccomp filter"),
            ));
        }
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
        let how = if pids_cgroup {
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

#[cfg(test)]
mod tests {
    use super::super::{CgroupSupport, Namespaces, Probe};
    use super::*;
    use crate::sandbox::parent::cgroup::CgroupVersion;
    use crate::sandbox::{Placeholders, Policy};

    fn kernel(root: bool, cgroups: bool, abi: Option<u32>) -> KernelSupport {
        let p = |ok: bool| Probe {
            ok,
            error: (!ok).then(|| "missing".to_string()),
        };
        KernelSupport {
            kernel: "test".into(),
            euid: if root { 0 } else { 1000 },
            is_root: root,
            landlock_abi: abi,
            landlock_error: abi.is_none().then(|| "no Landlock".into()),
            landlock_features: Vec::new(),
            seccomp_filter: p(true),
            namespaces: Namespaces {
                user: p(true),
                pid: p(true),
                network: p(root),
                mount: p(root),
                procfs_hidepid: p(root),
            },
            cgroup: CgroupSupport {
                version: CgroupVersion::V1,
                hybrid: false,
                pids_dir: None,
                memory_dir: None,
                pids: p(cgroups),
                memory: p(cgroups),
                v2_controllers: Vec::new(),
            },
        }
    }

    fn workspace_write() -> ResolvedPolicy {
        let ph = Placeholders {
            workspace: "/tmp".into(),
            tmp: "/tmp".into(),
            ..Default::default()
        };
        Policy::load("workspace-write")
            .unwrap()
            .resolve(&ph)
            .unwrap()
    }

    fn missing(items: &[Item]) -> Vec<(&str, bool)> {
        items
            .iter()
            .filter(|i| !i.enforced)
            .map(|i| (i.how.as_str(), i.required))
            .collect()
    }

    #[test]
    fn everything_enforced_on_a_full_kernel() {
        assert_eq!(
            missing(&enforcement(
                &kernel(true, true, Some(7)),
                &workspace_write()
            )),
            vec![]
        );
    }

    /// Root without a pids cgroup: the process cap is not enforced and the launcher refuses.
    #[test]
    fn root_without_cgroups_cannot_cap_processes() {
        let items = enforcement(&kernel(true, false, Some(7)), &workspace_write());
        assert_eq!(
            missing(&items),
            vec![("cgroup", true), ("pids cgroup", true)]
        );
    }

    /// Not root: no namespaces (fatal unless best effort), processes capped by RLIMIT_NPROC.
    #[test]
    fn unprivileged_loses_the_view_and_netns() {
        let items = enforcement(&kernel(false, false, Some(7)), &workspace_write());
        let m = missing(&items);
        assert!(m.contains(&("cgroup", false)), "{m:?}");
        assert!(
            m.iter()
                .any(|(how, req)| how.contains("mount namespace") && *req),
            "{m:?}"
        );
        assert!(
            m.iter()
                .any(|(how, req)| how.contains("network namespace") && *req),
            "{m:?}"
        );
        assert!(
            items
                .iter()
                .any(|i| i.how.starts_with("RLIMIT_NPROC") && i.enforced)
        );
    }

    /// No PID namespace (a container that refuses `unshare(CLONE_NEWPID)`): reported
    /// missing and required, as the launcher refuses the policy (fails closed).
    #[test]
    fn no_pid_namespace_is_required_and_missing() {
        let mut k = kernel(true, true, Some(7));
        k.namespaces.pid = Probe {
            ok: false,
            error: Some("EPERM".into()),
        };
        let items = enforcement(&k, &workspace_write());
        assert_eq!(missing(&items), vec![("PID namespace per job", true)]);
        let why = items.iter().find(|i| !i.enforced).unwrap().why_not.clone();
        assert_eq!(why.as_deref(), Some("EPERM"));
    }

    /// An old kernel: TCP port rules and scopes are reported missing.
    #[test]
    fn landlock_abi_gates_features() {
        let items = enforcement(&kernel(true, true, Some(3)), &workspace_write());
        assert_eq!(
            missing(&items),
            vec![
                ("Landlock ABI 6 scope", true),
                ("Landlock ABI 6 scope", true)
            ]
        );
    }
}
