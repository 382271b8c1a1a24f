//! Rendering of the list-style answers (sessions, variables, history, jobs, output,
//! environments): a short text block an LLM reads plus the same facts as structured
//! content. Job answers are rendered by [`super::report::JobReport`].

use std::fmt::Write as _;

use rmcp::model::{CallToolResult, ContentBlock};

use super::budget::{Whole, cut};
use super::report::JobReport;
use super::report::structured;
use super::shapes::{
    EnvReport, History, Jobs, OriginalImage, Output, Pruned, SessionDone, Sessions, Uv, Vars, Venv,
};
use crate::app::result::ResultImage;
use crate::app::{App, Chunk, EnvInfo, JobView, VarsOutcome};
use crate::jobs::search::Found;
use crate::jobs::{JobPage, SearchHit, Stream};
use crate::repl::{self, HistoryEntry, SessionInfo, SnapshotState, VariablePage, cell_name};

/// The name a value has in JSON (lowercase states), for the text to say the same.
fn wire_name<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

/// A plain-text + structured result for list-style tools.
fn listing<T: serde::Serialize>(text: String, value: &T) -> CallToolResult {
    structured(vec![ContentBlock::text(text)], value, false)
}

/// python_interrupt: the interrupted cell's job as it ended (its report, like
/// job_cancel's, within the budget), or that the session was idle.
pub(crate) fn interrupted(session: &str, job: Option<JobView>, app: &App) -> CallToolResult {
    let Some(view) = job else {
        return listing(
            format!("session {session:?} was idle; nothing to interrupt"),
            &SessionDone {
                session: session.into(),
                interrupted: Some(false),
                ..Default::default()
            },
        );
    };
    // Room for the line and the wrapper around the report.
    let (report, images) = JobReport::fitted(view, app, app.response_bytes().saturating_sub(300));
    let outcome = if report.status.is_finished() {
        format!("job {} ended {}", report.job_id, report.status)
    } else {
        format!(
            "job {} is still {}: follow it with job_wait",
            report.job_id, report.status
        )
    };
    let text = format!(
        "KeyboardInterrupt sent to session {session:?}; {outcome}\n{}",
        report.to_text()
    );
    let mut content = vec![ContentBlock::text(text)];
    content.extend(
        images
            .into_iter()
            .map(|i| ContentBlock::image(i.data, i.mime)),
    );
    structured(
        content,
        &SessionDone {
            session: session.into(),
            interrupted: Some(true),
            job: Some(report),
            ..Default::default()
        },
        false,
    )
}

pub(crate) fn vars(
    session: &str,
    outcome: VarsOutcome,
    note: Option<String>,
    cap: usize,
) -> CallToolResult {
    let mut answer = vars_of(session, outcome, cap);
    if let Some(note) = note {
        // Said first in the text, and beside the answer's own fields.
        if let Some(first) = answer.content.first_mut() {
            let text = first.as_text().map(|t| t.text.clone()).unwrap_or_default();
            *first = ContentBlock::text(format!("note: {note}\n{text}"));
        }
        if let Some(serde_json::Value::Object(map)) = answer.structured_content.as_mut() {
            map.insert("state_note".into(), serde_json::Value::String(note));
        }
    }
    answer
}

