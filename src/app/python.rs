//! Python use cases: cells run as jobs, the sink that spools their output, the control
//! that maps cancel/input onto the session, and sessions / variables / history.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_json::Value;

use super::envs::CellInstaller;
use super::{App, AppError, Call, JobView};
use crate::envs::Canceller;
use crate::jobs::store::WaitFor;
use crate::jobs::{JobControl, JobHandle, JobKind, JobOutcome, JobStatus, Stream};
use crate::repl::{
    CellOutcome, CellSink, CellStatus, History, InstallAnswer, OutStream, Parent, ReplError,
    Session, SessionInfo, SessionState, VariableDetail, VariablePage, parse_cell,
};

/// Variables asked of the worker per `python_vars` list page (the answer shows those
/// that fit its budget; the cursor goes on from the first one left out).
const LIST_PAGE: usize = 1000;

/// What to do with a session's variables.
#[derive(Debug, Clone, PartialEq)]
pub enum VarsRequest {
    /// One page, from the first name `>=` the cursor.
    List(Option<String>),
    Get(String),
    Set(String, Value),
    Delete(String),
    Clear,
}

/// The answer to a [`VarsRequest`].
#[derive(Debug, Clone)]
pub enum VarsOutcome {
    List(VariablePage),
    Get(VariableDetail),
    Set(String),
    Deleted(String),
    Cleared,
}

/// Adapts a job to the REPL's output sink: output is spooled, input requests flip status,
/// an R cell's `install.packages()` runs the install for the cell. Dropped when the cell
/// has ended: an install still running then is cancelled.
pub(super) struct JobSink {
    handle: JobHandle,
    installer: Option<CellInstaller>,
    installs: Mutex<Vec<Canceller>>,
}

impl JobSink {
    pub(super) fn new(handle: JobHandle, installer: Option<CellInstaller>) -> Self {
        JobSink {
            handle,
            installer,
            installs: Mutex::default(),
        }
    }
}

impl CellSink for JobSink {
    fn output(&self, stream: OutStream, data: &[u8]) {
        let s = match stream {
            OutStream::Stdout => Stream::Stdout,
            OutStream::Stderr => Stream::Stderr,
        };
        self.handle.append(s, data);
    }
    fn awaiting_input(&self, prompt: &str) {
        self.handle.awaiting_input(prompt);
    }
    fn awaiting_secret_input(&self, prompt: &str) {
        self.handle.awaiting_secret_input(prompt);
    }
    fn input_received(&self) {
        self.handle.resumed();
    }
    fn install_packages(&self, packages: Vec<String>, answer: InstallAnswer) {
        match &self.installer {
            Some(installer) => {
                let cancel = installer.start(packages, answer);
                self.installs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(cancel);
            }
            None => answer.send(
                false,
                "packages are installed from cells of R sessions only: call the env_install tool"
                    .into(),
            ),
        }
    }
}

impl Drop for JobSink {
    fn drop(&mut self) {
        for cancel in self
            .installs
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            cancel.cancel();
        }
    }
}

/// Routes job cancel/input to the session (weakly: a closed session needs no control).
pub(super) struct PyControl(pub Weak<Session>);

/// How long a cancelled cell has to react to KeyboardInterrupt before its worker is
/// killed and restarted.
pub(super) const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(2);

impl JobControl for PyControl {
    fn cancel(&self) {
        self.cancel_within(None);
    }
    fn cancel_within(&self, grace: Option<Duration>) {
        if let Some(s) = self.0.upgrade() {
            s.cancel_cell(grace.unwrap_or(DEFAULT_CANCEL_GRACE));
        }
    }
    fn send_input(&self, text: &str, eof: bool) -> Result<(), String> {
        let s = self.0.upgrade().ok_or("the session was closed")?;
        s.send_input(text, eof).map_err(|e| e.to_string())
    }
}

