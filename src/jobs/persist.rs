//! The job table on disk: one record per job (`<job>/job.json`, written atomically:
//! temp file, then rename; no fsync: it must survive a server restart, not a power
//! cut), the spools and result next to it, and the lock that keeps two servers from
//! sharing one store directory. Writing one small record per change keeps the cost of
//! starting and finishing a job constant however many jobs the store holds.
//!
//! Starting a job costs one `write`: its record is appended to `started.log`, so a job
//! that was running when the server died comes back as `lost`. Its directory, spools
//! and `job.json` appear only with its first output or when it finishes (a quick cell
//! that prints nothing writes its directory once, at finish). The log is rewritten
//! with only the running jobs when it grows, after prune or eviction (so removed jobs
//! do not come back), and at open.
//!
//! Layout of a store directory:
//! ```text
//! <state_dir>/jobs/            (or jobs.2, jobs.3, ... when another server holds jobs/)
//!   .lock                      flock held for the life of the store
//!   next_id                    the next job number (so pruned ids are not reused)
//!   started.log                one JobRecord (JSON) per line, appended as jobs start
//!   j12/job.json               JobRecord (below)
//!   j12/stdout, j12/stderr     spools
//!   j12/result.json            the job's structured result, if any
//! ```

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
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
const JOURNAL: &str = "started.log";

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
    /// Whether `result.json` exists.
    pub has_result: bool,
    /// Set by [`load`] when the record came from `started.log` only (its `job.json` is
    /// missing): it must be written before the log is next rewritten.
    #[serde(skip)]
    pub from_journal: bool,
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
}

impl Journal {
    pub(crate) fn open(store_dir: &Path) -> io::Result<Journal> {
        let path = store_dir.join(JOURNAL);
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        Ok(Journal {
            path,
            file,
            lines: 0,
        })
    }

    /// Append one record (a single `write`; no fsync).
    pub(crate) fn append(&mut self, rec: &JobRecord) -> io::Result<()> {
        let mut bytes = serde_json::to_vec(rec).map_err(io::Error::other)?;
        bytes.push(b'\n');
        self.lines += 1;
        self.file.write_all(&bytes)
    }

    pub(crate) fn needs_compaction(&self) -> bool {
        self.lines >= JOURNAL_COMPACT_LINES
    }

    /// Replace the log with `recs` (atomically) and keep appending to the new file.
    pub(crate) fn rewrite(&mut self, recs: &[JobRecord]) -> io::Result<()> {
        let mut bytes = Vec::new();
        for rec in recs {
            serde_json::to_writer(&mut bytes, rec).map_err(io::Error::other)?;
            bytes.push(b'\n');
        }
        write_atomic(&self.path, &bytes)?;
        self.file = OpenOptions::new().append(true).open(&self.path)?;
        self.lines = recs.len() as u64;
        Ok(())
    }
}

/// Records of `started.log` by job number (a damaged line, e.g. cut by a crash, is
/// skipped).
fn read_journal(store_dir: &Path) -> BTreeMap<u64, JobRecord> {
    let mut out = BTreeMap::new();
    let Ok(bytes) = std::fs::read(store_dir.join(JOURNAL)) else {
        return out;
    };
    for line in bytes.split(|b| *b == b'\n') {
        if let Some((seq, rec)) = serde_json::from_slice::<JobRecord>(line)
            .ok()
            .filter(|r| r.version == RECORD_VERSION)
            .and_then(|r| Some((parse_id(&r.id)?, r)))
        {
            out.insert(seq, rec);
        }
    }
    out
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

/// Run `write`; if the disk is full, release the store's reserve and try once more.
pub(crate) fn with_reserve<T>(
    store_dir: &Path,
    mut write: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    match write() {
        Err(e) if super::spool::is_disk_full(&e) && release_reserve(store_dir) => {
            tracing::warn!(dir = %store_dir.display(), "the state directory is full; using the space reserved for job records");
            write()
        }
        other => other,
    }
}

/// Write one job's record atomically: readers see the old or the new record.
/// Creates the job's directory if it does not exist yet.
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
    let tmp = path.with_extension("tmp");
    let written = File::create(&tmp).and_then(|mut file| file.write_all(bytes));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path)
}

/// `"j12"` (also `"J12"`, `"12"`) → 12.
pub(crate) fn parse_id(id: &str) -> Option<u64> {
    let id = id.trim();
    let digits = id.strip_prefix(['j', 'J']).unwrap_or(id);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Write a job's structured result next to its spools.
pub(crate) fn save_result(job_dir: &Path, value: &serde_json::Value) -> io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(io::Error::other)?;
    std::fs::create_dir_all(job_dir)?;
    std::fs::write(job_dir.join("result.json"), bytes)
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

    fn state(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("jobs-persist-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        p
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
        }
    }

    #[test]
    fn save_then_load_round_trips() {
        let s = state("roundtrip");
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
        let s = state("corrupt");
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
    fn started_log_brings_back_jobs_without_a_record_and_skips_torn_lines() {
        let s = state("journal");
        let dir = open_dir(&s).unwrap();
        let mut journal = Journal::open(&dir.path).unwrap();
        let mut running = record("j7");
        running.status = JobStatus::Running;
        journal.append(&running).unwrap();
        journal.append(&record("j8")).unwrap();
        // j8 also has its own record, which wins; a crash cut the last line.
        std::fs::create_dir_all(job_dir(&dir.path, "j8")).unwrap();
        let mut done = record("j8");
        done.label = "from job.json".into();
        save_record(&job_dir(&dir.path, "j8"), &done).unwrap();
        journal
            .file
            .write_all(b"{\"version\":1,\"id\":\"j9\"")
            .unwrap();
        let logged = JobRecord {
            from_journal: true,
            ..running.clone()
        };
        assert_eq!(load(&dir.path), (vec![logged, done], 9));
        // Rewriting keeps only what it is given.
        journal.rewrite(&[]).unwrap();
        assert_eq!(load(&dir.path).0.len(), 1);
    }

    #[test]
    fn second_open_gets_its_own_directory() {
        let s = state("slots");
        let a = open_dir(&s).unwrap();
        let b = open_dir(&s).unwrap();
        assert_eq!(a.path, s.join("jobs"));
        assert_eq!(b.path, s.join("jobs.2"));
        drop(a);
        let c = open_dir(&s).unwrap();
        assert_eq!(c.path, s.join("jobs"));
    }
}
