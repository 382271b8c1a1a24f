//! MCP tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663), kept by rmcp's
//! [`TaskManager`]: when a client that declares the extension starts a job
//! (`python_exec`, `python_run_file`, `python_run_script`, `shell_run`, `env_install`)
//! and the job outlives the call's window, the answer is a task instead of a `running`
//! report. The task follows the job: `tasks/get` says `working`, `input_required` while
//! the code waits for input (asked as an elicitation, answered with `tasks/update`),
//! then `completed` with the very answer the tool gives for a job that ends in its window
//! (output from the job's start, within the answer budget), or `cancelled`.
//! `tasks/cancel` cancels the job as `job_cancel` does.
//!
//! Task ids are rmcp's; the job's id travels in the `CreateTaskResult`'s `_meta`
//! ([`JOB_ID_META`]) and in every status message, so the job tools (`job_output`,
//! `job_input`, `job_wait`) work on the same job. See docs/tasks.md.

use std::sync::Arc;
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::{
    CallToolResult, CreateTaskResult, DetailedTask, GetTaskResult, InputRequest, InputResponses,
    MetaObject, Task, TaskPayload,
};
use rmcp::task_manager::{TaskContext, TaskExit, TaskManager, TaskOptions};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::report::JobReport;
use crate::app::{App, AppError, Call};
use crate::jobs::JobStatus;

/// Tools whose answer may become a task: the ones that start a job.
pub(crate) const TASK_TOOLS: [&str; 5] = [
    "python_exec",
    "python_run_file",
    "python_run_script",
    "shell_run",
    "env_install",
];

/// The `_meta` key of a `CreateTaskResult` that names the job the task follows.
pub(crate) const JOB_ID_META: &str = "io.github.mcp-sandbox-repl/job_id";

/// How long a task is kept from its creation (and again after it ends). A job that runs
/// longer goes on; only its task is then reported failed (expired).
const TTL_MS: u64 = 24 * 3600 * 1000;
/// Suggested polling interval.
const POLL_MS: u64 = 1000;
/// How long one wait of the follower lasts before it looks again.
const FOLLOW_WINDOW: Duration = Duration::from_secs(30);
/// How often a pending input request checks whether the job was answered elsewhere.
const INPUT_RECHECK: Duration = Duration::from_secs(1);

/// The tasks of one app (the server's own, or a principal's).
#[derive(Clone, Default)]
pub(crate) struct JobTasks {
    manager: TaskManager,
}

/// Every app's tasks, kept apart from any connection: a task created in one request
/// resolves in any later one — another MCP session, or a 2026-07-28 request that is a
/// connection of its own (SEP-2663: `tasks/get` must resolve once `CreateTaskResult` is
/// out). Followers end with the server (`stop`), not with the request that made them.
pub(crate) struct TaskBook {
    by_app: std::sync::Mutex<std::collections::HashMap<usize, JobTasks>>,
    stop: CancellationToken,
}

impl TaskBook {
    pub(crate) fn new(stop: CancellationToken) -> Self {
        TaskBook {
            by_app: Default::default(),
            stop,
        }
    }

    /// The tasks of `app` (apps live as long as the server: their address is their key).
    pub(crate) fn of(&self, app: &Arc<App>) -> JobTasks {
        let key = Arc::as_ptr(app) as usize;
        let mut map = self.by_app.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(key).or_default().clone()
    }

    /// Cancelled when the server stops: followers' waits end then.
    pub(crate) fn stop(&self) -> CancellationToken {
        self.stop.clone()
    }
}

impl Drop for TaskBook {
    fn drop(&mut self) {
        self.stop.cancel();
        let map = self.by_app.lock().unwrap_or_else(|p| p.into_inner());
        for tasks in map.values() {
            tasks.shutdown();
        }
    }
}

