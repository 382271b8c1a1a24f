//! The job table on disk: one append-only index of job records (`index.log`, JSON
//! lines; the last line of a job wins, a `removed` line drops it), the spools and result
//! of each job in its own directory, and the lock that keeps two servers from sharing
//! one store directory. No fsync: the table must survive a server restart, not a power cut.
//!
//! A job costs one appended line when it starts (so a job running when the server dies
//! comes back as `lost`) and one when it finishes; its directory appears only with its
//! first output or a structured result over [`INLINE_RESULT_MAX`] bytes (a quick cell that
//! prints nothing touches no other file: its small result is in its index line). Opening a store reads nothing; the table is read from the one index file (never
//! the job directories) on first use or on a thread of its own (see `JobStore::open`); exit
//! appends only the records that changed since they were last written. The index is rewritten with
//! the live records when dead lines outnumber them (amortised: never per job), and
//! removals (prune, retention, the disk cap) append one `removed` line each.
//!
//! Why a hand-kept JSON-lines file and not an embedded database (redb, SQLite): the access
//! pattern is append-one-record and read-everything-once at start-up, which a log does
//! with one `write` per change and one sequential read; a B-tree store would add a crate,
//! a file format to migrate and page writes per commit for no query the store needs (the
//! table is in memory while the server runs). Reading it off the start-up path (lazily,
//! prefetched on a thread) keeps start-up independent of the history without a store that
//! answers lookups from disk.
//!
//! Layout of a store directory:
//! ```text
//! <state_dir>/jobs/            (or jobs.2, jobs.3, ... when another server holds jobs/)
//!   .lock                      flock held for the life of the store
//!   .reserve                   space set aside for records when the disk is full
//!   next_id                    the next job number (so pruned ids are not reused)
//!   index.log                  one JobRecord (JSON) per line, appended on every change
//!   j12-k3f9q/stdout, .../stderr   spools (a job's directory is its id)
//!   j12-k3f9q/result.json      the job's structured result, if any and over 512 bytes
//!                              (a smaller one is in the job's index line)
//! ```
//! Stores written by older servers (`started.log` and a `job.json` per job) are read once
//! and turned into an index.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::{JobError, JobKind, JobStatus};

/// Current record format.
pub(crate) const RECORD_VERSION: u32 = 1;
/// How many store directories to try when others are locked by running servers.
const MAX_SLOTS: u32 = 16;
/// Lines in `started.log` after which it is rewritten with only the running jobs.
const JOURNAL_COMPACT_LINES: u64 = 2048;
const JOURNAL: &str = "index.log";
/// The log of started jobs of older servers (read once, when there is no index yet).
const LEGACY_JOURNAL: &str = "started.log";

/// One job as stored on disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct JobRecord {
    pub version: u32,
    pub id: String,
    pub kind: JobKind,
    pub session: Option<String>,
    pub label: String,
    pub status: JobStatus,
    pub prompt: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub message: Option<String>,
    pub created_unix_ms: u64,
    pub elapsed_ms: u64,
    /// Delivered cursors of stdout and stderr.
    pub delivered: [u64; 2],
    /// Whether the job has a structured result (in `result.json`, or in `result` below).
    pub has_result: bool,
    /// Set by [`load`] when the record came from `started.log` only (its `job.json` is
    /// missing): it must be written before the log is next rewritten.
    #[serde(skip)]
    pub from_journal: bool,
    /// Bytes in the stdout and stderr spools when the record was written (absent in
    /// records of older servers: then the files are looked at).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<[u64; 2]>,
    /// A line saying the job was removed (pruned, evicted, past retention).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
    /// The job's structured result when it is small ([`INLINE_RESULT_MAX`]), as JSON
    /// text: stored in the line itself, not in `result.json` (`has_result` is true either
    /// way). Text, not a JSON value: reading an index of 10,000 such jobs then builds no
    /// values (the result is parsed only when a call reads it), and a record is written
    /// from the text kept in memory without serialising it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_json: Option<String>,
}

/// An open store directory, locked for this process.
pub(crate) struct StoreDir {
    pub path: PathBuf,
    _lock: Flock<File>,
}

