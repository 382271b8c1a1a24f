//! Raw system-call wrappers the mount view is built with (`mount`, `pivot_root`,
//! `openat2` without symlinks, `mkdirat`), each returning `io::Result`.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `struct open_how` (linux/openat2.h).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)
}

/// mkdirat(dir, name) (existing is fine), then open it without following a symlink.
pub(super) fn mkdir_open(dir: &OwnedFd, name: &OsStr) -> io::Result<OwnedFd> {
    let c = CString::new(name.as_bytes()).map_err(io::Error::other)?;
    // SAFETY: mkdirat(2) relative to a directory descriptor we own.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) } != 0 {
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::AlreadyExists {
            return Err(err);
        }
    }
    open_beneath(Some(dir), Path::new(name), libc::O_DIRECTORY)
}

/// `openat2(dir, path, O_PATH | extra, RESOLVE_NO_SYMLINKS)`.
pub(super) fn open_beneath(
    dir: Option<&OwnedFd>,
    path: &Path,
    extra: libc::c_int,
) -> io::Result<OwnedFd> {
    let c = cstring(path)?;
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_CLOEXEC | extra) as u64,
        mode: 0,
        resolve: 0x04, // RESOLVE_NO_SYMLINKS
    };
    let at = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: openat2(2) with a valid path and an open_how of the size we pass.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            at,
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor openat2 just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

pub(super) fn pivot_root(new_root: &Path, put_old: &Path) -> io::Result<()> {
    let (a, b) = (cstring(new_root)?, cstring(put_old)?);
    // SAFETY: pivot_root(2) with two valid C strings.
    if unsafe { libc::syscall(libc::SYS_pivot_root, a.as_ptr(), b.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(super) fn mount(
    src: Option<impl AsRef<Path>>,
    dst: impl AsRef<Path>,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let to_c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other);
    let src = src.map(|s| to_c(s.as_ref())).transpose()?;
    let dst = to_c(dst.as_ref())?;
    let fstype = fstype
        .map(CString::new)
        .transpose()
        .map_err(io::Error::other)?;
    let data = data
        .map(CString::new)
        .transpose()
        .map_err(io::Error::other)?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: mount(2) with valid (or null) C strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            ptr(&src),
            dst.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
