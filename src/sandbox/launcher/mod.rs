//! The exec side: the hidden launcher mode of the binary. It runs single-threaded, before
//! any runtime, reads its [`LaunchSpec`] from an inherited descriptor, applies the
//! sandbox to itself in a fixed order and execs the target:
//!
//! parent-death signal → setsid → (no CAP_SYS_ADMIN: user namespace, own or the broker's,
//! see `userns`) → PID namespace (see `pidns`; its init makes the mount, IPC and network
//! namespaces before it starts the target, which is then in them, so their kernel memory is
//! charged to the server's cgroup, not the job's) → cgroup (under `run`, made by the parent
//! meanwhile and told on the cgroup gate, `cgroup::CgroupGate`) → network namespace (joined when
//! made ahead or the broker's; made here only where the init could not) → mount view →
//! chdir → rlimits → environment →
//! capability drop → no_new_privs → Landlock → seccomp → close inherited fds → default signal
//! dispositions → execvp.
//!
//! Any failure before exec is a [`SetupError`] whose `Display` is written to the status
//! pipe (close-on-exec, so a successful exec closes it). Lines starting with `unenforced:` name what a
//! `best_effort` policy could not enforce; a line starting with `error:` is fatal.
//!
//! This directory is the code that runs inside the launcher process (the re-executed
//! binary, a fork of the zygote, or `run`'s child): this file, the PID-namespace init and
//! supervisor (`pidns`) and one installer per mechanism (`cgroup` join, `netns`, `mounts`,
//! `rlimits`, `privileges`, `landlock`, `seccomp`; `isolation` adapts the first three to
//! a policy). It imports `policy/` and nothing of `parent/`; the parent reuses some of
//! it (a view or a network namespace made ahead runs the same code in a thread of its own).

pub(crate) mod cgroup;
pub(crate) mod error;
pub(crate) mod fds;
pub(crate) mod isolation;
pub(crate) mod landlock;
pub(crate) mod mounts;
pub(crate) mod netns;
pub(crate) mod pidns;
pub(crate) mod privileges;
pub(crate) mod rlimits;
pub(crate) mod seccomp;
pub(crate) mod userns;

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::sandbox::policy::KernelSupportMode;
use crate::sandbox::policy::resolve::{NetworkPolicy, ResolvedPolicy};
use error::{SETUP_FAILED_EXIT, SetupError};
use landlock::{install_landlock_on_current_thread, landlock_rules};
use netns::{NetnsError, join_namespace};
use privileges::{drop_all_capabilities, set_no_new_privs};
use rlimits::{apply_rlimits, rlimit_plan};
use seccomp::{CompiledFilter, install_seccomp_filter_on_current_thread, seccomp_rules};

// Where the interface stub had them, for callers that name these paths.

/// argv[1] that selects launcher mode.
pub(crate) const LAUNCHER_ARG: &str = "__sandbox-launch";

pub fn is_launcher_invocation() -> bool {
    std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == LAUNCHER_ARG)
}

