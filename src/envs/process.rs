//! Running one uv process through the sandbox launcher: output pumped into an
//! [`EnvSink`] as it arrives, stderr lines offered to a line callback (progress
//! parsing), cancellation, a timeout and the stores' disk bound ([`DiskWatch`]) that
//! kill the whole process group.

use crate::sandbox::Io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

use super::store::{DiskHit, Lease};
use super::{Canceller, EnvError, EnvSink, OutStream};
use crate::sandbox::{ExitReport, LimitHit, ResolvedPolicy, SandboxCommand, Termination};

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
    /// The process was killed at its stores' disk bound.
    pub disk: Option<DiskHit>,
}

/// The stores a step writes, measured while it runs against its owner's bounds.
pub struct DiskWatch<'a> {
    pub lease: &'a Lease,
    /// The trees the step can write (the uv cache, a venv, a transient environment, a
    /// temp dir on the host).
    pub writable: Vec<PathBuf>,
}

impl<'a> DiskWatch<'a> {
    /// The step writes `stores` and, under `policy`, maybe its temp dir on the host.
    pub fn new(lease: &'a Lease, mut stores: Vec<PathBuf>, policy: &ResolvedPolicy) -> Self {
        stores.extend(host_tmp(policy));
        DiskWatch {
            lease,
            writable: stores,
        }
    }
}

/// The private temp dir of a job under `policy` when it is a host directory (no tmpfs of
/// `tmp_size` in the job's view): then it counts among what the job writes.
pub fn host_tmp(policy: &ResolvedPolicy) -> Option<PathBuf> {
    let tmpfs = policy.limits.tmp_size_bytes.is_some() && !policy.filesystem_unrestricted();
    (!tmpfs).then(|| policy.tmp.clone())
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
        self.exit_code() == Some(0) && !self.cancelled && !self.timed_out && self.disk.is_none()
    }
    /// The limit that stopped the process, named as reports name it (`limit: "memory"`,
    /// `"disk"`, ...; docs/policies.md).
    pub fn limit(&self) -> Option<&'static str> {
        if self.disk.is_some() {
            return Some("disk");
        }
        Some(match self.report.limit? {
            LimitHit::Memory => "memory",
            LimitHit::Cpu => "cpu",
            LimitHit::WallTime => "wall_time",
            LimitHit::FileSize => "file_size",
            LimitHit::Processes => "processes",
        })
    }
    /// Words for the limit that stopped the process, if one did.
    pub fn limit_words(&self, policy: &ResolvedPolicy) -> Option<String> {
        if let Some(hit) = &self.disk {
            return Some(hit.words());
        }
        let l = &policy.limits;
        let amount = |v: Option<u64>, unit: fn(u64) -> String| {
            v.map(|v| format!(" ({})", unit(v))).unwrap_or_default()
        };
        Some(match self.report.limit? {
            LimitHit::Memory => format!(
                "killed: the policy's memory limit{} was reached",
                amount(l.memory_bytes, super::store::bytes_words)
            ),
            LimitHit::Cpu => format!(
                "killed: the policy's CPU time limit{} was reached",
                amount(l.cpu_seconds, |s| format!("{s} s"))
            ),
            LimitHit::WallTime => format!(
                "killed: the policy's wall-time limit{} was reached",
                amount(l.wall_seconds, |s| format!("{s} s"))
            ),
            LimitHit::FileSize => format!(
                "stopped: a file reached the policy's file size limit{}",
                amount(l.file_size_bytes, super::store::bytes_words)
            ),
            LimitHit::Processes => format!(
                "stopped: the policy's process count limit{} was reached",
                amount(l.processes, |n| n.to_string())
            ),
        })
    }
}

/// Called with each complete stderr line (without the newline).
pub type LineHook = Box<dyn FnMut(&str) + Send>;

/// Spawn `cmd` and run it to the end. stdout/stderr are set here (piped); stdin is
/// closed. With `disk`, the stores it writes are measured while it runs and the whole
/// process group is killed when they pass their bound. Must be called inside a tokio
/// runtime.
pub async fn run(
    mut cmd: SandboxCommand,
    sink: Arc<dyn EnvSink>,
    mut on_stderr_line: Option<LineHook>,
    cancel: &Canceller,
    timeout: Option<Duration>,
    disk: Option<DiskWatch<'_>>,
) -> Result<RunOutcome, EnvError> {
    cmd.stdin(Io::Null).stdout(Io::Piped).stderr(Io::Piped);
    let started = Instant::now();
    let mut child = cmd.spawn()?;
    let denials = child.network_denials();
    // Kills the process group and the job's cgroup while `wait` owns the child.
    let killer = child.killer();
    let pid = child.pid;
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
    let over = async {
        match &disk {
            Some(w) => w.lease.exceeded(&w.writable, Some(pid)).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(over);
    let (mut cancelled, mut timed_out, mut disk_hit) = (false, false, None);
    let mut report = loop {
        tokio::select! {
            report = &mut wait => break report,
            () = cancel.cancelled(), if !cancelled => { cancelled = true; killer.kill_all(); }
            () = &mut deadline, if !timed_out => { timed_out = true; killer.kill_all(); }
            hit = &mut over, if disk_hit.is_none() => {
                tracing::info!(owner = %hit.owner, used = hit.used, bound = hit.bound, "killed a uv process at its stores' disk bound");
                disk_hit = Some(hit);
                killer.kill_all();
            }
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
        disk: disk_hit,
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
