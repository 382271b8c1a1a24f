//! MCP resources: job output through the same pager as `job_output`
//! (`job://{job_id}/stdout{?offset,length}`, `.../stderr`), a session's cell history
//! (`session://{name}/history`), and the scripts `python_run_script` ran, saved with their
//! arguments (`script://{job_id}` as JSON to rerun from, `script://{job_id}/code` paged).
//! `resources/subscribe` on a job stream (or, from protocol 2026-07-28 on, a
//! `subscriptions/listen` naming job streams) sends `notifications/resources/updated` as
//! the stream grows and once when the job ends. Every read is bounded like a tool answer.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    ErrorCode, ListResourceTemplatesResult, ListResourcesResult, MetaObject, ReadResourceResult,
    Resource, ResourceContents, ResourceTemplate, ResourceUpdatedNotificationParam,
    SubscriptionFilter,
};
use rmcp::service::{SubscriptionContext, SubscriptionSink};
use rmcp::{ErrorData, Peer, RoleServer};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::app::App;
use crate::jobs::{JobFilter, Stream};

/// Most jobs and scripts `resources/list` names (newest first); older ones stay readable.
const LIST_JOBS: usize = 25;
const LIST_SCRIPTS: usize = 50;
/// Most live subscriptions one connection may hold.
const MAX_SUBSCRIPTIONS: usize = 64;
/// A subscription re-checks at least this often (a change it missed is found then).
const RECHECK: Duration = Duration::from_secs(2);
/// At most one `resources/updated` per subscription this often: a job that floods its
/// output must not flood the client with notifications too.
const MIN_GAP: Duration = Duration::from_millis(250);
/// How long a stream's size taken when a `subscriptions/listen` was accepted stays the
/// starting point of listens of it (see [`Baselines`]).
const BASELINE_KEPT: Duration = Duration::from_secs(10);

/// What a resource URI names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    Output {
        job: String,
        stream: Stream,
        offset: u64,
        length: Option<u64>,
    },
    History {
        session: String,
    },
    Script {
        job: String,
    },
    ScriptCode {
        job: String,
        offset: u64,
        length: Option<u64>,
    },
}

/// Resource not found (-32002), with the URI in `data.uri` as the spec's example has it.
fn not_found(uri: &str, message: String) -> ErrorData {
    ErrorData::resource_not_found(message, Some(json!({ "uri": uri })))
}

fn bad_uri(uri: &str, why: &str) -> ErrorData {
    not_found(
        uri,
        format!(
            "{why}: {uri:?}; resources are job://{{job_id}}/stdout|stderr[?offset=N&length=M], \
             session://{{name}}/history, script://{{job_id}}[/code]"
        ),
    )
}

fn plain_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s != "."
        && s != ".."
}

/// `offset` and `length` from a query string; anything else is refused.
fn range(uri: &str, query: Option<&str>) -> Result<(u64, Option<u64>), ErrorData> {
    let (mut offset, mut length) = (0, None);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let n: u64 = v
            .parse()
            .map_err(|_| bad_uri(uri, &format!("{k} must be a whole number")))?;
        match k {
            "offset" => offset = n,
            "length" => length = Some(n),
            _ => return Err(bad_uri(uri, &format!("unknown query parameter {k:?}"))),
        }
    }
    Ok((offset, length))
}

/// Parse a resource URI.
pub(crate) fn parse(uri: &str) -> Result<Target, ErrorData> {
    let (base, query) = match uri.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (uri, None),
    };
    if let Some(rest) = base.strip_prefix("job://") {
        let (job, stream) = rest
            .split_once('/')
            .ok_or_else(|| bad_uri(uri, "no stream"))?;
        let stream = match stream {
            "stdout" => Stream::Stdout,
            "stderr" => Stream::Stderr,
            _ => return Err(bad_uri(uri, "the stream is stdout or stderr")),
        };
        if !plain_name(job) {
            return Err(bad_uri(uri, "not a job id"));
        }
        let (offset, length) = range(uri, query)?;
        return Ok(Target::Output {
            job: job.into(),
            stream,
            offset,
            length,
        });
    }
    if let Some(rest) = base.strip_prefix("session://") {
        let session = rest
            .strip_suffix("/history")
            .filter(|s| plain_name(s) && query.is_none())
            .ok_or_else(|| bad_uri(uri, "not a session history"))?;
        return Ok(Target::History {
            session: session.into(),
        });
    }
    if let Some(rest) = base.strip_prefix("script://") {
        if let Some(job) = rest.strip_suffix("/code").filter(|j| plain_name(j)) {
            let (offset, length) = range(uri, query)?;
            return Ok(Target::ScriptCode {
                job: job.into(),
                offset,
                length,
            });
        }
        if plain_name(rest) && query.is_none() {
            return Ok(Target::Script { job: rest.into() });
        }
        return Err(bad_uri(uri, "not a saved script"));
    }
    Err(bad_uri(uri, "unknown resource"))
}

