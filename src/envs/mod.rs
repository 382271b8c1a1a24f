//! uv-managed environments: per-session venvs, package installs, one-off scripts.
//!
//! Map of this subsystem:
//! - [`manager`]: [`EnvManager`], what the server holds: uv found once, each
//!   session's venv, installs serialized per venv.
//! - [`uv`]: finding the real `uv` binary and the environment every uv process gets.
//! - [`venv`]: a session's virtual environment (created by `uv venv` on first need).
//! - [`install`]: `uv pip install` into a venv, with progress parsed from uv's stderr.
//! - [`script`]: one-off scripts in transient environments (`uv run --with` / PEP 723).
//! - [`process`]: running one uv process through the sandbox launcher, pumping its
//!   output into an [`EnvSink`], with cancellation and a timeout.
//! - [`policy`]: the policies uv processes run under (session policy + network + writes
//!   to the venv and the session's uv cache only).
//! - [`store`]: the stores that outlive a job (each session's uv cache and venv), private
//!   to one session, and their disk bounds, enforced while uv runs.
//!
//! Nothing here knows MCP or the job store: the caller hands in an [`EnvSink`] (the
//! server adapts a `jobs::JobHandle` and MCP progress notifications to it) and a
//! [`Canceller`] (the server's `JobControl::cancel` calls [`Canceller::cancel`]).

pub mod install;
pub(crate) mod manager;
pub(crate) mod policy;
pub mod process;
pub(crate) mod r_install;
pub mod script;
pub(crate) mod store;
pub(crate) mod uv;
pub mod venv;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

pub use install::{InstallReport, InstallRequest, ProgressParser};
pub use manager::EnvManager;
pub use process::RunOutcome;
pub use script::{Benchmark, ScriptReport, ScriptRequest, ScriptSource};
pub use store::{DiskCaps, DiskHit, Ended, Lease, Owner, Stores};
pub use uv::Uv;
pub use venv::{Venv, VenvLocation, allow_session_venvs};

/// What every environment operation needs to know, filled by the server from its flags.
#[derive(Debug, Clone)]
pub struct EnvConfig {
    /// The sandbox runtime every uv and script process is started with.
    pub sandbox: crate::sandbox::Runtime,
    /// The server's state directory; venvs live in `<state_dir>/venvs/<session>`,
    /// inline scripts in `<state_dir>/scripts`, and by default the uv caches in
    /// `<state_dir>/uv-cache`.
    pub state_dir: PathBuf,
    /// The agent's workspace (`{workspace}`; `VenvLocation::Workspace` uses its `.venv`).
    pub workspace: PathBuf,
    /// The interpreter new venvs are based on (the REPL worker's interpreter).
    pub python: PathBuf,
    /// Its version ("3.11.7"), if known: what a script without an environment runs on.
    pub python_version: Option<String>,
    /// A configured `uv` executable (`--uv`); `None` searches PATH.
    pub uv: Option<PathBuf>,
    /// The root of the uv caches, one per session below it (`sessions/<principal>/
    /// <session>`, [`store::Stores::cache_dir`]); `None` means `$MCP_SANDBOX_UV_CACHE` if
    /// set, else `<state_dir>/uv-cache`. The server's own `UV_CACHE_DIR` is never used:
    /// sandboxed installs would write the user's real cache.
    pub uv_cache: Option<PathBuf>,
    /// The disk bounds of the stores (per session and in total).
    pub disk: DiskCaps,
    /// Whose sessions these are: `None` for the one local principal (stdio, a single
    /// HTTP token), else the principal of a tokens file — part of every store's key.
    pub principal: Option<String>,
    /// Let uv download Python builds (into the session's own uv cache, `python/`) when a
    /// requested version is not installed. Off by default: a missing version is a clear
    /// error.
    pub python_downloads: bool,
    /// Package sources beyond uv's defaults. The server's own `UV_*` variables
    /// (`UV_INDEX_URL`, `UV_FIND_LINKS`, `UV_OFFLINE`, ...) are forwarded too.
    pub sources: PackageSources,
}

/// Where packages come from, as uv flags (tests and air-gapped machines use these to
/// install from a local directory of wheels without touching any index).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackageSources {
    /// `--find-links <dir>` for each (read access is granted to the installer).
    pub find_links: Vec<PathBuf>,
    /// `--no-index`: ignore the package index, use only `find_links`.
    pub no_index: bool,
    /// `--offline`: no network at all; the installer gets no network access either.
    pub offline: bool,
}

impl PackageSources {
    /// The uv flags for these sources.
    pub fn args(&self) -> Vec<std::ffi::OsString> {
        let mut args = Vec::new();
        for dir in &self.find_links {
            args.push("--find-links".into());
            args.push(dir.clone().into_os_string());
        }
        if self.no_index {
            args.push("--no-index".into());
        }
        if self.offline {
            args.push("--offline".into());
        }
        args
    }
    /// Whether uv will need the network (no `--offline` here or in `UV_OFFLINE`).
    pub fn needs_network(&self) -> bool {
        let env_offline =
            std::env::var("UV_OFFLINE").is_ok_and(|v| matches!(v.as_str(), "1" | "true" | "yes"));
        !(self.offline || env_offline)
    }
    /// Local paths uv reads packages and TLS roots from (granted read access).
    pub fn local_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = self.find_links.clone();
        dirs.extend(uv::find_links_dirs());
        dirs.extend(uv::tls_paths());
        dirs
    }
}

