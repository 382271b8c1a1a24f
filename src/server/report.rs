//! What tools return: the structured output types (their JSON Schemas are the tools' output
//! schemas) and their rendering as concise text plus MCP content blocks.
//!
//! Every tool answers with `structuredContent` (the typed value) and a short text block an
//! LLM can read without parsing JSON; images travel as MCP image content.

use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use super::budget::{IMAGE_BYTES, MAX_IMAGES, Whole, cut, share};
use crate::app::result::{self as result_stream, ResultLayout, is_image};
use crate::app::{App, JobView};
use crate::jobs::excerpt::split_budget;
use crate::jobs::{Excerpt, JobKind, JobSnapshot, JobStatus, Stream};
use crate::repl::cell_name;

/// A slice of one output stream of a job: bytes `[offset, end)` were delivered. When the
/// slice was too big for one response, `head` and `tail` are shown and `omitted` is the
/// byte range left out (read it with `job_output`).
#[derive(Debug, Clone, Default, Serialize, JsonSchema, PartialEq)]
pub(crate) struct OutputPart {
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
pub(crate) struct PyErrorReport {
    /// Exception class name, e.g. `ZeroDivisionError`.
    pub ename: String,
    /// Exception message.
    pub evalue: String,
    /// The formatted traceback.
    pub traceback: String,
}

/// A rich display item that is not an image (HTML, markdown, ...).
#[derive(Debug, Clone, Serialize, JsonSchema, PartialEq)]
pub(crate) struct DisplayReport {
    pub mime: String,
    pub data: String,
}

/// An image produced by the code; sent as MCP image content, not inside the JSON.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Image {
    pub mime: String,
    /// Base64 data.
    pub data: String,
}

/// The state of a job (a Python cell or a shell command) and its new output: a
/// [`JobSnapshot`] as the client sees it ([`JobReport::new`]), plus what the cell's result
/// holds and what the sandbox blocked.
#[derive(Debug, Clone, Serialize, JsonSchema, PartialEq)]
pub(crate) struct JobReport {
    /// Job id; pass it to job_wait, job_input, job_cancel, job_output.
    pub job_id: String,
    /// python, shell, install or script.
    #[schemars(with = "String")]
    pub kind: JobKind,
    /// The Python session, for Python jobs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// running, awaiting_input, completed, failed, cancelled or lost.
    #[schemars(with = "String")]
    pub status: JobStatus,
    /// The prompt of a pending `input()` (status awaiting_input).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// True when the pending input is a secret (getpass): the answer is never echoed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<bool>,
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
    #[serde(rename = "exception", skip_serializing_if = "Option::is_none")]
    pub error: Option<PyErrorReport>,
    /// Variables the cell created or rebound (so there is no need to list them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub new_variables: Vec<String>,
    /// True when the session's variables are gone: its worker died during this cell (see
    /// `message`, `signal`, `exit_code`) or before it (see `state_note`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_lost: Option<bool>,
    /// Why this cell ran in a fresh worker (a crash, a cancel that restarted the worker,
    /// the session's idle expiry), in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_note: Option<String>,
    /// The id of a Python cell ("c7"): pass it as `parent` to branch from its state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cell: Option<String>,
    /// The cell this one ran on top of (null: an empty state). Present with `cell`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<Option<String>>,
    /// Cells re-run to rebuild the parent's state (its snapshot was gone).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replayed: Vec<String>,
    /// Rich non-image display output in text form (markdown, plain text, SVG).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub display: Vec<DisplayReport>,
    /// Display items past the answer budget, collapsed into one summary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display_held: Option<HeldItems>,
    /// HTML forms of rich output: never in the answer (`value` or `display` has the text
    /// form); read them in the `result` stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub html: Option<HeldItems>,
    /// Index in the cell's display list of each `display` item, and of each HTML item.
    #[serde(skip)]
    #[schemars(skip)]
    display_index: Vec<usize>,
    #[serde(skip)]
    #[schemars(skip)]
    html_index: Vec<usize>,
    /// Number of images returned as image content.
    #[serde(skip_serializing_if = "is_zero")]
    pub images: usize,
    /// Images held back (over the per-answer limit): fetch each with job_output `image`
    /// (numbered from `images + 1`).
    #[serde(skip_serializing_if = "is_zero")]
    pub images_held: usize,
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

/// Items of a cell's result not in the answer: read them with job_output
/// `stream="result"` from `offset` (where the first one's section starts).
#[derive(Debug, Clone, Copy, Default, Serialize, JsonSchema, PartialEq)]
pub(crate) struct HeldItems {
    pub items: usize,
    pub bytes: u64,
    pub offset: u64,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl From<Excerpt> for OutputPart {
    fn from(e: Excerpt) -> Self {
        let Excerpt {
            offset,
            end,
            head,
            tail,
            omitted,
        } = e;
        OutputPart {
            offset,
            end,
            text: head,
            tail,
            omitted,
        }
    }
}

impl JobReport {
    /// For a finished job whose answer carries no new output but which printed some
    /// before (handed to an earlier answer, perhaps another caller's): where it is.
    fn delivered_before(&self) -> Option<String> {
        let nothing_new = self.stdout.text.is_empty() && self.stderr.text.is_empty();
        let earlier = self.stdout.offset + self.stderr.offset;
        (self.status.is_finished() && nothing_new && earlier > 0).then(|| {
            format!(
                "output: {} bytes of stdout and {} of stderr were in earlier answers; read them with job_output job_id=\"{}\"\n",
                self.stdout.offset, self.stderr.offset, self.job_id
            )
        })
    }

