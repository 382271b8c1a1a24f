//! The job store: ids, statuses, spooled output, long-poll, cancel, persistence;
//! shell jobs.
//!
//! Every long-running thing the server starts — a Python cell, a shell command, a
//! package install, a one-off script — is a *job*. Whoever runs it holds a
//! [`JobHandle`] and pushes output into it; the MCP layer reads through [`JobStore`].
//!
//! - [`store`]: the table of jobs, long-poll `wait`, cancel/input routing, prune.
//! - [`spool`]: one append-only file per stream; memory stays bounded however much a
//!   job prints, and any byte range can be read back later.
//! - [`excerpt`]: head/tail excerpts of a byte range with exact offsets, decoded as
//!   UTF-8 with replacement.
//! - `query`: ranged reads, searches, list and prune.
//! - [`search`]: pattern search with context over a spool, streaming.
//! - [`persist`]: the job table on disk (atomic writes); restart marks running jobs lost.
//! - [`shell`]: shell jobs (spawned through the sandbox launcher).
//! - [`dotenv`]: the `.env` parser used by shell jobs.
//!
//! Offsets are byte offsets into a stream as the job wrote it. `wait` hands out each
//! byte once (the delivered cursor advances); `read` can re-read any range at any time.

pub(crate) mod dotenv;
pub(crate) mod excerpt;
pub(crate) mod handles;
mod job;
pub(crate) mod persist;
mod query;
pub(crate) mod search;
pub(crate) mod shell;
pub(crate) mod spool;
pub(crate) mod store;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use shell::{ShellRequest, start_shell_job};
pub use store::{Admission, JobHandle, JobStore, WaitFor};

/// Short, human-friendly job id such as `"j12"`.
pub type JobId = String;

/// What kind of work a job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    /// A Python cell (or file) run in a REPL session.
    Python,
    /// A shell command.
    Shell,
    /// A package install into a session's environment.
    Install,
    /// A one-off script in a transient environment.
    Script,
}

impl JobKind {
    /// The snake_case name used in JSON and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Python => "python",
            JobKind::Shell => "shell",
            JobKind::Install => "install",
            JobKind::Script => "script",
        }
    }
}

impl std::fmt::Display for JobKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Still running.
    Running,
    /// Blocked on `input()`; send text with the input tool.
    AwaitingInput,
    /// Finished successfully (exit code 0 / no exception).
    #[default]
    Completed,
    /// Finished with an error (non-zero exit, signal, exception, limit hit).
    Failed,
    /// Ended because it was cancelled.
    Cancelled,
    /// Was running when the server stopped; its outcome is unknown.
    Lost,
}

impl JobStatus {
    /// Whether the job has ended (nothing more will be appended).
    pub fn is_finished(self) -> bool {
        !matches!(self, JobStatus::Running | JobStatus::AwaitingInput)
    }

    /// The snake_case name used in JSON and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Running => "running",
            JobStatus::AwaitingInput => "awaiting_input",
            JobStatus::Completed => "completed",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
            JobStatus::Lost => "lost",
        }
    }
}

impl std::fmt::Display for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One of a job's two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
    pub(crate) fn index(self) -> usize {
        match self {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }
    }
}

impl std::fmt::Display for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the store is set up.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Root state directory (`$XDG_STATE_HOME/mcp-sandbox-repl` by default, see
    /// [`default_state_dir`]). The store keeps its files under `<state_dir>/jobs`.
    pub state_dir: PathBuf,
    /// Cap on bytes of spooled output on disk; oldest finished jobs are evicted first.
    pub disk_cap: u64,
    /// Budget, in bytes of text, for the stdout+stderr excerpts of one snapshot and
    /// for one `read`.
    pub response_bytes: usize,
    /// How many finished jobs, and for how long, are kept (bytes: `disk_cap`).
    pub retention: Retention,
    /// Most jobs running at once (a principal's quota); `None`: no limit.
    pub max_running: Option<u64>,
}

/// Retention of finished jobs: the oldest go first once either limit is passed, whether
/// or not they printed anything. Running jobs are never removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Most jobs kept in the table (finished ones go, oldest first, to stay under it).
    pub max_jobs: usize,
    /// Finished jobs created longer ago than this are removed.
    pub max_age: std::time::Duration,
}