fn vars_of(session: &str, outcome: VarsOutcome, cap: usize) -> CallToolResult {
    match outcome {
        VarsOutcome::List(page) => {
            // One page within the budget: the rows that fit, the cursor at the first one
            // left out (or the worker's next name past its page).
            let VariablePage {
                mut variables,
                next,
                total,
            } = page;
            let room = (cap * 9 / 10).saturating_sub(300);
            let (mut text_used, mut json_used) = (0, 0);
            let mut rows = Vec::new();
            let fits = variables
                .iter()
                .take_while(|v| {
                    let size = v.size.map(|b| format!(" ({b} B)")).unwrap_or_default();
                    let row = format!("{}: {}{size} = {}\n", v.name, v.type_name, v.repr);
                    text_used += row.len();
                    json_used += serde_json::to_string(v).map_or(0, |j| j.len() + 1);
                    // At least one row, so a cursor always moves on.
                    let ok = (text_used <= room && json_used <= room) || rows.is_empty();
                    if ok {
                        rows.push(row);
                    }
                    ok
                })
                .count();
            let next_cursor = match variables.get(fits) {
                Some(v) => Some(v.name.clone()),
                None => next,
            };
            variables.truncate(fits);
            let mut text = format!("{total} variable(s) in session {session:?}");
            if let (Some(first), Some(last)) = (variables.first(), variables.last())
                && (next_cursor.is_some() || variables.len() as u64 != total)
            {
                let _ = write!(
                    text,
                    "; showing {} from {} to {}",
                    variables.len(),
                    first.name,
                    last.name
                );
            }
            text.push('\n');
            text.extend(rows);
            if let Some(c) = &next_cursor {
                let _ = writeln!(text, "more: python_vars action=list cursor={c:?}");
            }
            listing(
                text,
                &Vars {
                    session: session.into(),
                    variables: Some(variables),
                    total: Some(total),
                    next_cursor,
                    ..Default::default()
                },
            )
        }
        VarsOutcome::Get(mut v) => {
            // One budget per answer: the repr is cut at the edge, and a JSON copy that
            // would not fit beside it is left out (its size said).
            v.repr = cut(
                &v.repr,
                cap * 2 / 3,
                Whole::Elsewhere("print slices of it with python_exec"),
            );
            if v.repr.len() < v.chars as usize {
                v.truncated = true;
            }
            let json_bytes = v
                .json
                .as_ref()
                .and_then(|j| serde_json::to_string(j).ok())
                .map_or(0, |s| s.len());
            let mut more = String::new();
            if v.truncated {
                more = format!("\n… cut; the full repr has {} characters", v.chars);
            }
            let mut json_left_out = None;
            if json_bytes > cap / 4 {
                v.json = None;
                json_left_out = Some(json_bytes as u64);
                more.push_str(&format!(
                    "\nits JSON form ({json_bytes} bytes) is left out: write it to a file with python_exec (json.dump) and read that"
                ));
            }
            let text = format!("{}: {} = {}{more}", v.name, v.type_name, v.repr);
            listing(
                text,
                &Vars {
                    session: session.into(),
                    variable: Some(v),
                    json_left_out,
                    ..Default::default()
                },
            )
        }
        VarsOutcome::Set(name) => listing(
            format!("set {name} in session {session:?}"),
            &Vars {
                session: session.into(),
                set: Some(name),
                ..Default::default()
            },
        ),
        VarsOutcome::Deleted(name) => listing(
            format!("deleted {name} from session {session:?}"),
            &Vars {
                session: session.into(),
                deleted: Some(name),
                ..Default::default()
            },
        ),
        VarsOutcome::Cleared => listing(
            format!("cleared the variables of session {session:?}"),
            &Vars {
                session: session.into(),
                cleared: Some(true),
                ..Default::default()
            },
        ),
    }
}

