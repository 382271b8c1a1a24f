//! Binding every job to the server's life by the kernel, not by cleanup code.
//!
//! The launcher first asks for `SIGKILL` when the thread that forked it dies
//! (`PR_SET_PDEATHSIG`; the server forks from one thread that lives as long as it does,
//! see `spawn`) and checks its parent has not already gone. It then runs in a PID
//! namespace of its own, in one of two ways.
//!
//! **Started as the namespace's init** (the usual way: the parent cloned the launcher
//! with `CLONE_NEWPID`, see `spawn` and `zygote`; [`is_init`]). The launcher `T` is the
//! server's child *and* pid 1 of the namespace, and splits in two ([`serve_as_init`]):
//!
//! - `T` stays a tiny *init*: it reaps every orphan (double-forked daemons included),
//!   forwards thread-directed signals (`tgkill`, `SI_TKILL`) to the target, and when the
//!   target ends writes its wait status and resource use ([`ExitWord`]) to the
//!   *exit-word pipe*, whose read end only the server holds, and exits. The server
//!   answers from the word and reaps `T` afterwards, off the answer's way; `run`, once
//!   the job's cgroup proves nothing of the job is left, reaps `T` only after its
//!   answer is out (`SandboxedChild::wait_blocking_before_exit`). Without a word (`T` was killed: a
//!   group `SIGKILL`) `T` is reaped (pidfd, `wait4`) and its own end reported.
//! - `G`, its only child (pid 2), goes on with the sandbox and execs the target. `G`
//!   starts in `T`'s memory, on a stack of its own, while `T` sleeps until `G` has
//!   exec'd ([`start_target`]: `clone(CLONE_VM | CLONE_VFORK)`, as `posix_spawn` does):
//!   no page table is copied and no page taken by a copy-on-write fault.
//!
//! **Without a namespace from the parent** (a launcher in its own user namespace — not
//! root, without `CAP_SYS_ADMIN` — the re-exec route, or a parent that could not clone
//! one): the launcher `L` makes the namespace itself and splits in three ([`split`]):
//!
//! - `L` stays outside as a tiny *supervisor*: the server's pidfd, `wait4` (rusage) and
//!   signals still address it. It forwards thread-directed signals to the init and, when
//!   the init ends, ends the same way as the target did (same exit code, or killed by
//!   the same signal).
//! - `T`, the first child, is pid 1 of the namespace: the init as above, which hands the
//!   target's wait status to `L`. It has `PR_SET_PDEATHSIG` bound to `L`.
//! - `G`, the init's only child (pid 2), as above.
//!
//! Either way: when `T` dies, for any reason, the kernel kills every process of the
//! namespace, so the server's death kills `T` (through `L`'s when there is one), and
//! `T`'s kills the job. `G` goes on with the sandbox (cgroup, namespaces, mount view —
//! whose fresh `/proc` is that of the new namespace — rlimits, Landlock, seccomp).
//!
//! **`T` holds the job's other namespaces** ([`Hold`]): before it starts `G` it unshares
//! the mount and IPC namespaces in which `G` builds the view, and the network namespace
//! `G` would make (`G` is told, [`Made`], and does not make them again; where `T` could
//! not, `G` makes them itself and fails or notes as it would have), and it keeps the
//! descriptors of a view or network namespace made ahead that `G` joins. `T` starts
//! from `/`, so `G`'s `pivot_root` moves `T`'s root and working directory into the view
//! too: `T` keeps nothing of the host's tree (it only uses inherited descriptors). Were
//! `G` their only holder, its exit would unmount the whole view (`exit_task_namespaces`,
//! RCU grace periods) *before* `T` is woken to write the word; held by `T`, `G`'s exit
//! drops a reference only, and the teardown comes with `T`'s exit, after the word —
//! as bubblewrap's pid 1 holds the namespaces it made.
//! All share the launcher's session; `T` leads the job's process group, which `G` and its
//! children join (with a supervisor, `L` names it to the server on the status pipe).
//! Group signals (cancel, `SIGTERM`, `SIGCONT`) reach the target directly and `T`
//! ignores them (signals sent to a group arrive as `SI_USER`, forwarded ones as
//! `SI_TKILL`); a group `SIGKILL` ends `T`, the kernel empties the namespace, and only
//! then can the server reap `T` (or `L` report the end), so when the server sees the job
//! end none of its processes is left. Only `G` joins the job cgroup, so the supervisor
//! and init count against no job limit.
//!
//! Why not exec the target as pid 1 itself: an init ignores every signal it has no
//! handler for (a shell job's `sleep` would survive `SIGTERM` and `SIGINT`), gets no
//! `SIGPIPE`, and a Python worker would never reap orphaned zombies.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::error::SetupError;

