//! What a cell hands its caller: output as it is printed (a [`CellSink`]), its
//! [`CellOutcome`] when it ends, and the `c<N>` names agents see for cells.

use std::time::Duration;

use serde::Serialize;

use tokio::sync::mpsc;

use super::protocol::{self, DisplayItem, PyError, Request};

/// Which of the worker's output streams a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutStream {
    Stdout,
    Stderr,
}

/// Receives what a running cell produces, as it happens. Called from the worker's I/O
/// task: implementations must not block (append to a buffer or a spool and return).
pub trait CellSink: Send + Sync {
    /// A chunk of output (arbitrary bytes; not split at lines, may split UTF-8).
    fn output(&self, stream: OutStream, data: &[u8]);
    /// The cell called `input(prompt)` and waits for [`Session::send_input`].
    fn awaiting_input(&self, prompt: &str);
    /// The same for a secret (`getpass`): the answer is not to be shown.
    fn awaiting_secret_input(&self, prompt: &str) {
        self.awaiting_input(prompt);
    }
    /// The pending `input()` got its text; the cell runs again.
    fn input_received(&self);
    /// The cell (R's `install.packages()`) asks for `packages` to be installed into the
    /// session library and waits for `answer`. Must not block: start the install and
    /// answer when it ends. By default installs are not offered here.
    fn install_packages(&self, packages: Vec<String>, answer: InstallAnswer) {
        let _ = packages;
        answer.send(
            false,
            "packages cannot be installed from this cell: call the env_install tool".into(),
        );
    }
}

/// The way back to a cell waiting in `install.packages()`: [`InstallAnswer::send`] writes
/// its `install_reply`. Dropped unsent, it answers that the install was abandoned, so the
/// cell never waits forever.
pub struct InstallAnswer {
    id: u64,
    requests: Option<mpsc::WeakUnboundedSender<Vec<u8>>>,
}

impl InstallAnswer {
    pub(super) fn new(id: u64, requests: mpsc::WeakUnboundedSender<Vec<u8>>) -> Self {
        InstallAnswer {
            id,
            requests: Some(requests),
        }
    }

    /// Answer the cell: the install ended, `ok` or not, `message` in words.
    pub fn send(mut self, ok: bool, message: String) {
        self.reply(ok, message);
    }

    fn reply(&mut self, ok: bool, message: String) {
        // A worker that is gone (its request channel closed) needs no answer.
        if let Some(tx) = self.requests.take().and_then(|w| w.upgrade()) {
            let _ = tx.send(protocol::encode(&Request::InstallReply {
                id: self.id,
                ok,
                message,
            }));
        }
    }
}

impl Drop for InstallAnswer {
    fn drop(&mut self) {
        if self.requests.is_some() {
            self.reply(false, "the install was abandoned before it ended".into());
        }
    }
}

/// How a cell ended.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum CellStatus {
    Ok,
    Error,
    Interrupted,
    /// The worker process ended while the cell ran (crash, limit, kill); state is lost.
    WorkerDied,
}

/// The result of one cell (`execute` or `run_file`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CellOutcome {
    /// Cell number in the session (1-based; restarts begin again at 1). Shown as `c<N>`.
    pub cell: u64,
    /// The cell whose state this one ran on (none: a fresh worker's empty state).
    pub parent: Option<u64>,
    /// Cells run again, in order, to rebuild the parent's state (its snapshot was gone).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replayed: Vec<u64>,
    pub status: CellStatus,
    /// repr of the last expression, if it was an expression with a non-None value.
    pub value: Option<String>,
    /// Full length of that repr in characters (`value` is cut in the middle when long).
    pub value_chars: Option<u64>,
    pub value_truncated: bool,
    pub error: Option<PyError>,
    /// Rich output: images (base64), HTML, markdown.
    pub display: Vec<DisplayItem>,
    /// Names the cell created or rebound (at most 100).
    pub new_variables: Vec<String>,
    /// How the worker ended, in words, when status is `worker_died`.
    pub worker_exit: Option<String>,
    /// Signal that ended the worker during this cell ("SIGSEGV"), when status is `worker_died`.
    pub signal: Option<String>,
    /// Exit code of a worker that exited during this cell, when status is `worker_died`.
    pub exit_code: Option<i32>,
    /// The session's variables are gone: the worker died during this cell, or state was
    /// lost before it (a crash, a cancel that killed the worker, an expiry) and this cell
    /// ran in a fresh worker.
    pub state_lost: bool,
    /// Why this cell ran in a fresh worker, in words (only for that case; a cell whose own
    /// worker died says so in `worker_exit`).
    pub state_note: Option<String>,
    /// What the network broker refused (proxy mode) since the session's previous cell,
    /// in words.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub denied: Vec<String>,
    #[serde(rename = "elapsed_ms", serialize_with = "as_millis")]
    pub elapsed: Duration,
}

fn as_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 1e6).round() / 1e3)
}

/// `c<N>`, the id agents see for cell N.
pub(crate) fn cell_name(cell: u64) -> String {
    format!("c{cell}")
}

pub(super) fn cell_id<S: serde::Serializer>(c: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&cell_name(*c))
}

pub(super) fn opt_cell_id<S: serde::Serializer>(c: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match c {
        Some(c) => s.serialize_str(&cell_name(*c)),
        None => s.serialize_none(),
    }
}

pub(super) fn cell_ids<S: serde::Serializer>(c: &[u64], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(c.iter().map(|c| cell_name(*c)))
}

/// A cell id as agents write it: `c7` (or `7`).
pub(crate) fn parse_cell(id: &str) -> Option<u64> {
    let t = id.trim();
    t.strip_prefix('c').unwrap_or(t).parse().ok()
}
