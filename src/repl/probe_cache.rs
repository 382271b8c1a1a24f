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
//! An entry is *trusted* (used without a probe) only when the candidate is the
//! interpreter itself (it resolves to the same file as `sys.executable`) and that file
//! lies under one of the prefixes it reported. A candidate that is some other program —
//! a shim script choosing an interpreter by environment or by a version file somewhere —
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
        env: PREFIX_ENV
            .iter()
            .map(|v| {
                let value = std::env::var_os(v).map(|s| s.to_string_lossy().into_owned());
                (v.to_string(), value)
            })
            .collect(),
        stamps,
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
        if key(candidate, &entry.executable) != entry.key {
            return None;
        }
        let trusted = is_the_interpreter(candidate, &entry.executable, &entry.prefixes);
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
    c == e
        && prefixes.iter().any(|p| {
            p.canonicalize().is_ok_and(|p| {
                p != Path::new("/") && (c.starts_with(&p) || executable.starts_with(&p))
            })
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