pub(crate) fn templates() -> ListResourceTemplatesResult {
    let t = |uri: &str, name: &str, desc: &str, mime: &str| {
        ResourceTemplate::new(uri, name)
            .with_description(desc)
            .with_mime_type(mime)
    };
    ListResourceTemplatesResult::with_all_items(vec![
        t(
            "job://{job_id}/stdout{?offset,length}",
            "job stdout",
            "A job's stdout, a byte range at a time (default: from 0, up to the answer size); \
             _meta gives offset, end, total, eof. Subscribe to be told as it grows.",
            "text/plain",
        ),
        t(
            "job://{job_id}/stderr{?offset,length}",
            "job stderr",
            "A job's stderr, paged like stdout.",
            "text/plain",
        ),
        t(
            "session://{session}/history",
            "session history",
            "The cells a Python session ran (most recent ones if long).",
            "text/plain",
        ),
        t(
            "script://{job_id}",
            "saved script",
            "A script python_run_script ran: its arguments as JSON, to pass to \
             python_run_script again (env values are not saved).",
            "application/json",
        ),
        t(
            "script://{job_id}/code{?offset,length}",
            "saved script code",
            "The inline source of a saved script, paged.",
            "text/x-python",
        ),
    ])
}

pub(crate) fn list(app: &App) -> ListResourcesResult {
    let mut out = Vec::new();
    for s in app.saved_scripts().into_iter().take(LIST_SCRIPTS) {
        out.push(
            Resource::new(
                format!("script://{}", s.job_id),
                format!("script {}", s.job_id),
            )
            .with_description(s.label)
            .with_mime_type("application/json"),
        );
    }
    for s in app.session_list() {
        out.push(
            Resource::new(
                format!("session://{}/history", s.name),
                format!("history of session {}", s.name),
            )
            .with_mime_type("text/plain"),
        );
    }
    let mut jobs = app.job_list(&JobFilter::default());
    jobs.sort_by_key(|j| std::cmp::Reverse(j.created_unix_ms));
    for j in jobs.into_iter().take(LIST_JOBS) {
        for (stream, bytes) in [("stdout", j.stdout_bytes), ("stderr", j.stderr_bytes)] {
            out.push(
                Resource::new(
                    format!("job://{}/{stream}", j.id),
                    format!("{} {stream} of job {}", j.status, j.id),
                )
                .with_description(j.label.clone())
                .with_mime_type("text/plain")
                .with_size(bytes),
            );
        }
    }
    ListResourcesResult::with_all_items(out)
}

fn meta(v: serde_json::Value) -> MetaObject {
    match v {
        serde_json::Value::Object(m) => MetaObject(m),
        _ => MetaObject(Default::default()),
    }
}

fn text(uri: &str, mime: &str, body: String, m: Option<serde_json::Value>) -> ReadResourceResult {
    let mut c = ResourceContents::text(body, uri).with_mime_type(mime);
    if let Some(m) = m {
        c = c.with_meta(meta(m));
    }
    ReadResourceResult::new(vec![c])
}

/// What the app could not find behind `uri`, as resource-not-found naming it.
fn app_error(uri: &str) -> impl Fn(crate::app::AppError) -> ErrorData + '_ {
    move |e| not_found(uri, e.to_string())
}

/// `[offset, offset + len)` of `s` at char boundaries, `len` capped at `cap`.
fn slice(s: &str, offset: u64, len: Option<u64>, cap: usize) -> (usize, usize) {
    let mut start = (offset as usize).min(s.len());
    while !s.is_char_boundary(start) {
        start -= 1;
    }
    let want = len.map(|l| l as usize).unwrap_or(cap).min(cap);
    let mut end = start.saturating_add(want).min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    (start, end)
}

