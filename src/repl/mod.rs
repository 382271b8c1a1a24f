//! The persistent Python worker: spawn through the launcher, the typed worker
//! protocol, execution, input bridging, interrupt/restart, crash detection.
//!
//! Map:
//! - [`protocol`]: every message between server and worker (one tagged enum each way).
//! - `worker`: one worker process — spawn, calls, interrupt, kill.
//! - `pump`: the I/O task of a worker — its pipes, output attribution, death.
//! - `session`: a named session — cells, variables, history, restart after a crash.
//! - `graph`: a session's cells as a graph (parents, snapshots held, replay plans).
//! - `snapshot`: snapshots by fork — the control sockets, forking a live worker.
//! - `manager`: the named sessions — limits, idle TTL reaper, shutdown.
//! - `python`: which interpreter to use and its installation prefixes.
//!
//! Nothing here knows MCP: the server passes a [`CellSink`] that receives a cell's
//! output as it is printed, and gets a [`CellOutcome`] when the cell ends.

mod graph;
mod manager;
mod probe_cache;
pub mod protocol;
mod pump;
mod python;
mod session;
mod snapshot;
mod worker;

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

pub use manager::SessionManager;
pub use protocol::{DisplayItem, PyError, VariableDetail, VariableInfo};
pub use python::{PythonInfo, discover_python, known_python3};
pub use session::{Parent, Session, VariablePage};

use crate::sandbox::{
    ExitReport, LaunchError, LimitHit, Policy, PolicyError, ResolvedPolicy, Termination,
};

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
}

/// Configuration shared by all sessions.
#[derive(Debug, Clone)]
pub struct ReplConfig {
    /// The sandbox runtime every worker is started with.
    pub sandbox: crate::sandbox::Runtime,
    /// Interpreter to run; `None` = nearest `.venv` upward from the workspace, else
    /// `python3` on PATH.
    pub python: Option<PathBuf>,
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
            max_cells: 10_000,
            started: std::time::SystemTime::now(),
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

/// `c<N>`, the id agents see for cell N.
pub fn cell_name(cell: u64) -> String {
    format!("c{cell}")
}

fn cell_id<S: serde::Serializer>(c: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&cell_name(*c))
}

fn opt_cell_id<S: serde::Serializer>(c: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match c {
        Some(c) => s.serialize_str(&cell_name(*c)),
        None => s.serialize_none(),
    }
}

fn cell_ids<S: serde::Serializer>(c: &[u64], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(c.iter().map(|c| cell_name(*c)))
}

/// A cell id as agents write it: `c7` (or `7`).
pub fn parse_cell(id: &str) -> Option<u64> {
    let t = id.trim();
    t.strip_prefix('c').unwrap_or(t).parse().ok()
}

/// Errors of the REPL subsystem; every message says what failed, why, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ReplError {
    #[error(
        "session {session:?} is busy running cell {cell}; wait for its job to finish, interrupt it, or restart the session"
    )]
    Busy { session: String, cell: u64 },
    #[error(
        "session {session:?} is not waiting for input; input can only be sent while a cell waits in input()"
    )]
    NotAwaitingInput { session: String },
    #[error(
        "cannot start session {name:?}: the limit of {max} sessions is reached (open: {open}); close one with session_close, or reuse one"
    )]
    TooManySessions {
        name: String,
        max: usize,
        open: String,
    },
    #[error("invalid session name {name:?}: use 1-64 letters, digits, '-', '_' or '.'")]
    InvalidSessionName { name: String },
    #[error("session {session:?} was closed; start it again by using its name in a new call")]
    Closed { session: String },
    #[error("no session named {name:?}; open sessions: {open}")]
    NoSuchSession { name: String, open: String },
    #[error(
        "session {name:?} expired after {idle_secs} s idle and was closed: its variables and \
         history are gone; python_exec starts it again, fresh"
    )]
    Expired { name: String, idle_secs: u64 },
    #[error("no Python interpreter found: {detail}; pass --python PATH")]
    PythonNotFound { detail: String },
    #[error(
        "the Python interpreter {python:?} does not work: {detail}; pass a working one with --python PATH"
    )]
    PythonProbe { python: PathBuf, detail: String },
    #[error("cannot apply the sandbox policy: {0}")]
    Policy(#[from] PolicyError),
    #[error("cannot start the Python worker: {0}")]
    Launch(#[from] LaunchError),
    #[error("could not {what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{message}; the session's state is lost, the next call starts a fresh worker")]
    WorkerDied { message: String },
    #[error("{message}")]
    Python { message: String },
    #[error("the Python worker broke the protocol: {detail}; restart the session")]
    Protocol { detail: String },
    #[error(
        "cannot branch from {parent:?} in session {session:?}: {why}; cells you can use: {usable}"
    )]
    BadParent {
        session: String,
        parent: String,
        why: String,
        usable: String,
    },
    #[error(
        "cell {parent} has no snapshot ({why}). Its state can be rebuilt by re-running {cells} in a fresh worker; \
         this repeats their side effects (files written, network calls) and gives new random values. \
         Nothing was run. To do it, call python_exec again with parent=\"{parent}\" and replay=true"
    )]
    ReplayNeeded {
        parent: String,
        why: String,
        cells: String,
    },
    #[error("cannot branch: {detail}; the session's head is unchanged")]
    Branch { detail: String },
}

