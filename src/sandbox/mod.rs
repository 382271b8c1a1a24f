//! The sandbox: policy files (load, validate, resolve placeholders) and the launcher
//! that applies rlimits → capability drop → no_new_privs → Landlock → seccomp, then
//! execs the target. Knows nothing of MCP; the only module that uses landlock and
//! seccompiler.

pub mod launcher;
pub mod policy;

pub use launcher::{
    ExitReport, LaunchError, LimitHit, SandboxCommand, SandboxedChild, Termination,
};
pub use policy::{Placeholders, Policy, PolicyError, ResolvedPolicy};
