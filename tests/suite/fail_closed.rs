//! Fail closed, forced: each isolation mechanism is made unavailable to a real `run` (the
//! launcher path, as root) and the job is refused in words under `kernel_support =
//! "required"`, or runs with a note under `unenforced` under `best_effort`
//! (docs/security.md, "Which mechanisms fail closed").
//!
//! The mechanism is taken away inside the test's own child before it execs the binary:
//! a seccomp filter that answers one system call (or one namespace flag of `unshare`,
//! one `prctl` option, a `prlimit64` that sets a limit) with an error, as a container or
//! an old kernel would, or a private mount namespace whose `/sys/fs/cgroup` is an empty
//! tmpfs. Nothing outside that child is touched. The steps that are never best effort
//! (parent-death signal, new session, rlimits, capability drop, no_new_privs, a Landlock
//! ruleset the kernel will not enforce, seccomp) are refused under both settings.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Output;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

use crate::common::{TempDir, report, run_cmd, stderr, unshare_private_mounts};

/// How the test's child takes a mechanism away before it execs `run`.
enum Denial {
    /// `syscall` fails with `errno`: always, or only when its first argument has every
    /// bit of `flags` (an `unshare` of one namespace type).
    Syscall {
        syscall: libc::c_long,
        flags: Option<u64>,
        errno: u32,
    },
    /// `syscall` fails with `errno` when its argument `arg` compares to `value` by `op`
    /// (a `prctl` of one option, a `prlimit64` that sets a limit).
    SyscallWhen {
        syscall: libc::c_long,
        arg: u8,
        op: SeccompCmpOp,
        value: u64,
        errno: u32,
    },
    /// No cgroup file system: `/sys/fs/cgroup` covered by an empty tmpfs.
    NoCgroups,
}

/// A filter that answers `syscall` with `errno` when `condition` holds.
fn filter_when(syscall: libc::c_long, condition: SeccompCondition, errno: u32) -> BpfProgram {
    SeccompFilter::new(
        [(syscall, vec![SeccompRule::new(vec![condition]).unwrap()])]
            .into_iter()
            .collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(errno),
        std::env::consts::ARCH.try_into().unwrap(),
    )
    .unwrap()
    .try_into()
    .unwrap()
}

/// A filter that answers the denied call with its errno and allows everything else.
fn filter(syscall: libc::c_long, flags: Option<u64>, errno: u32) -> BpfProgram {
    let rules = match flags {
        Some(f) => vec![
            SeccompRule::new(vec![
                SeccompCondition::new(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(f), f)
                    .unwrap(),
            ])
            .unwrap(),
        ],
        // No rule: the call matches whatever its arguments.
        None => Vec::new(),
    };
    SeccompFilter::new(
        [(syscall, rules)].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(errno),
        std::env::consts::ARCH.try_into().unwrap(),
    )
    .unwrap()
    .try_into()
    .unwrap()
}