pub(crate) async fn read(app: &App, uri: &str) -> Result<ReadResourceResult, ErrorData> {
    let cap = app.response_bytes();
    match parse(uri)? {
        Target::Output {
            job,
            stream,
            offset,
            length,
        } => {
            let chunk = app
                .job_read(
                    &job,
                    match stream {
                        Stream::Stdout => crate::app::OutputStream::Stdout,
                        Stream::Stderr => crate::app::OutputStream::Stderr,
                    },
                    offset,
                    length,
                )
                .map_err(app_error(uri))?;
            let name = if stream == Stream::Stdout {
                "stdout"
            } else {
                "stderr"
            };
            let next = (!chunk.eof && chunk.end < chunk.total)
                .then(|| format!("job://{job}/{name}?offset={}", chunk.end));
            let m = json!({
                "offset": chunk.offset, "end": chunk.end, "total": chunk.total,
                "eof": chunk.eof, "next": next,
            });
            if chunk.base64 {
                // Bytes that are not text: a blob, exactly as written.
                let c = ResourceContents::blob(chunk.text, uri)
                    .with_mime_type("application/octet-stream")
                    .with_meta(meta(m));
                return Ok(ReadResourceResult::new(vec![c]));
            }
            Ok(text(uri, "text/plain", chunk.text, Some(m)))
        }
        Target::History { session } => {
            let (history, _) = app
                .python_history(&session, None, None)
                .await
                .map_err(app_error(uri))?;
            let cells = history.cells;
            let mut shown = Vec::new();
            let mut used = 0usize;
            for c in cells.iter().rev() {
                let mut entry = String::new();
                let _ = writeln!(
                    entry,
                    "[{}] {:?} {:.1} ms\n{}",
                    c.cell, c.status, c.elapsed_ms, c.code
                );
                if used + entry.len() > cap && !shown.is_empty() {
                    break;
                }
                used += entry.len();
                shown.push(entry);
            }
            let hidden = cells.len() - shown.len();
            let mut body = format!("{} cell(s) in session {session:?}", cells.len());
            if hidden > 0 {
                let _ = write!(
                    body,
                    "; the {hidden} earliest not shown (python_history has them all)"
                );
            }
            body.push('\n');
            if let Some(dropped) = &history.dropped {
                body.push_str(dropped);
                body.push('\n');
            }
            for e in shown.iter().rev() {
                let (s, end) = slice(e, 0, None, cap);
                body.push_str(&e[s..end]);
            }
            Ok(text(uri, "text/plain", body, None))
        }
        Target::Script { job } => {
            let mut saved = app
                .saved_script(&job)
                .ok_or_else(|| bad_uri(uri, "no saved script by that job id"))?;
            let code_len = saved
                .arguments
                .get("code")
                .and_then(|c| c.as_str())
                .map(str::len)
                .unwrap_or(0);
            let mut note = None;
            if code_len > cap / 2 {
                saved.arguments.remove("code");
                note = Some(format!(
                    "the code ({code_len} bytes) is too long to show here: read \
                     script://{job}/code page by page and pass it as `code`"
                ));
            }
            let body = json!({
                "job_id": saved.job_id, "label": saved.label,
                "created_unix_ms": saved.created_unix_ms,
                "arguments": saved.arguments, "env_names": saved.env_names,
                "note": note,
            });
            let body = serde_json::to_string_pretty(&body).unwrap_or_default();
            let (s, e) = slice(&body, 0, None, cap);
            Ok(text(uri, "application/json", body[s..e].to_string(), None))
        }
        Target::ScriptCode {
            job,
            offset,
            length,
        } => {
            let saved = app
                .saved_script(&job)
                .ok_or_else(|| bad_uri(uri, "no saved script by that job id"))?;
            let code = saved
                .arguments
                .get("code")
                .and_then(|c| c.as_str())
                .ok_or_else(|| bad_uri(uri, "that script ran a file, not inline code"))?;
            let (s, e) = slice(code, offset, length, cap);
            Ok(text(
                uri,
                "text/x-python",
                code[s..e].to_string(),
                Some(json!({"offset": s, "end": e, "total": code.len(), "eof": e == code.len()})),
            ))
        }
    }
}

/// This connection's subscriptions, by URI.
#[derive(Debug, Default)]
pub(crate) struct Subscriptions {
    live: Mutex<HashMap<String, CancellationToken>>,
    baselines: Mutex<Baselines>,
}

/// The size of each job stream when a `subscriptions/listen` naming it was accepted. The
/// SDK acknowledges a subscription before [`Subscriptions::listen`] runs, and the client
/// may make the job write in between: that output is news, so a listen counts growth
/// from the size at acceptance, not from when its watcher starts. A size is kept
/// [`BASELINE_KEPT`] and shared by every listen of the URI accepted meanwhile (the
/// oldest size wins: at worst one notification too many, never one missed).
#[derive(Debug, Default)]
struct Baselines {
    taken: HashMap<String, (Instant, u64)>,
}

