//! A running sandboxed process: signalling its process group and cgroup, and waiting
//! for it — async through a pidfd registered with tokio (never blocks the runtime) or
//! blocking with `poll` — then reaping it with `wait4` for its rusage and working out
//! which limit, if any, ended it. The rest of its process group and cgroup is killed
//! once the main process has ended.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::{ChildStderr, ChildStdin, ChildStdout};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;

use super::isolation::JobCgroupHandle;
use crate::sandbox::launcher::pidns::ExitWord;
use crate::sandbox::policy::resolve::Limits;

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

/// A running sandboxed process: `pid` is the server's child (the launcher acting as
/// the job's supervisor, or the target itself), `pgid` the job's process group (see
/// `pidns`; equal to `pid` without a PID namespace).
pub struct SandboxedChild {
    pub pid: u32,
    pub pgid: u32,
    pub stdin: Option<ChildStdin>,
    pub stdout: Option<ChildStdout>,
    pub stderr: Option<ChildStderr>,
    pidfd: Option<OwnedFd>,
    killer: GroupKiller,
    started: Instant,
    wall_limit: Option<Duration>,
    limits: Limits,
    unenforced: Vec<String>,
    reaped: bool,
    /// The job's network broker (proxy mode); stops when this handle is dropped.
    proxy: Option<super::proxy::ProxyGuard>,
    /// `pid` is the init of the job's PID namespace (see `launcher::pidns`) ...
    init: bool,
    /// ... and this the read end of its exit-word pipe (the target's wait status).
    exit_word: Option<OwnedFd>,
}

