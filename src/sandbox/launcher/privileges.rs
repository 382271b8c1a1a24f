//! Privileges: dropping every capability (the bounding set first, while CAP_SETPCAP is
//! still held), no_new_privs, and hardening the server process itself.

use caps::{CapSet, Capability};

use super::error::SetupError;

/// Drop every capability of the calling thread: bounding (needs CAP_SETPCAP, so first),
/// ambient, inheritable, then effective and permitted. After this an exec — even of a
/// root-owned or setuid file as uid 0 — gains nothing.
pub(crate) fn drop_all_capabilities() -> Result<(), SetupError> {
    let err = |set: &'static str| move |source| SetupError::Capabilities { set, source };
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false) {
        clear_bounding_set().map_err(err("bounding"))?;
    }
    caps::clear(None, CapSet::Ambient).map_err(err("ambient"))?;
    caps::clear(None, CapSet::Inheritable).map_err(err("inheritable"))?;
    caps::clear(None, CapSet::Effective).map_err(err("effective"))?;
    caps::clear(None, CapSet::Permitted).map_err(err("permitted"))?;
    Ok(())
}

/// Drop every capability the kernel has from the bounding set, numbers 0 up until the
/// kernel answers EINVAL (past its last one): one `prctl` per capability, with no
/// `PR_CAPBSET_READ` before each as `caps::clear` does, and none left out that this
/// build of the `caps` crate does not know.
fn clear_bounding_set() -> Result<(), caps::errors::CapsError> {
    for cap in 0..64 {
        // SAFETY: prctl with integer arguments, affecting only this thread.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } == 0 {
            continue;
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINVAL) && cap > 0 {
            return Ok(());
        }
        return Err(format!("PR_CAPBSET_DROP of capability {cap}: {e}").into());
    }
    Ok(())
}

/// PR_SET_NO_NEW_PRIVS: no exec can ever grant privileges again (setuid, file caps).
pub(crate) fn set_no_new_privs() -> Result<(), SetupError> {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(SetupError::NoNewPrivs(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Make the calling (server) process non-dumpable so that sandboxed processes of the
/// same uid cannot read its /proc/<pid>/environ, cmdline, maps or mem, nor ptrace it.
/// Call once at server start.
pub fn harden_current_process() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// In a child (the test process keeps its capabilities): afterwards the bounding set
    /// is empty as `/proc/self/status` shows it, and no capability is left to drop.
    #[test]
    fn the_bounding_set_is_emptied() {
        // SAFETY: fork in a test; the child only makes syscalls, reads a file and _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let ok = super::clear_bounding_set().is_ok()
                && std::fs::read_to_string("/proc/self/status")
                    .unwrap_or_default()
                    .lines()
                    .any(|l| l == "CapBnd:\t0000000000000000");
            // SAFETY: _exit in the forked child.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) }
        }
        let mut status = 0;
        // SAFETY: waitpid of our own child with a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
}
