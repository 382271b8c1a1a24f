//! Reading and replacing a client's configuration file without damaging it.
//!
//! A symlinked config (dotfiles managers do this) is followed: the link stays and its
//! target is rewritten. The new text is written to a temporary file in the target's own
//! directory, given the old file's owner and mode, synced, and renamed over the target, so
//! a reader sees either the old file or the new one, never half of one.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Mode for a configuration file that did not exist: it may hold environment values
/// (proxies, index URLs), so only its owner reads it.
const NEW_FILE_MODE: u32 = 0o600;

/// Symlink hops followed before giving up (Linux's own limit is 40).
const MAX_LINKS: usize = 40;

#[derive(Debug, Error)]
pub(crate) enum FileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: more than {MAX_LINKS} symbolic links; fix the link chain, then retry")]
    LinkLoop { path: PathBuf },
    #[error("cannot create directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write a temporary file next to {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot keep the owner (uid {uid}, gid {gid}) of {path}: {source}; \
         run install as that user"
    )]
    Owner {
        path: PathBuf,
        uid: u32,
        gid: u32,
        source: std::io::Error,
    },
    #[error("cannot replace {path}: {source}")]
    Replace {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The file a write to `path` must replace: `path` itself, or the end of its symlink
/// chain (which need not exist yet).
pub(crate) fn resolve_links(path: &Path) -> Result<PathBuf, FileError> {
    let mut current = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let link = std::fs::read_link(&current).map_err(|source| FileError::Read {
                    path: current.clone(),
                    source,
                })?;
                current = match current.parent() {
                    Some(dir) if link.is_relative() => dir.join(link),
                    _ => link,
                };
            }
            Ok(_) => return Ok(current),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(current),
            Err(source) => {
                return Err(FileError::Read {
                    path: current,
                    source,
                });
            }
        }
    }
    Err(FileError::LinkLoop {
        path: path.to_path_buf(),
    })
}

/// The file's text, or `None` if it does not exist.
pub(crate) fn read_existing(path: &Path) -> Result<Option<String>, FileError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(FileError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Replace `target` (a resolved path, see [`resolve_links`]) with `text` atomically,
/// keeping its owner and mode; a new file gets mode 0600 and its directory is created.
pub(crate) fn replace_atomically(target: &Path, text: &str) -> Result<(), FileError> {
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let old = match std::fs::metadata(target) {
        Ok(meta) => Some(meta),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(FileError::Read {
                path: target.to_path_buf(),
                source,
            });
        }
    };
    if old.is_none() {
        std::fs::create_dir_all(&dir).map_err(|source| FileError::CreateDir {
            path: dir.clone(),
            source,
        })?;
    }
    let write_err = |source| FileError::Write {
        path: target.to_path_buf(),
        source,
    };
    // tempfile creates the file 0600 with O_EXCL; it is removed if we fail before persist.
    let mut tmp = tempfile::Builder::new()
        .prefix(".mcp-sandbox-repl.")
        .suffix(".tmp")
        .tempfile_in(&dir)
        .map_err(write_err)?;
    tmp.write_all(text.as_bytes()).map_err(write_err)?;
    let mode = match &old {
        Some(meta) => {
            let mine = tmp.as_file().metadata().map_err(write_err)?;
            if (mine.uid(), mine.gid()) != (meta.uid(), meta.gid()) {
                // Before the chmod: a chown clears set-id bits.
                std::os::unix::fs::fchown(tmp.as_file(), Some(meta.uid()), Some(meta.gid()))
                    .map_err(|source| FileError::Owner {
                        path: target.to_path_buf(),
                        uid: meta.uid(),
                        gid: meta.gid(),
                        source,
                    })?;
            }
            meta.mode() & 0o7777
        }
        None => NEW_FILE_MODE,
    };
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(write_err)?;
    tmp.as_file().sync_all().map_err(write_err)?;
    tmp.persist(target).map_err(|e| FileError::Replace {
        path: target.to_path_buf(),
        source: e.error,
    })?;
    // Make the rename itself durable; a failure here leaves a correct file, so it is ignored.
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_followed_to_the_target_even_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("dotfiles").join("config.toml");
        std::fs::create_dir_all(real.parent().unwrap()).unwrap();
        let link1 = dir.path().join("link1");
        let link2 = dir.path().join("link2");
        std::os::unix::fs::symlink("dotfiles/config.toml", &link1).unwrap();
        std::os::unix::fs::symlink(&link1, &link2).unwrap();
        assert_eq!(resolve_links(&link2).unwrap(), real);
        std::fs::write(&real, "x").unwrap();
        assert_eq!(resolve_links(&link2).unwrap(), real);
        assert_eq!(resolve_links(&real).unwrap(), real);
    }

    #[test]
    fn link_loops_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        assert!(matches!(resolve_links(&a), Err(FileError::LinkLoop { .. })));
    }

    #[test]
    fn replace_keeps_mode_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.json");
        std::fs::write(&path, "{}").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        replace_atomically(&path, "{\"a\": 1}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"a\": 1}\n");
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o640);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("c.json")]);
    }

    #[test]
    fn a_new_file_is_private_and_its_directory_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a").join("b").join("mcp.json");
        replace_atomically(&path, "{}\n").unwrap();
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o7777;
        assert_eq!(mode, NEW_FILE_MODE);
    }
}