/// Status-pipe line naming the job's process group (the init's pid as the server sees it).
pub(crate) const PGID_PREFIX: &str = "pgid: ";

/// Status-pipe line of a launcher that is the init of a PID namespace its parent made:
/// the server's child is the init, which leads the job's process group and writes the
/// target's wait status to the exit-word pipe.
pub(crate) const INIT_LINE: &str = "pidns-init\n";

/// The pid, as the server sees it, of the process that is `ns_pid` inside the PID
/// namespace `reference` (a host pid) lives in — e.g. a worker a sandboxed process forked
/// and reported by its own, namespace-local pid. Found through `/proc/<p>/status`
/// (`NSpid`); `None` if no such process is alive. Without a PID namespace the two are
/// the same number.
pub(crate) fn host_pid(reference: u32, ns_pid: u32) -> Option<u32> {
    let ns = std::fs::read_link(format!("/proc/{reference}/ns/pid")).ok()?;
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|p| {
            std::fs::read_link(format!("/proc/{p}/ns/pid"))
                .ok()
                .as_ref()
                == Some(&ns)
                && std::fs::read_to_string(format!("/proc/{p}/status"))
                    .ok()
                    .and_then(|status| {
                        let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
                        line.split_whitespace().last()?.parse::<u32>().ok()
                    })
                    == Some(ns_pid)
        })
}

/// Launcher, first step: `SIGKILL` this process when the thread that forked it dies,
/// and stop here if the server (`parent`) has already gone (the signal would never come).
/// A launcher started as the init of a new PID namespace sees no parent pid (its parent
/// is outside the namespace): then the server's end of the status pipe (`status_fd`
/// ours) tells whether it is still there.
pub(crate) fn bind_to_parent(parent: u32, status_fd: Option<RawFd>) -> Result<(), SetupError> {
    // SAFETY: prctl with integer arguments, affecting only this process.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) } != 0 {
        return Err(SetupError::ParentDeath(io::Error::last_os_error()));
    }
    // SAFETY: getppid cannot fail.
    let now = unsafe { libc::getppid() };
    let gone = match (now, status_fd) {
        (0, Some(fd)) => reader_gone(fd),
        _ => u32::try_from(now).ok() != Some(parent),
    };
    if gone {
        return Err(SetupError::ParentGone { parent });
    }
    Ok(())
}

/// Whether this process is pid 1 of its PID namespace: its parent started it as the
/// namespace's init (`CLONE_NEWPID`).
pub(crate) fn is_init() -> bool {
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() };
    pid == 1
}

/// How a process ended: its wait status and resource use as `wait4` gave them. What
/// the init writes when the target ends (the status first, 4 bytes: all a supervisor
/// reads; the use covers every child the init reaped: the target with the descendants
/// it waited for, and the orphans handed to the init), so the server
/// can answer before the namespace is torn down; the server's own reaps read the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExitWord {
    pub(crate) status: i32,
    pub(crate) user_us: u64,
    pub(crate) system_us: u64,
    pub(crate) max_rss_kib: u64,
}

impl ExitWord {
    /// Bytes of a whole word.
    pub(crate) const LEN: usize = 28;

    /// A wait status and the resource use `wait4` gave with it.
    pub(crate) fn of(status: i32, ru: &libc::rusage) -> ExitWord {
        let us = |t: libc::timeval| (t.tv_sec.max(0) as u64) * 1_000_000 + t.tv_usec.max(0) as u64;
        ExitWord {
            status,
            user_us: us(ru.ru_utime),
            system_us: us(ru.ru_stime),
            max_rss_kib: ru.ru_maxrss.max(0) as u64,
        }
    }