impl JobTasks {
    /// If `answer` reports a job still running or waiting for input, a task that follows
    /// it to its end; `None` leaves the answer as it is.
    pub(crate) fn adopt(
        &self,
        app: Arc<App>,
        answer: &CallToolResult,
        closing: CancellationToken,
    ) -> Option<CreateTaskResult> {
        let (job_id, status) = unfinished_job(answer)?;
        let options = TaskOptions::new()
            .with_ttl_ms(TTL_MS)
            .with_poll_interval_ms(POLL_MS)
            .with_status_message(format!("job {job_id} {status}"));
        let follower = Follower {
            app,
            id: job_id.clone(),
            manager: self.manager.clone(),
            closing,
        };
        let app = follower.app.clone();
        let task = self
            .manager
            .spawn(options, move |ctx| Box::pin(follower.run(ctx)));
        // Kept with the job, so tasks/get resolves after a restart too.
        if let Err(e) = app.job_add_handle(&job_id, &task.task_id) {
            tracing::warn!(job = %job_id, task = %task.task_id, "the task will not outlive a restart: {e}");
        }
        let meta = MetaObject(
            [(JOB_ID_META.to_string(), json!(job_id))]
                .into_iter()
                .collect(),
        );
        Some(CreateTaskResult::new(task).with_meta(meta))
    }

    /// `tasks/get`: from the task's follower, or for a task of an earlier server on the
    /// same state dir (or one this server no longer follows), from its job.
    pub(crate) async fn get(&self, app: &App, task_id: &str) -> Result<GetTaskResult, ErrorData> {
        match self.manager.get_task(task_id) {
            Ok(task) => Ok(GetTaskResult::new(task)),
            Err(unknown) => match restored(app, task_id).await {
                Some(task) => Ok(GetTaskResult::new(task)),
                None => Err(unknown),
            },
        }
    }

    /// `tasks/update`: answers to the input requests of a task. A task no follower holds
    /// asks for no input: its answers are ignored (SEP-2663: unknown keys are).
    pub(crate) fn update(
        &self,
        app: &App,
        task_id: &str,
        responses: InputResponses,
    ) -> Result<(), ErrorData> {
        match self.manager.update_task(task_id, responses) {
            Err(_) if remembered(app, task_id).is_some() => Ok(()),
            other => other,
        }
    }

    /// `tasks/cancel`: the follower cancels the job and the task settles `cancelled`. A
    /// task no follower holds has its job cancelled directly if it still runs.
    pub(crate) async fn cancel(&self, app: &App, task_id: &str) -> Result<(), ErrorData> {
        match self.manager.cancel_task(task_id) {
            Err(unknown) => {
                let Some(job) = remembered(app, task_id) else {
                    return Err(unknown);
                };
                let running = app.job_summary(&job).is_ok_and(|s| !s.status.is_finished());
                if running && let Err(e) = app.job_cancel(&job, None).await {
                    tracing::debug!(job = %job, "cancel for tasks/cancel: {e}");
                }
                Ok(())
            }
            ok => ok,
        }
    }

    /// Stop every follower (the connection is going away); the jobs are the app's.
    pub(crate) fn shutdown(&self) {
        self.manager.shutdown();
    }
}

/// The job a task of this app's state dir follows, while the task lives (created less
/// than two TTLs ago, as rmcp keeps a task) and the job is kept.
fn remembered(app: &App, task_id: &str) -> Option<String> {
    remembered_record(app, task_id).map(|rec| rec.job)
}

