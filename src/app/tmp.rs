//! Private temp dirs: every shell job gets its own `{tmp}` that no other job or session
//! sees — a tmpfs in its own view where the policy has one (no host directory: see
//! `App::job_policy`), else `<state>/shell-tmp/<pid>-<n>`, which the job removes when it
//! ends (`ShellRequest::private_tmp`). Those left by a server killed before its jobs ended are
//! swept when the next server starts ([`sweep_state_dir`]), with the other temporary
//! files such a server leaves: inline scripts and session directories set aside for removal.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::AppError;

/// Create a fresh private dir under `base`, named after this server's pid (so a sweep by
/// another server sharing the state dir leaves it alone while we run).
pub fn create_job_tmp(base: &Path) -> Result<PathBuf, AppError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let tmp = base.join(format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    create_dir(&tmp)?;
    Ok(tmp)
}

/// A private temp dir removed (with everything in it) when dropped.
#[derive(Debug)]
pub struct TmpDir(pub PathBuf);

impl Drop for TmpDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::debug!(dir = %self.0.display(), error = %e, "could not remove a temp dir");
        }
    }
}

/// `create_dir_all` with the error in words.
pub fn create_dir(dir: &Path) -> Result<(), AppError> {
    std::fs::create_dir_all(dir).map_err(|error| AppError::CreateDir {
        path: dir.to_path_buf(),
        error,
    })
}

/// Remove job temp dirs (`<pid>-<n>`) left by servers that are no longer running (killed
/// before their jobs ended); those of a live server sharing the state dir stay.
/// Returns what was removed.
pub fn sweep_dead_job_tmps(dir: &Path) -> Vec<PathBuf> {
    sweep_dead(dir, |n| n.split('-').next())
}

/// Server start: remove what servers that are no longer running left in `state_dir`:
/// the private temp dirs of shell jobs, scripts and installs (`shell-tmp/<pid>-<n>`,
/// `env-tmp/<pid>-<n>`), inline scripts
/// (`scripts/script-<pid>-<n>.py`) and session directories set aside for removal
/// (`repl/.closed-*`, of any server: they are renamed away before removal). Returns them.
pub fn sweep_state_dir(state_dir: &Path) -> Vec<PathBuf> {
    let mut swept = sweep_dead_job_tmps(&state_dir.join("shell-tmp"));
    swept.extend(sweep_dead_job_tmps(&state_dir.join("env-tmp")));
    swept.extend(sweep_dead(&state_dir.join("scripts"), |n| {
        n.strip_prefix("script-")?.split('-').next()
    }));
    if let Ok(entries) = std::fs::read_dir(state_dir.join("repl")) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(".closed-")
                && std::fs::remove_dir_all(entry.path()).is_ok()
            {
                swept.push(entry.path());
            }
        }
    }
    swept
}

/// Remove each entry of `dir` whose owner pid (`owner` of its name) is not running.
fn sweep_dead(dir: &Path, owner: impl Fn(&str) -> Option<&str>) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut swept = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name.to_str().and_then(&owner);
        let mine = pid.is_some_and(|p| p == std::process::id().to_string());
        let alive = pid.is_some_and(|p| Path::new("/proc").join(p).exists());
        if mine || alive {
            continue;
        }
        let path = entry.path();
        let removed = match entry.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        if removed.is_ok() {
            swept.push(path);
        }
    }
    swept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_keeps_live_servers_dirs_only() {
        let (_scratch, base) = crate::test_support::scratch_path("app-tmp", "base");
        let mine = create_job_tmp(&base).unwrap();
        let second = create_job_tmp(&base).unwrap();
        assert_ne!(mine, second);
        // No process has pid u32::MAX; a non-numeric name is no server's either.
        let dead = base.join(format!("{}-0", u32::MAX));
        let junk = base.join("junk");
        std::fs::create_dir_all(&dead).unwrap();
        std::fs::create_dir_all(&junk).unwrap();
        let swept = sweep_dead_job_tmps(&base);
        assert_eq!(swept.len(), 2, "{swept:?}");
        assert!(mine.is_dir() && second.is_dir());
        assert!(!dead.exists() && !junk.exists());
    }
}
