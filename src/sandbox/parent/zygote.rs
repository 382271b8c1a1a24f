//! The spawn helper (a zygote): one small single-threaded process per server that forks
//! every sandboxed process, so a job costs a fork of a process of a few hundred KiB
//! instead of a fork of the multi-threaded server plus an exec of this binary.
//!
//! The server forks it at start, before its runtime starts any thread ([`start_early`]);
//! one that has died is replaced through the same re-exec as the launcher (`ZYGOTE_ARG`),
//! from the spawner thread that lives as long as the server (see `spawn`). It reads
//! requests from a `SOCK_SEQPACKET` socket pair only the two of them hold: one message
//! of JSON ([`Request`]: the [`LaunchSpec`] and where each descriptor goes) with the
//! descriptors themselves attached (`SCM_RIGHTS`); a request larger than
//! [`INLINE_MAX`] (a worker's source travels in its argv) comes in a memfd attached
//! last, the message itself being [`IN_MEMFD`]. For each it forks with
//! `CLONE_PARENT`, so the new process is the server's child — the server waits for it,
//! opens its pidfd and gets its exit status as before — and the child places its
//! descriptors and goes on exactly as the re-executed launcher does (`run_spec`). The
//! reply is the child's pid, or a negative errno.
//!
//! Nothing about a job is decided here: the spec is the one the re-exec path would
//! have read from its memfd. The zygote holds no descriptor of any job after the fork
//! (it closes what it received), asks for `SIGKILL` when the thread that started it dies, and
//! its children bind themselves to the server exactly as the launcher's do.

use std::io::{IoSlice, IoSliceMut, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg,
    sendmsg, socketpair,
};
use serde::{Deserialize, Serialize};

use super::spawner::Spawner;
use crate::sandbox::launcher::error::SETUP_FAILED_EXIT;
use crate::sandbox::launcher::seccomp::FilterCache;
use crate::sandbox::launcher::{LaunchSpec, run_spec};

/// argv[1] that selects zygote mode; argv[2] is the socket's descriptor, argv[3] the
/// server's pid.
pub(crate) const ZYGOTE_ARG: &str = "__sandbox-zygote";

/// The largest request sent inline in the message (socket buffers are ~200 KiB).
const INLINE_MAX: usize = 32 << 10;

/// The message of a request whose JSON is in the memfd attached last.
const IN_MEMFD: &[u8] = b"@";

/// How long the server waits for the zygote's reply before replacing it.
const REPLY_WITHIN_SECS: i64 = 10;

/// The most descriptors one job is handed (the kernel's own cap is 253).
const MAX_FDS: usize = 64;

#[derive(Serialize, Deserialize)]
struct Request {
    spec: LaunchSpec,
    /// Where each attached descriptor goes in the child, in order.
    targets: Vec<RawFd>,
}

pub fn is_zygote_invocation() -> bool {
    std::env::args_os().nth(1).is_some_and(|a| a == ZYGOTE_ARG)
}

/// Zygote mode: serve spawn requests until the server closes the socket. Never returns.
pub fn zygote_main() -> ! {
    let mut args = std::env::args().skip(2);
    let sock: Option<RawFd> = args.next().and_then(|a| a.parse().ok());
    let parent: Option<u32> = args.next().and_then(|a| a.parse().ok());
    let (Some(sock), Some(parent)) = (sock, parent) else {
        eprintln!("mcp-sandbox-repl: {ZYGOTE_ARG} is internal; it is started by the server");
        std::process::exit(SETUP_FAILED_EXIT);
    };
    if crate::sandbox::launcher::pidns::bind_to_parent(parent, None).is_err() {
        std::process::exit(SETUP_FAILED_EXIT);
    }
    // SAFETY: the server put our end of the socket pair at `sock`; nothing else owns it.
    serve(unsafe { OwnedFd::from_raw_fd(sock) })
}

