//! Spool files: one append-only file per job stream, so a job's output lives on disk
//! and the server keeps only a few bytes of it in memory.
//!
//! Invariant: bytes below [`Spool::len`] are on disk (writes go straight to the file,
//! no user-space buffer) and never change, so readers can read any range below the
//! length they observed without holding the spool's lock.
//!
//! The file (and the job directory holding it) is created on the first append: a job
//! that prints nothing costs no file system work for its output. A missing spool file
//! reads as empty.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Whether `e` means the file system (or the user's quota on it) is full.
pub(crate) fn is_disk_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        || e.kind() == io::ErrorKind::StorageFull
}

/// One stream of one job.
#[derive(Debug)]
pub(crate) struct Spool {
    path: PathBuf,
    /// Bytes in the file.
    len: u64,
    /// Bytes the job wrote that were not stored (disk cap reached or a write error).
    dropped: u64,
    /// Set when the file system ran out of space: the length at that moment. Later
    /// output is dropped, so the spool is exactly "the output up to byte N".
    full_at: Option<u64>,
    /// Open once the job wrote something; closed when it finishes.
    file: Option<File>,
    /// Whether the job still runs (appends are accepted).
    open: bool,
    /// The last (up to 3) bytes written, to hold back a multibyte character that is
    /// only partly written.
    last: [u8; 3],
    last_len: u8,
}

impl Spool {
    /// The spool of a new job. Nothing is created on disk until the first append.
    pub(crate) fn create(path: PathBuf) -> Spool {
        Spool {
            path,
            len: 0,
            dropped: 0,
            full_at: None,
            file: None,
            open: true,
            last: [0; 3],
            last_len: 0,
        }
    }

    /// Create (or truncate) the file, and its directory if needed.
    fn open_file(&mut self) -> io::Result<&mut File> {
        if self.file.is_none() {
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let file = OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(&self.path)?;
            self.file = Some(file);
        }
        self.file
            .as_mut()
            .ok_or_else(|| io::Error::other("the spool file is not open"))
    }

    /// A finished job's spool whose length the index knows: no file system access (the
    /// start-up cost must not grow with the history).
    pub(crate) fn finished(path: PathBuf, len: u64) -> Spool {
        Spool {
            path,
            len,
            dropped: 0,
            full_at: None,
            file: None,
            open: false,
            last: [0; 3],
            last_len: 0,
        }
    }

    /// A finished job's spool found on disk at start-up (missing file = empty).
    pub(crate) fn existing(path: PathBuf) -> Spool {
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let mut spool = Spool::finished(path, len);
        let keep = len.min(3);
        let mut buf = [0u8; 3];
        if keep > 0
            && File::open(&spool.path)
                .and_then(|f| f.read_exact_at(&mut buf[..keep as usize], len - keep))
                .is_ok()
        {
            spool.remember_tail(&buf[..keep as usize]);
        }
        spool
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The length at which the file system ran out of space, if it did.
    pub(crate) fn full_at(&self) -> Option<u64> {
        self.full_at
    }

    /// Append `data`. On error nothing is counted as stored and the bytes are counted
    /// as dropped; the caller decides how to tell the user.
    pub(crate) fn append(&mut self, data: &[u8]) -> io::Result<()> {
        if !self.open {
            self.dropped += data.len() as u64;
            return Err(io::Error::other("the spool is closed"));
        }
        if self.full_at.is_some() {
            self.dropped += data.len() as u64;
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let len = self.len;
        let file = match self.open_file() {
            Ok(f) => f,
            Err(e) => {
                self.dropped += data.len() as u64;
                if is_disk_full(&e) {
                    self.full_at = Some(self.len);
                }
                return Err(e);
            }
        };
        // write_all may write part of the data before failing; keep `len` equal to
        // the file size by checking how far it got.
        match file.write_all(data) {
            Ok(()) => {
                self.len += data.len() as u64;
                self.remember_tail(data);
                Ok(())
            }
            Err(e) => {
                let on_disk = file.metadata().map(|m| m.len()).unwrap_or(len);
                let written = on_disk.saturating_sub(self.len).min(data.len() as u64);
                self.len += written;
                self.remember_tail(&data[..written as usize]);
                self.dropped += data.len() as u64 - written;
                if is_disk_full(&e) {
                    self.full_at = Some(self.len);
                }
                Err(e)
            }
        }
    }

    /// Whether the spool was closed (the job finished).
    pub(crate) fn is_closed(&self) -> bool {
        !self.open
    }

    /// Count bytes that were not stored (e.g. over the disk cap).
    pub(crate) fn drop_bytes(&mut self, n: u64) {
        self.dropped += n;
    }

    /// Close the file (the job finished).
    pub(crate) fn close(&mut self) {
        self.open = false;
        self.file = None;
    }

    /// How many trailing bytes form a UTF-8 character that is not complete yet.
    pub(crate) fn incomplete_tail(&self) -> u64 {
        crate::jobs::excerpt::incomplete_suffix_len(&self.last[..self.last_len as usize]) as u64
    }

    fn remember_tail(&mut self, data: &[u8]) {
        if data.len() >= 3 {
            self.last.copy_from_slice(&data[data.len() - 3..]);
            self.last_len = 3;
            return;
        }
        let mut joined = Vec::with_capacity(6);
        joined.extend_from_slice(&self.last[..self.last_len as usize]);
        joined.extend_from_slice(data);
        let keep = joined.len().min(3);
        self.last[..keep].copy_from_slice(&joined[joined.len() - keep..]);
        self.last_len = keep as u8;
    }
}

/// Read bytes `[offset, offset + len)` of a spool file (fewer if the file is shorter).
pub(crate) fn read_range(path: &Path, offset: u64, len: u64) -> io::Result<Vec<u8>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let file = match File::open(path) {
        Ok(f) => f,
        // Never written: the job printed nothing on this stream.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut buf = vec![0u8; len as usize];
    let mut got = 0usize;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::scratch_path;

    #[test]
    fn appends_are_readable_at_once_and_by_range() {
        let (_dir, path) = scratch_path("jobs-spool-append", "out");
        let mut s = Spool::create(path.clone());
        s.append(b"hello ").unwrap();
        s.append(b"world").unwrap();
        assert_eq!(s.len(), 11);
        assert_eq!(read_range(&path, 0, 11).unwrap(), b"hello world");
        assert_eq!(read_range(&path, 6, 100).unwrap(), b"world");
        assert_eq!(read_range(&path, 20, 5).unwrap(), b"");
        s.close();
        assert!(s.append(b"x").is_err());
        assert_eq!(s.dropped(), 1);
        let again = Spool::existing(path.clone());
        assert_eq!(again.len(), 11);
    }

    #[test]
    fn remembers_a_partial_multibyte_character() {
        let (_dir, path) = scratch_path("jobs-spool-utf8", "out");
        let mut s = Spool::create(path);
        let euro = "€".as_bytes(); // 3 bytes
        s.append(b"ab").unwrap();
        s.append(&euro[..1]).unwrap();
        assert_eq!(s.incomplete_tail(), 1);
        s.append(&euro[1..2]).unwrap();
        assert_eq!(s.incomplete_tail(), 2);
        s.append(&euro[2..]).unwrap();
        assert_eq!(s.incomplete_tail(), 0);
    }
}
