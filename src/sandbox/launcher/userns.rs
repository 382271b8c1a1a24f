//! The launcher's own user namespace, for a server without `CAP_SYS_ADMIN` (not root):
//! `unshare(CLONE_NEWUSER)` mapping only this process's own uid and gid (`setgroups`
//! denied first, as the kernel requires of an unprivileged `gid_map`), so that the PID
//! namespace, network namespace and mount view that follow are made exactly as root
//! makes them, but owned by this namespace. The job keeps its uid (no root inside:
//! `RLIMIT_NPROC` binds it), and every capability the namespace gave is dropped before
//! exec as always. Root with `CAP_SYS_ADMIN` never takes this path: its behaviour is
//! unchanged. Root without it (a container's default capabilities) takes it too, mapping
//! uid 0 to itself.
//!
//! A proxy-mode job joins the broker's network namespace, which a server without
//! `CAP_SYS_ADMIN` makes in a user namespace of a short-lived helper's own
//! (`parent::netns`): the launcher then enters that user namespace ([`join_owner_of`])
//! instead of making one, and builds the job's other namespaces there.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use caps::{CapSet, Capability};

/// Whether the launcher should make its namespaces inside a user namespace of its own:
/// without `CAP_SYS_ADMIN` (which would make them directly), root or not.
pub(crate) fn wanted() -> bool {
    !caps::has_cap(None, CapSet::Effective, Capability::CAP_SYS_ADMIN).unwrap_or(false)
}

/// `NS_GET_USERNS` (`_IO(0xb7, 0x1)`, linux/nsfs.h): a descriptor of the user namespace
/// that owns a namespace.
const NS_GET_USERNS: libc::c_ulong = 0xb701;

/// Enter the user namespace that owns the network namespace `netns` (made by the
/// server's helper, `parent::netns`): this process's effective uid owns it, so it may,
/// and gains every capability there, which joining `netns` and making the job's PID
/// namespace and mount view in it need. Single-threaded callers only.
pub(crate) fn join_owner_of(netns: RawFd) -> Result<(), (&'static str, io::Error)> {
    // SAFETY: an ioctl on a namespace descriptor the caller owns; it returns a new one.
    let fd = unsafe { libc::ioctl(netns, NS_GET_USERNS as _) };
    if fd < 0 {
        return Err(("ioctl NS_GET_USERNS", io::Error::last_os_error()));
    }
    // SAFETY: the kernel just opened this descriptor for us.
    let owner = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: setns(2) on a descriptor we own, in a single-threaded process.
    if unsafe { libc::setns(fd, libc::CLONE_NEWUSER) } != 0 {
        return Err(("setns CLONE_NEWUSER", io::Error::last_os_error()));
    }
    drop(owner);
    Ok(())
}

/// The three files written after the unshare, in the kernel's required order, for a
/// process whose effective uid and gid are `uid`, `gid`: each maps the id to itself.
pub(crate) fn maps(uid: u32, gid: u32) -> [(&'static str, String); 3] {
    [
        ("/proc/self/setgroups", "deny".to_string()),
        ("/proc/self/uid_map", format!("{uid} {uid} 1\n")),
        ("/proc/self/gid_map", format!("{gid} {gid} 1\n")),
    ]
}

/// Enter a new user namespace that maps this process's own uid and gid. Single-threaded
/// callers only (the kernel refuses `CLONE_NEWUSER` in a multi-threaded process).
/// The error names the step: `unshare CLONE_NEWUSER` (user namespaces disabled or
/// refused, e.g. `kernel.unprivileged_userns_clone = 0`, `user.max_user_namespaces = 0`,
/// or a container's seccomp profile), or the map file that could not be written.
pub(crate) fn enter() -> Result<(), (String, io::Error)> {
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // SAFETY: unshare(2) with a constant flag in a single-threaded process.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER) } != 0 {
        return Err(("unshare CLONE_NEWUSER".into(), io::Error::last_os_error()));
    }
    // A non-dumpable process's /proc/self files belong to root, so it cannot write its
    // own maps: the server makes itself non-dumpable (`harden_current_process`) and a
    // zygote's fork inherits that. Dumpable only while the maps are written.
    let dumpable = Dumpable::for_a_moment();
    for (file, line) in maps(uid, gid) {
        std::fs::write(file, line.as_bytes()).map_err(|e| (format!("write {file}"), e))?;
    }
    drop(dumpable);
    Ok(())
}

/// `PR_SET_DUMPABLE` 1 until dropped, then back to what it was.
pub(crate) struct Dumpable(libc::c_int);

impl Dumpable {
    pub(crate) fn for_a_moment() -> Dumpable {
        // SAFETY: prctl with integer arguments, affecting only this process.
        unsafe {
            let was = libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0);
            libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
            Dumpable(was)
        }
    }
}

impl Drop for Dumpable {
    fn drop(&mut self) {
        if self.0 >= 0 && self.0 != 1 {
            // SAFETY: as above.
            unsafe { libc::prctl(libc::PR_SET_DUMPABLE, self.0, 0, 0, 0) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_id_maps_to_itself_and_setgroups_is_denied_first() {
        let m = maps(65534, 100);
        assert_eq!(m[0], ("/proc/self/setgroups", "deny".to_string()));
        assert_eq!(m[1], ("/proc/self/uid_map", "65534 65534 1\n".to_string()));
        assert_eq!(m[2], ("/proc/self/gid_map", "100 100 1\n".to_string()));
    }
}
