//! Who owns what a server leaves outside its own process: every server records itself in
//! its state dir as `owners/<instance id>` and holds an exclusive `flock` on that file for
//! its whole life (the kernel drops the lock when the process dies, however it dies). At
//! start a server takes the lock of every other record it can: a record whose lock it
//! gets belongs to a server that has ended, so what is named after that instance id (job
//! cgroups, temp paths) is its to sweep. Liveness is never read from `/proc`, which shows
//! another PID namespace's processes under other numbers or not at all: two servers in
//! any namespaces never take each other for dead.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use super::error::AppError;

const DIR: &str = "owners";

/// This server's record, locked while it lives (the lock goes with the descriptor, which
/// is close-on-exec: no job inherits it).
#[derive(Debug)]
pub(super) struct Registration {
    path: PathBuf,
    _file: File,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Record this server (`id`) as an owner in `state_dir`, locked.
pub(super) fn register(state_dir: &Path, id: &str) -> Result<Registration, AppError> {
    let path = state_dir.join(DIR).join(id);
    let err = |error| AppError::Owner {
        path: path.clone(),
        error,
    };
    std::fs::create_dir_all(state_dir.join(DIR)).map_err(err)?;
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(err)?;
    file.try_lock().map_err(|e| match e {
        std::fs::TryLockError::Error(e) => err(e),
        std::fs::TryLockError::WouldBlock => err(std::io::Error::other(
            "another live process holds this server's own record",
        )),
    })?;
    Ok(Registration { path, _file: file })
}

/// A server that has ended: its id, and its record, locked by us until dropped (so no
/// other server sweeps it at the same time); `forget` removes the record.
#[derive(Debug)]
pub(super) struct Ended {
    pub id: String,
    path: PathBuf,
    _file: File,
}

impl Ended {
    /// Remove the record, once what it owned has been swept.
    pub(super) fn forget(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The servers recorded in `state_dir` that have ended (their lock could be taken).
/// Records whose name is not an instance id are left alone.
pub(super) fn ended(state_dir: &Path, is_id: impl Fn(&str) -> bool) -> Vec<Ended> {
    let Ok(entries) = std::fs::read_dir(state_dir.join(DIR)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let Some(id) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !is_id(&id) {
            continue;
        }
        let path = entry.path();
        let Ok(file) = File::open(&path) else {
            continue;
        };
        if file.try_lock().is_ok() {
            out.push(Ended {
                id,
                path,
                _file: file,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(_: &str) -> bool {
        true
    }

    #[test]
    fn a_live_owner_is_never_taken_for_ended_and_a_dead_one_is() {
        let (_scratch, state) = crate::test_support::scratch_path("owners", "state");
        let live = register(&state, "1x00000001").unwrap();
        // A record nobody holds: what a killed server leaves.
        std::fs::write(state.join(DIR).join("2x00000002"), "").unwrap();
        let ended = ended(&state, any);
        assert_eq!(
            ended.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
            ["2x00000002"]
        );
        // While we hold the ended record, a second look does not hand it out again.
        assert!(super::ended(&state, any).is_empty());
        for e in ended {
            e.forget();
        }
        assert!(!state.join(DIR).join("2x00000002").exists());
        drop(live);
        assert!(
            !state.join(DIR).join("1x00000001").exists(),
            "removed on drop"
        );
    }

    #[test]
    fn a_record_held_by_another_process_is_alive() {
        let (_scratch, state) = crate::test_support::scratch_path("owners", "state");
        std::fs::create_dir_all(state.join(DIR)).unwrap();
        let path = state.join(DIR).join("3x00000003");
        std::fs::write(&path, "").unwrap();
        // flock(1) holds the lock in another process (as a server in another PID
        // namespace would) until its stdin closes.
        let mut holder = std::process::Command::new("flock")
            .arg("-x")
            .arg(&path)
            .args(["-c", "echo locked; read _"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("flock(1)");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "locked");
        assert!(ended(&state, any).is_empty(), "held by a live process");
        drop(holder.stdin.take());
        holder.wait().unwrap();
        assert_eq!(ended(&state, any).len(), 1, "free once it ended");
    }
}
