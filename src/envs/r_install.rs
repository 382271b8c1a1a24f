//! R packages for an R session: `install.packages()` run by `Rscript` as a job of its
//! own, under the session's policy plus write access to the session library and the
//! installer's network (the broker, allowed to reach the configured CRAN mirror only).
//! The session itself keeps its network setting; it sees the packages at once, since the
//! session library is on its `.libPaths()` (`R_LIBS_USER`).

use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::install::{duration_ms, with_denials};
use super::policy::{self, Grants};
use super::process::{self, LineHook};
use super::{Canceller, EnvError, EnvSink, Progress};
use crate::sandbox::policy::allow::UrlParts;
use crate::sandbox::{NetworkPolicy, ResolvedPolicy, Runtime};

/// The CRAN mirror when `MCP_SANDBOX_CRAN` names none.
pub(crate) const DEFAULT_CRAN: &str = "https://cloud.r-project.org";

/// The mirror R installs from: `MCP_SANDBOX_CRAN` of the server's environment, else
/// [`DEFAULT_CRAN`].
pub(crate) fn cran_mirror() -> String {
    std::env::var("MCP_SANDBOX_CRAN")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_CRAN.to_string())
}

/// Installs `commandArgs(TRUE)[-(1:2)]` into library `[1]` from repository `[2]`; each
/// package's outcome as a line `installed: NAME VERSION` or `not installed: NAME` on
/// stderr, and a non-zero exit if any is missing.
const SCRIPT: &str = "a <- commandArgs(TRUE); lib <- a[1]; repo <- a[2]; pkgs <- a[-(1:2)]; \
options(warn = 1); \
install.packages(pkgs, lib = lib, repos = repo, dependencies = NA, Ncpus = 1L); \
have <- rownames(installed.packages(lib.loc = lib)); ok <- TRUE; \
for (p in pkgs) if (p %in% have) message('installed: ', p, ' ', packageVersion(p, lib.loc = lib)) \
else { ok <- FALSE; message('not installed: ', p) }; \
if (!ok) quit('no', 1L)";

/// What an R install did.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct RInstallReport {
    pub ok: bool,
    pub message: Option<String>,
    pub cancelled: bool,
    pub exit_code: Option<i32>,
    /// `NAME VERSION` of each package now in the library.
    pub installed: Vec<String>,
    pub library: String,
    pub repository: String,
    pub elapsed_ms: u64,
    pub denied: Vec<String>,
}

/// The installer's network for R: the policy's `[installer.network]`; a proxy with an
/// empty allow list (the default) allows the CRAN mirror only.
pub(crate) fn r_network(base: &ResolvedPolicy, repo: &str, netns_usable: bool) -> NetworkPolicy {
    match policy::installer_network(base, netns_usable) {
        NetworkPolicy::Proxy { .. } if matches!(&base.installer_network, NetworkPolicy::Proxy { allow } if allow.is_empty()) => {
            NetworkPolicy::Proxy {
                allow: UrlParts::parse(repo)
                    .map(|u| vec![u.allow_entry()])
                    .unwrap_or_default(),
            }
        }
        other => other,
    }
}

/// Valid R package names only (letters, digits, dots; starting with a letter).
pub(crate) fn validate(packages: &[String]) -> Result<(), EnvError> {
    if packages.is_empty() {
        return Err(EnvError::BadRequest(
            "`packages` is empty: name at least one R package".into(),
        ));
    }
    for p in packages {
        let ok = p.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '.')
            && p.len() <= 100;
        if !ok {
            return Err(EnvError::BadRequest(format!(
                "{p:?} is not an R package name (letters, digits and dots, starting with a letter)"
            )));
        }
    }
    Ok(())
}

