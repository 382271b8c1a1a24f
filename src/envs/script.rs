//! One-off scripts: inline code or a script file run in a
//! transient environment built from declared dependencies (`--with`, PEP 508) and/or
//! the script's own PEP 723 `# /// script` block, with a chosen Python version, args,
//! env vars and a timeout. The environment is built by uv under the installer's rules
//! (network through the broker, writes to the transient venv and the session's uv cache
//! only, within their disk bound);
//! the script then runs under the session policy alone. Reports a benchmark of both
//! steps from the launcher's [`ExitReport`]s.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use super::install::{duration_ms, uv_explanation, with_denials};
use super::policy::{self, Grants};
use super::process::{DiskWatch, RunOutcome};
use super::{Canceller, EnvConfig, EnvError, EnvSink, Lease, Uv, process};
use crate::sandbox::{ExitReport, ResolvedPolicy};

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
    /// The session's stores (uv cache, transient environment) reached their disk bound.
    DiskLimit,
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
    /// Connections a network broker refused (resolving dependencies, or the script's
    /// own under a proxy-mode policy), in words.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub denied: Vec<String>,
    /// The limit that stopped it: `"disk"` (the session's stores at their bound),
    /// `"memory"`, `"cpu"`, `"wall_time"`, `"file_size"`, `"processes"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    /// The Python version the script ran on ("3.11.7"), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    /// What its environment resolved to, `name==version`, sorted (none without one).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resolved: Vec<String>,
    /// The environment an earlier run with the same dependencies and Python built was
    /// used again (no uv step ran).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub reused_environment: bool,
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
///
/// Two steps, each under its own policy:
/// 1. When the script needs an environment (dependencies, a PEP 723 block, another
///    Python), uv builds a transient venv under the installer's rules: the installer's
///    network (by default the broker's proxy to the package indexes), writes only to
///    that venv, the uv cache of `lease`'s owner and its temp dir; build hooks run under
///    the same rules. Both are measured while uv runs, which is killed at their bound.
/// 2. The script runs with that venv's interpreter (or the REPL's) under the session
///    policy, which keeps its own network setting (none by default).
pub async fn run_script(
    cfg: &EnvConfig,
    uv: &Uv,
    req: &ScriptRequest,
    session_policy: &ResolvedPolicy,
    lease: &Lease,
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
    let started = std::time::Instant::now();
    let pep723 = has_script_block(&script);
    let needs_env = !req.dependencies.is_empty() || req.python_version.is_some() || pep723;
    let mut benchmark = Benchmark::default();
    let mut env_dir = None;
    let mut prefixes = Vec::new();
    let key = needs_env.then(|| env_key(cfg, uv, req, lease, &script, pep723, session_policy));
    let mut reused = None;
    let mut built = false;
    let result = async {
        let python = if let Some(hit) = key.and_then(reuse) {
            // The same dependencies and Python as an earlier run: its environment as uv
            // built it (no job can write it since), no uv step.
            prefixes = hit.prefixes.clone();
            env_dir = Some(hit.dir.clone());
            let python = hit.dir.join("bin").join("python");
            reused = Some(hit);
            python
        } else if needs_env {
            let dir = transient_env_dir(cfg)?;
            env_dir = Some(dir.clone());
            lease.add_tree(&dir);
            match build_env(
                cfg,
                uv,
                req,
                session_policy,
                &script,
                pep723,
                &dir,
                lease,
                &sink,
                cancel,
            )
            .await?
            {
                Ok((b, base)) => {
                    add(&mut benchmark, &b);
                    prefixes = base;
                    built = true;
                    dir.join("bin").join("python")
                }
                Err(mut report) => {
                    add(&mut report.benchmark, &benchmark);
                    return Ok(report);
                }
            }
        } else {
            cfg.python.clone()
        };
        // Step 2: the script itself, under the session policy.
        let mut policy = session_policy.with_read(script.clone());
        if let Some(dir) = &env_dir {
            policy = policy.with_execute(dir.clone());
            for prefix in &prefixes {
                policy = policy.with_execute(prefix);
            }
        } else if let Some(prefix) = interpreter_prefix(&python) {
            // The REPL's interpreter: what the session runs already.
            policy = policy.with_execute(prefix);
        }
        let policy = Arc::new(policy);
        let mut cmd = cfg.sandbox.command(policy.clone(), &python);
        cmd.arg(&script).args(&req.args);
        cmd.current_dir(&workdir);
        for (k, v) in &req.env {
            cmd.env(k, v);
        }
        let left = req.timeout.map(|t| t.saturating_sub(started.elapsed()));
        // The script writes no store (the workspace is not one), only its temp dir,
        // which is measured when it is a host directory.
        let watch = DiskWatch::new(lease, Vec::new(), &policy);
        let outcome = process::run(cmd, sink.clone(), None, cancel, left, Some(watch)).await?;
        add(&mut benchmark, &Benchmark::from_report(&outcome.report));
        let failure = if outcome.cancelled {
            Some(ScriptFailure::Cancelled)
        } else if outcome.timed_out {
            Some(ScriptFailure::TimedOut)
        } else if outcome.disk.is_some() {
            Some(ScriptFailure::DiskLimit)
        } else {
            None
        };
        let message = match (outcome.limit_words(&policy), failure) {
            (Some(words), _) => Some(words),
            (None, Some(f)) => Some(failure_words(f, req, "")),
            (None, None) => None,
        };
        let (python, resolved) = match &env_dir {
            Some(dir) => (
                venv_version(dir).or_else(|| cfg.python_version.clone()),
                installed(dir),
            ),
            None => (cfg.python_version.clone(), Vec::new()),
        };
        Ok(ScriptReport {
            ok: outcome.success(),
            exit_code: outcome.exit_code(),
            signal: outcome.signal(),
            failure,
            message,
            benchmark: benchmark.clone(),
            limit: outcome.limit().map(str::to_string),
            denied: outcome.denied,
            python,
            resolved,
            reused_environment: reused.is_some(),
        })
    }
    .await;
    if let Some(path) = temp {
        let _ = std::fs::remove_file(path);
    }
    match (reused, env_dir) {
        (Some(hit), _) => release(&hit),
        (None, Some(dir)) => {
            // Kept for the next run with the same key if it was built whole and the
            // script did not fail in a way that says the environment is at fault.
            let kept = match (&key, &result) {
                (Some(k), Ok(_)) if built => keep(*k, &dir, &prefixes),
                _ => false,
            };
            if !kept {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        (None, None) => {}
    }
    result
}

/// Script environments kept for reuse (at most [`KEPT_ENVS`] per server, each at most
/// [`KEPT_FOR`] old), by [`env_key`]. They live in `<state>/script-envs/env-<server>-<n>`,
/// which no job can write once uv has built them (the state dir is hidden from every
/// job; the build step could write only that directory), and which the next server's
/// start-up sweep removes. The prefixes are those read right after `uv venv`.
struct KeptEnv {
    dir: PathBuf,
    prefixes: Vec<PathBuf>,
    built: std::time::Instant,
    used: std::time::Instant,
    busy: usize,
}

/// Most script environments kept at once (the least recently used one goes).
const KEPT_ENVS: usize = 8;
/// Oldest kept environment reused: an unpinned dependency is resolved again after this.
const KEPT_FOR: Duration = Duration::from_secs(3600);

static KEPT: std::sync::Mutex<Option<std::collections::HashMap<u64, KeptEnv>>> =
    std::sync::Mutex::new(None);

fn kept() -> std::sync::MutexGuard<'static, Option<std::collections::HashMap<u64, KeptEnv>>> {
    KEPT.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a script environment depends on, hashed: whose it is (the lease's owner: never
/// another session's), the dependency strings (as a set), the Python asked for (or the
/// REPL's interpreter and its identity), the PEP 723 block, the package sources, the
/// wheels-only rule and the installer's network, and the uv binary.
fn env_key(
    cfg: &EnvConfig,
    uv: &Uv,
    req: &ScriptRequest,
    lease: &Lease,
    script: &std::path::Path,
    pep723: bool,
    policy: &ResolvedPolicy,
) -> u64 {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::MetadataExt;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    lease.owner().hash(&mut h);
    let mut deps = req.dependencies.clone();
    deps.sort();
    deps.dedup();
    deps.hash(&mut h);
    req.python_version.hash(&mut h);
    cfg.python.hash(&mut h);
    for p in [&cfg.python, &uv.sealed(cfg)] {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
            .hash(&mut h);
    }
    if pep723 {
        script_block(script).hash(&mut h);
    }
    cfg.sources.args().hash(&mut h);
    policy.wheels_only.hash(&mut h);
    format!(
        "{:?}",
        policy::installer_network(policy, cfg.sandbox.namespaces_usable())
    )
    .hash(&mut h);
    h.finish()
}

/// A kept environment for `key`, marked in use; `None` if there is none (or it is too old).
fn reuse(key: u64) -> Option<KeptEnvRef> {
    let mut map = kept();
    let envs = map.get_or_insert_with(Default::default);
    let env = envs.get_mut(&key)?;
    if env.built.elapsed() > KEPT_FOR || !env.dir.join("bin").join("python").exists() {
        if env.busy == 0 {
            let gone = envs.remove(&key)?;
            remove_later(gone.dir);
        }
        return None;
    }
    env.busy += 1;
    env.used = std::time::Instant::now();
    Some(KeptEnvRef {
        key,
        dir: env.dir.clone(),
        prefixes: env.prefixes.clone(),
    })
}

/// A kept environment in use by one run.
struct KeptEnvRef {
    key: u64,
    dir: PathBuf,
    prefixes: Vec<PathBuf>,
}

fn release(hit: &KeptEnvRef) {
    if let Some(env) = kept()
        .get_or_insert_with(Default::default)
        .get_mut(&hit.key)
    {
        env.busy = env.busy.saturating_sub(1);
    }
}

/// Keep `dir` (just built for `key`) for later runs; false if another run kept one for
/// the same key first (then `dir` is removed by the caller).
fn keep(key: u64, dir: &std::path::Path, prefixes: &[PathBuf]) -> bool {
    let mut map = kept();
    let envs = map.get_or_insert_with(Default::default);
    if envs.contains_key(&key) {
        return false;
    }
    while envs.len() >= KEPT_ENVS {
        let Some(lru) = envs
            .iter()
            .filter(|(_, e)| e.busy == 0)
            .min_by_key(|(_, e)| e.used)
            .map(|(k, _)| *k)
        else {
            return false;
        };
        if let Some(gone) = envs.remove(&lru) {
            remove_later(gone.dir);
        }
    }
    let now = std::time::Instant::now();
    envs.insert(
        key,
        KeptEnv {
            dir: dir.to_path_buf(),
            prefixes: prefixes.to_vec(),
            built: now,
            used: now,
            busy: 0,
        },
    );
    true
}

fn remove_later(dir: PathBuf) {
    std::thread::spawn(move || {
        let _ = std::fs::remove_dir_all(dir);
    });
}

/// The PEP 723 block's lines (what uv reads of the script), from a bounded read.
fn script_block(script: &std::path::Path) -> Vec<Vec<u8>> {
    use std::io::BufRead;
    let Some(file) = super::open_job_file(script, SCRIPT_BLOCK_SCAN) else {
        return Vec::new();
    };
    let mut inside = false;
    let mut lines = Vec::new();
    for l in std::io::BufReader::new(file)
        .split(b'\n')
        .map_while(Result::ok)
    {
        let t = l.trim_ascii_end();
        if t == b"# /// script" {
            inside = true;
        } else if inside && t == b"# ///" {
            break;
        } else if inside {
            lines.push(t.to_vec());
        }
    }
    lines
}

fn failure_words(f: ScriptFailure, req: &ScriptRequest, stderr: &str) -> String {
    match f {
        ScriptFailure::Cancelled => "cancelled".to_string(),
        ScriptFailure::TimedOut => format!(
            "timed out after {}s; the whole process tree was killed",
            req.timeout.map_or(0, |t| t.as_secs())
        ),
        ScriptFailure::PythonUnavailable => format!(
            "Python {} is not available here: {}",
            req.python_version.as_deref().unwrap_or("(default)"),
            uv_explanation(stderr)
        ),
        ScriptFailure::Environment => format!(
            "the script's environment could not be built: {}",
            uv_explanation(stderr)
        ),
        ScriptFailure::DiskLimit => {
            "killed: the session's package stores reached their disk bound".to_string()
        }
    }
}

fn add(total: &mut Benchmark, b: &Benchmark) {
    total.wall_ms += b.wall_ms;
    total.cpu_ms += b.cpu_ms;
    total.user_cpu_ms += b.user_cpu_ms;
    total.system_cpu_ms += b.system_cpu_ms;
    total.peak_rss_bytes = total.peak_rss_bytes.max(b.peak_rss_bytes);
}

/// How much of a script the server itself reads looking for its block: a workspace file
/// may be any size (a sparse one costs no disk), and this is the server's memory.
const SCRIPT_BLOCK_SCAN: u64 = 16 << 20;

/// Whether the script has a PEP 723 `# /// script` block (then uv reads its
/// dependencies with `-r script`) in its first [`SCRIPT_BLOCK_SCAN`] bytes. Opened
/// without blocking and without following a last-step link, and only a regular file is
/// read: a job may have swapped the checked path for a FIFO or a link since.
fn has_script_block(script: &std::path::Path) -> bool {
    use std::io::BufRead;
    super::open_job_file(script, SCRIPT_BLOCK_SCAN).is_some_and(|file| {
        std::io::BufReader::new(file)
            .split(b'\n')
            .map_while(Result::ok)
            .any(|l| l.trim_ascii_end() == b"# /// script")
    })
}

fn transient_env_dir(cfg: &EnvConfig) -> Result<PathBuf, EnvError> {
    let n = SCRIPT_SEQ.fetch_add(1, Ordering::Relaxed);
    let dir = cfg
        .state_dir
        .join("script-envs")
        .join(format!("env-{}-{n}", cfg.sandbox.instance_id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| EnvError::io(format!("creating {}", dir.display()), e))?;
    Ok(dir)
}

/// The installation prefixes of the interpreter a venv is based on (`home` in its
/// pyvenv.cfg, and where that resolves to): the script's interpreter must run from there.
/// Read right after `uv venv`, before any package's build hook could rewrite the venv.
fn base_prefixes(venv: &std::path::Path) -> Vec<PathBuf> {
    let cfg = std::fs::read_to_string(venv.join("pyvenv.cfg")).unwrap_or_default();
    let mut out = Vec::new();
    for line in cfg.lines() {
        if let Some((k, v)) = line.split_once('=')
            && k.trim() == "home"
        {
            let home = PathBuf::from(v.trim());
            for bin in [home.clone(), home.canonicalize().unwrap_or(home)] {
                if let Some(prefix) = bin.parent()
                    && prefix != std::path::Path::new("/")
                    && !out.contains(&prefix.to_path_buf())
                {
                    out.push(prefix.to_path_buf());
                }
            }
        }
    }
    if let Ok(real) = venv.join("bin").join("python").canonicalize()
        && let Some(prefix) = real.parent().and_then(|b| b.parent())
        && prefix != std::path::Path::new("/")
        && !out.contains(&prefix.to_path_buf())
    {
        out.push(prefix.to_path_buf());
    }
    out
}

/// The installation prefix of an interpreter (`<prefix>/bin/python3` → `<prefix>`).
fn interpreter_prefix(python: &std::path::Path) -> Option<PathBuf> {
    let real = python.canonicalize().ok()?;
    let prefix = real.parent()?.parent()?;
    (prefix != std::path::Path::new("/")).then(|| prefix.to_path_buf())
}

/// Step 1: `uv venv` + `uv pip install` into `dir` under the installer's rules. `Ok(Ok)`
/// The Python version of the environment in `dir`, from its `pyvenv.cfg` (`version_info`
/// as uv writes it, or `version`): read, never run.
fn venv_version(dir: &std::path::Path) -> Option<String> {
    let cfg = std::fs::read_to_string(dir.join("pyvenv.cfg")).ok()?;
    cfg.lines().find_map(|l| {
        let (key, value) = l.split_once('=')?;
        matches!(key.trim(), "version_info" | "version").then(|| value.trim().to_string())
    })
}

/// The distributions installed in the environment in `dir` (`name==version`, sorted),
/// from the names of its `*.dist-info` directories: read, never run.
fn installed(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(lib) = std::fs::read_dir(dir.join("lib")) else {
        return out;
    };
    for py in lib.flatten() {
        let Ok(entries) = std::fs::read_dir(py.path().join("site-packages")) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".dist-info")) else {
                continue;
            };
            if let Some((dist, version)) = stem.split_once('-') {
                out.push(format!("{dist}=={version}"));
            }
        }
    }
    out.sort();
    out
}

/// with the benchmark when the environment is ready, `Ok(Err(report))` when it could
/// not be built (the report says why).
#[expect(
    clippy::too_many_arguments,
    reason = "one script environment's inputs, each named at its one call site"
)]
async fn build_env(
    cfg: &EnvConfig,
    uv: &Uv,
    req: &ScriptRequest,
    session_policy: &ResolvedPolicy,
    script: &std::path::Path,
    pep723: bool,
    dir: &std::path::Path,
    lease: &Lease,
    sink: &Arc<dyn EnvSink>,
    cancel: &Canceller,
) -> Result<Result<(Benchmark, Vec<PathBuf>), ScriptReport>, EnvError> {
    let cache = lease.cache_dir()?;
    let write = vec![dir.to_path_buf(), cache.clone()];
    let mut read = vec![script.to_path_buf()];
    read.extend(cfg.sources.local_dirs());
    let uv_bin = uv.sealed(cfg);
    let policy = Arc::new(policy::extend(
        session_policy,
        &Grants {
            write: write.clone(),
            read,
            execute: vec![uv_bin.clone(), cfg.python.clone()],
            network: cfg.sources.needs_network(),
            confine_writes: true,
        },
        cfg.sandbox.namespaces_usable(),
    ));
    let python = dir.join("bin").join("python");
    let mut venv = cfg.sandbox.command(policy.clone(), &uv_bin);
    venv.args(["venv", "--quiet", "--python"]);
    match &req.python_version {
        Some(v) => venv.arg(v),
        None => venv.arg(&cfg.python),
    };
    venv.arg(dir);
    uv.apply_env(&mut venv, cfg, &policy, &cache);
    let mut steps = vec![venv];
    if !req.dependencies.is_empty() || pep723 {
        let mut install = cfg.sandbox.command(policy.clone(), &uv_bin);
        install
            .proxy_trusts_target(true)
            .args(["pip", "install", "--quiet", "--python"])
            .arg(&python)
            .args(cfg.sources.args());
        if policy.wheels_only {
            install.arg("--no-build");
        }
        if pep723 {
            install.arg("-r").arg(script);
        }
        install.args(&req.dependencies);
        uv.apply_env(&mut install, cfg, &policy, &cache);
        steps.push(install);
    }
    let mut benchmark = Benchmark::default();
    let mut prefixes = None;
    for cmd in steps {
        let watch = DiskWatch::new(lease, write.clone(), &policy);
        let outcome =
            process::run(cmd, sink.clone(), None, cancel, req.timeout, Some(watch)).await?;
        add(&mut benchmark, &Benchmark::from_report(&outcome.report));
        if outcome.success() {
            // The venv as uv made it: the install's build hooks may write the venv, and
            // a `home` they add would grant the script that host directory.
            prefixes.get_or_insert_with(|| base_prefixes(dir));
            continue;
        }
        let failure = failure_of(&outcome);
        let words = outcome
            .limit_words(&policy)
            .unwrap_or_else(|| failure_words(failure, req, &outcome.stderr_tail));
        return Ok(Err(ScriptReport {
            ok: false,
            exit_code: outcome.exit_code(),
            signal: outcome.signal(),
            failure: Some(failure),
            message: Some(with_denials(words, &outcome.denied)),
            benchmark,
            limit: outcome.limit().map(str::to_string),
            denied: outcome.denied,
            python: None,
            resolved: Vec::new(),
            reused_environment: false,
        }));
    }
    Ok(Ok((benchmark, prefixes.unwrap_or_default())))
}

