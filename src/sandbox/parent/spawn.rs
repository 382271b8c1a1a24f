//! The spawn side: [`SandboxCommand`] builds a [`LaunchSpec`], starts the launcher by the
//! route its [`Runtime`] is configured for (zygote, re-exec with the spec on a memfd, or
//! a plain fork), and reads the status pipe until
//! the launcher has exec'd the target (EOF) or reported why it could not (words).
//!
//! Between fork and exec the parent does only async-signal-safe work: `dup2` of the
//! descriptors the child keeps. Everything else happens in the single-threaded launcher.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ChildStderr, ChildStdin, ChildStdout, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::child::SandboxedChild;
use super::error::LaunchError;
use super::isolation::JobCgroupHandle;
use super::memfd::bytes_memfd;
use super::proxy::{ProxyError, ProxyGuard, ProxyNetwork, ProxyRequest};
use super::runtime::{Route, Runtime};
use crate::sandbox::launcher::cgroup::CgroupGate;
use crate::sandbox::launcher::error::SetupError;
use crate::sandbox::launcher::mounts::PreparedView;
use crate::sandbox::launcher::{LAUNCHER_ARG, LaunchSpec, os_bytes, run_spec};
use crate::sandbox::policy::KernelSupportMode;
use crate::sandbox::policy::resolve::{NetworkPolicy, ResolvedPolicy};

impl Runtime {
    /// A command to start `program` under `policy` with this runtime.
    pub fn command(
        &self,
        policy: Arc<ResolvedPolicy>,
        program: impl Into<OsString>,
    ) -> SandboxCommand {
        SandboxCommand::new(self.clone(), policy, program)
    }
}

/// Start a proxy network for one job through `rt`'s broker, or say why not.
fn start_proxy(rt: &Runtime, request: &ProxyRequest<'_>) -> Result<ProxyNetwork, ProxyError> {
    match rt.proxy_provider() {
        Some(p) => p.start(request),
        None => Err(ProxyError::NoBroker {
            policy: request.policy.to_string(),
        }),
    }
}

/// Builder for one sandboxed process, like `std::process::Command`.
pub struct SandboxCommand {
    runtime: Runtime,
    policy: Arc<ResolvedPolicy>,
    program: OsString,
    args: Vec<OsString>,
    cwd: Option<PathBuf>,
    env: Vec<(OsString, OsString)>,
    fds: Vec<(OwnedFd, RawFd)>,
    stdin: Option<Io>,
    stdout: Option<Io>,
    stderr: Option<Io>,
    enforce_wall_time: bool,
    view_made_ahead: bool,
    proxy_trusts_target: bool,
}