impl Baselines {
    fn record(&mut self, uri: &str, bytes: u64, now: Instant) {
        self.taken
            .retain(|_, (at, _)| now.saturating_duration_since(*at) < BASELINE_KEPT);
        self.taken.entry(uri.to_string()).or_insert((now, bytes));
    }

    fn get(&self, uri: &str, now: Instant) -> Option<u64> {
        self.taken
            .get(uri)
            .filter(|(at, _)| now.saturating_duration_since(*at) < BASELINE_KEPT)
            .map(|(_, bytes)| *bytes)
    }
}

/// How much of `stream` the job has written so far.
fn stream_bytes(summary: &crate::jobs::JobSummary, stream: Stream) -> u64 {
    match stream {
        Stream::Stdout => summary.stdout_bytes,
        Stream::Stderr => summary.stderr_bytes,
    }
}

impl Subscriptions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, CancellationToken>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn baselines(&self) -> std::sync::MutexGuard<'_, Baselines> {
        self.baselines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watch a job stream; `notifications/resources/updated` as it grows and at its end.
    pub(crate) fn subscribe(
        self: &Arc<Self>,
        app: Arc<App>,
        peer: Peer<RoleServer>,
        uri: String,
        closing: &CancellationToken,
    ) -> Result<(), ErrorData> {
        let Target::Output { job, stream, .. } = parse(&uri)? else {
            return Err(ErrorData::new(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "only job output can be subscribed to (job://{{job_id}}/stdout|stderr), not {uri:?}"
                ),
                None,
            ));
        };
        // The size now, before the answer goes: output after it is news to the client.
        let start = stream_bytes(&app.job_summary(&job).map_err(app_error(&uri))?, stream);
        let token = closing.child_token();
        {
            let mut live = self.lock();
            live.retain(|_, t| !t.is_cancelled());
            if live.contains_key(&uri) {
                return Ok(());
            }
            if live.len() >= MAX_SUBSCRIPTIONS {
                return Err(ErrorData::new(
                    ErrorCode::INVALID_REQUEST,
                    format!(
                        "at most {MAX_SUBSCRIPTIONS} subscriptions per connection; unsubscribe from finished jobs first"
                    ),
                    None,
                ));
            }
            live.insert(uri.clone(), token.clone());
        }
        let notifier = Notifier::Legacy(peer);
        tokio::spawn(watch(app, notifier, uri, job, stream, start, token));
        Ok(())
    }

    pub(crate) fn unsubscribe(&self, uri: &str) {
        if let Some(t) = self.lock().remove(uri) {
            t.cancel();
        }
    }
}

/// Where a watcher's notifications go.
enum Notifier {
    /// `resources/subscribe`: plain notifications to the peer.
    Legacy(Peer<RoleServer>),
    /// `subscriptions/listen`: through the subscription's sink (tagged with its id).
    Listen(SubscriptionSink),
}

impl Notifier {
    /// Send `resources/updated`; false once the receiver is gone.
    async fn updated(&self, uri: &str) -> bool {
        match self {
            Notifier::Legacy(peer) => peer
                .notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                .await
                .is_ok(),
            Notifier::Listen(sink) => sink.notify_resource_updated(uri).await.is_ok(),
        }
    }
}

impl Subscriptions {
    /// The part of a `subscriptions/listen` filter this server honours: job streams that
    /// exist (list-changed categories are not offered). Runs before the acknowledgement,
    /// so the sizes the listen counts from are taken here.
    pub(crate) fn accept(
        &self,
        app: &App,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let now = Instant::now();
        let mut uris = Vec::new();
        for uri in requested.resource_subscriptions.iter().flatten() {
            let Ok(Target::Output { job, stream, .. }) = parse(uri) else {
                continue;
            };
            let Ok(summary) = app.job_summary(&job) else {
                continue;
            };
            self.baselines()
                .record(uri, stream_bytes(&summary, stream), now);
            uris.push(uri.clone());
            if uris.len() == MAX_SUBSCRIPTIONS {
                break;
            }
        }
        let mut filter = SubscriptionFilter::new();
        filter.resource_subscriptions = Some(uris);
        Some(filter)
    }

