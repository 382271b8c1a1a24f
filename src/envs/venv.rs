//! A session's virtual environment: where it lives, creating it with `uv venv` on
//! first need, and what the session worker needs to see packages installed into it.
//!
//! How a running session sees new packages (the contract with the server/repl):
//! - Best: start the session's worker with [`Venv::python`]. `sys.prefix` is then the
//!   venv and its site-packages is on `sys.path` from the start.
//! - Either way, after every successful install run [`Venv::activation_code`] as a
//!   cell in the session: it adds the venv's site-packages with `site.addsitedir`
//!   (which also processes new `.pth` files) and calls `importlib.invalidate_caches()`,
//!   so `import pkg` works in the same session with all earlier state intact.
//! - Workers started later (restart, crash, the spare) get [`Venv::site_packages`]
//!   through the repl's start-up hook (`SessionManager::set_site_dirs`), which the
//!   server sets when it activates the venv.
//! - The session's policy gets `{venv}` = [`Venv::root`] (read-only for session code;
//!   only the installer writes there).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::policy::{self, Grants};
use super::process::DiskWatch;
use super::{Canceller, EnvConfig, EnvError, Lease, NullSink, Uv, process};
use crate::sandbox::{Policy, ResolvedPolicy};

/// Where a session's venv is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VenvLocation {
    /// `<state_dir>/venvs/<session>`, created on first need.
    Managed { session: String },
    /// A path the user named; created there if missing.
    Path(PathBuf),
    /// `<workspace>/.venv`, which must already exist.
    Workspace,
}

/// An existing virtual environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Venv {
    root: PathBuf,
    python: PathBuf,
    site_packages: PathBuf,
    /// The interpreter version from `pyvenv.cfg`, e.g. "3.11.7".
    pub python_version: Option<String>,
}

impl Venv {
    /// The venv directory (`{venv}` in policies).
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// `<venv>/bin/python`: start a worker with it to get the venv from the start.
    pub fn python(&self) -> &Path {
        &self.python
    }
    /// `<venv>/lib/pythonX.Y/site-packages`.
    pub fn site_packages(&self) -> &Path {
        &self.site_packages
    }

    /// Python code that makes a running interpreter see packages installed into this
    /// venv (idempotent; run it as a cell after each install).
    pub fn activation_code(&self) -> String {
        let dir = self.site_packages.to_string_lossy();
        format!(
            "import site as _s, importlib as _il\n_s.addsitedir({})\n_il.invalidate_caches()\ndel _s, _il\n",
            py_str(&dir)
        )
    }

    /// Open an existing venv at `root` (it must have `bin/python` and one
    /// `lib/python*/site-packages`).
    pub fn open(root: &Path) -> Result<Venv, EnvError> {
        let no = |why: &str| EnvError::NoVenv {
            path: root.to_path_buf(),
            why: why.into(),
        };
        if !root.is_dir() {
            return Err(no("the directory does not exist"));
        }
        let python = root.join("bin").join("python");
        if !python.exists() {
            return Err(no("it has no bin/python"));
        }
        let lib = root.join("lib");
        let entries = std::fs::read_dir(&lib).map_err(|_| no("it has no lib directory"))?;
        let mut sites: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
            .map(|e| e.path().join("site-packages"))
            .filter(|p| p.is_dir())
            .collect();
        sites.sort();
        let Some(site_packages) = sites.pop() else {
            return Err(no("it has no lib/python*/site-packages"));
        };
        let python_version =
            read_cfg(root).and_then(|cfg| cfg_value(&cfg, &["version_info", "version"]));
        Ok(Venv {
            root: root.to_path_buf(),
            python,
            site_packages,
            python_version,
        })
    }
}

/// A venv's `pyvenv.cfg` as the server reads it: a workspace venv's is the jobs' to
/// write, so only a regular file (not a FIFO that would hold the server's thread, not a
/// link), opened without blocking, and only its first 64 KiB.
fn read_cfg(root: &Path) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    super::open_job_file(&root.join("pyvenv.cfg"), 64 << 10)?
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// Let session workers read (and run programs from) the managed venvs, which live in
/// `<state_dir>/venvs`. The directory is created now: Landlock rules name existing
/// paths, and a worker's rules are fixed when it starts, so a venv created later for a
/// running session is readable only if its parent was allowed from the start. Writing
/// stays denied: only the installer's own policy may write a venv.
pub fn allow_session_venvs(policy: &mut Policy, state_dir: &Path) -> Result<(), EnvError> {
    let dir = state_dir.join("venvs");
    std::fs::create_dir_all(&dir)
        .map_err(|e| EnvError::io(format!("creating {}", dir.display()), e))?;
    let dir = dir.to_string_lossy().into_owned();
    for list in [&mut policy.filesystem.read, &mut policy.filesystem.execute] {
        if !list.contains(&dir) {
            list.push(dir.clone());
        }
    }
    Ok(())
}

/// The directory a location stands for (not checked or created).
pub fn location_path(cfg: &EnvConfig, location: &VenvLocation) -> Result<PathBuf, EnvError> {
    match location {
        VenvLocation::Managed { session } => {
            check_session_name(session)?;
            Ok(cfg.state_dir.join("venvs").join(session))
        }
        VenvLocation::Path(p) if p.is_absolute() => Ok(p.clone()),
        VenvLocation::Path(p) => Ok(cfg.workspace.join(p)),
        VenvLocation::Workspace => Ok(cfg.workspace.join(".venv")),
    }
}