impl SandboxCommand {
    /// A command for `program` under `policy`, started with `runtime`'s launch state
    /// (also [`Runtime::command`]).
    pub fn new(
        runtime: Runtime,
        policy: Arc<ResolvedPolicy>,
        program: impl Into<OsString>,
    ) -> Self {
        SandboxCommand {
            runtime,
            policy,
            program: program.into(),
            args: Vec::new(),
            cwd: None,
            env: Vec::new(),
            fds: Vec::new(),
            stdin: None,
            stdout: None,
            stderr: None,
            enforce_wall_time: true,
            view_made_ahead: false,
            proxy_trusts_target: false,
        }
    }
    pub fn arg(&mut self, arg: impl Into<OsString>) -> &mut Self {
        self.args.push(arg.into());
        self
    }
    pub fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(&mut self, args: I) -> &mut Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }
    pub fn current_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        self.cwd = Some(dir.into());
        self
    }
    /// Set a variable on top of those the policy passes through.
    pub fn env(&mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> &mut Self {
        self.env.push((key.into(), value.into()));
        self
    }
    /// Hand `fd` to the child as descriptor number `target` (>= 3).
    pub fn pass_fd(&mut self, fd: OwnedFd, target: RawFd) -> &mut Self {
        self.fds.push((fd, target));
        self
    }
    pub fn stdin(&mut self, s: impl Into<Io>) -> &mut Self {
        self.stdin = Some(s.into());
        self
    }
    pub fn stdout(&mut self, s: impl Into<Io>) -> &mut Self {
        self.stdout = Some(s.into());
        self
    }
    pub fn stderr(&mut self, s: impl Into<Io>) -> &mut Self {
        self.stderr = Some(s.into());
        self
    }
    /// Whether `wait` kills the process group when the policy's wall-time limit passes
    /// (true by default; a long-lived REPL worker turns it off).
    pub fn enforce_wall_time(&mut self, on: bool) -> &mut Self {
        self.enforce_wall_time = on;
        self
    }

    /// Whether this process may take a file-system view made ahead of need (by the
    /// server, for a policy its jobs share: shell jobs). Off by default: views would be
    /// made ahead for a policy used once (a session's, an install's) and wait unused.
    /// The view is the job's alone either way.
    pub fn view_made_ahead(&mut self, on: bool) -> &mut Self {
        self.view_made_ahead = on;
        self
    }

    /// Whether the network broker (proxy mode) may treat the program this command execs
    /// — that process alone, never its children or anything it later runs — as the
    /// server's own trusted client, and lend it the server's credentials where the
    /// broker's rules allow (the installer: `uv` itself, not its build hooks). Off by
    /// default; without proxy mode it changes nothing.
    pub fn proxy_trusts_target(&mut self, on: bool) -> &mut Self {
        self.proxy_trusts_target = on;
        self
    }

    /// Start the process. Returns once the target has been exec'd (or the launcher
    /// reported why it could not be). Blocks for the launcher's setup (about a
    /// millisecond); async callers may prefer `spawn_blocking`.
    ///
    /// The steps, each a function of its own: the job's resources ([`Self::acquire`]),
    /// where each descriptor goes ([`FdLayout`]), the launch spec ([`Self::plan`]), the
    /// route ([`choose_route`], [`start_launcher`]) and the launcher's report on the
    /// status pipe ([`read_status`]).
    pub fn spawn(self) -> Result<SandboxedChild, LaunchError> {
        let spawn_err = |source: std::io::Error| LaunchError::Spawn {
            program: self.program.clone(),
            source,
        };
        if let Some(&(_, t)) = self.fds.iter().find(|(_, t)| *t < 3) {
            return Err(SetupError::ReservedFd { target: t }.into());
        }
        let route = choose_route(self.runtime.config().route, single_threaded());
        let mut made = self.acquire(route)?;
        let layout = FdLayout::above(self.fds.iter().map(|(_, t)| *t));
        let (status_r, status_w) = pipe_cloexec().map_err(spawn_err)?;
        let spec = self.plan(&made, &layout);
        let [stdin, stdout, stderr] = [
            (self.stdin, Direction::ToChild),
            (self.stdout, Direction::FromChild),
            (self.stderr, Direction::FromChild),
        ]
        .map(|(io, dir)| child_end(io, dir));
        let (stdin, stdin_ours) = stdin.map_err(spawn_err)?;
        let (stdout, stdout_ours) = stdout.map_err(spawn_err)?;
        let (stderr, stderr_ours) = stderr.map_err(spawn_err)?;
        let fds = layout.placements(&self.fds, &status_w, &made);
        let started = Instant::now();
        let pid = start_launcher(
            &self.runtime,
            route,
            spec,
            &fds,
            &layout,
            [stdin, stdout, stderr],
        )
        .map_err(spawn_err)?;
        drop(status_w);
        // The launcher holds its own copies now (or has joined them already).
        drop(made.netns.take());
        drop(made.view.take());
        let unmade = open_gate(&self.policy, &self.runtime, &mut made).err();
        let status = launcher_status(status_r, pid, unmade)?;
        made.unenforced.extend(status.unenforced);
        let limits = &self.policy.limits;
        let wall_limit = match self.enforce_wall_time {
            true => limits.wall_seconds.map(Duration::from_secs),
            false => None,
        };
        let mut child = SandboxedChild::new(
            pid,
            status.pgid,
            (
                stdin_ours.map(ChildStdin::from),
                stdout_ours.map(ChildStdout::from),
                stderr_ours.map(ChildStderr::from),
            ),
            made.cgroup,
            started,
            wall_limit,
            limits.clone(),
            made.unenforced,
            // Our end of the exit-word pipe (theirs closed), when the launcher is the init.
            made.exit_word.map(|(ours, _)| ours).filter(|_| status.init),
        )
        .map_err(spawn_err)?;
        if let Some(proxy) = made.proxy {
            if self.proxy_trusts_target {
                // The target has been exec'd (the status pipe reached EOF): in a PID
                // namespace it is the init's only child so far.
                proxy.job.target_started(child.main_pid());
            }
            child.set_proxy(ProxyGuard::new(proxy.denials, proxy.job));
        }
        Ok(child)
    }

    /// Whether the launcher is started as pid 1 of a new PID namespace (the parent's
    /// `CLONE_NEWPID`, one fork and one exit hop fewer than a supervisor outside it):
    /// for policies that get a PID namespace, when this process can make one directly
    /// (not through the launcher's own user namespace), on the routes that clone.
    fn init_by_parent(&self, route: Route) -> bool {
        route != Route::Reexec
            && !self.policy.filesystem_unrestricted()
            && !crate::sandbox::launcher::userns::wanted()
    }

    /// What the job needs made before its launcher starts: its cgroup (the server's
    /// jobs take one made ahead of need; `run` makes its own), its broker in proxy mode,
    /// a network namespace and a view made ahead, the exit-word pipe of an init.
    fn acquire(&self, route: Route) -> Result<Resources, LaunchError> {
        let policy = &self.policy;
        let rt = &self.runtime;
        let mut unenforced = Vec::new();
        // `run` (the fork route, nothing made ahead) makes the job's cgroup only once
        // the launcher runs, while the init makes the namespaces, not before it
        // (`open_gate`); the target joins it once the gate says it is there.
        let (cgroup, cgroup_gate) = match route == Route::Fork && limited(policy) {
            true => (
                None,
                Some(pipe_cloexec().map_err(|source| LaunchError::Spawn {
                    program: self.program.clone(),
                    source,
                })?),
            ),
            false => (job_cgroup(policy, rt, &mut unenforced)?, None),
        };
        // Proxy mode: the broker's namespace and listener, made before anything else
        // that would need undoing.
        let proxy = match &policy.network {
            NetworkPolicy::Proxy { allow } => Some(start_proxy(
                rt,
                &ProxyRequest {
                    policy: &policy.name,
                    allow,
                    trust_target: self.proxy_trusts_target,
                },
            )?),
            _ => None,
        };
        let netns =
            crate::sandbox::launcher::private_network(policy).and_then(|lo| rt.take_netns(lo));
        let view = crate::sandbox::launcher::isolation::mount_view_of(policy)
            .filter(|_| self.view_made_ahead)
            .and_then(|kind| rt.take_view(&kind));
        let exit_word = match self.init_by_parent(route) {
            true => Some(pipe_cloexec().map_err(|source| LaunchError::Spawn {
                program: self.program.clone(),
                source,
            })?),
            false => None,
        };
        Ok(Resources {
            cgroup,
            cgroup_gate,
            proxy,
            netns,
            view,
            unenforced,
            exit_word,
        })
    }

    /// The launch spec: what the launcher applies and execs, with the descriptors at
    /// their places in `layout`.
    fn plan(&self, made: &Resources, layout: &FdLayout) -> LaunchSpec {
        let policy = &self.policy;
        let proxy_env = made.proxy.as_ref().map(|p| p.env.as_slice());
        let env = child_env(policy.child_env(std::env::vars_os()), &self.env, proxy_env);
        let mut argv = vec![os_bytes(&self.program)];
        argv.extend(self.args.iter().map(|a| os_bytes(a)));
        let cgroup = made.cgroup.as_ref();
        LaunchSpec {
            policy: (**policy).clone(),
            argv,
            env: env
                .iter()
                .map(|(k, v)| (os_bytes(k), os_bytes(v)))
                .collect(),
            cwd: self.cwd.clone().or_else(|| Some(policy.workspace.clone())),
            keep_fds: self.fds.iter().map(|(_, t)| *t).collect(),
            status_fd: layout.status,
            cgroup_procs: cgroup.map(|c| c.procs_files()).unwrap_or_default(),
            memory_cgroup: cgroup.is_some_and(|c| c.has_memory_limit()),
            cgroup_gate_fd: made.cgroup_gate.as_ref().map(|_| layout.cgroup_gate),
            netns_fd: (made.proxy.is_some() || made.netns.is_some()).then_some(layout.netns),
            proxy_port: made.proxy.as_ref().map(|p| p.port),
            view_fd: made.view.as_ref().map(|_| layout.view),
            view_mounts_proc: made.view.as_ref().is_some_and(|v| v.mounts_proc()),
            parent_pid: std::process::id(),
            exit_word_fd: made.exit_word.as_ref().map(|_| layout.exit_word),
            inherited_open_files: self.runtime.config().inherited_open_files,
        }
    }
}

