//! Workspace confinement: paths from tool arguments, resolved against the workspace,
//! and the check for those the server hands on with extra rights (a venv gets written,
//! a script gets a read grant). Plain functions on a path, testable without MCP.

use std::path::{Path, PathBuf};

use super::error::AppError;

/// The canonical workspace directory.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
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

    /// `p` as a path strictly inside the workspace: a path outside (absolute, `..`, or
    /// through a symlink in the workspace) would open the host to a tool call. The
    /// longest existing prefix is resolved; what is left must be plain names.
    pub fn inside(&self, p: &str, what: &str) -> Result<PathBuf, AppError> {
        let refuse = || AppError::OutsideWorkspace {
            what: what.to_string(),
            path: p.to_string(),
            workspace: self.root.clone(),
        };
        let path = self.resolve(p);
        let mut existing = path.as_path();
        let mut rest = Vec::new();
        // A dangling symlink counts as existing (and then fails to resolve): it would be
        // followed by whoever creates the path.
        while existing.symlink_metadata().is_err() {
            let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
                return Err(refuse());
            };
            rest.push(name.to_owned());
            existing = parent;
        }
        let mut real = existing.canonicalize().map_err(|_| refuse())?;
        if !real.starts_with(&self.root) || (real == self.root && rest.is_empty()) {
            return Err(refuse());
        }
        for name in rest.iter().rev() {
            if name == ".." || name == "." {
                return Err(refuse());
            }
            real.push(name);
        }
        Ok(real)
    }
}

/// Refuse a workspace that would hand sandboxed code the whole machine, the user's files
/// or the server's own state: `/`, `home`, a parent of `state_dir` or anything inside
/// it — unless `allow_broad` (then the state dir is still masked from the job's view).
/// All paths canonical.
pub fn check_breadth(
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
    use std::os::unix::fs::symlink;

    /// A scratch directory removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let p = std::env::temp_dir().join(format!("app-ws-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Scratch(p.canonicalize().unwrap())
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A workspace with a file, a symlink out, a dangling one, and one that stays inside.
    fn setup(name: &str) -> (Scratch, Scratch, Workspace) {
        let ws = Scratch::new(&format!("{name}-ws"));
        let outside = Scratch::new(&format!("{name}-out"));
        let root = ws.0.clone();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a.py"), "").unwrap();
        symlink(&outside.0, root.join("out")).unwrap();
        symlink(outside.0.join("nothing"), root.join("dangling")).unwrap();
        symlink(root.join("sub"), root.join("in")).unwrap();
        (ws, outside, Workspace::new(root))
    }

    #[test]
    fn paths_inside_are_accepted_and_resolved() {
        let (_ws, _out, w) = setup("in");
        let root = w.root().to_path_buf();
        assert_eq!(w.inside("sub/a.py", "path").unwrap(), root.join("sub/a.py"));
        assert_eq!(w.inside("new/venv", "p").unwrap(), root.join("new/venv"));
        let abs = root.join("sub/a.py");
        assert_eq!(w.inside(abs.to_str().unwrap(), "p").unwrap(), abs);
        // A symlink that stays inside resolves to its target.
        assert_eq!(w.inside("in/a.py", "p").unwrap(), root.join("sub/a.py"));
    }

    #[test]
    fn paths_leading_out_are_refused() {
        let (_ws, out, w) = setup("out");
        let outside = out.0.to_str().unwrap().to_string();
        for p in [
            "/etc/passwd",
            "/",
            "..",
            "../x",
            "sub/../../x",
            "new/../../x",
            ".",
            "",
            "out",
            "out/x",
            "dangling",
            "dangling/x",
            outside.as_str(),
        ] {
            let e = w.inside(p, "venv_path").unwrap_err();
            assert!(
                matches!(&e, AppError::OutsideWorkspace { what, .. } if what == "venv_path"),
                "{p:?} accepted or wrong error: {e}"
            );
            assert!(e.to_string().contains("is outside the workspace"), "{e}");
        }
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