    /// Serve one `subscriptions/listen` until the client cancels it or the connection goes.
    pub(crate) async fn listen(
        &self,
        app: Arc<App>,
        ctx: SubscriptionContext,
        closing: &CancellationToken,
    ) {
        let token = closing.child_token();
        let now = Instant::now();
        for uri in ctx.accepted().resource_subscriptions.iter().flatten() {
            let Ok(Target::Output { job, stream, .. }) = parse(uri) else {
                continue;
            };
            let start = match self.baselines().get(uri, now) {
                Some(bytes) => bytes,
                None => match app.job_summary(&job) {
                    Ok(summary) => stream_bytes(&summary, stream),
                    Err(_) => continue,
                },
            };
            let notifier = Notifier::Listen(ctx.sink().clone());
            tokio::spawn(watch(
                app.clone(),
                notifier,
                uri.clone(),
                job,
                stream,
                start,
                token.child_token(),
            ));
        }
        tokio::select! {
            _ = ctx.cancelled() => {}
            _ = token.cancelled() => {}
        }
        token.cancel();
    }
}

/// Notify `uri`'s subscriber whenever the stream has grown past `last` bytes (at most
/// once per [`MIN_GAP`]), and once more when the job ends.
async fn watch(
    app: Arc<App>,
    notifier: Notifier,
    uri: String,
    job: String,
    stream: Stream,
    mut last: u64,
    token: CancellationToken,
) {
    loop {
        let Ok(s) = app.job_summary(&job) else { return };
        let now = stream_bytes(&s, stream);
        let done = s.status.is_finished();
        if now != last || done {
            last = now;
            let sent = notifier.updated(&uri).await;
            if !sent || done {
                token.cancel();
                return;
            }
            // Then look again at once: output that came during the gap is news too.
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tokio::time::sleep(MIN_GAP) => continue,
            }
        }
        tokio::select! {
            _ = token.cancelled() => return,
            r = app.job_changed(&job, RECHECK) => if r.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listen counts from the size at acceptance, even when its watcher starts after
    /// the stream grew; a second listen accepted meanwhile shares the older size; stale
    /// sizes are neither used nor kept.
    #[test]
    fn a_listen_counts_from_the_size_at_acceptance() {
        let t0 = Instant::now();
        let mut b = Baselines::default();
        b.record("job://j1/stdout", 2, t0);
        b.record("job://j1/stdout", 4, t0 + Duration::from_secs(1));
        assert_eq!(
            b.get("job://j1/stdout", t0 + Duration::from_secs(2)),
            Some(2)
        );
        assert_eq!(b.get("job://j2/stdout", t0), None);
        let late = t0 + BASELINE_KEPT + Duration::from_secs(1);
        assert_eq!(b.get("job://j1/stdout", late), None);
        b.record("job://j2/stdout", 7, late);
        assert_eq!(b.taken.len(), 1, "{:?}", b.taken);
        assert_eq!(b.get("job://j2/stdout", late), Some(7));
    }

    #[test]
    fn uris_parse() {
        assert_eq!(
            parse("job://j3/stdout?offset=10&length=5").unwrap(),
            Target::Output {
                job: "j3".into(),
                stream: Stream::Stdout,
                offset: 10,
                length: Some(5)
            }
        );
        assert_eq!(
            parse("session://default/history").unwrap(),
            Target::History {
                session: "default".into()
            }
        );
        assert_eq!(
            parse("script://j9").unwrap(),
            Target::Script { job: "j9".into() }
        );
        assert!(matches!(
            parse("script://j9/code?offset=3").unwrap(),
            Target::ScriptCode { offset: 3, .. }
        ));
    }

    #[test]
    fn hostile_uris_are_refused() {
        for bad in [
            "job://j1/stdin",
            "job://../stdout",
            "job://j1/stdout?offset=-1",
            "job://j1/stdout?offset=1&x=2",
            "job://j1",
            "session://../history",
            "session://a/b/history",
            "script://../../etc/passwd",
            "script://j1?x=1",
            "file:///etc/passwd",
            "",
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::RESOURCE_NOT_FOUND, "{bad}");
            assert_eq!(e.data, Some(json!({ "uri": bad })), "{bad}");
        }
    }

    #[test]
    fn slices_keep_char_boundaries_and_the_cap() {
        let s = "aé€b";
        let (a, b) = slice(s, 2, None, 100);
        assert!(s.is_char_boundary(a) && s.is_char_boundary(b));
        assert_eq!(slice("abcdef", 1, Some(100), 3), (1, 4));
        assert_eq!(slice("abc", 99, None, 3), (3, 3));
    }
}
