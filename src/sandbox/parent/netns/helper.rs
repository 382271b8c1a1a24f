//! The broker's network namespace for a server without CAP_SYS_ADMIN: a forked child
//! (single-threaded, so the kernel lets it `unshare(CLONE_NEWUSER)`, which it refuses
//! to the multi-threaded server) enters a user namespace of its own, makes the network
//! namespace there with `lo` up, binds the listener on 127.0.0.1 and sends the listener
//! and `/proc/self/ns/net` back over a socket pair, then exits. The descriptors keep
//! both namespaces alive. The child makes only raw syscalls on buffers prepared before
//! the fork (as the kernel probe's children do): safe in a fork of a threaded process.
//!
//! On failure the child sends five bytes instead: the failed step's number and the errno.

use std::io::{self, IoSliceMut};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{
    AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg, socketpair,
};

use crate::sandbox::launcher::netns::{NetnsError, bring_up_loopback};
use crate::sandbox::parent::probe::UserMaps;

/// The child's steps, numbered from 1 in the failure message.
const STEPS: [&str; 6] = [
    "unshare CLONE_NEWUSER and write its uid and gid maps",
    "unshare CLONE_NEWNET",
    "bring up lo",
    "bind and listen on 127.0.0.1",
    "open /proc/self/ns/net",
    "send the descriptors to the server",
];

/// Make the broker's namespace and listener in a helper child's user namespace:
/// (the network namespace, the listener bound in it).
pub(crate) fn make() -> Result<(OwnedFd, TcpListener), NetnsError> {
    let io_err = |step| {
        move |e: nix::Error| NetnsError::Listener {
            step,
            source: io::Error::from(e),
        }
    };
    let maps = UserMaps::own();
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(io_err("socketpair"))?;
    // SAFETY: fork(2); the child makes only raw syscalls on prepared buffers, then _exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(NetnsError::Listener {
            step: "fork the helper",
            source: io::Error::last_os_error(),
        });
    }
    if pid == 0 {
        // SAFETY: the forked child; `child` never returns.
        unsafe { child(&maps, theirs.as_raw_fd()) }
    }
    drop(theirs);
    let got = receive(&ours);
    let mut status = 0;
    // SAFETY: reaping the child we forked (again if a signal interrupted the wait).
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
        && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
    {}
    got
}