/// The zygote's loop: one request, one fork, one reply, until the server is gone.
fn serve(sock: OwnedFd) -> ! {
    let mut buf = vec![0u8; INLINE_MAX];
    // Each policy's seccomp filter, compiled here once: the children load it compiled.
    let mut filters = FilterCache::default();
    loop {
        let (len, mut fds) = match receive(&sock, &mut buf) {
            Ok(Some(got)) => got,
            // The server closed its end (or is gone): nothing more to do.
            Ok(None) | Err(_) => std::process::exit(0),
        };
        let request = if &buf[..len] == IN_MEMFD {
            let mut json = Vec::new();
            fds.pop()
                .map(std::fs::File::from)
                .and_then(|mut f| f.read_to_end(&mut json).ok())
                .and_then(|_| serde_json::from_slice::<Request>(&json).ok())
        } else {
            serde_json::from_slice::<Request>(&buf[..len]).ok()
        };
        let reply = match request {
            Some(req) if req.targets.len() == fds.len() => fork_job(&sock, &req, fds, &mut filters),
            _ => -libc::EINVAL,
        };
        let sent = sendmsg::<()>(
            sock.as_raw_fd(),
            &[IoSlice::new(&reply.to_ne_bytes())],
            &[],
            MsgFlags::MSG_NOSIGNAL,
            None,
        );
        if sent.is_err() {
            std::process::exit(0);
        }
    }
}

/// Fork one job as the server's child; in the child, place its descriptors and apply
/// the sandbox (never returns there). Returns the pid, or a negative errno.
fn fork_job(sock: &OwnedFd, req: &Request, fds: Vec<OwnedFd>, filters: &mut FilterCache) -> i32 {
    // The policy's seccomp filter, compiled here once: the child gets it compiled (a
    // failure here is met again, and reported, by the child, which compiles it itself).
    let filter: Option<Arc<_>> = filters
        .compiled_for(&crate::sandbox::launcher::seccomp::seccomp_rules(
            &req.spec.policy,
        ))
        .ok();
    // A job whose launcher is to be the init of a PID namespace of its own (the spec
    // carries the exit-word pipe) is cloned into a new one; where the kernel refuses,
    // into none (the launcher then makes it itself, with a supervisor).
    let mut pid = -1;
    if req.spec.exit_word_fd.is_some() {
        pid = clone_parent(libc::CLONE_NEWPID);
    }
    if pid < 0 {
        pid = clone_parent(0);
    }
    if pid == 0 {
        // SAFETY: closing our copy of the socket; the child never uses it.
        unsafe { libc::close(sock.as_raw_fd()) };
        place_fds(&fds, &req.targets);
        run_spec(&req.spec, filter.as_deref());
    }
    if pid < 0 {
        return -std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
    }
    i32::try_from(pid).unwrap_or(-libc::EOVERFLOW)
}

/// A raw clone with `CLONE_PARENT` and `flags`; the pid, 0 in the child, or -1.
fn clone_parent(flags: libc::c_int) -> libc::c_long {
    // SAFETY: a raw clone in a single-threaded process: like fork(2), with CLONE_PARENT
    // making the child a sibling of this process (the server's child). The child only
    // makes syscalls and allocates, as the re-executed launcher would.
    unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::CLONE_PARENT | flags | libc::SIGCHLD,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    }
}

/// In the child: put `fds[i]` at `targets[i]`. Every source is first copied above all
/// targets so no `dup2` clobbers a source still to be placed; the copies are left to
/// the launcher's close of inherited descriptors.
fn place_fds(fds: &[OwnedFd], targets: &[RawFd]) {
    let high = targets.iter().copied().max().unwrap_or(2) + 1;
    let fail = || {
        // SAFETY: _exit in a forked child; the status pipe may not be in place yet,
        // so the server sees a setup failure without words (exit 127).
        unsafe { libc::_exit(SETUP_FAILED_EXIT) }
    };
    let mut moved = Vec::with_capacity(fds.len());
    for fd in fds {
        // SAFETY: fcntl on a descriptor this process holds.
        let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, high) };
        if dup < 0 {
            fail();
        }
        moved.push(dup);
    }
    for (&fd, &target) in moved.iter().zip(targets) {
        // SAFETY: dup2 from a descriptor this process holds (above every target).
        if unsafe { libc::dup2(fd, target) } < 0 {
            fail();
        }
    }
}

/// One request and its descriptors; `None` at end of file.
fn receive(sock: &OwnedFd, buf: &mut [u8]) -> nix::Result<Option<(usize, Vec<OwnedFd>)>> {
    let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS]);
    loop {
        let mut iov = [IoSliceMut::new(buf)];
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => {
                let mut fds = Vec::new();
                for c in msg.cmsgs()? {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        // SAFETY: the kernel just installed these descriptors in this
                        // process for this message; nothing else owns them.
                        fds.extend(
                            raw.into_iter()
                                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                        );
                    }
                }
                if msg.bytes == 0 {
                    return Ok(None);
                }
                if msg.flags.contains(MsgFlags::MSG_TRUNC) {
                    return Ok(Some((0, fds)));
                }
                return Ok(Some((msg.bytes, fds)));
            }
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The server's side: the zygote process (our child) and its socket.
pub(super) struct Zygote {
    sock: OwnedFd,
    pid: libc::pid_t,
}

