//! Privileges: dropping every capability (the bounding set first, while CAP_SETPCAP is
//! still held), no_new_privs, and hardening the server process itself.

use caps::{CapSet, Capability};

/// Drop every capability of the calling thread: bounding (needs CAP_SETPCAP, so first),
/// ambient, inheritable, then effective and permitted. After this an exec — even of a
/// root-owned or setuid file as uid 0 — gains nothing.
pub fn drop_all_capabilities() -> Result<(), String> {
    let err = |set: &str, e: caps::errors::CapsError| {
        format!("cannot clear the {set} capability set: {e}")
    };
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false) {
        caps::clear(None, CapSet::Bounding).map_err(|e| err("bounding", e))?;
    }
    caps::clear(None, CapSet::Ambient).map_err(|e| err("ambient", e))?;
    caps::clear(None, CapSet::Inheritable).map_err(|e| err("inheritable", e))?;
    caps::clear(None, CapSet::Effective).map_err(|e| err("effective", e))?;
    caps::clear(None, CapSet::Permitted).map_err(|e| err("permitted", e))?;
    Ok(())
}

/// PR_SET_NO_NEW_PRIVS: no exec can ever grant privileges again (setuid, file caps).
pub fn set_no_new_privs() -> Result<(), String> {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(format!(
            "cannot set no_new_privs: {}",
            std::io::Error::last_os_error()
        ));
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