    /// The report of a job; images of a Python cell go to the returned list. Every field
    /// of the snapshot is named here (no `..`), so a new one cannot be forgotten.
    pub(crate) fn new(view: JobView) -> (JobReport, Vec<Image>) {
        let JobView {
            snapshot,
            denied,
            running_cell,
        } = view;
        let JobSnapshot {
            id,
            kind,
            session,
            label: _,
            status,
            prompt,
            secret,
            stdout,
            stderr,
            elapsed_ms,
            exit_code,
            signal,
            message,
            result,
        } = snapshot;
        let mut report = JobReport {
            job_id: id,
            kind,
            session,
            status,
            prompt,
            secret: secret.then_some(true),
            stdout: stdout.into(),
            stderr: stderr.into(),
            elapsed_ms,
            exit_code,
            signal,
            message,
            value: None,
            error: None,
            new_variables: Vec::new(),
            state_lost: None,
            state_note: None,
            cell: None,
            parent: None,
            replayed: Vec::new(),
            display: Vec::new(),
            display_held: None,
            html: None,
            display_index: Vec::new(),
            html_index: Vec::new(),
            images: 0,
            images_held: 0,
            result: None,
            denied,
            next: None,
        };
        if let Some((cell, parent)) = running_cell {
            // A cell still running: its id and parent come from the session.
            report.cell = Some(cell_name(cell));
            report.parent = Some(parent.map(cell_name));
        }
        let mut images = Vec::new();
        if let Some(result) = result {
            match kind {
                JobKind::Install | JobKind::Script => report.result = Some(result),
                JobKind::Python | JobKind::Shell => report.fill_python_result(&result, &mut images),
            }
        }
        (report, images)
    }