impl EnvConfig {
    /// The root of the per-session uv caches in effect (see [`EnvConfig::uv_cache`]).
    pub fn uv_cache_root(&self) -> PathBuf {
        if let Some(dir) = &self.uv_cache {
            return dir.clone();
        }
        match std::env::var_os(UV_CACHE_ENV) {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => self.state_dir.join("uv-cache"),
        }
    }
}

/// The variable that configures the root of the uv caches of sandboxed installs and
/// scripts.
pub const UV_CACHE_ENV: &str = "MCP_SANDBOX_UV_CACHE";

/// Every failure of this subsystem, each saying what failed, why, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error(
        "uv was not found ({searched}). Session virtual environments, package installs and \
         one-off scripts need it; install it with `pip install uv` (or pass its path with \
         --uv / MCP_SANDBOX_UV). Everything else keeps working without it."
    )]
    UvMissing { searched: String },
    #[error(
        "{path} is not a usable uv executable: {why}. Session virtual environments, package \
         installs and one-off scripts need uv: install it with `pip install uv`, or point \
         --uv / MCP_SANDBOX_UV at the uv binary."
    )]
    UvUnusable { path: PathBuf, why: String },
    #[error(
        "invalid session name {0:?} for a virtual environment: use letters, digits, '-', '_' or '.'"
    )]
    BadSessionName(String),
    #[error(
        "no virtual environment at {path}: {why}. Create one (`uv venv {path}`) or ask for a \
         managed venv instead."
    )]
    NoVenv { path: PathBuf, why: String },
    #[error("could not create the virtual environment at {path}: {message}")]
    VenvCreate { path: PathBuf, message: String },
    #[error("invalid request: {0}")]
    BadRequest(String),
    #[error("Python {version:?} is not available: {message}")]
    PythonUnavailable { version: String, message: String },
    #[error("{what} failed: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// A store at its disk bound; the text says which, how full, and how to free it.
    #[error("{0}")]
    StoreFull(String),
    #[error("could not start uv under the sandbox: {0}")]
    Launch(#[from] crate::sandbox::LaunchError),
}

impl EnvError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        EnvError::Io {
            what: what.into(),
            source,
        }
    }
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutStream {
    Stdout,
    Stderr,
}

/// One progress step of an install, shaped like an MCP progress notification.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// Steps done so far (monotonic).
    pub progress: f64,
    /// Total steps, when known.
    pub total: Option<f64>,
    /// uv's own words for the step, e.g. "Resolved 3 packages in 12ms".
    pub message: String,
}

/// Where a running uv process's output and progress go. The server implements it
/// over a `jobs::JobHandle` (output) and the request's progress token (progress).
pub trait EnvSink: Send + Sync {
    fn output(&self, stream: OutStream, data: &[u8]);
    fn progress(&self, _progress: &Progress) {}
    /// An install's uv said its packages are in place in `venv` ("Installed N
    /// packages", "Audited N packages") and its stderr has ended (uv has exited), while
    /// its sandbox may still be exiting; at most once per install. Whether the install
    /// succeeded is known only from its report: what is started here (the session's
    /// activation of the venv, which any later success does too) must be harmless if
    /// it then fails. Called from the output pump: must not block.
    fn installed(&self, _venv: &Venv) {}
}

/// A sink that drops everything (for callers that only want the final report).
pub struct NullSink;

impl EnvSink for NullSink {
    fn output(&self, _stream: OutStream, _data: &[u8]) {}
}

/// Cancellation of one running operation. Cheap to clone; `cancel` is idempotent and
/// may come before the process even started (it is then killed at once).
///
/// Why a flag plus a `Notify`: the flag answers "was it cancelled?" at any later
/// point (no lost wake-ups), the `Notify` wakes the task awaiting the process.
#[derive(Debug, Clone, Default)]
pub struct Canceller {
    inner: Arc<CancelInner>,
}

#[derive(Debug, Default)]
struct CancelInner {
    cancelled: AtomicBool,
    notify: Notify,
}

impl Canceller {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        self.inner.notify.notify_waiters();
    }
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }
    /// Resolves once [`Canceller::cancel`] has been called (at once if it already was).
    pub async fn cancelled(&self) {
        loop {
            let notified = self.inner.notify.notified();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }
}

/// The first `limit` bytes of `path`, a file sandboxed code may write (a workspace venv's
/// `pyvenv.cfg`, a script): opened without blocking and without following a last-step
/// link, and read only if it is a regular file, so a FIFO or a link swapped in never holds
/// a server thread or sends it elsewhere, and a huge (sparse) file never fills its memory.
pub(crate) fn open_job_file(
    path: &std::path::Path,
    limit: u64,
) -> Option<std::io::Take<std::fs::File>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    file.metadata().ok()?.is_file().then(|| file.take(limit))
}
