//! The sandbox: policy files (load, validate, resolve placeholders) and the launcher
//! that applies rlimits → capability drop → no_new_privs → Landlock → seccomp, then
//! execs the target. Knows nothing of MCP; the only module that uses landlock and
//! seccompiler.
//!
//! Three parts, named for where their code runs, importing in one direction only
//! (`parent → launcher → policy`; `tests/suite/deps.rs` checks it):
//!
//! - `policy/`: pure data — the policy format and loading, placeholder resolution
//!   (`resolve`), the network allow-list (`allow`), denials in words (`explain`).
//! - `launcher/`: the code that runs inside the launcher process — the launch spec and
//!   its steps (`mod.rs`), the PID-namespace init and supervisor (`pidns`), one installer
//!   per mechanism (`cgroup` join, `netns`, `mounts`, `rlimits`, `privileges`,
//!   `landlock`, `seccomp`), `isolation`.
//! - `parent/`: the server's (or `run`'s) side — the [`Runtime`] every spawn goes
//!   through, `spawn`, the `zygote`, the `pool`s made ahead, job `cgroup`s, the broker's
//!   `netns` and `proxy` interface, `child` (waiting, signals, rusage), `instance`,
//!   `probe` (`doctor`).

pub(crate) mod launcher;
pub(crate) mod parent;
pub(crate) mod policy;

pub use launcher::error::SetupError;
pub use launcher::privileges::harden_current_process;
pub use launcher::{is_launcher_invocation, launcher_main};
pub use parent::child::{
    ExitReport, GroupKiller, LeftInit, LimitHit, Pidfd, SandboxedChild, Termination, signal_name,
};
pub use parent::error::LaunchError;
pub use parent::runtime::{Route, Runtime, RuntimeConfig};
pub use parent::spawn::{Io, SandboxCommand};
pub use parent::zygote::{is_zygote_invocation, zygote_main};
pub use policy::error::PolicyError;
pub use policy::explain::explain_denials;
pub use policy::resolve::{Limits, NetworkPolicy, Placeholders, ResolvedPolicy};
pub use policy::{DEFAULT_POLICY, KernelSupportMode, NetworkMode, Policy, Scoping};