/// Lock the first free store directory under `state_dir`: `jobs`, then `jobs.2`, ...
/// A second server on the same state dir gets its own table instead of marking the
/// first one's running jobs lost.
pub(crate) fn open_dir(state_dir: &Path) -> Result<StoreDir, JobError> {
    for slot in 1..=MAX_SLOTS {
        let name = if slot == 1 {
            "jobs".to_string()
        } else {
            format!("jobs.{slot}")
        };
        let path = state_dir.join(name);
        std::fs::create_dir_all(&path).map_err(|e| {
            JobError::io(
                format!("could not create the job directory {}", path.display()),
                e,
            )
        })?;
        let lock_path = path.join(".lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| JobError::io(format!("could not open {}", lock_path.display()), e))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => {
                if slot > 1 {
                    tracing::info!(dir = %path.display(), "another server holds the first job directory; using this one");
                }
                return Ok(StoreDir { path, _lock: lock });
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => continue,
            Err((_, errno)) => {
                return Err(JobError::io(
                    format!("could not lock {}", lock_path.display()),
                    errno.into(),
                ));
            }
        }
    }
    Err(JobError::io(
        format!(
            "all {MAX_SLOTS} job directories under {} are in use by other servers",
            state_dir.display()
        ),
        io::Error::from(io::ErrorKind::ResourceBusy),
    ))
}

/// Directory of one job's files.
pub(crate) fn job_dir(store_dir: &Path, id: &str) -> PathBuf {
    store_dir.join(id)
}

/// The log of started jobs (see the module docs), open for appending.
pub(crate) struct Journal {
    path: PathBuf,
    file: File,
    lines: u64,
    /// While a rewrite runs outside the lock ([`Journal::begin_rewrite`]): the lines
    /// appended since it began (they are in the old file too), for the new file's end.
    tail: Option<Vec<u8>>,
    /// The new file, from [`Journal::switch_rewrite`] until it has the log's name: every
    /// line goes to both files, so whichever has the name after a crash has them all.
    next: Option<File>,
    /// The file's length as this process wrote it (`None`: not known, read it).
    end: Option<u64>,
    /// Up to where (an offset) [`keep_room`](Self::keep_room) has allocated blocks.
    reserved_to: u64,
}

/// A rewrite of the index under way: the new file, written without holding the
/// journal's lock (see [`Journal::begin_rewrite`]).
pub(crate) struct Rewrite {
    tmp: PathBuf,
    /// The log's path.
    log: PathBuf,
    /// Lines in the new file when it was switched to.
    lines: u64,
    /// The journal's line count then (lines appended since are in both files).
    from: u64,
}

impl Journal {
    /// Open the index for appending; `lines` is how many it holds (from [`load`]).
    pub(crate) fn open(store_dir: &Path, lines: u64) -> io::Result<Journal> {
        let path = store_dir.join(JOURNAL);
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        Ok(Journal {
            path,
            file,
            lines,
            tail: None,
            next: None,
            end: None,
            reserved_to: 0,
        })
    }

    /// Append one record (a single `write`; no fsync).
    pub(crate) fn append(&mut self, rec: &JobRecord) -> io::Result<()> {
        let mut bytes = serde_json::to_vec(rec).map_err(io::Error::other)?;
        bytes.push(b'\n');
        self.lines += 1;
        let written = self.file.write_all(&bytes);
        self.end = match (written.is_ok(), self.end) {
            (true, Some(end)) => Some(end + bytes.len() as u64),
            _ => None, // a partial write: look again
        };
        written?;
        if let Some(tail) = &mut self.tail {
            tail.extend_from_slice(&bytes);
        }
        if let Some(next) = &mut self.next {
            next.write_all(&bytes)?;
        }
        Ok(())
    }

