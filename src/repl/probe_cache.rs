//! The interpreter probe's answers remembered in the state dir (`python-probe.json`), so
//! a later server does not run the probe again (one interpreter start, tens of
//! milliseconds through a pyenv-style shim, on the way to the first cell).
//!
//! An entry is keyed by the candidate path, this binary's version and worker driver
//! (its precompiled code is stored too), the environment variables that move an
//! interpreter's prefix, and the identity (device, inode, size, mtime, ctime) of the
//! candidate and of the interpreter it named, with and without following symlinks, and
//! of the `pyvenv.cfg` files that would make it a virtual environment. Any change there
//! is a miss, and the probe runs again.
//!
//! An entry is *trusted* (used without a probe) only when the interpreter it names lies
//! under one of the prefixes it reported and either the candidate is that interpreter
//! itself (it resolves to the same file as `sys.executable`), or the candidate is a pyenv
//! shim and everything pyenv chooses by is as it was (its variables, version files and
//! directories: [`PyenvInputs`]). Any other program — a shim script choosing an
//! interpreter by environment or by a version file somewhere —
//! may answer differently with nothing above changed: its entry is only a guess the
//! session manager may start a worker from while the probe checks it, and no cell runs
//! before the probe agrees. The file must belong to the owner of the state dir and be
//! writable by nobody else, or it is ignored.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::ReplError;
use super::python::{PythonInfo, candidate, probe_candidate};

/// The file, in the state dir.
pub(crate) const FILE: &str = "python-probe.json";
/// Entries kept (one per candidate path; the oldest goes first).
const MAX_ENTRIES: usize = 8;
/// Variables that change where an interpreter finds its prefix.
const PREFIX_ENV: [&str; 3] = ["PYTHONHOME", "PYTHONEXECUTABLE", "PYTHONPLATLIBDIR"];

/// What a file was when the entry was written (`None`: it did not exist).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    path: PathBuf,
    follow: bool,
    id: Option<(u64, u64, u64, i64, i64, i64, i64)>,
}

fn stamp(path: &Path, follow: bool) -> Stamp {
    let meta = if follow {
        std::fs::metadata(path)
    } else {
        std::fs::symlink_metadata(path)
    };
    Stamp {
        path: path.to_path_buf(),
        follow,
        id: meta.ok().map(|m| {
            (
                m.dev(),
                m.ino(),
                m.size(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec(),
            )
        }),
    }
}

/// Everything an entry's answer depends on, as it is now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Key {
    server: String,
    driver: u64,
    candidate: PathBuf,
    env: Vec<(String, Option<String>)>,
    stamps: Vec<Stamp>,
    /// For a pyenv shim: everything it chooses the interpreter by (see [`pyenv_inputs`]);
    /// `None` for any other candidate.
    #[serde(default)]
    pyenv: Option<PyenvInputs>,
}

/// What a pyenv shim (`$PYENV_ROOT/shims/python3`: `exec "$PYENV_ROOT/libexec/pyenv" exec
/// python3 "$@"`) decides by when the probe runs it (from `/`, in the server's
/// environment): the variables pyenv reads (`PYENV_VERSION` first of all, `PATH` for the
/// `system` version), the version files it looks for (`.python-version` in `$PYENV_DIR`
/// or the working directory `/` and upward, then `$PYENV_ROOT/version`), and the
/// identity of pyenv itself and what it chooses among (the `versions`, `libexec`,
/// `plugins`, `pyenv.d` directories: an installed, removed or upgraded version or hook
/// changes them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct PyenvInputs {
    root: PathBuf,
    env: Vec<(String, Option<String>)>,
    stamps: Vec<Stamp>,
}

/// Variables a pyenv shim's choice depends on.
const PYENV_ENV: [&str; 6] = [
    "PYENV_VERSION",
    "PYENV_DIR",
    "PYENV_ROOT",
    "PYENV_HOOK_PATH",
    "PYENV_DEBUG",
    "PATH",
];

/// The shim's `PYENV_ROOT`, if `candidate` is a pyenv shim (a short script that sets it
/// and execs `$PYENV_ROOT/libexec/pyenv exec`).
fn pyenv_root(candidate: &Path) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = Vec::with_capacity(1024);
    std::fs::File::open(candidate)
        .ok()?
        .take(4096)
        .read_to_end(&mut head)
        .ok()?;
    let text = std::str::from_utf8(&head).ok()?;
    if !text.starts_with("#!") {
        return None;
    }
    let root = text.lines().find_map(|l| {
        l.trim()
            .strip_prefix("export PYENV_ROOT=")
            .map(|v| v.trim_matches('"'))
    })?;
    let exec = format!("exec \"{root}/libexec/pyenv\" exec ");
    (!root.is_empty() && Path::new(root).is_absolute() && text.contains(&exec))
        .then(|| PathBuf::from(root))
}

