//! The stdio transport: newline-delimited JSON-RPC on stdin/stdout, with a line-level
//! validator in front of rmcp so every line gets an answer.
//!
//! rmcp's own stdio codec drops lines it cannot parse without a reply (invalid JSON,
//! invalid UTF-8, lone surrogates, over-deep nesting, numbers out of range), and answers
//! malformed `tools/call` params with "method not found". Here a reader task parses each
//! line strictly ([`validate_line`]): good messages go to rmcp, bad ones are answered at
//! once with a JSON-RPC error (-32700 parse error, -32600 invalid request, -32602 invalid
//! params) carrying the request's id whenever it can be read. Replies from rmcp and from
//! the validator go through one writer task, so lines never interleave. A line longer
//! than [`MAX_LINE`] is skipped without being buffered and answered with an error.

use std::io;

use rmcp::RoleServer;
use rmcp::model::{ClientRequest, JsonRpcMessage};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value, json};
use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt,
};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::log_limit::{self, Throttle};

/// Longest request line accepted (bytes, without the newline): 16 MiB. Longer lines are
/// answered with -32600 and skipped.
pub(crate) const MAX_LINE: usize = 16 << 20;
/// JSON nesting deeper than this (the whole message counted: 127 levels of objects and
/// arrays) is a parse error: serde_json's recursion limit.
pub(crate) const MAX_DEPTH: usize = 127;

const PARSE_ERROR: i32 = -32700;
const INVALID_REQUEST: i32 = -32600;
const INVALID_PARAMS: i32 = -32602;

/// Client → server request methods of MCP: a request naming one of these whose params do
/// not fit is answered "invalid params", not "method not found".
const KNOWN_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "completion/complete",
    "logging/setLevel",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "tools/call",
    "tools/list",
];

/// What to do with one input line.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// A well-formed message for rmcp.
    Pass(Box<RxJsonRpcMessage<RoleServer>>),
    /// Answer with this JSON-RPC error object (a complete message, without newline).
    Reply(Value),
    /// Nothing to do (a blank line).
    Ignore,
    /// A malformed notification: dropped unanswered (JSON-RPC: a server never replies
    /// to a notification), with this reason logged.
    Drop(String),
}

fn error_reply(id: Value, code: i32, message: impl Into<String>) -> Verdict {
    Verdict::Reply(json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": code, "message": message.into() },
    }))
}

/// Judge one line (without its newline).
pub(crate) fn validate_line(line: &[u8]) -> Verdict {
    let line = line.trim_ascii();
    if line.is_empty() {
        return Verdict::Ignore;
    }
    let Ok(text) = std::str::from_utf8(line) else {
        return error_reply(
            recover_id(line),
            PARSE_ERROR,
            "parse error: the line is not valid UTF-8; send one JSON-RPC message per line, UTF-8 encoded",
        );
    };
    let value = match serde_json::from_str::<Strict>(text) {
        Ok(Strict(v)) => v,
        Err(e) => {
            return error_reply(
                recover_id(line),
                PARSE_ERROR,
                format!(
                    "parse error: {e} (lone surrogates, duplicate keys, numbers out of range and \
                     nesting deeper than {MAX_DEPTH} are rejected); send one JSON-RPC message per line"
                ),
            );
        }
    };
    let Value::Object(map) = &value else {
        return error_reply(
            Value::Null,
            INVALID_REQUEST,
            "invalid request: a JSON-RPC message must be a JSON object (batches are not supported)",
        );
    };
    let id = match map.get("id") {
        None => None,
        Some(v @ Value::String(_)) => Some(v.clone()),
        Some(Value::Number(n)) if n.is_i64() => Some(Value::Number(n.clone())),
        Some(other) => {
            // An integer beyond i64 (up to u64) is echoed as given; anything else
            // (fractions, objects, integers beyond u64, read as floats) cannot be.
            let echo = match other {
                Value::Number(n) if n.is_u64() => other.clone(),
                _ => Value::Null,
            };
            return error_reply(
                echo,
                INVALID_REQUEST,
                format!(
                    "invalid request: `id` must be a string or an integer from -2^63 to \
                     2^63-1, got {other}"
                ),
            );
        }
    };
    let notification = id.is_none() && matches!(map.get("method"), Some(Value::String(_)));
    match validate_message(value, id) {
        // Whatever is wrong with a notification, it is never answered.
        Verdict::Reply(v) if notification => Verdict::Drop(
            v["error"]["message"]
                .as_str()
                .unwrap_or("malformed notification")
                .to_string(),
        ),
        other => other,
    }
}

