//! Python glue: cells run as jobs, the sink that spools their output, the control that
//! maps cancel/input onto the session, and the session / variable / history tools.

use std::fmt::Write as _;
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::{Value, json};

use super::{Backend, R, listing};
use crate::jobs::store::WaitFor;
use crate::jobs::{JobControl, JobHandle, JobKind, JobOutcome, JobStatus, Stream};
use crate::repl::{
    CellOutcome, CellSink, CellStatus, OutStream, Parent, ReplError, Session, SnapshotState,
    cell_name, parse_cell,
};
use crate::server::progress::CallCtx;
use crate::server::report::{DisplayReport, Image, JobReport, PyErrorReport, failure};
use crate::server::tools::ToolError;
use crate::server::tools::python::VarAction;

/// Adapts a job to the REPL's output sink: output is spooled, input requests flip status.
pub struct JobSink(pub JobHandle);

impl CellSink for JobSink {
    fn output(&self, stream: OutStream, data: &[u8]) {
        let s = match stream {
            OutStream::Stdout => Stream::Stdout,
            OutStream::Stderr => Stream::Stderr,
        };
        self.0.append(s, data);
    }
    fn awaiting_input(&self, prompt: &str) {
        self.0.awaiting_input(prompt);
    }
    fn input_received(&self) {
        self.0.resumed();
    }
}

/// Routes job cancel/input to the session (weakly: a closed session needs no control).
pub struct PyControl(pub Weak<Session>);

impl JobControl for PyControl {
    fn cancel(&self) {
        if let Some(s) = self.0.upgrade() {
            s.interrupt();
        }
    }
    fn send_input(&self, text: &str, eof: bool) -> Result<(), String> {
        let s = self.0.upgrade().ok_or("the session was closed")?;
        s.send_input(text, eof).map_err(|e| e.to_string())
    }
}

/// How a cell's outcome becomes a job outcome.
pub fn job_outcome(r: Result<CellOutcome, ReplError>, cancel_requested: bool) -> JobOutcome {
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
            o.error
                .as_ref()
                .map(|e| format!("{}: {}", e.ename, e.evalue)),
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
                "{}; the session's state is lost, the next call starts a fresh worker",
                o.worker_exit.as_deref().unwrap_or("the Python worker died")
            )),
        ),
    };
    JobOutcome {
        status,
        exit_code: None,
        signal: None,
        message,
        result: Some(super::cell_result(&o)),
    }
}

/// Copy a stored cell result into the report; images go to `images`.
pub fn fill_python_result(report: &mut JobReport, result: &Value, images: &mut Vec<Image>) {
    report.value = result
        .get("value")
        .and_then(Value::as_str)
        .map(str::to_string);
    if let Some(e) = result.get("error").filter(|e| !e.is_null()) {
        let f = |k: &str| {
            e.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        report.error = Some(PyErrorReport {
            ename: f("ename"),
            evalue: f("evalue"),
            traceback: f("traceback"),
        });
    }
    if result.get("state_lost").and_then(Value::as_bool) == Some(true) {
        report.state_lost = Some(true);
    }
    if let Some(cell) = result.get("cell").and_then(Value::as_u64) {
        report.cell = Some(cell_name(cell));
        report.parent = Some(result.get("parent").and_then(Value::as_u64).map(cell_name));
    }
    report.replayed = result
        .get("replayed")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_u64)
        .map(cell_name)
        .collect();
    for item in result
        .get("display")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(mime), Some(data)) = (
            item.get("mime").and_then(Value::as_str),
            item.get("data").and_then(Value::as_str),
        ) else {
            continue;
        };
        if mime.starts_with("image/") && mime != "image/svg+xml" {
            images.push(Image {
                mime: mime.to_string(),
                data: data.to_string(),
            });
        } else {
            report.display.push(DisplayReport {
                mime: mime.to_string(),
                data: data.to_string(),
            });
        }
    }
}