/// How a worker ended, in words: "the Python worker was killed by SIGSEGV
/// (segmentation fault)", "... exited with code 3", "... killed: memory limit (512 MiB)
/// reached". `policy` supplies the amount of the limit that was hit.
pub fn exit_words(report: &ExitReport, policy: &ResolvedPolicy) -> String {
    if let Some(limit) = report.limit {
        let what = match limit {
            LimitHit::Memory => "memory limit",
            LimitHit::Cpu => "CPU time limit",
            LimitHit::WallTime => "wall-time limit",
            LimitHit::FileSize => "file size limit",
            LimitHit::Processes => "process count limit",
        };
        return match limit_amount(policy, limit) {
            Some(amount) => format!("the Python worker was killed: {what} ({amount}) reached"),
            None => format!("the Python worker was killed: {what} reached"),
        };
    }
    match &report.termination {
        Termination::Exited(code) => format!("the Python worker exited with code {code}"),
        Termination::Signaled(sig) => match signal_meaning(sig) {
            Some(meaning) => format!("the Python worker was killed by {sig} ({meaning})"),
            None => format!("the Python worker was killed by {sig}"),
        },
        Termination::Unknown => "the Python worker ended (exit status unknown)".to_string(),
    }
}

/// The amount of a policy limit, in words ("512 MiB", "60 s").
fn limit_amount(policy: &ResolvedPolicy, limit: LimitHit) -> Option<String> {
    let l = &policy.limits;
    match limit {
        LimitHit::Memory => l.memory_bytes.map(bytes_words),
        LimitHit::Cpu => l.cpu_seconds.map(|s| format!("{s} s of CPU")),
        LimitHit::WallTime => l.wall_seconds.map(|s| format!("{s} s")),
        LimitHit::FileSize => l.file_size_bytes.map(bytes_words),
        LimitHit::Processes => l.processes.map(|n| format!("{n} processes")),
    }
}

/// "512 MiB", "4 GiB", "1500 bytes".
fn bytes_words(n: u64) -> String {
    const KIB: u64 = 1024;
    for (unit, size) in [("GiB", KIB * KIB * KIB), ("MiB", KIB * KIB), ("KiB", KIB)] {
        if n >= size && n.is_multiple_of(size) {
            return format!("{} {unit}", n / size);
        }
    }
    if n >= KIB * KIB {
        return format!("{:.1} MiB", n as f64 / (KIB * KIB) as f64);
    }
    format!("{n} bytes")
}

fn signal_meaning(sig: &str) -> Option<&'static str> {
    Some(match sig {
        "SIGSEGV" => "segmentation fault",
        "SIGKILL" => "killed from outside, or out of memory",
        "SIGABRT" => "aborted",
        "SIGBUS" => "bus error",
        "SIGFPE" => "floating-point exception",
        "SIGILL" => "illegal instruction",
        "SIGTERM" => "terminated",
        "SIGXCPU" => "CPU time limit",
        "SIGXFSZ" => "file size limit",
        "SIGSYS" => "blocked system call",
        "SIGPIPE" => "broken pipe",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_words_name_signal_code_and_limit() {
        let placeholders = crate::sandbox::Placeholders {
            workspace: "/w".into(),
            tmp: "/t".into(),
            ..Default::default()
        };
        let policy = Policy::load("workspace-write")
            .unwrap()
            .resolve(&placeholders)
            .unwrap();
        let exit_words = |r: &ExitReport| exit_words(r, &policy);
        assert_eq!(bytes_words(512 << 20), "512 MiB");
        assert_eq!(bytes_words(4 << 30), "4 GiB");
        assert_eq!(bytes_words(1500), "1500 bytes");
        let mut r = ExitReport {
            termination: Termination::Signaled("SIGSEGV".into()),
            ..Default::default()
        };
        assert_eq!(
            exit_words(&r),
            "the Python worker was killed by SIGSEGV (segmentation fault)"
        );
        r.termination = Termination::Exited(3);
        assert_eq!(exit_words(&r), "the Python worker exited with code 3");
        r.limit = Some(LimitHit::Memory);
        assert_eq!(
            exit_words(&r),
            "the Python worker was killed: memory limit (4 GiB) reached"
        );
    }
}
