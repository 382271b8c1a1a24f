//! Where a server is in its life, as a cell behind an orchestrator sees it: starting
//! (what earlier servers left not yet swept, the job table not yet read, the default
//! worker not yet up), ready, or draining (a SIGTERM: new jobs refused in words, running
//! ones given time to end). [`App::readiness`] answers `/readyz`; [`Lifecycle`] is the
//! drain flag, shared by every app of one server (a tokens file's principals too).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{App, AppError};
use crate::jobs::{JobFilter, JobStatus};

/// The drain flag of one server, shared by all its apps.
#[derive(Debug, Default)]
pub struct Lifecycle {
    draining: AtomicBool,
}

impl Lifecycle {
    /// From now on new jobs are refused and the server is not ready.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

/// How the default session's start-up prewarm went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) enum Warmth {
    /// Not started, or still starting.
    #[default]
    Pending,
    /// Its worker answered: a `python_exec` is served now.
    Warm,
    /// It could not start; the words say why.
    Failed(String),
}

/// What `/readyz` says while not ready (one line each).
pub(super) const STARTING_SWEEP: &str =
    "starting: sweeping what earlier servers of this state dir left behind";
pub(super) const STARTING_JOBS: &str = "starting: reading the job table";
pub(super) const STARTING_WORKER: &str = "starting: the default Python worker is not up yet";
pub(super) const DRAINING: &str = "draining: this sandbox is shutting down";
pub(super) const STARTING_POLICY: &str =
    "starting: checking that this host can enforce the policy (as `doctor` does)";

/// Why `policy` cannot be enforced on this host, as `doctor` tells it (`refuses_to_start`:
/// a required protection is not enforced and the policy does not run best effort), or
/// `None` when it can.
pub(super) fn unenforceable(
    kernel: &crate::sandbox::parent::probe::KernelSupport,
    policy: &crate::sandbox::ResolvedPolicy,
) -> Option<String> {
    if policy.kernel_support == crate::sandbox::KernelSupportMode::BestEffort {
        return None;
    }
    let missing: Vec<String> =
        crate::sandbox::parent::probe::enforcement::enforcement(kernel, policy)
            .into_iter()
            .filter(|i| i.required && !i.enforced)
            .map(|i| match i.why_not {
                Some(why) => format!("{} [{}]: {}", i.what, i.how, one_line(&why)),
                None => format!("{} [{}]", i.what, i.how),
            })
            .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "policy {} cannot be enforced here: {}; run `mcp-sandbox-repl doctor` for what each policy gets on this host, or choose a policy it enforces",
            policy.name,
            missing.join("; ")
        )
    })
}

impl App {
    /// The drain flag this app obeys.
    pub fn lifecycle(&self) -> std::sync::Arc<Lifecycle> {
        self.lifecycle.clone()
    }

    /// Obey `lifecycle` (another app's: one server drains all its apps at once).
    pub fn sharing_lifecycle(mut self, lifecycle: std::sync::Arc<Lifecycle>) -> App {
        self.lifecycle = lifecycle;
        self
    }

    /// `Ok` when a `python_exec` is answered now: what earlier servers left is swept, the
    /// job table is read, the default session's worker is up (when nothing the client
    /// says can move it, `settings_are_fixed`; otherwise it starts on the client's
    /// `initialize`) and the server is not draining. Otherwise one line saying why.
    pub fn readiness(&self) -> Result<(), String> {
        if self.lifecycle.is_draining() {
            return Err(DRAINING.into());
        }
        if !*self.settled.borrow() {
            return Err(STARTING_SWEEP.into());
        }
        match &*lock(&self.enforceable) {
            None => return Err(STARTING_POLICY.into()),
            Some(Err(why)) => return Err(why.clone()),
            Some(Ok(_)) => {}
        }
        if !self.store.is_loaded() {
            return Err(STARTING_JOBS.into());
        }
        if !self.settings_are_fixed() {
            return Ok(());
        }
        match &*lock(&self.warmth) {
            Warmth::Warm => Ok(()),
            Warmth::Pending => Err(STARTING_WORKER.into()),
            Warmth::Failed(why) => Err(format!(
                "the default Python worker could not start: {}",
                one_line(why)
            )),
        }
    }

