//! The session's start-up hook: site directories (a venv's site-packages) that every
//! new worker of the session puts on `sys.path` before its first cell — a fresh worker
//! after a restart or crash and the idle spare alike.
//!
//! The hook is one `add_site_dirs` request sent right after the worker is spawned (or,
//! for a spare, when it is put in reserve), so the worker's request order runs it before
//! any cell. It leaves the namespace and the cell count alone. A failure (a directory
//! that no longer exists) is logged; the worker stays usable.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use super::Session;
use crate::repl::error::ReplError;
use crate::repl::protocol::{Event, Request};
use crate::repl::worker::{Reply, Worker};

impl Session {
    /// Set the directories new workers of this session add with `site.addsitedir`
    /// (replacing the earlier set). Applies to the idle spare at once and to every
    /// worker started from now on; the running worker is left as it is (run the
    /// equivalent code as a cell to change it, as the server does after an install).
    pub fn set_site_dirs(&self, dirs: Vec<PathBuf>) {
        let mut inner = self.inner();
        if inner.site_dirs == dirs {
            return;
        }
        inner.site_dirs = dirs;
        if let Some(spare) = inner.spare.clone() {
            self.apply_site_dirs(&spare, &inner.site_dirs);
        }
    }

    /// Add `dirs` to the running worker now (starting one if there is none), as the
    /// start-up hook does for new workers: no cell, so the history, the cell count and
    /// the namespace are left alone (an install is not something the user ran).
    pub async fn add_site_dirs_now(&self, dirs: &[PathBuf]) -> Result<(), ReplError> {
        let dirs: Vec<String> = dirs
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect();
        match self.call(|id| Request::AddSiteDirs { id, dirs }).await? {
            Event::Ok { .. } => Ok(()),
            other => Err(super::variables::unexpected("ok", &other)),
        }
    }

    /// The directories every new worker of this session adds to `sys.path`.
    pub fn site_dirs(&self) -> Vec<PathBuf> {
        self.inner().site_dirs.clone()
    }

    /// Send the hook to a new worker (nothing if `dirs` is empty). Call it before the
    /// worker is handed out, so it runs ahead of any cell.
    pub(super) fn apply_site_dirs(&self, worker: &Worker, dirs: &[PathBuf]) {
        if dirs.is_empty() {
            return;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let req = Request::AddSiteDirs {
            id,
            dirs: dirs
                .iter()
                .map(|d| d.to_string_lossy().into_owned())
                .collect(),
        };
        let rx = worker.call(id, &req, None, None);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let session = self.name.clone();
        rt.spawn(async move {
            if let Ok(Reply::Event(Event::Failed { message, .. })) = rx.await {
                tracing::warn!(%session, %message, "the session's site directories were not all added");
            }
        });
    }
}
