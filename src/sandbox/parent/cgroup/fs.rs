//! Where job cgroups go and the file-system steps every cgroup operation shares.

use std::io::{ErrorKind, Read};
use std::path::Path;

use crate::sandbox::launcher::cgroup::CgroupError;

/// Directory created under the server's own cgroup to hold job cgroups.
pub(crate) const PARENT_DIR: &str = "mcp-sandbox-repl";
/// v2 only: the leaf the server moves itself into.
pub(crate) const SERVER_LEAF: &str = "mcp-sandbox-repl.server";

pub(super) fn io<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

pub(super) fn mkdir_ok_exists(dir: &Path) -> Result<(), CgroupError> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(CgroupError::Io {
            action: "create",
            path: dir.to_path_buf(),
            source: e,
        }),
    }
}

/// First buffer for [`read_kernel_file`]: larger than the /proc and cgroup files read
/// before a job starts (`/proc/self/mountinfo` of a container is a few KiB).
const KERNEL_FILE_FIRST_READ: usize = 8 * 1024;

/// The whole text of a /proc or cgroupfs file. Such files stat as size 0, so
/// `std::fs::read_to_string` reads them in probing steps (32, 32, 64, 128 ... bytes:
/// eight reads for a 1.7 KiB mountinfo); here one read into a buffer sized for them,
/// then the read that sees the end (a file larger than the buffer is read in more,
/// growing steps: a read may return less than asked before the end).
pub(crate) fn read_kernel_file(path: &Path) -> std::io::Result<String> {
    read_all_from(std::fs::File::open(path)?, KERNEL_FILE_FIRST_READ)
}

fn read_all_from(mut file: impl Read, first: usize) -> std::io::Result<String> {
    let mut buf: Vec<u8> = Vec::with_capacity(first);
    loop {
        if buf.len() == buf.capacity() {
            buf.reserve(buf.capacity().max(first));
        }
        let len = buf.len();
        buf.resize(buf.capacity(), 0);
        match file.read(&mut buf[len..]) {
            Ok(0) => {
                buf.truncate(len);
                break;
            }
            Ok(n) => buf.truncate(len + n),
            Err(e) if e.kind() == ErrorKind::Interrupted => buf.truncate(len),
            Err(e) => return Err(e),
        }
    }
    String::from_utf8(buf).map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out at most `step` bytes a call, counting its calls.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
        calls: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            self.calls += 1;
            let n = self.data.len().min(self.step).min(out.len());
            out[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    /// A file larger than the first buffer, and one returned in short reads, come back
    /// whole: only a read of 0 bytes ends it.
    #[test]
    fn whole_file_past_the_first_buffer_and_short_reads() {
        let text: String = (0..5000).map(|i| format!("line {i}\n")).collect();
        let mut r = Trickle {
            data: text.as_bytes(),
            step: usize::MAX,
            calls: 0,
        };
        assert_eq!(read_all_from(&mut r, 64).unwrap(), text);
        let mut r = Trickle {
            data: text.as_bytes(),
            step: 1000,
            calls: 0,
        };
        assert_eq!(read_all_from(&mut r, 4096).unwrap(), text);
        assert!(r.calls > text.len() / 1000, "read on past short reads");
    }

    /// The machine's own files come back as std reads them.
    #[test]
    fn proc_files_read_whole() {
        for path in [
            "/proc/self/mountinfo",
            "/proc/self/cgroup",
            "/proc/self/status",
        ] {
            let ours = read_kernel_file(Path::new(path)).unwrap();
            let std = std::fs::read_to_string(path).unwrap();
            // Both are snapshots of the same (unchanging) file of this process.
            assert_eq!(ours.lines().next(), std.lines().next(), "{path}");
            assert_eq!(ours.lines().count(), std.lines().count(), "{path}");
        }
    }
}