/// How a cell's outcome becomes a job outcome.
pub(super) fn job_outcome(r: Result<CellOutcome, ReplError>, cancel_requested: bool) -> JobOutcome {
    let o = match r {
        Ok(o) => o,
        Err(e) => {
            return JobOutcome {
                status: JobStatus::Failed,
                message: Some(e.to_string()),
                ..Default::default()
            };
        }
    };
    let (status, message) = match o.status {
        CellStatus::Ok => (JobStatus::Completed, None),
        CellStatus::Error => (
            JobStatus::Failed,
            // One line for listings; the whole message ends the traceback.
            o.error.as_ref().map(|e| {
                let line = e.evalue.lines().next().unwrap_or_default();
                let short: String = line.chars().take(200).collect();
                let more = if short.len() < e.evalue.len() {
                    " …"
                } else {
                    ""
                };
                format!("{}: {short}{more}", e.ename)
            }),
        ),
        CellStatus::Interrupted if cancel_requested => (
            JobStatus::Cancelled,
            Some(
                "cancelled: KeyboardInterrupt raised in the cell; the session keeps its state"
                    .into(),
            ),
        ),
        CellStatus::Interrupted => (
            JobStatus::Failed,
            Some("interrupted: KeyboardInterrupt; the session keeps its state".into()),
        ),
        CellStatus::WorkerDied => (
            if cancel_requested {
                JobStatus::Cancelled
            } else {
                JobStatus::Failed
            },
            Some(format!(
                "{}; the session's state is lost, the next call runs in a fresh worker",
                o.worker_exit.as_deref().unwrap_or("the Python worker died")
            )),
        ),
    };
    JobOutcome {
        status,
        exit_code: o.exit_code,
        signal: o.signal.clone(),
        message,
        result: Some(cell_result(&o)),
    }
}

/// The structured result of a Python cell as stored in the job (`JobOutcome::result`).
pub(crate) fn cell_result(outcome: &CellOutcome) -> Value {
    serde_json::to_value(outcome).unwrap_or(Value::Null)
}

fn first_line(code: &str) -> String {
    let mut lines = code.lines().filter(|l| !l.trim().is_empty());
    let first = lines.next().unwrap_or("").trim().to_string();
    if lines.next().is_some() {
        format!("{first} …")
    } else {
        first
    }
}

impl App {
    async fn start_cell(
        &self,
        session_name: &str,
        label: String,
        wait: Duration,
        timeout: Option<Duration>,
        call: &Call,
        run: impl FnOnce(Arc<Session>, Arc<dyn CellSink>) -> futures_cell::CellFuture + Send + 'static,
    ) -> Result<JobView, AppError> {
        self.admit_job()?;
        let session = self.session(session_name).await?;
        // Our own record of the session's running cell (in memory; no /proc reads on the
        // hot path). A race with another caller is still caught by the session itself.
        let busy_with = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(session_name)
            .cloned()
            .filter(|j| self.store.summary(j).is_ok_and(|s| !s.status.is_finished()))
            // A killed cell's job may still be settling after the session is free again
            // (restart, cancel): the session's own state decides.
            .filter(|_| {
                matches!(
                    session.state(),
                    SessionState::Busy | SessionState::AwaitingInput
                )
            });
        if let Some(job) = busy_with {
            return Err(AppError::SessionBusy {
                session: session_name.to_string(),
                job,
            });
        }
        let handle = self
            .store
            .create(JobKind::Python, Some(session_name), &label)?;
        handle.set_control(Arc::new(PyControl(Arc::downgrade(&session))));
        let id = handle.id().to_string();
        self.arm_timeout(&id, timeout);
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(session_name.to_string(), id.clone());
        let installer = self.cell_installer(&session, &handle, call);
        let sink: Arc<dyn CellSink> = Arc::new(JobSink::new(handle.clone(), installer));
        // The caller hears "running" before the spawned cell reaches the session: a cancel
        // or interrupt in between must be kept for it, not find nothing running.
        let promise = session.expect_cell();
        let expected = session.clone();
        let fut = run(session, sink);
        tokio::spawn(async move {
            let r = fut.await;
            expected.expected_cell_ended(promise);
            // Wake the waiting call first (it answers from memory), then write the files.
            if handle.finish_unpersisted(job_outcome(r, handle.cancel_requested())) {
                tokio::task::yield_now().await;
                handle.persist();
            }
        });
        self.follow(&id, wait, WaitFor::Settled, call, true).await
    }