impl SandboxedChild {
    #[expect(
        clippy::too_many_arguments,
        reason = "the parts of one finished child, each named at its one call site"
    )]
    pub(crate) fn new(
        pid: u32,
        pgid: u32,
        (stdin, stdout, stderr): (
            Option<std::process::ChildStdin>,
            Option<std::process::ChildStdout>,
            Option<std::process::ChildStderr>,
        ),
        cgroup: Option<JobCgroupHandle>,
        started: Instant,
        wall_limit: Option<Duration>,
        limits: Limits,
        unenforced: Vec<String>,
        exit_word: Option<OwnedFd>,
    ) -> std::io::Result<SandboxedChild> {
        // Our own unreaped child: its pid cannot have been reused.
        let pidfd = pidfd_open(pid).ok();
        Ok(SandboxedChild {
            pid,
            pgid,
            stdin,
            stdout,
            stderr,
            pidfd,
            killer: GroupKiller {
                pgid,
                cgroup: cgroup.map(Arc::new),
                done: Arc::new(AtomicBool::new(false)),
            },
            started,
            wall_limit,
            limits,
            unenforced,
            reaped: false,
            proxy: None,
            init: exit_word.is_some(),
            exit_word,
        })
    }

    pub(crate) fn set_proxy(&mut self, guard: super::proxy::ProxyGuard) {
        self.proxy = Some(guard);
    }

    /// What the job's network broker refused so far, in words (proxy mode; shared, so
    /// it can be read after `wait` consumed the child).
    pub fn network_denials(&self) -> Option<super::proxy::Denials> {
        self.proxy.as_ref().map(|p| p.denials.clone())
    }

    /// The pid (as the server sees it) of the process that runs the target: `pid` itself,
    /// or in a PID namespace the init's child (found in /proc: for occasional use, such
    /// as reporting the target's memory).
    pub fn main_pid(&self) -> u32 {
        if self.pgid == self.pid && !self.init {
            return self.pid;
        }
        // The init's children: the target (pid 2 of the namespace) and orphans it adopted.
        let init = self.pgid;
        if let Ok(children) = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
        {
            let target = children
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok())
                .find(|c| {
                    std::fs::read_to_string(format!("/proc/{c}/status"))
                        .ok()
                        .and_then(|status| {
                            let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
                            Some(line.split_whitespace().last()? == "2")
                        })
                        .unwrap_or(false)
                });
            if let Some(target) = target {
                return target;
            }
        }
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return self.pid;
        };
        let pgid = self.pgid.to_string();
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .find(|p| {
                let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
                let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
                let f: Vec<&str> = rest.split_whitespace().take(3).collect();
                f.len() == 3 && f[1] == pgid && f[2] == pgid
            })
            .unwrap_or(self.pid)
    }

    /// What the policy asked for but this kernel or build did not enforce
    /// (only ever non-empty where the policy allows best effort).
    pub fn unenforced(&self) -> &[String] {
        &self.unenforced
    }

    /// Send `signal` to the whole process group (and, for SIGKILL, every process of
    /// its cgroup).
    pub fn signal_group(&self, signal: i32) -> std::io::Result<()> {
        self.killer.signal(signal)
    }

    /// SIGKILL everything the child started.
    pub fn kill_all(&self) {
        self.killer.kill_all();
    }

    /// Memory the child's job cgroup holds now, for the whole process tree (pages shared
    /// copy-on-write counted once); `None` without a memory cgroup.
    pub fn cgroup_memory_bytes(&self) -> Option<u64> {
        self.killer.cgroup.as_deref()?.current_memory_bytes()
    }

    /// Send `signal` to the process that runs the target alone (not its group, not a
    /// PID namespace's supervisor or init: stopping or killing those would take the
    /// whole namespace). A no-op once reaped.
    pub fn signal_target(&self, signal: i32) -> std::io::Result<()> {
        if self.reaped || self.killer.done.load(Ordering::SeqCst) {
            return Ok(());
        }
        Pidfd::open(self.main_pid())?.signal(signal)
    }

    /// Forward the terminal's signals to this child's process group from now on (and
    /// any that arrived since `forwarding` was installed); see [`SignalForwarding`].
    pub fn forward_terminal_signals(&self, forwarding: &SignalForwarding) {
        let _ = forwarding;
        FORWARD_PGID.store(self.pgid as i32, Ordering::SeqCst);
        let pending = PENDING_SIGNAL.swap(0, Ordering::SeqCst);
        if pending > 0 {
            // SAFETY: kill(2) on our own child's process group.
            unsafe { libc::kill(-(self.pgid as i32), pending) };
        }
    }

    /// A cloneable handle that can signal the process group while another task owns
    /// the child in [`wait`](Self::wait) (cancel, interrupt). It goes inert once the
    /// child has been reaped, so a recycled process-group id is never signalled.
    pub fn killer(&self) -> GroupKiller {
        self.killer.clone()
    }

    /// A descriptor that becomes readable once the process has ended, registered with
    /// tokio (call inside a runtime): for a task that watches the process while another
    /// owns it. Reaping stays with [`wait`](Self::wait).
    pub fn exit_fd(&self) -> std::io::Result<AsyncFd<OwnedFd>> {
        let fd = match &self.pidfd {
            Some(fd) => fd.try_clone()?,
            None => pidfd_open(self.pid)?,
        };
        register_readable(fd)
    }

    /// Wait for the process to end (async; never blocks the runtime) and report how.
    /// Enforces the wall-time limit when asked to.
    pub async fn wait(mut self) -> ExitReport {
        let mut wall_hit = false;
        if self.init && self.pidfd.is_some() {
            match self.answer_on_the_word().await {
                Ok(report) => {
                    // `finish` killed the rest; the init ends with its namespace. Reaped,
                    // and its cgroup removed (when `self` drops), on a thread of its own.
                    let pid = self.pid;
                    drop(tokio::task::spawn_blocking(move || {
                        let _ = reap(pid, 0);
                        drop(self);
                    }));
                    return report;
                }
                Err(hit) => wall_hit = hit,
            }
        }
        let mut ended = false;
        if let Some(fd) = self.pidfd.take() {
            let registered = register_readable(fd);
            // Without a reactor for this fd, the blocking reap below (off the runtime) waits,
            // without the wall-time limit.
            if let Ok(afd) = registered {
                let readable = afd.readable();
                ended = match self.remaining_wall() {
                    Some(left) => {
                        if tokio::time::timeout(left, readable).await.is_err() {
                            wall_hit = true;
                            self.kill_all();
                            afd.readable().await.is_ok()
                        } else {
                            true
                        }
                    }
                    None => readable.await.is_ok(),
                };
            }
        }
        let pid = self.pid;
        // The pidfd said it has ended: reaped here, without a hop to a blocking thread
        // (a wake-up of another CPU on the way of every job's answer).
        if ended && let Some(r) = reap(pid, libc::WNOHANG) {
            return self.finish(Some(r), wall_hit);
        }
        match tokio::task::spawn_blocking(move || reap(pid, 0)).await {
            Ok(r) => self.finish(r, wall_hit),
            Err(_) => self.finish(None, wall_hit),
        }
    }

    /// A descriptor that becomes readable once the job's end can be taken: the init's
    /// exit word (or the init's own end, when it was killed) for a PID namespace's init,
    /// else the process's end (its pidfd). For a caller that polls it beside its own
    /// descriptors (`run`'s stderr) before [`wait_blocking`](Self::wait_blocking).
    pub fn end_fd(&self) -> Option<RawFd> {
        self.exit_word
            .as_ref()
            .filter(|_| self.init)
            .or(self.pidfd.as_ref())
            .map(AsRawFd::as_raw_fd)
    }

    /// Blocking variant of [`wait`](Self::wait). For a PID namespace's init the report
    /// comes from its exit word (see [`wait_blocking_before_exit`]); the init is reaped
    /// before this returns.
    ///
    /// [`wait_blocking_before_exit`]: Self::wait_blocking_before_exit
    pub fn wait_blocking(self) -> ExitReport {
        self.wait_blocking_then(InitEnd::Reap).0
    }

    /// [`wait_blocking`](Self::wait_blocking) for a process that exits right after it
    /// (`run`). The report is made when the init's exit word arrives (the target's
    /// status and resource use; the limit counters read then), and the job's cgroup is
    /// removed at once: only the target and its descendants join it (the init does not),
    /// and an rmdir succeeds only on a cgroup without a member, so its success proves
    /// that nothing of the job is left. Then the init is not waited for here: it ends by
    /// itself right after its word (the teardown of the job's namespaces, which it holds,
    /// comes with its exit), and is handed back as a [`LeftInit`] for the caller to reap
    /// once its own answer is out — not left to whoever inherits it, which need not reap
    /// (a container's `tail -f /dev/null` or `sleep infinity` as pid 1, a subreaper that
    /// waits for its own children only: one zombie per `run`). When something is left (a
    /// background process: EBUSY), or without a cgroup, everything is killed and the
    /// init reaped first, as `wait_blocking` does.
    pub fn wait_blocking_before_exit(self) -> (ExitReport, LeftInit) {
        let pid = self.pid;
        let (report, left) = self.wait_blocking_then(InitEnd::Leave);
        (
            report,
            LeftInit {
                pid: left.then_some(pid),
            },
        )
    }

    /// The report, and whether the init was left unreaped (`InitEnd::Leave`, the job
    /// proven gone).
    fn wait_blocking_then(mut self, init_end: InitEnd) -> (ExitReport, bool) {
        let deadline = self.remaining_wall().map(|left| Instant::now() + left);
        // The init's word (or its end), else the process's end when there is a wall-time
        // limit to enforce (without one the reap below simply blocks).
        let watched = match (self.init, deadline) {
            (false, None) => None,
            _ => self.end_fd(),
        };
        let mut wall_hit = false;
        if let Some(fd) = watched
            && !wait_readable(fd, deadline)
        {
            wall_hit = true;
            self.kill_all();
        }
        let word = match (&self.exit_word, wall_hit) {
            (Some(fd), false) if self.init => read_word(fd).ok().flatten(),
            _ => None,
        };
        if let Some(word) = word {
            return self.end_on_the_word(word, init_end);
        }
        let r = reap(self.pid, 0);
        (self.finish(r, wall_hit), false)
    }

    /// The job's end from the init's exit `word`: the report at once, then what is left
    /// of the job proven gone by its cgroup's removal, or killed (see
    /// [`wait_blocking_before_exit`](Self::wait_blocking_before_exit)).
    fn end_on_the_word(&mut self, word: ExitWord, init_end: InitEnd) -> (ExitReport, bool) {
        let report = self.report(word, self.started.elapsed(), false);
        let gone = (self.killer.cgroup.as_deref()).is_some_and(JobCgroupHandle::remove_if_empty);
        if !gone {
            self.kill_all();
        }
        self.killer.done.store(true, Ordering::SeqCst);
        if gone && init_end == InitEnd::Leave {
            // Nothing for `Drop` to kill or reap: the job is gone, and the init is left to
            // end by itself; the caller reaps it (`LeftInit`).
            self.reaped = true;
            return (report, true);
        }
        self.reaped = reap(self.pid, 0).is_some();
        (report, false)
    }

    /// The target's wait status: `status` itself, or for a PID namespace's init the word
    /// it wrote when the target ended (without one — the init was killed — its own).
    /// Read once the init is reaped: every writer has gone, so this never blocks.
    fn target_status(&mut self, status: i32) -> i32 {
        let Some(fd) = self.exit_word.take() else {
            return status;
        };
        match read_word(&fd) {
            Ok(Some(word)) => word.status,
            _ => status,
        }
    }

    /// Wait for the exit word of a PID namespace's init (the target ended), within the
    /// wall-time limit. With it, the answer is made at once: the target's status and
    /// resource use come in the word, the rest of the job is killed, and the init's
    /// reaping (its namespace's teardown: two RCU grace periods, ~1 ms) and the
    /// cgroup's removal go on off the answer's way. `Err(wall_hit)` without a word (the
    /// init was killed, or the wall-time limit hit, which kills it): the caller waits
    /// for the init as before and reports the init's own end.
    async fn answer_on_the_word(&mut self) -> Result<ExitReport, bool> {
        let Some(fd) = self.exit_word.take() else {
            return Err(false);
        };
        // The pipe goes back to `self.exit_word` whenever no word is taken here, for
        // `target_status`: a word written after we gave up (or one we could not wait
        // for) still names the target's end.
        let afd = match register_or_give_back(fd) {
            Ok(afd) => afd,
            Err((fd, _)) => {
                self.exit_word = Some(fd);
                return Err(false);
            }
        };
        let read = async {
            loop {
                let Ok(mut ready) = afd.readable().await else {
                    return None;
                };
                match ready.try_io(|fd| read_word(fd.get_ref())) {
                    Ok(word) => return word.ok().flatten(),
                    Err(_would_block) => continue,
                }
            }
        };
        let word = match self.remaining_wall() {
            Some(left) => match tokio::time::timeout(left, read).await {
                Ok(word) => word,
                Err(_) => {
                    self.kill_all();
                    self.exit_word = Some(afd.into_inner());
                    return Err(true);
                }
            },
            None => read.await,
        };
        let Some(word) = word else {
            self.exit_word = Some(afd.into_inner());
            return Err(false);
        };
        Ok(self.finish(Some(word), false))
    }

    fn remaining_wall(&self) -> Option<Duration> {
        self.wall_limit
            .map(|l| l.saturating_sub(self.started.elapsed()))
    }

    /// The report of an end (`reaped`: the init's or the process's own from `wait4`, or
    /// the target's from the init's exit word; `None`: it could not be reaped).
    fn finish(&mut self, reaped: Option<ExitWord>, wall_hit: bool) -> ExitReport {
        self.reaped = reaped.is_some();
        let wall = self.started.elapsed();
        // The main process is gone: nothing it left behind may outlive it.
        self.kill_all();
        self.killer.done.store(true, Ordering::SeqCst);
        let Some(ended) = reaped else {
            return ExitReport {
                wall,
                ..Default::default()
            };
        };
        let status = self.target_status(ended.status);
        self.report(ExitWord { status, ..ended }, wall, wall_hit)
    }

    /// The report of the target's end `ended` (its wait status and resource use) after
    /// `wall`, with the limit that ended it read from the status and the job's cgroup.
    fn report(&self, ended: ExitWord, wall: Duration, wall_hit: bool) -> ExitReport {
        let status = ended.status;
        let (user_cpu, system_cpu) = (
            Duration::from_micros(ended.user_us),
            Duration::from_micros(ended.system_us),
        );
        let termination = if libc::WIFEXITED(status) {
            Termination::Exited(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            Termination::Signaled(signal_name(libc::WTERMSIG(status)))
        } else {
            Termination::Unknown
        };
        // A shell reports a child killed by signal N as exit 128+N: count that too.
        let signal = if libc::WIFSIGNALED(status) {
            Some(libc::WTERMSIG(status))
        } else {
            match libc::WEXITSTATUS(status) - 128 {
                libc::SIGXCPU if self.limits.cpu_seconds.is_some() => Some(libc::SIGXCPU),
                libc::SIGXFSZ if self.limits.file_size_bytes.is_some() => Some(libc::SIGXFSZ),
                _ => None,
            }
        };
        let cpu_spent = user_cpu + system_cpu;
        let cg = self.killer.cgroup.as_deref();
        let limit = if wall_hit {
            Some(LimitHit::WallTime)
        } else if cg.is_some_and(|c| c.memory_limit_hit()) {
            Some(LimitHit::Memory)
        } else if signal == Some(libc::SIGXCPU)
            || (signal == Some(libc::SIGKILL)
                && self
                    .limits
                    .cpu_seconds
                    .is_some_and(|l| cpu_spent >= Duration::from_secs(l)))
        {
            Some(LimitHit::Cpu)
        } else if signal == Some(libc::SIGXFSZ) {
            Some(LimitHit::FileSize)
        } else if cg.is_some_and(|c| c.pids_limit_hit()) {
            Some(LimitHit::Processes)
        } else {
            None
        };
        ExitReport {
            termination,
            wall,
            user_cpu,
            system_cpu,
            peak_rss_bytes: ended.max_rss_kib * 1024,
            limit,
        }
    }
}