/// Everything the launcher needs, sent by the parent as JSON over an inherited fd.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LaunchSpec {
    pub policy: ResolvedPolicy,
    /// argv[0] is the program; bytes, since arguments need not be UTF-8.
    pub argv: Vec<Vec<u8>>,
    pub env: Vec<(Vec<u8>, Vec<u8>)>,
    pub cwd: Option<PathBuf>,
    /// Descriptors (besides 0, 1, 2) the target keeps.
    pub keep_fds: Vec<RawFd>,
    pub status_fd: RawFd,
    /// cgroup.procs files of the job's cgroup(s); empty without a cgroup.
    pub cgroup_procs: Vec<PathBuf>,
    /// Whether memory is capped by the cgroup (then RLIMIT_AS is not used).
    pub memory_cgroup: bool,
    /// The cgroup gate's read end (`cgroup::CgroupGate`): the parent makes the job's
    /// cgroup once the launcher runs and tells it there; `cgroup_procs` and
    /// `memory_cgroup` are not used then.
    #[serde(default)]
    pub cgroup_gate_fd: Option<RawFd>,
    /// The network namespace to join (closed right after): the broker's in proxy mode,
    /// or one made ahead of need for `none`/`loopback` (else the launcher makes one) ...
    #[serde(default)]
    pub netns_fd: Option<RawFd>,
    /// ... and the broker's port there, the only TCP port Landlock lets the job connect to.
    #[serde(default)]
    pub proxy_port: Option<u16>,
    /// A mount namespace holding the finished view, made ahead of need for this job
    /// alone (else the launcher builds the view itself) ...
    #[serde(default)]
    pub view_fd: Option<RawFd>,
    /// ... and whether the job mounts its `/proc` there (after the PID namespace split).
    #[serde(default)]
    pub view_mounts_proc: bool,
    /// The spawning process: the launcher dies with it (`pidns`).
    pub parent_pid: u32,
    /// Set when the parent starts the launcher as pid 1 of a new PID namespace
    /// (`CLONE_NEWPID`): the write end of the exit-word pipe, where the init writes the
    /// target's wait status (`pidns::serve_as_init`).
    #[serde(default)]
    pub exit_word_fd: Option<RawFd>,
    /// The soft open-file limit the server had before raising its own: the job's, when
    /// its policy sets none (`rlimits::rlimit_plan`).
    #[serde(default)]
    pub inherited_open_files: Option<u64>,
}

/// Launcher mode: apply the sandbox, exec the target. Never returns.
pub fn launcher_main() -> ! {
    let spec_fd: Option<RawFd> = std::env::args().nth(2).and_then(|a| a.parse().ok());
    let Some(spec_fd) = spec_fd else {
        eprintln!("mcp-sandbox-repl: {LAUNCHER_ARG} is internal; it is started by the server");
        std::process::exit(SETUP_FAILED_EXIT);
    };
    // SAFETY: the parent put the spec at `spec_fd` and nothing else owns it.
    let mut file = unsafe { std::fs::File::from_raw_fd(spec_fd) };
    let mut text = Vec::new();
    let spec: LaunchSpec = match file
        .read_to_end(&mut text)
        .and_then(|_| serde_json::from_slice(&text).map_err(std::io::Error::from))
    {
        Ok(spec) => spec,
        Err(e) => {
            eprintln!("mcp-sandbox-repl: sandbox setup failed: unreadable launch spec: {e}");
            std::process::exit(SETUP_FAILED_EXIT);
        }
    };
    drop(file);
    run_spec(&spec, None)
}

/// Apply `spec` to this process and exec its target; on failure report on the status
/// fd and exit. Must run in a single-threaded process: the re-executed launcher, or
/// the forked child of a single-threaded parent (see `spawn`).
/// `filter` is the policy's seccomp filter when the caller compiled it (the zygote).
pub(crate) fn run_spec(spec: &LaunchSpec, filter: Option<&CompiledFilter>) -> ! {
    // SAFETY: the status fd was handed to us by the parent; we own it.
    let mut status = unsafe { std::fs::File::from_raw_fd(spec.status_fd) };
    set_cloexec(spec.status_fd);
    let mut notes = Vec::new();
    let err = launch(spec, filter, &mut notes, &mut status);
    fail(&mut status, err)
}

/// Report `err` on the status pipe and exit: the target was not exec'd.
fn fail(status: &mut std::fs::File, err: SetupError) -> ! {
    let _ = writeln!(status, "error: {}", err.to_string().replace('\n', " "));
    // SAFETY: _exit skips atexit handlers and stdio flushing, which belong to the parent
    // when this is a forked child.
    unsafe { libc::_exit(SETUP_FAILED_EXIT) }
}

fn set_cloexec(fd: RawFd) {
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
}