impl Drop for Zygote {
    fn drop(&mut self) {
        // SAFETY: kill and waitpid of our own unreaped child.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

/// Fork `spec` through the zygote with `fds` placed at their targets; returns the pid
/// of the new process (this process's child). Starts the zygote on first use, and once
/// more if it has died; an error means the caller should re-execute the launcher —
/// except `TimedOut`: the zygote may have forked the job before it stopped answering.
pub(super) fn spawn(
    slot: &Mutex<Option<Zygote>>,
    exe: &Path,
    spawner: &Spawner,
    spec: &LaunchSpec,
    fds: &[(RawFd, RawFd)],
) -> std::io::Result<u32> {
    let request = Request {
        spec: spec.clone(),
        targets: fds.iter().map(|&(_, t)| t).collect(),
    };
    let json = serde_json::to_vec(&request).map_err(std::io::Error::other)?;
    if fds.len() >= MAX_FDS {
        return Err(std::io::Error::other("too many descriptors for the zygote"));
    }
    let mut raw: Vec<RawFd> = fds.iter().map(|&(fd, _)| fd).collect();
    let memfd = match json.len() > INLINE_MAX {
        true => Some(super::memfd::bytes_memfd(&json)?),
        false => None,
    };
    let message: &[u8] = match &memfd {
        Some(fd) => {
            raw.push(fd.as_raw_fd());
            IN_MEMFD
        }
        None => &json,
    };
    let mut guard = slot
        .lock()
        .map_err(|_| std::io::Error::other("the zygote lock is poisoned"))?;
    let mut last = None;
    for _ in 0..2 {
        if guard.is_none() {
            *guard = Some(start(exe, spawner)?);
        }
        let Some(zygote) = guard.as_ref() else {
            continue;
        };
        match exchange(&zygote.sock, message, &raw) {
            Ok(pid) if pid > 0 => return Ok(pid as u32),
            Ok(errno) => {
                return Err(std::io::Error::from_raw_os_error(-errno));
            }
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                // It may have forked the job already: never start it a second time.
                *guard = None;
                return Err(e);
            }
            Err(e) => {
                // The zygote has died or garbled the exchange: start a new one.
                tracing::warn!(error = %e, "the spawn helper failed; starting a new one");
                *guard = None;
                last = Some(e);
            }
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("the zygote could not be started")))
}

/// Send one request and read the reply (pid or negative errno).
fn exchange(sock: &OwnedFd, json: &[u8], fds: &[RawFd]) -> std::io::Result<i32> {
    sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(json)],
        &[ControlMessage::ScmRights(fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    let mut reply = [0u8; 4];
    loop {
        let mut iov = [IoSliceMut::new(&mut reply)];
        match recvmsg::<()>(sock.as_raw_fd(), &mut iov, None, MsgFlags::empty()) {
            Ok(msg) if msg.bytes == 4 => break,
            Ok(_) => return Err(std::io::Error::other("the zygote closed its socket")),
            Err(nix::Error::EINTR) => continue,
            Err(nix::Error::EAGAIN) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "the spawn helper did not answer within {REPLY_WITHIN_SECS} s; it was replaced"
                    ),
                ));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(i32::from_ne_bytes(reply))
}

/// Start the zygote from the spawner thread (its death signal is bound to that thread).
fn start(exe: &Path, spawner: &Spawner) -> std::io::Result<Zygote> {
    let (mine, theirs) = socket_pair()?;
    const TARGET: RawFd = 3;
    let src = theirs.as_raw_fd();
    let mut cmd = std::process::Command::new(exe);
    cmd.arg(ZYGOTE_ARG)
        .arg(TARGET.to_string())
        .arg(std::process::id().to_string())
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    // SAFETY: dup2 is async-signal-safe; `theirs` stays open until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(src, TARGET) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let process = spawner.spawn(cmd)?;
    drop(theirs);
    server_side(mine, process.id() as libc::pid_t)
}

/// The pair the server and its zygote talk over (only the two of them hold it).
fn socket_pair() -> nix::Result<(OwnedFd, OwnedFd)> {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
}

/// The server's side of a zygote just started.
fn server_side(mine: OwnedFd, pid: libc::pid_t) -> std::io::Result<Zygote> {
    // A zygote that stops answering (it forks and replies, nothing slower) is replaced
    // rather than left to hold every spawn of the server.
    nix::sys::socket::setsockopt(
        &mine,
        nix::sys::socket::sockopt::ReceiveTimeout,
        &nix::sys::time::TimeVal::new(REPLY_WITHIN_SECS, 0),
    )?;
    Ok(Zygote { sock: mine, pid })
}

/// Start the zygote by forking this process, before it starts any thread (the server's
/// runtime): the first job then waits for no exec of this binary and its start (~3 ms
/// here), and the fork of the still small process costs a fraction of that. Its death
/// signal is bound to the calling thread, which must live as long as the server (the
/// main thread, which runs the server's runtime); so are the jobs it forks, as with the
/// spawner thread. Does nothing when this process already has threads; the first job
/// then starts one the usual way.
pub(super) fn start_early(slot: &Mutex<Option<Zygote>>) {
    if !single_threaded() {
        return;
    }
    let Ok(mut guard) = slot.lock() else { return };
    if guard.is_some() {
        return;
    }
    match fork_here() {
        Ok(zygote) => *guard = Some(zygote),
        Err(e) => {
            tracing::debug!(error = %e, "no spawn helper forked at start; the first job starts one")
        }
    }
}

fn single_threaded() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|tasks| tasks.count() == 1)
}

