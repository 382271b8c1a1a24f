//! The job table on disk: `<state_dir>/jobs/table.json` (written atomically: temp
//! file, fsync, rename), one directory per job holding its spools and result, and
//! the lock that keeps two servers from sharing one table.
//!
//! Layout of a store directory:
//! ```text
//! <state_dir>/jobs/            (or jobs.2, jobs.3, ... when another server holds jobs/)
//!   .lock                      flock held for the life of the store
//!   table.json                 Table (below)
//!   j12/stdout, j12/stderr     spools
//!   j12/result.json            the job's structured result, if any
//! ```

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::{JobError, JobKind, JobStatus};

/// Current table format.
const TABLE_VERSION: u32 = 1;
/// How many store directories to try when others are locked by running servers.
const MAX_SLOTS: u32 = 16;

/// One job as stored on disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct JobRecord {
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
}

/// The whole table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Table {
    pub version: u32,
    /// Next job number, so ids are never reused within a store directory.
    pub next_id: u64,
    pub jobs: Vec<JobRecord>,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            version: TABLE_VERSION,
            next_id: 1,
            jobs: Vec::new(),
        }
    }
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

/// Load the table. A missing table is empty; an unreadable one is set aside (renamed
/// to `table.json.corrupt`) with a warning so the server still starts.
pub(crate) fn load(store_dir: &Path) -> Table {
    let path = store_dir.join("table.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Table::default(),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "could not read the job table; starting empty");
            return Table::default();
        }
    };
    match serde_json::from_str::<Table>(&text) {
        Ok(t) if t.version == TABLE_VERSION => t,
        Ok(t) => {
            tracing::warn!(
                version = t.version,
                "job table has an unknown format version; setting it aside"
            );
            set_aside(&path);
            Table::default()
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "job table does not parse; setting it aside");
            set_aside(&path);
            Table::default()
        }
    }
}

fn set_aside(path: &Path) {
    let _ = std::fs::rename(path, path.with_extension("json.corrupt"));
}

/// Write the table atomically: readers see the old or the new table, never a mix.
pub(crate) fn save(store_dir: &Path, table: &Table) -> io::Result<()> {
    let path = store_dir.join("table.json");
    let tmp = store_dir.join("table.json.tmp");
    let bytes = serde_json::to_vec(table).map_err(io::Error::other)?;
    let mut file = File::create(&tmp)?;
    file.write_all(&bytes)?;
    file.sync_data()?;
    drop(file);
    std::fs::rename(&tmp, &path)
}

/// Write a job's structured result next to its spools.
pub(crate) fn save_result(job_dir: &Path, value: &serde_json::Value) -> io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(io::Error::other)?;
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

    #[test]
    fn save_then_load_round_trips() {
        let s = state("roundtrip");
        let dir = open_dir(&s).unwrap();
        let table = Table {
            version: TABLE_VERSION,
            next_id: 3,
            jobs: vec![JobRecord {
                id: "j2".into(),
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
            }],
        };
        save(&dir.path, &table).unwrap();
        assert_eq!(load(&dir.path), table);
    }

    #[test]
    fn corrupt_table_is_set_aside() {
        let s = state("corrupt");
        let dir = open_dir(&s).unwrap();
        std::fs::write(dir.path.join("table.json"), "{not json").unwrap();
        assert_eq!(load(&dir.path), Table::default());
        assert!(dir.path.join("table.json.corrupt").exists());
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
