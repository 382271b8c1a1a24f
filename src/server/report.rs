//! What tools return: the structured output types (their JSON Schemas are the tools' output
//! schemas) and their rendering as concise text plus MCP content blocks.
//!
//! Every tool answers with `structuredContent` (the typed value) and a short text block an
//! LLM can read without parsing JSON; images travel as MCP image content.

use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::Serialize;

/// A slice of one output stream of a job: bytes `[offset, end)` were delivered. When the
/// slice was too big for one response, `head` and `tail` are shown and `omitted` is the
/// byte range left out (read it with `job_output`).
#[derive(Debug, Clone, Default, Serialize, JsonSchema, PartialEq)]
pub struct OutputPart {
    /// First byte offset covered by this answer.
    pub offset: u64,
    /// One past the last byte offset covered by this answer.
    pub end: u64,
    /// The text (or its beginning, when `omitted` is set). Invalid UTF-8 shows as U+FFFD.
    pub text: String,
    /// The end of the text, when the middle was left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tail: Option<String>,
    /// Byte range `[from, to)` not shown; read it with `job_output`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub omitted: Option<[u64; 2]>,
}

/// A Python exception.
#[derive(Debug, Clone, Serialize, JsonSchema, PartialEq)]
pub struct PyErrorReport {
    /// Exception class name, e.g. `ZeroDivisionError`.
    pub ename: String,
    /// Exception message.
    pub evalue: String,
    /// The formatted traceback.
    pub traceback: String,
}

/// A rich display item that is not an image (HTML, markdown, ...).
#[derive(Debug, Clone, Serialize, JsonSchema, PartialEq)]
pub struct DisplayReport {
    pub mime: String,
    pub data: String,
}

/// An image produced by the code; sent as MCP image content, not inside the JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub mime: String,
    /// Base64 data.
    pub data: String,
}

/// The state of a job (a Python cell or a shell command) and its new output.
#[derive(Debug, Clone, Default, Serialize, JsonSchema, PartialEq)]
pub struct JobReport {
    /// Job id; pass it to job_wait, job_input, job_cancel, job_output.
    pub job_id: String,
    /// python, shell, install or script.
    pub kind: String,
    /// The Python session, for Python jobs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// running, awaiting_input, completed, failed, cancelled or lost.
    pub status: String,
    /// The prompt of a pending `input()` (status awaiting_input).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// New standard output since the last answer about this job.
    pub stdout: OutputPart,
    /// New standard error since the last answer about this job.
    pub stderr: OutputPart,
    /// Milliseconds since the job started (until it finished, if it did).
    pub elapsed_ms: u64,
    /// Exit code of a shell job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Signal that ended the process, e.g. SIGSEGV.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// What happened, in words (worker crash, limit hit, policy denial, cancellation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// repr of the value of the last expression of a Python cell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The Python exception, if the cell raised one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<PyErrorReport>,
    /// True when the session's worker had died before this cell: earlier variables are gone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_lost: Option<bool>,
    /// The id of a Python cell ("c7"): pass it as `parent` to branch from its state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cell: Option<String>,
    /// The cell this one ran on top of (null: an empty state). Present with `cell`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<Option<String>>,
    /// Cells re-run to rebuild the parent's state (its snapshot was gone).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replayed: Vec<String>,
    /// Rich non-image display output (HTML, markdown).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub display: Vec<DisplayReport>,
    /// Number of images returned as image content.
    #[serde(skip_serializing_if = "is_zero")]
    pub images: usize,
    /// Structured result of an install or script job (packages installed, benchmark...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// Operations the sandbox blocked, in words ("blocked by policy workspace-write: write
    /// to /etc/x ..."), found in the output of a job that failed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub denied: Vec<String>,
    /// What to do next, when the job is not finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl JobReport {
    pub fn is_finished(&self) -> bool {
        !matches!(self.status.as_str(), "running" | "awaiting_input")
    }

    /// For a job that failed, say in words what the sandbox blocked, if its output or
    /// traceback shows a denial (the kernel itself only answers EACCES/EROFS/EPERM).
    pub fn explain_denials(&mut self, policy: &crate::sandbox::ResolvedPolicy) {
        let failed = self.status == "failed" || self.error.is_some();
        if !failed {
            return;
        }
        let mut text = String::new();
        for part in [&self.stderr, &self.stdout] {
            text.push_str(&part.text);
            text.push('\n');
            if let Some(tail) = &part.tail {
                text.push_str(tail);
                text.push('\n');
            }
        }
        if let Some(e) = &self.error {
            text.push_str(&e.traceback);
        }
        self.denied = crate::sandbox::explain_denials(policy, &text);
    }