impl Drop for SandboxedChild {
    fn drop(&mut self) {
        if !self.reaped {
            self.kill_all();
            let pid = self.pid;
            // Reap off-thread so that dropping never blocks and leaves no zombie.
            let _ = std::thread::Builder::new()
                .name("sandbox-reap".into())
                .spawn(move || reap(pid, 0));
            self.killer.done.store(true, Ordering::SeqCst);
        }
    }
}

/// The init of a job proven gone, not yet reaped (see
/// [`SandboxedChild::wait_blocking_before_exit`]): reaped when this is dropped, or by
/// [`reap`](Self::reap). Its end needs no kill: it exits by itself right after its word.
/// A caller keeps it until its own answer is out, so that the init's teardown overlaps
/// that work and no zombie is handed to a parent that may never reap it.
#[derive(Debug)]
#[must_use = "dropping it reaps the init at once; keep it until the answer is out"]
pub struct LeftInit {
    pid: Option<u32>,
}

impl LeftInit {
    /// Wait for the init to end and reap it: its wait status, `None` when there was
    /// none to reap (the wait reaped it already).
    pub fn reap(mut self) -> Option<i32> {
        let pid = self.pid.take()?;
        reap(pid, 0).map(|ended| ended.status)
    }
}

impl Drop for LeftInit {
    fn drop(&mut self) {
        if let Some(pid) = self.pid.take() {
            let _ = reap(pid, 0);
        }
    }
}

