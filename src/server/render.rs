//! Rendering of the list-style answers (sessions, variables, history, jobs, output,
//! environments): a short text block an LLM reads plus the same facts as structured
//! content. Job answers are rendered by [`super::report::JobReport`].

use std::fmt::Write as _;

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::json;

use super::report::structured;
use crate::app::{EnvInfo, VarsOutcome};
use crate::jobs::{JobSummary, OutputChunk, SearchHit, Stream};
use crate::repl::{HistoryEntry, SessionInfo, SnapshotState, cell_name};

/// A plain-text + structured result for list-style tools.
fn listing<T: serde::Serialize>(text: String, value: &T) -> CallToolResult {
    structured(vec![ContentBlock::text(text)], value, false)
}

pub fn interrupted(session: &str, was_running: bool) -> CallToolResult {
    let text = if was_running {
        format!("KeyboardInterrupt sent to session {session:?}; the running job reports it")
    } else {
        format!("session {session:?} was idle; nothing to interrupt")
    };
    listing(text, &json!({ "session": session, "interrupted": true }))
}

pub fn vars(session: &str, outcome: VarsOutcome) -> CallToolResult {
    match outcome {
        VarsOutcome::List(vars) => {
            let mut text = format!("{} variable(s) in session {session:?}\n", vars.len());
            for v in &vars {
                let size = v.size.map(|b| format!(" ({b} B)")).unwrap_or_default();
                let _ = writeln!(text, "{}: {}{size} = {}", v.name, v.type_name, v.repr);
            }
            listing(text, &json!({ "session": session, "variables": vars }))
        }
        VarsOutcome::Get(v) => {
            let more = if v.truncated {
                format!("\n… cut; the full repr has {} characters", v.chars)
            } else {
                String::new()
            };
            listing(
                format!("{}: {} = {}{more}", v.name, v.type_name, v.repr),
                &v,
            )
        }
        VarsOutcome::Set(name) => listing(
            format!("set {name} in session {session:?}"),
            &json!({ "session": session, "set": name }),
        ),
        VarsOutcome::Deleted(name) => listing(
            format!("deleted {name} from session {session:?}"),
            &json!({ "session": session, "deleted": name }),
        ),
        VarsOutcome::Cleared => listing(
            format!("cleared the variables of session {session:?}"),
            &json!({ "session": session, "cleared": true }),
        ),
    }
}

pub fn history(session: &str, cells: Vec<HistoryEntry>) -> CallToolResult {
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
    listing(
        text,
        &json!({ "session": session, "head": head, "cells": cells }),
    )
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

pub fn sessions(sessions: Vec<SessionInfo>) -> CallToolResult {
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
    listing(text, &json!({ "sessions": sessions }))
}

pub fn restarted(session: &str) -> CallToolResult {
    listing(
        format!("session {session:?} restarted: fresh worker, no variables"),
        &json!({ "session": session, "restarted": true }),
    )
}

pub fn closed(session: &str) -> CallToolResult {
    listing(
        format!("session {session:?} closed"),
        &json!({ "session": session, "closed": true }),
    )
}

pub fn jobs(jobs: Vec<JobSummary>) -> CallToolResult {
    let mut text = format!("{} job(s)\n", jobs.len());
    for j in &jobs {
        let exit = j
            .exit_code
            .map(|c| format!(" exit {c}"))
            .unwrap_or_default();
        let sess = j
            .session
            .as_deref()
            .map(|s| format!(" [{s}]"))
            .unwrap_or_default();
        let _ = writeln!(
            text,
            "{} {:?}{sess} {}{exit} · {} ms · out {} B, err {} B · {}",
            j.id, j.kind, j.status, j.elapsed_ms, j.stdout_bytes, j.stderr_bytes, j.label
        );
    }
    listing(text, &json!({ "jobs": jobs }))
}

pub fn hits(job_id: &str, stream: Stream, pattern: &str, hits: Vec<SearchHit>) -> CallToolResult {
    let mut text = format!(
        "{} match(es) of {pattern:?} in {stream} of job {job_id}\n",
        hits.len(),
    );
    for h in &hits {
        let _ = writeln!(text, "--- line {} (byte {}) ---", h.line, h.offset);
        for l in &h.before {
            let _ = writeln!(text, "  {l}");
        }
        let _ = writeln!(text, "> {}", h.text);
        for l in &h.after {
            let _ = writeln!(text, "  {l}");
        }
    }
    listing(
        text,
        &json!({ "job_id": job_id, "stream": stream, "hits": hits }),
    )
}

pub fn chunk(chunk: OutputChunk) -> CallToolResult {
    let more = if chunk.end < chunk.total {
        format!(
            "; {} more bytes: call job_output with offset {}",
            chunk.total - chunk.end,
            chunk.end
        )
    } else if chunk.eof {
        "; end of output".to_string()
    } else {
        "; the job is still writing".to_string()
    };
    let text = format!(
        "{} of job {} bytes [{}..{}) of {}{more}\n{}",
        chunk.stream, chunk.id, chunk.offset, chunk.end, chunk.total, chunk.text
    );
    listing(text, &chunk)
}

pub fn pruned(pruned: Vec<String>) -> CallToolResult {
    listing(
        format!("pruned {} job(s): {}", pruned.len(), pruned.join(", ")),
        &json!({ "pruned": pruned }),
    )
}

pub fn env_info(session: &str, info: EnvInfo) -> CallToolResult {
    let EnvInfo { uv, venv, uv_cache } = info;
    let uv = uv.map(|u| json!({ "path": u.path, "version": u.version }));
    let mut text = String::new();
    match &uv {
        Ok(u) => {
            let _ = writeln!(
                text,
                "uv: {} ({})",
                u["version"].as_str().unwrap_or("?"),
                u["path"]
            );
        }
        Err(e) => {
            let _ = writeln!(text, "uv: missing: {e}");
        }
    }
    match &venv {
        Some(v) => {
            let _ = writeln!(text, "session {session:?} venv: {}", v.root().display());
            let _ = writeln!(
                text,
                "python: {} ({})",
                v.python().display(),
                v.python_version.as_deref().unwrap_or("?")
            );
            let _ = writeln!(text, "site-packages: {}", v.site_packages().display());
        }
        None => {
            let _ = writeln!(
                text,
                "session {session:?} has no venv yet: env_install creates it (or env_info with create=true)"
            );
        }
    }
    let _ = writeln!(text, "uv cache: {}", uv_cache.display());
    let value = json!({
        "session": session,
        "uv": uv.as_ref().ok(),
        "uv_error": uv.as_ref().err().map(ToString::to_string),
        "venv": venv.as_ref().map(|v| json!({
            "root": v.root(),
            "python": v.python(),
            "python_version": v.python_version,
            "site_packages": v.site_packages(),
        })),
        "uv_cache": uv_cache,
    });
    listing(text, &value)
}
