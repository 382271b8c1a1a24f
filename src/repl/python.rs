//! Which Python interpreter the workers run, and its installation prefixes (the
//! policy's `{python}` placeholder).
//!
//! The default is the nearest `.venv` upward from the workspace, else `python3` on
//! PATH. PATH entries may be shims (pyenv's are shell scripts that re-exec the real
//! interpreter on every start, costing tens of milliseconds and needing a shell in the
//! sandbox), so the interpreter is asked once for `sys.executable` and that is used.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::ReplError;

/// A probed interpreter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PythonInfo {
    /// The real interpreter (`sys.executable`; inside a venv, the venv's python).
    pub executable: PathBuf,
    /// e.g. "3.11.7".
    pub version: String,
    /// sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix (deduplicated).
    pub prefixes: Vec<PathBuf>,
    /// The virtual environment, when the interpreter runs in one (sys.prefix != base_prefix).
    pub venv: Option<PathBuf>,
}

const PROBE: &str = "import sys,json;print(json.dumps([sys.executable,sys.version.split()[0],\
sys.prefix,sys.base_prefix,sys.exec_prefix,sys.base_exec_prefix]))";

/// The interpreter to use: `explicit`, else the nearest `.venv` upward from
/// `workspace`, else `python3` on PATH; probed for its real executable and prefixes.
pub async fn discover_python(explicit: Option<&Path>, workspace: &Path) -> Result<PythonInfo, ReplError> {
    let candidate = match explicit {
        Some(p) => p.to_path_buf(),
        None => match nearest_venv_python(workspace) {
            Some(p) => p,
            None => which::which("python3").map_err(|e| ReplError::PythonNotFound {
                detail: format!("no .venv above {} and no python3 on PATH ({e})", workspace.display()),
            })?,
        },
    };
    probe(&candidate).await
}

/// `<dir>/.venv/bin/python` for the nearest `dir` at or above `start` that has one.
pub(crate) fn nearest_venv_python(start: &Path) -> Option<PathBuf> {
    start.ancestors().map(|dir| dir.join(".venv/bin/python")).find(|p| p.is_file())
}

async fn probe(python: &Path) -> Result<PythonInfo, ReplError> {
    let fail = |detail: String| ReplError::PythonProbe { python: python.to_path_buf(), detail };
    let out = tokio::process::Command::new(python)
        .args(["-c", PROBE])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(30), out)
        .await
        .map_err(|_| fail("it did not answer within 30 s".into()))?
        .map_err(|e| fail(format!("could not run it ({e})")))?;
    if !out.status.success() {
        return Err(fail(format!(
            "it exited with {} ({})",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    parse_probe(&out.stdout).ok_or_else(|| {
        fail(format!("unexpected answer to the probe: {:?}", String::from_utf8_lossy(&out.stdout)))
    })
}

fn parse_probe(stdout: &[u8]) -> Option<PythonInfo> {
    let fields: Vec<String> = serde_json::from_slice(stdout.trim_ascii()).ok()?;
    let [exe, version, prefix, base_prefix, exec_prefix, base_exec_prefix] = fields.as_slice() else {
        return None;
    };
    if exe.is_empty() {
        return None;
    }
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for p in [prefix, base_prefix, exec_prefix, base_exec_prefix] {
        let p = PathBuf::from(p);
        if !prefixes.contains(&p) {
            prefixes.push(p);
        }
    }
    let venv = (prefix != base_prefix).then(|| PathBuf::from(prefix));
    Some(PythonInfo { executable: PathBuf::from(exe), version: version.clone(), prefixes, venv })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_answer_gives_prefixes_and_venv() {
        let info = parse_probe(br#"["/w/.venv/bin/python","3.11.7","/w/.venv","/usr","/w/.venv","/usr"]"#).unwrap();
        assert_eq!(info.executable, PathBuf::from("/w/.venv/bin/python"));
        assert_eq!(info.prefixes, vec![PathBuf::from("/w/.venv"), PathBuf::from("/usr")]);
        assert_eq!(info.venv, Some(PathBuf::from("/w/.venv")));
        assert_eq!(parse_probe(b"garbage"), None);
    }

    #[test]
    fn nearest_venv_is_found_upward() {
        let root = std::env::temp_dir().join(format!("repl-venv-test-{}", std::process::id()));
        let deep = root.join("a/b");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::create_dir_all(root.join(".venv/bin")).unwrap();
        std::fs::write(root.join(".venv/bin/python"), "").unwrap();
        assert_eq!(nearest_venv_python(&deep), Some(root.join(".venv/bin/python")));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[tokio::test]
    async fn python3_on_path_resolves_to_the_real_interpreter() {
        let info = discover_python(None, Path::new("/")).await.unwrap();
        assert!(info.executable.is_absolute());
        assert!(!info.prefixes.is_empty());
        // Not a shell-script shim: the file starts with the ELF magic (or is a venv link).
        let head = std::fs::read(&info.executable).unwrap();
        assert_eq!(&head[..4], b"\x7fELF", "{} is not a real interpreter", info.executable.display());
    }
}