    fn to_bytes(self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..4].copy_from_slice(&self.status.to_ne_bytes());
        b[4..12].copy_from_slice(&self.user_us.to_ne_bytes());
        b[12..20].copy_from_slice(&self.system_us.to_ne_bytes());
        b[20..].copy_from_slice(&self.max_rss_kib.to_ne_bytes());
        b
    }

    /// A whole word, or `None` for anything shorter.
    pub(crate) fn from_bytes(b: &[u8]) -> Option<ExitWord> {
        let b: &[u8; Self::LEN] = b.get(..Self::LEN)?.try_into().ok()?;
        let u = |r: std::ops::Range<usize>| u64::from_ne_bytes(b[r].try_into().unwrap_or([0; 8]));
        Some(ExitWord {
            status: i32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
            user_us: u(4..12),
            system_us: u(12..20),
            max_rss_kib: u(20..28),
        })
    }
}

/// The job's namespaces its init holds (see the module docs): those it makes before it
/// starts the target, and those made ahead of need whose descriptors it keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Hold {
    /// A mount and IPC namespace, in which the target builds its view (it would
    /// otherwise make them itself: no view was made ahead) ...
    pub(crate) mount: bool,
    /// ... a network namespace (a private network, none made ahead) ...
    pub(crate) network: bool,
    /// ... and the descriptors of namespaces made ahead that the target joins.
    pub(crate) keep: [Option<RawFd>; 2],
}

/// The namespaces the init made (see [`Hold`]) and the target is in from its first
/// instruction: it must not make them again. Where the init could not make one, the
/// target makes it itself as without an init, and fails (or notes) as that says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Made {
    pub(crate) mount: bool,
    pub(crate) network: bool,
}

impl Hold {
    /// Make the namespaces asked for, in this process (the init, before the target starts).
    fn make(&self) -> Made {
        let mut made = Made::default();
        if self.mount {
            // From `/`: the target's pivot_root moves the root and working directory of
            // every process of the namespace that were the old root's, so the init too
            // ends up in the view and holds nothing of the host's tree (a working
            // directory elsewhere would keep the detached copy of it mounted).
            // SAFETY: chdir to a constant path, then unshare(2) with constant flags,
            // affecting only this single-threaded process (and its children to come).
            made.mount = unsafe {
                libc::chdir(c"/".as_ptr()) == 0
                    && libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWIPC) == 0
            };
        }
        if self.network {
            // SAFETY: as above.
            made.network = unsafe { libc::unshare(libc::CLONE_NEWNET) } == 0;
        }
        made
    }
}

