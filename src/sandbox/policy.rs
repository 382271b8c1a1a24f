//! Policy files: the TOML format, strict loading, placeholder resolution.
//!
//! INTERFACE STUB written by the lead so other subsystems compile; the sandbox work
//! replaces the bodies and may extend the types (keep these signatures).

use std::path::PathBuf;

/// Values for the placeholders a policy may use in paths.
#[derive(Debug, Clone, Default)]
pub struct Placeholders {
    /// `{workspace}`: the directory the agent works in.
    pub workspace: PathBuf,
    /// `{tmp}`: a private temp directory for this job or session (the caller creates it).
    pub tmp: PathBuf,
    /// `{python}`: installation prefixes of the interpreter in use (sys.prefix, sys.base_prefix, ...).
    pub python: Vec<PathBuf>,
    /// `{venv}`: the session's virtual environment, if any.
    pub venv: Option<PathBuf>,
    /// `{uv_cache}`: uv's cache directory, if known.
    pub uv_cache: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("unknown policy {name:?}; known policies: {known}")]
    Unknown { name: String, known: String },
}

/// A policy as written in a file (placeholders unresolved).
#[derive(Debug, Clone)]
pub struct Policy {
    pub name: String,
}

impl Policy {
    /// Load a shipped policy by name, or a policy file by path.
    pub fn load(name_or_path: &str) -> Result<Policy, PolicyError> {
        Ok(Policy {
            name: name_or_path.to_string(),
        })
    }

    /// Resolve placeholders into absolute paths; the result is what the launcher enforces.
    pub fn resolve(&self, _placeholders: &Placeholders) -> Result<ResolvedPolicy, PolicyError> {
        Ok(ResolvedPolicy {
            name: self.name.clone(),
        })
    }
}

/// A policy with every path absolute, ready for the launcher.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ResolvedPolicy {
    pub name: String,
}
