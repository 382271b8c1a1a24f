//! Which Python interpreter the workers run, and its installation prefixes (the
//! policy's `{python}` placeholder).
//!
//! The default is the nearest `.venv` upward from the workspace, else `python3` on
//! PATH. PATH entries may be shims (pyenv's are shell scripts that re-exec the real
//! interpreter on every start, costing tens of milliseconds and needing a shell in the
//! sandbox), so the interpreter is asked once for `sys.executable` and that is used.
//! That probe runs outside the sandbox, so it never runs a program sandboxed code could
//! have written (see `probe_candidate`).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::error::ReplError;

/// The worker driver, embedded so the binary is self-contained (the probe compiles it
/// with each interpreter: [`PythonInfo::driver_code`]).
pub(crate) const WORKER_SOURCE: &str = include_str!("../../python/sandbox_repl_worker.py");

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
    /// The worker driver compiled by this interpreter (base64 of `marshal.dumps`): workers
    /// start from it instead of compiling the source each time (saves ~5 ms per start).
    #[serde(skip)]
    pub worker_code: Option<std::sync::Arc<str>>,
}

impl PythonInfo {
    /// The precompiled driver as bytes (marshal data), if there is one.
    pub(crate) fn driver_code(&self) -> Option<std::sync::Arc<[u8]>> {
        use base64::Engine;
        let text = self.worker_code.as_deref()?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .ok()
            .map(Into::into)
    }

    /// The same interpreter with the same installation (the precompiled driver aside).
    pub(crate) fn same_interpreter(&self, other: &PythonInfo) -> bool {
        self.executable == other.executable
            && self.version == other.version
            && self.prefixes == other.prefixes
            && self.venv == other.venv
    }
}

/// Prints the interpreter's facts as a JSON list, the last item the worker driver (read
/// from stdin) compiled and marshalled, or null if that failed.
///
/// It runs with `-S` (no `site`): `.pth` files in site-packages may import whole packages
/// at every start (tens of milliseconds), and none of the facts needs them. Without
/// `site`, a virtual environment's prefix is not applied, so the probe does what
/// `site.venv` does: a `pyvenv.cfg` beside the executable or one directory up makes that
/// directory `sys.prefix` and `sys.exec_prefix`. Given an argument, it looks there
/// instead of beside the executable (a venv whose interpreter is probed by its real path).
const PROBE: &str = "import sys,json,marshal,binascii,os\n\
try: c=binascii.b2a_base64(marshal.dumps(compile(sys.stdin.read(),'<sandbox-repl-worker>','exec')),newline=False).decode()\n\
except Exception: c=None\n\
p,e=sys.prefix,sys.exec_prefix\n\
d=sys.argv[1] if len(sys.argv)>1 else os.path.dirname(sys.executable)\n\
v=[v for v in (d,os.path.dirname(d)) if os.path.isfile(os.path.join(v,'pyvenv.cfg'))]\n\
if v: p=e=v[0]\n\
print(json.dumps([sys.executable,sys.version.split()[0],p,sys.base_prefix,e,sys.base_exec_prefix,c]))";

/// The interpreter to use: `explicit`, else the nearest `.venv` upward from
/// `workspace`, else `python3` on PATH; probed for its real executable and prefixes.
pub async fn discover_python(
    explicit: Option<&Path>,
    workspace: &Path,
) -> Result<PythonInfo, ReplError> {
    let candidate = candidate(explicit, workspace)?;
    probe_candidate(&candidate, explicit.is_some(), &[workspace]).await
}

/// Probe `candidate` — outside the sandbox, so never a program a job could have written.
/// An explicit `--python` is the user's choice, and a candidate outside `job_writable`
/// (the workspace and the state dir) no job can change. A `.venv` found inside them is
/// another matter: a job may have written its `bin/python`. Then the real interpreter it
/// links to is probed by its real path (told where the venv is), provided that path lies
/// outside `job_writable` too; the venv's own `bin/python` only ever runs in the sandbox.
/// A venv whose interpreter is a file in there (a `--copies` venv, or whatever a job
/// wrote) is not used: `python3` on PATH is, and a warning says why.
pub(super) async fn probe_candidate(
    candidate: &Path,
    explicit: bool,
    job_writable: &[&Path],
) -> Result<PythonInfo, ReplError> {
    // Each root as given and as resolved: the candidate is built from the first, the
    // real interpreter's path from the second.
    let roots: Vec<PathBuf> = job_writable
        .iter()
        .flat_map(|root| {
            [root.to_path_buf()]
                .into_iter()
                .chain(root.canonicalize().ok())
        })
        .collect();
    let inside = |p: &Path| roots.iter().any(|root| p.starts_with(root));
    if explicit || !inside(candidate) {
        return probe(candidate, None).await;
    }
    let bin = candidate.parent().unwrap_or(Path::new("/"));
    match candidate.canonicalize() {
        Ok(real) if !inside(&real) => {
            let mut info = probe(&real, Some(bin)).await?;
            info.executable = candidate.to_path_buf();
            Ok(info)
        }
        found => {
            let why = match found {
                Ok(real) => format!("it is the file {}", real.display()),
                Err(e) => format!("it cannot be resolved ({e})"),
            };
            tracing::warn!(
                venv_python = %candidate.display(),
                "not using the workspace's virtual environment: {why}, in a directory sandboxed \
                 code can write, and the server does not run such a program outside the \
                 sandbox; using python3 from PATH (pass --python to choose the interpreter)"
            );
            let path = which::which("python3").map_err(|e| ReplError::PythonNotFound {
                detail: format!(
                    "{} is not usable ({why}) and there is no python3 on PATH ({e})",
                    candidate.display()
                ),
            })?;
            probe(&path, None).await
        }
    }
}