/// The checks of a message (a JSON object) whose `id`, if any, is valid.
fn validate_message(value: Value, id: Option<Value>) -> Verdict {
    let Value::Object(map) = &value else {
        return error_reply(
            Value::Null,
            INVALID_REQUEST,
            "invalid request: not an object",
        );
    };
    let reply_id = id.clone().unwrap_or(Value::Null);
    if map.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return error_reply(
            reply_id,
            INVALID_REQUEST,
            "invalid request: `jsonrpc` must be \"2.0\"",
        );
    }
    match map.get("method") {
        Some(Value::String(method)) => {
            if let Some(p) = map.get("params")
                && !p.is_object()
            {
                return error_reply(
                    reply_id,
                    INVALID_REQUEST,
                    format!("invalid request: `params` of {method:?} must be an object, got {p}"),
                );
            }
            let method = method.clone();
            let params = map.get("params").cloned();
            match serde_json::from_value::<RxJsonRpcMessage<RoleServer>>(value) {
                Ok(JsonRpcMessage::Request(r))
                    if matches!(r.request, ClientRequest::CustomRequest(_))
                        && KNOWN_METHODS.contains(&method.as_str()) =>
                {
                    error_reply(
                        reply_id,
                        INVALID_PARAMS,
                        format!(
                            "invalid params for {method}: {}",
                            params_problem(&method, params)
                        ),
                    )
                }
                Ok(m) => Verdict::Pass(Box::new(m)),
                Err(e) => error_reply(reply_id, INVALID_REQUEST, format!("invalid request: {e}")),
            }
        }
        Some(other) => error_reply(
            reply_id,
            INVALID_REQUEST,
            format!("invalid request: `method` must be a string, got {other}"),
        ),
        None if id.is_none() => error_reply(
            Value::Null,
            INVALID_REQUEST,
            "invalid request: neither a request (`method`) nor a response (`id` with `result` or `error`)",
        ),
        None => match serde_json::from_value::<RxJsonRpcMessage<RoleServer>>(value) {
            Ok(m) => Verdict::Pass(Box::new(m)),
            Err(e) => error_reply(reply_id, INVALID_REQUEST, format!("invalid response: {e}")),
        },
    }
}

/// Why the params of a known method did not parse, in words.
fn params_problem(method: &str, params: Option<Value>) -> String {
    let params = params.unwrap_or(Value::Null);
    let err = match method {
        "tools/call" => serde_json::from_value::<rmcp::model::CallToolRequestParams>(params).err(),
        "initialize" => {
            serde_json::from_value::<rmcp::model::InitializeRequestParams>(params).err()
        }
        _ => None,
    };
    match err {
        Some(e) => e.to_string(),
        None => "they do not match the method's schema".into(),
    }
}