    /// Keep at least `bytes` allocated past the journal's end (`fallocate` with
    /// `KEEP_SIZE`: the size stays, the blocks are ours), so that appends up to that much
    /// never need new space. Fails with `ENOSPC` when the disk has no room for it.
    /// Allocates [`ROOM_SLACK`] more when it can, and does nothing while what it allocated
    /// before still covers `bytes` past the end: the call is on the way of every new job
    /// (a stat and an `fallocate`, ~7 µs here, now about once per 200 jobs).
    pub(crate) fn keep_room(&mut self, bytes: u64) -> io::Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let end = match self.end {
            Some(end) => end,
            None => self.file.metadata()?.len(),
        };
        self.end = Some(end);
        if end + bytes <= self.reserved_to {
            return Ok(());
        }
        let reserved = keep_room(&self.file, bytes + ROOM_SLACK)
            .map(|()| bytes + ROOM_SLACK)
            .or_else(|_| keep_room(&self.file, bytes).map(|()| bytes))?;
        self.reserved_to = end + reserved;
        Ok(())
    }

    /// Count `n` more lines (those the index held when it was read).
    pub(crate) fn add_lines(&mut self, n: u64) {
        self.lines += n;
    }

    /// Whether dead lines outnumber the `live` records enough to rewrite the index.
    pub(crate) fn needs_compaction(&self, live: usize) -> bool {
        self.lines >= JOURNAL_COMPACT_LINES + 2 * live as u64
    }

    /// Start a rewrite that runs without this lock: from now on appended lines are kept
    /// for the new file's end as well. The caller collects the records (after this, so
    /// none is older than the lines kept), writes them with [`Rewrite::write`] unlocked,
    /// then [`switch_rewrite`](Self::switch_rewrite) (locked), [`Rewrite::rename`]
    /// (unlocked) and [`place_rewrite`](Self::place_rewrite) (locked). Slow file-system
    /// work (writing the records, the rename, closing the old file, which frees its
    /// blocks) is done without the lock, so appends of new jobs never wait for it.
    /// `None` when one is already under way.
    pub(crate) fn begin_rewrite(&mut self) -> Option<PathBuf> {
        if self.tail.is_some() || self.next.is_some() {
            return None;
        }
        self.tail = Some(Vec::new());
        Some(self.path.clone())
    }

    /// The records are written: the lines appended since go to the new file's end, and
    /// from now on every line goes to both files. On an error the rewrite ends (the old
    /// log stays, and nothing more goes to the new file).
    pub(crate) fn switch_rewrite(
        &mut self,
        rewrite: io::Result<Rewrite>,
        room: u64,
    ) -> io::Result<Rewrite> {
        let tail = self.tail.take().unwrap_or_default();
        let mut rewrite = rewrite?;
        let opened = (|| {
            let mut file = OpenOptions::new().append(true).open(&rewrite.tmp)?;
            file.write_all(&tail)?;
            keep_room(&file, room)?;
            Ok(file)
        })();
        match opened {
            Ok(file) => {
                self.next = Some(file);
                rewrite.lines += tail.iter().filter(|b| **b == b'\n').count() as u64;
                rewrite.from = self.lines;
                Ok(rewrite)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&rewrite.tmp);
                Err(e)
            }
        }
    }

    /// After [`Rewrite::rename`]: appends go to the new file alone. Returns the old file,
    /// for the caller to close after letting go of the lock (closing the replaced log
    /// frees its blocks, which took 70 ms under load here).
    pub(crate) fn place_rewrite(
        &mut self,
        rewrite: &Rewrite,
        renamed: io::Result<()>,
    ) -> io::Result<Option<File>> {
        let next = self.next.take();
        renamed?;
        let Some(next) = next else {
            return Ok(None);
        };
        // The new file's lines: the records and tail, and each line appended since.
        self.lines = rewrite.lines + self.lines.saturating_sub(rewrite.from);
        // Its length and allocation are read again at the next `keep_room`.
        self.end = None;
        self.reserved_to = 0;
        Ok(Some(std::mem::replace(&mut self.file, next)))
    }

    /// Replace the log with `recs` (atomically) and keep appending to the new file. The
    /// records are streamed to the file one at a time: a rewrite of a long table does not
    /// hold the whole index in memory (which the allocator would keep as RSS).
    /// `room`: bytes kept allocated past the new file's end ([`keep_room`](Self::keep_room));
    /// without them the rewrite fails and the old log stays.
    #[cfg(test)]
    pub(crate) fn rewrite(
        &mut self,
        recs: impl IntoIterator<Item = JobRecord>,
        room: u64,
    ) -> io::Result<()> {
        let log = self
            .begin_rewrite()
            .ok_or_else(|| io::Error::other("a rewrite of the job index is under way"))?;
        let written = Rewrite::write(log, recs);
        let rewrite = self.switch_rewrite(written, room)?;
        let renamed = rewrite.rename();
        self.place_rewrite(&rewrite, renamed).map(drop)
    }
}

impl Rewrite {
    /// Give the new file the log's name. On an error the new file is removed and the
    /// old log stays.
    pub(crate) fn rename(&self) -> io::Result<()> {
        std::fs::rename(&self.tmp, &self.log).inspect_err(|_| {
            let _ = std::fs::remove_file(&self.tmp);
        })
    }