fn env_of(names: &[&str]) -> Vec<(String, Option<String>)> {
    names
        .iter()
        .map(|v| {
            let value = std::env::var_os(v).map(|s| s.to_string_lossy().into_owned());
            (v.to_string(), value)
        })
        .collect()
}

/// What a pyenv shim at `candidate` decides by, now (`None`: not a pyenv shim).
fn pyenv_inputs(candidate: &Path) -> Option<PyenvInputs> {
    let root = pyenv_root(candidate)?;
    let mut stamps = Vec::new();
    // The probe runs from `/`: pyenv looks in $PYENV_DIR (default: there) and upward.
    let dir = std::env::var_os("PYENV_DIR").map_or_else(|| PathBuf::from("/"), PathBuf::from);
    for d in dir.ancestors() {
        stamps.push(stamp(&d.join(".python-version"), true));
    }
    for f in [
        "version",
        "versions",
        "libexec",
        "libexec/pyenv",
        "plugins",
        "pyenv.d",
    ] {
        stamps.push(stamp(&root.join(f), true));
    }
    Some(PyenvInputs {
        root,
        env: env_of(&PYENV_ENV),
        stamps,
    })
}

fn key(candidate: &Path, executable: &Path) -> Key {
    let mut stamps = Vec::new();
    for p in [candidate, executable] {
        stamps.push(stamp(p, false));
        stamps.push(stamp(p, true));
    }
    // `site.venv`'s rule (the probe's too): a pyvenv.cfg beside the executable or one up.
    if let Some(dir) = executable.parent() {
        stamps.push(stamp(&dir.join("pyvenv.cfg"), true));
        if let Some(up) = dir.parent() {
            stamps.push(stamp(&up.join("pyvenv.cfg"), true));
        }
    }
    Key {
        server: env!("CARGO_PKG_VERSION").to_string(),
        driver: driver_hash(),
        candidate: candidate.to_path_buf(),
        env: env_of(&PREFIX_ENV),
        stamps,
        pyenv: pyenv_inputs(candidate),
    }
}

/// The embedded driver's hash (SipHash with fixed keys: another Rust release may hash
/// differently, which is only a miss).
fn driver_hash() -> u64 {
    let mut h = DefaultHasher::new();
    super::python::WORKER_SOURCE.hash(&mut h);
    h.finish()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    key: Key,
    executable: PathBuf,
    version: String,
    prefixes: Vec<PathBuf>,
    venv: Option<PathBuf>,
    code: Option<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct CacheFile {
    entries: Vec<Entry>,
}

/// A remembered answer for a candidate.
#[derive(Debug, Clone)]
pub(crate) struct Hit {
    pub(crate) info: PythonInfo,
    /// Usable without a probe (see the module docs); else a guess to check.
    pub(crate) trusted: bool,
}

/// The cache in `state_dir`.
#[derive(Debug, Clone)]
pub(crate) struct ProbeCache {
    state_dir: PathBuf,
}

impl ProbeCache {
    /// The state dir it lives in.
    pub(super) fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    pub(super) fn new(state_dir: &Path) -> ProbeCache {
        ProbeCache {
            state_dir: state_dir.to_path_buf(),
        }
    }

    fn path(&self) -> PathBuf {
        self.state_dir.join(FILE)
    }

    fn read(&self) -> CacheFile {
        let path = self.path();
        let (Ok(file), Ok(dir)) = (
            std::fs::symlink_metadata(&path),
            std::fs::metadata(&self.state_dir),
        ) else {
            return CacheFile::default();
        };
        if !file.is_file() || file.uid() != dir.uid() || file.mode() & 0o022 != 0 {
            tracing::warn!(
                file = %path.display(),
                "ignoring the interpreter probe cache: not a regular file of the state dir's owner, or writable by others"
            );
            return CacheFile::default();
        }
        std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// The remembered answer for `candidate`, if nothing it depends on changed.
    pub(super) fn lookup(&self, candidate: &Path) -> Option<Hit> {
        let entry = self
            .read()
            .entries
            .into_iter()
            .find(|e| e.key.candidate == candidate)?;
        let now = key(candidate, &entry.executable);
        if now != entry.key {
            return None;
        }
        // A pyenv shim whose inputs are all as they were chooses the same interpreter:
        // its answer is used without running it again (it costs a bash and several
        // forks, ~100-200 ms), provided the interpreter lies under its own prefixes.
        let trusted = if now.pyenv.is_some() {
            under_own_prefix(&entry.executable, &entry.prefixes)
        } else {
            is_the_interpreter(candidate, &entry.executable, &entry.prefixes)
        };
        Some(Hit {
            info: PythonInfo {
                executable: entry.executable,
                version: entry.version,
                prefixes: entry.prefixes,
                venv: entry.venv,
                worker_code: entry.code.map(Into::into),
            },
            trusted,
        })
    }

    /// Remember `info`, the probe's answer for `candidate` (best effort: a failure is
    /// logged; the next server probes again).
    pub(super) fn store(&self, candidate: &Path, info: &PythonInfo) {
        let mut file = self.read();
        file.entries.retain(|e| e.key.candidate != candidate);
        if file.entries.len() >= MAX_ENTRIES {
            file.entries.remove(0);
        }
        file.entries.push(Entry {
            key: key(candidate, &info.executable),
            executable: info.executable.clone(),
            version: info.version.clone(),
            prefixes: info.prefixes.clone(),
            venv: info.venv.clone(),
            code: info.worker_code.as_deref().map(str::to_string),
        });
        let written = serde_json::to_vec(&file)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                // Created 0600 beside the file, renamed over it: readers never see half.
                std::fs::create_dir_all(&self.state_dir)?;
                let mut tmp = tempfile::NamedTempFile::new_in(&self.state_dir)?;
                tmp.write_all(&bytes)?;
                tmp.persist(self.path()).map_err(|e| e.error)?;
                Ok(())
            });
        if let Err(e) = written {
            tracing::debug!(file = %self.path().display(), error = %e, "could not remember the interpreter probe");
        }
    }
}

