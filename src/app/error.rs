//! [`AppError`]: every way a use case of the application layer fails, each message saying
//! what failed, why, and what to do. The server turns it into a tool error (its `Display`
//! is the text the agent reads).

use std::path::PathBuf;

use crate::envs::EnvError;
use crate::jobs::{JobError, JobStatus};
use crate::repl::ReplError;
use crate::sandbox::PolicyError;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("cannot read the current directory: {0}")]
    CurrentDir(std::io::Error),
    #[error(
        "workspace {} is not usable: {error}; pass an existing directory with --workspace",
        path.display()
    )]
    Workspace {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A workspace so broad that writing it means writing the user's files or our state.
    #[error(
        "refusing workspace {}: it is {why}, so sandboxed code could write anywhere under it; \
         pass --workspace <a project directory>, or --allow-broad-workspace to accept it",
        path.display()
    )]
    BroadWorkspace { path: PathBuf, why: String },
    /// Started in a broad directory (no `--workspace`), and the client has not named a
    /// workspace (roots, Codex's sandboxCwd): nothing may run until one is known.
    #[error(
        "no workspace yet: the server was started in {} ({why}), which is never taken as the \
         workspace, and the client has named none (MCP roots, or Codex's sandboxCwd); start \
         the server with --workspace <a project directory> (or from that directory), or with \
         --allow-broad-workspace to accept it",
        path.display()
    )]
    WorkspaceUnknown { path: PathBuf, why: String },
    #[error(
        "workspace {} is not a directory; pass a directory with --workspace",
        path.display()
    )]
    WorkspaceNotADirectory { path: PathBuf },
    #[error("cannot create the state directory {}: {error}; pass --state-dir", path.display())]
    StateDir {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "cannot record this server as an owner in {}: {error}; check that the state \
         directory is writable (or pass another with --state-dir)",
        path.display()
    )]
    Owner {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot create {}: {error}", path.display())]
    CreateDir {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A path argument that would open the host to a tool call (absolute, `..`, or a
    /// symlink leading out of the workspace).
    #[error(
        "{what} {path} is outside the workspace {}; give a path inside it",
        workspace.display()
    )]
    OutsideWorkspace {
        what: String,
        path: String,
        workspace: PathBuf,
    },
    /// A path inside the workspace that is missing or of the wrong kind.
    #[error(
        "{what} {path} {reason} (paths are relative to the workspace {})",
        workspace.display()
    )]
    PathUnusable {
        what: String,
        path: String,
        reason: String,
        workspace: PathBuf,
    },
    #[error(
        "session {session:?} is busy with another cell: follow job {job} with job_wait, \
         stop it with job_cancel, or use another session name to run in parallel"
    )]
    SessionBusy { session: String, job: String },
    /// A `parent` cell that cannot be branched from; the text lists the usable cells.
    #[error("{0}")]
    BadParent(String),
    #[error("job {id} is still {status}; cancel it first (job_cancel) or wait for it")]
    StillRunning { id: String, status: JobStatus },
    /// Arguments that contradict each other or miss a required one; the text names them.
    #[error("{0}")]
    BadRequest(&'static str),
    /// A sandbox request from the client while the server's sandbox is fixed.
    #[error(
        "the server's sandbox is fixed by --sandbox-state or --policy; start it with \
         --sandbox-state inherit (and no --policy) to let the client choose it"
    )]
    SandboxNotInherited,
    #[error("job {id} has no result stream{why}; read its stdout or stderr instead")]
    NoResult { id: String, why: &'static str },
    #[error("job {id} has no image {index}: it produced {of} image(s), numbered from 1")]
    NoImage { id: String, index: usize, of: usize },
    #[error(
        "image {index} of job {id} cannot be returned: {why}; save it to a file in the workspace with python_exec and read it there"
    )]
    ImageUnfit {
        id: String,
        index: usize,
        why: super::images::FitError,
    },
    #[error("offset {offset} is past the end of the result of job {id}, which has {total} bytes")]
    ResultPastEnd { id: String, offset: u64, total: u64 },
    #[error("the server is shutting down; job {id} is being stopped")]
    ShuttingDown { id: String },
    /// A new job while the server drains (SIGTERM): running jobs may still end.
    #[error(
        "this sandbox is shutting down: no new job is started; jobs already running may \
         still finish (follow them with job_wait). Retry on the server that replaces this one"
    )]
    Draining,
    #[error("request cancelled; job {id} {fate}")]
    RequestCancelled { id: String, fate: &'static str },
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Job(#[from] JobError),
    #[error(transparent)]
    Repl(#[from] ReplError),
    #[error(transparent)]
    Env(#[from] EnvError),
}

// The io errors are fields named `error`, not `source`: the message already carries them,
// and a source would print them twice in an error chain (`{:#}`).

pub type AppResult<T> = Result<T, AppError>;