/// The job's cgroup when its policy limits memory or processes. Without one,
/// RLIMIT_AS caps memory and RLIMIT_NPROC processes — but RLIMIT_NPROC never binds
/// root, so root fails closed unless the policy is best effort.
fn job_cgroup(
    policy: &ResolvedPolicy,
    rt: &Runtime,
    unenforced: &mut Vec<String>,
) -> Result<Option<JobCgroupHandle>, LaunchError> {
    if !limited(policy) {
        return Ok(None);
    }
    let limits = &policy.limits;
    let kind = (limits.memory_bytes, limits.processes);
    match rt
        .take_cgroup(&kind)
        .map_or_else(|| rt.make_cgroup(&kind), Ok)
    {
        Ok(cg) => Ok(Some(cg)),
        Err(e) => {
            // SAFETY: getuid cannot fail.
            let root = unsafe { libc::getuid() } == 0;
            let best_effort = policy.kernel_support == KernelSupportMode::BestEffort;
            if root && limits.processes.is_some() && !best_effort {
                return Err(SetupError::RootNeedsCgroup {
                    policy: policy.name.clone(),
                    source: e,
                }
                .into());
            }
            unenforced.push(format!("cgroup limits, using rlimits instead ({e})"));
            Ok(None)
        }
    }
}

