//! The structured answers of the tools that are not job reports, as types: their JSON
//! Schemas are the tools' output schemas, so what a tool returns and what it declares
//! cannot drift apart. Shared shapes: every job is named by `job_id`, every session by
//! `session`, every state is lowercase.

use schemars::JsonSchema;
use serde::Serialize;

use crate::jobs::{JobSummary, SearchHit};
use crate::repl::{HistoryEntry, SessionInfo, VariableDetail, VariableInfo};

/// What a session tool did (python_interrupt, session_restart, session_close).
#[derive(Debug, Clone, Default, Serialize, JsonSchema)]
pub(crate) struct SessionDone {
    pub session: String,
    /// python_interrupt: whether a cell was running (and got KeyboardInterrupt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<bool>,
    /// python_interrupt: the interrupted cell's job once it ended (or after the wait).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<crate::server::report::JobReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restarted: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub closed: Option<bool>,
}

/// session_list.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct Sessions {
    pub sessions: Vec<SessionInfo>,
}

/// python_vars: the list, one variable (its fields at the top level), or what changed.
#[derive(Debug, Clone, Default, Serialize, JsonSchema)]
pub(crate) struct Vars {
    pub session: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variables: Option<Vec<VariableInfo>>,
    /// List: how many variables the session has.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    /// List: pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub variable: Option<VariableDetail>,
    /// Bytes of the JSON form of the variable, when it was left out (too big).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json_left_out: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub set: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cleared: Option<bool>,
    /// Why the session's state is fresh (it expired, its worker died), in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_note: Option<String>,
}

/// python_history.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct History {
    pub session: String,
    /// The cell a cell without `parent` runs on (null: an empty state).
    pub head: Option<String>,
    pub cells: Vec<HistoryEntry>,
    /// Older cells left out to fit the answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub left_out: Option<usize>,
    /// Pass as `cursor` for the older cells left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// Older cells dropped for good by the session's cap on cells kept, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped: Option<String>,
    /// Why the session's state is fresh (it expired, its worker died), in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_note: Option<String>,
}

/// job_list.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct Jobs {
    pub jobs: Vec<JobSummary>,
    /// Pass as `cursor` for the next (older) page; null on the last page.
    pub next_cursor: Option<String>,
}

/// job_prune.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct Pruned {
    pub pruned: Vec<String>,
}

/// job_output: a byte range read, a search, or one image.
#[derive(Debug, Clone, Default, Serialize, JsonSchema)]
pub(crate) struct Output {
    pub job_id: String,
    /// stdout, stderr or result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    /// Read: first byte returned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Read: one past the last byte returned; read on from here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end: Option<u64>,
    /// Read: bytes in the stream so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    /// Read: nothing more will come.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eof: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Read: `base64` when `text` is the base64 of bytes that are not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
    /// Search: the pattern.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// Search: the matches shown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hits: Option<Vec<SearchHit>>,
    /// Search: matching lines in the range searched (exact unless `matches_at_least`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matches: Option<u64>,
    /// Search: true when `matches` is a lower bound (the count stopped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matches_at_least: Option<bool>,
    /// Search: more matches follow the ones shown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
    /// Search: pass as `offset` to continue after the hits shown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
    /// Image: its number, of `images`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub images: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mime: Option<String>,
    /// Image: pixel size of the image returned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub height: Option<u32>,
    /// Image: the cell's image, when the one returned is a copy scaled down to fit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub original: Option<OriginalImage>,
}

/// The size of an image that was scaled down to fit an answer.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct OriginalImage {
    pub width: u32,
    pub height: u32,
    /// Bytes of the image file.
    pub bytes: u64,
}

/// env_info's uv.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct Uv {
    pub path: String,
    pub version: String,
}

/// env_info's venv.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct Venv {
    pub root: String,
    pub python: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python_version: Option<String>,
    pub site_packages: String,
}

/// env_info.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct EnvReport {
    pub session: String,
    /// null when uv is missing (`uv_error` says why).
    pub uv: Option<Uv>,
    pub uv_error: Option<String>,
    /// null until the session has a venv.
    pub venv: Option<Venv>,
    pub uv_cache: String,
}
