//! Bytes in an anonymous file: how a launch spec reaches a re-executed launcher, and a
//! large request the zygote.

use std::io::{Seek, Write};
use std::os::fd::{FromRawFd, OwnedFd};

/// `bytes` in an anonymous close-on-exec file, positioned at offset 0.
pub(super) fn bytes_memfd(json: &[u8]) -> std::io::Result<OwnedFd> {
    // SAFETY: memfd_create with a static NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"launch-spec".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor we own.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.write_all(json)?;
    file.rewind()?;
    Ok(OwnedFd::from(file))
}
