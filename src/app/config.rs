//! [`Config`]: the plain settings the application layer is built from (`commands/serve`
//! fills it from the command line; tests build it by hand).

use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Config {
    /// The directory sandboxed code may write to (default: the current directory).
    pub workspace: Option<PathBuf>,
    /// A shipped policy name or a policy file path.
    pub policy: String,
    /// Python interpreter for workers (default: discovered from the workspace).
    pub python: Option<PathBuf>,
    /// The language of a session whose first call names none (`--interpreter`).
    pub interpreter: crate::repl::Language,
    /// Job tables, spooled output, session venvs (default: `jobs::default_state_dir`).
    pub state_dir: Option<PathBuf>,
    /// The uv executable (default: `uv` on PATH).
    pub uv: Option<PathBuf>,
    /// Most live Python sessions.
    pub max_sessions: usize,
    /// Idle time after which a session is closed.
    pub session_ttl: Duration,
    /// Fork snapshots kept per session for branching (0: off).
    pub max_snapshots: usize,
    /// Memory budget for a session's snapshots, bytes (default: half the policy's memory limit).
    pub snapshot_memory: Option<u64>,
    /// Idle time after a cell before its snapshot is taken (a call sooner skips it).
    pub snapshot_idle: std::time::Duration,
    /// Cells a session keeps in its graph (the oldest are dropped past it; at least 1).
    pub max_cells: usize,
    /// Approximate cap, in bytes, on the text of one response.
    pub response_bytes: usize,
    /// Cap, in bytes, on disk used by spooled job output.
    pub disk_cap: u64,
    /// Most jobs running at once (a principal's quota); `None`: no limit.
    pub max_running_jobs: Option<u64>,
    /// Whose app this is: `None` for the one local principal (stdio, a single HTTP
    /// token), else a principal of the tokens file (its stores are keyed by it).
    pub principal: Option<String>,
    /// Disk bounds of the package stores (uv caches, venvs), per session and in total.
    pub env_disk: crate::envs::DiskCaps,
    /// What the client may change while the server runs (sandbox state, roots).
    pub sources: super::settings::Sources,
    /// Accept a workspace that is `/`, the user's home or a parent of the state dir.
    pub allow_broad_workspace: bool,
    /// How many finished jobs, and for how long, are kept.
    pub retention: crate::jobs::Retention,
    /// The sandbox runtime every spawn of this app (and of every principal's app of the
    /// server: clones share it) goes through; built once by the front end.
    pub sandbox: crate::sandbox::Runtime,
}