/// The candidate resolves to the interpreter the probe named, which lies under one of
/// the prefixes it reported (so a remembered prefix cannot widen what the policy's
/// `{python}` grants beyond the interpreter's own installation).
fn is_the_interpreter(candidate: &Path, executable: &Path, prefixes: &[PathBuf]) -> bool {
    let (Ok(c), Ok(e)) = (candidate.canonicalize(), executable.canonicalize()) else {
        return false;
    };
    c == e && under_own_prefix(executable, prefixes)
}

/// The interpreter (as named, or resolved) lies under one of the prefixes it reported,
/// none of them `/`.
fn under_own_prefix(executable: &Path, prefixes: &[PathBuf]) -> bool {
    let Ok(e) = executable.canonicalize() else {
        return false;
    };
    prefixes.iter().any(|p| {
        p.canonicalize()
            .is_ok_and(|p| p != Path::new("/") && (e.starts_with(&p) || executable.starts_with(&p)))
    })
}

/// Whether an earlier server's probe, remembered in `state_dir` and still trusted (see
/// `probe_cache`), found `python` to be a working Python 3: then start-up need not
/// run it again to check.
pub(crate) fn known_python3(python: &Path, state_dir: &Path) -> bool {
    ProbeCache::new(state_dir)
        .lookup(python)
        .is_some_and(|hit| hit.trusted && hit.info.version.starts_with("3."))
}