/// Why an environment step failed.
fn failure_of(outcome: &RunOutcome) -> ScriptFailure {
    if outcome.cancelled {
        ScriptFailure::Cancelled
    } else if outcome.timed_out {
        ScriptFailure::TimedOut
    } else if outcome.disk.is_some() {
        ScriptFailure::DiskLimit
    } else {
        classify_uv_failure(&outcome.stderr_tail).unwrap_or(ScriptFailure::Environment)
    }
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
    let path = dir.join(format!("script-{}-{n}.py", cfg.sandbox.instance_id()));
    std::fs::write(&path, code)
        .map_err(|e| EnvError::io(format!("writing {}", path.display()), e))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_is_found_in_a_bounded_read_of_a_regular_file_only() {
        let d = tempfile::tempdir().unwrap();
        let p = |n: &str| d.path().join(n);
        std::fs::write(p("a.py"), "x = 1\r\n# /// script\r\n# ///\n").unwrap();
        std::fs::write(p("b.py"), "# // script\n").unwrap();
        assert!(has_script_block(&p("a.py")));
        assert!(!has_script_block(&p("b.py")));
        // Past the bound (a sparse file costs no disk): not read, not found.
        let big = std::fs::File::create(p("big.py")).unwrap();
        big.set_len(SCRIPT_BLOCK_SCAN + 10).unwrap();
        drop(big);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(p("big.py"))
            .unwrap();
        std::io::Write::write_all(&mut f, b"\n# /// script\n").unwrap();
        assert!(!has_script_block(&p("big.py")));
        // A link or a FIFO swapped in: not followed, never blocks.
        std::os::unix::fs::symlink(p("a.py"), p("link.py")).unwrap();
        assert!(!has_script_block(&p("link.py")));
        nix::unistd::mkfifo(&p("fifo.py"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(!has_script_block(&p("fifo.py")));
    }

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
