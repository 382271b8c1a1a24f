//! The worker protocol, Rust side: every message both ways as one tagged serde enum per
//! direction. JSON lines; requests on the worker's fd 3, events on its fd 4. Described
//! in docs/worker-protocol.md (a test keeps the two in step).

use serde::{Deserialize, Serialize};

/// Server → worker (fd 3). Every request but `input_reply` and `shutdown` is answered by
/// exactly one event with the same `id`, in the order the requests were sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(super) enum Request {
    /// Run `code` as cell number `cell`; answered by `done`.
    Execute {
        id: u64,
        cell: u64,
        code: String,
        repr_limit: usize,
    },
    /// Run the file at `path` as `__main__` with `sys.argv = [path, *argv]`; answered by `done`.
    RunFile {
        id: u64,
        cell: u64,
        path: String,
        argv: Vec<String>,
        repr_limit: usize,
    },
    /// Answer to `input_request` number `id`; `text: null` means end of input (EOFError).
    InputReply { id: u64, text: Option<String> },
    /// Answer to `install_request` of cell `id` (R only): the install ended, `ok` or not,
    /// `message` saying what it did in words. The cell runs on.
    InstallReply { id: u64, ok: bool, message: String },
    /// KeyboardInterrupt in cell `id`: raised at once if it runs, or as soon as it
    /// starts if it is still queued (no answer; the cell's `done` says `interrupted`).
    Interrupt { id: u64 },
    /// Answered by `variables`: by name, from the first name `>= start` (all when
    /// absent), at most `limit` (the worker's own cap, 5000, when absent or larger).
    ListVariables {
        id: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        start: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<usize>,
    },
    /// Answered by `variable` or `failed`.
    GetVariable {
        id: u64,
        name: String,
        repr_limit: usize,
    },
    /// Answered by `ok` or `failed`.
    SetVariable {
        id: u64,
        name: String,
        value: serde_json::Value,
    },
    /// Answered by `ok` or `failed`.
    DeleteVariable { id: u64, name: String },
    /// Answered by `ok`.
    ClearVariables { id: u64 },
    /// Add each directory with `site.addsitedir` (skipping those already on `sys.path`)
    /// and invalidate the import caches; the session's start-up hook. Answered by `ok`,
    /// or `failed` naming the directories that do not exist (the others are added).
    AddSiteDirs { id: u64, dirs: Vec<String> },
    /// Answered by `ok`. Every event the worker sent before it (a `snapshot` after the
    /// last cell) has arrived once the answer has.
    Ping { id: u64 },
    /// The worker exits at once (no answer).
    Shutdown,
}

/// Worker → server (fd 4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub(super) enum Event {
    /// Sent once, before anything else, when the worker is ready for requests.
    Ready {
        protocol: u32,
        pid: u32,
        version: String,
        executable: String,
    },
    /// The running cell `id` called `input(prompt)` and blocks until `input_reply`.
    InputRequest {
        id: u64,
        prompt: String,
        /// A secret (getpass): the answer must not be shown.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        secret: bool,
    },
    /// The running cell `id` (R only: `install.packages()`) asks the server to install
    /// `packages` into the session library, and blocks until `install_reply`.
    InstallRequest {
        id: u64,
        packages: Vec<String>,
    },
    /// Cell `id` finished. Everything it printed was flushed to fds 1/2 before this line.
    Done {
        id: u64,
        status: WireStatus,
        #[serde(default)]
        value: Option<WireValue>,
        #[serde(default)]
        error: Option<PyError>,
        #[serde(default)]
        display: Vec<DisplayItem>,
        /// Names the cell created or rebound (at most 100).
        #[serde(default)]
        new_variables: Vec<String>,
    },
    /// The variables by name; at most 5000 (or the request's `limit`), `omitted` counts
    /// the rest after them, `next` names the first of those, `total` counts all.
    Variables {
        id: u64,
        variables: Vec<VariableInfo>,
        #[serde(default)]
        omitted: u64,
        #[serde(default)]
        next: Option<String>,
        #[serde(default)]
        total: u64,
    },
    Variable {
        id: u64,
        #[serde(flatten)]
        detail: VariableDetail,
    },
    Ok {
        id: u64,
    },
    /// A non-cell request failed; `message` says why in words.
    Failed {
        id: u64,
        message: String,
    },
    /// Sent after the `done` of cell `cell` when snapshots are on (a control socket was
    /// passed): `held` with the snapshot's `pid` (its control socket was sent on the
    /// control socket just before this line), or not held with `note` saying why.
    Snapshot {
        cell: u64,
        held: bool,
        #[serde(default)]
        pid: Option<u32>,
        #[serde(default)]
        note: Option<String>,
    },
}

impl Event {
    /// The request this event answers, if any.
    pub(super) fn id(&self) -> Option<u64> {
        match self {
            Event::Ready { .. } | Event::Snapshot { .. } => None,
            Event::InputRequest { id, .. }
            | Event::InstallRequest { id, .. }
            | Event::Done { id, .. }
            | Event::Variables { id, .. }
            | Event::Variable { id, .. }
            | Event::Ok { id }
            | Event::Failed { id, .. } => Some(*id),
        }
    }
}

/// How a cell ended, as the worker reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum WireStatus {
    Ok,
    Error,
    Interrupted,
}

/// The repr of the last expression; `repr` is cut in the middle when longer than the
/// request's `repr_limit`, `chars` is the full length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct WireValue {
    pub(crate) repr: String,
    pub(crate) chars: u64,
    pub(crate) truncated: bool,
}

/// A Python exception: `traceback` is the full formatted text, worker frames removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PyError {
    pub ename: String,
    pub evalue: String,
    pub traceback: String,
}

/// Rich output: `data` is text for text types and base64 for images.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DisplayItem {
    pub mime: String,
    pub data: String,
}