fn remembered_record(app: &App, task_id: &str) -> Option<crate::jobs::handles::HandleRecord> {
    let rec = app.job_of_handle(task_id)?;
    let age = now_unix_ms().saturating_sub(rec.created_unix_ms);
    (age < 2 * TTL_MS).then_some(rec)
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A task no follower holds (made by an earlier server on the same state dir, whose
/// jobs were read back), told from its job: `completed` with the job's answer once it
/// ended (`lost` if the server stopped while it ran), `cancelled`, or `working` while it
/// runs.
async fn restored(app: &App, task_id: &str) -> Option<DetailedTask> {
    let rec = remembered_record(app, task_id)?;
    let id = rec.job;
    let summary = app.job_summary(&id).ok()?;
    let status = summary.status;
    let payload = match status {
        JobStatus::Cancelled => TaskPayload::Cancelled,
        s if s.is_finished() => {
            let whole = app.job_whole(&id).await.ok()?;
            let answer = JobReport::answer(whole, app);
            match serde_json::to_value(&answer) {
                Ok(Value::Object(result)) => TaskPayload::Completed { result },
                _ => return None,
            }
        }
        _ => TaskPayload::Working,
    };
    let created = chrono::DateTime::from_timestamp_millis(rec.created_unix_ms as i64)
        .unwrap_or_default()
        .to_rfc3339();
    let mut task = Task::new(
        task_id.to_string(),
        payload.status(),
        created,
        rmcp::task_manager::current_timestamp(),
    );
    task.ttl_ms = Some(TTL_MS);
    task.poll_interval_ms = Some(POLL_MS);
    task.status_message = Some(format!("job {id} {status}"));
    Some(DetailedTask::new(task, payload))
}

/// The job id and status of a job report whose job is still running or waiting for input.
fn unfinished_job(answer: &CallToolResult) -> Option<(String, &str)> {
    let report = answer.structured_content.as_ref()?;
    let status = report.get("status")?.as_str()?;
    if !matches!(status, "running" | "awaiting_input") {
        return None;
    }
    Some((report.get("job_id")?.as_str()?.to_string(), status))
}

/// Follows one job for its task.
struct Follower {
    app: Arc<App>,
    id: String,
    manager: TaskManager,
    closing: CancellationToken,
}

fn failed(e: AppError) -> TaskExit {
    TaskExit::Error(ErrorData::internal_error(e.to_string(), None))
}

impl Follower {
    async fn run(self, ctx: TaskContext) -> Result<CallToolResult, TaskExit> {
        let id = self.id.as_str();
        let mut asked = 0u32;
        let detached = Call::detached();
        loop {
            let view = tokio::select! {
                _ = ctx.cancelled() => return self.cancel_job(&ctx).await,
                _ = self.closing.cancelled() => return Err(self.closed()),
                v = self.app.job_wait(id, FOLLOW_WINDOW, true, &detached) => v.map_err(failed)?,
            };
            let status = view.snapshot.status;
            match status {
                JobStatus::Cancelled => {
                    ctx.set_status_message(format!("job {id} cancelled"));
                    return Err(TaskExit::Cancelled);
                }
                s if s.is_finished() => {
                    ctx.set_status_message(format!("job {id} {status}"));
                    let whole = self.app.job_whole(id).await.map_err(failed)?;
                    return Ok(JobReport::answer(whole, &self.app));
                }
                JobStatus::AwaitingInput => {
                    asked += 1;
                    let prompt = view.snapshot.prompt.unwrap_or_default();
                    let key = format!("input-{asked}");
                    self.ask(&ctx, &key, &prompt, view.snapshot.secret).await?;
                }
                _ => ctx.set_status_message(format!("job {id} running")),
            }
        }
    }

    /// The job waits for input: ask the client (`input_required`) until it answers with
    /// `tasks/update`, or the job gets its input another way (`job_input`), or ends.
    async fn ask(
        &self,
        ctx: &TaskContext,
        key: &str,
        prompt: &str,
        secret: bool,
    ) -> Result<(), TaskExit> {
        let id = self.id.as_str();
        ctx.set_status_message(format!(
            "job {id} awaiting input (prompt {prompt:?}): answer the input request with \
             tasks/update, or call job_input with job_id {id:?}"
        ));
        let answer = ctx.request_input(key.to_string(), input_request(id, prompt, secret)?);
        tokio::pin!(answer);
        loop {
            tokio::select! {
                reply = &mut answer => {
                    let Ok(reply) = reply else {
                        // tasks/cancel withdrew the request.
                        return self.cancel_job(ctx).await.map(|_| ());
                    };
                    let (text, eof) = input_of(&reply);
                    if let Err(e) = self.app.job_input(id, &text, eof, Duration::ZERO, &Call::detached()).await {
                        tracing::debug!(job = %id, "task input not delivered: {e}");
                    }
                    return Ok(());
                }
                _ = ctx.cancelled() => return self.cancel_job(ctx).await.map(|_| ()),
                _ = self.closing.cancelled() => return Err(self.closed()),
                _ = self.app.job_changed(id, INPUT_RECHECK) => {
                    let waiting = self.app.job_summary(id).map_err(failed)?.status == JobStatus::AwaitingInput;
                    if !waiting {
                        // Answered elsewhere or ended: withdraw the request.
                        let _ = self.manager.update_task(ctx.task_id(), [(key.to_string(), Value::Null)]);
                        return Ok(());
                    }
                }
            }
        }
    }

    async fn cancel_job(&self, ctx: &TaskContext) -> Result<CallToolResult, TaskExit> {
        if let Err(e) = self.app.job_cancel(&self.id, None).await {
            tracing::debug!(job = %self.id, "cancel for tasks/cancel: {e}");
        }
        ctx.set_status_message(format!("job {} cancelled (tasks/cancel)", self.id));
        Err(TaskExit::Cancelled)
    }

    fn closed(&self) -> TaskExit {
        TaskExit::Error(ErrorData::internal_error(
            format!(
                "the connection closed while job {} ran; the server stops its jobs",
                self.id
            ),
            None,
        ))
    }
}

/// The elicitation that asks for the text a job waits for (a secret for getpass).
fn input_request(id: &str, prompt: &str, secret: bool) -> Result<InputRequest, TaskExit> {
    let what = if secret {
        "a secret (getpass; never echoed)"
    } else {
        "input"
    };
    let request = json!({
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": format!("job {id} asks for {what}: {prompt}"),
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "text": {"type": "string", "description": "The line to send (no newline needed)."}
                },
                "required": ["text"]
            }
        }
    });
    serde_json::from_value(request).map_err(|e| {
        TaskExit::Error(ErrorData::internal_error(
            format!("cannot build the input request: {e}"),
            None,
        ))
    })
}