/// The path to ask: `explicit`, else the nearest `.venv` upward from `workspace`, else
/// `python3` on PATH (which may be a shim).
pub(crate) fn candidate(explicit: Option<&Path>, workspace: &Path) -> Result<PathBuf, ReplError> {
    Ok(match explicit {
        Some(p) => p.to_path_buf(),
        None => match nearest_venv_python(workspace) {
            Some(p) => p,
            None => which::which("python3").map_err(|e| ReplError::PythonNotFound {
                detail: format!(
                    "no .venv above {} and no python3 on PATH ({e})",
                    workspace.display()
                ),
            })?,
        },
    })
}

/// `<dir>/.venv/bin/python` for the nearest `dir` at or above `start` that has one.
pub(crate) fn nearest_venv_python(start: &Path) -> Option<PathBuf> {
    start
        .ancestors()
        .map(|dir| dir.join(".venv/bin/python"))
        .find(|p| p.is_file())
}

/// Run the probe with `python`; `venv_bin`: where to look for `pyvenv.cfg` instead of
/// beside it.
pub(crate) async fn probe(python: &Path, venv_bin: Option<&Path>) -> Result<PythonInfo, ReplError> {
    let fail = |detail: String| ReplError::PythonProbe {
        python: python.to_path_buf(),
        detail,
    };
    let mut child = tokio::process::Command::new(python)
        .args(["-S", "-c", PROBE])
        .args(venv_bin)
        // `-c` puts the working directory first on sys.path, and this probe runs outside
        // the sandbox: from the server's (often the workspace, where a job may have put a
        // `json.py`) it would import what a job left there.
        .current_dir("/")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| fail(format!("could not run it ({e})")))?;
    if let Some(mut stdin) = child.stdin.take() {
        use tokio::io::AsyncWriteExt;
        // A failed write shows up as a probe without compiled code; the source is the fallback.
        let _ = stdin.write_all(WORKER_SOURCE.as_bytes()).await;
    }
    let out = tokio::time::timeout(std::time::Duration::from_secs(30), child.wait_with_output())
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
        fail(format!(
            "unexpected answer to the probe: {:?}",
            String::from_utf8_lossy(&out.stdout)
        ))
    })
}

fn parse_probe(stdout: &[u8]) -> Option<PythonInfo> {
    let fields: Vec<Option<String>> = serde_json::from_slice(stdout.trim_ascii()).ok()?;
    let [
        Some(exe),
        Some(version),
        Some(prefix),
        Some(base_prefix),
        Some(exec_prefix),
        Some(base_exec_prefix),
        code,
    ] = fields.as_slice()
    else {
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
    Some(PythonInfo {
        executable: PathBuf::from(exe),
        version: version.clone(),
        prefixes,
        venv,
        worker_code: code.as_deref().map(Into::into),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_answer_gives_prefixes_and_venv() {
        let info = parse_probe(
            br#"["/w/.venv/bin/python","3.11.7","/w/.venv","/usr","/w/.venv","/usr",null]"#,
        )
        .unwrap();
        assert_eq!(info.executable, PathBuf::from("/w/.venv/bin/python"));
        assert_eq!(
            info.prefixes,
            vec![PathBuf::from("/w/.venv"), PathBuf::from("/usr")]
        );
        assert_eq!(info.venv, Some(PathBuf::from("/w/.venv")));
        assert_eq!(parse_probe(b"garbage"), None);
    }

    #[test]
    fn nearest_venv_is_found_upward() {
        let scratch = crate::test_support::scratch_dir("repl-venv-test");
        let root = scratch.path();
        let deep = root.join("a/b");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::create_dir_all(root.join(".venv/bin")).unwrap();
        std::fs::write(root.join(".venv/bin/python"), "").unwrap();
        assert_eq!(
            nearest_venv_python(&deep),
            Some(root.join(".venv/bin/python"))
        );
    }

    #[tokio::test]
    async fn python3_on_path_resolves_to_the_real_interpreter() {
        let info = discover_python(None, Path::new("/")).await.unwrap();
        assert!(info.executable.is_absolute());
        assert!(!info.prefixes.is_empty());
        assert!(
            info.worker_code.is_some(),
            "the worker driver did not compile"
        );
        // Not a shell-script shim: the file starts with the ELF magic (or is a venv link).
        let head = std::fs::read(&info.executable).unwrap();
        assert_eq!(
            &head[..4],
            b"\x7fELF",
            "{} is not a real interpreter",
            info.executable.display()
        );
    }

    /// The probe runs without `site`, yet still finds the prefix of a virtual environment.
    #[tokio::test]
    async fn a_virtual_environment_is_recognised_without_site() {
        let (_scratch, root) = crate::test_support::scratch_path("repl-probe-venv", "venv");
        let base = discover_python(None, Path::new("/")).await.unwrap();
        let made = std::process::Command::new(&base.executable)
            .args(["-m", "venv", "--without-pip"])
            .arg(&root)
            .status()
            .unwrap();
        assert!(
            made.success(),
            "could not create a venv at {}",
            root.display()
        );
        let python = root.join("bin/python");
        let info = discover_python(Some(&python), Path::new("/"))
            .await
            .unwrap();
        assert_eq!(info.venv, Some(root.clone()));
        assert_eq!(info.executable, python);
        assert!(info.prefixes.contains(&root));
        assert!(
            info.prefixes.iter().any(|p| p != &root),
            "the base installation is missing from {:?}",
            info.prefixes
        );
    }
}