/// Install `packages` into `library` with `rscript` under `session_policy` plus the
/// library's write and the installer's network.
#[expect(
    clippy::too_many_arguments,
    reason = "one install's inputs, each named at its one call site"
)]
pub(crate) async fn install(
    sandbox: &Runtime,
    rscript: &Path,
    library: &Path,
    packages: &[String],
    repo: &str,
    session_policy: &ResolvedPolicy,
    sink: Arc<dyn EnvSink>,
    cancel: &Canceller,
) -> Result<RInstallReport, EnvError> {
    validate(packages)?;
    let grants = Grants {
        write: vec![library.to_path_buf()],
        confine_writes: true,
        ..Grants::default()
    };
    let netns = sandbox.namespaces_usable();
    let policy = policy::extend(session_policy, &grants, netns).with_network(r_network(
        session_policy,
        repo,
        netns,
    ));
    let policy = Arc::new(policy);
    let mut cmd = sandbox.command(policy.clone(), rscript);
    cmd.args(["--vanilla", "-e", SCRIPT])
        .arg(library)
        .arg(repo)
        .args(packages)
        .env("R_LIBS_USER", library);
    sink.progress(&Progress {
        progress: 0.0,
        total: Some(STEPS),
        message: format!("installing {} from {repo}", packages.join(" ")),
    });
    let steps = Arc::new(Mutex::new(Steps::default()));
    let hook_steps = steps.clone();
    let hook_sink = sink.clone();
    let hook: LineHook = Box::new(move |line| {
        let step = hook_steps.lock().ok().and_then(|mut s| s.line(line));
        if let Some(step) = step {
            hook_sink.progress(&step);
        }
    });
    let outcome = process::run(cmd, sink, Some(hook), cancel, None, None).await?;
    let installed = steps
        .lock()
        .map(|s| s.installed.clone())
        .unwrap_or_default();
    let message = if outcome.cancelled {
        Some("cancelled; the session library may hold some of the packages".into())
    } else if let Some(words) = outcome.limit_words(&policy) {
        Some(with_denials(words, &outcome.denied))
    } else if !outcome.success() {
        let tail: Vec<&str> = outcome.stderr_tail.lines().rev().take(6).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        Some(with_denials(
            format!("install.packages() failed: {}", tail.join(" / ")),
            &outcome.denied,
        ))
    } else {
        None
    };
    Ok(RInstallReport {
        ok: outcome.success(),
        message,
        cancelled: outcome.cancelled,
        exit_code: outcome.exit_code(),
        installed,
        library: library.to_string_lossy().into_owned(),
        repository: repo.to_string(),
        elapsed_ms: duration_ms(outcome.report.wall),
        denied: outcome.denied,
    })
}

/// Progress milestones: downloading, installing, installed.
const STEPS: f64 = 3.0;

/// Turns install.packages()'s stderr into strictly increasing progress steps.
#[derive(Debug, Default)]
struct Steps {
    last: f64,
    installed: Vec<String>,
}

impl Steps {
    fn line(&mut self, line: &str) -> Option<Progress> {
        let text = line.trim();
        let milestone = if text.starts_with("trying URL") {
            1.0
        } else if text.starts_with("* installing") || text.starts_with("downloaded ") {
            2.0
        } else if let Some(pkg) = text.strip_prefix("installed: ") {
            self.installed.push(pkg.to_string());
            3.0
        } else {
            return None;
        };
        let progress = if milestone > self.last {
            milestone
        } else {
            self.last + (self.last.floor() + 1.0 - self.last) / 2.0
        };
        self.last = progress;
        Some(Progress {
            progress,
            total: Some(STEPS),
            message: text.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_steps_increase_and_collect_packages() {
        let mut s = Steps::default();
        let a = s
            .line("trying URL 'http://x/src/contrib/tinypkg_0.1.tar.gz'")
            .unwrap();
        let b = s.line("downloaded 1234 bytes").unwrap();
        let c = s
            .line("* installing *source* package 'tinypkg' ...")
            .unwrap();
        let d = s.line("installed: tinypkg 0.1").unwrap();
        assert!(a.progress < b.progress && b.progress < c.progress && c.progress < d.progress);
        assert_eq!(s.installed, vec!["tinypkg 0.1"]);
        assert!(s.line("** R").is_none());
    }

    #[test]
    fn names_are_checked() {
        assert!(validate(&["ggplot2".into(), "data.table".into()]).is_ok());
        assert!(validate(&["../x".into()]).is_err());
        assert!(validate(&["a; system('x')".into()]).is_err());
        assert!(validate(&[]).is_err());
    }
}
