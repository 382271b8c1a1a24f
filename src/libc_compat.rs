//! The two libc wrappers the sandbox calls that glibc 2.17 lacks, as the system calls
//! they wrap: `close_range` (glibc 2.34) and `memfd_create` (glibc 2.27). The wheels are
//! linked against glibc 2.17 (manylinux2014: Ubuntu 20.04, Debian 11, RHEL 8), whose
//! libc has neither symbol; defined here, the binary links there and runs on any glibc.
//! On a newer glibc these definitions stand in for its own (the executable's symbol comes
//! first): the same system call, with errno set the same way by `syscall(2)`. The kernel
//! still decides what is supported (`close_range` needs Linux 5.9; the sandbox already
//! falls back where it fails).
//!
//! A leaf: nothing of the crate is imported, and nothing imports it; the linker finds
//! the symbols. Only for glibc targets (musl's libc crate has no `close_range`).

#![cfg(all(target_os = "linux", target_env = "gnu"))]

use libc::{c_char, c_int, c_long, c_uint};

/// `close_range(2)` by its system call number.
///
/// # Safety
/// As `close_range(2)`: closing descriptors others still use is the caller's concern.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    // SAFETY: the kernel validates the arguments; the call touches no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as c_long,
            last as c_long,
            flags as c_long,
        ) as c_int
    }
}

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
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    use libc::c_int;

    #[test]
    fn memfd_create_and_close_range_do_what_libc_would() {
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
        let raw = file.as_raw_fd() as libc::c_uint;
        // A dup far above anything open, closed by close_range; the memfd stays.
        // SAFETY: dup2 onto a descriptor number nothing else uses in this test process.
        let high = unsafe { libc::dup2(raw as c_int, 900) };
        assert_eq!(high, 900);
        // SAFETY: closes only 900..=901, which this test opened.
        assert_eq!(unsafe { libc::close_range(900, 901, 0) }, 0);
        // SAFETY: fcntl on a number, to see whether it is open.
        assert_eq!(unsafe { libc::fcntl(900, libc::F_GETFD) }, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EBADF)
        );
        // Errors come back as -1 with errno, as from libc: first > last is EINVAL.
        // SAFETY: invalid arguments, nothing is closed.
        assert_eq!(unsafe { libc::close_range(5, 4, 0) }, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EINVAL)
        );
        drop(file);
    }
}
