//! What one resolved policy actually gets on this machine: each protection the policy
//! asks for, matched against the probed [`KernelSupport`] and the launcher's rules
//! (which mechanism carries which limit), as "enforced" or "not enforced, because".

use serde::Serialize;

use super::KernelSupport;
use super::per_job::size;
use crate::sandbox::launcher::landlock::landlock_rules;
use crate::sandbox::policy::resolve::{NetworkPolicy, ResolvedPolicy};

/// One protection of a policy and whether this machine enforces it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Item {
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
pub(crate) fn enforcement(k: &KernelSupport, policy: &ResolvedPolicy) -> Vec<Item> {
    let here = Here::new(k, policy);
    let mut items = Vec::new();
    items.extend(here.cgroup_item());
    items.extend(here.file_system_items());
    items.extend(here.network_items());
    items.extend(here.scope_items());
    items.extend(here.privilege_items());
    items.extend(here.limit_items());
    items
}

/// One policy on one machine: what each group of items is read from.
struct Here<'a> {
    k: &'a KernelSupport,
    policy: &'a ResolvedPolicy,
    /// The Landlock ABI (0: none).
    abi: i32,
    /// Root (CAP_SYS_ADMIN in the launcher: namespaces and mounts), or a user namespace
    /// of the launcher's own in which it has it.
    admin: bool,
    /// " in a user namespace" where the launcher makes the job's namespaces in one.
    userns: &'static str,
    /// Whether the job gets its cgroup: one with every capped controller, or none.
    pids_cgroup: bool,
}

