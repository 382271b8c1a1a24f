//! The launcher's cgroup step: join the job's cgroup(s) the parent made
//! (`parent::cgroup`), and the error every cgroup operation reports.

use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "no usable cgroup hierarchy with the {controller} controller (checked /proc/self/mountinfo and \
         /proc/self/cgroup); mount cgroup v2 with {controller} delegated, or a cgroup v1 {controller} \
         hierarchy, or use a policy without a {what} limit"
    )]
    NoController {
        controller: &'static str,
        what: &'static str,
    },
    /// v2: the controller is not in the server's cgroup's `cgroup.controllers` (not
    /// enabled in its parent, or bound to a v1 hierarchy on a hybrid host).
    #[error(
        "the cgroup v2 hierarchy offers no {controller} controller to the server's cgroup {dir} \
         (its cgroup.controllers: {offered}): its parent does not enable {controller} in \
         cgroup.subtree_control, or (hybrid host) {controller} is bound to a cgroup v1 hierarchy; \
         delegate a cgroup with pids and memory enabled (e.g. systemd Delegate=yes, or a \
         container runtime's own cgroup namespace), or use a policy without a {what} limit"
    )]
    NotOffered {
        controller: &'static str,
        what: &'static str,
        dir: PathBuf,
        offered: String,
    },
    #[error(
        "cgroup v2 is not delegated to this server: cannot enable {controllers} in {dir}: {reason}; \
         run the server in its own cgroup (e.g. `systemd-run --scope -p Delegate=yes ...`) or as the \
         only process of a container"
    )]
    NotDelegated {
        dir: PathBuf,
        controllers: String,
        /// Why enabling them failed (shared: the outcome is prepared once per process).
        reason: std::sync::Arc<CgroupError>,
    },
    #[error(
        "cannot {action} {path}: {source}; is the cgroup filesystem writable (root or delegated)?"
    )]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// Controllers cannot be enabled where other processes live (no-internal-processes).
    #[error("{source}; other processes share the cgroup ({others} of them)")]
    Shared {
        source: std::io::Error,
        others: usize,
    },
    #[error("cannot join cgroup {path}: {source}; the job cannot be limited, refusing to run it")]
    Join {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The parent made no cgroup for the job after starting it (`CgroupGate`).
    #[error(
        "the job's cgroup was not made: {source}; the job cannot be limited, refusing to run it"
    )]
    Unmade { source: std::io::Error },
}

/// Launcher child: move the calling process into every given membership file.
/// Writing "0" means "the writer". On v1 the files are `tasks` (moves only the calling
/// thread): the kernel then skips the global threadgroup lock whose RCU grace period
/// makes a `cgroup.procs` write cost ~10 ms here, against ~0.2 ms. That is only the
/// whole process if it is single-threaded — as the launcher is; otherwise the
/// `cgroup.procs` beside it is used.
pub(crate) fn join_current(procs_files: &[PathBuf]) -> Result<(), CgroupError> {
    // Looked at once: a launcher starts no thread between its joins.
    let single_threaded = procs_files.iter().any(|p| p.ends_with("tasks"))
        && std::fs::read_dir("/proc/self/task")
            .map(|d| d.count() == 1)
            .unwrap_or(false);
    for path in procs_files {
        let procs;
        let path = if path.ends_with("tasks") && !single_threaded {
            procs = path.with_file_name("cgroup.procs");
            &procs
        } else {
            path
        };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|source| CgroupError::Join {
                path: path.clone(),
                source,
            })?;
        file.write_all(b"0").map_err(|source| CgroupError::Join {
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
}

/// The job's cgroup as the parent tells it on the *cgroup gate*, a pipe the target reads
/// before it joins: `run` makes the cgroup after it has started the launcher, beside
/// the init's own work (the namespaces), instead of before. The message: one byte —
/// `M` (join the files that follow; memory capped by the cgroup), `P` (join them; memory
/// not capped by it), `N` (no cgroup: the rlimits stand in, the parent has noted it), `X`
/// (the parent could not make it and reports why: do not run) — then each membership
/// file NUL-terminated, then one more NUL. It ends itself: the launcher still holds the
/// pipe's write end it inherited (no exec has closed it), so no end of file comes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CgroupGate {
    Join {
        procs_files: Vec<PathBuf>,
        memory: bool,
    },
    Without,
    Refused,
}

impl CgroupGate {
    pub(crate) fn encode(&self) -> Vec<u8> {
        use std::os::unix::ffi::OsStrExt;
        let (flag, files): (u8, &[PathBuf]) = match self {
            CgroupGate::Join {
                procs_files,
                memory,
            } => (if *memory { b'M' } else { b'P' }, procs_files),
            CgroupGate::Without => (b'N', &[]),
            CgroupGate::Refused => (b'X', &[]),
        };
        let mut out = vec![flag];
        for path in files {
            out.extend_from_slice(path.as_os_str().as_bytes());
            out.push(0);
        }
        out.push(0);
        out
    }

    /// Whether `bytes` hold a whole message (it ends with an empty entry).
    fn complete(bytes: &[u8]) -> bool {
        matches!(bytes, [_, 0] | [_, .., 0, 0])
    }

    /// The whole message in `bytes`; `None` for a cut or malformed one.
    pub(crate) fn decode(bytes: &[u8]) -> Option<CgroupGate> {
        use std::os::unix::ffi::OsStrExt;
        if !Self::complete(bytes) {
            return None;
        }
        let (&flag, rest) = bytes.split_first()?;
        let body = &rest[..rest.len() - 1];
        let procs_files: Vec<PathBuf> = match body {
            [] => Vec::new(),
            [entries @ .., 0] => entries
                .split(|&b| b == 0)
                .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p)))
                .collect(),
            _ => return None,
        };
        if procs_files.iter().any(|p| p.as_os_str().is_empty()) {
            return None;
        }
        match (flag, procs_files.is_empty()) {
            (b'M' | b'P', false) => Some(CgroupGate::Join {
                procs_files,
                memory: flag == b'M',
            }),
            (b'N', true) => Some(CgroupGate::Without),
            (b'X', true) => Some(CgroupGate::Refused),
            _ => None,
        }
    }

    /// Launcher child: wait for the parent's message on the gate `fd` (ours from here);
    /// the membership files to join and whether memory is capped by them.
    pub(crate) fn wait(fd: std::os::fd::RawFd) -> Result<(Vec<PathBuf>, bool), CgroupError> {
        use std::io::Read;
        use std::os::fd::FromRawFd;
        let unmade = |why: &str| CgroupError::Unmade {
            source: std::io::Error::other(why.to_string()),
        };
        // SAFETY: the parent placed the gate's read end at this number for us alone.
        let mut gate = unsafe { std::fs::File::from_raw_fd(fd) };
        let mut bytes = Vec::new();
        let mut buf = [0u8; 512];
        while !Self::complete(&bytes) {
            match gate.read(&mut buf) {
                Ok(0) => return Err(unmade("the parent ended before it said")),
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => return Err(CgroupError::Unmade { source }),
            }
        }
        match Self::decode(&bytes) {
            Some(CgroupGate::Join {
                procs_files,
                memory,
            }) => Ok((procs_files, memory)),
            Some(CgroupGate::Without) => Ok((Vec::new(), false)),
            Some(CgroupGate::Refused) => Err(unmade("the parent could not make it (it says why)")),
            None => Err(unmade("the parent's message was malformed")),
        }
    }
}