    /// Copy a stored cell result into the report; images go to `images`.
    fn fill_python_result(&mut self, result: &Value, images: &mut Vec<Image>) {
        self.value = result
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
            self.error = Some(PyErrorReport {
                ename: f("ename"),
                evalue: f("evalue"),
                traceback: f("traceback"),
            });
        }
        self.new_variables = result
            .get("new_variables")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect();
        if result.get("state_lost").and_then(Value::as_bool) == Some(true) {
            self.state_lost = Some(true);
            // The crashing cell's own answer names the crash in `message`; only a cell
            // that ran in a fresh worker carries the note.
            if result.get("status").and_then(Value::as_str) != Some("worker_died") {
                self.state_note = Some(
                    result
                        .get("state_note")
                        .and_then(Value::as_str)
                        .unwrap_or(
                            "the previous worker had died; this ran in a fresh worker and \
                             earlier state is lost",
                        )
                        .to_string(),
                );
            }
        } else if let Some(note) = result.get("state_note").and_then(Value::as_str) {
            // State kept, with something said of it (a branch that shares descriptors).
            self.state_note = Some(note.to_string());
        }
        if let Some(cell) = result.get("cell").and_then(Value::as_u64) {
            self.cell = Some(cell_name(cell));
            self.parent = Some(result.get("parent").and_then(Value::as_u64).map(cell_name));
        }
        self.replayed = result
            .get("replayed")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .map(cell_name)
            .collect();
        let items = result
            .get("display")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate();
        for (n, item) in items {
            let (Some(mime), Some(data)) = (
                item.get("mime").and_then(Value::as_str),
                item.get("data").and_then(Value::as_str),
            ) else {
                continue;
            };
            if is_image(mime) {
                images.push(Image {
                    mime: mime.to_string(),
                    data: data.to_string(),
                });
            } else if mime == "text/html" {
                // Rich output once: the answer carries the text form, the HTML stays in
                // the result stream.
                let held = self.html.get_or_insert_with(HeldItems::default);
                held.items += 1;
                held.bytes += data.len() as u64;
                self.html_index.push(n);
            } else {
                self.display.push(DisplayReport {
                    mime: mime.to_string(),
                    data: data.to_string(),
                });
                self.display_index.push(n);
            }
        }
    }

    /// The whole MCP answer for a job view, within the one answer budget
    /// ([`App::response_bytes`] of text, and the same of structured content): every part
    /// over its share is cut, saying what was left out and where to read it whole.
    pub(crate) fn answer(view: JobView, app: &App) -> CallToolResult {
        let (report, sent) = JobReport::fitted(view, app, app.response_bytes());
        report.into_result(sent)
    }

    /// The report of a job view within `cap` bytes of text and of JSON, and the images
    /// it carries.
    pub(crate) fn fitted(view: JobView, app: &App, cap: usize) -> (JobReport, Vec<Image>) {
        let layout = view
            .snapshot
            .result
            .as_ref()
            .map(|r| (result_stream::layout(view.snapshot.kind, r), r.clone()));
        let (full, images) = JobReport::new(view);
        let full = full.with_next_step();
        let (sent, held) = pick_images(images);
        let mut budget = cap;
        let mut report = full.clone();
        // Markers and JSON escaping are only known once assembled: shrink until it fits.
        for _ in 0..6 {
            report = full.fit(budget, layout.as_ref(), app);
            report.images = sent.len();
            report.images_held = held;
            let worst = report.to_text().len().max(json_len(&report));
            if worst <= cap {
                break;
            }
            budget = (budget as u64 * cap as u64 / worst as u64) as usize * 9 / 10;
        }
        (report, sent)
    }