fn fork_here() -> std::io::Result<Zygote> {
    let (mine, theirs) = socket_pair()?;
    let parent = std::process::id();
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    // SAFETY: fork in a single-threaded process (checked by the caller); the child only
    // makes syscalls before it serves, as the re-executed zygote would.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: the child's own descriptors: the protocol's stdin and stdout become
        // /dev/null (the zygote must not hold the client's pipes), everything but the
        // socket and stderr is closed.
        let kept = unsafe {
            libc::dup2(null.as_raw_fd(), 0) == 0
                && libc::dup2(null.as_raw_fd(), 1) == 1
                && libc::dup2(theirs.as_raw_fd(), 3) == 3
                && crate::sandbox::launcher::fds::close_range(4, u32::MAX, 0) == 0
        };
        if !kept || crate::sandbox::launcher::pidns::bind_to_parent(parent, None).is_err() {
            // SAFETY: _exit in the forked child.
            unsafe { libc::_exit(SETUP_FAILED_EXIT) }
        }
        // SAFETY: descriptor 3 is the socket, placed just above; nothing else owns it.
        serve(unsafe { OwnedFd::from_raw_fd(3) })
    }
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    drop(theirs);
    server_side(mine, pid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn inode(fd: RawFd) -> u64 {
        // SAFETY: a zeroed stat buffer filled by fstat on a descriptor we hold.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        match unsafe { libc::fstat(fd, &mut st) } {
            0 => st.st_ino,
            _ => 0,
        }
    }

    /// Two descriptors that arrive at each other's target numbers (a swap): each must
    /// still end up at its own target, not a copy of the one placed first.
    #[test]
    fn descriptors_that_arrive_at_each_others_targets_are_swapped_right() {
        let a = std::fs::File::open("/dev/null").unwrap();
        let b = tempfile::tempfile().unwrap();
        let (ino_a, ino_b) = (a.metadata().unwrap().ino(), b.metadata().unwrap().ino());
        assert_ne!(ino_a, ino_b);
        // SAFETY: a fork in a test: the child only makes syscalls and _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: dup2 onto numbers nothing else in this child uses.
            let (x, y) = unsafe { (libc::dup2(a.as_raw_fd(), 40), libc::dup2(b.as_raw_fd(), 41)) };
            // SAFETY: the descriptors were just made by dup2 and are owned here only.
            let fds = unsafe { [OwnedFd::from_raw_fd(x), OwnedFd::from_raw_fd(y)] };
            place_fds(&fds, &[41, 40]);
            let ok = inode(41) == ino_a && inode(40) == ino_b;
            // SAFETY: _exit in the forked child.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) }
        }
        let mut status = 0;
        // SAFETY: waiting for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the descriptors were not placed at their own targets (status {status})"
        );
    }
}
