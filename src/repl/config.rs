//! The configuration every session of a manager shares.

use std::path::PathBuf;
use std::time::Duration;

use super::interpreter::Language;
use crate::sandbox::Policy;

/// Configuration shared by all sessions.
#[derive(Debug, Clone)]
pub struct ReplConfig {
    /// The sandbox runtime every worker is started with.
    pub sandbox: crate::sandbox::Runtime,
    /// Interpreter to run; `None` = nearest `.venv` upward from the workspace, else
    /// `python3` on PATH.
    pub python: Option<PathBuf>,
    /// The language of a session whose first call names none (`--interpreter`).
    pub interpreter: Language,
    /// Working directory of every worker (`{workspace}` in the policy).
    pub workspace: PathBuf,
    /// The policy, unresolved: each session resolves it with its own `{tmp}`.
    pub policy: Policy,
    /// Where sessions keep their private temp directories.
    pub state_dir: PathBuf,
    pub max_sessions: usize,
    /// A session idle this long is closed by the reaper (busy sessions never are).
    pub idle_ttl: Duration,
    /// Longest repr of a cell's value (characters) before it is cut in the middle.
    pub repr_limit: usize,
    /// How long a new worker may take to report `ready`.
    pub start_timeout: Duration,
    /// Keep one started, idle worker per session (after its first cell) so a restart or
    /// the cell after a crash does not wait for an interpreter to start. Costs one idle
    /// Python process (~10 MB) per session.
    pub spare_worker: bool,
    /// Snapshots (forked copies of the state after each cell, for branching) a session
    /// keeps at most; the least recently used is evicted. 0 turns snapshots off.
    pub max_snapshots: usize,
    /// Memory budget for a session's snapshots, bytes (its job cgroups' figure); past
    /// it the least recently used are evicted. `None`: half the policy's memory limit
    /// (no budget without one: there is no memory cgroup to read).
    pub snapshot_memory: Option<u64>,
    /// Idle time after a cell before the worker takes its snapshot; a request that
    /// arrives sooner skips it (the cell is then branched by replay). Zero: at once.
    pub snapshot_idle: Duration,
    /// Cells a session keeps in its graph (history, branching) at most; past it the oldest
    /// are dropped, except those whose snapshot is held and the head's line. 0: all.
    pub max_cells: usize,
    /// When this server started: the time a session restored from an earlier server's
    /// graph names in its `state_note`.
    pub started: std::time::SystemTime,
}

impl ReplConfig {
    /// Defaults: interpreter discovered, 16 sessions, 1 hour idle TTL.
    pub fn new(
        sandbox: crate::sandbox::Runtime,
        workspace: PathBuf,
        policy: Policy,
        state_dir: PathBuf,
    ) -> ReplConfig {
        ReplConfig {
            sandbox,
            python: None,
            interpreter: Language::Python,
            workspace,
            policy,
            state_dir,
            max_sessions: 16,
            idle_ttl: Duration::from_secs(3600),
            repr_limit: 20_000,
            start_timeout: Duration::from_secs(20),
            spare_worker: true,
            max_snapshots: 8,
            snapshot_memory: None,
            snapshot_idle: Duration::from_millis(200),
            max_cells: 10_000,
            started: std::time::SystemTime::now(),
        }
    }
}