/// Read the child's answer: the listener and the namespace, or its failure.
fn receive(sock: &OwnedFd) -> Result<(OwnedFd, TcpListener), NetnsError> {
    let mut buf = [0u8; 8];
    let mut iov = [IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([RawFd; 2]);
    let msg = loop {
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::Error::EINTR) => continue,
            other => {
                break other.map_err(|e| NetnsError::Listener {
                    step: "receive from the helper",
                    source: io::Error::from(e),
                })?;
            }
        }
    };
    let bytes = msg.bytes;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for c in msg.cmsgs().into_iter().flatten() {
        if let ControlMessageOwned::ScmRights(rights) = c {
            // SAFETY: the kernel installed these descriptors for us.
            fds.extend(
                rights
                    .into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    if bytes >= 5 && buf[0] != 0 {
        let step = STEPS
            .get(usize::from(buf[0]) - 1)
            .copied()
            .unwrap_or("helper");
        let source =
            io::Error::from_raw_os_error(i32::from_le_bytes([buf[1], buf[2], buf[3], buf[4]]));
        return Err(match buf[0] {
            1 | 2 => NetnsError::UserNamespace { step, source },
            3 => NetnsError::Loopback { step, source },
            _ => NetnsError::Listener { step, source },
        });
    }
    let mut fds = fds.into_iter();
    match (bytes, fds.next(), fds.next()) {
        (1, Some(listener), Some(netns)) => Ok((netns, TcpListener::from(listener))),
        _ => Err(NetnsError::Listener {
            step: "receive from the helper",
            source: io::Error::other("the helper ended without an answer"),
        }),
    }
}

/// The helper child: each step, then `_exit`. Never returns.
///
/// # Safety
/// Only raw syscalls on buffers prepared before the fork, and `_exit`.
unsafe fn child(maps: &UserMaps, sock: RawFd) -> ! {
    // SAFETY: raw syscalls on stack buffers and descriptors of this process.
    unsafe {
        let errno = || *libc::__errno_location();
        let fail = |step: u8, e: i32| -> ! {
            let mut msg = [0u8; 5];
            msg[0] = step;
            msg[1..].copy_from_slice(&e.to_le_bytes());
            libc::send(sock, msg.as_ptr().cast(), msg.len(), libc::MSG_NOSIGNAL);
            libc::_exit(1)
        };
        if let Err(e) = maps.enter() {
            fail(1, e);
        }
        if libc::unshare(libc::CLONE_NEWNET) != 0 {
            fail(2, errno());
        }
        if let Err(e) = bring_up_loopback() {
            let raw = match e {
                NetnsError::Loopback { source, .. } => source.raw_os_error(),
                _ => None,
            };
            fail(3, raw.unwrap_or(libc::EIO));
        }
        let listener = listen_on_loopback().unwrap_or_else(|e| fail(4, e));
        let netns = libc::open(
            c"/proc/self/ns/net".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if netns < 0 {
            fail(5, errno());
        }
        if send_fds(sock, [listener, netns]) != 0 {
            fail(6, errno());
        }
        libc::_exit(0)
    }
}

/// A TCP socket bound to 127.0.0.1 on a port the kernel picks, listening; the errno on
/// failure.
///
/// # Safety
/// Raw syscalls only.
unsafe fn listen_on_loopback() -> Result<RawFd, i32> {
    // SAFETY: raw syscalls on a stack sockaddr.
    unsafe {
        let errno = || *libc::__errno_location();
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(errno());
        }
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_addr.s_addr = u32::from_be_bytes([127, 0, 0, 1]).to_be();
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        if libc::bind(fd, (&addr as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(errno());
        }
        if libc::listen(fd, 128) != 0 {
            return Err(errno());
        }
        Ok(fd)
    }
}

/// `sendmsg` of one data byte (0: success) with `fds` as `SCM_RIGHTS`, from a stack
/// buffer. Returns what `sendmsg` returned, 0 for success.
///
/// # Safety
/// Raw syscalls only.
unsafe fn send_fds(sock: RawFd, fds: [RawFd; 2]) -> libc::c_int {
    #[repr(C)]
    union Control {
        buf: [u8; 64],
        _align: libc::cmsghdr,
    }
    // SAFETY: building a msghdr over stack buffers that outlive the call.
    unsafe {
        let payload = std::mem::size_of_val(&fds) as libc::c_uint;
        let mut data = [0u8; 1];
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr().cast(),
            iov_len: data.len(),
        };
        let mut control = Control { buf: [0; 64] };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.buf.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(payload) as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(payload) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast(), fds.len());
        if libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) == 1 {
            0
        } else {
            -1
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    use super::*;
    use crate::sandbox::launcher::netns::join_namespace;
    use crate::sandbox::launcher::userns::join_owner_of;

    /// A helper that failed sends its step and errno: the server's error names both,
    /// and a failed user namespace says what to allow.
    #[test]
    fn a_failed_step_is_told_in_words() {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let mut msg = vec![1u8];
        msg.extend(libc::ENOSPC.to_le_bytes());
        nix::unistd::write(&theirs, &msg).unwrap();
        let words = receive(&ours).err().unwrap().to_string();
        assert!(
            words.contains("unshare CLONE_NEWUSER and write its uid and gid maps")
                && words.contains("No space left on device")
                && words.contains("allow unprivileged user namespaces"),
            "{words}"
        );
        drop(theirs);
        let words = receive(&ours).err().unwrap().to_string();
        assert!(
            words.contains("the helper ended without an answer"),
            "{words}"
        );
    }

    fn ns_link(pid: &str, ns: &str) -> String {
        std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))
            .unwrap()
            .display()
            .to_string()
    }

    /// The helper's namespace (made here as root too: root may make a user namespace)
    /// is owned by a user namespace that is not ours; a process that enters that user
    /// namespace as the launcher does, then the network namespace, reaches the
    /// listener there and no host listener, and the server accepts its connection.
    #[test]
    fn a_helper_namespace_is_joined_through_its_user_namespace() {
        let (netns, listener) = make().expect("the helper makes the namespace");
        let port = listener.local_addr().unwrap().port();
        let host = TcpListener::bind("127.0.0.1:0").unwrap();
        let host_port = host.local_addr().unwrap().port();
        let script = format!(
            "import os, socket\n\
             def tryc(p):\n  try:\n    socket.create_connection(('127.0.0.1', p), timeout=2).close(); return 'ok'\n  except OSError as e: return type(e).__name__\n\
             print(tryc({port}), tryc({host_port}), os.readlink('/proc/self/ns/user'))"
        );
        let fd = netns.try_clone().unwrap();
        let mut cmd = Command::new("python3");
        cmd.arg("-c").arg(&script);
        // SAFETY: raw syscalls between fork and exec in a test.
        unsafe {
            cmd.pre_exec(move || {
                join_owner_of(fd.as_raw_fd())
                    .map_err(|(step, e)| io::Error::other(format!("{step}: {e}")))?;
                join_namespace(&fd).map_err(io::Error::other)
            })
        };
        let out = cmd.output().expect("spawn python3");
        let text = String::from_utf8_lossy(&out.stdout);
        let words: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(words[..2], ["ok", "ConnectionRefusedError"], "{out:?}");
        assert_ne!(
            words[2],
            ns_link("self", "user"),
            "the host's user namespace"
        );
        listener.set_nonblocking(true).unwrap();
        assert!(
            listener.accept().is_ok(),
            "the server accepts the job's connection"
        );
    }
}