impl Default for Retention {
    /// 10,000 jobs and 7 days: a busy agent's day (a call every few seconds) stays.
    fn default() -> Self {
        Retention {
            max_jobs: 10_000,
            max_age: std::time::Duration::from_secs(7 * 24 * 3600),
        }
    }
}

impl StoreConfig {
    /// Config with the given state dir and the defaults of the CLI (2 GiB cap, 20 KB responses).
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        StoreConfig {
            state_dir: state_dir.into(),
            disk_cap: 2 * 1024 * 1024 * 1024,
            response_bytes: 20_000,
            retention: Retention::default(),
            max_running: None,
        }
    }
}

/// `$XDG_STATE_HOME/mcp-sandbox-repl`, falling back to `~/.local/state/mcp-sandbox-repl`
/// (and to a directory under the system temp dir if there is no home).
pub fn default_state_dir() -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".local/state"))
        })
        .unwrap_or_else(std::env::temp_dir);
    base.join("mcp-sandbox-repl")
}

/// Registered by whoever runs a job, so the store can route cancel and input to it.
pub trait JobControl: Send + Sync {
    /// Python: interrupt; shell: TERM to the group, KILL after a grace period.
    fn cancel(&self);
    /// Deliver `text` (then close the input if `eof`). `Err(words)` if the job is not
    /// reading or its input is closed.
    fn send_input(&self, text: &str, eof: bool) -> Result<(), String>;
    /// Cancel with a caller-chosen grace period before the hard stop (`None` = the
    /// producer's default). Defaults to [`cancel`](Self::cancel).
    fn cancel_within(&self, grace: Option<std::time::Duration>) {
        let _ = grace;
        self.cancel()
    }
    /// End the job now, without grace (used at shutdown). Defaults to [`cancel`](Self::cancel).
    fn kill(&self) {
        self.cancel()
    }
}

/// How a job ended; passed by the producer to [`JobHandle::finish`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobOutcome {
    pub status: JobStatus,
    pub exit_code: Option<i32>,
    /// Signal that ended the process, in words (e.g. "SIGKILL").
    pub signal: Option<String>,
    /// A sentence for the agent (error summary, limit hit, ...).
    pub message: Option<String>,
    /// Structured result (e.g. a Python cell's value and display items).
    pub result: Option<serde_json::Value>,
}

/// A stretch of one stream, shortened to head + tail when over budget.
///
/// Covers bytes `[offset, end)`. If `omitted` is `Some([a, b])`, `head` is the text of
/// `[offset, a)`, `tail` the text of `[b, end)`, and `[a, b)` was left out (read it with
/// the read tool). Otherwise `head` is all of `[offset, end)` and `tail` is `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Excerpt {
    /// Byte offset of the first byte covered.
    pub offset: u64,
    /// Byte offset just past the last byte covered.
    pub end: u64,
    /// Text from `offset` (UTF-8, invalid bytes replaced).
    pub head: String,
    /// Text ending at `end`, when the middle was left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tail: Option<String>,
    /// Byte range `[from, to)` left out between `head` and `tail`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub omitted: Option<[u64; 2]>,
}

impl Excerpt {
    /// Whether the excerpt covers no bytes.
    pub fn is_empty(&self) -> bool {
        self.offset == self.end
    }
}

/// The state of a job plus the output not yet delivered; what `wait` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobSnapshot {
    pub id: JobId,
    pub kind: JobKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    pub label: String,
    pub status: JobStatus,
    /// The input prompt, while `status` is `awaiting_input`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The pending input is a secret (getpass): its answer is never shown.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub secret: bool,
    /// Stdout written since the last snapshot.
    pub stdout: Excerpt,
    /// Stderr written since the last snapshot.
    pub stderr: Excerpt,
    /// Milliseconds since the job started (until it finished, once finished).
    pub elapsed_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
}

