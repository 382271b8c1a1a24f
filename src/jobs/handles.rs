//! Handles: names a caller gives a job besides its id (the server layer's MCP task ids),
//! kept so that a handle given before a restart still names its job after it. One JSON
//! line per handle in `handles.log` of the store directory, appended when the handle is
//! given; read on the first lookup, when lines whose job is gone (pruned, evicted, past
//! retention) are dropped and the file rewritten — and again whenever the file holds more
//! than twice the lines of the handles live at its last rewrite (plus [`SLACK`]), so a long-running server's file
//! stays in proportion to the jobs it keeps. A handle names at most one job.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::job::{lock, now_unix_ms};
use super::{JobError, JobId, JobStore};

const FILE: &str = "handles.log";
/// Longest handle kept (MCP task ids are UUIDs: 36 characters).
const MAX_HANDLE: usize = 128;
/// Lines a file may hold beyond twice its live handles before it is rewritten.
const SLACK: usize = 64;

/// One handle as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HandleRecord {
    pub handle: String,
    pub job: JobId,
    /// When the handle was given.
    pub created_unix_ms: u64,
}

/// The handles of one store, read from its file on first use.
#[derive(Default)]
pub(crate) struct Handles {
    map: Mutex<Option<Loaded>>,
}

/// The handles in memory, the number of lines their file holds, and how many handles
/// were live when it was last compacted.
struct Loaded {
    map: HashMap<String, HandleRecord>,
    lines: usize,
    live: usize,
}

fn read(path: &Path) -> (HashMap<String, HandleRecord>, usize) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut map = HashMap::new();
    let mut lines = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        lines += 1;
        // A line cut by a crash is skipped.
        if let Ok(rec) = serde_json::from_str::<HandleRecord>(line) {
            map.insert(rec.handle.clone(), rec);
        }
    }
    (map, lines)
}

fn rewrite(path: &Path, map: &HashMap<String, HandleRecord>) -> std::io::Result<()> {
    let mut text = String::new();
    for rec in map.values() {
        text.push_str(&serde_json::to_string(rec).map_err(std::io::Error::other)?);
        text.push('\n');
    }
    let tmp = path.with_extension("log.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

impl JobStore {
    fn handles_path(&self) -> PathBuf {
        self.dir().join(FILE)
    }

    /// The handles, read from the file on first use (jobs that are gone dropped).
    fn handle_map(&self) -> std::sync::MutexGuard<'_, Option<Loaded>> {
        let mut guard = lock(&self.handles.map);
        if guard.is_none() {
            let (map, lines) = read(&self.handles_path());
            let mut loaded = Loaded {
                map,
                lines,
                live: 0,
            };
            self.compact(&mut loaded);
            *guard = Some(loaded);
        }
        guard
    }

    /// Drop the handles whose job is gone; rewrite the file if it holds more lines.
    fn compact(&self, loaded: &mut Loaded) {
        loaded.map.retain(|_, rec| self.get(&rec.job).is_ok());
        loaded.live = loaded.map.len();
        if loaded.map.len() < loaded.lines {
            let path = self.handles_path();
            match rewrite(&path, &loaded.map) {
                Ok(()) => loaded.lines = loaded.map.len(),
                Err(e) => {
                    tracing::debug!(path = %path.display(), error = %e, "could not rewrite the job handles")
                }
            }
        }
    }

    /// Name job `id` also by `handle`, durably (a restart keeps it while the job is kept).
    pub fn add_handle(self: &Arc<Self>, id: &str, handle: &str) -> Result<(), JobError> {
        if handle.is_empty() || handle.len() > MAX_HANDLE || handle.contains(['\n', '\r']) {
            return Err(JobError::Request(format!(
                "a job handle must be 1 to {MAX_HANDLE} characters on one line"
            )));
        }
        let job = self.get(id)?;
        let rec = HandleRecord {
            handle: handle.to_string(),
            job: job.id.clone(),
            created_unix_ms: now_unix_ms(),
        };
        let mut guard = self.handle_map();
        let mut line = serde_json::to_string(&rec)
            .map_err(|e| JobError::io("could not encode a job handle", std::io::Error::other(e)))?;
        line.push('\n');
        let path = self.handles_path();
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(|e| JobError::io(format!("could not write {}", path.display()), e))?;
        if let Some(loaded) = guard.as_mut() {
            loaded.map.insert(rec.handle.clone(), rec);
            loaded.lines += 1;
            if loaded.lines > 2 * loaded.live + SLACK {
                self.compact(loaded);
            }
        }
        Ok(())
    }

    /// The job `handle` names, if that job is still kept.
    pub fn job_of_handle(&self, handle: &str) -> Option<HandleRecord> {
        let guard = self.handle_map();
        let rec = guard.as_ref()?.map.get(handle)?.clone();
        drop(guard);
        self.get(&rec.job).is_ok().then_some(rec)
    }
}