impl<'a> Here<'a> {
    fn new(k: &'a KernelSupport, policy: &'a ResolvedPolicy) -> Here<'a> {
        let limits = &policy.limits;
        Here {
            k,
            policy,
            abi: k.landlock_abi.unwrap_or(0) as i32,
            admin: k.is_root || k.namespaces.in_user_namespace,
            userns: if k.namespaces.in_user_namespace {
                " in a user namespace"
            } else {
                ""
            },
            pids_cgroup: k.cgroup.pids.ok && (limits.memory_bytes.is_none() || k.cgroup.memory.ok),
        }
    }

    fn no_landlock(&self) -> String {
        self.k
            .landlock_error
            .clone()
            .unwrap_or_else(|| "Landlock unavailable".into())
    }

    fn netns_missing(&self) -> String {
        self.k
            .namespaces
            .network
            .error
            .clone()
            .unwrap_or_else(|| "needs root (CAP_SYS_ADMIN)".into())
    }

    /// The job cgroup. Without one the launcher carries on with rlimits, except as root
    /// with a process cap (RLIMIT_NPROC does not bind root): then it refuses (fail closed).
    fn cgroup_item(&self) -> Option<Item> {
        let (k, limits) = (self.k, &self.policy.limits);
        if limits.processes.is_none() && limits.memory_bytes.is_none() {
            return None;
        }
        let mut item = check(
            "job cgroup (kill-all, accounting)",
            "cgroup",
            self.pids_cgroup,
            || {
                let why = cgroup_why(&k.cgroup.pids);
                let why = if why.is_empty() {
                    cgroup_why(&k.cgroup.memory)
                } else {
                    why
                };
                match (k.is_root, delegation_hint(k)) {
                    (false, Some(hint)) => format!("{why}; {hint}"),
                    _ => why,
                }
            },
        );
        item.required = k.is_root && limits.processes.is_some();
        Some(item)
    }

    /// The mount view, the PID namespace the launcher splits into where the job has a
    /// view (whose fresh /proc shows that namespace), and Landlock's file rules.
    fn file_system_items(&self) -> Vec<Item> {
        let (k, abi, admin) = (self.k, self.abi, self.admin);
        if self.policy.filesystem_unrestricted() {
            return Vec::new();
        }
        let needs_root = |p: &super::Probe| {
            p.error
                .clone()
                .unwrap_or_else(|| "needs root (CAP_SYS_ADMIN) in the launcher".into())
        };
        let userns = self.userns;
        let mut proc_item = check(
            "/proc shows only the job's own processes",
            format!(
                "procfs hidepid=ptraceable in the mount view{userns} + Landlock ptrace scoping"
            ),
            k.namespaces.mount.ok && k.namespaces.procfs_hidepid.ok && admin && abi >= 1,
            || "needs the mount view, a new procfs and Landlock".into(),
        );
        // Without a new procfs the view binds the host's /proc (read-only) and carries on.
        proc_item.required = k.namespaces.procfs_hidepid.ok;
        vec![
            check(
                "no process of the job outlives the server (double-forked daemons included)",
                format!("PID namespace per job{userns}"),
                k.namespaces.pid.ok && admin,
                || needs_root(&k.namespaces.pid),
            ),
            check(
                "paths outside the policy do not exist (pathname unix sockets, chmod/chown/utimes outside writable paths)",
                format!("private mount namespace, read-only binds{userns}"),
                k.namespaces.mount.ok && admin,
                || needs_root(&k.namespaces.mount),
            ),
            check(
                "file-system read/write/execute rules",
                "Landlock",
                abi >= 1,
                || self.no_landlock(),
            ),
            check(
                "truncate only where writable",
                "Landlock ABI 3",
                abi >= 3,
                || format!("Landlock ABI {abi} < 3"),
            ),
            proc_item,
        ]
    }

    /// What the network mode gets: a namespace (empty, loopback, the broker's) or
    /// Landlock's port rules, and seccomp's socket families.
    fn network_items(&self) -> Vec<Item> {
        let (k, abi, policy) = (self.k, self.abi, self.policy);
        let netns_ok = k.namespaces.network.ok && self.admin;
        let userns = self.userns;
        // Without CAP_SYS_ADMIN the broker's namespace is made in a helper's user
        // namespace (`parent::netns::helper`), which the launcher enters.
        let broker_ok = netns_ok;
        let seccomp_ok = k.seccomp_filter.ok && policy.syscall_filter;
        match &policy.network {
            NetworkPolicy::None => vec![
                check(
                    "no network at all",
                    format!("empty network namespace{userns}"),
                    netns_ok,
                    || self.netns_missing(),
                ),
                check("no sockets but AF_UNIX", "seccomp", seccomp_ok, || {
                    k.seccomp_filter
                        .error
                        .clone()
                        .unwrap_or_else(|| "policy turns the syscall filter off".into())
                }),
            ],
            NetworkPolicy::Loopback => vec![check(
                "loopback only (host listeners unreachable)",
                format!("network namespace with lo up{userns}"),
                netns_ok,
                || self.netns_missing(),
            )],
            NetworkPolicy::Ports { .. } => vec![check(
                "TCP only to/on listed ports",
                "Landlock ABI 4",
                abi >= 4,
                || format!("Landlock ABI {abi} < 4"),
            )],
            NetworkPolicy::Proxy { .. } => vec![
                check(
                    "only the server's proxy reachable (host listeners unreachable)",
                    format!("empty network namespace joined from the broker{userns}"),
                    broker_ok,
                    || self.netns_missing(),
                ),
                check(
                    "TCP connect to the proxy port only; no UDP, raw, netlink or vsock sockets",
                    "Landlock ABI 4 + seccomp",
                    abi >= 4 && seccomp_ok,
                    || format!("Landlock ABI {abi} < 4, or no seccomp filter"),
                ),
            ],
            NetworkPolicy::Full => Vec::new(),
        }
    }

    /// Landlock's scopes (ABI 6).
    fn scope_items(&self) -> Vec<Item> {
        let abi = self.abi;
        let plan = landlock_rules(self.policy);
        let scope = |what: &str| {
            check(what, "Landlock ABI 6 scope", abi >= 6, || {
                format!("Landlock ABI {abi} < 6")
            })
        };
        let mut items = Vec::new();
        if plan.scope_abstract_unix {
            items.push(scope("abstract unix sockets outside the job unreachable"));
        }
        if plan.scope_signals {
            items.push(scope("no signals to processes outside the job"));
        }
        items
    }

    /// The capability drop and the syscall filter.
    fn privilege_items(&self) -> Vec<Item> {
        let (k, policy) = (self.k, self.policy);
        let mut items = Vec::new();
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
        items
    }

    /// The resource limits and what carries each.
    fn limit_items(&self) -> Vec<Item> {
        let (k, limits) = (self.k, &self.policy.limits);
        let mut items = Vec::new();
        if let Some(mem) = limits.memory_bytes {
            let how = match self.pids_cgroup {
                true => "memory cgroup",
                false => "RLIMIT_AS (address space; coarser)",
            };
            items.push(yes(format!("memory ≤ {}", size(mem)), how));
        }
        if let Some(n) = limits.processes {
            items.push(if self.pids_cgroup {
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
            });
        }
        let plain = [
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
        ];
        for (limit, what, how) in plain {
            if let Some(n) = limit {
                items.push(yes(format!("{what} ≤ {n}"), how));
            }
        }
        items
    }
}