    /// Fill in `next` for unfinished jobs, so the caller always knows the next move.
    pub fn with_next_step(mut self) -> Self {
        self.next = match self.status.as_str() {
            "running" => Some(format!(
                "still running in the background: call job_wait with job_id \"{}\" to follow it, job_cancel to stop it",
                self.job_id
            )),
            "awaiting_input" => Some(format!(
                "waiting for input: call job_input with job_id \"{}\" and the text",
                self.job_id
            )),
            _ => None,
        };
        self
    }

    /// Concise text for the model: status line, output, value, traceback.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let mut head = format!("[{} {}] {}", self.kind, self.job_id, self.status);
        if let Some(s) = &self.session {
            head.push_str(&format!(" · session {s}"));
        }
        if let Some(c) = &self.cell {
            head.push_str(&format!(" · cell {c}"));
            if let Some(Some(p)) = &self.parent {
                head.push_str(&format!(" (on {p})"));
            }
        }
        head.push_str(&format!(" · {} ms", self.elapsed_ms));
        if let Some(c) = self.exit_code {
            head.push_str(&format!(" · exit {c}"));
        }
        if let Some(s) = &self.signal {
            head.push_str(&format!(" · signal {s}"));
        }
        out.push_str(&head);
        out.push('\n');
        if self.state_lost == Some(true) {
            out.push_str("note: the previous worker had died; this ran in a fresh worker and earlier state is lost\n");
        }
        if !self.replayed.is_empty() {
            out.push_str(&format!(
                "note: replayed {} to rebuild the parent's state (no snapshot held it); their side effects happened again\n",
                self.replayed.join(", ")
            ));
        }
        push_part(&mut out, "stdout", &self.stdout);
        push_part(&mut out, "stderr", &self.stderr);
        if let Some(v) = &self.value {
            out.push_str(&format!("value: {v}\n"));
        }
        if let Some(e) = &self.error {
            out.push_str(&e.traceback);
            if !e.traceback.ends_with('\n') {
                out.push('\n');
            }
        }
        for d in &self.display {
            out.push_str(&format!("--- {} ---\n{}\n", d.mime, d.data));
        }
        if let Some(p) = &self.prompt {
            out.push_str(&format!("prompt: {p:?}\n"));
        }
        if let Some(m) = &self.message {
            out.push_str(&format!("{m}\n"));
        }
        for d in &self.denied {
            out.push_str(&format!("{d}\n"));
        }
        if let Some(n) = &self.next {
            out.push_str(&format!("next: {n}\n"));
        }
        out
    }

    /// The MCP result: text + structured content (+ images). Failed jobs are tool errors
    /// (`isError`) so the model notices them; the structured content is the same either way.
    pub fn into_result(self, images: Vec<Image>) -> CallToolResult {
        let failed = matches!(self.status.as_str(), "failed" | "lost");
        let mut report = self;
        report.images = images.len();
        let text = report.to_text();
        let mut content = vec![ContentBlock::text(text)];
        content.extend(
            images
                .into_iter()
                .map(|i| ContentBlock::image(i.data, i.mime)),
        );
        structured(content, &report, failed)
    }
}

fn push_part(out: &mut String, name: &str, part: &OutputPart) {
    if part.text.is_empty() && part.tail.is_none() {
        return;
    }
    out.push_str(&format!("--- {name} [{}..{}) ---\n", part.offset, part.end));
    out.push_str(&part.text);
    if let (Some(tail), Some([a, b])) = (&part.tail, part.omitted) {
        if !part.text.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&format!(
            "… {} bytes omitted [{a}..{b}); read them with job_output …\n",
            b - a
        ));
        out.push_str(tail);
    }
    if !out.ends_with('\n') {
        out.push('\n');
    }
}

/// A result carrying `value` as structured content and `content` for display.
pub fn structured<T: Serialize>(
    content: Vec<ContentBlock>,
    value: &T,
    is_error: bool,
) -> CallToolResult {
    let mut result = if is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    result.structured_content = serde_json::to_value(value).ok();
    result
}

/// A tool failure the caller should read: `isError` with words, no structured content.
pub fn failure(text: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text.into())])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_jobs_say_what_to_do_next() {
        let r = JobReport {
            job_id: "j3".into(),
            kind: "python".into(),
            status: "running".into(),
            ..Default::default()
        }
        .with_next_step();
        assert!(r.to_text().contains("job_wait with job_id \"j3\""));
        let done = JobReport {
            status: "completed".into(),
            ..Default::default()
        }
        .with_next_step();
        assert_eq!(done.next, None);
    }

    #[test]
    fn omitted_ranges_are_marked() {
        let r = JobReport {
            stdout: OutputPart {
                offset: 0,
                end: 100,
                text: "aa\n".into(),
                tail: Some("zz\n".into()),
                omitted: Some([3, 97]),
            },
            ..Default::default()
        };
        assert!(r.to_text().contains("94 bytes omitted [3..97)"));
    }
}
