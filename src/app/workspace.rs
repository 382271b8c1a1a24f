//! Workspace confinement: paths from tool arguments are opened beneath the workspace
//! with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` and named by what that
//! descriptor is (its `/proc/self/fd` link), never by a path checked first and used
//! later; directories the server creates for a tool (a venv) are made with `mkdirat`
//! relative to the descriptor of their parent, no symlink followed. A path leading out
//! (absolute elsewhere, `..`, a symlink out) is refused with the same words whether or
//! not anything exists there. Plain functions on a path, testable without MCP.
//!
//! `nix` wraps openat2 and mkdirat (already a dependency, used the same way by
//! `jobs::dotenv`); nothing here needs more of it.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::Mode;

use super::error::AppError;

/// The canonical workspace directory.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
}

/// What a path must be once opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    File,
    Dir,
}

impl Workspace {
    /// `root` must be canonical (the app canonicalizes it once at start).
    pub fn new(root: PathBuf) -> Self {
        Workspace { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `p` relative to the workspace unless absolute; no checks (the sandbox confines
    /// what the job does with it).
    pub fn resolve(&self, p: &str) -> PathBuf {
        let path = Path::new(p);
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.root.join(path)
        }
    }

    /// An existing regular file beneath the workspace, as the real path of what was opened.
    pub fn file(&self, p: &str, what: &str) -> Result<PathBuf, AppError> {
        self.open(p, what, Want::File, false)
    }

    /// An existing directory beneath the workspace (the workspace itself included).
    pub fn dir(&self, p: &str, what: &str) -> Result<PathBuf, AppError> {
        self.open(p, what, Want::Dir, true)
    }

    /// A directory strictly inside the workspace, created (with its parents) if missing:
    /// each level is made with `mkdirat` relative to its parent's descriptor and opened
    /// with no symlink followed, so a swap racing this call cannot lead it outside.
    pub fn create_dir(&self, p: &str, what: &str) -> Result<PathBuf, AppError> {
        let refuse = || self.outside(p, what);
        let rel = self.relative(p).ok_or_else(refuse)?;
        let mut names = Vec::new();
        for c in rel.components() {
            match c {
                Component::Normal(n) => names.push(n),
                _ => return Err(refuse()),
            }
        }
        if names.is_empty() {
            return Err(refuse());
        }
        let mut dir = self.open_root()?;
        for name in names {
            match nix::sys::stat::mkdirat(dir.as_fd(), name, Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(self.unusable(p, what, format!("cannot be created ({e})"))),
            }
            let how = OpenHow::new()
                .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
                .resolve(
                    ResolveFlag::RESOLVE_BENEATH
                        | ResolveFlag::RESOLVE_NO_SYMLINKS
                        | ResolveFlag::RESOLVE_NO_MAGICLINKS,
                );
            dir = match openat2(dir.as_fd(), name, how) {
                Ok(fd) => fd,
                Err(Errno::ENOTDIR) => {
                    return Err(self.unusable(p, what, "is not a directory".into()));
                }
                Err(_) => return Err(refuse()),
            };
        }
        self.real_path(&dir, p, what)
    }

    fn open(&self, p: &str, what: &str, want: Want, root_ok: bool) -> Result<PathBuf, AppError> {
        let rel = self.relative(p).ok_or_else(|| self.outside(p, what))?;
        let root = self.open_root()?;
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let fd = match openat2(root.as_fd(), &rel, how) {
            Ok(fd) => fd,
            // EXDEV: the walk would leave the workspace; ELOOP: a magic link or a chain.
            // Nothing about what lies outside is looked up, so both read the same.
            Err(Errno::EXDEV | Errno::ELOOP) => return Err(self.outside(p, what)),
            Err(Errno::ENOENT | Errno::ENOTDIR) => {
                return Err(self.unusable(
                    p,
                    what,
                    "does not exist (no such file or directory)".into(),
                ));
            }
            Err(e) => return Err(self.unusable(p, what, format!("cannot be opened ({e})"))),
        };
        let stat = nix::sys::stat::fstat(fd.as_fd())
            .map_err(|e| self.unusable(p, what, format!("cannot be opened ({e})")))?;
        let kind = stat.st_mode & libc::S_IFMT;
        match want {
            Want::File if kind != libc::S_IFREG => {
                return Err(self.unusable(p, what, "is not a regular file".into()));
            }
            Want::Dir if kind != libc::S_IFDIR => {
                return Err(self.unusable(p, what, "is not a directory".into()));
            }
            _ => {}
        }
        let real = self.real_path(&fd, p, what)?;
        if real == self.root && !root_ok {
            return Err(self.outside(p, what));
        }
        Ok(real)
    }

    /// `p` as a path relative to the workspace, or `None` for an absolute path elsewhere
    /// (decided on the text alone: nothing outside is looked at).
    fn relative(&self, p: &str) -> Option<PathBuf> {
        let path = Path::new(p);
        let rel = if path.is_absolute() {
            path.strip_prefix(&self.root).ok()?.to_path_buf()
        } else {
            path.to_path_buf()
        };
        Some(if rel.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            rel
        })
    }

    fn open_root(&self) -> Result<OwnedFd, AppError> {
        let root = std::fs::File::open(&self.root).map_err(|error| AppError::Workspace {
            path: self.root.clone(),
            error,
        })?;
        Ok(OwnedFd::from(root))
    }

    /// Where `fd` really is; it must still be beneath the workspace.
    fn real_path(&self, fd: &OwnedFd, p: &str, what: &str) -> Result<PathBuf, AppError> {
        let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
        match std::fs::read_link(link) {
            Ok(real) if real.starts_with(&self.root) => Ok(real),
            _ => Err(self.outside(p, what)),
        }
    }

    fn outside(&self, p: &str, what: &str) -> AppError {
        AppError::OutsideWorkspace {
            what: what.to_string(),
            path: p.to_string(),
            workspace: self.root.clone(),
        }
    }

    fn unusable(&self, p: &str, what: &str, reason: String) -> AppError {
        AppError::PathUnusable {
            what: what.to_string(),
            path: p.to_string(),
            reason,
            workspace: self.root.clone(),
        }
    }
}

/// Refuse a workspace that would hand sandboxed code the whole machine, the user's files
/// or the server's own state: `/`, `home`, a parent of `state_dir` or anything inside
/// it — unless `allow_broad` (then the state dir is still masked from the job's view).
/// All paths canonical.
pub(crate) fn check_breadth(
    root: &Path,
    state_dir: &Path,
    home: Option<&Path>,
    allow_broad: bool,
) -> Result<(), AppError> {
    let why = if root == Path::new("/") {
        Some("the root directory".to_string())
    } else if home == Some(root) {
        Some("your home directory".to_string())
    } else if state_dir.starts_with(root) {
        Some(format!(
            "a parent of the server's state dir {} (job records and output)",
            state_dir.display()
        ))
    } else if root.starts_with(state_dir) {
        Some(format!(
            "inside the server's state dir {}",
            state_dir.display()
        ))
    } else {
        None
    };
    match why {
        Some(why) if !allow_broad => Err(AppError::BroadWorkspace {
            path: root.to_path_buf(),
            why,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::scratch_dir;
    use std::os::unix::fs::symlink;
    use tempfile::TempDir;

    /// A workspace with a file, a symlink out, a dangling one, and one that stays inside.
    fn setup(name: &str) -> (TempDir, TempDir, Workspace) {
        let ws = scratch_dir(&format!("app-ws-{name}-ws"));
        let outside = scratch_dir(&format!("app-ws-{name}-out"));
        let root = ws.path().to_path_buf();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a.py"), "").unwrap();
        symlink(outside.path(), root.join("out")).unwrap();
        symlink(outside.path().join("nothing"), root.join("dangling")).unwrap();
        symlink("sub", root.join("in")).unwrap();
        symlink(root.join("sub"), root.join("abs-in")).unwrap();
        (ws, outside, Workspace::new(root))
    }

    #[test]
    fn paths_inside_are_opened_and_named_by_what_was_opened() {
        let (_ws, _out, w) = setup("in");
        let root = w.root().to_path_buf();
        assert_eq!(w.file("sub/a.py", "path").unwrap(), root.join("sub/a.py"));
        let abs = root.join("sub/a.py");
        assert_eq!(w.file(abs.to_str().unwrap(), "p").unwrap(), abs);
        // A symlink that stays inside resolves to its target.
        assert_eq!(w.file("in/a.py", "p").unwrap(), root.join("sub/a.py"));
        assert_eq!(
            w.file("sub/../sub/a.py", "p").unwrap(),
            root.join("sub/a.py")
        );
        assert_eq!(w.dir(".", "cwd").unwrap(), root);
        assert_eq!(w.dir("", "cwd").unwrap(), root);
        assert_eq!(w.dir("in", "cwd").unwrap(), root.join("sub"));
        // An absolute symlink is refused even when it points inside (RESOLVE_BENEATH).
        assert!(w.file("abs-in/a.py", "p").is_err());
        assert_eq!(
            w.create_dir("new/venv", "p").unwrap(),
            root.join("new/venv")
        );
        assert!(root.join("new/venv").is_dir());
        assert_eq!(w.create_dir("sub", "p").unwrap(), root.join("sub"));
    }

    #[test]
    fn paths_leading_out_are_refused_alike_whether_or_not_they_exist() {
        let (_ws, out, w) = setup("out");
        let outside = out.path().to_str().unwrap().to_string();
        let missing = format!("{outside}/nothing");
        for p in [
            "/etc/passwd",
            "/etc/nope",
            "/",
            "..",
            "../x",
            "sub/../../x",
            "out",
            "out/x",
            "dangling",
            "dangling/x",
            "/proc/self/cwd",
            "/proc/self/root/etc/passwd",
            outside.as_str(),
            missing.as_str(),
        ] {
            for r in [w.file(p, "path"), w.dir(p, "path"), w.create_dir(p, "path")] {
                let e = r.unwrap_err();
                assert!(
                    matches!(&e, AppError::OutsideWorkspace { what, .. } if what == "path"),
                    "{p:?}: {e}"
                );
                assert!(e.to_string().contains("is outside the workspace"), "{e}");
            }
        }
        // Nothing was created outside by the refused creations.
        assert!(!out.path().join("x").exists() && !out.path().join("nothing").exists());
        for p in [".", "", "new/../x", "./new"] {
            assert!(w.create_dir(p, "venv_path").is_err(), "{p:?}");
        }
    }

    #[test]
    fn wrong_kinds_and_missing_paths_inside_are_named() {
        let (_ws, _out, w) = setup("kind");
        let e = w.file("sub", "path").unwrap_err().to_string();
        assert!(e.contains("is not a regular file"), "{e}");
        let e = w.dir("sub/a.py", "cwd").unwrap_err().to_string();
        assert!(e.contains("is not a directory"), "{e}");
        let e = w.file("sub/none.py", "path").unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
        let e = w
            .create_dir("sub/a.py/v", "venv_path")
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not a directory"), "{e}");
    }

    #[test]
    fn broad_workspaces_are_refused_unless_allowed() {
        let state = Path::new("/home/u/.local/state/mcp");
        let home = Some(Path::new("/home/u"));
        for (root, word) in [
            ("/", "root directory"),
            ("/home/u", "home directory"),
            ("/home", "parent of the server's state dir"),
            ("/home/u/.local", "parent of the server's state dir"),
            (
                "/home/u/.local/state/mcp",
                "parent of the server's state dir",
            ),
            (
                "/home/u/.local/state/mcp/x",
                "inside the server's state dir",
            ),
        ] {
            let e = check_breadth(Path::new(root), state, home, false).unwrap_err();
            let text = e.to_string();
            assert!(text.contains(word), "{root}: {text}");
            assert!(text.contains("--allow-broad-workspace"), "{text}");
            assert!(!text.contains('\n'), "{text}");
            assert!(check_breadth(Path::new(root), state, home, true).is_ok());
        }
        for root in ["/home/u/project", "/home/u/.local/statex", "/srv/w"] {
            assert!(
                check_breadth(Path::new(root), state, home, false).is_ok(),
                "{root}"
            );
        }
    }

    #[test]
    fn relative_paths_resolve_against_the_workspace() {
        let w = Workspace::new("/w".into());
        assert_eq!(w.resolve("a/b"), PathBuf::from("/w/a/b"));
        assert_eq!(w.resolve("/x"), PathBuf::from("/x"));
    }
}
