//! Principals of the HTTP transport (`--tokens FILE`): who a bearer token belongs to, and
//! each principal's own [`App`] — its own sessions, jobs, scripts, venvs, package caches,
//! state dir (`<state>/principals/<name>`) and workspace — so that nothing one principal
//! makes can be named, listed or reached by another: the isolation is structural, not a
//! filter on shared tables. Quotas are the app's own limits, set per principal.
//!
//! The file (TOML, mode 0600 or stricter, re-read on SIGHUP):
//!
//! ```toml
//! [principal.alice]
//! token = "a-long-random-secret"   # at least 16 characters, unique
//! max_sessions = 4                 # Python sessions at once (default: the server's)
//! max_running_jobs = 8             # jobs running at once (default: no limit)
//! disk = "2GiB"                    # job output on disk (default: the server's --disk-cap)
//! workspace = "/srv/alice"         # default: <server workspace>/<name>
//! ```

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use serde::Deserialize;

use crate::app::App;
use crate::app::settings::Sources;

use super::ServerError;
use super::transport::sessions::Principal;

/// Shortest token accepted in a tokens file.
const MIN_TOKEN: usize = 16;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    principal: BTreeMap<String, Spec>,
}

/// One principal of the tokens file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    token: String,
    max_sessions: Option<usize>,
    max_running_jobs: Option<u64>,
    max_mcp_sessions: Option<usize>,
    disk: Option<String>,
    workspace: Option<PathBuf>,
}

/// The principals of a tokens file and their apps (made on first use).
pub(crate) struct Tenants {
    path: PathBuf,
    /// The server's own settings, which a principal's app starts from.
    base: crate::app::Config,
    /// The server's workspace and state dir (a principal's live below them).
    workspace: PathBuf,
    state_dir: PathBuf,
    specs: RwLock<BTreeMap<String, Spec>>,
    apps: Mutex<HashMap<String, Arc<App>>>,
    /// The server's drain flag, which every principal's app obeys.
    lifecycle: Arc<crate::app::Lifecycle>,
}

impl std::fmt::Debug for Tenants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenants").field("path", &self.path).finish()
    }
}

impl Tenants {
    /// Read the tokens file; `base` is the server's config and `app` its own app (whose
    /// workspace and state dir the principals' live below).
    pub(crate) fn load(
        path: &Path,
        base: crate::app::Config,
        app: &App,
    ) -> Result<Tenants, ServerError> {
        let specs = read(path)?;
        Ok(Tenants {
            path: path.to_path_buf(),
            base,
            // A tokens file's principals cannot name a workspace: a broad start dir fails here.
            workspace: app
                .workspace_root()
                .map_err(|e| ServerError::Config(e.to_string()))?,
            state_dir: app.state_dir().to_path_buf(),
            specs: RwLock::new(specs),
            apps: Mutex::new(HashMap::new()),
            lifecycle: app.lifecycle(),
        })
    }

    /// Read the file again (SIGHUP): new principals and tokens apply at once, removed
    /// ones can no longer authenticate. A principal's app, once made, keeps its quotas
    /// until the server restarts. A file that does not read leaves the old table in
    /// force. Returns how many principals there are now.
    pub(crate) fn reload(&self) -> Result<usize, ServerError> {
        let specs = read(&self.path)?;
        let n = specs.len();
        *self.specs.write().unwrap_or_else(|p| p.into_inner()) = specs;
        Ok(n)
    }