/// What a blocking wait does with the init once the job is proven gone: reap it, or
/// leave it (the caller reaps it later; see `wait_blocking_before_exit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InitEnd {
    Reap,
    Leave,
}

/// Wait until `fd` is readable (true) or `deadline` has passed (false); an error other
/// than EINTR counts as readable (the reap that follows then blocks instead).
fn wait_readable(fd: RawFd, deadline: Option<Instant>) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .as_millis()
                .min(i32::MAX as u128) as i32,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc > 0 {
            return true;
        }
        if rc == 0 {
            return false;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return true;
        }
    }
}

/// Process group the terminal's signals are forwarded to (0: none yet); see
/// [`SignalForwarding`].
static FORWARD_PGID: AtomicI32 = AtomicI32::new(0);
/// A signal that arrived before the child's group was known, replayed once it is.
static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward_signal(sig: libc::c_int) {
    let pgid = FORWARD_PGID.load(Ordering::SeqCst);
    if pgid > 0 {
        // SAFETY: kill(2) is async-signal-safe; the group is our own child's.
        unsafe { libc::kill(-pgid, sig) };
    } else {
        PENDING_SIGNAL.store(sig, Ordering::SeqCst);
    }
}

/// Forwarding of SIGINT/SIGTERM/SIGHUP/SIGQUIT for the single-threaded `run` command:
/// the sandboxed child leads its own session, so the terminal's signals (Ctrl-C, a CI
/// timeout) reach only `run`. Install it *before* spawning, so that no signal is lost
/// in between, then point it at the child with
/// [`SandboxedChild::forward_terminal_signals`]. Dropping it stops the forwarding (the
/// child has been reaped: its group id may be reused).
#[must_use = "forwarding stops when the guard is dropped"]
pub struct SignalForwarding(());