/// A range of one stream, returned by [`JobStore::read`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OutputChunk {
    pub id: JobId,
    pub stream: Stream,
    /// Offset of the first byte returned.
    pub offset: u64,
    /// Offset just past the last byte returned; read on from here.
    pub end: u64,
    /// Bytes written to this stream so far.
    pub total: u64,
    /// True when `end == total` and the job has finished: nothing more will come.
    pub eof: bool,
    /// The bytes `[offset, end)`: as UTF-8 when they are text, else (`base64`) their
    /// exact base64 encoding — binary output is never turned into U+FFFD.
    pub text: String,
    /// `text` is the base64 of the bytes (they are not UTF-8).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub base64: bool,
}

/// One match of [`JobStore::search`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SearchHit {
    /// 1-based line number of the matching line.
    pub line: u64,
    /// Byte offset of the start of the matching line.
    pub offset: u64,
    /// The matching line (long lines are shortened around the match).
    pub text: String,
    /// Up to `context_lines` lines before the match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub before: Vec<String>,
    /// Up to `context_lines` lines after the match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
}

/// Which jobs a list or prune applies to; every field set must match.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobFilter {
    /// Only jobs with one of these statuses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Vec<JobStatus>>,
    /// Only jobs of one of these kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Vec<JobKind>>,
    /// Only jobs of this REPL session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Only these job ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<JobId>>,
    /// Only jobs created at least this many seconds ago.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub older_than_secs: Option<u64>,
    /// At most this many jobs (the newest first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

/// One page of a job listing, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct JobPage {
    pub jobs: Vec<JobSummary>,
    /// Pass as `cursor` to get the next (older) page; `None` on the last page.
    pub next_cursor: Option<String>,
}

/// One line of a job listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobSummary {
    /// `job_id` on the wire, the name every answer uses for a job.
    #[serde(rename = "job_id", alias = "id")]
    pub id: JobId,
    pub kind: JobKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    pub label: String,
    pub status: JobStatus,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    pub elapsed_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Bytes written to stdout so far.
    pub stdout_bytes: u64,
    /// Bytes written to stderr so far.
    pub stderr_bytes: u64,
}

/// Errors of the job subsystem; each message says what failed, why, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("no job with id {id:?}; {known}")]
    UnknownJob { id: String, known: String },
    #[error("job {id} has already finished ({status}); {what}")]
    Finished {
        id: String,
        status: JobStatus,
        what: String,
    },
    #[error("job {id} cannot {what}: nothing controls it (it is {status})")]
    NoControl {
        id: String,
        what: &'static str,
        status: JobStatus,
    },
    #[error("job {id} did not take the input: {reason}")]
    Input { id: String, reason: String },
    #[error(
        "offset {offset} is past the end of {stream} of job {id}, which has {total} bytes{more}"
    )]
    PastEnd {
        id: String,
        stream: Stream,
        offset: u64,
        total: u64,
        more: &'static str,
    },
    #[error("invalid search pattern {pattern:?}: {reason}")]
    Pattern { pattern: String, reason: String },
    #[error("working directory {path:?} {reason}; pass an existing directory")]
    Cwd { path: PathBuf, reason: String },
    #[error(
        "{what} {path:?} is outside what policy {policy} lets a job read; use a path inside the workspace"
    )]
    Denied {
        what: &'static str,
        path: PathBuf,
        policy: String,
    },
    #[error("{file}:{line}: {reason}")]
    DotEnv {
        file: String,
        line: usize,
        reason: String,
    },
    #[error("invalid shell request: {0}")]
    Request(String),
    #[error("could not start the job: {0}")]
    Launch(#[from] crate::sandbox::LaunchError),
    #[error(
        "state directory is full ({}): cannot record a new job; free space there (or remove \
         old jobs with job_prune) and try again", path.display()
    )]
    StateDirFull { path: PathBuf },
    #[error(
        "too many jobs running: {limit} at once is this client's quota; wait for one to \
         end (job_wait) or cancel one (job_cancel), then try again"
    )]
    TooManyRunning { limit: u64 },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

impl JobError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        JobError::Io {
            what: what.into(),
            source,
        }
    }
}

/// Grace period between SIGTERM and SIGKILL when a shell job is cancelled.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(2);
