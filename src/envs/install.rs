//! Installing packages into a venv: `uv pip install --python <venv python> ...` run
//! through the launcher (network on, writes only to the venv and the session's uv
//! cache, within their disk bound), its stderr parsed into progress steps, a failure
//! reported in uv's own words.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use super::policy::{self, Grants};
use super::process::DiskWatch;
use super::{Canceller, EnvConfig, EnvError, EnvSink, Lease, Progress, Uv, Venv, process};
use crate::sandbox::ResolvedPolicy;

/// uv's words, then what the broker refused (uv only sees "403 Forbidden").
pub(crate) fn with_denials(explanation: String, denied: &[String]) -> String {
    if denied.is_empty() {
        return explanation;
    }
    format!("{explanation}\n{}", denied.join("\n"))
}

/// Longest explanation kept from uv's stderr.
const EXPLANATION_CHARS: usize = 2000;

/// What to install.
#[derive(Debug, Clone, Default)]
pub struct InstallRequest {
    /// PEP 508 requirement strings (`"requests>=2"`, `"pkg[extra]"`), or local paths.
    pub packages: Vec<String>,
    /// Pass `--upgrade`.
    pub upgrade: bool,
}

/// How an install ended; the job's `result` (and its message when it failed).
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct InstallReport {
    pub ok: bool,
    /// On failure: uv's explanation, trimmed (or why it was stopped).
    pub message: Option<String>,
    pub cancelled: bool,
    pub exit_code: Option<i32>,
    /// `name==version` of each package installed.
    pub installed: Vec<String>,
    /// `name==version` of each package removed (replaced by another version).
    pub uninstalled: Vec<String>,
    /// uv's summary lines ("Resolved 3 packages in 12ms", ...).
    pub summary: Vec<String>,
    pub elapsed_ms: u64,
    /// The venv's site-packages (what the session must have on `sys.path`).
    pub site_packages: String,
    /// Connections the installer's network broker refused, in words.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub denied: Vec<String>,
    /// The limit that stopped the install: `"disk"` (the session's stores at their
    /// bound), `"memory"`, `"cpu"`, `"wall_time"`, `"file_size"`, `"processes"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
}

/// Check a request before anything runs.
pub fn validate(req: &InstallRequest) -> Result<(), EnvError> {
    if req.packages.is_empty() {
        return Err(EnvError::BadRequest(
            "no packages given; name at least one".into(),
        ));
    }
    for p in &req.packages {
        if p.trim().is_empty() {
            return Err(EnvError::BadRequest(
                "an empty package name was given".into(),
            ));
        }
        if p.starts_with('-') {
            return Err(EnvError::BadRequest(format!(
                "{p:?} looks like an option; only requirement strings or paths are accepted"
            )));
        }
        if p.chars().any(char::is_control) {
            return Err(EnvError::BadRequest(format!(
                "{p:?} contains control characters"
            )));
        }
    }
    Ok(())
}