/// `sh -c 'echo ran'` under `policy` in `ws`, by `run --json`, with `denial` in force.
fn run_denied(policy: &str, ws: &Path, denial: &Denial) -> Output {
    // SAFETY: geteuid takes no arguments and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "these tests force failures of mechanisms only root has; run them as root"
    );
    let mut cmd = run_cmd(policy, ws, true, &["sh", "-c", "echo ran"]);
    let program = match denial {
        Denial::Syscall {
            syscall,
            flags,
            errno,
        } => Some(filter(*syscall, *flags, *errno)),
        Denial::SyscallWhen {
            syscall,
            arg,
            op,
            value,
            errno,
        } => {
            let condition =
                SeccompCondition::new(*arg, SeccompCmpArgLen::Qword, op.clone(), *value).unwrap();
            Some(filter_when(*syscall, condition, *errno))
        }
        Denial::NoCgroups => None,
    };
    match (denial, program) {
        (_, Some(program)) => {
            // SAFETY: between fork and exec the child only makes the seccomp system calls
            // of `apply_filter` (prctl, seccomp) on a program built before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    seccompiler::apply_filter(&program).map_err(std::io::Error::other)
                });
            }
        }
        (_, None) => {
            let (cgroup, tmpfs) = (c"/sys/fs/cgroup", c"tmpfs");
            // SAFETY: between fork and exec the child only makes system calls (unshare,
            // mount) with static strings; they change its own mount
            // namespace, which no other process shares.
            unsafe {
                cmd.pre_exec(move || {
                    let ok = unshare_private_mounts()
                        && libc::mount(
                            tmpfs.as_ptr(),
                            cgroup.as_ptr(),
                            tmpfs.as_ptr(),
                            0,
                            std::ptr::null(),
                        ) == 0;
                    if ok {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
    }
    cmd.output().unwrap()
}

/// workspace-write with `kernel_support = "best_effort"`, written into `dir`.
fn best_effort_policy(dir: &TempDir) -> String {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/workspace-write.toml"),
    )
    .unwrap();
    let required = "kernel_support = \"required\"";
    assert!(text.contains(required), "workspace-write changed: {text}");
    let text = text.replace(required, "kernel_support = \"best_effort\"");
    dir.write("best-effort.toml", &text).display().to_string()
}

/// Under `required` the job is refused before it runs, with `words` (what failed) and
/// `hint` (what to do) on stderr; under `best_effort` it runs and its report lists a note
/// starting with `note`.
fn check(tag: &str, denial: Denial, words: &str, hint: &str, note: &str) {
    let ws = TempDir::new(&format!("closed-{tag}"));
    let pol = TempDir::new(&format!("closed-{tag}-policy"));
    let out = run_denied("workspace-write", &ws.path, &denial);
    let err = stderr(&out);
    assert!(
        !out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("ran"),
        "{tag}: a required policy ran without it: {out:?}"
    );
    assert!(
        err.contains("sandbox setup failed") && err.contains(words) && err.contains(hint),
        "{tag}: refused without the words {words:?} / {hint:?}: {err}"
    );

    let out = run_denied(&best_effort_policy(&pol), &ws.path, &denial);
    let r = report(&out);
    assert_eq!(r["exit_code"], 0, "{tag}: {r}; stderr: {}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ran"),
        "{tag}: {out:?}"
    );
    let notes = r["unenforced"].as_array().unwrap();
    assert!(
        notes
            .iter()
            .any(|n| n.as_str().is_some_and(|n| n.starts_with(note))),
        "{tag}: no note {note:?} in {r}"
    );
}

fn unshare_denied(flag: libc::c_int) -> Denial {
    Denial::Syscall {
        syscall: libc::SYS_unshare,
        flags: Some(flag as u64),
        errno: libc::EPERM as u32,
    }
}

#[test]
fn no_pid_namespace_fails_closed_unless_best_effort() {
    check(
        "pidns",
        unshare_denied(libc::CLONE_NEWPID),
        "cannot create the job's PID namespace (unshare CLONE_NEWPID: Operation not permitted",
        "kernel_support = \"best_effort\"",
        "PID namespace (unshare CLONE_NEWPID",
    );
}

#[test]
fn no_network_namespace_fails_closed_unless_best_effort() {
    check(
        "netns",
        unshare_denied(libc::CLONE_NEWNET),
        "cannot create a network namespace (unshare CLONE_NEWNET): Operation not permitted",
        "run the server as root",
        "private network namespace",
    );
}

#[test]
fn no_mount_namespace_fails_closed_unless_best_effort() {
    check(
        "mounts",
        unshare_denied(libc::CLONE_NEWNS),
        "cannot create a mount and IPC namespace",
        "use a policy that allows best effort",
        "private mount view",
    );
}

#[test]
fn no_landlock_fails_closed_unless_best_effort() {
    check(
        "landlock",
        Denial::Syscall {
            syscall: libc::SYS_landlock_create_ruleset,
            flags: None,
            errno: libc::ENOSYS as u32,
        },
        "this kernel has no Landlock; policy workspace-write requires it",
        "requires it",
        "file-system rules (kernel has no Landlock)",
    );
}

/// Root with a process cap: RLIMIT_NPROC does not bind root, so only a pids cgroup
/// enforces it (refused without one); best effort falls back to rlimits, with a note.
#[test]
fn no_cgroup_as_root_fails_closed_unless_best_effort() {
    check(
        "cgroup",
        Denial::NoCgroups,
        "cannot create the job's cgroup",
        "holds only through a pids cgroup",
        "cgroup limits, using rlimits instead",
    );
}

/// seccomp is never best effort: a kernel that refuses the filter refuses the job, also
/// under `best_effort` (docs/security.md says so).
#[test]
fn a_refused_seccomp_filter_fails_closed_even_under_best_effort() {
    let denial = || Denial::Syscall {
        syscall: libc::SYS_seccomp,
        flags: None,
        errno: libc::EINVAL as u32,
    };
    refused_under_both(
        "seccomp",
        denial,
        "sandbox setup failed: this kernel refused the seccomp filter",
    );
}

/// The steps that are never best effort: a job whose launcher cannot take them is
/// refused, in words naming the step, under `required` and under `best_effort` alike.
fn refused_under_both(tag: &str, denial: impl Fn() -> Denial, words: &str) {
    let ws = TempDir::new(&format!("closed-{tag}"));
    let pol = TempDir::new(&format!("closed-{tag}-policy"));
    for policy in ["workspace-write".to_string(), best_effort_policy(&pol)] {
        let out = run_denied(&policy, &ws.path, &denial());
        let err = stderr(&out);
        assert!(
            !out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("ran"),
            "{tag}, {policy}: ran without it: {out:?}"
        );
        assert!(
            err.contains("sandbox setup failed") && err.contains(words),
            "{tag}, {policy}: refused without the words {words:?}: {err}"
        );
    }
}

fn prctl_denied(option: libc::c_int) -> Denial {
    Denial::SyscallWhen {
        syscall: libc::SYS_prctl,
        arg: 0,
        op: SeccompCmpOp::Eq,
        value: option as u64,
        errno: libc::EPERM as u32,
    }
}

#[test]
fn a_refused_capability_drop_fails_closed_even_under_best_effort() {
    refused_under_both(
        "caps",
        || Denial::Syscall {
            syscall: libc::SYS_capset,
            flags: None,
            errno: libc::EPERM as u32,
        },
        "cannot clear the",
    );
}

#[test]
fn a_refused_no_new_privs_fails_closed_even_under_best_effort() {
    refused_under_both(
        "nnp",
        || prctl_denied(libc::PR_SET_NO_NEW_PRIVS),
        "cannot set no_new_privs",
    );
}

/// Setting a limit refused (reading one still works: the runtime reads its stack's).
#[test]
fn refused_rlimits_fail_closed_even_under_best_effort() {
    refused_under_both(
        "rlimits",
        || Denial::SyscallWhen {
            syscall: libc::SYS_prlimit64,
            arg: 2,
            op: SeccompCmpOp::Ne,
            value: 0,
            errno: libc::EPERM as u32,
        },
        "cannot set the",
    );
}

#[test]
fn a_refused_parent_death_signal_fails_closed_even_under_best_effort() {
    refused_under_both(
        "pdeathsig",
        || prctl_denied(libc::PR_SET_PDEATHSIG),
        "cannot ask to be killed with the server (prctl PR_SET_PDEATHSIG)",
    );
}

#[test]
fn a_refused_new_session_fails_closed_even_under_best_effort() {
    refused_under_both(
        "setsid",
        || Denial::Syscall {
            syscall: libc::SYS_setsid,
            flags: None,
            errno: libc::EPERM as u32,
        },
        "setsid: Operation not permitted",
    );
}

/// A Landlock ruleset the kernel will not enforce on the process (`landlock_restrict_self`
/// refused) is refused under both settings: best effort covers a kernel without Landlock
/// or with an older ABI, not one that refuses a ruleset it accepted.
#[test]
fn a_landlock_ruleset_that_cannot_be_enforced_fails_closed_even_under_best_effort() {
    refused_under_both(
        "landlock-restrict",
        || Denial::Syscall {
            syscall: libc::SYS_landlock_restrict_self,
            flags: None,
            errno: libc::EPERM as u32,
        },
        "sandbox setup failed: Landlock: ",
    );
}
