//! Closing descriptor ranges, the one libc wrapper the sandbox calls that not every libc
//! has: `close_range(2)` is declared by the libc crate for glibc only (a musl build has no
//! such function) and is missing from glibc before 2.34 (the manylinux2014 wheels link
//! against 2.17). Called by its system call number, it is the same on all of them.

use libc::{c_int, c_long, c_uint};

/// `close_range(2)`: close `first..=last`; 0, or -1 with errno (Linux ≥ 5.9).
///
/// # Safety
/// As `close_range(2)`: closing descriptors others in the process still use is the
/// caller's concern.
pub(crate) unsafe fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
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

#[cfg(test)]
mod tests {
    use super::close_range;

    #[test]
    fn closes_the_range_and_reports_errors_as_libc_would() {
        let file = std::fs::File::open("/dev/null").unwrap();
        let raw = std::os::fd::AsRawFd::as_raw_fd(&file);
        // SAFETY: dup2 onto numbers nothing else in this test process uses.
        assert_eq!(unsafe { libc::dup2(raw, 910) }, 910);
        // SAFETY: closes only 910..=911, which this test opened.
        assert_eq!(unsafe { close_range(910, 911, 0) }, 0);
        // SAFETY: fcntl on a number, to see whether it is open.
        assert_eq!(unsafe { libc::fcntl(910, libc::F_GETFD) }, -1);
        // SAFETY: invalid arguments (first > last): nothing is closed.
        assert_eq!(unsafe { close_range(5, 4, 0) }, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EINVAL)
        );
    }
}