impl SignalForwarding {
    pub fn install() -> Self {
        FORWARD_PGID.store(0, Ordering::SeqCst);
        PENDING_SIGNAL.store(0, Ordering::SeqCst);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            // SAFETY: installs a handler that only touches atomics and calls kill(2),
            // all async-signal-safe. exec (of the launcher) resets it in the child.
            unsafe { libc::signal(sig, forward_signal as *const () as libc::sighandler_t) };
        }
        SignalForwarding(())
    }
}

impl Drop for SignalForwarding {
    fn drop(&mut self) {
        FORWARD_PGID.store(0, Ordering::SeqCst);
    }
}

/// A process this server did not spawn itself (one forked by a sandboxed process, e.g.
/// a Python worker forked from a snapshot), watched and signalled through a pidfd: a
/// pidfd never names another process, even after the pid is reused.
#[derive(Debug)]
pub struct Pidfd(OwnedFd);

impl Pidfd {
    /// Only sound while `pid` cannot have been reaped and reused yet (its parent is
    /// known to hold it, alive or zombie).
    pub fn open(pid: u32) -> std::io::Result<Self> {
        pidfd_open(pid).map(Self)
    }

    /// `pidfd_send_signal(2)`; a process that has already ended is not an error.
    pub fn signal(&self, signal: i32) -> std::io::Result<()> {
        // SAFETY: pidfd_send_signal with a pidfd we own, a null siginfo and no flags.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ESRCH) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// A descriptor that becomes readable once the process has ended, registered with
    /// tokio (call inside a runtime).
    pub fn exit_fd(&self) -> std::io::Result<AsyncFd<OwnedFd>> {
        register_readable(self.0.try_clone()?)
    }
}

impl AsRawFd for Pidfd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// `pidfd_open(2)`: a descriptor for `pid` that becomes readable once it has ended.
/// Only meaningful for a process that cannot have been reaped yet (our own child).
fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).map_err(std::io::Error::other)?;
    // SAFETY: pidfd_open takes a pid and flags and returns a fresh descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(std::io::Error::other)?;
    // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Register a pidfd (the process ended) or a pipe with the tokio reactor for