/// Install `req` into `venv`, with the uv cache of `lease`'s owner (whose stores are
/// measured while uv runs and its processes killed at their bound). Output goes to `sink`
/// as it comes (so the caller can spool it into a job), progress steps to
/// `sink.progress`. Errors are only for failures to run uv at all; a failed resolution is
/// `Ok` with `ok: false`.
#[expect(
    clippy::too_many_arguments,
    reason = "one install's inputs, each named at its one call site"
)]
pub async fn install(
    cfg: &EnvConfig,
    uv: &Uv,
    venv: &Venv,
    req: &InstallRequest,
    session_policy: &ResolvedPolicy,
    lease: &Lease,
    sink: Arc<dyn EnvSink>,
    cancel: &Canceller,
) -> Result<InstallReport, EnvError> {
    validate(req)?;
    let cache = lease.cache_dir()?;
    lease.set_venv(venv.root());
    let read = cfg.sources.local_dirs();
    let uv_bin = uv.sealed(cfg);
    let stores = vec![venv.root().to_path_buf(), cache.clone()];
    let grants = Grants {
        write: stores.clone(),
        read,
        execute: vec![uv_bin.clone(), cfg.python.clone()],
        network: cfg.sources.needs_network(),
        confine_writes: true,
    };
    let policy = Arc::new(policy::extend(
        session_policy,
        &grants,
        cfg.sandbox.namespaces_usable(),
    ));

    let mut cmd = cfg.sandbox.command(policy.clone(), &uv_bin);
    // A session's installs share one view (its venv, its cache, a tmpfs `{tmp}` by name
    // only: app::envs): the sandbox may make it ahead of the next install. A view made
    // ahead is used by one job at most, and only while every listed path is still the
    // file it was made from.
    cmd.view_made_ahead(true);
    // uv itself (not the build hooks it runs) may borrow the index credentials.
    cmd.proxy_trusts_target(true);
    cmd.args(["pip", "install", "--python"]).arg(venv.python());
    if req.upgrade {
        cmd.arg("--upgrade");
    }
    cmd.args(cfg.sources.args());
    if policy.wheels_only {
        cmd.arg("--no-build");
    }
    cmd.args(&req.packages);
    uv.apply_env(&mut cmd, cfg, &policy, &cache);

    sink.progress(&Progress {
        progress: 0.0,
        total: Some(STEPS),
        message: format!("installing {}", req.packages.join(" ")),
    });
    let parser = Arc::new(Mutex::new(ProgressParser::default()));
    let hook_parser = parser.clone();
    let hook_sink = sink.clone();
    let mut in_place = InPlace {
        sink: sink.clone(),
        venv: venv.clone(),
        said: false,
    };
    let hook: process::LineHook = Box::new(move |line| {
        let step = hook_parser.lock().ok().and_then(|mut p| p.line(line));
        if let Some(step) = step {
            hook_sink.progress(&step);
            in_place.note(&step);
        }
    });
    let watch = DiskWatch::new(lease, stores, &policy);
    let outcome = process::run(cmd, sink, Some(hook), cancel, None, Some(watch)).await?;
    let parsed = parser.lock().map(|p| p.clone()).unwrap_or_default();
    let message = if outcome.cancelled {
        Some("cancelled; the environment may hold some of the packages".into())
    } else if let Some(words) = outcome.limit_words(&policy) {
        Some(with_denials(
            format!("{words}; the environment may hold some of the packages"),
            &outcome.denied,
        ))
    } else if !outcome.success() {
        Some(with_denials(
            uv_explanation(&outcome.stderr_tail),
            &outcome.denied,
        ))
    } else {
        None
    };
    Ok(InstallReport {
        ok: outcome.success(),
        message,
        cancelled: outcome.cancelled,
        exit_code: outcome.exit_code(),
        installed: parsed.installed,
        uninstalled: parsed.uninstalled,
        summary: parsed.summary,
        elapsed_ms: duration_ms(outcome.report.wall),
        site_packages: venv.site_packages().to_string_lossy().into_owned(),
        limit: outcome.limit().map(str::to_string),
        denied: outcome.denied,
    })
}

/// Tells the sink the packages are in place ([`EnvSink::installed`]) once uv has said so
/// ("Installed N packages", "Audited N packages") and its stderr has ended: dropped with
/// the stderr hook when the pipe reaches its end, i.e. when every process holding it —
/// uv itself included — has exited or closed it. A build hook that prints those words
/// early cannot make the sink told while uv still runs.
struct InPlace {
    sink: Arc<dyn EnvSink>,
    venv: Venv,
    said: bool,
}

impl InPlace {
    fn note(&mut self, step: &Progress) {
        self.said |= step.progress >= STEPS;
    }
}

impl Drop for InPlace {
    fn drop(&mut self) {
        if self.said {
            self.sink.installed(&self.venv);
        }
    }
}

pub(crate) fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Progress milestones: resolved, prepared, installed.
const STEPS: f64 = 3.0;

/// Turns uv's stderr lines into strictly increasing progress steps (MCP requires
/// progress to increase with every notification) and collects what changed.
#[derive(Debug, Clone, Default)]
pub struct ProgressParser {
    last: f64,
    pub installed: Vec<String>,
    pub uninstalled: Vec<String>,
    pub summary: Vec<String>,
}

impl ProgressParser {
    /// Feed one stderr line; returns a progress step if the line is one.
    pub fn line(&mut self, line: &str) -> Option<Progress> {
        let text = line.trim();
        if let Some(pkg) = text.strip_prefix("+ ") {
            self.installed.push(pkg.trim().to_string());
            return None;
        }
        if let Some(pkg) = text.strip_prefix("- ") {
            self.uninstalled.push(pkg.trim().to_string());
            return None;
        }
        let first = text.split_whitespace().next()?;
        let milestone = match first {
            "Resolved" => Some(1.0),
            "Prepared" => Some(2.0),
            "Installed" | "Audited" => Some(3.0),
            "Uninstalled" | "Downloading" | "Downloaded" | "Building" | "Built" => None,
            _ => return None,
        };
        if milestone.is_some() || first == "Uninstalled" {
            self.summary.push(text.to_string());
        }
        let progress = match milestone {
            Some(m) if m > self.last => m,
            // Between milestones (or a repeated one): halfway to the next whole step.
            _ => self.last + (self.last.floor() + 1.0 - self.last) / 2.0,
        };
        self.last = progress;
        Some(Progress {
            progress,
            total: Some(STEPS),
            message: text.to_string(),
        })
    }
}