pub(crate) fn history(
    session: &str,
    history: repl::History,
    note: Option<String>,
    cap: usize,
) -> CallToolResult {
    let repl::History { mut cells, dropped } = history;
    let head = cells.iter().find(|c| c.head).map(|c| cell_name(c.cell));
    // Within the answer budget: long cells cut, then the oldest left out.
    for c in &mut cells {
        c.code = cut(&c.code, cap / 8, Whole::Elsewhere("cut for this listing"));
    }
    let total = cells.len();
    let all = &cells;
    let render = |cells: &[HistoryEntry]| {
        let mut text = format!(
            "{total} cell(s) in session {session:?}; head: {}\n",
            head.as_deref().unwrap_or("none (empty state)")
        );
        if let Some(note) = &note {
            let _ = writeln!(text, "note: {note}");
        }
        if let Some(dropped) = &dropped {
            let _ = writeln!(text, "{dropped}");
        }
        if cells.len() < total {
            let _ = writeln!(
                text,
                "{} older cell(s) left out to fit the answer; showing the newest {}; more: python_history cursor={:?}",
                total - cells.len(),
                cells.len(),
                cell_name(all[total - cells.len() - 1].cell)
            );
        }
        for c in cells {
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
                "[{}{}] on {parent} · {} · {:.1} ms · {state}\n{}",
                cell_name(c.cell),
                if c.head { ", head" } else { "" },
                wire_name(&c.status),
                c.elapsed_ms,
                excerpt(&c.code)
            );
        }
        text
    };
    let mut from = 0;
    while from < cells.len()
        && (render(&cells[from..]).len() > cap * 9 / 10
            || serde_json::to_string(&cells[from..]).map_or(0, |j| j.len()) > cap * 9 / 10)
    {
        from += 1 + (cells.len() - from) / 8;
    }
    let from = from.min(cells.len().saturating_sub(1));
    let text = render(&cells[from..]);
    let next_cursor = from.checked_sub(1).map(|i| cell_name(cells[i].cell));
    let cells = cells.split_off(from);
    listing(
        text,
        &History {
            session: session.into(),
            head,
            left_out: (from > 0).then_some(from),
            next_cursor,
            dropped,
            state_note: note,
            cells,
        },
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

pub(crate) fn sessions(sessions: Vec<SessionInfo>) -> CallToolResult {
    let mut text = format!("{} session(s)\n", sessions.len());
    for s in &sessions {
        let mb = |b: u64| format!("{:.1} MB", b as f64 / 1e6);
        let mut mem = s.memory_bytes.map(mb).unwrap_or_else(|| "-".into());
        if let Some(held) = s.held_memory_bytes.filter(|_| s.snapshots > 0) {
            let _ = write!(mem, " ({} with {} snapshot(s))", mb(held), s.snapshots);
        }
        let _ = writeln!(
            text,
            "{}: {} · policy {} · pid {} · {mem} · idle {} s · {} cells",
            s.name,
            wire_name(&s.state),
            s.policy,
            s.worker_pid
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-".into()),
            s.idle_seconds,
            s.cells
        );
    }
    listing(text, &Sessions { sessions })
}

pub(crate) fn restarted(session: &str) -> CallToolResult {
    listing(
        format!("session {session:?} restarted: fresh worker, no variables"),
        &SessionDone {
            session: session.into(),
            restarted: Some(true),
            ..Default::default()
        },
    )
}

pub(crate) fn closed(session: &str) -> CallToolResult {
    listing(
        format!("session {session:?} closed"),
        &SessionDone {
            session: session.into(),
            closed: Some(true),
            ..Default::default()
        },
    )
}

/// One page of jobs ([`crate::jobs::JobStore::list_page`] already keeps it within the
/// response cap).
pub(crate) fn jobs(page: JobPage) -> CallToolResult {
    let JobPage { jobs, next_cursor } = page;
    let mut text = format!("{} job(s)\n", jobs.len());
    let mut shown = Vec::new();
    for j in jobs {
        let exit = j
            .exit_code
            .map(|c| format!(" exit {c}"))
            .unwrap_or_default();
        let sess = j
            .session
            .as_deref()
            .map(|s| format!(" [{s}]"))
            .unwrap_or_default();
        let line = format!(
            "{} {}{sess} {}{exit} · {} ms · out {} B, err {} B · {}\n",
            j.id, j.kind, j.status, j.elapsed_ms, j.stdout_bytes, j.stderr_bytes, j.label
        );
        text.push_str(&line);
        shown.push(j);
    }
    if let Some(c) = &next_cursor {
        let _ = writeln!(text, "more: call job_list with cursor={c:?} for older jobs");
    }
    listing(
        text,
        &Jobs {
            jobs: shown,
            next_cursor,
        },
    )
}

pub(crate) fn hits(
    job_id: &str,
    stream: Stream,
    pattern: &str,
    found: Found,
    cap: usize,
) -> CallToolResult {
    let Found {
        mut hits,
        matches,
        at_least,
        mut next_offset,
    } = found;
    // The hits were gathered within the budget; drop trailing ones if the words around
    // them still tip it over (the cursor then points at the first one dropped).
    let size = |h: &SearchHit| {
        h.text.len()
            + h.before
                .iter()
                .chain(&h.after)
                .map(|l| l.len() + 4)
                .sum::<usize>()
            + 40
    };
    let mut used = 0;
    let keep = hits
        .iter()
        .take_while(|h| {
            used += size(h);
            used <= cap * 9 / 10
        })
        .count()
        .max(1);
    if keep < hits.len() {
        next_offset = Some(hits[keep].offset);
        hits.truncate(keep);
    }
    let count = if at_least {
        format!("at least {matches}")
    } else {
        matches.to_string()
    };
    let mut text = format!(
        "{count} matching line(s) of {pattern:?} in {stream} of job {job_id}; showing {}",
        hits.len()
    );
    if let Some(o) = next_offset {
        let _ = write!(
            text,
            "; more: job_output with the same pattern and offset={o}"
        );
    }
    text.push('\n');
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
        &Output {
            job_id: job_id.into(),
            stream: Some(stream.to_string()),
            pattern: Some(pattern.into()),
            hits: Some(hits),
            matches: Some(matches),
            matches_at_least: Some(at_least),
            truncated: Some(next_offset.is_some()),
            next_offset,
            ..Default::default()
        },
    )
}

