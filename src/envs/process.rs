//! Running one uv process through the sandbox launcher: output pumped into an
//! [`EnvSink`] as it arrives, stderr lines offered to a line callback (progress
//! parsing), cancellation and a timeout that kill the whole process group.

use crate::sandbox::Io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

use super::{Canceller, EnvError, EnvSink, OutStream};
use crate::sandbox::{ExitReport, SandboxCommand, Termination};

/// How long to wait for the output pipes to drain after the process ended (a
/// grandchild that outlived it may hold them open).
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// How much of stderr's end is kept for error reporting.
const STDERR_TAIL: usize = 16 * 1024;

/// How a uv process ended.
#[derive(Debug, Clone, Default)]
pub struct RunOutcome {
    pub report: ExitReport,
    pub cancelled: bool,
    pub timed_out: bool,
    /// The last [`STDERR_TAIL`] bytes of stderr, for extracting uv's explanation.
    pub stderr_tail: String,
    /// What the job's network broker refused, in words (proxy mode only).
    pub denied: Vec<String>,
}

impl RunOutcome {
    pub fn exit_code(&self) -> Option<i32> {
        match self.report.termination {
            Termination::Exited(code) => Some(code),
            _ => None,
        }
    }
    pub fn signal(&self) -> Option<String> {
        match &self.report.termination {
            Termination::Signaled(s) => Some(s.clone()),
            _ => None,
        }
    }
    pub fn success(&self) -> bool {
        self.exit_code() == Some(0) && !self.cancelled && !self.timed_out
    }
}

/// Called with each complete stderr line (without the newline).
pub type LineHook = Box<dyn FnMut(&str) + Send>;

/// Spawn `cmd` and run it to the end. stdout/stderr are set here (piped); stdin is
/// closed. Must be called inside a tokio runtime.
pub async fn run(
    mut cmd: SandboxCommand,
    sink: Arc<dyn EnvSink>,
    mut on_stderr_line: Option<LineHook>,
    cancel: &Canceller,
    timeout: Option<Duration>,
) -> Result<RunOutcome, EnvError> {
    cmd.stdin(Io::Null).stdout(Io::Piped).stderr(Io::Piped);
    let started = Instant::now();
    let mut child = cmd.spawn()?;
    let denials = child.network_denials();
    // Kills the process group and the job's cgroup while `wait` owns the child.
    let killer = child.killer();
    let tail = Arc::new(Mutex::new(Vec::<u8>::new()));

    let stdout = child
        .stdout
        .take()
        .map(tokio::process::ChildStdout::from_std);
    let stderr = child
        .stderr
        .take()
        .map(tokio::process::ChildStderr::from_std);
    let out_task = match stdout {
        Some(Ok(pipe)) => {
            let sink = sink.clone();
            Some(tokio::spawn(pump(pipe, move |chunk| {
                sink.output(OutStream::Stdout, chunk)
            })))
        }
        _ => None,
    };
    let err_task = match stderr {
        Some(Ok(pipe)) => {
            let sink = sink.clone();
            let tail = tail.clone();
            let mut partial: Vec<u8> = Vec::new();
            Some(tokio::spawn(pump(pipe, move |chunk| {
                sink.output(OutStream::Stderr, chunk);
                keep_tail(&tail, chunk);
                if let Some(hook) = on_stderr_line.as_mut() {
                    partial.extend_from_slice(chunk);
                    while let Some(nl) = partial.iter().position(|&b| b == b'\n') {
                        let line: Vec<u8> = partial.drain(..=nl).collect();
                        hook(String::from_utf8_lossy(&line).trim_end());
                    }
                }
            })))
        }
        _ => None,
    };

    if cancel.is_cancelled() {
        killer.kill_all();
    }
    let wait = child.wait();
    tokio::pin!(wait);
    let deadline = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let (mut cancelled, mut timed_out) = (false, false);
    let mut report = loop {
        tokio::select! {
            report = &mut wait => break report,
            () = cancel.cancelled(), if !cancelled => { cancelled = true; killer.kill_all(); }
            () = &mut deadline, if !timed_out => { timed_out = true; killer.kill_all(); }
        }
    };
    let drain_until = tokio::time::Instant::now() + DRAIN_GRACE;
    for task in [out_task, err_task].into_iter().flatten() {
        let abort = task.abort_handle();
        if tokio::time::timeout_at(drain_until, task).await.is_err() {
            abort.abort();
        }
    }
    if report.wall.is_zero() {
        report.wall = started.elapsed();
    }
    let stderr_tail = tail
        .lock()
        .map(|t| String::from_utf8_lossy(&t).into_owned())
        .unwrap_or_default();
    let denied = denials
        .map(|d| d.lock().map(|d| d.clone()).unwrap_or_default())
        .unwrap_or_default();
    Ok(RunOutcome {
        report,
        cancelled,
        timed_out,
        stderr_tail,
        denied,
    })
}

async fn pump<R: tokio::io::AsyncRead + Unpin>(mut pipe: R, mut each: impl FnMut(&[u8])) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => each(&buf[..n]),
        }
    }
}

fn keep_tail(tail: &Mutex<Vec<u8>>, chunk: &[u8]) {
    if let Ok(mut t) = tail.lock() {
        t.extend_from_slice(chunk);
        if t.len() > STDERR_TAIL {
            let cut = t.len() - STDERR_TAIL;
            t.drain(..cut);
        }
    }
}