/// Whether `policy` limits memory or processes: what a job cgroup is for.
fn limited(policy: &ResolvedPolicy) -> bool {
    policy.limits.memory_bytes.is_some() || policy.limits.processes.is_some()
}

/// `run`'s job cgroup, made now that the launcher runs (the init makes the job's
/// namespaces meanwhile), and told to the target on the gate. Without one to
/// make, nothing. On failure the target is told to stop before it joins anything, and
/// the error is the caller's to report.
fn open_gate(
    policy: &ResolvedPolicy,
    rt: &Runtime,
    made: &mut Resources,
) -> Result<(), LaunchError> {
    let Some((read, write)) = made.cgroup_gate.take() else {
        return Ok(());
    };
    drop(read);
    let cgroup = job_cgroup(policy, rt, &mut made.unenforced);
    let gate = match &cgroup {
        Ok(Some(cg)) => CgroupGate::Join {
            procs_files: cg.procs_files(),
            memory: cg.has_memory_limit(),
        },
        Ok(None) => CgroupGate::Without,
        Err(_) => CgroupGate::Refused,
    };
    // A launcher that has already ended (it failed first) reads nothing: its report
    // says why.
    let _ = std::fs::File::from(write).write_all(&gate.encode());
    made.cgroup = cgroup?;
    Ok(())
}

/// What a spawn made (or took) for its job before the launcher starts.
struct Resources {
    cgroup: Option<JobCgroupHandle>,
    /// The cgroup gate (read, write) when the cgroup is made after the launcher starts.
    cgroup_gate: Option<(OwnedFd, OwnedFd)>,
    proxy: Option<ProxyNetwork>,
    /// A network namespace made ahead (`none` / `loopback`).
    netns: Option<OwnedFd>,
    view: Option<PreparedView>,
    /// What the policy asked for and this spawn could not give (best effort).
    unenforced: Vec<String>,
    /// The exit-word pipe (read, write) when the launcher is started as an init.
    exit_word: Option<(OwnedFd, OwnedFd)>,
}

/// Where the launcher finds its own descriptors: just above the caller's highest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FdLayout {
    /// The spec's memfd (re-exec route).
    spec: RawFd,
    /// The status pipe's write end.
    status: RawFd,
    /// A network namespace to join (the broker's or one made ahead).
    netns: RawFd,
    /// A view made ahead.
    view: RawFd,
    /// The exit-word pipe's write end (a launcher started as an init).
    exit_word: RawFd,
    /// The cgroup gate's read end (a cgroup made after the launcher starts).
    cgroup_gate: RawFd,
    /// Above every target: where sources are moved before they are placed.
    high: RawFd,
}

impl FdLayout {
    /// The layout above the caller's `targets` (at least above stdio).
    fn above(targets: impl Iterator<Item = RawFd>) -> FdLayout {
        let max = targets.max().unwrap_or(2).max(2);
        FdLayout {
            spec: max + 1,
            status: max + 2,
            netns: max + 3,
            view: max + 4,
            exit_word: max + 5,
            cgroup_gate: max + 6,
            high: max + 7,
        }
    }