    /// Run `code` in `session`, on the head or, with `parent` (a cell id such as "c3"),
    /// on the state right after that cell (`replay`: rebuild it by re-running cells when
    /// no snapshot is left); `timeout` interrupts it (then restarts the worker if it
    /// ignores that) and fails the job in words.
    #[expect(
        clippy::too_many_arguments,
        reason = "one script run's inputs, each named at its one call site"
    )]
    pub async fn python_exec(
        &self,
        session: &str,
        code: String,
        parent: Option<String>,
        replay: bool,
        wait: Duration,
        timeout: Option<Duration>,
        call: &Call,
    ) -> Result<JobView, AppError> {
        let parent = match parent {
            None => None,
            Some(text) => Some(self.check_parent(session, text, replay).await?),
        };
        let label = first_line(&code);
        self.start_cell(session, label, wait, timeout, call, move |s, sink| {
            Box::pin(async move { s.execute_on(&code, parent, sink).await })
        })
        .await
    }

    /// Session `session` is to run `language` (`python_exec`'s `language`): recorded for
    /// its start, or checked against the open session's.
    pub fn choose_language(
        &self,
        session: &str,
        language: crate::repl::Language,
    ) -> Result<(), AppError> {
        Ok(self.sessions.choose_language(session, language)?)
    }

    /// A bad parent is refused before a job exists: nothing changes.
    async fn check_parent(
        &self,
        session: &str,
        text: String,
        replay: bool,
    ) -> Result<Parent, AppError> {
        let Some(cell) = parse_cell(&text) else {
            return Err(AppError::BadParent(format!(
                "parent {text:?} is not a cell id: use the `cell` of an earlier answer, e.g. \"c3\""
            )));
        };
        let p = Parent { cell, text, replay };
        let s = self.session(session).await?;
        if let Err(e) = s.check_parent(&p).await {
            let mut msg = e.to_string();
            let elsewhere = self.sessions.sessions_with_cell(cell, session);
            if !s.has_cell(cell) && !elsewhere.is_empty() {
                msg.push_str(&format!(
                    ". Session(s) {} have a {}: cells belong to their session, and a branch \
                     runs in the session of its parent (pass that session's name)",
                    elsewhere.join(", "),
                    p.text
                ));
            }
            return Err(AppError::BadParent(msg));
        }
        Ok(p)
    }

    pub async fn python_run_file(
        &self,
        session: &str,
        path: &str,
        args: Vec<String>,
        wait: Duration,
        call: &Call,
    ) -> Result<JobView, AppError> {
        let full = self.workspace()?.file(path, "path")?;
        // Quoted as a shell would, so the history shows the arguments exactly.
        let quoted = std::iter::once(path)
            .chain(args.iter().map(String::as_str))
            .map(|a| shlex::try_quote(a).map_or_else(|_| format!("{a:?}"), |q| q.into_owned()))
            .collect::<Vec<_>>()
            .join(" ");
        let label = format!("run_file {quoted}");
        let path = full.to_string_lossy().into_owned();
        self.start_cell(session, label, wait, None, call, move |s, sink| {
            Box::pin(async move { s.run_file(&path, args, sink).await })
        })
        .await
    }

    /// KeyboardInterrupt in the session's running cell, escalating to a worker restart
    /// after `grace`; then wait for the cell to end (like `job_cancel`) and return its
    /// job's final view, so the next call finds the session free. None when no cell ran.
    pub async fn python_interrupt(
        &self,
        session: &str,
        grace: Option<Duration>,
    ) -> Result<Option<JobView>, AppError> {
        let s = self.sessions.get(session)?;
        let grace = grace.unwrap_or(DEFAULT_CANCEL_GRACE);
        // The session's latest job, before the interrupt: the one it ends.
        let job = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(session)
            .cloned();
        if !s.cancel_cell(grace) {
            return Ok(None);
        }
        let Some(job) = job else { return Ok(None) };
        let settle = (grace + Duration::from_secs(3)).max(Duration::from_secs(5));
        let view = self
            .follow(&job, settle, WaitFor::Finished, &Call::detached(), false)
            .await?;
        Ok(Some(view))
    }

    /// A variable operation, and why the session's state is fresh if it is (an expiry or
    /// a crash the next cell will also be told of).
    pub async fn python_vars(
        &self,
        session: &str,
        request: VarsRequest,
    ) -> Result<(VarsOutcome, Option<String>), AppError> {
        let s = self.session(session).await?;
        let note = s.pending_loss();
        let outcome = match request {
            VarsRequest::List(cursor) => {
                VarsOutcome::List(s.variables_page(cursor.as_deref(), Some(LIST_PAGE)).await?)
            }
            VarsRequest::Get(name) => VarsOutcome::Get(s.get_variable(&name).await?),
            VarsRequest::Set(name, value) => {
                s.set_variable(&name, value).await?;
                VarsOutcome::Set(name)
            }
            VarsRequest::Delete(name) => {
                s.delete_variable(&name).await?;
                VarsOutcome::Deleted(name)
            }
            VarsRequest::Clear => {
                s.clear_variables().await?;
                VarsOutcome::Cleared
            }
        };
        Ok((outcome, note))
    }

    /// The session's cells up to `before` (a cell id, itself included: a page's cursor),
    /// the most recent `limit` of them if given, and what retention dropped.
    pub async fn python_history(
        &self,
        session: &str,
        limit: Option<usize>,
        before: Option<&str>,
    ) -> Result<(History, Option<String>), AppError> {
        let upto = match before {
            None => None,
            Some(text) => Some(parse_cell(text).ok_or_else(|| {
                AppError::BadParent(format!(
                    "cursor {text:?} is not a cell id: pass the `next_cursor` of an earlier python_history answer"
                ))
            })?),
        };
        let s = match self.sessions.get(session) {
            Ok(s) => s,
            // Kept by an earlier server: starting the session loads its history. Not one
            // the idle TTL has just closed: its graph is removed only after its name is
            // (the window in which this started an empty session and answered for it).
            Err(crate::repl::ReplError::NoSuchSession { .. })
                if self.sessions.has_kept_history(session) =>
            {
                self.session(session).await?
            }
            Err(e) => return Err(e.into()),
        };
        s.settle_snapshots().await;
        let note = s.pending_loss();
        let mut history = s.history();
        if let Some(upto) = upto {
            history.cells.retain(|c| c.cell <= upto);
        }
        if let Some(n) = limit {
            let skip = history.cells.len().saturating_sub(n);
            history.cells.drain(..skip);
        }
        Ok((history, note))
    }

    pub fn session_list(&self) -> Vec<SessionInfo> {
        self.sessions.list()
    }

    pub async fn session_restart(&self, session: &str) -> Result<(), AppError> {
        self.session(session).await?.restart().await?;
        Ok(())
    }

    pub fn session_close(&self, session: &str) -> Result<(), AppError> {
        Ok(self.sessions.close(session)?)
    }
}

/// The boxed future a cell runner returns.
mod futures_cell {
    use std::future::Future;
    use std::pin::Pin;

    use crate::repl::{CellOutcome, ReplError};

    pub(super) type CellFuture =
        Pin<Box<dyn Future<Output = Result<CellOutcome, ReplError>> + Send>>;
}
