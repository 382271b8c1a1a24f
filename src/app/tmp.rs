//! Private temp dirs: every shell job gets its own `{tmp}` that no other job or session
//! sees — a tmpfs in its own view where the policy has one (no host directory: see
//! `App::job_policy`), else `<state>/shell-tmp/<pid>-<n>`, which the job removes when it
//! ends (`ShellRequest::private_tmp`). Those left by a server killed before its jobs ended are
//! swept when the next server starts ([`sweep_state_dir`]), with the other temporary
//! files such a server leaves: inline scripts and session directories set aside for removal.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::AppError;

/// Create a fresh private dir under `base`, named after this server's instance id (so a
/// sweep by another server sharing the state dir leaves it alone while we run: `owners`).
pub(crate) fn create_job_tmp(base: &Path, owner: &str) -> Result<PathBuf, AppError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let tmp = base.join(format!("{owner}-{}", NEXT.fetch_add(1, Ordering::Relaxed)));
    create_dir(&tmp)?;
    Ok(tmp)
}

/// A private temp dir removed (with everything in it) when dropped.
#[derive(Debug)]
pub(crate) struct TmpDir(pub PathBuf);

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
pub(crate) fn create_dir(dir: &Path) -> Result<(), AppError> {
    std::fs::create_dir_all(dir).map_err(|error| AppError::CreateDir {
        path: dir.to_path_buf(),
        error,
    })
}

/// Server start: remove what the ended server `owner` (an instance id, see `owners`)
/// left in `state_dir`: the private temp dirs of its shell jobs, scripts and installs
/// (`shell-tmp/<owner>-<n>`, `env-tmp/<owner>-<n>`), its inline scripts
/// (`scripts/script-<owner>-<n>.py`) and transient script environments
/// (`script-envs/env-<owner>-<n>`). Returns them.
pub(crate) fn sweep_owner(state_dir: &Path, owner: &str) -> Vec<PathBuf> {
    let mut swept = Vec::new();
    for (dir, prefix) in [
        ("shell-tmp", format!("{owner}-")),
        ("env-tmp", format!("{owner}-")),
        ("scripts", format!("script-{owner}-")),
        ("script-envs", format!("env-{owner}-")),
    ] {
        swept.extend(remove_entries(&state_dir.join(dir), |name| {
            name.starts_with(&prefix)
        }));
    }
    swept
}

/// Server start: session directories set aside for removal (`repl/.closed-*`, of any
/// server: they are renamed away before removal, so no live session uses one).
pub(crate) fn sweep_closed_sessions(state_dir: &Path) -> Vec<PathBuf> {
    remove_entries(&state_dir.join("repl"), |name| name.starts_with(".closed-"))
}

/// Remove each entry of `dir` whose name `matches`; returns what was removed.
fn remove_entries(dir: &Path, matches: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut swept = Vec::new();
    for entry in entries.flatten() {
        if !entry.file_name().to_str().is_some_and(&matches) {
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
    fn only_the_ended_owners_paths_are_swept() {
        let (_scratch, state) = crate::test_support::scratch_path("app-tmp", "state");
        let mine = create_job_tmp(&state.join("shell-tmp"), "7x0000abcd").unwrap();
        let second = create_job_tmp(&state.join("shell-tmp"), "7x0000abcd").unwrap();
        assert_ne!(mine, second);
        let dead = "7x0000dead";
        let theirs = [
            state.join(format!("shell-tmp/{dead}-0")),
            state.join(format!("env-tmp/{dead}-3")),
            state.join(format!("script-envs/env-{dead}-1")),
        ];
        let other = state.join("shell-tmp/8x0000beef-0");
        for d in theirs.iter().chain([&other]) {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::create_dir_all(state.join("scripts")).unwrap();
        let script = state.join(format!("scripts/script-{dead}-2.py"));
        std::fs::write(&script, "").unwrap();
        let swept = sweep_owner(&state, dead);
        assert_eq!(swept.len(), 4, "{swept:?}");
        assert!(theirs.iter().all(|d| !d.exists()) && !script.exists());
        assert!(mine.is_dir() && second.is_dir() && other.is_dir());
    }
}
