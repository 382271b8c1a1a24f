//! The sandbox: policy files (load, validate, resolve placeholders) and the launcher
//! that applies rlimits → capability drop → no_new_privs → Landlock → seccomp, then
//! execs the target. Knows nothing of MCP; the only module that uses landlock and
//! seccompiler.
//!
//! - `policy`: the TOML format and strict loading; `resolve`: placeholders → paths.
//! - `spawn` (parent side), `zygote` (the server's fork helper) and `launcher` (the
//!   hidden exec side); `child`: waiting,
//!   rusage, which limit ended a process.
//! - one file per mechanism: `rlimits`, `privileges`, `landlock`, `seccomp`, and
//!   `isolation`, the adapter to the cgroup / network namespace / mount view modules.

pub mod allow;
pub mod cgroup;
pub mod child;
pub mod error;
pub mod explain;
pub mod instance;
pub mod isolation;
pub mod landlock;
pub mod launcher;
pub mod mounts;
pub mod netns;
pub mod pidns;
pub mod policy;
pub mod pool;
pub mod privileges;
pub mod probe;
pub mod proxy;
pub mod resolve;
pub mod rlimits;
pub mod runtime;
pub mod seccomp;
pub mod spawn;
pub mod zygote;

pub use child::{
    ExitReport, GroupKiller, LimitHit, Pidfd, SandboxedChild, Termination, signal_name,
};
pub use error::{LaunchError, PolicyError, SetupError};
pub use explain::explain_denials;
pub use policy::{DEFAULT_POLICY, KernelSupportMode, NetworkMode, Policy, Scoping};
pub use privileges::harden_current_process;
pub use resolve::{Limits, NetworkPolicy, Placeholders, ResolvedPolicy};
pub use runtime::{Route, Runtime, RuntimeConfig};
pub use spawn::{Io, SandboxCommand};