    /// Every descriptor besides 0-2 and where it goes in the child: the caller's, the
    /// status pipe, the namespace and the view when there are.
    fn placements(
        &self,
        passed: &[(OwnedFd, RawFd)],
        status: &OwnedFd,
        made: &Resources,
    ) -> Vec<(RawFd, RawFd)> {
        let mut fds: Vec<(RawFd, RawFd)> =
            passed.iter().map(|(fd, t)| (fd.as_raw_fd(), *t)).collect();
        fds.push((status.as_raw_fd(), self.status));
        let netns = made
            .proxy
            .as_ref()
            .map(|p| &p.netns)
            .or(made.netns.as_ref());
        if let Some(netns) = netns {
            fds.push((netns.as_raw_fd(), self.netns));
        }
        if let Some(view) = &made.view {
            fds.push((view.fd().as_raw_fd(), self.view));
        }
        if let Some((_, write)) = &made.exit_word {
            fds.push((write.as_raw_fd(), self.exit_word));
        }
        if let Some((read, _)) = &made.cgroup_gate {
            fds.push((read.as_raw_fd(), self.cgroup_gate));
        }
        fds
    }
}

/// The child's environment: the policy's (`base`), the command's variables on top, and
/// in proxy mode the broker's address in place of any proxy setting of the server
/// (whose credentials stay with the broker): nothing bypasses it.
fn child_env(
    mut env: Vec<(OsString, OsString)>,
    overrides: &[(OsString, OsString)],
    proxy: Option<&[(String, String)]>,
) -> Vec<(OsString, OsString)> {
    for (k, v) in overrides {
        env.retain(|(ek, _)| ek != k);
        env.push((k.clone(), v.clone()));
    }
    if let Some(proxy) = proxy {
        env.retain(|(k, _)| {
            !k.to_str().is_some_and(|k| {
                matches!(
                    k.to_ascii_uppercase().as_str(),
                    "HTTP_PROXY" | "HTTPS_PROXY" | "ALL_PROXY" | "NO_PROXY"
                )
            })
        });
        env.extend(proxy.iter().map(|(k, v)| (k.into(), v.into())));
    }
    env
}

/// Start the launcher by `route` with `fds` placed; returns its pid. The zygote's
/// failure falls back to a re-exec — except a timeout: it may have forked the job.
fn start_launcher(
    rt: &Runtime,
    route: Route,
    spec: LaunchSpec,
    fds: &[(RawFd, RawFd)],
    layout: &FdLayout,
    stdio: [Option<OwnedFd>; 3],
) -> std::io::Result<u32> {
    if route == Route::Zygote {
        let mut all = fds.to_vec();
        for (target, io) in stdio.iter().enumerate() {
            // Inherit: this process's own descriptor.
            let target = target as RawFd;
            all.push((io.as_ref().map_or(target, |fd| fd.as_raw_fd()), target));
        }
        let (slot, exe) = (rt.zygote(), &rt.config().launcher_exe);
        match super::zygote::spawn(slot, exe, rt.spawner(), &spec, &all) {
            Ok(pid) => return Ok(pid),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return Err(e),
            Err(e) => tracing::warn!(
                error = %e,
                "the spawn helper could not start a job; re-executing the launcher"
            ),
        }
    }
    match route {
        Route::Fork => fork_launcher(spec, fds, layout.high, stdio),
        _ => exec_launcher(rt, spec, fds, (layout.spec, layout.high), stdio),
    }
}

/// What the launcher `pid` reported on the status pipe (`status_r`) once its target
/// exec'd, or why the job did not start: the cgroup that could not be made (`unmade`),
/// or the launcher's own error (it is reaped then).
fn launcher_status(
    status_r: OwnedFd,
    pid: u32,
    unmade: Option<LaunchError>,
) -> Result<Status, LaunchError> {
    let mut report = String::new();
    let _ = std::fs::File::from(status_r).read_to_string(&mut report);
    let mut status = read_status(&report, pid);
    let failed = unmade.or_else(|| status.error.take().map(LaunchError::Launcher));
    if let Some(e) = failed {
        super::child::reap_blocking(pid);
        return Err(e);
    }
    Ok(status)
}

/// What the launcher said on the status pipe before it exec'd (EOF) or gave up.
#[derive(Debug, PartialEq, Eq)]
struct Status {
    /// The job's process group (in a PID namespace: the init's), else the pid.
    pgid: u32,
    /// Why setup failed (a `SetupError`'s words); `None`: the target runs.
    error: Option<String>,
    /// What a best-effort policy could not enforce.
    unenforced: Vec<String>,
    /// The launcher is the init of a PID namespace its parent made (`pidns::INIT_LINE`).
    init: bool,
}