    /// This report with its parts cut to share `budget` bytes.
    fn fit(&self, budget: usize, layout: Option<&(ResultLayout, Value)>, app: &App) -> JobReport {
        let mut r = self.clone();
        if let Some(p) = &r.prompt {
            r.prompt = Some(cut(p, 1000, Whole::Elsewhere("the prompt is longer")));
        }
        let mut bare = r.clone();
        bare.stdout.text.clear();
        bare.stdout.tail = None;
        bare.stderr.text.clear();
        bare.stderr.tail = None;
        bare.value = bare.value.map(|_| String::new());
        if let Some(e) = &mut bare.error {
            e.traceback.clear();
            e.evalue.clear();
        }
        bare.display.clear();
        bare.result = bare.result.map(|_| Value::Null);
        let overhead = bare.to_text().len().max(json_len(&bare));
        let avail = budget.saturating_sub(overhead);

        let shown = |p: &OutputPart| p.text.len() + p.tail.as_ref().map_or(0, String::len);
        let result_json = r.result.as_ref().map(json_len);
        let display_needs: Vec<usize> = r
            .display
            .iter()
            .map(|d| d.data.len() + item_overhead(&d.mime))
            .collect();
        let needs = vec![
            shown(&r.stdout) + shown(&r.stderr),
            r.value.as_ref().map_or(0, String::len),
            r.error
                .as_ref()
                .map_or(0, |e| e.traceback.len() + e.evalue.len().min(300)),
            result_json.unwrap_or(0),
            display_needs.iter().sum(),
        ];
        let grant = share(avail, &needs);

        if grant[0] < needs[0] {
            let (b_out, b_err) = split_budget(
                grant[0],
                r.stdout.end - r.stdout.offset,
                r.stderr.end - r.stderr.offset,
            );
            let job_id = r.job_id.clone();
            let again = |p: &OutputPart, stream: Stream, b: usize| {
                app.job_excerpt(&job_id, stream, p.offset, p.end, b)
                    .map(OutputPart::from)
                    .unwrap_or_else(|_| OutputPart {
                        text: cut(
                            &p.text,
                            b,
                            Whole::Elsewhere("read the stream with job_output"),
                        ),
                        tail: None,
                        ..p.clone()
                    })
            };
            r.stdout = again(&r.stdout, Stream::Stdout, b_out);
            r.stderr = again(&r.stderr, Stream::Stderr, b_err);
        }
        let at = |o: Option<u64>| {
            o.map_or(
                Whole::Elsewhere("the job has no result stream"),
                Whole::ResultAt,
            )
        };
        let offsets = layout.map(|(l, _)| l);
        let section = |n: usize| {
            offsets
                .and_then(|l| l.display_start.get(n).copied())
                .unwrap_or(0)
        };
        if let Some(h) = &mut r.html {
            h.offset = r.html_index.first().map_or(0, |&n| section(n));
        }
        if let Some(v) = &r.value {
            r.value = Some(cut(v, grant[1], at(offsets.and_then(|l| l.value))));
        }
        if let Some(e) = &mut r.error {
            e.evalue = cut(
                &e.evalue,
                300,
                Whole::Elsewhere("the whole message ends the traceback"),
            );
            let room = grant[2].saturating_sub(e.evalue.len());
            e.traceback = cut(&e.traceback, room, at(offsets.and_then(|l| l.traceback)));
        }
        if let (Some(len), Some(v)) = (result_json, &r.result)
            && len > grant[3]
        {
            let pretty = serde_json::to_string_pretty(v).unwrap_or_default();
            r.result = Some(Value::String(cut(&pretty, grant[3], Whole::ResultAt(0))));
        }
        // Display items: as many as fit whole or cut to a useful size (at most
        // MAX_CUT of them cut), the rest collapsed into one summary.
        let (shares, kept) = display_plan(grant[4], &display_needs);
        if kept < r.display.len() {
            let rest = &r.display[kept..];
            r.display_held = Some(HeldItems {
                items: rest.len(),
                bytes: rest.iter().map(|d| d.data.len() as u64).sum(),
                offset: section(r.display_index[kept]),
            });
            r.display.truncate(kept);
        }
        for (i, d) in r.display.iter_mut().enumerate() {
            let data_at = offsets.and_then(|l| l.display.get(r.display_index[i]).copied());
            let room = shares[i].saturating_sub(item_overhead(&d.mime));
            d.data = cut(&d.data, room, at(data_at));
        }
        r
    }

    /// Fill in `next` for unfinished jobs, so the caller always knows the next move.
    pub(crate) fn with_next_step(mut self) -> Self {
        self.next = match self.status {
            JobStatus::Running => Some(format!(
                "still running in the background: call job_wait with job_id \"{}\" to follow it, job_cancel to stop it",
                self.job_id
            )),
            JobStatus::AwaitingInput => Some(format!(
                "waiting for input: call job_input with job_id \"{}\" and the text",
                self.job_id
            )),
            _ => None,
        };
        self
    }

