//! The libc wrapper the sandbox calls that glibc 2.17 lacks, as the system call it
//! wraps: `memfd_create` (glibc 2.27). The wheels are linked against glibc 2.17
//! (manylinux2014: Ubuntu 20.04, Debian 11, RHEL 8), whose libc has no such symbol;
//! defined here, the binary links there and runs on any glibc. On a newer glibc this
//! definition stands in for its own (the executable's symbol comes first): the same
//! system call, with errno set the same way by `syscall(2)`. (`close_range`, glibc 2.34
//! and glibc-only in the libc crate, is called by its number in `sandbox/launcher/fds.rs`.)
//!
//! A leaf: nothing of the crate is imported, and nothing imports it; the linker finds
//! the symbol. Only for glibc targets (musl has `memfd_create` itself).

#![cfg(all(target_os = "linux", target_env = "gnu"))]

use libc::{c_char, c_int, c_long, c_uint};

/// `memfd_create(2)` by its system call number.
///
/// # Safety
/// `name` must point to a NUL-terminated string (the kernel reads it).
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn memfd_create(name: *const c_char, flags: c_uint) -> c_int {
    // SAFETY: the caller passes a NUL-terminated name; the kernel copies it and checks
    // the flags.
    unsafe { libc::syscall(libc::SYS_memfd_create, name, flags as c_long) as c_int }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{FromRawFd, OwnedFd};

    #[test]
    fn memfd_create_does_what_libc_would() {
        // Called as the sandbox calls them, through the libc crate's declarations (in
        // this binary the names resolve to the definitions above).
        // SAFETY: a static NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"compat".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        // SAFETY: fd was just created and is ours.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut file = std::fs::File::from(owned);
        std::io::Write::write_all(&mut file, b"x").unwrap();
        assert_eq!(file.metadata().unwrap().len(), 1);
        drop(file);
    }
}