/// Read the launcher's `report` for the process `pid`.
fn read_status(report: &str, pid: u32) -> Status {
    let mut status = Status {
        pgid: pid,
        error: None,
        unenforced: Vec::new(),
        init: false,
    };
    for line in report.lines() {
        if line == crate::sandbox::launcher::pidns::INIT_LINE.trim_end() {
            status.init = true;
        }
        if let Some(n) = line.strip_prefix(crate::sandbox::launcher::pidns::PGID_PREFIX) {
            status.pgid = n.trim().parse().unwrap_or(pid);
        }
        if let Some(msg) = line.strip_prefix("error: ") {
            status.error = Some(msg.to_string());
            return status;
        }
        if let Some(note) = line.strip_prefix("unenforced: ") {
            status.unenforced.push(note.to_string());
        }
    }
    status
}

/// The route `configured` comes to in a process with one thread or more: a fork only
/// while it has one.
fn choose_route(configured: Route, single_threaded: bool) -> Route {
    match configured {
        Route::Fork if !single_threaded => Route::Reexec,
        route => route,
    }
}

/// What a standard stream of the child is connected to.
#[derive(Debug)]
pub enum Io {
    /// /dev/null.
    Null,
    /// A new pipe; this side's end is `SandboxedChild::{stdin, stdout, stderr}`.
    Piped,
    /// This process's own descriptor (the default).
    Inherit,
    /// A descriptor of the caller's (e.g. one end of a pipe it made).
    Fd(OwnedFd),
}

impl<T: Into<OwnedFd>> From<T> for Io {
    fn from(fd: T) -> Io {
        Io::Fd(fd.into())
    }
}

#[derive(Clone, Copy)]
enum Direction {
    ToChild,
    FromChild,
}

/// The child's end of a standard stream (`None`: inherit) and, for a pipe, ours.
fn child_end(
    io: Option<Io>,
    dir: Direction,
) -> std::io::Result<(Option<OwnedFd>, Option<OwnedFd>)> {
    Ok(match io.unwrap_or(Io::Inherit) {
        Io::Inherit => (None, None),
        Io::Fd(fd) => (Some(fd), None),
        Io::Null => {
            let file = std::fs::OpenOptions::new()
                .read(matches!(dir, Direction::ToChild))
                .write(matches!(dir, Direction::FromChild))
                .open("/dev/null")?;
            (Some(file.into()), None)
        }
        Io::Piped => {
            let (r, w) = std::io::pipe()?;
            match dir {
                Direction::ToChild => (Some(r.into()), Some(w.into())),
                Direction::FromChild => (Some(w.into()), Some(r.into())),
            }
        }
    })
}

/// Copies of `fds`' sources above every target (`high`), each with its target, so that
/// the `dup2`s in the child cannot clobber one another; close-on-exec, dropped once the
/// child has them.
fn moved_above(fds: &[(RawFd, RawFd)], high: RawFd) -> std::io::Result<Vec<(OwnedFd, RawFd)>> {
    fds.iter()
        .map(|&(fd, target)| Ok((dup_above(fd, high)?, target)))
        .collect()
}

/// Start the launcher in a fork of this single-threaded process (`run`), with `fds` and
/// the standard streams (`stdio`, `None`: ours) placed first. Returns the pid.
fn fork_launcher(
    spec: LaunchSpec,
    fds: &[(RawFd, RawFd)],
    high: RawFd,
    stdio: [Option<OwnedFd>; 3],
) -> std::io::Result<u32> {
    let mut all = fds.to_vec();
    for (target, io) in stdio.iter().enumerate() {
        if let Some(fd) = io {
            all.push((fd.as_raw_fd(), target as RawFd));
        }
    }
    let moves = moved_above(&all, high)?;
    let pairs: Vec<(RawFd, RawFd)> = moves.iter().map(|(fd, t)| (fd.as_raw_fd(), *t)).collect();
    let init = spec.exit_word_fd.is_some();
    fork_in_pid_namespace(init, || {
        for &(src, target) in &pairs {
            // SAFETY: dup2 of descriptors that stay open in the parent until after the
            // fork; a failure ends this child before it runs anything.
            if unsafe { libc::dup2(src, target) } < 0 {
                // SAFETY: _exit in a forked child.
                unsafe { libc::_exit(crate::sandbox::launcher::error::SETUP_FAILED_EXIT) }
            }
        }
        standard_signal_state();
        run_spec(&spec, None)
    })
}

