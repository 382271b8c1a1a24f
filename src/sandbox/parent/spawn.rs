//! The spawn side: [`SandboxCommand`] builds a [`LaunchSpec`], starts the launcher by the
//! route its [`Runtime`] is configured for (zygote, re-exec with the spec on a memfd, or
//! a plain fork), and reads the status pipe until
//! the launcher has exec'd the target (EOF) or reported why it could not (words).
//!
//! Between fork and exec the parent does only async-signal-safe work: `dup2` of the
//! descriptors the child keeps. Everything else happens in the single-threaded launcher.

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{ChildStderr, ChildStdin, ChildStdout, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::child::SandboxedChild;
use super::error::LaunchError;
use super::memfd::bytes_memfd;
use super::proxy::{ProxyError, ProxyGuard, ProxyNetwork, ProxyRequest};
use super::runtime::{Route, Runtime};
use crate::sandbox::launcher::error::SetupError;
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
    pub fn spawn(self) -> Result<SandboxedChild, LaunchError> {
        let spawn_err = |source: std::io::Error| LaunchError::Spawn {
            program: self.program.clone(),
            source,
        };
        if let Some(&(_, t)) = self.fds.iter().find(|(_, t)| *t < 3) {
            return Err(SetupError::ReservedFd { target: t }.into());
        }
        let policy = &self.policy;
        let limits = &policy.limits;
        let mut unenforced = Vec::new();
        let rt = &self.runtime;
        let route = choose_route(rt.config().route);
        // The server's jobs take a cgroup and a network namespace made ahead of need;
        // `run` (one job per process) makes its own.
        let cgroup = if limits.memory_bytes.is_some() || limits.processes.is_some() {
            let kind = (limits.memory_bytes, limits.processes);
            match rt
                .take_cgroup(&kind)
                .map_or_else(|| rt.make_cgroup(&kind), Ok)
            {
                Ok(cg) => Some(cg),
                Err(e) => {
                    // Without a cgroup, RLIMIT_AS caps memory and RLIMIT_NPROC caps processes
                    // — but RLIMIT_NPROC never binds root, so root must fail closed.
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
                    None
                }
            }
        } else {
            None
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
        let pooled_netns =
            crate::sandbox::launcher::private_network(policy).and_then(|lo| rt.take_netns(lo));
        let prepared_view = crate::sandbox::launcher::isolation::mount_view_of(policy)
            .filter(|_| self.view_made_ahead)
            .and_then(|kind| rt.take_view(&kind));
        let max_target = self.fds.iter().map(|(_, t)| *t).max().unwrap_or(2);
        let (spec_target, status_target) = (max_target + 1, max_target + 2);
        let (netns_target, view_target) = (max_target + 3, max_target + 4);
        let high = view_target + 1;

        let (status_r, status_w) = pipe_cloexec().map_err(spawn_err)?;
        let mut env = policy.child_env(std::env::vars_os());
        for (k, v) in &self.env {
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v.clone()));
        }
        if let Some(proxy) = &proxy {
            // The broker's address replaces any proxy setting of the server (whose
            // credentials stay with the broker); nothing bypasses it.
            env.retain(|(k, _)| {
                !k.to_str().is_some_and(|k| {
                    matches!(
                        k.to_ascii_uppercase().as_str(),
                        "HTTP_PROXY" | "HTTPS_PROXY" | "ALL_PROXY" | "NO_PROXY"
                    )
                })
            });
            env.extend(proxy.env.iter().map(|(k, v)| (k.into(), v.into())));
        }
        let mut argv = vec![os_bytes(&self.program)];
        argv.extend(self.args.iter().map(|a| os_bytes(a)));
        let spec = LaunchSpec {
            policy: (**policy).clone(),
            argv,
            env: env
                .iter()
                .map(|(k, v)| (os_bytes(k), os_bytes(v)))
                .collect(),
            cwd: self.cwd.clone().or_else(|| Some(policy.workspace.clone())),
            keep_fds: self.fds.iter().map(|(_, t)| *t).collect(),
            status_fd: status_target,
            cgroup_procs: cgroup.as_ref().map(|c| c.procs_files()).unwrap_or_default(),
            memory_cgroup: cgroup.as_ref().is_some_and(|c| c.has_memory_limit()),
            netns_fd: (proxy.is_some() || pooled_netns.is_some()).then_some(netns_target),
            proxy_port: proxy.as_ref().map(|p| p.port),
            view_fd: prepared_view.as_ref().map(|_| view_target),
            view_mounts_proc: prepared_view.as_ref().is_some_and(|v| v.mounts_proc()),
            parent_pid: std::process::id(),
            inherited_open_files: rt.config().inherited_open_files,
        };
        let [stdin, stdout, stderr] = [
            (self.stdin, Direction::ToChild),
            (self.stdout, Direction::FromChild),
            (self.stderr, Direction::FromChild),
        ]
        .map(|(io, dir)| child_end(io, dir));
        let (stdin, stdin_ours) = stdin.map_err(spawn_err)?;
        let (stdout, stdout_ours) = stdout.map_err(spawn_err)?;
        let (stderr, stderr_ours) = stderr.map_err(spawn_err)?;
        // Where each descriptor besides 0-2 goes in the child.
        let mut fds: Vec<(RawFd, RawFd)> = self
            .fds
            .iter()
            .map(|(fd, t)| (fd.as_raw_fd(), *t))
            .collect();
        fds.push((status_w.as_raw_fd(), status_target));
        if let Some(netns) = proxy.as_ref().map(|p| &p.netns).or(pooled_netns.as_ref()) {
            fds.push((netns.as_raw_fd(), netns_target));
        }
        if let Some(view) = &prepared_view {
            fds.push((view.fd().as_raw_fd(), view_target));
        }
        let stdio = [stdin, stdout, stderr];
        let started = Instant::now();
        let zygote_pid = match route {
            Route::Zygote => {
                let mut all = fds.clone();
                for (target, io) in stdio.iter().enumerate() {
                    // Inherit: this process's own descriptor.
                    let target = target as RawFd;
                    all.push((io.as_ref().map_or(target, |fd| fd.as_raw_fd()), target));
                }
                match super::zygote::spawn(
                    rt.zygote(),
                    &rt.config().launcher_exe,
                    rt.spawner(),
                    &spec,
                    &all,
                ) {
                    Ok(pid) => Some(pid),
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return Err(spawn_err(e)),
                    Err(e) => {
                        tracing::warn!(
                            error = %e,
                            "the spawn helper could not start a job; re-executing the launcher"
                        );
                        None
                    }
                }
            }
            Route::Fork | Route::Reexec => None,
        };
        let pid = match zygote_pid {
            Some(pid) => pid,
            None => exec_launcher(
                rt,
                spec,
                route == Route::Fork,
                &fds,
                (spec_target, high),
                stdio,
            )
            .map_err(spawn_err)?,
        };
        drop(status_w);
        drop(pooled_netns);
        drop(prepared_view);
        let mut report = String::new();
        let mut status_r = std::fs::File::from(status_r);
        let _ = status_r.read_to_string(&mut report);
        let mut pgid = pid;
        for line in report.lines() {
            if let Some(n) = line.strip_prefix(crate::sandbox::launcher::pidns::PGID_PREFIX) {
                pgid = n.trim().parse().unwrap_or(pid);
            }
            if let Some(msg) = line.strip_prefix("error: ") {
                super::child::reap_blocking(pid);
                return Err(LaunchError::Launcher(msg.to_string()));
            }
            if let Some(note) = line.strip_prefix("unenforced: ") {
                unenforced.push(note.to_string());
            }
        }
        let wall_limit = if self.enforce_wall_time {
            limits.wall_seconds.map(Duration::from_secs)
        } else {
            None
        };
        let mut child = SandboxedChild::new(
            pid,
            pgid,
            (
                stdin_ours.map(ChildStdin::from),
                stdout_ours.map(ChildStdout::from),
                stderr_ours.map(ChildStderr::from),
            ),
            cgroup,
            started,
            wall_limit,
            limits.clone(),
            unenforced,
        )
        .map_err(spawn_err)?;
        if let Some(proxy) = proxy {
            if self.proxy_trusts_target {
                // The target has been exec'd (the status pipe reached EOF): in a PID
                // namespace it is the init's only child so far.
                proxy.job.target_started(child.main_pid());
            }
            child.set_proxy(ProxyGuard::new(proxy.denials, proxy.job));
        }
        Ok(child)
    }
}