/// One row of the variable list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VariableInfo {
    pub name: String,
    /// Type name, qualified with its module unless it is a builtin.
    #[serde(rename = "type")]
    pub type_name: String,
    /// repr, cut to about 120 characters.
    pub repr: String,
    /// `sys.getsizeof` in bytes (shallow), if the object reports it.
    pub size: Option<u64>,
}

/// One variable in full.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VariableDetail {
    pub name: String,
    #[serde(rename = "type")]
    pub type_name: String,
    pub repr: String,
    /// Length of the full repr in characters.
    pub chars: u64,
    pub truncated: bool,
    pub size: Option<u64>,
    /// The value as JSON when it is JSON-serialisable (null otherwise; see `has_json`).
    pub json: Option<serde_json::Value>,
    pub has_json: bool,
}

/// Encode a request as one protocol line (with the trailing newline).
pub(super) fn encode(req: &Request) -> Vec<u8> {
    // Serialising these plain types cannot fail; fall back to an empty object anyway.
    let mut line = serde_json::to_vec(req).unwrap_or_else(|_| b"{}".to_vec());
    line.push(b'\n');
    line
}

/// Decode one protocol line from the worker.
pub(super) fn decode(line: &[u8]) -> Result<Event, serde_json::Error> {
    serde_json::from_slice(line)
}

/// Every `op` and `ev` tag, for the docs-in-step test.
#[cfg(test)]
const ALL_TAGS: &[&str] = &[
    "execute",
    "run_file",
    "input_reply",
    "install_reply",
    "interrupt",
    "list_variables",
    "get_variable",
    "set_variable",
    "delete_variable",
    "clear_variables",
    "add_site_dirs",
    "ping",
    "shutdown",
    "ready",
    "input_request",
    "install_request",
    "done",
    "variables",
    "variable",
    "ok",
    "failed",
    "snapshot",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_encode_with_op_tag() {
        let line = encode(&Request::InputReply { id: 3, text: None });
        assert_eq!(
            line,
            b"{\"op\":\"input_reply\",\"id\":3,\"text\":null}\n".to_vec()
        );
        assert_eq!(
            encode(&Request::Shutdown),
            b"{\"op\":\"shutdown\"}\n".to_vec()
        );
    }

    #[test]
    fn events_decode_from_worker_lines() {
        let ev = decode(br#"{"ev":"done","id":7,"status":"ok","value":{"repr":"2","chars":1,"truncated":false},"display":[]}"#)
            .unwrap();
        assert_eq!(
            ev,
            Event::Done {
                id: 7,
                status: WireStatus::Ok,
                value: Some(WireValue {
                    repr: "2".into(),
                    chars: 1,
                    truncated: false
                }),
                error: None,
                display: vec![],
                new_variables: vec![],
            }
        );
        let ev = decode(br#"{"ev":"variable","id":1,"name":"x","type":"int","repr":"1","chars":1,"truncated":false,"size":28,"json":1,"has_json":true}"#).unwrap();
        assert_eq!(ev.id(), Some(1));
        // getpass asks with `secret: true`; input() leaves it out.
        for (line, secret) in [
            (
                &br#"{"ev":"input_request","id":2,"prompt":"pw: ","secret":true}"#[..],
                true,
            ),
            (
                &br#"{"ev":"input_request","id":2,"prompt":"pw: "}"#[..],
                false,
            ),
        ] {
            let ev = decode(line).unwrap();
            let want = Event::InputRequest {
                id: 2,
                prompt: "pw: ".into(),
                secret,
            };
            assert_eq!(ev, want);
        }
        let ev = decode(br#"{"ev":"install_request","id":4,"packages":["tinypkg"]}"#).unwrap();
        assert_eq!(
            ev,
            Event::InstallRequest {
                id: 4,
                packages: vec!["tinypkg".into()]
            }
        );
        assert_eq!(ev.id(), Some(4));
    }

    #[test]
    fn every_tag_is_listed_and_documented() {
        let doc = include_str!("../../docs/worker-protocol.md");
        for tag in ALL_TAGS {
            assert!(
                doc.contains(&format!("`{tag}`")),
                "docs/worker-protocol.md does not describe `{tag}`"
            );
        }
        // Each listed tag round-trips through the enums (catches renamed variants).
        let samples = [
            encode(&Request::Execute {
                id: 1,
                cell: 1,
                code: String::new(),
                repr_limit: 1,
            }),
            encode(&Request::RunFile {
                id: 1,
                cell: 1,
                path: String::new(),
                argv: vec![],
                repr_limit: 1,
            }),
            encode(&Request::InputReply { id: 1, text: None }),
            encode(&Request::InstallReply {
                id: 1,
                ok: true,
                message: String::new(),
            }),
            encode(&Request::Interrupt { id: 1 }),
            encode(&Request::ListVariables {
                id: 1,
                start: None,
                limit: None,
            }),
            encode(&Request::GetVariable {
                id: 1,
                name: String::new(),
                repr_limit: 1,
            }),
            encode(&Request::SetVariable {
                id: 1,
                name: String::new(),
                value: serde_json::Value::Null,
            }),
            encode(&Request::DeleteVariable {
                id: 1,
                name: String::new(),
            }),
            encode(&Request::ClearVariables { id: 1 }),
            encode(&Request::AddSiteDirs {
                id: 1,
                dirs: vec![],
            }),
            encode(&Request::Ping { id: 1 }),
            encode(&Request::Shutdown),
        ];
        for (line, tag) in samples.iter().zip(ALL_TAGS) {
            let text = String::from_utf8_lossy(line);
            assert!(
                text.contains(&format!("\"op\":\"{tag}\"")),
                "{text} lacks {tag}"
            );
        }
    }
}