/// The venv at `location`, created with `uv venv` (through the sandbox, writes allowed
/// only to the venv and the uv cache of `lease`'s owner, within their disk bound) if it
/// does not exist yet.
pub async fn ensure(
    cfg: &EnvConfig,
    uv: &Uv,
    location: &VenvLocation,
    session_policy: &ResolvedPolicy,
    lease: &Lease,
) -> Result<Venv, EnvError> {
    let root = location_path(cfg, location)?;
    if matches!(location, VenvLocation::Workspace) || root.join("pyvenv.cfg").exists() {
        let venv = Venv::open(&root)?;
        lease.set_venv(venv.root());
        return Ok(venv);
    }
    if root.exists()
        && std::fs::read_dir(&root)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        return Err(EnvError::NoVenv {
            path: root,
            why: "the directory exists, is not empty and is not a virtual environment".into(),
        });
    }
    let cache = lease.cache_dir()?;
    // A `Path` location lies in the workspace, where sandboxed code can swap a directory
    // for a symlink: its caller created it through descriptors (app::workspace), and
    // creating it again by path here could follow such a link out.
    let mut dirs = vec![];
    if !matches!(location, VenvLocation::Path(_)) {
        dirs.push(&root);
    } else if !root.is_dir() {
        return Err(EnvError::NoVenv {
            path: root,
            why: "the directory for it is missing; create it inside the workspace first".into(),
        });
    }
    for dir in dirs {
        std::fs::create_dir_all(dir)
            .map_err(|e| EnvError::io(format!("creating {}", dir.display()), e))?;
    }
    lease.set_venv(&root);
    let stores = vec![root.clone(), cache.clone()];
    let grants = Grants {
        write: stores.clone(),
        read: vec![],
        execute: vec![uv.path.clone(), cfg.python.clone()],
        network: false,
        confine_writes: true,
    };
    let policy = Arc::new(policy::extend(
        session_policy,
        &grants,
        cfg.sandbox.namespaces_usable(),
    ));
    let mut cmd = cfg.sandbox.command(policy.clone(), &uv.path);
    cmd.args(["venv", "--quiet", "--python"])
        .arg(&cfg.python)
        .arg(&root);
    uv.apply_env(&mut cmd, cfg, &policy, &cache);
    let watch = DiskWatch::new(lease, stores, &policy);
    let outcome = process::run(
        cmd,
        Arc::new(NullSink),
        None,
        &Canceller::new(),
        None,
        Some(watch),
    )
    .await?;
    if !outcome.success() {
        return Err(EnvError::VenvCreate {
            path: root,
            message: outcome
                .limit_words(&policy)
                .unwrap_or_else(|| super::install::uv_explanation(&outcome.stderr_tail)),
        });
    }
    Venv::open(&root)
}

fn check_session_name(name: &str) -> Result<(), EnvError> {
    if crate::names::is_valid_session_name(name) {
        Ok(())
    } else {
        Err(EnvError::BadSessionName(name.to_string()))
    }
}

fn cfg_value(cfg: &str, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|key| {
        cfg.lines().find_map(|line| {
            let (k, v) = line.split_once('=')?;
            (k.trim() == *key).then(|| v.trim().to_string())
        })
    })
}

/// A Python string literal for `s` (JSON string syntax is valid Python here).
fn py_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "''".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> EnvConfig {
        EnvConfig {
            sandbox: crate::sandbox::Runtime::new(crate::sandbox::RuntimeConfig::server()),
            state_dir: "/state".into(),
            workspace: "/ws".into(),
            python: "/usr/bin/python3".into(),
            python_version: None,
            uv: None,
            uv_cache: None,
            disk: Default::default(),
            python_downloads: false,
            sources: Default::default(),
            principal: None,
        }
    }

    #[test]
    fn locations_map_to_paths() {
        let c = cfg();
        let managed = VenvLocation::Managed {
            session: "s1".into(),
        };
        assert_eq!(
            location_path(&c, &managed).unwrap(),
            PathBuf::from("/state/venvs/s1")
        );
        assert_eq!(
            location_path(&c, &VenvLocation::Workspace).unwrap(),
            PathBuf::from("/ws/.venv")
        );
        let rel = VenvLocation::Path("envs/a".into());
        assert_eq!(
            location_path(&c, &rel).unwrap(),
            PathBuf::from("/ws/envs/a")
        );
    }

    #[test]
    fn session_names_cannot_escape_the_venvs_dir() {
        for bad in ["", "..", "a/b", "../x", "a b"] {
            let loc = VenvLocation::Managed {
                session: bad.into(),
            };
            assert!(
                matches!(
                    location_path(&cfg(), &loc),
                    Err(EnvError::BadSessionName(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn activation_code_quotes_the_path() {
        let v = Venv {
            root: "/v".into(),
            python: "/v/bin/python".into(),
            site_packages: "/v/lib/python3.11/site-packages'x".into(),
            python_version: None,
        };
        let code = v.activation_code();
        assert!(
            code.contains(r#"_s.addsitedir("/v/lib/python3.11/site-packages'x")"#),
            "{code}"
        );
        assert!(code.contains("invalidate_caches()"));
    }

    #[test]
    fn pyvenv_cfg_version() {
        let text = "home = /x\nversion_info = 3.11.7\n";
        assert_eq!(
            cfg_value(text, &["version_info", "version"]).as_deref(),
            Some("3.11.7")
        );
    }

    #[test]
    fn open_rejects_a_plain_directory() {
        let dir = crate::test_support::scratch_dir("envs-open");
        let err = Venv::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("no bin/python"), "{err}");
    }
}
