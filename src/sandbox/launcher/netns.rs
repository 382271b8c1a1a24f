//! Network isolation, the launcher's step: a fresh network namespace for the job. With `network = none` it
//! has no interface up at all (sandbox-core's seccomp filter also refuses inet sockets);
//! with `loopback` its own `lo` is brought up, so the job can talk to itself but no
//! listener of the host (not even on 127.0.0.1) is reachable. With `proxy` the server
//! makes the namespace ([`namespace_with_listener`]: a short-lived thread unshares, brings
//! `lo` up and binds the broker's listener there) and the launcher joins it
//! ([`join_namespace`]). The server's jobs with `none` or `loopback` join namespaces
//! made ahead of need (by the runtime's pool, with [`make_namespace`]), each
//! used by one job only.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error(
        "cannot create a network namespace (unshare CLONE_NEWNET): {0}; the launcher needs CAP_SYS_ADMIN \
         (run the server as root, or in a user namespace) and a kernel with CONFIG_NET_NS"
    )]
    Unshare(io::Error),
    #[error(
        "cannot bring up the loopback interface in the job's network namespace: {step}: {source}"
    )]
    Loopback {
        step: &'static str,
        source: io::Error,
    },
    #[error("cannot make the broker's listener in the job's network namespace: {step}: {source}")]
    Listener {
        step: &'static str,
        source: io::Error,
    },
    #[error("cannot join the job's network namespace (setns): {0}")]
    Join(io::Error),
    #[error(
        "cannot make the broker's network namespace in a user namespace of its own (this \
         server has no CAP_SYS_ADMIN): {step}: {source}; allow unprivileged user namespaces \
         (kernel.unprivileged_userns_clone, user.max_user_namespaces, a container's seccomp \
         profile), or run the server as root with CAP_SYS_ADMIN"
    )]
    UserNamespace {
        step: &'static str,
        source: io::Error,
    },
    #[error(
        "cannot enter the user namespace that owns the broker's network namespace: {step}: {source}"
    )]
    JoinOwner {
        step: &'static str,
        source: io::Error,
    },
}

/// Launcher child (still privileged): move into the network namespace `netns`.
pub(crate) fn join_namespace(netns: &OwnedFd) -> Result<(), NetnsError> {
    // SAFETY: setns(2) on a descriptor we own; affects only this single-threaded process.
    if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(NetnsError::Join(io::Error::last_os_error()));
    }
    Ok(())
}

/// Launcher child (still privileged): move into a new network namespace, unless the
/// job's init made one for it (`made_by_init`, see `pidns::Hold`: this process is in it
/// already); bring `lo` up if asked.
pub(crate) fn isolate_network(loopback_up: bool, made_by_init: bool) -> Result<(), NetnsError> {
    // SAFETY: unshare(2) with a constant flag; affects only this (single-threaded) process.
    if !made_by_init && unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(NetnsError::Unshare(io::Error::last_os_error()));
    }
    if loopback_up {
        bring_up_loopback()?;
    }
    Ok(())
}

/// Move the calling thread (one of our own: the pool's, the broker's short-lived one)
/// into a new network namespace, `lo` up if asked; its descriptor keeps it alive.
pub(in crate::sandbox) fn make_namespace(loopback: bool) -> Result<OwnedFd, NetnsError> {
    // SAFETY: unshare(2) with a constant flag; it moves only this thread.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(NetnsError::Unshare(io::Error::last_os_error()));
    }
    if loopback {
        bring_up_loopback()?;
    }
    let ns = std::fs::File::open("/proc/thread-self/ns/net").map_err(NetnsError::Join)?;
    Ok(OwnedFd::from(ns))
}

/// `ip link set lo up` with two ioctls on a throwaway datagram socket. Raw syscalls
/// only (no allocation): the broker's helper calls it in a forked child of the server.
pub(in crate::sandbox) fn bring_up_loopback() -> Result<(), NetnsError> {
    let err = |step| move |source| NetnsError::Loopback { step, source };
    // SAFETY: plain socket(2); the descriptor is closed below on every path.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(err("socket")(io::Error::last_os_error()));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    let result = (|| {
        // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read/write the ifreq we own.
        if unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &mut req) } != 0 {
            return Err(err("SIOCGIFFLAGS")(io::Error::last_os_error()));
        }
        // SAFETY: ifru_flags is the active union member after SIOCGIFFLAGS.
        unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
        // SAFETY: as above; the kernel only reads the ifreq.
        if unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &req) } != 0 {
            return Err(err("SIOCSIFFLAGS")(io::Error::last_os_error()));
        }
        Ok(())
    })();
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(fd) };
    result
}