/// What a server that is not root needs for job cgroups: the directories it makes them
/// in, owned by its uid (v1), or its own cgroup delegated to it (v2).
fn delegation_hint(k: &KernelSupport) -> Option<String> {
    use crate::sandbox::parent::cgroup::CgroupVersion;
    let uid = k.euid;
    match k.cgroup.version {
        CgroupVersion::V1 => {
            let dirs: Vec<&str> = [&k.cgroup.pids_dir, &k.cgroup.memory_dir]
                .into_iter()
                .flatten()
                .map(String::as_str)
                .collect();
            (!dirs.is_empty()).then(|| {
                format!(
                    "without root, delegate a subtree: {} writable by uid {uid} (the server \
                     makes mcp-sandbox-repl/<job> in each)",
                    dirs.join(" and ")
                )
            })
        }
        CgroupVersion::V2 => k.cgroup.pids_dir.as_ref().map(|dir| {
            format!(
                "without root, delegate the server's cgroup {dir} to uid {uid} (owned by it, \
                 pids and memory enabled for it, e.g. systemd Delegate=yes)"
            )
        }),
        CgroupVersion::None => None,
    }
}

fn cgroup_why(p: &super::Probe) -> String {
    p.error.clone().unwrap_or_default()
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
                in_user_namespace: false,
            },
            cgroup: CgroupSupport {
                version: CgroupVersion::V1,
                hybrid: false,
                pids_dir: None,
                memory_dir: None,
                pids: p(cgroups),
                memory: p(cgroups),
                v2_controllers: Vec::new(),
                ambient: Default::default(),
                per_job: String::new(),
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

    /// Not root, but the launcher makes the namespaces in a user namespace of its own:
    /// everything but the job cgroup (not required off root) is enforced, said to be so
    /// "in a user namespace"; the broker's namespace too (made in a helper's).
    #[test]
    fn unprivileged_with_a_user_namespace_keeps_the_namespaces() {
        let mut k = kernel(false, false, Some(7));
        let ok = Probe {
            ok: true,
            error: None,
        };
        k.namespaces.network = ok.clone();
        k.namespaces.mount = ok.clone();
        k.namespaces.procfs_hidepid = ok;
        k.namespaces.in_user_namespace = true;
        k.cgroup.pids_dir = Some("/sys/fs/cgroup/pids".into());
        let items = enforcement(&k, &workspace_write());
        assert_eq!(missing(&items), vec![("cgroup", false)]);
        let cgroup = items.iter().find(|i| i.how == "cgroup").unwrap();
        assert!(
            cgroup.why_not.as_deref().unwrap().ends_with(
                "; without root, delegate a subtree: /sys/fs/cgroup/pids writable by uid \
                 1000 (the server makes mcp-sandbox-repl/<job> in each)"
            ),
            "{cgroup:?}"
        );
        for how in [
            "PID namespace",
            "private mount namespace",
            "empty network namespace",
        ] {
            let item = items.iter().find(|i| i.how.starts_with(how)).unwrap();
            assert!(item.how.ends_with(" in a user namespace"), "{item:?}");
        }
        let mut proxied = workspace_write();
        proxied.network = NetworkPolicy::Proxy { allow: Vec::new() };
        let items = enforcement(&k, &proxied);
        let broker = items
            .iter()
            .find(|i| i.how.contains("from the broker"))
            .unwrap();
        assert!(broker.enforced && broker.required, "{broker:?}");
        assert!(broker.how.ends_with(" in a user namespace"), "{broker:?}");
    }

    /// Root without CAP_SYS_ADMIN (a container's default capabilities) makes the job's
    /// namespaces in a user namespace as uid 65534 does; without a job cgroup its process
    /// cap is missing and required (RLIMIT_NPROC does not bind root), so doctor names it.
    #[test]
    fn root_without_cap_sys_admin_uses_a_user_namespace_and_needs_the_cgroup() {
        let mut k = kernel(true, false, Some(7));
        k.namespaces.in_user_namespace = true;
        let mut proxied = workspace_write();
        proxied.network = NetworkPolicy::Proxy { allow: Vec::new() };
        let items = enforcement(&k, &proxied);
        for how in [
            "PID namespace",
            "private mount namespace",
            "empty network namespace joined from the broker",
        ] {
            let item = items.iter().find(|i| i.how.starts_with(how)).unwrap();
            assert!(
                item.enforced && item.how.ends_with(" in a user namespace"),
                "{item:?}"
            );
        }
        let nproc = items.iter().find(|i| i.what == "≤ 512 processes").unwrap();
        assert!(!nproc.enforced && nproc.required, "{nproc:?}");
        assert!(
            nproc
                .why_not
                .as_deref()
                .unwrap()
                .contains("RLIMIT_NPROC does not bind root")
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
