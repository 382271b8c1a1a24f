//! One-off scripts: inline code or a script file run by `uv run --script` in a
//! transient environment built from declared dependencies (`--with`, PEP 508) and/or
//! the script's own PEP 723 `# /// script` block, with a chosen Python version, args,
//! env vars and a timeout. Runs through the launcher under the session policy plus
//! network (for resolution) and writes to the uv cache. Optionally reports a
//! benchmark of the whole process tree from the launcher's [`ExitReport`].

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use super::install::{duration_ms, uv_explanation};
use super::policy::{self, Grants};
use super::{Canceller, EnvConfig, EnvError, EnvSink, Uv, process};
use crate::sandbox::{ExitReport, ResolvedPolicy, SandboxCommand};

/// The script to run.
#[derive(Debug, Clone)]
pub enum ScriptSource {
    /// Inline code (written to `<state_dir>/scripts/` for the run, removed after).
    Code(String),
    /// A script file (relative paths are taken from the working directory).
    Path(PathBuf),
}

/// A one-off script run.
#[derive(Debug, Clone)]
pub struct ScriptRequest {
    pub source: ScriptSource,
    /// PEP 508 requirement strings added with `--with` (on top of any PEP 723 block).
    pub dependencies: Vec<String>,
    /// e.g. "3.11"; anything `uv run --python` accepts. `None`: the REPL's interpreter.
    pub python_version: Option<String>,
    pub args: Vec<String>,
    /// Extra environment variables for the script.
    pub env: Vec<(String, String)>,
    /// Kill the whole process tree after this long.
    pub timeout: Option<Duration>,
    /// Working directory (default: the workspace).
    pub cwd: Option<PathBuf>,
}

/// Wall, CPU and peak memory of the whole process tree (uv and the script).
#[derive(Debug, Clone, Default, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Benchmark {
    pub wall_ms: u64,
    /// user + system CPU time.
    pub cpu_ms: u64,
    pub user_cpu_ms: u64,
    pub system_cpu_ms: u64,
    pub peak_rss_bytes: u64,
}

impl Benchmark {
    pub fn from_report(r: &ExitReport) -> Self {
        Benchmark {
            wall_ms: duration_ms(r.wall),
            cpu_ms: duration_ms(r.user_cpu + r.system_cpu),
            user_cpu_ms: duration_ms(r.user_cpu),
            system_cpu_ms: duration_ms(r.system_cpu),
            peak_rss_bytes: r.peak_rss_bytes,
        }
    }
}

/// Why a script run did not succeed, when the cause is not the script itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ScriptFailure {
    /// The requested Python is not installed (and downloads are off).
    PythonUnavailable,
    /// uv could not build the environment (unknown package, no matching version...).
    Environment,
    TimedOut,
    Cancelled,
}

/// How a script run ended (the job's `result`).
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct ScriptReport {
    pub ok: bool,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub failure: Option<ScriptFailure>,
    /// Words for a failure that is not the script's own (uv's explanation, trimmed).
    pub message: Option<String>,
    pub benchmark: Benchmark,
}

/// Check a request before anything runs; returns the script file to run.
fn validate(cfg: &EnvConfig, req: &ScriptRequest) -> Result<(), EnvError> {
    let bad = |m: String| Err(EnvError::BadRequest(m));
    for d in &req.dependencies {
        if d.trim().is_empty() || d.starts_with('-') || d.chars().any(char::is_control) {
            return bad(format!(
                "{d:?} is not a requirement string (e.g. \"requests>=2\")"
            ));
        }
    }
    if let Some(v) = &req.python_version
        && (v.trim().is_empty() || v.starts_with('-') || v.chars().any(char::is_control))
    {
        return bad(format!("{v:?} is not a Python version (e.g. \"3.11\")"));
    }
    for (k, _) in &req.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return bad(format!("{k:?} is not a valid environment variable name"));
        }
    }
    if let ScriptSource::Path(p) = &req.source {
        let full = cwd(cfg, req).join(p);
        if !full.is_file() {
            return bad(format!("script file {} does not exist", full.display()));
        }
    }
    if let ScriptSource::Code(c) = &req.source
        && c.trim().is_empty()
    {
        return bad("the code is empty".into());
    }
    Ok(())
}

fn cwd(cfg: &EnvConfig, req: &ScriptRequest) -> PathBuf {
    match &req.cwd {
        Some(d) if d.is_absolute() => d.clone(),
        Some(d) => cfg.workspace.join(d),
        None => cfg.workspace.clone(),
    }
}

