//! Privileges: dropping every capability (the bounding set first, while CAP_SETPCAP is
//! still held), no_new_privs, and hardening the server process itself.

use caps::{CapSet, Capability};

use super::error::SetupError;

/// Drop every capability of the calling thread: bounding (needs CAP_SETPCAP, so first),
/// ambient, inheritable, then effective and permitted. After this an exec — even of a
/// root-owned or setuid file as uid 0 — gains nothing.
pub fn drop_all_capabilities() -> Result<(), SetupError> {
    let err = |set: &'static str| move |source| SetupError::Capabilities { set, source };
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false) {
        caps::clear(None, CapSet::Bounding).map_err(err("bounding"))?;
    }
    caps::clear(None, CapSet::Ambient).map_err(err("ambient"))?;
    caps::clear(None, CapSet::Inheritable).map_err(err("inheritable"))?;
    caps::clear(None, CapSet::Effective).map_err(err("effective"))?;
    caps::clear(None, CapSet::Permitted).map_err(err("permitted"))?;
    Ok(())
}

/// PR_SET_NO_NEW_PRIVS: no exec can ever grant privileges again (setuid, file caps).
pub fn set_no_new_privs() -> Result<(), SetupError> {
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