/// Start the launcher by re-executing this binary with the spec on a memfd at
/// `spec_target`; `fds` are placed at their targets first. Returns the pid.
fn exec_launcher(
    rt: &Runtime,
    spec: LaunchSpec,
    fds: &[(RawFd, RawFd)],
    (spec_target, high): (RawFd, RawFd),
    stdio: [Option<OwnedFd>; 3],
) -> std::io::Result<u32> {
    let spec_fd = spec_memfd(&spec)?;
    let mut moves = moved_above(fds, high)?;
    moves.push((dup_above(spec_fd.as_raw_fd(), high)?, spec_target));
    let pairs: Vec<(RawFd, RawFd)> = moves.iter().map(|(fd, t)| (fd.as_raw_fd(), *t)).collect();
    let mut cmd = std::process::Command::new(&rt.config().launcher_exe);
    cmd.arg(LAUNCHER_ARG)
        .arg(spec_target.to_string())
        .env_clear();
    let [stdin, stdout, stderr] = stdio;
    if let Some(fd) = stdin {
        cmd.stdin(Stdio::from(fd));
    }
    if let Some(fd) = stdout {
        cmd.stdout(Stdio::from(fd));
    }
    if let Some(fd) = stderr {
        cmd.stderr(Stdio::from(fd));
    }
    // SAFETY: the closure calls dup2, which is async-signal-safe, on descriptors that
    // stay open until after spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            for &(src, target) in &pairs {
                if libc::dup2(src, target) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = rt.spawner().spawn(cmd)?;
    drop(moves);
    drop(spec_fd);
    Ok(child.id())
}

/// Fork this single-threaded process and run `child` in the child, made pid 1 of a new
/// PID namespace when `init` (where the kernel allows; else in ours, and the launcher
/// makes the namespace itself); returns the child's pid. Our own namespace for children
/// is restored after the fork: a process cannot start threads while it differs from the
/// one it lives in. A plain fork, not `std::process::Command`: its spawn returns only
/// once the child has exec'd or ended, and the launcher does neither before its target
/// execs — which `run` must be free to help on its way meanwhile (the cgroup gate).
fn fork_in_pid_namespace(init: bool, child: impl FnOnce()) -> std::io::Result<u32> {
    let ours = match init {
        true => std::fs::File::open("/proc/self/ns/pid").ok(),
        false => None,
    };
    // SAFETY: unshare(2) with a constant flag: only children made from here on.
    let unshared = ours.is_some() && unsafe { libc::unshare(libc::CLONE_NEWPID) } == 0;
    // SAFETY: fork in a single-threaded process (`choose_route` takes this route only
    // then): no lock can be held by a thread that vanished in the fork, so the child
    // may allocate; `child` execs or exits (were it to return, the child ends here).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        child();
        // SAFETY: _exit in a forked child.
        unsafe { libc::_exit(crate::sandbox::launcher::error::SETUP_FAILED_EXIT) }
    }
    let forked = match pid {
        -1 => Err(std::io::Error::last_os_error()),
        pid => Ok(pid as u32),
    };
    if let (true, Some(ns)) = (unshared, &ours) {
        // SAFETY: setns(2) back to the namespace we live in, with a descriptor we own.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWPID) } != 0 {
            let e = std::io::Error::last_os_error();
            tracing::warn!(error = %e, "could not restore the PID namespace for children");
        }
    }
    forked
}

/// In a forked child, the signal state a spawned process starts with (as
/// `std::process::Command` gives it): nothing blocked, `SIGPIPE` at its default (Rust's
/// runtime ignores it).
fn standard_signal_state() {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset; sigprocmask and signal
    // on this single-threaded child with valid arguments.
    unsafe {
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Whether this process has exactly one thread (field 20 of /proc/self/stat).
fn single_threaded() -> bool {
    let Ok(stat) = crate::sandbox::parent::cgroup::read_kernel_file(Path::new("/proc/self/stat"))
    else {
        return false;
    };
    // The command name (field 2) may contain spaces; count fields after its `)`.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    after.split_whitespace().nth(17) == Some("1")
}

fn pipe_cloexec() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn dup_above(fd: RawFd, min: RawFd) -> std::io::Result<OwnedFd> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) returns a fresh descriptor or -1.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) };
    if new < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `new` is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// The spec as JSON in an anonymous file, read by the launcher from offset 0.