    pub(crate) fn len(&self) -> usize {
        self.specs.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The principal whose token `presented` is (compared in constant time, every
    /// token looked at), if any.
    pub(crate) fn principal_of(&self, presented: &str) -> Option<Principal> {
        let specs = self.specs.read().unwrap_or_else(|p| p.into_inner());
        let mut found = None;
        for (name, spec) in specs.iter() {
            if super::transport::tokens_equal(presented, &spec.token) && found.is_none() {
                found = Some(Principal::new(name));
            }
        }
        found
    }

    /// The MCP sessions `principal` may hold open at once: its `max_mcp_sessions`, else a
    /// quarter of the server's total (at least 1), so no principal can take every one.
    pub(crate) fn mcp_session_quota(&self, principal: &Principal, total: usize) -> usize {
        let specs = self.specs.read().unwrap_or_else(|p| p.into_inner());
        specs
            .get(principal.name())
            .and_then(|s| s.max_mcp_sessions)
            .unwrap_or((total / 4).max(1))
    }

    /// `principal`'s app, made on first use.
    pub(crate) fn app(&self, principal: &Principal) -> Result<Arc<App>, String> {
        let name = principal.name();
        let spec = self
            .specs
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
            .ok_or_else(|| format!("principal {name:?} is no longer in the tokens file"))?;
        let mut apps = self.apps.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(app) = apps.get(name) {
            return Ok(app.clone());
        }
        let cfg = self.config_for(name, &spec)?;
        if let Some(ws) = &cfg.workspace {
            std::fs::create_dir_all(ws).map_err(|e| {
                format!(
                    "cannot create the workspace {} of principal {name:?}: {e}",
                    ws.display()
                )
            })?;
        }
        let app = Arc::new(
            App::new(&cfg)
                .map_err(|e| e.to_string())?
                .sharing_lifecycle(self.lifecycle.clone()),
        );
        tracing::info!(
            principal = name,
            "first use of a principal: its own sessions, jobs and stores"
        );
        apps.insert(name.to_string(), app.clone());
        Ok(app)
    }

    /// Every principal's app made so far (for shutdown).
    pub(crate) fn apps(&self) -> Vec<Arc<App>> {
        let apps = self.apps.lock().unwrap_or_else(|p| p.into_inner());
        apps.values().cloned().collect()
    }

    fn config_for(&self, name: &str, spec: &Spec) -> Result<crate::app::Config, String> {
        let mut cfg = self.base.clone();
        cfg.principal = Some(name.to_string());
        cfg.state_dir = Some(self.state_dir.join("principals").join(name));
        cfg.workspace = Some(
            spec.workspace
                .clone()
                .unwrap_or_else(|| self.workspace.join(name)),
        );
        // A principal's client cannot move its workspace (roots) or loosen its sandbox.
        cfg.sources = Sources {
            inherit_sandbox: false,
            workspace_from_roots: false,
        };
        if let Some(n) = spec.max_sessions {
            cfg.max_sessions = n;
        }
        cfg.max_running_jobs = spec.max_running_jobs;
        if let Some(disk) = &spec.disk {
            cfg.disk_cap =
                parse_size(disk).map_err(|e| format!("principal {name:?}: disk: {e}"))?;
        }
        Ok(cfg)
    }
}

fn parse_size(text: &str) -> Result<u64, String> {
    let size = match text.trim().parse::<u64>() {
        Ok(n) => crate::sandbox::policy::ByteSize::Bytes(n),
        Err(_) => crate::sandbox::policy::ByteSize::Text(text.to_string()),
    };
    crate::sandbox::policy::parse_size(&size).map_err(|e| e.to_string())
}

fn bad(path: &Path, why: impl std::fmt::Display) -> ServerError {
    ServerError::Config(format!("tokens file {}: {why}", path.display()))
}

/// Parse and check the file: private (no group or other access), principals named like
/// sessions (they become directory names), tokens long and unique, sizes that parse.
fn read(path: &Path) -> Result<BTreeMap<String, Spec>, ServerError> {
    let meta = std::fs::metadata(path).map_err(|e| bad(path, format!("cannot read it: {e}")))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(bad(
            path,
            format!(
                "its mode is {mode:o}: tokens are secrets; `chmod 600` it (no access for group or others)"
            ),
        ));
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| bad(path, format!("cannot read it: {e}")))?;
    let file: TokensFile = toml::from_str(&text).map_err(|e| bad(path, e.message().trim_end()))?;
    if file.principal.is_empty() {
        return Err(bad(
            path,
            "it names no principal; add `[principal.NAME]` tables with a `token`",
        ));
    }
    let mut seen: Vec<&str> = Vec::new();
    for (name, spec) in &file.principal {
        if !crate::names::is_valid_session_name(name) || name == "local" {
            return Err(bad(
                path,
                format!(
                    "principal name {name:?}: use 1-64 of A-Z a-z 0-9 . _ - (not \"local\", \".\" or \"..\")"
                ),
            ));
        }
        if spec.token.chars().count() < MIN_TOKEN {
            return Err(bad(
                path,
                format!("the token of {name:?} is shorter than {MIN_TOKEN} characters"),
            ));
        }
        if seen.contains(&spec.token.as_str()) {
            return Err(bad(
                path,
                format!("the token of {name:?} is another principal's too"),
            ));
        }
        seen.push(&spec.token);
        if let Some(disk) = &spec.disk {
            parse_size(disk).map_err(|e| bad(path, format!("principal {name:?}: disk: {e}")))?;
        }
    }
    Ok(file.principal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str, mode: u32) -> PathBuf {
        let p = dir.join("tokens.toml");
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    const GOOD: &str = "[principal.alice]\ntoken = \"alice-0123456789abcdef\"\nmax_running_jobs = 2\n\n[principal.bob]\ntoken = \"bob-0123456789abcdef\"\ndisk = \"1GiB\"\n";

    #[test]
    fn a_private_file_with_valid_principals_reads() {
        let (_s, dir) = crate::test_support::scratch_path("tenants", "d");
        std::fs::create_dir_all(&dir).unwrap();
        let specs = read(&write(&dir, GOOD, 0o600)).unwrap();
        assert_eq!(specs.keys().collect::<Vec<_>>(), ["alice", "bob"]);
        assert_eq!(specs["alice"].max_running_jobs, Some(2));
    }

    #[test]
    fn bad_files_are_refused_in_words() {
        let (_s, dir) = crate::test_support::scratch_path("tenants", "d");
        std::fs::create_dir_all(&dir).unwrap();
        let cases = [
            (GOOD, 0o644, "mode is 644"),
            ("", 0o600, "names no principal"),
            (
                "[principal.\"a/b\"]\ntoken = \"0123456789abcdef0\"\n",
                0o600,
                "principal name",
            ),
            (
                "[principal.local]\ntoken = \"0123456789abcdef0\"\n",
                0o600,
                "principal name",
            ),
            (
                "[principal.a]\ntoken = \"short\"\n",
                0o600,
                "shorter than 16",
            ),
            (
                "[principal.a]\ntoken = \"0123456789abcdef0\"\n[principal.b]\ntoken = \"0123456789abcdef0\"\n",
                0o600,
                "another principal's too",
            ),
            (
                "[principal.a]\ntoken = \"0123456789abcdef0\"\ncolour = 1\n",
                0o600,
                "unknown field",
            ),
            (
                "[principal.a]\ntoken = \"0123456789abcdef0\"\ndisk = \"lots\"\n",
                0o600,
                "disk",
            ),
        ];
        for (text, mode, want) in cases {
            let err = read(&write(&dir, text, mode)).unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }
}