/// Run a one-off script to the end; its output goes to `sink` as it comes. Errors
/// are for requests that cannot run at all; script failures, a missing Python or an
/// unresolvable dependency are `Ok` with `ok: false` and `failure` set.
pub async fn run_script(
    cfg: &EnvConfig,
    uv: &Uv,
    req: &ScriptRequest,
    session_policy: &ResolvedPolicy,
    sink: Arc<dyn EnvSink>,
    cancel: &Canceller,
) -> Result<ScriptReport, EnvError> {
    validate(cfg, req)?;
    let workdir = cwd(cfg, req);
    let (script, temp) = match &req.source {
        ScriptSource::Path(p) => (workdir.join(p), None),
        ScriptSource::Code(code) => {
            let path = write_inline(cfg, code)?;
            (path.clone(), Some(path))
        }
    };
    let cache = cfg.uv_cache_dir();
    std::fs::create_dir_all(&cache)
        .map_err(|e| EnvError::io(format!("creating {}", cache.display()), e))?;
    let mut write = vec![cache];
    if cfg.python_downloads {
        let dir = cfg.python_install_dir();
        std::fs::create_dir_all(&dir)
            .map_err(|e| EnvError::io(format!("creating {}", dir.display()), e))?;
        write.push(dir);
    }
    let mut read = vec![script.clone()];
    read.extend(cfg.sources.local_dirs());
    let network = cfg.sources.needs_network();
    let policy = Arc::new(policy::extend(
        session_policy,
        &Grants {
            write,
            read,
            execute: vec![uv.path.clone(), cfg.python.clone()],
            network,
            confine_writes: false,
        },
    ));

    let mut cmd = SandboxCommand::new(policy.clone(), &uv.path);
    cmd.args(["run", "--quiet", "--no-project"])
        .args(cfg.sources.args());
    // Default: the REPL's own interpreter (already resolved past any PATH shim),
    // rather than whatever `python3` uv would find on PATH.
    match &req.python_version {
        Some(v) => cmd.arg("--python").arg(v),
        None => cmd.arg("--python").arg(&cfg.python),
    };
    for d in &req.dependencies {
        cmd.arg("--with").arg(d);
    }
    cmd.arg("--script").arg(&script).args(&req.args);
    cmd.current_dir(&workdir);
    uv.apply_env(&mut cmd, cfg, &policy);
    for (k, v) in &req.env {
        cmd.env(k, v);
    }

    let outcome = process::run(cmd, sink, None, cancel, req.timeout).await;
    if let Some(path) = temp {
        let _ = std::fs::remove_file(path);
    }
    let outcome = outcome?;
    let failure = if outcome.cancelled {
        Some(ScriptFailure::Cancelled)
    } else if outcome.timed_out {
        Some(ScriptFailure::TimedOut)
    } else if outcome.success() {
        None
    } else {
        classify_uv_failure(&outcome.stderr_tail)
    };
    let message = match failure {
        Some(ScriptFailure::Cancelled) => Some("cancelled".to_string()),
        Some(ScriptFailure::TimedOut) => Some(format!(
            "timed out after {}s; the whole process tree was killed",
            req.timeout.map_or(0, |t| t.as_secs())
        )),
        Some(ScriptFailure::PythonUnavailable) => Some(format!(
            "Python {} is not available here: {}",
            req.python_version.as_deref().unwrap_or("(default)"),
            uv_explanation(&outcome.stderr_tail)
        )),
        Some(ScriptFailure::Environment) => Some(format!(
            "the script's environment could not be built: {}",
            uv_explanation(&outcome.stderr_tail)
        )),
        None => None,
    };
    Ok(ScriptReport {
        ok: outcome.success(),
        exit_code: outcome.exit_code(),
        signal: outcome.signal(),
        failure,
        message,
        benchmark: Benchmark::from_report(&outcome.report),
    })
}

/// With `--quiet`, uv itself prints nothing unless it fails, and its failures start
/// with `error:`; a script's own failure starts with a traceback or its own output.
fn classify_uv_failure(stderr: &str) -> Option<ScriptFailure> {
    let first = stderr.lines().find(|l| !l.trim().is_empty())?.trim_start();
    if !first.starts_with("error:") {
        return None;
    }
    if first.contains("No interpreter found") || first.contains("Python request") {
        Some(ScriptFailure::PythonUnavailable)
    } else {
        Some(ScriptFailure::Environment)
    }
}

static SCRIPT_SEQ: AtomicU64 = AtomicU64::new(0);

fn write_inline(cfg: &EnvConfig, code: &str) -> Result<PathBuf, EnvError> {
    let dir = cfg.state_dir.join("scripts");
    std::fs::create_dir_all(&dir)
        .map_err(|e| EnvError::io(format!("creating {}", dir.display()), e))?;
    let n = SCRIPT_SEQ.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("script-{}-{n}.py", std::process::id()));
    std::fs::write(&path, code)
        .map_err(|e| EnvError::io(format!("writing {}", path.display()), e))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uv_failures_are_told_apart_from_script_failures() {
        let py = "error: No interpreter found for Python 3.99 in virtual environments, managed installations, or search path\n";
        assert_eq!(
            classify_uv_failure(py),
            Some(ScriptFailure::PythonUnavailable)
        );
        let dep = "error: No solution found when resolving `--with` dependencies\n  cause: Because nosuch was not found\n";
        assert_eq!(classify_uv_failure(dep), Some(ScriptFailure::Environment));
        let tb = "Traceback (most recent call last):\n  File \"x.py\"\nValueError: error: no\n";
        assert_eq!(classify_uv_failure(tb), None);
        assert_eq!(classify_uv_failure(""), None);
    }

    #[test]
    fn benchmark_adds_user_and_system_cpu() {
        let r = ExitReport {
            wall: Duration::from_millis(900),
            user_cpu: Duration::from_millis(300),
            system_cpu: Duration::from_millis(200),
            peak_rss_bytes: 42,
            ..ExitReport::default()
        };
        let b = Benchmark::from_report(&r);
        assert_eq!(
            b,
            Benchmark {
                wall_ms: 900,
                cpu_ms: 500,
                user_cpu_ms: 300,
                system_cpu_ms: 200,
                peak_rss_bytes: 42
            }
        );
    }
}