    /// Write `recs`, one at a time, to a new file beside `log` (the path
    /// [`Journal::begin_rewrite`] returned).
    pub(crate) fn write(
        log: PathBuf,
        recs: impl IntoIterator<Item = JobRecord>,
    ) -> io::Result<Rewrite> {
        let tmp = log.with_extension("tmp");
        let mut lines = 0;
        let written = File::create(&tmp).and_then(|file| {
            let mut out = BufWriter::new(file);
            for rec in recs {
                serde_json::to_writer(&mut out, &rec).map_err(io::Error::other)?;
                out.write_all(b"\n")?;
                lines += 1;
            }
            out.flush()
        });
        match written {
            Ok(()) => Ok(Rewrite {
                log,
                tmp,
                lines,
                from: 0,
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }
}

/// Records of a log file by job number: the last line of a job wins, a `removed` line
/// drops it, a damaged line (e.g. cut by a crash) is skipped. Also returns the number of
/// lines and the highest job number seen (removed jobs included).
///
/// Read from the end, so that the lines a later line of the same job supersedes (most of
/// them: a job has a line when it starts and one when it ends) are recognised by their
/// first bytes and never parsed.
fn read_journal_file(path: &Path) -> (BTreeMap<u64, JobRecord>, u64, u64) {
    let mut out = BTreeMap::new();
    let (mut lines, mut max_seq) = (0, 0);
    let Ok(bytes) = std::fs::read(path) else {
        return (out, lines, max_seq);
    };
    let prefix = format!("{{\"version\":{RECORD_VERSION},\"id\":\"j");
    // Jobs whose last valid line was seen (kept, or removed).
    let mut decided = std::collections::HashSet::new();
    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()).rev() {
        lines += 1;
        if line_seq(line, prefix.as_bytes()).is_some_and(|seq| decided.contains(&seq)) {
            continue;
        }
        let Some((seq, rec)) = serde_json::from_slice::<JobRecord>(line)
            .ok()
            .filter(|r| r.version == RECORD_VERSION)
            .and_then(|r| Some((parse_id(&r.id)?, r)))
        else {
            continue;
        };
        if !decided.insert(seq) {
            continue;
        }
        max_seq = max_seq.max(seq);
        if !rec.removed {
            out.insert(seq, rec);
        }
    }
    (out, lines, max_seq)
}

/// The job number of a record line from its first bytes (`prefix`, then the digits of
/// the id up to its random part: the fields are written in declaration order), or None if it does not start so.
fn line_seq(line: &[u8], prefix: &[u8]) -> Option<u64> {
    let rest = line.strip_prefix(prefix)?;
    let end = rest.iter().position(|b| *b == b'"' || *b == b'-')?;
    let digits = &rest[..end];
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// Records of the legacy `started.log` by job number.
fn read_journal(store_dir: &Path) -> BTreeMap<u64, JobRecord> {
    read_journal_file(&store_dir.join(LEGACY_JOURNAL)).0
}

/// What [`load`] found.
#[derive(Debug, PartialEq)]
pub(crate) struct Loaded {
    pub records: Vec<JobRecord>,
    pub next_id: u64,
    /// Lines in the index.
    pub lines: u64,
    /// Read from an older server's layout: write an index now.
    pub legacy: bool,
}

/// Whether the store directory has an index (else it is new, or an older server's). An
/// empty index counts as none: it may be the one a server created just before it died
/// converting an older layout, and an index with no lines holds no job anyway.
pub(crate) fn has_index(store_dir: &Path) -> bool {
    std::fs::metadata(store_dir.join(JOURNAL)).is_ok_and(|m| m.len() > 0)
}

/// Every job record of the store and the next job number: from the index if the store
/// `had_index` when it was opened, else (once, for a store of an older server) from its
/// job directories and `started.log`.
pub(crate) fn load_store(store_dir: &Path, had_index: bool) -> Loaded {
    let index = store_dir.join(JOURNAL);
    let next_file = std::fs::read_to_string(store_dir.join("next_id"))
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .unwrap_or(1);
    if had_index {
        let (map, lines, max_seq) = read_journal_file(&index);
        return Loaded {
            records: map.into_values().collect(),
            next_id: next_file.max(max_seq + 1),
            lines,
            legacy: false,
        };
    }
    let (records, next_id) = load(store_dir);
    // With nothing found there is nothing to convert: no rewrite of an empty index (and
    // of `next_id`) at every start of a server with no history.
    let legacy = !records.is_empty();
    Loaded {
        records,
        next_id,
        lines: 0,
        legacy,
    }
}

/// Remove what an older server's layout leaves once its records are in the index.
pub(crate) fn remove_legacy(store_dir: &Path, records: &[JobRecord]) {
    let _ = std::fs::remove_file(store_dir.join(LEGACY_JOURNAL));
    for rec in records {
        let _ = std::fs::remove_file(job_dir(store_dir, &rec.id).join("job.json"));
    }
}

/// Every job record under `store_dir`, and the next job number. A job directory
/// without a readable record (a crash between creating it and writing the record, or
/// a damaged file) is removed with a warning, unless `started.log` knows the job (it
/// was running: its output is kept).
pub(crate) fn load(store_dir: &Path) -> (Vec<JobRecord>, u64) {
    let mut records = Vec::new();
    let mut started = read_journal(store_dir);
    let mut next_id = std::fs::read_to_string(store_dir.join("next_id"))
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .unwrap_or(1);
    let Ok(entries) = std::fs::read_dir(store_dir) else {
        return (records, next_id);
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let Some(seq) = name.to_str().and_then(parse_id) else {
            continue;
        };
        if !path.is_dir() {
            continue;
        }
        next_id = next_id.max(seq + 1);
        let rec = std::fs::read(path.join("job.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<JobRecord>(&b).ok())
            .filter(|r| r.version == RECORD_VERSION && parse_id(&r.id) == Some(seq));
        let from_log = || {
            started.remove(&seq).map(|mut r| {
                r.from_journal = true;
                r
            })
        };
        match rec.or_else(from_log) {
            Some(rec) => {
                started.remove(&seq);
                records.push(rec);
            }
            None => {
                tracing::warn!(dir = %path.display(), "job directory without a valid record; removing it");
                remove_job_files(&path);
            }
        }
    }
    // Started jobs that never wrote anything: they come back too.
    for (seq, mut rec) in started {
        next_id = next_id.max(seq + 1);
        rec.from_journal = true;
        records.push(rec);
    }
    records.sort_by_key(|r| parse_id(&r.id));
    (records, next_id)
}

/// Room kept past the journal's end for each unfinished job's records (its end line, and
/// a few changes on the way: a line is a few hundred bytes).
pub(crate) const RECORD_ROOM: u64 = 4096;

/// Below this much free space in the state dir new jobs are refused: the disk is full.
pub(crate) const MIN_FREE_BYTES: u64 = 1 << 20;

/// Bytes free for us in the file system of `dir` (`None` if it cannot be asked).
pub(crate) fn free_bytes(dir: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(st.blocks_available() as u64 * st.fragment_size() as u64)
}

fn keep_room(file: &File, bytes: u64) -> io::Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    let end = file.metadata()?.len();
    nix::fcntl::fallocate(
        file,
        nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
        end as i64,
        bytes as i64,
    )
    .map_err(io::Error::from)
}

/// What [`Journal::keep_room`] allocates beyond what it is asked for (~200 records).
const ROOM_SLACK: u64 = 64 * 1024;

/// Space set aside in each store directory (`.reserve`) so that the records of jobs can
/// still be written when job output has filled the file system: released when a record
/// write finds the disk full, taken again once there is room.
const RESERVE_BYTES: i64 = 512 * 1024;
const RESERVE: &str = ".reserve";

/// Set the reserve aside if it is not there; whether it is.
pub(crate) fn take_reserve(store_dir: &Path) -> bool {
    let path = store_dir.join(RESERVE);
    if std::fs::metadata(&path).is_ok_and(|m| m.len() as i64 >= RESERVE_BYTES) {
        return true;
    }
    let made = File::create(&path)
        .and_then(|f| nix::fcntl::posix_fallocate(&f, 0, RESERVE_BYTES).map_err(io::Error::from));
    if made.is_err() {
        let _ = std::fs::remove_file(&path);
    }
    made.is_ok()
}

/// Give the reserve back to the file system; whether there was one.
pub(crate) fn release_reserve(store_dir: &Path) -> bool {
    std::fs::remove_file(store_dir.join(RESERVE)).is_ok()
}

/// Run `write`; if the disk is full, release the store's reserve (setting `released`)
/// and try once more.
pub(crate) fn with_reserve<T>(
    store_dir: &Path,
    released: &std::sync::atomic::AtomicBool,
    mut write: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    match write() {
        Err(e) if super::spool::is_disk_full(&e) && release_reserve(store_dir) => {
            released.store(true, std::sync::atomic::Ordering::SeqCst);
            tracing::warn!(dir = %store_dir.display(), "the state directory is full; using the space reserved for job records");
            write()
        }
        other => other,
    }
}

/// Write one job's record atomically: readers see the old or the new record.
/// Creates the job's directory if it does not exist yet.
#[cfg(test)]
pub(crate) fn save_record(job_dir: &Path, rec: &JobRecord) -> io::Result<()> {
    std::fs::create_dir_all(job_dir)?;
    let bytes = serde_json::to_vec(rec).map_err(io::Error::other)?;
    write_atomic(&job_dir.join("job.json"), &bytes)
}

/// Remember the next job number (after prune or eviction removed the newest jobs).
pub(crate) fn save_next_id(store_dir: &Path, next_id: u64) -> io::Result<()> {
    write_atomic(&store_dir.join("next_id"), next_id.to_string().as_bytes())
}

fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with(path, |out| out.write_all(bytes))
}

/// Write a file through `write` to a temporary name, then rename it over `path`: readers
/// see the old or the new file, never a part.
fn write_atomic_with(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>,
) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let written = File::create(&tmp).and_then(|file| {
        let mut out = BufWriter::new(file);
        write(&mut out)?;
        out.flush()
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path)
}

/// The job number of a job id: `"j12-k3f9q"` (also `"J12-K3F9Q"`, `"12-k3f9q"`, and
/// `"j12"` as older servers wrote ids) → 12. Numbers order jobs; only the whole id names one
/// (see [`same_id`]).
pub(crate) fn parse_id(id: &str) -> Option<u64> {
    let id = id.trim();
    let rest = id.strip_prefix(['j', 'J']).unwrap_or(id);
    let digits = rest.split_once('-').map_or(rest, |(digits, _)| digits);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether `given` (what a caller typed) names the job whose id is `id`: the whole id,
/// random part included, case and the leading `j` aside. A job number alone (`j12`)
/// names only a job of an older server whose id had no random part.
pub(crate) fn same_id(given: &str, id: &str) -> bool {
    let key = |s: &str| {
        let s = s.trim();
        s.strip_prefix(['j', 'J']).unwrap_or(s).to_ascii_lowercase()
    };
    key(given) == key(id)
}

/// Lowercase letters and digits without the look-alikes (i, l, o, u): Crockford's base32.
const TAG_ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";
/// Characters of the random part of job ids.
pub(crate) const TAG_LEN: usize = 5;

/// The random part of the ids of the jobs a store makes while it is open: drawn anew
/// each time a server opens its state directory, so an id from another server, another
/// state directory or an earlier run of this one never names a job made now, even if
/// the job numbers meet (a copied volume, a lost `next_id`). 25 bits, 5 characters.
pub(crate) fn draw_tag() -> String {
    let mut bytes = [0u8; TAG_LEN];
    if let Err(e) = getrandom::fill(&mut bytes) {
        // Not expected on Linux; the clock and pid still differ between servers.
        tracing::warn!("no random bytes for job ids ({e}); using the clock and pid");
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ (u64::from(std::process::id()) << 32);
        bytes = std::array::from_fn(|i| (nanos >> (i * 5)) as u8);
    }
    bytes
        .iter()
        .map(|b| TAG_ALPHABET[usize::from(b % 32)] as char)
        .collect()
}

/// The longest structured result (bytes of JSON) stored in the job's index line instead
/// of a `result.json` of its own: a trivial cell's result (~250 bytes) then costs no
/// directory and no file — a job that prints nothing touches only the index (measured:
/// the directory and the file were ~15 % of the server's CPU time per trivial
/// `python_exec`). The record stays far below [`RECORD_ROOM`], and the text is kept in
/// memory while the job is (see `ResultSlot`): at most this much per kept job.
pub(crate) const INLINE_RESULT_MAX: usize = 512;

/// `value`'s JSON text if it is at most [`INLINE_RESULT_MAX`] bytes (serialising a larger
/// one stops at the limit).
pub(crate) fn inline_text(value: &serde_json::Value) -> Option<Box<str>> {
    struct Capped(Vec<u8>);
    impl Write for Capped {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            if self.0.len() + b.len() > INLINE_RESULT_MAX {
                return Err(io::Error::other("over the inline limit"));
            }
            self.0.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut out = Capped(Vec::with_capacity(64));
    serde_json::to_writer(&mut out, value).ok()?;
    String::from_utf8(out.0).ok().map(String::into_boxed_str)
}

/// Write a job's structured result (its JSON text) next to its spools.
pub(crate) fn save_result(job_dir: &Path, text: &str) -> io::Result<()> {
    std::fs::create_dir_all(job_dir)?;
    std::fs::write(job_dir.join("result.json"), text)
}

/// Read a job's structured result, if it has one.
pub(crate) fn load_result(job_dir: &Path) -> Option<serde_json::Value> {
    let bytes = std::fs::read(job_dir.join("result.json")).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Remove a job's files.
pub(crate) fn remove_job_files(job_dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(job_dir)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %job_dir.display(), error = %e, "could not remove job files");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::scratch_path;

    /// A record of job `id` as it is while the job runs.
    fn running_record(id: &str) -> JobRecord {
        JobRecord {
            status: JobStatus::Running,
            ..record(id)
        }
    }

    fn record(id: &str) -> JobRecord {
        JobRecord {
            version: RECORD_VERSION,
            id: id.into(),
            kind: JobKind::Shell,
            session: None,
            label: "echo hi".into(),
            status: JobStatus::Completed,
            prompt: None,
            exit_code: Some(0),
            signal: None,
            message: None,
            created_unix_ms: 5,
            elapsed_ms: 7,
            delivered: [3, 0],
            has_result: false,
            from_journal: false,
            bytes: None,
            removed: false,
            result_json: None,
        }
    }

    #[test]
    fn save_then_load_round_trips() {
        let (_scratch, s) = scratch_path("jobs-persist-roundtrip", "state");
        let dir = open_dir(&s).unwrap();
        for id in ["j10", "j2"] {
            std::fs::create_dir_all(job_dir(&dir.path, id)).unwrap();
            save_record(&job_dir(&dir.path, id), &record(id)).unwrap();
        }
        assert_eq!(load(&dir.path), (vec![record("j2"), record("j10")], 11));
        save_next_id(&dir.path, 20).unwrap();
        assert_eq!(load(&dir.path).1, 20);
    }

    #[test]
    fn directories_without_a_valid_record_are_removed() {
        let (_scratch, s) = scratch_path("jobs-persist-corrupt", "state");
        let dir = open_dir(&s).unwrap();
        let broken = job_dir(&dir.path, "j3");
        std::fs::create_dir_all(&broken).unwrap();
        std::fs::write(broken.join("job.json"), "{not json").unwrap();
        let bare = job_dir(&dir.path, "j4");
        std::fs::create_dir_all(&bare).unwrap();
        assert_eq!(load(&dir.path), (vec![], 5));
        assert!(!broken.exists() && !bare.exists());
    }

    #[test]
    fn legacy_started_log_brings_back_jobs_without_a_record_and_skips_torn_lines() {
        let (_scratch, s) = scratch_path("jobs-persist-journal", "state");
        let dir = open_dir(&s).unwrap();
        let running = running_record("j7");
        let mut log = Vec::new();
        for rec in [&running, &record("j8")] {
            serde_json::to_writer(&mut log, rec).unwrap();
            log.push(b'\n');
        }
        // A crash cut the last line.
        log.extend_from_slice(b"{\"version\":1,\"id\":\"j9\"");
        std::fs::write(dir.path.join(LEGACY_JOURNAL), log).unwrap();
        // j8 also has its own record, which wins.
        let mut done = record("j8");
        done.label = "from job.json".into();
        save_record(&job_dir(&dir.path, "j8"), &done).unwrap();
        let logged = JobRecord {
            from_journal: true,
            ..running.clone()
        };
        // A server that died converting it left an empty index: still converted.
        std::fs::write(dir.path.join(JOURNAL), "").unwrap();
        let loaded = load_store(&dir.path, has_index(&dir.path));
        assert!(loaded.legacy);
        assert_eq!(
            (loaded.records.clone(), loaded.next_id),
            (vec![logged, done], 9)
        );
        remove_legacy(&dir.path, &loaded.records);
        assert!(!dir.path.join(LEGACY_JOURNAL).exists());
        assert!(!job_dir(&dir.path, "j8").join("job.json").exists());
    }

    #[test]
    fn index_last_line_wins_removed_lines_drop_and_ids_are_not_reused() {
        let (_scratch, s) = scratch_path("jobs-persist-index", "state");
        let dir = open_dir(&s).unwrap();
        let mut index = Journal::open(&dir.path, 0).unwrap();
        let running = running_record("j1");
        index.append(&running).unwrap();
        index.append(&record("j2")).unwrap();
        index.append(&record("j1")).unwrap();
        let mut gone = record("j3");
        index.append(&gone).unwrap();
        gone.removed = true;
        index.append(&gone).unwrap();
        index
            .file
            .write_all(b"{\"version\":1,\"id\":\"j4\"")
            .unwrap();
        let loaded = load_store(&dir.path, has_index(&dir.path));
        assert!(!loaded.legacy);
        assert_eq!(loaded.records, vec![record("j1"), record("j2")]);
        assert_eq!((loaded.next_id, loaded.lines), (4, 6));
        // Rewriting keeps only what it is given.
        index.rewrite([record("j2")], 4096).unwrap();
        let loaded = load_store(&dir.path, has_index(&dir.path));
        assert_eq!((loaded.records, loaded.lines), (vec![record("j2")], 1));
        assert!(index.needs_compaction(0) == (JOURNAL_COMPACT_LINES <= 1));
    }

    #[test]
    fn lines_appended_while_a_rewrite_runs_unlocked_reach_the_new_index() {
        let (_scratch, s) = scratch_path("jobs-persist-rewrite", "state");
        let dir = open_dir(&s).unwrap();
        let mut index = Journal::open(&dir.path, 0).unwrap();
        index.append(&running_record("j1")).unwrap();
        index.append(&record("j2")).unwrap();
        let log = index.begin_rewrite().unwrap();
        assert!(index.begin_rewrite().is_none(), "one rewrite at a time");
        // What the table held when the rewrite began; then j1 ends and j3 starts.
        let written = Rewrite::write(log, [running_record("j1"), record("j2")]);
        index.append(&record("j1")).unwrap();
        index.append(&running_record("j3")).unwrap();
        // Until the new file is in place, the old one has every line.
        assert_eq!(load_store(&dir.path, true).records.len(), 3);
        let rewrite = index.switch_rewrite(written, 4096).unwrap();
        // Between the switch and the rename a line goes to both files: a crash then
        // finds it under the log's name whichever file has it.
        index.append(&record("j3")).unwrap();
        assert_eq!(load_store(&dir.path, true).records[2], record("j3"));
        let renamed = rewrite.rename();
        assert!(index.begin_rewrite().is_none(), "still under way");
        let old = index.place_rewrite(&rewrite, renamed).unwrap();
        assert!(
            old.is_some(),
            "the old file is handed back, to close unlocked"
        );
        let loaded = load_store(&dir.path, true);
        assert_eq!(
            loaded.records,
            vec![record("j1"), record("j2"), record("j3")]
        );
        assert_eq!((loaded.lines, index.lines), (5, 5));
        // Appends go to the new file, and the next rewrite may start.
        index.append(&running_record("j4")).unwrap();
        assert_eq!(load_store(&dir.path, true).records[3], running_record("j4"));
        assert!(index.begin_rewrite().is_some());
    }

    #[test]
    fn a_record_line_names_its_job_in_its_first_bytes() {
        let prefix = format!("{{\"version\":{RECORD_VERSION},\"id\":\"j");
        let line = serde_json::to_vec(&record("j42")).unwrap();
        assert_eq!(line_seq(&line, prefix.as_bytes()), Some(42));
        for other in [
            &br#"{"version":2,"id":"j42""#[..],
            br#"{"id":"j42","version":1}"#,
            br#"{"version":1,"id":"j""#,
            br#"{"version":1,"id":"j4x2""#,
            br#"{"version":1,"id":"j42"#,
        ] {
            assert_eq!(line_seq(other, prefix.as_bytes()), None, "{other:?}");
        }
    }

    /// Superseded lines are skipped without being parsed, but only when a later line of
    /// the job was valid: a torn last line leaves the one before it in force.
    #[test]
    fn a_torn_last_line_leaves_the_previous_record_of_its_job() {
        let (_scratch, s) = scratch_path("jobs-persist-torn-last", "state");
        let dir = open_dir(&s).unwrap();
        let mut index = Journal::open(&dir.path, 0).unwrap();
        let running = running_record("j1");
        index.append(&running).unwrap();
        index.append(&record("j2")).unwrap();
        let mut line = serde_json::to_vec(&record("j1")).unwrap();
        line.truncate(line.len() - 5);
        index.file.write_all(&line).unwrap();
        let loaded = load_store(&dir.path, true);
        assert_eq!(loaded.records, vec![running, record("j2")]);
        assert_eq!((loaded.next_id, loaded.lines), (3, 3));
    }

    #[test]
    fn second_open_gets_its_own_directory() {
        let (_scratch, s) = scratch_path("jobs-persist-slots", "state");
        let a = open_dir(&s).unwrap();
        let b = open_dir(&s).unwrap();
        assert_eq!(a.path, s.join("jobs"));
        assert_eq!(b.path, s.join("jobs.2"));
        drop(a);
        let c = open_dir(&s).unwrap();
        assert_eq!(c.path, s.join("jobs"));
    }

    /// `keep_room` allocates ahead and skips the call while that still covers the room,
    /// but the room past the end is there after every append, across a rewrite too.
    #[test]
    fn room_is_kept_past_every_append() {
        use std::os::unix::fs::MetadataExt;

        let (_scratch, s) = scratch_path("jobs-persist-room", "state");
        let dir = open_dir(&s).unwrap();
        let mut index = Journal::open(&dir.path, 0).unwrap();
        let room = |index: &Journal| {
            let m = index.file.metadata().unwrap();
            // Allocated bytes past the end (blocks are allocated from the start here).
            (m.blocks() * 512).saturating_sub(m.len())
        };
        for round in 0..2 {
            for i in 0..600 {
                index.append(&record(&format!("j{i}"))).unwrap();
                index.keep_room(3 * RECORD_ROOM).unwrap();
                assert!(room(&index) >= 3 * RECORD_ROOM, "round {round}, append {i}");
            }
            index.rewrite([record("j1")], 0).unwrap();
        }
    }
}