/// [`discover_python`](super::python::discover_python) through the state dir's [`ProbeCache`]: a trusted entry answers
/// without a probe; otherwise the probe runs and its answer is remembered.
pub(crate) async fn discover_python_cached(
    explicit: Option<&Path>,
    workspace: &Path,
    cache: &ProbeCache,
) -> Result<PythonInfo, ReplError> {
    let candidate = candidate(explicit, workspace)?;
    if let Some(hit) = cache.lookup(&candidate)
        && hit.trusted
    {
        return Ok(hit.info);
    }
    let info = probe_candidate(
        &candidate,
        explicit.is_some(),
        &[workspace, cache.state_dir()],
    )
    .await?;
    cache.store(&candidate, &info);
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(exe: &Path, prefixes: &[&Path]) -> PythonInfo {
        PythonInfo {
            executable: exe.to_path_buf(),
            version: "3.0.0".into(),
            prefixes: prefixes.iter().map(|p| p.to_path_buf()).collect(),
            venv: None,
            worker_code: Some("Y29kZQ==".into()),
        }
    }

    /// An installation: `<root>/bin/python3` (a file) and `<root>/bin/shim` (a script).
    fn install(tag: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::Builder::new().prefix(tag).tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let exe = bin.join("python3");
        std::fs::write(&exe, "not really").unwrap();
        let shim = bin.join("shim");
        std::fs::write(&shim, "#!/bin/sh\n").unwrap();
        (dir, exe, shim)
    }

    #[test]
    fn an_unchanged_interpreter_is_remembered_and_any_change_is_a_miss() {
        let (dir, exe, _) = install("probe-cache-hit");
        let cache = ProbeCache::new(dir.path());
        assert!(cache.lookup(&exe).is_none());
        cache.store(&exe, &info(&exe, &[dir.path()]));
        let hit = cache.lookup(&exe).unwrap();
        assert!(hit.trusted);
        assert_eq!(hit.info, info(&exe, &[dir.path()]));
        assert_eq!(hit.info.worker_code.as_deref(), Some("Y29kZQ=="));
        // Replaced (a new inode, as a package upgrade does): probed again.
        std::fs::remove_file(&exe).unwrap();
        std::fs::write(&exe, "not really").unwrap();
        assert!(cache.lookup(&exe).is_none());
        // A pyvenv.cfg appearing beside it makes it another interpreter.
        cache.store(&exe, &info(&exe, &[dir.path()]));
        assert!(cache.lookup(&exe).is_some());
        std::fs::write(dir.path().join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        assert!(cache.lookup(&exe).is_none());
    }

    #[test]
    fn a_shim_is_only_a_guess_and_a_foreign_prefix_is_never_trusted() {
        let (dir, exe, shim) = install("probe-cache-shim");
        let cache = ProbeCache::new(dir.path());
        cache.store(&shim, &info(&exe, &[dir.path()]));
        let hit = cache.lookup(&shim).unwrap();
        assert!(
            !hit.trusted,
            "a shim names its interpreter by more than its files"
        );
        assert_eq!(hit.info.executable, exe);
        // Prefixes that do not hold the interpreter (or are `/`) would widen `{python}`.
        let elsewhere = tempfile::tempdir().unwrap();
        cache.store(&exe, &info(&exe, &[elsewhere.path()]));
        assert!(!cache.lookup(&exe).unwrap().trusted);
        cache.store(&exe, &info(&exe, &[Path::new("/")]));
        assert!(!cache.lookup(&exe).unwrap().trusted);
    }

    /// A pyenv root: `shims/python3` (pyenv's shim text), `libexec/pyenv`, `version`,
    /// `versions/`, with the interpreter `versions/3.0/bin/python3`.
    fn pyenv(tag: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::Builder::new().prefix(tag).tempdir().unwrap();
        let root = dir.path();
        for d in ["shims", "libexec", "versions/3.0/bin"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let shim = root.join("shims/python3");
        std::fs::write(
            &shim,
            format!(
                "#!/usr/bin/env bash\nset -e\nprogram=\"${{0##*/}}\"\nexport PYENV_ROOT=\"{r}\"\nexec \"{r}/libexec/pyenv\" exec \"$program\" \"$@\"\n",
                r = root.display()
            ),
        )
        .unwrap();
        std::fs::write(root.join("libexec/pyenv"), "#!/bin/sh\n").unwrap();
        std::fs::write(root.join("version"), "3.0\n").unwrap();
        let exe = root.join("versions/3.0/bin/python3");
        std::fs::write(&exe, "not really").unwrap();
        (dir, shim, exe)
    }

    #[test]
    fn a_pyenv_shim_is_trusted_while_what_it_decides_by_is_unchanged() {
        let (dir, shim, exe) = pyenv("probe-cache-pyenv");
        let root = dir.path();
        assert_eq!(pyenv_root(&shim).as_deref(), Some(root));
        let cache = ProbeCache::new(root);
        let prefix = root.join("versions/3.0");
        cache.store(&shim, &info(&exe, &[&prefix]));
        assert!(
            cache.lookup(&shim).unwrap().trusted,
            "an unchanged pyenv shim was not trusted"
        );
        // The global version file changes: the shim may choose another interpreter.
        std::fs::write(root.join("version"), "3.1\n").unwrap();
        assert!(cache.lookup(&shim).is_none());
        cache.store(&shim, &info(&exe, &[&prefix]));
        assert!(cache.lookup(&shim).unwrap().trusted);
        // A version installed (or removed) changes what it chooses among.
        std::fs::create_dir_all(root.join("versions/3.1")).unwrap();
        assert!(cache.lookup(&shim).is_none());
        // An interpreter outside its reported prefixes is never trusted.
        let elsewhere = tempfile::tempdir().unwrap();
        cache.store(&shim, &info(&exe, &[elsewhere.path()]));
        assert!(!cache.lookup(&shim).unwrap().trusted);
        // Any other script is only a guess (the shim of `install` is not pyenv's).
        let (_d, _exe, other) = install("probe-cache-other");
        assert_eq!(pyenv_root(&other), None);
    }

    #[test]
    fn a_file_others_may_write_or_garbage_is_ignored() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, exe, _) = install("probe-cache-perm");
        let cache = ProbeCache::new(dir.path());
        cache.store(&exe, &info(&exe, &[dir.path()]));
        let file = dir.path().join(FILE);
        assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o077, 0);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(
            cache.lookup(&exe).is_none(),
            "a world-writable cache was used"
        );
        std::fs::write(&file, "{not json").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(cache.lookup(&exe).is_none());
        // ... and is replaced by the next answer.
        cache.store(&exe, &info(&exe, &[dir.path()]));
        assert!(cache.lookup(&exe).is_some());
    }
}