/// The code of a cell, cut to a few lines for the history listing.
fn excerpt(code: &str) -> String {
    const LINES: usize = 6;
    let lines: Vec<&str> = code.lines().collect();
    if lines.len() <= LINES {
        return code.to_string();
    }
    format!(
        "{}\n… {} more line(s)",
        lines[..LINES].join("\n"),
        lines.len() - LINES
    )
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

impl Backend {
    async fn start_cell(
        &self,
        session_name: &str,
        label: String,
        wait: Duration,
        call: &CallCtx,
        run: impl FnOnce(Arc<Session>, Arc<dyn CellSink>) -> futures_cell::CellFuture + Send + 'static,
    ) -> R {
        let session = self.session(session_name).await?;
        // Our own record of the session's running cell (in memory; no /proc reads on the
        // hot path). A race with another caller is still caught by the session itself.
        let busy_with = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(session_name)
            .cloned()
            .filter(|j| self.store.summary(j).is_ok_and(|s| !s.status.is_finished()));
        if let Some(j) = busy_with {
            return Ok(failure(format!(
                "session {session_name:?} is busy with another cell: follow job {j} with job_wait, \
                 stop it with job_cancel, or use another session name to run in parallel"
            )));
        }
        let handle = self
            .store
            .create(JobKind::Python, Some(session_name), &label)?;
        handle.set_control(Arc::new(PyControl(Arc::downgrade(&session))));
        let id = handle.id().to_string();
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(session_name.to_string(), id.clone());
        let sink: Arc<dyn CellSink> = Arc::new(JobSink(handle.clone()));
        let fut = run(session, sink);
        tokio::spawn(async move {
            let r = fut.await;
            // Wake the waiting call first (it answers from memory), then write the files.
            if handle.finish_unpersisted(job_outcome(r, handle.cancel_requested())) {
                tokio::task::yield_now().await;
                handle.persist();
            }
        });
        self.follow(&id, wait, WaitFor::Settled, call, true).await
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn python_exec(
        &self,
        session: &str,
        code: String,
        parent: Option<String>,
        replay: bool,
        wait: Duration,
        call: &CallCtx,
    ) -> R {
        let parent = match parent {
            None => None,
            Some(text) => {
                let Some(cell) = parse_cell(&text) else {
                    return Ok(failure(format!(
                        "parent {text:?} is not a cell id: use the `cell` of an earlier answer, e.g. \"c3\""
                    )));
                };
                let p = Parent { cell, text, replay };
                // A bad parent is refused before a job exists: nothing changes.
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
                    return Ok(failure(msg));
                }
                Some(p)
            }
        };
        let label = first_line(&code);
        self.start_cell(session, label, wait, call, move |s, sink| {
            Box::pin(async move { s.execute_on(&code, parent, sink).await })
        })
        .await
    }

    pub async fn python_run_file(
        &self,
        session: &str,
        path: &str,
        args: Vec<String>,
        wait: Duration,
        call: &CallCtx,
    ) -> R {
        let full = self.resolve_path(path);
        if !full.is_file() {
            return Err(ToolError(format!(
                "no such file: {} (paths are relative to the workspace {})",
                full.display(),
                self.workspace.display()
            )));
        }
        let label = format!("run_file {path} {}", args.join(" "))
            .trim_end()
            .to_string();
        let path = full.to_string_lossy().into_owned();
        self.start_cell(session, label, wait, call, move |s, sink| {
            Box::pin(async move { s.run_file(&path, args, sink).await })
        })
        .await
    }

    pub async fn python_interrupt(&self, session: &str) -> R {
        let s = self.sessions.get(session)?;
        let text = if s.interrupt() {
            format!("KeyboardInterrupt sent to session {session:?}; the running job reports it")
        } else {
            format!("session {session:?} was idle; nothing to interrupt")
        };
        Ok(listing(
            text,
            &json!({ "session": session, "interrupted": true }),
        ))
    }

    pub async fn python_vars(
        &self,
        session: &str,
        action: VarAction,
        name: Option<&str>,
        value: Option<Value>,
    ) -> R {
        let s = self.session(session).await?;
        let name = name.unwrap_or_default();
        match action {
            VarAction::List => {
                let vars = s.variables().await?;
                let mut text = format!("{} variable(s) in session {session:?}\n", vars.len());
                for v in &vars {
                    let size = v.size.map(|b| format!(" ({b} B)")).unwrap_or_default();
                    let _ = writeln!(text, "{}: {}{size} = {}", v.name, v.type_name, v.repr);
                }
                Ok(listing(
                    text,
                    &json!({ "session": session, "variables": vars }),
                ))
            }
            VarAction::Get => {
                let v = s.get_variable(name).await?;
                let more = if v.truncated {
                    format!("\n… cut; the full repr has {} characters", v.chars)
                } else {
                    String::new()
                };
                Ok(listing(
                    format!("{}: {} = {}{more}", v.name, v.type_name, v.repr),
                    &v,
                ))
            }
            VarAction::Set => {
                s.set_variable(name, value.unwrap_or(Value::Null)).await?;
                Ok(listing(
                    format!("set {name} in session {session:?}"),
                    &json!({ "session": session, "set": name }),
                ))
            }
            VarAction::Delete => {
                s.delete_variable(name).await?;
                Ok(listing(
                    format!("deleted {name} from session {session:?}"),
                    &json!({ "session": session, "deleted": name }),
                ))
            }
            VarAction::Clear => {
                s.clear_variables().await?;
                Ok(listing(
                    format!("cleared the variables of session {session:?}"),
                    &json!({ "session": session, "cleared": true }),
                ))
            }
        }
    }

    pub async fn python_history(&self, session: &str, limit: Option<usize>) -> R {
        let s = self.sessions.get(session)?;
        s.settle_snapshots().await;
        let mut cells = s.history();
        if let Some(n) = limit {
            let skip = cells.len().saturating_sub(n);
            cells.drain(..skip);
        }
        let head = cells.iter().find(|c| c.head).map(|c| cell_name(c.cell));
        let mut text = format!(
            "{} cell(s) in session {session:?}; head: {}\n",
            cells.len(),
            head.as_deref().unwrap_or("none (empty state)")
        );
        for c in &cells {
            let parent = c.parent.map(cell_name).unwrap_or_else(|| "-".into());
            let state = match c.snapshot {
                SnapshotState::Held => "snapshot".to_string(),
                SnapshotState::Replay => format!(
                    "replay{}",
                    c.note
                        .as_deref()
                        .map(|n| format!(" ({n})"))
                        .unwrap_or_default()
                ),
                SnapshotState::None => "no state".to_string(),
            };
            let _ = writeln!(
                text,
                "[{}{}] on {parent} · {:?} · {:.1} ms · {state}\n{}",
                cell_name(c.cell),
                if c.head { ", head" } else { "" },
                c.status,
                c.elapsed_ms,
                excerpt(&c.code)
            );
        }
        Ok(listing(
            text,
            &json!({ "session": session, "head": head, "cells": cells }),
        ))
    }

    pub async fn session_list(&self) -> R {
        let sessions = self.sessions.list();
        let mut text = format!("{} session(s)\n", sessions.len());
        for s in &sessions {
            let mem = s
                .memory_bytes
                .map(|b| format!("{:.1} MB", b as f64 / 1e6))
                .unwrap_or_else(|| "-".into());
            let _ = writeln!(
                text,
                "{}: {:?} · policy {} · pid {} · {mem} · idle {} s · {} cells",
                s.name,
                s.state,
                s.policy,
                s.worker_pid
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "-".into()),
                s.idle_seconds,
                s.cells
            );
        }
        Ok(listing(text, &json!({ "sessions": sessions })))
    }

    pub async fn session_restart(&self, session: &str) -> R {
        let s = self.session(session).await?;
        s.restart().await?;
        Ok(listing(
            format!("session {session:?} restarted: fresh worker, no variables"),
            &json!({ "session": session, "restarted": true }),
        ))
    }

    pub async fn session_close(&self, session: &str) -> R {
        self.sessions.close(session)?;
        Ok(listing(
            format!("session {session:?} closed"),
            &json!({ "session": session, "closed": true }),
        ))
    }
}

/// The boxed future a cell runner returns.
mod futures_cell {
    use std::future::Future;
    use std::pin::Pin;

    use crate::repl::{CellOutcome, ReplError};

    pub type CellFuture = Pin<Box<dyn Future<Output = Result<CellOutcome, ReplError>> + Send>>;
}
