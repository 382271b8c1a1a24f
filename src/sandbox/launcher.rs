//! The launcher: the parent side ([`SandboxCommand`]) and the hidden launcher mode
//! ([`launcher_main`]) that applies the sandbox to its own single thread and execs.
//!
//! INTERFACE STUB written by the lead so other subsystems compile: `spawn` below runs
//! the command WITHOUT a sandbox. The sandbox work replaces the bodies (keep the
//! public signatures; extending them is fine).

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::process::{ChildStderr, ChildStdin, ChildStdout, Stdio};
use std::sync::Arc;
use std::time::Duration;

use super::policy::ResolvedPolicy;

/// argv[1] that selects launcher mode.
pub const LAUNCHER_ARG: &str = "__sandbox-launch";

pub fn is_launcher_invocation() -> bool {
    std::env::args_os().nth(1).is_some_and(|a| a == LAUNCHER_ARG)
}

/// Launcher mode: apply the sandbox, exec the target. Never returns.
pub fn launcher_main() -> ! {
    eprintln!("sandbox setup failed: launcher not built yet");
    std::process::exit(127)
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("could not start {program:?}: {source}")]
    Spawn { program: OsString, source: std::io::Error },
    /// The launcher reported a failure before exec (message in words).
    #[error("sandbox setup failed: {0}")]
    Setup(String),
}

/// Builder for one sandboxed process, like `std::process::Command`.
pub struct SandboxCommand {
    policy: Arc<ResolvedPolicy>,
    program: OsString,
    args: Vec<OsString>,
    cwd: Option<PathBuf>,
    env: Vec<(OsString, OsString)>,
    fds: Vec<(OwnedFd, RawFd)>,
    stdin: Option<Stdio>,
    stdout: Option<Stdio>,
    stderr: Option<Stdio>,
    enforce_wall_time: bool,
}

impl SandboxCommand {
    pub fn new(policy: Arc<ResolvedPolicy>, program: impl Into<OsString>) -> Self {
        SandboxCommand {
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
    pub fn stdin(&mut self, s: Stdio) -> &mut Self {
        self.stdin = Some(s);
        self
    }
    pub fn stdout(&mut self, s: Stdio) -> &mut Self {
        self.stdout = Some(s);
        self
    }
    pub fn stderr(&mut self, s: Stdio) -> &mut Self {
        self.stderr = Some(s);
        self
    }
    /// Whether `wait` kills the process group when the policy's wall-time limit passes
    /// (true by default; a long-lived REPL worker turns it off).
    pub fn enforce_wall_time(&mut self, on: bool) -> &mut Self {
        self.enforce_wall_time = on;
        self
    }

    /// Start the process. Returns once the target has been exec'd (or the launcher
    /// reported why it could not be).
    pub fn spawn(self) -> Result<SandboxedChild, LaunchError> {
        let _ = (&self.policy, self.enforce_wall_time);
        let mut cmd = std::process::Command::new(&self.program);
        // STUB (repl helper): own process group + pass_fd, so the REPL works before the
        // real launcher lands. Only async-signal-safe calls between fork and exec.
        let fds: Vec<(RawFd, RawFd)> = self.fds.iter().map(|(fd, t)| (fd.as_raw_fd(), *t)).collect();
        // SAFETY: setpgid, fcntl and dup2 are async-signal-safe; no allocation happens.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || {
                if libc::setpgid(0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let mut moved = [0 as RawFd; 16];
                for (i, (fd, _)) in fds.iter().enumerate().take(16) {
                    moved[i] = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 64);
                }
                for (i, (_, target)) in fds.iter().enumerate().take(16) {
                    if libc::dup2(moved[i], *target) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        cmd.args(&self.args).envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        if let Some(s) = self.stdin {
            cmd.stdin(s);
        }
        if let Some(s) = self.stdout {
            cmd.stdout(s);
        }
        if let Some(s) = self.stderr {
            cmd.stderr(s);
        }
        let mut child = cmd
            .spawn()
            .map_err(|source| LaunchError::Spawn { program: self.program.clone(), source })?;
        Ok(SandboxedChild {
            pid: child.id(),
            stdin: child.stdin.take(),
            stdout: child.stdout.take(),
            stderr: child.stderr.take(),
            child,
        })
    }
}

/// A running sandboxed process; it leads its own process group (pgid == pid).
pub struct SandboxedChild {
    pub pid: u32,
    pub stdin: Option<ChildStdin>,
    pub stdout: Option<ChildStdout>,
    pub stderr: Option<ChildStderr>,
    child: std::process::Child,
}

impl SandboxedChild {
    /// Send `signal` to the whole process group (and every process of its cgroup).
    pub fn signal_group(&self, signal: i32) -> std::io::Result<()> {
        // SAFETY: plain syscall (STUB: process group only, no cgroup).
        if unsafe { libc::killpg(self.pid as libc::pid_t, signal) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
    /// SIGKILL everything the child started.
    pub fn kill_all(&self) {
        let _ = self.signal_group(libc::SIGKILL);
    }
    /// Wait for the process to end (async; never blocks the runtime) and report how.
    pub async fn wait(mut self) -> ExitReport {
        // STUB: blocking wait on a helper thread.
        let status = tokio::task::spawn_blocking(move || self.child.wait()).await;
        let termination = match status {
            Ok(Ok(st)) => {
                use std::os::unix::process::ExitStatusExt;
                match (st.code(), st.signal()) {
                    (Some(code), _) => Termination::Exited(code),
                    (None, Some(sig)) => Termination::Signaled(
                        match sig {
                            libc::SIGSEGV => "SIGSEGV",
                            libc::SIGKILL => "SIGKILL",
                            libc::SIGABRT => "SIGABRT",
                            libc::SIGTERM => "SIGTERM",
                            libc::SIGINT => "SIGINT",
                            libc::SIGBUS => "SIGBUS",
                            libc::SIGXCPU => "SIGXCPU",
                            _ => "a signal",
                        }
                        .to_string(),
                    ),
                    _ => Termination::Unknown,
                }
            }
            _ => Termination::Unknown,
        };
        ExitReport { termination, ..ExitReport::default() }
    }
}

/// How a sandboxed process ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Termination {
    Exited(i32),
    /// Killed by a signal (e.g. "SIGKILL").
    Signaled(String),
    #[default]
    Unknown,
}

/// The limit that ended a process, if one did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitHit {
    Memory,
    Cpu,
    WallTime,
    FileSize,
    Processes,
}

/// Report of one finished process: what `run --json` prints.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ExitReport {
    pub termination: Termination,
    pub wall: Duration,
    pub user_cpu: Duration,
    pub system_cpu: Duration,
    pub peak_rss_bytes: u64,
    pub limit: Option<LimitHit>,
}