/// readability.
fn register_readable(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    register_or_give_back(fd).map_err(|(_, e)| e)
}

/// [`register_readable`], giving `fd` back when it cannot be registered.
fn register_or_give_back(fd: OwnedFd) -> Result<AsyncFd<OwnedFd>, (OwnedFd, std::io::Error)> {
    // SAFETY: `fd` is an OwnedFd moved into the AsyncFd, which owns it until dropped.
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts())
}

/// The exit word in `fd` (`Ok(None)`: the pipe's end, or less than a word), or
/// `WouldBlock` when nothing is there yet. `fd` is made non-blocking: this never
/// blocks, even if some process we do not know of held the write end.
fn read_word(fd: &OwnedFd) -> std::io::Result<Option<ExitWord>> {
    let mut bytes = [0u8; ExitWord::LEN];
    // SAFETY: fcntl and read into a buffer we own, on a pipe end we own.
    let n = unsafe {
        libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK);
        libc::read(fd.as_raw_fd(), bytes.as_mut_ptr().cast(), bytes.len())
    };
    match usize::try_from(n) {
        Ok(n) => Ok(ExitWord::from_bytes(&bytes[..n])),
        Err(_) => Err(std::io::Error::last_os_error()),
    }
}

/// Reap our child `pid` (one whose launcher failed), blocking until it has ended.
pub(super) fn reap_blocking(pid: u32) {
    let _ = reap(pid, 0);
}

