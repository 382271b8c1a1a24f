//! [`PolicyError`]: loading, validating or resolving a policy failed; the message says
//! what failed, why, and what to do.

use std::path::PathBuf;

/// Loading, validating or resolving a policy failed.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error(
        "unknown policy {name:?}; known policies: {known} (or give a path to a .toml policy file)"
    )]
    Unknown { name: String, known: String },
    #[error("cannot read policy file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// TOML syntax or schema error (unknown key, wrong type); `message` names the key.
    #[error("policy file {file}: {message}")]
    Parse { file: String, message: String },
    /// A value that parses but makes no sense; names the key and what is allowed.
    #[error("policy file {file}: key `{key}`: {message}")]
    Invalid {
        file: String,
        key: String,
        message: String,
    },
    /// A placeholder could not be resolved (e.g. the workspace does not exist).
    #[error("policy {policy}: {message}")]
    Resolve { policy: String, message: String },
}