/// Launcher started as pid 1 of a new PID namespace (see the module docs): stay as its
/// init, holding the job's namespaces (`hold`), and start the target, which runs
/// `target` told which namespaces it is already in. The init writes the target's wait
/// status to `exit_word` (the server holds the read end) when it ends. Returns only with
/// the reason the init could not start the target.
pub(crate) fn serve_as_init(
    status_fd: RawFd,
    exit_word: Option<RawFd>,
    hold: &Hold,
    target: &mut dyn FnMut(Made),
) -> SetupError {
    // SAFETY: write of a constant buffer to the status pipe we hold.
    unsafe { libc::write(status_fd, INIT_LINE.as_ptr().cast(), INIT_LINE.len()) };
    // The exit-word pipe is ours from here (the target closes its copy with every
    // descriptor it does not keep). Without one the word goes nowhere: a pipe of our
    // own, its read end left open so that the init does not take it for a dead reader.
    let word = match exit_word {
        // SAFETY: the parent placed the pipe's write end at this number for us alone.
        Some(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
        None => match pipe() {
            Ok((read, write)) => {
                std::mem::forget(read);
                write
            }
            Err(e) => return SetupError::PidNamespace(e),
        },
    };
    // Blocked before the target starts, as in `split`: its SIGCHLD is queued however
    // soon it ends.
    let original = block_all_signals();
    init(word, &original, hold, target)
}

/// Launcher, after `setsid`: make a PID namespace and split into supervisor, init and
/// target (see the module docs), the init holding the job's namespaces (`hold`); the
/// target runs `target`, told which namespaces the init made. Returns only with the
/// reason this launch failed (in the launcher, or in the init before it started the
/// target), or when no PID namespace can be made and the policy allows that: `policy`
/// (its name) requires one and this fails closed ([`SetupError::PidNamespaceMissing`]),
/// or under best effort (`best_effort`) this returns a note and the caller goes on as
/// the target, no namespace made (then the target is bound to the server by
/// `PR_SET_PDEATHSIG` alone, not its descendants).
pub(crate) fn split(
    status_fd: RawFd,
    policy: &str,
    best_effort: bool,
    hold: &Hold,
    target: &mut dyn FnMut(Made),
) -> Result<Option<String>, SetupError> {
    // SAFETY: unshare(2) with a constant flag; it only affects children made from here on.
    if unsafe { libc::unshare(libc::CLONE_NEWPID) } != 0 {
        let source = io::Error::last_os_error();
        if !best_effort {
            return Err(SetupError::PidNamespaceMissing {
                policy: policy.to_string(),
                source,
            });
        }
        return Ok(Some(format!(
            "PID namespace (unshare CLONE_NEWPID: {source}; needs CAP_SYS_ADMIN): \
             processes that leave the job's process group and cgroup may outlive the \
             server"
        )));
    }
    let (from_init, to_supervisor) = pipe().map_err(SetupError::PidNamespace)?;
    // Every signal is blocked *before* the fork, in both halves: a blocked SIGCHLD is
    // queued, an unblocked one (default action: ignore) is discarded. Blocking after the
    // fork lost the init's SIGCHLD whenever the init ended first (a target that exits at
    // once or fails to start), and the supervisor then waited forever beside a zombie.
    let original = block_all_signals();
    // SAFETY: fork in a single-threaded process (the launcher); the child only makes
    // syscalls and starts the target, which goes on single-threaded as the launcher would.
    match unsafe { libc::fork() } {
        -1 => {
            let e = io::Error::last_os_error();
            set_signal_mask(&original);
            Err(SetupError::PidNamespace(e))
        }
        0 => {
            drop(from_init);
            // SAFETY: setpgid on ourselves (the supervisor does it too: no race either way).
            unsafe { libc::setpgid(0, 0) };
            Err(init(to_supervisor, &original, hold, target))
        }
        init_pid => {
            drop(to_supervisor);
            // SAFETY: setpgid of our own child, in our session.
            unsafe { libc::setpgid(init_pid, init_pid) };
            // The job's process group is the init's: the server signals that group, so a
            // group SIGKILL ends the init (and with it the namespace) but not this
            // supervisor, which then reports the end once every process of it is gone.
            let line = format!("{PGID_PREFIX}{init_pid}\n");
            // SAFETY: write of a buffer we own to the status pipe we hold.
            unsafe { libc::write(status_fd, line.as_ptr().cast(), line.len()) };
            supervise(init_pid, from_init)
        }
    }
}

/// pid 1 of the new namespace: make the namespaces `hold` asks for, start the target
/// (which runs `target`) and serve as its init. Returns only with the reason it could not
/// start it. `to_supervisor`: where the target's wait status goes (the supervisor's pipe,
/// or the server's exit-word pipe).
fn init(
    to_supervisor: OwnedFd,
    original: &libc::sigset_t,
    hold: &Hold,
    target: &mut dyn FnMut(Made),
) -> SetupError {
    // SAFETY: prctl with integer arguments, affecting only this process.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) } != 0 {
        return SetupError::ParentDeath(io::Error::last_os_error());
    }
    // The supervisor (or the server) holds the only read end: an error on ours means it
    // has already died (before the death signal was armed), so nothing would ever kill
    // this namespace.
    if reader_gone(to_supervisor.as_raw_fd()) {
        // SAFETY: _exit in a forked child.
        unsafe { libc::_exit(super::error::SETUP_FAILED_EXIT) }
    }
    // Every signal is still blocked (since before our own fork): blocked signals are
    // queued even for an init, which would otherwise drop those it has no handler for,
    // and the target's SIGCHLD cannot be lost however soon it ends.
    let all = full_sigset();
    // The job's namespaces are made here, before the target starts, so that this process
    // holds them: the target's end then drops a reference only, and their teardown (the
    // view's unmounting) comes with this process's exit, after the word.
    let mut start = TargetStart {
        run: target,
        made: hold.make(),
        mask: *original,
        word: to_supervisor.as_raw_fd(),
    };
    let target = match start_target(&mut start) {
        Ok(pid) => pid,
        Err(e) => return SetupError::PidNamespace(e),
    };
    let [a, b] = hold.keep;
    close_all_but([Some(to_supervisor.as_raw_fd()), a, b]);
    loop {
        let (sig, code) = wait_signal(&all);
        // A timeout (sig 0) reaps too: the watchdog against any wakeup that never comes.
        if sig == libc::SIGCHLD || sig == 0 {
            // Reap every child: the target and any orphan the namespace handed to us.
            let mut ended = None;
            loop {
                let mut status = 0;
                // SAFETY: waitpid with a valid out-pointer.
                let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
                if pid <= 0 {
                    break;
                }
                if pid == target {
                    ended = Some(status);
                }
            }
            if let Some(status) = ended {
                // The resource use of every child reaped so far — the target with what it
                // waited for, and the orphans this init reaped (a job's background work
                // counts too, as when the server read this process's own use).
                // SAFETY: rusage is plain data; zeroed is a valid value.
                let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
                // SAFETY: getrusage with a valid out-pointer.
                unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
                let word = ExitWord::of(status, &ru).to_bytes();
                // SAFETY: write of a buffer we own to our pipe end (one write of less
                // than PIPE_BUF: read whole or not at all).
                unsafe { libc::write(to_supervisor.as_raw_fd(), word.as_ptr().cast(), word.len()) };
                // SAFETY: _exit; the kernel then kills whatever is left in the namespace.
                unsafe { libc::_exit(0) }
            }
        } else if code == libc::SI_TKILL {
            // SAFETY: tgkill of our own unreaped child (the target).
            unsafe { libc::syscall(libc::SYS_tgkill, target, target, sig) };
        }
    }
}