/// The route `configured` comes to in this process: a fork only while it has one thread.
fn choose_route(configured: Route) -> Route {
    match configured {
        Route::Fork if !single_threaded() => Route::Reexec,
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

/// Start the launcher by `fork` (in-process, `in_fork`) or by re-executing this binary
/// with the spec on a memfd at `spec_target`; `fds` are placed at their targets first.
/// Returns the pid.
fn exec_launcher(
    rt: &Runtime,
    spec: LaunchSpec,
    in_fork: bool,
    fds: &[(RawFd, RawFd)],
    (spec_target, high): (RawFd, RawFd),
    stdio: [Option<OwnedFd>; 3],
) -> std::io::Result<u32> {
    let spec_fd = match in_fork {
        true => None,
        false => Some(spec_memfd(&spec)?),
    };
    // Move every source above all targets, so the dup2s in the child cannot clobber
    // one another; these copies are close-on-exec and dropped after spawn.
    let mut moves: Vec<(OwnedFd, RawFd)> = Vec::new();
    for &(fd, target) in fds {
        moves.push((dup_above(fd, high)?, target));
    }
    if let Some(spec_fd) = &spec_fd {
        moves.push((dup_above(spec_fd.as_raw_fd(), high)?, spec_target));
    }
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
    let in_fork_spec = in_fork.then_some(spec);
    // SAFETY: the closure calls dup2, which is async-signal-safe, on descriptors that
    // stay open until after spawn returns. Only when this process has a single thread
    // (so no lock can be held by a thread that vanished in the fork) does it go on to
    // apply the sandbox and exec in the child, which allocates.
    unsafe {
        cmd.pre_exec(move || {
            for &(src, target) in &pairs {
                if libc::dup2(src, target) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(spec) = &in_fork_spec {
                run_spec(spec, None);
            }
            Ok(())
        });
    }
    let child = match in_fork {
        true => cmd.spawn(),
        false => rt.spawner().spawn(cmd),
    }?;
    drop(moves);
    drop(spec_fd);
    Ok(child.id())
}

/// Whether this process has exactly one thread (field 20 of /proc/self/stat).
fn single_threaded() -> bool {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
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
