//! Handles: names a caller gives a job besides its id (the server layer's MCP task ids),
//! kept so that a handle given before a restart still names its job after it. One JSON
//! line per handle in `handles.log` of the store directory, appended when the handle is
//! given; read on the first lookup, when lines whose job is gone (pruned, evicted, past
//! retention) are dropped and the file rewritten. A handle names at most one job.

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
    map: Mutex<Option<HashMap<String, HandleRecord>>>,
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
    fn handle_map(&self) -> std::sync::MutexGuard<'_, Option<HashMap<String, HandleRecord>>> {
        let mut guard = lock(&self.handles.map);
        if guard.is_none() {
            let path = self.handles_path();
            let (mut map, lines) = read(&path);
            map.retain(|_, rec| self.get(&rec.job).is_ok());
            if map.len() < lines
                && let Err(e) = rewrite(&path, &map)
            {
                tracing::debug!(path = %path.display(), error = %e, "could not rewrite the job handles");
            }
            *guard = Some(map);
        }
        guard
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
        if let Some(map) = guard.as_mut() {
            map.insert(rec.handle.clone(), rec);
        }
        Ok(())
    }

    /// The job `handle` names, if that job is still kept.
    pub fn job_of_handle(&self, handle: &str) -> Option<HandleRecord> {
        let guard = self.handle_map();
        let rec = guard.as_ref()?.get(handle)?.clone();
        drop(guard);
        self.get(&rec.job).is_ok().then_some(rec)
    }
}
