//! What a session reports about itself: its state and figures ([`SessionInfo`]) and its
//! history of cells ([`History`]).

use serde::Serialize;

use super::cell::{CellStatus, cell_id, cell_ids, opt_cell_id};
use super::protocol::VariableInfo;

/// What a session is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    Idle,
    Busy,
    AwaitingInput,
    /// No live worker (crashed or not started); the next cell starts a fresh one.
    Dead,
}

/// A session as `list` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct SessionInfo {
    pub name: String,
    pub state: SessionState,
    pub policy: String,
    pub python: String,
    /// The Python interpreter's pid, as the server's PID namespace numbers it (not the
    /// supervisor the launcher leaves outside the job's namespace).
    pub worker_pid: Option<u32>,
    /// Resident memory of the worker process (VmRSS), bytes.
    pub memory_bytes: Option<u64>,
    /// Memory charged to the session's process trees — the worker and every snapshot it
    /// holds for branching — read from their job cgroups, bytes; none without a memory
    /// cgroup. Snapshots share pages copy-on-write until they differ.
    pub held_memory_bytes: Option<u64>,
    pub idle_seconds: u64,
    pub cells: u64,
    /// Snapshots held for branching (forked processes sharing memory copy-on-write).
    pub snapshots: usize,
}

/// Whether a cell's state is held by a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotState {
    /// A snapshot holds it: branching from it is a fork.
    Held,
    /// No snapshot: branching from it re-runs cells (see `note`).
    Replay,
    /// The worker died in this cell: there is no state to branch from.
    None,
}

/// One executed cell in a session's graph.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct HistoryEntry {
    /// The cell id, `c<N>`.
    #[serde(serialize_with = "cell_id")]
    #[schemars(with = "String")]
    pub cell: u64,
    /// The cell it ran on top of, `c<N>` (null: an empty state).
    #[serde(serialize_with = "opt_cell_id")]
    #[schemars(with = "Option<String>")]
    pub parent: Option<u64>,
    /// The code, or `run_file <path> <args>` for a file.
    pub code: String,
    pub status: CellStatus,
    pub elapsed_ms: f64,
    pub snapshot: SnapshotState,
    /// Why the state is not held (not taken, evicted, the worker or server restarted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The live worker is at this cell: a cell without `parent` runs on it.
    pub head: bool,
    /// Cells re-run to rebuild this cell's parent state.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<String>")]
    #[serde(serialize_with = "cell_ids")]
    pub replayed: Vec<u64>,
}

/// A session's history: its cells (the newest [`HistoryEntry`]s) and, when the retention
/// cap dropped older ones, a note in words.
#[derive(Debug, Clone, PartialEq)]
pub struct History {
    pub cells: Vec<HistoryEntry>,
    /// "12 older cells were dropped (the session keeps its last 10 cells); the oldest kept
    /// is c13".
    pub dropped: Option<String>,
}

/// One page of a session's variables, by name.
#[derive(Debug, Clone, PartialEq)]
pub struct VariablePage {
    pub variables: Vec<VariableInfo>,
    /// The first name after this page, if any.
    pub next: Option<String>,
    /// How many variables the session has.
    pub total: u64,
}
