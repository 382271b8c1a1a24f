//! [`SetupError`]: one step of setting up the sandbox failed (the launcher's steps and
//! the two checks the parent makes before it starts one). Every message says what
//! failed, why, and what to do. (Policy errors: `policy::error`; starting a process:
//! `parent::error`.)

use std::io;
use std::path::PathBuf;

use super::cgroup::CgroupError;
use super::mounts::MountError;
use super::netns::NetnsError;

/// Exit status of the launcher when it fails before exec.
pub(crate) const SETUP_FAILED_EXIT: i32 = 127;

/// One step of setting up the sandbox failed: which step (the variant) and why (the
/// source error). The launcher writes its `Display` — exactly — to the status pipe, after
/// `error: `; the parent shows it as [`LaunchError::Launcher`].
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A descriptor was to be passed as 0, 1 or 2 (parent side).
    #[error("descriptor target {target} is reserved for stdio; pass descriptors as 3 or above")]
    ReservedFd { target: i32 },
    /// As root the process limit holds only through a pids cgroup (parent side).
    #[error(
        "cannot create the job's cgroup ({source}); as root the process limit of policy \
         {policy} holds only through a pids cgroup"
    )]
    RootNeedsCgroup { policy: String, source: CgroupError },
    #[error("setsid: {0}")]
    Session(#[source] io::Error),
    #[error("cannot ask to be killed with the server (prctl PR_SET_PDEATHSIG): {0}")]
    ParentDeath(#[source] io::Error),
    #[error("the server (pid {parent}) ended before the job started")]
    ParentGone { parent: u32 },
    #[error("cannot start the job's PID namespace init: {0}")]
    PidNamespace(#[source] io::Error),
    /// No PID namespace could be made and the policy does not allow best effort.
    #[error(
        "cannot create the job's PID namespace (unshare CLONE_NEWPID: {source}); policy \
         {policy} requires it so that no process of the job outlives the server: the launcher \
         needs CAP_SYS_ADMIN (run the server as root, or in a user namespace), or set \
         kernel_support = \"best_effort\" to run without it"
    )]
    PidNamespaceMissing { policy: String, source: io::Error },
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error(transparent)]
    Network(#[from] NetnsError),
    #[error(transparent)]
    Mounts(#[from] MountError),
    #[error("cannot enter the working directory {}: {source}", path.display())]
    WorkingDir { path: PathBuf, source: io::Error },
    #[error("cannot read the {limit} limit: {source}")]
    RlimitRead {
        limit: &'static str,
        source: io::Error,
    },
    #[error("cannot set the {limit} limit to {soft}: {source}")]
    RlimitSet {
        limit: &'static str,
        soft: u64,
        source: io::Error,
    },
    #[error("cannot clear the {set} capability set: {source}")]
    Capabilities {
        set: &'static str,
        source: caps::errors::CapsError,
    },
    #[error("cannot set no_new_privs: {0}")]
    NoNewPrivs(#[source] io::Error),
    #[error("this kernel has no Landlock; policy {policy} requires it")]
    LandlockMissing { policy: String },
    #[error(
        "this kernel's Landlock ABI is {abi}; policy {policy} needs ABI {required} for: {missing}"
    )]
    LandlockAbi {
        abi: i32,
        policy: String,
        required: i32,
        /// What the kernel would leave unenforced, comma-separated.
        missing: String,
    },
    #[error("Landlock: {0}")]
    Landlock(#[from] landlock::RulesetError),
    #[error("Landlock: cannot open {}: {source}", path.display())]
    LandlockPath {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the kernel did not fully enforce the Landlock ruleset ({status}); policy {policy} \
         requires it"
    )]
    LandlockPartial { status: String, policy: String },
    #[error("seccomp: unsupported architecture: {0}")]
    SeccompArch(#[source] seccompiler::BackendError),
    #[error("seccomp rule for {syscall}: {source}")]
    SeccompRule {
        syscall: String,
        source: seccompiler::BackendError,
    },
    #[error("seccomp filter: {0}")]
    SeccompFilter(#[source] seccompiler::BackendError),
    #[error("this kernel refused the seccomp filter: {0}")]
    SeccompLoad(#[source] seccompiler::Error),
    #[error("cannot close inherited descriptors: {0}")]
    CloseFds(#[source] io::Error),
    #[error("no command given")]
    NoCommand,
    #[error("an argument or variable for {program:?} contains a NUL byte")]
    NulByte { program: String },
    #[error("cannot execute {program:?}: {source}")]
    Exec { program: String, source: io::Error },
    /// Landlock (or file modes) refused to execute the program.
    #[error(
        "cannot execute {program:?}: {source}; blocked by policy {policy}, which allows \
         executing only under: {allowed}"
    )]
    ExecDenied {
        program: String,
        source: io::Error,
        policy: String,
        /// The policy's `execute` paths, comma-separated.
        allowed: String,
    },
    #[error("command not found: {program:?} (searched PATH={path})")]
    NotFound { program: String, path: String },
}

impl SetupError {
    /// The setup step that failed, in a word (for logs and tests).
    pub fn step(&self) -> &'static str {
        match self {
            SetupError::ReservedFd { .. } => "descriptors",
            SetupError::RootNeedsCgroup { .. } | SetupError::Cgroup(_) => "cgroup",
            SetupError::Session(_) => "setsid",
            SetupError::ParentDeath(_) | SetupError::ParentGone { .. } => "pdeathsig",
            SetupError::PidNamespace(_) | SetupError::PidNamespaceMissing { .. } => "pidns",
            SetupError::Network(_) => "netns",
            SetupError::Mounts(_) => "mounts",
            SetupError::WorkingDir { .. } => "chdir",
            SetupError::RlimitRead { .. } | SetupError::RlimitSet { .. } => "rlimits",
            SetupError::Capabilities { .. } => "caps",
            SetupError::NoNewPrivs(_) => "no_new_privs",
            SetupError::LandlockMissing { .. }
            | SetupError::LandlockAbi { .. }
            | SetupError::Landlock(_)
            | SetupError::LandlockPath { .. }
            | SetupError::LandlockPartial { .. } => "landlock",
            SetupError::SeccompArch(_)
            | SetupError::SeccompRule { .. }
            | SetupError::SeccompFilter(_)
            | SetupError::SeccompLoad(_) => "seccomp",
            SetupError::CloseFds(_) => "close_fds",
            SetupError::NoCommand
            | SetupError::NulByte { .. }
            | SetupError::Exec { .. }
            | SetupError::ExecDenied { .. }
            | SetupError::NotFound { .. } => "exec",
        }
    }
}