    /// Concise text for the model: status line, output, value, traceback.
    pub(crate) fn to_text(&self) -> String {
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
        if let Some(note) = &self.state_note {
            out.push_str(&format!("note: {note}\n"));
        }
        if !self.replayed.is_empty() {
            out.push_str(&format!(
                "note: replayed {} to rebuild the parent's state (no snapshot held it); their side effects happened again\n",
                self.replayed.join(", ")
            ));
        }
        push_part(&mut out, "stdout", &self.stdout);
        push_part(&mut out, "stderr", &self.stderr);
        if let Some(note) = self.delivered_before() {
            out.push_str(&note);
        }
        if let Some(v) = &self.value {
            out.push_str(&format!("value: {v}\n"));
        }
        if !self.new_variables.is_empty() {
            out.push_str(&format!(
                "new variables: {}\n",
                self.new_variables.join(", ")
            ));
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
        if let Some(h) = &self.display_held {
            out.push_str(&format!(
                "… {} more display item(s) ({} bytes) left out: read them with job_output job_id=\"{}\" stream=\"result\" offset={}\n",
                h.items, h.bytes, self.job_id, h.offset
            ));
        }
        if let Some(h) = &self.html {
            out.push_str(&format!(
                "html: {} item(s), {} bytes, not shown (the text form is): job_output job_id=\"{}\" stream=\"result\" offset={}\n",
                h.items, h.bytes, self.job_id, h.offset
            ));
        }
        if let Some(p) = &self.prompt {
            let secret = if self.secret == Some(true) {
                " (secret: the answer is not echoed)"
            } else {
                ""
            };
            out.push_str(&format!("prompt: {p:?}{secret}\n"));
        }
        // A failed cell's message repeats the traceback's last line; one that says more
        // (a time limit) is shown.
        let repeats = |m: &str| {
            self.error
                .as_ref()
                .is_some_and(|e| m.starts_with(&format!("{}:", e.ename)))
        };
        if let Some(m) = self.message.as_ref().filter(|m| !repeats(m)) {
            out.push_str(&format!("{m}\n"));
        }
        if self.images_held > 0 {
            out.push_str(&format!(
                "{} more image(s) held back: fetch each with job_output job_id=\"{}\" image={}..{}\n",
                self.images_held,
                self.job_id,
                self.images + 1,
                self.images + self.images_held
            ));
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
    pub(crate) fn into_result(self, images: Vec<Image>) -> CallToolResult {
        let failed = matches!(self.status, JobStatus::Failed | JobStatus::Lost);
        let report = self;
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

/// Most display items one answer shows cut; past them, items are held back whole.
const MAX_CUT: usize = 4;
/// The least a cut display item keeps (smaller, it would be mostly its marker).
const MIN_ITEM: usize = 600;

/// What one display item costs an answer beyond its data (its header line in the text,
/// its JSON object in the structured content).
fn item_overhead(mime: &str) -> usize {
    mime.len() + 24
}

/// How `avail` bytes go to display items that want `needs` (overhead included): the
/// grant of each of the first `kept` items; the rest are held back. The most items
/// that fit with at most [`MAX_CUT`] of them cut, none below [`MIN_ITEM`].
fn display_plan(avail: usize, needs: &[usize]) -> (Vec<usize>, usize) {
    // Room for the summary line of the held-back items.
    const SUMMARY: usize = 200;
    let plan = |k: usize| {
        let room = if k < needs.len() {
            avail.saturating_sub(SUMMARY)
        } else {
            avail
        };
        let g = share(room, &needs[..k]);
        let cut: Vec<usize> = (0..k).filter(|&i| g[i] < needs[i]).collect();
        let ok = cut.len() <= MAX_CUT && cut.iter().all(|&i| g[i] >= MIN_ITEM);
        (g, ok)
    };
    if plan(needs.len()).1 {
        return (plan(needs.len()).0, needs.len());
    }
    // Short of all, the summary's room is taken and feasibility only gets harder with
    // more items: the largest feasible count.
    let (mut lo, mut hi) = (0, needs.len() - 1);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if plan(mid).1 {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    (plan(lo).0, lo)
}

/// Bytes of `v` as compact JSON.
fn json_len<T: Serialize>(v: &T) -> usize {
    serde_json::to_string(v).map_or(0, |s| s.len())
}

/// The images an answer carries (at most [`MAX_IMAGES`], at most [`IMAGE_BYTES`] of
/// base64, in order) and how many are held back.
fn pick_images(images: Vec<Image>) -> (Vec<Image>, usize) {
    let total = images.len();
    let mut bytes = 0;
    let mut sent = Vec::new();
    for i in images {
        if sent.len() == MAX_IMAGES || bytes + i.data.len() > IMAGE_BYTES {
            break;
        }
        bytes += i.data.len();
        sent.push(i);
    }
    let held = total - sent.len();
    (sent, held)
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
pub(crate) fn structured<T: Serialize>(
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

/// A tool failure the caller should read: `isError` with words, and the same words as
/// `{"error": ...}` structured content (every output schema admits it).
pub(crate) fn failure(text: impl Into<String>) -> CallToolResult {
    let text = text.into();
    let mut r = CallToolResult::error(vec![ContentBlock::text(text.clone())]);
    r.structured_content = Some(serde_json::json!({ "error": text }));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(kind: JobKind, status: JobStatus) -> JobSnapshot {
        JobSnapshot {
            id: "j3".into(),
            kind,
            session: Some("default".into()),
            label: "print(1)".into(),
            status,
            prompt: None,
            secret: false,
            stdout: Excerpt::default(),
            stderr: Excerpt::default(),
            elapsed_ms: 5,
            exit_code: None,
            signal: None,
            message: None,
            result: None,
        }
    }

    fn report(kind: JobKind, status: JobStatus) -> JobReport {
        JobReport::new(JobView {
            snapshot: snapshot(kind, status),
            denied: Vec::new(),
            running_cell: None,
        })
        .0
    }

    #[test]
    fn running_jobs_say_what_to_do_next() {
        let r = report(JobKind::Python, JobStatus::Running).with_next_step();
        assert!(r.to_text().contains("job_wait with job_id \"j3\""));
        assert!(r.to_text().starts_with("[python j3] running"));
        let done = report(JobKind::Shell, JobStatus::Completed).with_next_step();
        assert_eq!(done.next, None);
    }

    /// The JSON a client sees: states and kinds in lowercase snake_case, the job id as
    /// `job_id`, no label, empty optionals left out.
    #[test]
    fn states_and_kinds_serialize_as_before() {
        let v = serde_json::to_value(report(JobKind::Install, JobStatus::AwaitingInput)).unwrap();
        assert_eq!(v["kind"], "install");
        assert_eq!(v["status"], "awaiting_input");
        assert_eq!(v["job_id"], "j3");
        assert!(v.get("label").is_none() && v.get("id").is_none());
        assert!(v.get("images").is_none() && v.get("denied").is_none());
        assert_eq!(
            v["stdout"],
            serde_json::json!({"offset": 0, "end": 0, "text": ""})
        );
        // The output schema keeps them plain strings.
        let schema = serde_json::to_value(schemars::schema_for!(JobReport)).unwrap();
        assert_eq!(schema["properties"]["status"]["type"], "string");
        assert_eq!(schema["properties"]["kind"]["type"], "string");
    }

    #[test]
    fn cell_results_fill_value_error_and_images() {
        let mut s = snapshot(JobKind::Python, JobStatus::Failed);
        s.result = Some(serde_json::json!({
            "value": "3",
            "error": {"ename": "E", "evalue": "v", "traceback": "tb"},
            "display": [{"mime": "image/png", "data": "AA"}, {"mime": "text/html", "data": "<b>"}],
        }));
        let (r, images) = JobReport::new(JobView {
            snapshot: s,
            denied: vec!["blocked".into()],
            running_cell: None,
        });
        assert_eq!(r.value.as_deref(), Some("3"));
        assert_eq!(r.error.as_ref().map(|e| e.ename.as_str()), Some("E"));
        assert_eq!(images.len(), 1);
        // HTML is held out of the answer (its text form would be a display item).
        assert_eq!(r.display.len(), 0);
        assert_eq!(r.html.map(|h| h.items), Some(1));
        assert_eq!(r.denied, vec!["blocked".to_string()]);
        let mut s = snapshot(JobKind::Script, JobStatus::Completed);
        s.result = Some(serde_json::json!({"ok": true}));
        let (r, _) = JobReport::new(JobView {
            snapshot: s,
            denied: Vec::new(),
            running_cell: None,
        });
        assert_eq!(r.result, Some(serde_json::json!({"ok": true})));
        assert_eq!(r.value, None);
    }

    #[test]
    fn images_are_capped_by_count_and_bytes() {
        let img = |n: usize| Image {
            mime: "image/png".into(),
            data: "A".repeat(n),
        };
        let (sent, held) = pick_images((0..30).map(|_| img(10)).collect());
        assert_eq!((sent.len(), held), (MAX_IMAGES, 30 - MAX_IMAGES));
        let (sent, held) = pick_images(vec![img(IMAGE_BYTES - 5), img(10), img(1)]);
        assert_eq!(
            (sent.len(), held),
            (1, 2),
            "in order: the second would pass the byte budget"
        );
        let (sent, held) = pick_images(vec![img(IMAGE_BYTES + 1)]);
        assert_eq!((sent.len(), held), (0, 1));
        let mut r = report(JobKind::Python, JobStatus::Completed);
        r.images = 4;
        r.images_held = 26;
        assert!(r.to_text().contains("26 more image(s) held back"));
        assert!(r.to_text().contains("image=5..30"));
    }

    #[test]
    fn a_failed_cell_prints_its_exception_once() {
        let mut r = report(JobKind::Python, JobStatus::Failed);
        r.message = Some("ValueError: boom".into());
        r.error = Some(PyErrorReport {
            ename: "ValueError".into(),
            evalue: "boom".into(),
            traceback: "Traceback (most recent call last):\nValueError: boom\n".into(),
        });
        assert_eq!(r.to_text().matches("ValueError: boom").count(), 1);
    }

    #[test]
    fn display_items_fit_whole_or_collapse() {
        // All fit: nothing held.
        let (g, kept) = display_plan(1000, &[100, 100]);
        assert_eq!((g, kept), (vec![100, 100], 2));
        // Many small ones: as many as fit whole after the summary's room, none cut.
        let needs = vec![150; 2000];
        let (g, kept) = display_plan(18_000, &needs);
        assert_eq!(kept, (18_000 - 200) / 150);
        assert!(g.iter().zip(&needs).all(|(g, n)| g == n));
        // A few big ones: at most MAX_CUT cut, each keeping at least MIN_ITEM.
        let (g, kept) = display_plan(18_000, &[50_000; 10]);
        assert_eq!(kept, MAX_CUT);
        assert!(g.iter().all(|&g| g >= MIN_ITEM));
        // Nothing fits: all held.
        assert_eq!(display_plan(100, &[5_000]).1, 0);
        assert_eq!(display_plan(0, &[]).1, 0);
    }

    #[test]
    fn omitted_ranges_are_marked() {
        let mut r = report(JobKind::Shell, JobStatus::Completed);
        r.stdout = OutputPart {
            offset: 0,
            end: 100,
            text: "aa\n".into(),
            tail: Some("zz\n".into()),
            omitted: Some([3, 97]),
        };
        assert!(r.to_text().contains("94 bytes omitted [3..97)"));
    }
}