    /// What a ready `/readyz` adds to "ready": where the policy limits memory or processes
    /// but jobs get no cgroup each, the words saying so (`doctor`'s per-job line: why,
    /// what holds each job instead, what holds them together).
    pub fn readiness_note(&self) -> Option<String> {
        match &*lock(&self.enforceable) {
            Some(Ok(note)) => note.clone(),
            _ => None,
        }
    }

    /// Check, once, that this host enforces the server's policy (its probes on a blocking
    /// thread, off the start-up path): until then, and if it does not, `/readyz` says so.
    /// The HTTP transport calls it at start; without it readiness waits for it.
    /// Jobs are refused by the launcher all the same; this tells an orchestrator before it
    /// sends work to a cell that would only answer refusals.
    pub async fn check_enforcement(&self) {
        // Resolved as `doctor` resolves it: what is enforced does not hang on the paths.
        let settings = self.settings();
        let ph = crate::sandbox::Placeholders {
            workspace: settings.workspace.root().to_path_buf(),
            tmp: std::env::temp_dir(),
            python: Vec::new(),
            venv: None,
            uv_cache: None,
        };
        let verdict = match settings.policy.resolve(&ph) {
            Ok(policy) => {
                let probed = tokio::task::spawn_blocking(move || {
                    let kernel = crate::sandbox::parent::probe::KernelSupport::probe();
                    let limited =
                        policy.limits.memory_bytes.is_some() || policy.limits.processes.is_some();
                    let note = (limited && !kernel.cgroup.per_job_enforced())
                        .then(|| kernel.cgroup.per_job.clone());
                    (unenforceable(&kernel, &policy), note)
                })
                .await;
                match probed {
                    Ok((None, note)) => Ok(note),
                    Ok((Some(why), _)) => Err(why),
                    Err(e) => Err(format!("the policy check did not finish: {e}")),
                }
            }
            Err(e) => Err(format!(
                "policy {} cannot be resolved: {}",
                settings.policy.name,
                one_line(&e.to_string())
            )),
        };
        if let Err(why) = &verdict {
            tracing::warn!("not ready: {why}");
        }
        *lock(&self.enforceable) = Some(verdict);
    }

    /// Read the job table on a thread of its own now (the prewarm does too), so that
    /// readiness does not wait for a first call when nothing is prewarmed at start.
    pub fn load_jobs_in_background(&self) {
        self.store.load_in_background();
    }

    pub(super) fn set_warmth(&self, w: Warmth) {
        *lock(&self.warmth) = w;
    }

    /// A new job may start: refused in words while draining.
    pub(super) fn admit_job(&self) -> Result<(), AppError> {
        match self.lifecycle.is_draining() {
            true => Err(AppError::Draining),
            false => Ok(()),
        }
    }

    /// Jobs not finished yet (running or waiting for input). A store whose table was
    /// never read ran no job in this server.
    pub fn unfinished_jobs(&self) -> usize {
        if !self.store.is_loaded() {
            return 0;
        }
        self.store
            .list(&JobFilter {
                status: Some(vec![JobStatus::Running, JobStatus::AwaitingInput]),
                ..JobFilter::default()
            })
            .len()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The first line of `text`, at most 300 bytes (a reason must stay one short line).
fn one_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    match line.char_indices().nth(300) {
        Some((i, _)) => format!("{} …", &line[..i]),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_one_short_line() {
        assert_eq!(one_line("a\nb"), "a");
        let long = "x".repeat(1000);
        assert!(one_line(&long).len() < 310);
        assert_eq!(one_line(""), "");
    }

    #[test]
    fn drain_is_shared_and_one_way() {
        let l = std::sync::Arc::new(Lifecycle::default());
        let other = l.clone();
        assert!(!l.is_draining());
        other.begin_drain();
        assert!(l.is_draining());
    }
}