/// wait4 for `pid`, retrying on EINTR: its status and resource use. `None` if it
/// cannot be reaped.
fn reap(pid: u32, flags: i32) -> Option<ExitWord> {
    let mut status = 0;
    // SAFETY: rusage is plain data; zeroed is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: valid out-pointers for our own child.
        let rc = unsafe { libc::wait4(pid as libc::pid_t, &mut status, flags, &mut ru) };
        if rc == pid as libc::pid_t {
            return Some(ExitWord::of(status, &ru));
        }
        if rc < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        return None;
    }
}

/// "SIGKILL" for 9, etc.; "signal N" for numbers without a name.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

/// The number of a signal name produced by [`signal_name`].
pub(crate) fn signal_number(name: &str) -> Option<i32> {
    (1..32).find(|&n| signal_name(n) == name)
}

/// Signals a sandboxed process group (and its cgroup) from anywhere; see
/// [`SandboxedChild::killer`].
#[derive(Debug, Clone)]
pub struct GroupKiller {
    pgid: u32,
    cgroup: Option<Arc<JobCgroupHandle>>,
    /// Set once the child is reaped and its leftovers killed.
    done: Arc<AtomicBool>,
}

impl GroupKiller {
    /// Send `signal` to the process group (for SIGKILL also to every process of the
    /// cgroup). A no-op once the child is gone.
    ///
    /// The group first: it holds a PID namespace's init, whose end makes the kernel
    /// empty the namespace, so a killed job ends with its init — no exit word, its end
    /// reported once the init has been reaped and nothing of the namespace (nor the
    /// namespaces the init holds) is left — not with a target the cgroup's kill ended
    /// first while the init still tears the namespaces down. Then the cgroup: whatever
    /// left the group.
    pub fn signal(&self, signal: i32) -> std::io::Result<()> {
        if self.done.load(Ordering::SeqCst) {
            return Ok(());
        }
        // SAFETY: kill(2) on our own child's process group.
        let failed = match unsafe { libc::kill(-(self.pgid as libc::pid_t), signal) } {
            0 => None,
            _ => Some(std::io::Error::last_os_error())
                .filter(|e| e.raw_os_error() != Some(libc::ESRCH)),
        };
        if let (libc::SIGKILL, Some(cg)) = (signal, &self.cgroup) {
            cg.kill_all();
        }
        failed.map_or(Ok(()), Err)
    }

    /// SIGKILL everything the child started.
    pub fn kill_all(&self) {
        let _ = self.signal(libc::SIGKILL);
    }
}