/// What the target's process starts with (see [`start_target`]).
struct TargetStart<'a> {
    /// The target's half of the launch; it never returns (it execs or exits).
    run: &'a mut dyn FnMut(Made),
    made: Made,
    /// The signal mask from before the launcher blocked every signal.
    mask: libc::sigset_t,
    /// The init's end of the exit-word pipe, which the target must not keep.
    word: RawFd,
}

/// The stack the target's half runs on until its exec: plain, shallow setup code
/// (mounts, Landlock, seccomp, the exec); reserved, not committed, beyond what it touches.
const TARGET_STACK: usize = 1 << 20;

/// Start the target: a child that shares this process's memory until it execs or exits
/// (`clone(CLONE_VM | CLONE_VFORK)`, as `posix_spawn` starts one), running `start.run` on
/// a stack of its own while this process sleeps. Nothing of the init's memory is copied:
/// a fork copied its page tables, and every page either side then wrote took a
/// copy-on-write fault (~60 in the target before its exec). Sound because this process
/// is single-threaded and sleeps until the child is gone from its memory, as after a
/// `vfork`; the child's allocations stay behind as garbage, and the init allocates
/// nothing afterwards (a child killed inside `malloc` leaves its lock taken). Returns
/// the child's pid.
fn start_target(start: &mut TargetStart<'_>) -> io::Result<libc::pid_t> {
    // SAFETY: a fresh anonymous private mapping; its result is checked.
    let stack = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            TARGET_STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // A guard page at the bottom: an overflow faults instead of writing below the stack.
    // SAFETY: the mapping's first page, ours.
    unsafe { libc::mprotect(stack, page_size(), libc::PROT_NONE) };
    // SAFETY: the child runs `target_entry` on the top of the fresh stack (mmap's page
    // alignment keeps the 16-byte alignment the ABI wants) with a pointer to `start`,
    // which outlives its use: CLONE_VFORK returns only once the child has exec'd or ended.
    let pid = unsafe {
        libc::clone(
            target_entry,
            stack.cast::<u8>().add(TARGET_STACK).cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (start as *mut TargetStart<'_>).cast(),
        )
    };
    let result = match pid {
        -1 => Err(io::Error::last_os_error()),
        pid => Ok(pid),
    };
    // SAFETY: nothing runs on the stack any more (the child exec'd, ended, or never was).
    unsafe { libc::munmap(stack, TARGET_STACK) };
    result
}

/// The target's first function, on its own stack (see [`start_target`]).
extern "C" fn target_entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `start_target` passed its `TargetStart`, alive and untouched by the parent,
    // which sleeps until this child has exec'd or ended.
    let start = unsafe { &mut *arg.cast::<TargetStart<'_>>() };
    // SAFETY: closing our copy of the init's descriptor (the fd table is our own).
    unsafe { libc::close(start.word) };
    set_signal_mask(&start.mask);
    (start.run)(start.made);
    // SAFETY: `run` execs or exits; were it to return, end without unwinding.
    unsafe { libc::_exit(super::error::SETUP_FAILED_EXIT) }
}

fn page_size() -> usize {
    // SAFETY: sysconf with a constant name.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    }
}

/// The launcher outside the namespace: forward, wait, and end as the target ended.
/// Every signal is already blocked (by `split`, before the fork), so the init's SIGCHLD is
/// queued however soon it ended; the first look is a `waitpid` anyway, and every wait is
/// bounded (`WATCHDOG`), so even a lost wakeup only delays the end, never hangs it.
fn supervise(init: libc::pid_t, from_init: OwnedFd) -> ! {
    close_all_but([Some(from_init.as_raw_fd())]);
    let all = full_sigset();
    loop {
        let mut status = 0;
        // SAFETY: waitpid of our own child with a valid out-pointer.
        if unsafe { libc::waitpid(init, &mut status, libc::WNOHANG) } == init {
            let mut bytes = [0u8; 4];
            // SAFETY: read into a 4-byte buffer we own.
            let n = unsafe { libc::read(from_init.as_raw_fd(), bytes.as_mut_ptr().cast(), 4) };
            // Without a word from the init (it was killed), end as the init did.
            let target = if n == 4 {
                i32::from_ne_bytes(bytes)
            } else {
                status
            };
            end_like(target);
        }
        let (sig, code) = wait_signal(&all);
        if sig != libc::SIGCHLD && sig != 0 && code == libc::SI_TKILL {
            // SAFETY: tgkill of our own unreaped child (the init), which passes it on.
            unsafe { libc::syscall(libc::SYS_tgkill, init, init, sig) };
        }
    }
}

/// Exit with the same code, or die of the same signal, as wait status `status` says.
fn end_like(status: i32) -> ! {
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let mut set = empty_sigset();
        // SAFETY: plain syscalls on this process with valid arguments: no core file of the
        // supervisor, default action for `sig`, unblocked, then sent to ourselves.
        unsafe {
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::signal(sig, libc::SIG_DFL);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::getpid(), sig);
            libc::_exit(128 + sig)
        }
    }
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        super::error::SETUP_FAILED_EXIT
    };
    // SAFETY: _exit skips atexit handlers, which belong to the server in a forked child.
    unsafe { libc::_exit(code) }
}