/// uv's explanation of a failure, trimmed: from its first `error:` line to the end,
/// without colour codes, at most [`EXPLANATION_CHARS`] characters.
pub fn uv_explanation(stderr: &str) -> String {
    let clean = strip_ansi(stderr);
    let lines: Vec<&str> = clean.lines().map(str::trim_end).collect();
    let start = lines
        .iter()
        .position(|l| {
            let t = l.trim_start();
            t.starts_with("error:") || t.starts_with('×')
        })
        .unwrap_or_else(|| lines.len().saturating_sub(20));
    let mut text = lines[start..]
        .iter()
        .filter(|l| !l.trim().is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join("\n");
    if text.is_empty() {
        text = "uv failed without saying why".into();
    }
    if text.chars().count() > EXPLANATION_CHARS {
        text = text.chars().take(EXPLANATION_CHARS).collect::<String>() + " …(trimmed)";
    }
    text
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_from_uv_lines_is_strictly_increasing() {
        let mut p = ProgressParser::default();
        let lines = [
            "Using Python 3.11.7 environment at: /v",
            "Resolved 2 packages in 3ms",
            "Downloading big (10.0MiB)",
            "Downloaded big",
            "Prepared 2 packages in 40ms",
            "Uninstalled 1 package in 1ms",
            "Installed 2 packages in 2ms",
            " - tinypkg==0.1",
            " + tinypkg==0.2",
            " + other==1.0",
        ];
        let steps: Vec<Progress> = lines.iter().filter_map(|l| p.line(l)).collect();
        let values: Vec<f64> = steps.iter().map(|s| s.progress).collect();
        assert_eq!(values, vec![1.0, 1.5, 1.75, 2.0, 2.5, 3.0]);
        assert_eq!(steps[0].message, "Resolved 2 packages in 3ms");
        assert_eq!(p.installed, vec!["tinypkg==0.2", "other==1.0"]);
        assert_eq!(p.uninstalled, vec!["tinypkg==0.1"]);
        assert_eq!(p.summary.len(), 4);
    }

    #[test]
    fn explanation_starts_at_the_error() {
        let stderr = "Using Python 3.11.7 environment at: v1\n\u{1b}[31merror\u{1b}[0m: No solution found when resolving dependencies\n  cause: Because nosuchpkg was not found in the provided package locations and you require nosuchpkg, we can conclude that your requirements are unsatisfiable.\n\n";
        let text = uv_explanation(stderr);
        assert!(text.starts_with("error: No solution found"), "{text}");
        assert!(text.contains("nosuchpkg was not found"), "{text}");
        assert!(!text.contains("Using Python"), "{text}");
    }

    #[test]
    fn explanation_is_trimmed() {
        let long = format!("error: {}", "x".repeat(5000));
        let text = uv_explanation(&long);
        assert!(text.chars().count() < 2100);
        assert!(text.ends_with("(trimmed)"));
    }

    /// The sink is told the packages are in place only when the stderr hook is dropped
    /// (the pipe's end: uv has exited), however early uv's words came, and only if they
    /// came: a build hook printing "Installed" cannot have the session activated while uv
    /// still writes the venv.
    #[test]
    fn the_sink_is_told_in_place_at_the_end_of_stderr_only_after_uvs_words() {
        #[derive(Default)]
        struct Told(Mutex<Vec<std::path::PathBuf>>);
        impl EnvSink for Told {
            fn output(&self, _: super::super::OutStream, _: &[u8]) {}
            fn installed(&self, venv: &Venv) {
                self.0.lock().unwrap().push(venv.root().to_path_buf());
            }
        }
        let d = crate::test_support::scratch_dir("in-place");
        std::fs::create_dir_all(d.path().join("bin")).unwrap();
        std::fs::write(d.path().join("bin/python"), b"").unwrap();
        std::fs::create_dir_all(d.path().join("lib/python3.11/site-packages")).unwrap();
        let venv = Venv::open(d.path()).unwrap();
        let told = Arc::new(Told::default());
        let mut parser = ProgressParser::default();
        let mut in_place = InPlace {
            sink: told.clone(),
            venv: venv.clone(),
            said: false,
        };
        for line in [
            "Resolved 1 package in 1ms",
            "Installed 1 package in 1ms",
            " + a==1",
        ] {
            if let Some(step) = parser.line(line) {
                in_place.note(&step);
            }
        }
        assert!(told.0.lock().unwrap().is_empty(), "told before the end");
        drop(in_place);
        assert_eq!(*told.0.lock().unwrap(), vec![venv.root().to_path_buf()]);

        // No such words (a failed resolution): never told.
        let silent = Arc::new(Told::default());
        let mut in_place = InPlace {
            sink: silent.clone(),
            venv,
            said: false,
        };
        let mut parser = ProgressParser::default();
        for line in ["Resolved 1 package in 1ms", "error: no solution"] {
            if let Some(step) = parser.line(line) {
                in_place.note(&step);
            }
        }
        drop(in_place);
        assert!(silent.0.lock().unwrap().is_empty());
    }

    #[test]
    fn options_are_not_accepted_as_packages() {
        let req = InstallRequest {
            packages: vec!["--index-url=http://evil".into()],
            upgrade: false,
        };
        assert!(matches!(validate(&req), Err(EnvError::BadRequest(_))));
        let empty = InstallRequest::default();
        assert!(matches!(validate(&empty), Err(EnvError::BadRequest(_))));
    }
}