/// The text and end-of-input flag an elicitation answer carries: `accept` with
/// `content.text`; `decline` or `cancel` end the input (EOFError in the code).
fn input_of(reply: &Value) -> (String, bool) {
    let accepted = reply.get("action").and_then(Value::as_str) == Some("accept");
    let text = reply
        .get("content")
        .and_then(|c| c.get("text"))
        .and_then(Value::as_str);
    match (accepted, text) {
        (true, Some(t)) => (t.to_string(), false),
        _ => (String::new(), true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elicitation_answers_become_input() {
        let accept = json!({"action": "accept", "content": {"text": "42"}});
        assert_eq!(input_of(&accept), ("42".to_string(), false));
        for end in [
            json!({"action": "decline"}),
            json!({"action": "cancel"}),
            json!({"action": "accept", "content": {}}),
            json!(null),
        ] {
            assert_eq!(input_of(&end), (String::new(), true), "{end}");
        }
    }

    #[test]
    fn the_input_request_is_a_form_elicitation() {
        let Ok(secret) = input_request("j1", "pw: ", true) else {
            panic!("no input request")
        };
        let wire = serde_json::to_value(&secret).unwrap();
        assert!(
            wire["params"]["message"]
                .as_str()
                .unwrap()
                .contains("secret")
        );
        let Ok(r) = input_request("j1", "name? ", false) else {
            panic!("no input request")
        };
        let wire = serde_json::to_value(&r).unwrap();
        assert_eq!(wire["method"], "elicitation/create");
        assert_eq!(wire["params"]["mode"], "form");
        assert!(
            wire["params"]["message"]
                .as_str()
                .unwrap()
                .contains("name? ")
        );
    }

    #[test]
    fn only_unfinished_job_reports_become_tasks() {
        let report = |status: &str| {
            let mut r = CallToolResult::success(vec![]);
            r.structured_content = Some(json!({"job_id": "j9", "status": status}));
            r
        };
        for done in ["completed", "failed", "cancelled", "lost"] {
            assert!(unfinished_job(&report(done)).is_none(), "{done}");
        }
        for open in ["running", "awaiting_input"] {
            let r = report(open);
            assert_eq!(unfinished_job(&r), Some(("j9".to_string(), open)));
        }
        assert!(unfinished_job(&CallToolResult::success(vec![])).is_none());
    }
}