/// How long a supervisor or init waits for a signal before it looks for its child's end
/// itself: a watchdog, so that no lost wakeup can leave a job `running` forever. Ending
/// is signalled (SIGCHLD, queued while blocked), so this only bounds the rare lost one.
const WATCHDOG: libc::timespec = libc::timespec {
    tv_sec: 1,
    tv_nsec: 0,
};

/// Wait for any signal (all are blocked), at most [`WATCHDOG`]; returns its number and
/// `si_code`, or `(0, 0)` on timeout. The raw syscall: glibc's `sigwaitinfo` reports
/// `SI_TKILL` as `SI_USER`, which is the very difference between a forwarded signal and
/// a group one.
fn wait_signal(set: &libc::sigset_t) -> (i32, i32) {
    loop {
        // SAFETY: siginfo_t is plain data; zeroed is valid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: rt_sigtimedwait with a valid set, out-pointer, timeout and the kernel's
        // sigset size (64 signals).
        let sig = unsafe {
            libc::syscall(
                libc::SYS_rt_sigtimedwait,
                set as *const libc::sigset_t,
                &mut info as *mut libc::siginfo_t,
                &WATCHDOG as *const libc::timespec,
                8usize,
            )
        };
        if sig > 0 {
            return (sig as i32, info.si_code);
        }
        if io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN) {
            return (0, 0);
        }
    }
}