#[cfg(test)]
mod gate_tests {
    use super::*;

    /// Every message comes back as written and ends itself; a cut one is none.
    #[test]
    fn a_gate_message_round_trips_and_a_cut_one_is_refused() {
        let files = vec![
            PathBuf::from("/sys/fs/cgroup/pids/x/tasks"),
            PathBuf::from("/sys/fs/cgroup/memory/x/tasks"),
        ];
        for gate in [
            CgroupGate::Join {
                procs_files: files.clone(),
                memory: true,
            },
            CgroupGate::Join {
                procs_files: files[..1].to_vec(),
                memory: false,
            },
            CgroupGate::Without,
            CgroupGate::Refused,
        ] {
            let bytes = gate.encode();
            assert!(CgroupGate::complete(&bytes), "{bytes:?}");
            for cut in 0..bytes.len() {
                assert!(!CgroupGate::complete(&bytes[..cut]), "{:?}", &bytes[..cut]);
            }
            assert_eq!(CgroupGate::decode(&bytes), Some(gate));
        }
        assert_eq!(CgroupGate::decode(b"M\0"), None);
        assert_eq!(CgroupGate::decode(b"N/a\0\0"), None);
        assert_eq!(CgroupGate::decode(b"Z\0"), None);
    }

    /// The target waits for the message however it comes, and stops at a refusal or a
    /// parent that ended without one.
    #[test]
    fn the_target_takes_the_message_in_pieces_and_stops_at_a_refusal() {
        use std::io::Write;
        use std::os::fd::IntoRawFd;
        let whole = CgroupGate::Join {
            procs_files: vec![PathBuf::from("/a/tasks")],
            memory: true,
        }
        .encode();
        let (read, mut write) = std::io::pipe().unwrap();
        let writer = std::thread::spawn(move || {
            for b in whole {
                write.write_all(&[b]).unwrap();
            }
            write
        });
        let got = CgroupGate::wait(read.into_raw_fd()).unwrap();
        assert_eq!(got, (vec![PathBuf::from("/a/tasks")], true));
        drop(writer.join().unwrap());
        let (read, mut write) = std::io::pipe().unwrap();
        write.write_all(&CgroupGate::Refused.encode()).unwrap();
        assert!(CgroupGate::wait(read.into_raw_fd()).is_err());
        let (read, write) = std::io::pipe().unwrap();
        drop(write);
        assert!(CgroupGate::wait(read.into_raw_fd()).is_err());
    }
}