/// One image of a finished cell, as MCP image content (a scaled-down copy says so).
pub(crate) fn image(job_id: &str, img: ResultImage) -> CallToolResult {
    let px = |(w, h): (u32, u32)| format!("{w}×{h}");
    let mut text = format!("image {} of {} ({}", img.index, img.of, img.mime);
    if let Some(size) = img.size {
        let _ = write!(text, ", {}", px(size));
    }
    text.push(')');
    if let Some(o) = img.original {
        let _ = write!(
            text,
            ": scaled down from {} ({:.1} MB) to fit the answer; for the full image, save it to a file with python_exec",
            px((o.width, o.height)),
            o.bytes as f64 / 1e6
        );
    }
    let value = Output {
        job_id: job_id.into(),
        image: Some(img.index),
        images: Some(img.of),
        mime: Some(img.mime.clone()),
        width: img.size.map(|s| s.0),
        height: img.size.map(|s| s.1),
        original: img.original.map(|o| OriginalImage {
            width: o.width,
            height: o.height,
            bytes: o.bytes,
        }),
        ..Default::default()
    };
    structured(
        vec![
            ContentBlock::text(text),
            ContentBlock::image(img.data, img.mime),
        ],
        &value,
        false,
    )
}

pub(crate) fn chunk(chunk: Chunk) -> CallToolResult {
    let more = if chunk.end < chunk.total {
        format!(
            "; {} more bytes: call job_output with stream=\"{}\" offset={}",
            chunk.total - chunk.end,
            chunk.stream.as_str(),
            chunk.end
        )
    } else if chunk.eof {
        "; end of output".to_string()
    } else {
        "; the job is still writing".to_string()
    };
    let encoding = if chunk.base64 {
        " (not text: the bytes in base64)"
    } else {
        ""
    };
    let text = format!(
        "{} of job {} bytes [{}..{}) of {}{more}{encoding}\n{}",
        chunk.stream.as_str(),
        chunk.job_id,
        chunk.offset,
        chunk.end,
        chunk.total,
        chunk.text
    );
    let value = Output {
        job_id: chunk.job_id,
        stream: Some(chunk.stream.as_str().into()),
        offset: Some(chunk.offset),
        end: Some(chunk.end),
        total: Some(chunk.total),
        eof: Some(chunk.eof),
        text: Some(chunk.text),
        encoding: chunk.base64.then(|| "base64".into()),
        ..Default::default()
    };
    listing(text, &value)
}

pub(crate) fn pruned(pruned: Vec<String>) -> CallToolResult {
    listing(
        format!("pruned {} job(s): {}", pruned.len(), pruned.join(", ")),
        &Pruned { pruned },
    )
}

pub(crate) fn env_info(session: &str, info: EnvInfo) -> CallToolResult {
    let EnvInfo { uv, venv, uv_cache } = info;
    let mut text = String::new();
    let (uv, uv_error) = match uv {
        Ok(u) => {
            let _ = writeln!(text, "uv: {} ({})", u.version, u.path.display());
            (
                Some(Uv {
                    path: u.path.display().to_string(),
                    version: u.version.to_string(),
                }),
                None,
            )
        }
        Err(e) => {
            let _ = writeln!(text, "uv: missing: {e}");
            (None, Some(e.to_string()))
        }
    };
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
    let value = EnvReport {
        session: session.into(),
        uv,
        uv_error,
        venv: venv.as_ref().map(|v| Venv {
            root: v.root().display().to_string(),
            python: v.python().display().to_string(),
            python_version: v.python_version.clone(),
            site_packages: v.site_packages().display().to_string(),
        }),
        uv_cache: uv_cache.display().to_string(),
    };
    listing(text, &value)
}