/// Block every signal; returns the mask before.
fn block_all_signals() -> libc::sigset_t {
    let all = full_sigset();
    let mut original = empty_sigset();
    // SAFETY: sigprocmask with valid sets in a single-threaded process.
    unsafe { libc::sigprocmask(libc::SIG_BLOCK, &all, &mut original) };
    original
}

fn set_signal_mask(mask: &libc::sigset_t) {
    // SAFETY: sigprocmask with a valid set in a single-threaded process.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, mask, std::ptr::null_mut()) };
}

fn full_sigset() -> libc::sigset_t {
    let mut set = empty_sigset();
    // SAFETY: sigfillset on a set we own.
    unsafe { libc::sigfillset(&mut set) };
    set
}

fn empty_sigset() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::sigemptyset(&mut set) };
    set
}

/// Whether every read end of the pipe whose write end is `fd` is closed.
fn reader_gone(fd: RawFd) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: poll of one valid pollfd, without waiting.
    let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
    rc > 0 && pfd.revents & libc::POLLERR != 0
}

/// Close every descriptor but those in `keep`: stdio and the status pipe must reach EOF
/// when the target closes them, not when the supervisor or init end. No allocation.
fn close_all_but<const N: usize>(keep: [Option<RawFd>; N]) {
    let mut keep = keep.map(|fd| fd.and_then(|fd| u32::try_from(fd).ok()).unwrap_or(u32::MAX));
    keep.sort_unstable();
    let mut next: u32 = 0;
    for fd in keep.into_iter().take_while(|&fd| fd != u32::MAX) {
        if fd > next {
            // SAFETY: closing descriptors of this single-threaded process that it no
            // longer uses.
            unsafe { super::fds::close_range(next, fd - 1, 0) };
        }
        next = next.max(fd + 1);
    }
    // SAFETY: as above.
    unsafe { super::fds::close_range(next, u32::MAX, 0) };
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The word comes back whole; the status leads (a supervisor reads only it);
    /// anything shorter is no word.
    #[test]
    fn an_exit_word_round_trips_and_leads_with_the_status() {
        // SAFETY: rusage is plain data; zeroed is a valid value.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        ru.ru_utime.tv_sec = 2;
        ru.ru_utime.tv_usec = 5;
        ru.ru_stime.tv_usec = 700;
        ru.ru_maxrss = 65536;
        let word = ExitWord::of(9 << 8, &ru);
        let bytes = word.to_bytes();
        assert_eq!(
            i32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            9 << 8
        );
        assert_eq!(
            ExitWord::from_bytes(&bytes),
            Some(ExitWord {
                status: 9 << 8,
                user_us: 2_000_005,
                system_us: 700,
                max_rss_kib: 65536
            })
        );
        assert_eq!(ExitWord::from_bytes(&bytes[..4]), None);
    }

    #[test]
    fn without_a_namespace_the_host_pid_is_the_same_number() {
        let me = std::process::id();
        assert_eq!(host_pid(me, me), Some(me));
        // A pid that no process in our namespace has.
        assert_eq!(host_pid(me, u32::MAX - 1), None);
    }

    /// The target is another process that runs in the init's memory (what it writes is
    /// the init's to read: nothing was copied), with the mask it is given and without the
    /// init's exit-word descriptor, and the init goes on only once it has ended.
    #[test]
    fn the_target_runs_in_the_inits_memory_while_the_init_waits() {
        let (read, write) = pipe().unwrap();
        let mut seen = None;
        let mut run = |_made: Made| {
            // SAFETY: plain syscalls and a write of plain data: nothing that allocates.
            unsafe {
                let mut mask = empty_sigset();
                libc::sigprocmask(libc::SIG_SETMASK, std::ptr::null(), &mut mask);
                let word_open = libc::fcntl(write.as_raw_fd(), libc::F_GETFD) != -1;
                seen = Some((
                    libc::getpid(),
                    libc::getppid(),
                    libc::sigismember(&mask, libc::SIGUSR1) == 1,
                    word_open,
                ));
                libc::_exit(7)
            }
        };
        let mut mask = empty_sigset();
        // SAFETY: sigaddset on a set we own.
        unsafe { libc::sigaddset(&mut mask, libc::SIGUSR1) };
        let mut start = TargetStart {
            run: &mut run,
            made: Made::default(),
            mask,
            word: write.as_raw_fd(),
        };
        let pid = start_target(&mut start).unwrap();
        // The child has ended (CLONE_VFORK): what it wrote is here already.
        let parent = std::process::id() as libc::pid_t;
        assert_eq!(seen, Some((pid, parent, true, false)));
        let mut status = 0;
        // SAFETY: waitpid of our own child with a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7);
        // Only the child's copy of the descriptor was closed.
        // SAFETY: fcntl on a descriptor we own.
        assert_ne!(unsafe { libc::fcntl(write.as_raw_fd(), libc::F_GETFD) }, -1);
        drop(read);
    }

    /// Runs a supervisor in a forked child whose "init" has already ended (a zombie,
    /// not yet reaped) before `supervise` starts: `block_first` says whether signals are
    /// blocked before the init's fork (as `split` does) or only after (the old order,
    /// in which the init's SIGCHLD is discarded). Returns the supervisor's wait status.
    fn supervisor_after_an_early_exit(block_first: bool) -> i32 {
        let (from_init, to_supervisor) = pipe().unwrap();
        // SAFETY: fork from the test process; the child makes only syscalls (and ends
        // in `supervise`, which never returns).
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork: {}", io::Error::last_os_error());
        if child == 0 {
            if block_first {
                block_all_signals();
            }
            // SAFETY: fork in the now single-threaded child.
            let init = unsafe { libc::fork() };
            if init == 0 {
                // The init ends at once, with a word for the supervisor: status 7 << 8.
                let status: i32 = 7 << 8;
                let bytes = status.to_ne_bytes();
                // SAFETY: write of a buffer we own, then _exit in a forked child.
                unsafe {
                    libc::write(to_supervisor.as_raw_fd(), bytes.as_ptr().cast(), 4);
                    libc::_exit(0)
                }
            }
            drop(to_supervisor);
            // Wait until the init has ended, leaving it unreaped (WNOWAIT): its SIGCHLD
            // has been sent (and, unblocked, discarded) before the supervisor waits.
            // SAFETY: siginfo_t is plain data; zeroed is valid.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: waitid of our own child with a valid out-pointer.
            unsafe {
                libc::waitid(
                    libc::P_PID,
                    init as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOWAIT,
                )
            };
            if !block_first {
                block_all_signals();
            }
            supervise(init, from_init)
        }
        drop((from_init, to_supervisor));
        // Hang guard (not a timing claim): a supervisor that never ends is the bug.
        for _ in 0..6000 {
            let mut status = 0;
            // SAFETY: waitpid of our own child with a valid out-pointer.
            if unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) } == child {
                return status;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // SAFETY: kill and reap our own child.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
        }
        panic!("the supervisor never saw its init end (60 s)");
    }

    #[test]
    fn a_supervisor_whose_init_ended_before_it_waited_ends_like_the_target() {
        let status = supervisor_after_an_early_exit(true);
        assert!(libc::WIFEXITED(status), "status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 7);
    }

    #[test]
    fn a_lost_sigchld_does_not_leave_the_supervisor_waiting() {
        // The init's SIGCHLD was discarded (signals were not yet blocked when it ended):
        // the supervisor's first look (waitpid) and its watchdog still find the end.
        let status = supervisor_after_an_early_exit(false);
        assert!(libc::WIFEXITED(status), "status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 7);
    }
}