/// The request's top-level `"id"` (an integer or a string), read from the start of a line
/// that may be cut or otherwise broken; `null` when it cannot be read.
pub(crate) fn recover_id(line: &[u8]) -> Value {
    let mut i = 0;
    let skip_ws = |i: &mut usize| {
        while *i < line.len() && line[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    skip_ws(&mut i);
    if line.get(i) != Some(&b'{') {
        return Value::Null;
    }
    let (mut depth, mut key_next) = (0usize, false);
    while i < line.len() {
        match line[i] {
            b'{' | b'[' => {
                depth += 1;
                key_next = depth == 1;
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b',' if depth == 1 => key_next = true,
            b':' if depth == 1 => key_next = false,
            b'"' => {
                let end = string_end(line, i);
                if depth == 1 && key_next && &line[i..end] == b"\"id\"" {
                    let mut j = end;
                    skip_ws(&mut j);
                    if line.get(j) != Some(&b':') {
                        return Value::Null;
                    }
                    j += 1;
                    skip_ws(&mut j);
                    return id_value(line, j);
                }
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Value::Null
}

/// Index just past the string literal starting at `start` (a `"`), or the end of input.
fn string_end(line: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < line.len() {
        match line[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    line.len()
}

fn id_value(line: &[u8], at: usize) -> Value {
    match line.get(at) {
        Some(b'"') => {
            let end = string_end(line, at);
            match serde_json::from_slice::<Value>(&line[at..end]) {
                Ok(v @ Value::String(_)) => v,
                _ => Value::Null,
            }
        }
        Some(b) if *b == b'-' || b.is_ascii_digit() => {
            let end = line[at..]
                .iter()
                .position(|b| !(*b == b'-' || b.is_ascii_digit()))
                .map_or(line.len(), |p| at + p);
            // A number followed by `.`/`e` is not an integer id.
            if matches!(line.get(end), Some(b'.' | b'e' | b'E')) {
                return Value::Null;
            }
            let digits = std::str::from_utf8(&line[at..end]).ok();
            digits
                .and_then(|s| s.parse::<i64>().ok())
                .map(Value::from)
                .or_else(|| digits.and_then(|s| s.parse::<u64>().ok()).map(Value::from))
                .unwrap_or(Value::Null)
        }
        _ => Value::Null,
    }
}

/// A JSON value parsed strictly: duplicate object keys are an error (serde_json would keep
/// the last one silently), and so are non-finite numbers.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("number out of range"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(de::Error::custom(format!("duplicate key {key:?}")));
            }
            let Strict(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// stdin and stdout as the transport reads and writes them.
pub(crate) type Input = Box<dyn AsyncRead + Unpin + Send>;
pub(crate) type Output = Box<dyn AsyncWrite + Unpin + Send>;

/// stdin and stdout for the transport. When they are pipes or Unix stream sockets (how
/// MCP clients start a server: pipes from Python's SDK, socket pairs from Node's), the
/// runtime reads and writes them itself, when its event loop says they are ready;
/// tokio's `stdin()`/`stdout()` hand every read and every write to a blocking-pool
/// thread instead, a wake-up of that thread and one back for each message in either
/// direction (measured: 6 context switches of the server per trivial call instead of
/// 14, and ~60 µs less CPU). Anything else (a terminal, a file, a TCP socket) keeps
/// tokio's blocking-thread I/O. See [`StdioFlags`] for the non-blocking mode this sets.
pub(crate) fn std_streams() -> (Input, Output) {
    use std::os::fd::AsFd;

    let input = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| event_reader(fd).ok());
    let output = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| event_writer(fd).ok());
    (
        input.unwrap_or_else(|| Box::new(tokio::io::stdin())),
        output.unwrap_or_else(|| Box::new(tokio::io::stdout())),
    )
}

/// What kind of stream a descriptor is, for [`std_streams`].
#[derive(Debug, PartialEq)]
enum StreamKind {
    Fifo,
    UnixStream,
    Other,
}

fn stream_kind(fd: &std::os::fd::OwnedFd) -> StreamKind {
    use nix::sys::socket::{AddressFamily, SockaddrLike, SockaddrStorage, sockopt};
    use nix::sys::stat::{SFlag, fstat};

    let Ok(st) = fstat(fd) else {
        return StreamKind::Other;
    };
    match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
        SFlag::S_IFIFO => StreamKind::Fifo,
        SFlag::S_IFSOCK => {
            let stream = nix::sys::socket::getsockopt(fd, sockopt::SockType)
                .is_ok_and(|t| t == nix::sys::socket::SockType::Stream);
            let unix = nix::sys::socket::getsockname::<SockaddrStorage>(
                std::os::fd::AsRawFd::as_raw_fd(fd),
            )
            .is_ok_and(|a| a.family() == Some(AddressFamily::Unix));
            if stream && unix {
                StreamKind::UnixStream
            } else {
                StreamKind::Other
            }
        }
        _ => StreamKind::Other,
    }
}

fn event_reader(fd: std::os::fd::OwnedFd) -> io::Result<Input> {
    match stream_kind(&fd) {
        StreamKind::Fifo => Ok(Box::new(tokio::net::unix::pipe::Receiver::from_owned_fd(
            reopened(fd, libc::O_RDONLY),
        )?)),
        StreamKind::UnixStream => Ok(Box::new(unix_stream(fd)?)),
        StreamKind::Other => Err(io::Error::other("not a pipe or a Unix stream socket")),
    }
}

fn event_writer(fd: std::os::fd::OwnedFd) -> io::Result<Output> {
    match stream_kind(&fd) {
        StreamKind::Fifo => Ok(Box::new(tokio::net::unix::pipe::Sender::from_owned_fd(
            reopened(fd, libc::O_WRONLY),
        )?)),
        StreamKind::UnixStream => Ok(Box::new(unix_stream(fd)?)),
        StreamKind::Other => Err(io::Error::other("not a pipe or a Unix stream socket")),
    }
}

/// A pipe opened anew through `/proc/self/fd` (`access`: its direction): an open file
/// of the server's own, so the non-blocking mode it is served in is nobody else's — not
/// even after a SIGKILL, when nothing could put a shared file's mode back. `fd` itself
/// if that cannot be done (its mode is then put back at exit, [`StdioFlags`]).
fn reopened(fd: std::os::fd::OwnedFd, access: libc::c_int) -> std::os::fd::OwnedFd {
    use std::os::fd::{AsRawFd, FromRawFd};

    let path = format!("/proc/self/fd/{}\0", fd.as_raw_fd());
    // SAFETY: open(2) of a NUL-terminated path we own; a new descriptor or -1.
    let new = unsafe {
        libc::open(
            path.as_ptr().cast(),
            access | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if new < 0 {
        return fd;
    }
    // SAFETY: `new` was just opened by us and is owned by nothing else.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(new) }
}

fn unix_stream(fd: std::os::fd::OwnedFd) -> io::Result<tokio::net::UnixStream> {
    let std = std::os::unix::net::UnixStream::from(fd);
    std.set_nonblocking(true)?;
    tokio::net::UnixStream::from_std(std)
}

/// The file status flags of stdin and stdout as the server found them, put back when
/// dropped. [`std_streams`] makes a socket (or a pipe it could not open anew) non-blocking,
/// and that mode belongs to the open file, which the process that started the server may
/// share (a shell running `server; cat`): it must find its stdin as it was. Drop it after the runtime is shut
/// down (a read still registered with the runtime must never find the descriptor
/// blocking again).
pub(crate) struct StdioFlags([Option<libc::c_int>; 2]);

impl StdioFlags {
    pub(crate) fn save() -> StdioFlags {
        // SAFETY: F_GETFL on descriptors 0 and 1 reads flags; an unused one fails (-1).
        let get = |fd| match unsafe { libc::fcntl(fd, libc::F_GETFL) } {
            -1 => None,
            flags => Some(flags),
        };
        StdioFlags([get(0), get(1)])
    }
}

impl Drop for StdioFlags {
    fn drop(&mut self) {
        for (fd, saved) in (0..).zip(self.0) {
            let Some(saved) = saved else { continue };
            // SAFETY: F_GETFL/F_SETFL on descriptor 0 or 1, which this process never
            // closes; only O_NONBLOCK is changed back.
            unsafe {
                let now = libc::fcntl(fd, libc::F_GETFL);
                if now != -1 && (now ^ saved) & libc::O_NONBLOCK != 0 {
                    libc::fcntl(
                        fd,
                        libc::F_SETFL,
                        (now & !libc::O_NONBLOCK) | (saved & libc::O_NONBLOCK),
                    );
                }
            }
        }
    }
}

/// One line for the writer task, with an optional acknowledgement of its write.
type Outgoing = (Vec<u8>, Option<oneshot::Sender<io::Result<()>>>);

/// The transport rmcp serves on: messages come from the reader task, replies go to the
/// writer task.
pub(crate) struct StdioTransport {
    incoming: mpsc::Receiver<RxJsonRpcMessage<RoleServer>>,
    outgoing: mpsc::UnboundedSender<Outgoing>,
}

impl StdioTransport {
    /// Start the reader and writer tasks on `input`/`output`. `on_eof` is cancelled when
    /// the input ends (the client is gone).
    pub(crate) fn start<R, W>(input: R, output: W, on_eof: CancellationToken) -> StdioTransport
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let (in_tx, in_rx) = mpsc::channel(64);
        tokio::spawn(write_lines(output, out_rx));
        let replies = out_tx.clone();
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::with_capacity(1 << 16, input);
            if let Err(e) = read_lines(&mut reader, &in_tx, &replies).await {
                tracing::debug!(error = %e, "stdin read failed");
            }
            on_eof.cancel();
        });
        StdioTransport {
            incoming: in_rx,
            outgoing: out_tx,
        }
    }
}

async fn write_lines<W: AsyncWrite + Unpin>(
    mut output: W,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
) {
    while let Some((line, ack)) = rx.recv().await {
        let r = async {
            output.write_all(&line).await?;
            output.flush().await
        }
        .await;
        let failed = r.is_err();
        if let Some(ack) = ack {
            let _ = ack.send(r);
        }
        if failed {
            break;
        }
    }
}

/// Read lines until end of input, judging each one.
async fn read_lines<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    messages: &mpsc::Sender<RxJsonRpcMessage<RoleServer>>,
    replies: &mpsc::UnboundedSender<Outgoing>,
) -> io::Result<()> {
    let mut line = Vec::new();
    // One warning per 10 s about malformed input, the next saying how many were left out:
    // a client (or anything on the pipe) sending garbage must not fill stderr.
    let warned = Throttle::new(log_limit::EVERY);
    loop {
        line.clear();
        let n = (&mut *reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            return Ok(());
        }
        let verdict = if line.len() > MAX_LINE && !line.ends_with(b"\n") {
            let id = recover_id(&line);
            let skipped = line.len() as u64 + skip_line(reader).await?;
            if let Some(n) = warned.ready() {
                tracing::warn!(
                    bytes = skipped,
                    "skipped a request line over the size limit{}",
                    log_limit::left_out(n)
                );
            }
            error_reply(
                id,
                INVALID_REQUEST,
                format!(
                    "invalid request: the line is {skipped} bytes or more, over the limit of \
                     {MAX_LINE} bytes (16 MiB) per message; send large data as a file in the workspace"
                ),
            )
        } else {
            validate_line(&line)
        };
        match verdict {
            Verdict::Pass(m) => {
                if messages.send(*m).await.is_err() {
                    return Ok(()); // rmcp stopped serving
                }
            }
            Verdict::Reply(reply) => {
                if let Some(n) = warned.ready() {
                    tracing::warn!(reply = %reply, "answered a malformed request line{}", log_limit::left_out(n));
                }
                let mut bytes = serde_json::to_vec(&reply).map_err(io::Error::other)?;
                bytes.push(b'\n');
                if replies.send((bytes, None)).is_err() {
                    return Ok(());
                }
            }
            Verdict::Drop(why) => {
                if let Some(n) = warned.ready() {
                    tracing::warn!(
                        "dropped a malformed notification (not answered): {why}{}",
                        log_limit::left_out(n)
                    );
                }
            }
            Verdict::Ignore => {}
        }
    }
}

/// Discard input up to and including the next newline; returns the bytes discarded.
async fn skip_line<R: AsyncBufRead + Unpin>(reader: &mut R) -> io::Result<u64> {
    let mut skipped = 0u64;
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            return Ok(skipped);
        }
        match buf.iter().position(|b| *b == b'\n') {
            Some(p) => {
                reader.consume(p + 1);
                return Ok(skipped + p as u64);
            }
            None => {
                let n = buf.len();
                reader.consume(n);
                skipped += n as u64;
            }
        }
    }
}

impl Transport<RoleServer> for StdioTransport {
    type Error = io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), io::Error>> + Send + 'static {
        let outgoing = self.outgoing.clone();
        async move {
            let mut line = serde_json::to_vec(&item).map_err(io::Error::other)?;
            line.push(b'\n');
            let (ack, done) = oneshot::channel();
            let gone = || io::Error::new(io::ErrorKind::BrokenPipe, "the stdout writer ended");
            outgoing.send((line, Some(ack))).map_err(|_| gone())?;
            done.await.unwrap_or_else(|_| Err(gone()))
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleServer>>> + Send {
        self.incoming.recv()
    }

    async fn close(&mut self) -> Result<(), io::Error> {
        self.incoming.close();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(line: &str) -> (i64, Value) {
        match validate_line(line.as_bytes()) {
            Verdict::Reply(v) => (v["error"]["code"].as_i64().unwrap(), v["id"].clone()),
            other => panic!("{line:?} was not answered: {other:?}"),
        }
    }

    #[test]
    fn malformed_lines_are_answered_with_the_right_code_and_id() {
        assert_eq!(reply("{not json"), (-32700, Value::Null));
        assert_eq!(reply("[1,2"), (-32700, Value::Null));
        let lone = r#"{"jsonrpc":"2.0","id":4,"method":"ping","params":{"x":"\ud800"}}"#;
        assert_eq!(reply(lone), (-32700, json!(4)));
        let dup = r#"{"jsonrpc":"2.0","id":5,"id":6,"method":"ping"}"#;
        assert_eq!(reply(dup), (-32700, json!(5)));
        let big = r#"{"jsonrpc":"2.0","id":"a","method":"ping","params":{"x":1e999}}"#;
        assert_eq!(reply(big), (-32700, json!("a")));
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"ping","params":{{"x":{}1{}}}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        assert_eq!(reply(&deep), (-32700, json!(7)));
        assert_eq!(reply("[]"), (-32600, Value::Null));
        assert_eq!(reply("3"), (-32600, Value::Null));
        let params = r#"{"jsonrpc":"2.0","id":8,"method":"tools/list","params":"x"}"#;
        assert_eq!(reply(params), (-32600, json!(8)));
        let call = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":5}}"#;
        assert_eq!(reply(call), (-32602, json!(9)));
        let ver = r#"{"jsonrpc":"1.0","id":10,"method":"ping"}"#;
        assert_eq!(reply(ver), (-32600, json!(10)));
        let bad_id = r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#;
        assert_eq!(reply(bad_id), (-32600, Value::Null));
        assert!(validate_line(b"\xff\xfe{}").is_parse_error_with_null_id());
    }

    impl Verdict {
        fn is_parse_error_with_null_id(&self) -> bool {
            matches!(self, Verdict::Reply(v) if v["error"]["code"] == -32700 && v["id"].is_null())
        }
    }

    #[test]
    fn malformed_notifications_are_never_answered() {
        for line in [
            r#"{"jsonrpc":"2.0","method":"notifications/initialized","params":[1]}"#,
            r#"{"jsonrpc":"1.0","method":"notifications/cancelled"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/x","params":"text"}"#,
        ] {
            assert!(
                matches!(validate_line(line.as_bytes()), Verdict::Drop(_)),
                "{line}"
            );
        }
    }

    #[test]
    fn integer_ids_beyond_i64_are_echoed_in_the_error() {
        let big = r#"{"jsonrpc":"2.0","id":18446744073709551615,"method":"ping"}"#;
        assert_eq!(reply(big), (-32600, json!(18446744073709551615u64)));
        assert_eq!(
            recover_id(br#"{"id":18446744073709551615,"x":"#),
            json!(18446744073709551615u64)
        );
        // Beyond u64 a number is a float to us: the id cannot be told, so it is null.
        let huge = r#"{"jsonrpc":"2.0","id":1e30,"method":"ping"}"#;
        assert_eq!(reply(huge), (-32600, Value::Null));
    }

    #[test]
    fn nesting_depth_limit_is_exactly_max_depth() {
        // The whole message counts: the top-level object, `params`, then `x`'s arrays.
        let at = |levels: usize| {
            format!(
                r#"{{"jsonrpc":"2.0","id":7,"method":"ping","params":{{"x":{}1{}}}}}"#,
                "[".repeat(levels - 2),
                "]".repeat(levels - 2)
            )
        };
        assert!(matches!(
            validate_line(at(MAX_DEPTH).as_bytes()),
            Verdict::Pass(_)
        ));
        assert_eq!(reply(&at(MAX_DEPTH + 1)), (-32700, json!(7)));
    }

    #[test]
    fn good_lines_pass_and_blank_lines_are_ignored() {
        let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        assert!(matches!(validate_line(ping), Verdict::Pass(_)));
        let note = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        assert!(matches!(validate_line(note), Verdict::Pass(_)));
        let call = br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"python_exec","arguments":{"code":"1"}}}"#;
        assert!(matches!(validate_line(call), Verdict::Pass(_)));
        assert!(matches!(validate_line(b"  \r"), Verdict::Ignore));
    }

    #[test]
    fn ids_are_recovered_from_broken_prefixes() {
        assert_eq!(
            recover_id(br#"{"jsonrpc":"2.0","id":42,"params":{"x":"#),
            json!(42)
        );
        assert_eq!(recover_id(br#" { "id" : "req-1", "#), json!("req-1"));
        // Only the top-level key counts, not one inside params or a string.
        assert_eq!(
            recover_id(br#"{"params":{"id":1},"note":"\"id\":2","id":3,"#),
            json!(3)
        );
        assert_eq!(recover_id(br#"{"params":{"id":1},"#), Value::Null);
        assert_eq!(recover_id(br#"{"id":1.5}"#), Value::Null);
        assert_eq!(recover_id(b"garbage"), Value::Null);
    }
}