/// Isolation step outcome: applied, not available (a note), or failed.
fn isolation_step(
    result: Result<Option<String>, SetupError>,
    notes: &mut Vec<String>,
) -> Result<(), SetupError> {
    match result {
        Ok(None) => Ok(()),
        Ok(Some(note)) => {
            notes.push(note);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The launcher's half: bind to the parent, lead a session, enter a user namespace where
/// one is needed, then split at the PID namespace (see `pidns`). The target's half
/// ([`target_half`]) runs in the process that becomes the target: the init's child, or
/// this process when the policy gets no PID namespace (or, best effort, cannot have
/// one). Returns only with the reason the launch failed in this process.
fn launch(
    spec: &LaunchSpec,
    filter: Option<&CompiledFilter>,
    notes: &mut Vec<String>,
    status: &mut std::fs::File,
) -> SetupError {
    if let Err(e) = pidns::bind_to_parent(spec.parent_pid, Some(spec.status_fd)) {
        return e;
    }
    // SAFETY: plain syscall; we are not a group leader (fresh child of the parent).
    if unsafe { libc::setsid() } < 0 {
        return SetupError::Session(std::io::Error::last_os_error());
    }
    if let Err(e) = enter_user_namespace(spec) {
        return e;
    }
    let policy = &spec.policy;
    let best_effort = policy.kernel_support == KernelSupportMode::BestEffort;
    // Only with a mount view, whose fresh /proc then shows that namespace, is there a
    // PID namespace: a job that sees the host's /proc must be able to signal the pids it
    // shows. A launcher its parent started as pid 1 (only for such policies) is an init
    // whatever happens. The init makes the namespaces the target would make (and keeps
    // those made ahead): it holds them, so that their teardown comes after the target's
    // end has been reported (see `pidns`).
    let hold = pidns::Hold {
        mount: isolation::mount_view_of(policy).is_some() && spec.view_fd.is_none(),
        network: private_network(policy).is_some() && spec.netns_fd.is_none(),
        keep: [spec.netns_fd, spec.view_fd],
    };
    if pidns::is_init() {
        return pidns::serve_as_init(spec.status_fd, spec.exit_word_fd, &hold, &mut |made| {
            target_half(spec, filter, notes, status, made)
        });
    }
    if !policy.filesystem_unrestricted() {
        let target = &mut |made| target_half(spec, filter, notes, status, made);
        match pidns::split(spec.status_fd, &policy.name, best_effort, &hold, target) {
            Ok(note) => notes.extend(note),
            Err(e) => return e,
        }
    }
    target_half(spec, filter, notes, status, pidns::Made::default())
}

/// The target's half, told which namespaces it is already in (`made`): isolate (cgroup,
/// network namespace, mount view), enter the working directory, confine (rlimits,
/// capabilities, no_new_privs, Landlock, seccomp), close what the target must not
/// inherit, report what went unenforced, reset signal dispositions and exec. Never
/// returns: a step that fails is reported on the status pipe.
fn target_half(
    spec: &LaunchSpec,
    filter: Option<&CompiledFilter>,
    notes: &mut Vec<String>,
    status: &mut std::fs::File,
    made: pidns::Made,
) -> ! {
    let err = match apply_sandbox(spec, filter, notes, made) {
        Ok(()) => {
            for note in notes.iter() {
                let _ = writeln!(status, "unenforced: {note}");
            }
            default_signal_dispositions();
            exec(spec)
        }
        Err(e) => e,
    };
    fail(status, err)
}

/// Give the target every signal's default disposition: an ignored signal stays ignored
/// across exec, and this process inherited `SIGPIPE` ignored from Rust's runtime (the
/// zygote's or the re-executed launcher's), or any signal its server was started with
/// ignored (`nohup`). A shell job would otherwise see `yes | head` fail with EPIPE
/// instead of ending quietly.
fn default_signal_dispositions() {
    for sig in 1..libc::SIGRTMIN() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: resetting a disposition in a single-threaded process about to exec.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}

/// The target's steps before its exec, in order: isolate (cgroup, network namespace,
/// mount view; the namespaces in `made` already entered), working directory, confine,
/// close inherited descriptors.
fn apply_sandbox(
    spec: &LaunchSpec,
    filter: Option<&CompiledFilter>,
    notes: &mut Vec<String>,
    made: pidns::Made,
) -> Result<(), SetupError> {
    let memory_cgroup = isolate(spec, notes, made)?;
    if let Some(dir) = &spec.cwd {
        std::env::set_current_dir(dir).map_err(|source| SetupError::WorkingDir {
            path: dir.clone(),
            source,
        })?;
    }
    confine(spec, filter, notes, memory_cgroup)?;
    close_inherited_fds(&spec.keep_fds, spec.status_fd)
}

/// The isolation steps after the PID namespace: cgroup, network namespace, mount view;
/// each a note under `best_effort` where the mechanism is missing, else fatal. Returns
/// whether memory is capped by the cgroup joined.
fn isolate(
    spec: &LaunchSpec,
    notes: &mut Vec<String>,
    made: pidns::Made,
) -> Result<bool, SetupError> {
    let policy = &spec.policy;
    let best_effort = policy.kernel_support == KernelSupportMode::BestEffort;
    // A parent that makes the cgroup only once the launcher runs (`run`, on the gate)
    // has done so meanwhile: the init made the namespaces first.
    let (procs_files, memory_cgroup) = match spec.cgroup_gate_fd {
        Some(fd) => cgroup::CgroupGate::wait(fd)?,
        None => (spec.cgroup_procs.clone(), spec.memory_cgroup),
    };
    isolation_step(isolation::join_cgroup(&procs_files, best_effort), notes)?;
    isolate_network(spec, best_effort, made.network, notes)?;
    if let Some(view) = isolation::mount_view_of(policy) {
        let step = match spec.view_fd {
            // The view made ahead of need for this job alone.
            Some(fd) => {
                // SAFETY: the parent passed this descriptor for us alone; we own it from here.
                let ns = unsafe { OwnedFd::from_raw_fd(fd) };
                isolation::enter_prepared_view(
                    &ns,
                    spec.view_mounts_proc,
                    &view.workspace,
                    best_effort,
                )
            }
            None => isolation::apply_mount_view(&view, made.mount, best_effort),
        };
        isolation_step(step, notes)?;
    }
    Ok(memory_cgroup)
}

/// Without CAP_SYS_ADMIN (root or not), a user namespace of the launcher's own first, in
/// which the namespaces below are made exactly as root makes them (see `userns`): only
/// where the job gets one of them and none was made ahead (the parent makes them only
/// when it could itself). Where user namespaces are refused the launcher carries on,
/// and the step that then lacks CAP_SYS_ADMIN fails (or, best effort, notes) in words.
///
/// A proxy-mode job's broker namespace was made in a user namespace of a helper's own
/// when the server lacks CAP_SYS_ADMIN: the launcher enters that one (never best effort:
/// without it the job cannot join the broker's network).
fn enter_user_namespace(spec: &LaunchSpec) -> Result<(), SetupError> {
    let policy = &spec.policy;
    if !userns::wanted() {
        return Ok(());
    }
    if let (NetworkPolicy::Proxy { .. }, Some(fd)) = (&policy.network, spec.netns_fd) {
        return userns::join_owner_of(fd)
            .map_err(|(step, source)| NetnsError::JoinOwner { step, source }.into());
    }
    let needs_namespaces = !policy.filesystem_unrestricted()
        || private_network(policy).is_some()
        || isolation::mount_view_of(policy).is_some();
    if needs_namespaces && spec.netns_fd.is_none() && spec.view_fd.is_none() {
        let _ = userns::enter();
    }
    Ok(())
}

/// The job's network namespace: a new one (`none`, `loopback`; made by the init,
/// `made_by_init`, or one made ahead, joined), or the broker's joined (`proxy`: never
/// best effort, without it the job would have the host's network).
fn isolate_network(
    spec: &LaunchSpec,
    best_effort: bool,
    made_by_init: bool,
    notes: &mut Vec<String>,
) -> Result<(), SetupError> {
    let policy = &spec.policy;
    if let Some(loopback) = private_network(policy) {
        match spec.netns_fd {
            // A namespace the server made ahead of need for this job alone.
            Some(fd) => {
                // SAFETY: the parent passed this descriptor for us alone; we own it from here.
                let netns = unsafe { OwnedFd::from_raw_fd(fd) };
                join_namespace(&netns)?;
            }
            None => isolation_step(
                isolation::isolate_network(loopback, made_by_init, best_effort),
                notes,
            )?,
        }
    }
    if let NetworkPolicy::Proxy { .. } = policy.network {
        let fd = spec.netns_fd.ok_or_else(|| {
            NetnsError::Join(std::io::Error::other(
                "no namespace was handed to the launcher",
            ))
        })?;
        // SAFETY: the parent passed this descriptor for us alone; we own it from here.
        let netns = unsafe { OwnedFd::from_raw_fd(fd) };
        join_namespace(&netns)?;
    }
    Ok(())
}

/// The confinement steps: rlimits (`memory_cgroup`: memory is capped by the cgroup),
/// capability drop, no_new_privs, Landlock, seccomp.
fn confine(
    spec: &LaunchSpec,
    filter: Option<&CompiledFilter>,
    notes: &mut Vec<String>,
    memory_cgroup: bool,
) -> Result<(), SetupError> {
    let policy = &spec.policy;
    let best_effort = policy.kernel_support == KernelSupportMode::BestEffort;
    // SAFETY: getuid cannot fail.
    let root = unsafe { libc::getuid() } == 0;
    apply_rlimits(&rlimit_plan(
        &policy.limits,
        memory_cgroup,
        root,
        spec.inherited_open_files,
    ))?;
    if policy.drop_capabilities {
        drop_all_capabilities()?;
    }
    let mut plan = landlock_rules(policy);
    if let (Some(port), Some((connect, _))) = (spec.proxy_port, plan.tcp.as_mut()) {
        connect.push(port);
    }
    let seccomp = seccomp_rules(policy);
    if policy.drop_capabilities || !plan.is_empty() || !seccomp.is_empty() {
        set_no_new_privs()?;
    }
    notes.extend(install_landlock_on_current_thread(
        &plan,
        &policy.name,
        best_effort,
    )?);
    install_seccomp_filter_on_current_thread(&seccomp, filter)
}

/// Close every descriptor from 3 up except `keep` and `status` (which is close-on-exec).
fn close_inherited_fds(keep: &[RawFd], status: RawFd) -> Result<(), SetupError> {
    let mut keep: Vec<u32> = keep.iter().chain([&status]).map(|&fd| fd as u32).collect();
    keep.sort_unstable();
    keep.dedup();
    let mut next: u32 = 3;
    for fd in keep.into_iter().chain([u32::MAX]) {
        if fd > next {
            // SAFETY: closing descriptors nobody else in this single-threaded process uses.
            let rc = unsafe { fds::close_range(next, fd - 1, 0) };
            if rc != 0 {
                return Err(SetupError::CloseFds(std::io::Error::last_os_error()));
            }
        }
        next = next.max(fd.saturating_add(1));
    }
    Ok(())
}

/// Whether `policy` gives the job a network namespace of its own without a broker, and
/// whether its `lo` is up (`loopback`) or not (`none`). Only where the job cannot undo
/// it (no capabilities left, or `setns`/`unshare` refused by seccomp).
pub(super) fn private_network(policy: &ResolvedPolicy) -> Option<bool> {
    let loopback = match policy.network {
        NetworkPolicy::None => false,
        NetworkPolicy::Loopback => true,
        _ => return None,
    };
    (policy.syscall_filter || policy.drop_capabilities).then_some(loopback)
}

/// Exec the target with the spec's environment, searching the spec's PATH like execvp
/// (ENOENT and ENOTDIR go on to the next directory, EACCES is remembered, ENOEXEC runs
/// the file with /bin/sh). The process environment is never touched: std's environment
/// lock may be held by the parent's `spawn` in a forked child. Returns why it failed.
fn exec(spec: &LaunchSpec) -> SetupError {
    let program = spec.argv.first().cloned().unwrap_or_default();
    let shown = String::from_utf8_lossy(&program).into_owned();
    if program.is_empty() {
        return SetupError::NoCommand;
    }
    let Some((args, envs)) = c_strings(spec) else {
        return SetupError::NulByte { program: shown };
    };
    let path = search_path(&spec.env);
    let mut envp: Vec<*const libc::c_char> = envs.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let mut denied: Option<std::io::Error> = None;
    let mut last = std::io::Error::from_raw_os_error(libc::ENOENT);
    for candidate in exec_candidates(&program, &path) {
        let Ok(file) = CString::new(candidate) else {
            continue;
        };
        let e = try_exec(&file, &args, &envp);
        match e.raw_os_error() {
            // A script without a #! line: run it with the shell, as execvp does.
            Some(libc::ENOEXEC) => {
                return SetupError::Exec {
                    program: shown,
                    source: exec_with_shell(&file, &args, &envp),
                };
            }
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => last = e,
            Some(libc::EACCES) | Some(libc::EPERM) => denied = Some(e),
            _ => {
                return SetupError::Exec {
                    program: shown,
                    source: e,
                };
            }
        }
    }
    not_executed(spec, shown, &path, denied, last)
}

/// The argument and environment strings of `spec` (entries without a name or with `=`
/// in it left out); `None` when one holds a NUL byte.
fn c_strings(spec: &LaunchSpec) -> Option<(Vec<CString>, Vec<CString>)> {
    let cstr = |b: &[u8]| CString::new(b.to_vec());
    let args: Result<Vec<CString>, _> = spec.argv.iter().map(|a| cstr(a)).collect();
    let envs: Result<Vec<CString>, _> = spec
        .env
        .iter()
        .filter(|(k, _)| !k.is_empty() && !k.contains(&b'='))
        .map(|(k, v)| cstr(&[k.as_slice(), b"=", v.as_slice()].concat()))
        .collect();
    Some((args.ok()?, envs.ok()?))
}

/// The target's `PATH`, or the usual default.
fn search_path(env: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    env.iter()
        .find(|(k, _)| k == b"PATH")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| b"/usr/local/bin:/usr/bin:/bin".to_vec())
}

/// The files to try for `program`: itself when it names a path, else each `PATH`
/// entry's (an empty entry is the current directory), as execvp searches.
fn exec_candidates(program: &[u8], path: &[u8]) -> Vec<Vec<u8>> {
    if program.contains(&b'/') {
        return vec![program.to_vec()];
    }
    path.split(|&c| c == b':')
        .map(|dir| {
            let dir = if dir.is_empty() { b".".as_slice() } else { dir };
            [dir, b"/", program].concat()
        })
        .collect()
}

/// `execve(file, args, envp)`; returns only with the reason it failed.
fn try_exec(file: &CString, args: &[CString], envp: &[*const libc::c_char]) -> std::io::Error {
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: NUL-terminated strings and NULL-terminated arrays that outlive the call.
    unsafe { libc::execve(file.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    std::io::Error::last_os_error()
}

/// `/bin/sh file args...`; returns only with the reason it failed.
fn exec_with_shell(
    file: &CString,
    args: &[CString],
    envp: &[*const libc::c_char],
) -> std::io::Error {
    let sh = c"/bin/sh";
    let mut argv: Vec<*const libc::c_char> = vec![sh.as_ptr(), file.as_ptr()];
    argv.extend(args.iter().skip(1).map(|a| a.as_ptr()));
    argv.push(std::ptr::null());
    // SAFETY: NUL-terminated strings and a NULL-terminated array that outlive the call.
    unsafe { libc::execve(sh.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    std::io::Error::last_os_error()
}

/// Why no candidate ran: refused (the policy's execute paths in the words), not a
/// file, or not found on `path`.
fn not_executed(
    spec: &LaunchSpec,
    shown: String,
    path: &[u8],
    denied: Option<std::io::Error>,
    last: std::io::Error,
) -> SetupError {
    if let Some(source) = denied {
        return SetupError::ExecDenied {
            program: shown,
            source,
            policy: spec.policy.name.clone(),
            allowed: spec
                .policy
                .execute
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        };
    }
    if shown.contains('/') {
        return SetupError::Exec {
            program: shown,
            source: last,
        };
    }
    SetupError::NotFound {
        program: shown,
        path: String::from_utf8_lossy(path).into_owned(),
    }
}

/// Bytes of an OS string, for the spec.
pub(crate) fn os_bytes(s: &std::ffi::OsStr) -> Vec<u8> {
    s.as_bytes().to_vec()
}
