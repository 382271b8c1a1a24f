//! Finding the real `uv` binary, and the environment variables every uv process gets.
//!
//! `uv` on PATH is often not uv itself but a wrapper script (a pyenv shim, an asdf
//! shim). A wrapper would need a shell, pyenv and their config inside the sandbox, so
//! we resolve it to the binary it runs: a shebang script is asked which file it
//! execs (`pyenv which uv`), and failing that the `uv` Python package is asked
//! (`python3 -m uv` ships the binary and exposes `uv.find_uv_bin()`).

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{EnvConfig, EnvError};
use crate::sandbox::policy::allow::UrlParts;
use crate::sandbox::{ResolvedPolicy, SandboxCommand};

/// A located, working uv binary.
#[derive(Debug, Clone)]
pub struct Uv {
    /// The uv executable itself (never a wrapper script).
    pub path: PathBuf,
    /// `uv --version` output, e.g. "uv 0.13.9".
    pub version: String,
}

impl Uv {
    /// Find uv: the configured path if any, else `uv` on PATH, resolved through
    /// wrapper scripts to the real binary, then checked with `uv --version`.
    pub fn locate(configured: Option<&Path>) -> Result<Uv, EnvError> {
        let found = match configured {
            Some(path) => {
                if !path.exists() {
                    return Err(EnvError::UvUnusable {
                        path: path.to_path_buf(),
                        why: "no such file".into(),
                    });
                }
                path.to_path_buf()
            }
            None => which::which("uv").map_err(|_| EnvError::UvMissing {
                searched: format!(
                    "searched PATH={}",
                    std::env::var("PATH").unwrap_or_default()
                ),
            })?,
        };
        let path = if is_script(&found) {
            resolve_wrapper(&found).ok_or_else(|| EnvError::UvUnusable {
                path: found.clone(),
                why: "it is a wrapper script and the uv binary behind it could not be found \
                      (tried `pyenv which uv` and the `uv` Python package)"
                    .into(),
            })?
        } else {
            found
        };
        let out =
            Command::new(&path)
                .arg("--version")
                .output()
                .map_err(|e| EnvError::UvUnusable {
                    path: path.clone(),
                    why: e.to_string(),
                })?;
        if !out.status.success() {
            return Err(EnvError::UvUnusable {
                path,
                why: format!(
                    "`uv --version` failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Ok(Uv { path, version })
    }

    /// Environment for every uv process: `cache` (the session's own uv cache), files
    /// copied from it rather than linked, no progress bars or colours, Python downloads
    /// as configured, plus the user's own `UV_*` settings (index URLs, find-links,
    /// offline mode) which the sandbox's environment allow-list would otherwise drop.
    pub fn env(&self, cfg: &EnvConfig, cache: &Path) -> Vec<(OsString, OsString)> {
        let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
            .filter(|(k, _)| {
                k.to_str().is_some_and(|k| {
                    k.starts_with("UV_") && !OWN_VARS.contains(&k) && !is_secret_name(k)
                })
            })
            // Index URLs without their user:password: what uv runs (build hooks) sees
            // this environment; the broker adds credentials where it can.
            .map(|(k, v)| match v.to_str() {
                Some(text) => (k, OsString::from(strip_url_credentials(text))),
                None => (k, v),
            })
            .collect();
        // TLS roots: without them a machine behind an intercepting proxy fails every
        // download with "invalid peer certificate". The server's proxy settings are not
        // passed: the job's proxy is its broker, which chains to them itself.
        env.extend(std::env::vars_os().filter(|(k, _)| {
            k.to_str()
                .is_some_and(|k| NETWORK_VARS.contains(&k.to_ascii_uppercase().as_str()))
        }));
        let set = |env: &mut Vec<(OsString, OsString)>, k: &str, v: OsString| {
            env.push((k.into(), v));
        };
        set(&mut env, "UV_CACHE_DIR", cache.as_os_str().to_owned());
        // Copies: a venv's file is never also a cache file (the two are bound apart in
        // the job's view, where uv's hard links fail and it copies anyway, warning).
        set(&mut env, "UV_LINK_MODE", "copy".into());
        set(&mut env, "UV_NO_PROGRESS", "1".into());
        set(&mut env, "NO_COLOR", "1".into());
        // uv.toml files in the workspace are not read: code the agent wrote there could
        // otherwise point the installer (which has network) at another index.
        set(&mut env, "UV_NO_CONFIG", "1".into());
        if cfg.python_downloads {
            set(&mut env, "UV_PYTHON_DOWNLOADS", "automatic".into());
            set(
                &mut env,
                "UV_PYTHON_INSTALL_DIR",
                cache.join("python").into_os_string(),
            );
        } else {
            set(&mut env, "UV_PYTHON_DOWNLOADS", "never".into());
        }
        env
    }

    /// The uv binary installs run: a copy of [`Uv::path`] in `<state_dir>/uv-bin` with
    /// mode `0111` (execute, no read), made once per uv binary. A process that execs a
    /// file it may not read is not dumpable (the kernel's `would_dump`; the job holds no
    /// capability that would let it read it), so the build hooks uv starts — same uid,
    /// same sandbox — can neither see uv in their `/proc` (mounted `hidepid=ptraceable`)
    /// nor read or write its memory through `/proc/<pid>/mem`: uv's own connections,
    /// the only ones the broker lends index credentials to, stay uv's. If the copy cannot
    /// be made, uv itself runs (logged).
    pub fn sealed(&self, cfg: &EnvConfig) -> PathBuf {
        match seal(&self.path, &cfg.state_dir.join("uv-bin")) {
            Ok(path) => path,
            Err(e) => {
                tracing::warn!(
                    "cannot make the execute-only copy of {} for installs ({e}); build hooks \
                     may read and write the uv process's memory",
                    self.path.display()
                );
                self.path.clone()
            }
        }
    }

    /// Set [`Uv::env`] on a command, and a `PATH` with only the directories `policy`
    /// lets it execute from (see [`super::policy::sandbox_path`]).
    pub fn apply_env(
        &self,
        cmd: &mut SandboxCommand,
        cfg: &EnvConfig,
        policy: &ResolvedPolicy,
        cache: &Path,
    ) {
        for (k, v) in self.env(cfg, cache) {
            cmd.env(k, v);
        }
        let path = std::env::var_os("PATH");
        cmd.env(
            "PATH",
            super::policy::sandbox_path(policy, &cfg.python, path.as_deref()),
        );
    }
}

/// The execute-only copy of `src` in `dir` (see [`Uv::sealed`]), named after the
/// source's identity so a changed uv gets a new one; copies of other uv binaries there
/// are removed.
fn seal(src: &Path, dir: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(src)?;
    let name = format!(
        "uv-{}-{}-{}-{}.{}",
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec()
    );
    let dest = dir.join(&name);
    if let Ok(m) = std::fs::symlink_metadata(&dest)
        && m.is_file()
        && m.len() == meta.len()
        && m.mode() & 0o7777 == 0o111
    {
        return Ok(dest);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mut tmp = tempfile::Builder::new().prefix(".uv-").tempfile_in(dir)?;
    std::io::copy(&mut std::fs::File::open(src)?, tmp.as_file_mut())?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o111))?;
    // Closed before anything execs it (a file open for writing cannot be executed).
    drop(tmp.persist(&dest).map_err(|e| e.error)?);
    for entry in std::fs::read_dir(dir)?.flatten() {
        let other = entry.file_name();
        if other != name.as_str() && other.to_string_lossy().starts_with("uv-") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(dest)
}

/// Variables [`Uv::env`] sets itself (a user's value for these is not forwarded).
const OWN_VARS: &[&str] = &[
    "UV_CACHE_DIR",
    "UV_LINK_MODE",
    "UV_NO_PROGRESS",
    "UV_NO_CONFIG",
    "UV_PYTHON_DOWNLOADS",
    "UV_PYTHON_INSTALL_DIR",
];

/// Variables uv's TLS stack reads.
const NETWORK_VARS: &[&str] = &["SSL_CERT_FILE", "SSL_CERT_DIR"];

/// Variables naming package indexes or find-links URLs (space- or comma-separated,
/// `UV_INDEX` entries maybe `name=url`).
const INDEX_VARS: &[&str] = &[
    "UV_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_INDEX",
    "UV_FIND_LINKS",
];

/// Variables that replace PyPI as the default index.
const DEFAULT_INDEX_VARS: &[&str] = &["UV_INDEX_URL", "UV_DEFAULT_INDEX"];

/// The installer's default allow list: the hosts of uv's configured indexes and
/// find-links URLs in `vars`, plus pypi.org and files.pythonhosted.org unless a default
/// index replaces PyPI.
pub(crate) fn default_index_allow(vars: impl Iterator<Item = (String, String)>) -> Vec<String> {
    let vars: Vec<(String, String)> = vars.collect();
    let mut allow: Vec<String> = Vec::new();
    let replaced = vars
        .iter()
        .any(|(k, v)| DEFAULT_INDEX_VARS.contains(&k.as_str()) && !v.trim().is_empty());
    if !replaced {
        allow.extend(["pypi.org".to_string(), "files.pythonhosted.org".to_string()]);
    }
    for (k, v) in &vars {
        if !INDEX_VARS.contains(&k.as_str()) {
            continue;
        }
        for token in v.split([' ', ',', '\n']).filter(|t| !t.is_empty()) {
            let url = match token.split_once('=') {
                Some((name, url)) if !name.contains("://") => url,
                _ => token,
            };
            if let Some(u) = UrlParts::parse(url) {
                let entry = u.allow_entry();
                if !allow.contains(&entry) {
                    allow.push(entry);
                }
            }
        }
    }
    allow
}

/// `text` with the `user:password@` of every http(s) URL in it removed.
pub(crate) fn strip_url_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut token = String::new();
    let flush = |token: &mut String, out: &mut String| {
        let (prefix, url) = match token.split_once('=') {
            Some((name, url)) if !name.contains("://") => (format!("{name}="), url.to_string()),
            _ => (String::new(), token.clone()),
        };
        match UrlParts::parse(&url) {
            Some(u) if u.user.is_some() => {
                out.push_str(&prefix);
                out.push_str(&u.without_credentials());
            }
            _ => out.push_str(token),
        }
        token.clear();
    };
    for c in text.chars() {
        if c == ' ' || c == ',' || c == '\n' {
            flush(&mut token, &mut out);
            out.push(c);
        } else {
            token.push(c);
        }
    }
    flush(&mut token, &mut out);
    out
}

/// Files and directories named by `SSL_CERT_FILE` / `SSL_CERT_DIR`: the installer's
/// sandbox must be able to read them.
pub(crate) fn tls_paths() -> Vec<PathBuf> {
    ["SSL_CERT_FILE", "SSL_CERT_DIR"]
        .iter()
        .filter_map(std::env::var_os)
        .flat_map(|v| std::env::split_paths(&v).collect::<Vec<_>>())
        .filter(|p| p.is_absolute() && p.exists())
        .collect()
}

/// Credentials uv reads from the environment are not handed to sandboxed processes.
fn is_secret_name(key: &str) -> bool {
    let k = key.to_ascii_uppercase();
    [
        "PASSWORD",
        "TOKEN",
        "SECRET",
        "USERNAME",
        "CREDENTIAL",
        "AUTH",
    ]
    .iter()
    .any(|w| k.contains(w))
}

/// Local directories named by `UV_FIND_LINKS` (comma-separated; URLs skipped): the
/// installer's sandbox must be able to read them.
pub(crate) fn find_links_dirs() -> Vec<PathBuf> {
    let Ok(value) = std::env::var("UV_FIND_LINKS") else {
        return Vec::new();
    };
    value
        .split([',', ' '])
        .map(str::trim)
        .filter(|s| !s.is_empty() && !s.contains("://"))
        .map(|s| PathBuf::from(s.strip_prefix("file:").unwrap_or(s)))
        .filter(|p| p.is_absolute())
        .collect()
}

fn is_script(path: &Path) -> bool {
    let mut head = [0u8; 2];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| &head == b"#!")
}

/// The binary behind a wrapper script, if it can be found.
fn resolve_wrapper(script: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(script).unwrap_or_default();
    if text.contains("pyenv")
        && let Some(p) = command_line("pyenv", &["which", "uv"]).map(PathBuf::from)
        && p.is_file()
        && !is_script(&p)
    {
        return Some(p);
    }
    for python in ["python3", "python"] {
        let code = "import uv; print(uv.find_uv_bin())";
        if let Some(p) = command_line(python, &["-c", code]) {
            let p = PathBuf::from(p);
            if p.is_file() && !is_script(&p) {
                return Some(p);
            }
        }
    }
    None
}

/// First line of a command's stdout, if it succeeded. Run from `/`, not from the
/// server's working directory (often the workspace): there `python -c` would import a
/// job's `uv.py` and pyenv would read a job's `.python-version`, outside the sandbox.
fn command_line(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .current_dir("/")
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let line = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()?
        .trim()
        .to_string();
    (!line.is_empty()).then_some(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_resolves_wrapper_scripts_to_the_binary() {
        let uv = Uv::locate(None).expect("uv is installed on this machine");
        assert!(!is_script(&uv.path), "{} is a script", uv.path.display());
        assert!(uv.version.starts_with("uv "), "{}", uv.version);
    }

    #[test]
    fn the_sealed_copy_is_execute_only_and_made_once_per_binary() {
        use std::os::unix::fs::PermissionsExt;
        let dir = crate::test_support::scratch_dir("uv-seal");
        let src = dir.path().join("uv");
        std::fs::write(&src, b"#!/bin/sh\necho uv 0.0.0\n").unwrap();
        std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = dir.path().join("bin");
        let first = seal(&src, &bin).unwrap();
        let meta = std::fs::metadata(&first).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o111);
        assert_eq!(seal(&src, &bin).unwrap(), first);
        // Another uv binary: a new copy, the old one removed.
        std::fs::write(&src, b"#!/bin/sh\necho uv 0.0.1 (longer)\n").unwrap();
        let second = seal(&src, &bin).unwrap();
        assert_ne!(second, first);
        assert!(!first.exists());
        let left: Vec<_> = std::fs::read_dir(&bin).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "{left:?}");
    }

    #[test]
    fn missing_configured_uv_says_so() {
        let err = Uv::locate(Some(Path::new("/nonexistent/uv"))).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/uv"), "{err}");
    }

    #[test]
    fn missing_uv_message_names_pip_install_and_features() {
        let err = EnvError::UvMissing {
            searched: "PATH=/x".into(),
        };
        let text = err.to_string();
        assert!(text.contains("pip install uv"), "{text}");
        assert!(text.contains("package installs"), "{text}");
    }

    #[test]
    fn index_hosts_make_the_default_allow_list() {
        let v = |pairs: &[(&str, &str)]| {
            default_index_allow(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        };
        assert_eq!(v(&[]), vec!["pypi.org", "files.pythonhosted.org"]);
        assert_eq!(
            v(&[
                ("UV_INDEX_URL", "https://u:p@pkgs.corp/simple"),
                (
                    "UV_EXTRA_INDEX_URL",
                    "http://127.0.0.1:8123/simple https://x.org/s"
                ),
                ("UV_FIND_LINKS", "/local/dir,http://[::1]:9000/"),
                ("HOME", "https://not.an.index"),
            ]),
            vec!["pkgs.corp", "127.0.0.1:8123", "x.org", "[::1]:9000"]
        );
    }

    #[test]
    fn credentials_are_stripped_from_urls() {
        assert_eq!(
            strip_url_credentials("https://u:p@pkgs.corp/simple http://x.org/s"),
            "https://pkgs.corp/simple http://x.org/s"
        );
        assert_eq!(
            strip_url_credentials("corp=https://tok@pkgs.corp/simple"),
            "corp=https://pkgs.corp/simple"
        );
        assert_eq!(strip_url_credentials("/a/dir,/b"), "/a/dir,/b");
    }

    #[test]
    fn secrets_are_not_forwarded() {
        assert!(is_secret_name("UV_INDEX_CORP_USERNAME"));
        assert!(is_secret_name("UV_INDEX_PASSWORD"));
        assert!(is_secret_name("UV_PUBLISH_TOKEN"));
        assert!(!is_secret_name("UV_FIND_LINKS"));
    }
}