fn spec_memfd(spec: &LaunchSpec) -> std::io::Result<OwnedFd> {
    bytes_memfd(&serde_json::to_vec(spec).map_err(std::io::Error::other)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs.iter().map(|(k, v)| (k.into(), v.into())).collect()
    }

    /// The launcher's own descriptors sit just above the caller's highest target, each
    /// at its own number, and sources are moved above them all.
    #[test]
    fn the_layout_sits_above_the_callers_descriptors() {
        let none = FdLayout::above(std::iter::empty());
        assert_eq!(
            (
                none.spec,
                none.status,
                none.netns,
                none.view,
                none.exit_word,
                none.cgroup_gate,
                none.high
            ),
            (3, 4, 5, 6, 7, 8, 9)
        );
        let some = FdLayout::above([3, 9, 5].into_iter());
        assert_eq!(some.spec, 10);
        let all = [
            some.spec,
            some.status,
            some.netns,
            some.view,
            some.exit_word,
            some.cgroup_gate,
        ];
        assert!(all.iter().all(|&fd| fd > 9 && fd < some.high));
        let distinct: std::collections::BTreeSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), 6);
    }

    /// The status pipe, a namespace and a view made ahead get their places; the caller's
    /// descriptors keep theirs.
    #[test]
    fn placements_put_each_descriptor_at_its_target() {
        let layout = FdLayout::above([7].into_iter());
        let passed = vec![(OwnedFd::from(std::fs::File::open("/dev/null").unwrap()), 7)];
        let status = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let netns = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let made = Resources {
            cgroup: None,
            cgroup_gate: Some(pipe_cloexec().unwrap()),
            proxy: None,
            netns: Some(netns),
            view: None,
            unenforced: Vec::new(),
            exit_word: Some(pipe_cloexec().unwrap()),
        };
        let fds = layout.placements(&passed, &status, &made);
        let targets: Vec<RawFd> = fds.iter().map(|&(_, t)| t).collect();
        assert_eq!(
            targets,
            [
                7,
                layout.status,
                layout.netns,
                layout.exit_word,
                layout.cgroup_gate
            ]
        );
        assert_eq!(fds[1].0, status.as_raw_fd());
    }

    /// The command's variables replace the policy's; in proxy mode the broker's address
    /// replaces every proxy setting of the server, whatever its case.
    #[test]
    fn the_environment_takes_overrides_and_the_brokers_address() {
        let base = os(&[
            ("PATH", "/usr/bin"),
            ("https_proxy", "http://server:3128"),
            ("A", "1"),
        ]);
        let env = child_env(base.clone(), &os(&[("A", "2")]), None);
        assert!(
            env.contains(&("A".into(), "2".into())) && !env.contains(&("A".into(), "1".into()))
        );
        assert!(env.contains(&("https_proxy".into(), "http://server:3128".into())));
        let broker = [("HTTPS_PROXY".to_string(), "http://127.0.0.1:9".to_string())];
        let env = child_env(base, &[], Some(&broker));
        assert!(!env.iter().any(|(k, _)| k == "https_proxy"), "{env:?}");
        assert!(env.contains(&("HTTPS_PROXY".into(), "http://127.0.0.1:9".into())));
        assert!(env.contains(&("PATH".into(), "/usr/bin".into())));
    }

    /// A fork only in a single-threaded process; the other routes as configured.
    #[test]
    fn the_route_is_the_configured_one_except_a_fork_with_threads() {
        assert_eq!(choose_route(Route::Fork, true), Route::Fork);
        assert_eq!(choose_route(Route::Fork, false), Route::Reexec);
        for threads in [true, false] {
            assert_eq!(choose_route(Route::Zygote, threads), Route::Zygote);
            assert_eq!(choose_route(Route::Reexec, threads), Route::Reexec);
        }
    }

    /// The status pipe: the process group, notes, and an error that ends the reading.
    #[test]
    fn the_status_report_is_read_line_by_line() {
        let ok = read_status("pgid: 41\nunenforced: cgroup limits (x)\n", 40);
        assert_eq!(
            ok,
            Status {
                pgid: 41,
                error: None,
                unenforced: vec!["cgroup limits (x)".into()],
                init: false,
            }
        );
        assert!(read_status("pidns-init\n", 40).init);
        assert_eq!(read_status("pidns-init\n", 40).pgid, 40);
        assert_eq!(read_status("", 40).pgid, 40);
        assert_eq!(read_status("pgid: garbage\n", 40).pgid, 40);
        let failed = read_status("unenforced: a\nerror: landlock: no\nunenforced: b\n", 7);
        assert_eq!(failed.error.as_deref(), Some("landlock: no"));
        assert_eq!(failed.unenforced, ["a"]);
    }
}
