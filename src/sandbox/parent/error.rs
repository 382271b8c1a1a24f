//! [`LaunchError`]: starting a sandboxed process failed; the message says what failed,
//! why, and what to do.

use std::ffi::OsString;

use crate::sandbox::launcher::error::SetupError;

/// Starting a sandboxed process failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("could not start {program:?}: {source}")]
    Spawn {
        program: OsString,
        source: std::io::Error,
    },
    /// A setup step in this process failed before the launcher started.
    #[error("sandbox setup failed: {0}")]
    Setup(#[from] SetupError),
    /// The launcher reported a failure before exec: a [`SetupError`]'s words, as they
    /// crossed the status pipe from the launcher process.
    #[error("sandbox setup failed: {0}")]
    Launcher(String),
    /// The job's network broker (proxy mode) could not be set up.
    #[error(transparent)]
    Proxy(#[from] super::proxy::ProxyError),
}
