//! Shell jobs: a command (`sh -c`) or an argv list, spawned through the sandbox
//! launcher with piped stdio. Two pump tasks copy stdout and stderr into the job's
//! spools in chunks; a writer task feeds stdin; a supervisor task waits for the exit,
//! kills what is left of the process group, and finishes the job.
//!
//! Cancel: SIGTERM (and SIGCONT, so stopped processes see it) to the whole process
//! group, then SIGKILL after the grace period. Status stays `running` while the
//! process runs: we cannot tell whether it is blocked reading stdin.

use crate::sandbox::Io;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::job::lock;
use super::store::JobStore;
use super::{
    DEFAULT_CANCEL_GRACE, JobControl, JobError, JobHandle, JobKind, JobOutcome, JobStatus, Stream,
    dotenv,
};
use crate::sandbox::{
    ExitReport, GroupKiller, LimitHit, ResolvedPolicy, SandboxedChild, Termination,
};

/// How long after the main process exits (and the rest of its group is killed) we
/// keep reading output pipes that are still open.
const DRAIN_WAIT: Duration = Duration::from_secs(1);
/// Size asked for the stdout/stderr pipes.
const PIPE_SIZE: i32 = 1 << 20;
/// Largest read from an output pipe (one buffer per stream per running job).
const READ_CHUNK: usize = 256 * 1024;
/// The first reads of an output pipe, until one fills it (no large buffer for a job
/// that prints little).
const SMALL_READ: usize = 4096;
/// Reads at least this large (but short of a full buffer) mark a burst of output.
const BURST: usize = 4096;

/// What to run as a shell job.
#[derive(Debug, Clone)]
pub struct ShellRequest {
    /// A command line, run by `/bin/sh -c`.
    pub command: Option<String>,
    /// Or a program and its arguments, run directly (no shell).
    pub argv: Option<Vec<String>>,
    /// Working directory (must exist); relative paths are taken from the server's.
    pub cwd: Option<PathBuf>,
    /// Environment variables on top of the policy's; these win over `env_file`.
    pub env: BTreeMap<String, String>,
    /// A `.env` file to load (relative paths are taken from `cwd`).
    pub env_file: Option<PathBuf>,
    /// REPL session the job belongs to, for listing.
    pub session: Option<String>,
    /// Give the job a stdin pipe fed by the input tool (default); if false, stdin is
    /// /dev/null.
    pub stdin: bool,
    /// Time between SIGTERM and SIGKILL on cancel (default 2 s).
    pub cancel_grace: Option<Duration>,
    /// The job's private temp dir on the host (its policy's `{tmp}`), removed once the job
    /// has ended; `None` where there is none (a tmpfs in the job's view is its `{tmp}`).
    pub private_tmp: Option<PathBuf>,
}

impl Default for ShellRequest {
    fn default() -> Self {
        ShellRequest {
            command: None,
            argv: None,
            cwd: None,
            env: BTreeMap::new(),
            env_file: None,
            session: None,
            stdin: true,
            cancel_grace: None,
            private_tmp: None,
        }
    }
}

impl ShellRequest {
    /// A request to run `command` through `sh -c`, with defaults for the rest.
    pub fn command(command: impl Into<String>) -> Self {
        ShellRequest {
            command: Some(command.into()),
            ..ShellRequest::default()
        }
    }
}

/// Validate `req`, spawn it through the launcher under `policy`, and return the job's
/// handle. On any error nothing was started and no job was created. Must be called
/// within a tokio runtime.
pub fn start_shell_job(
    sandbox: &crate::sandbox::Runtime,
    store: &Arc<JobStore>,
    req: ShellRequest,
    policy: Arc<ResolvedPolicy>,
) -> Result<JobHandle, JobError> {
    let rt = tokio::runtime::Handle::try_current().map_err(|_| {
        JobError::Request("shell jobs must be started from within the tokio runtime".into())
    })?;
    let (program, args, label) = program_and_args(&req)?;
    let cwd = req.cwd.as_deref().map(check_cwd).transpose()?;
    if let Some(dir) = &cwd {
        check_readable(&policy, dir, "working directory")?;
    }
    let env = environment(&req, cwd.as_deref(), &policy)?;
    let req_tmp = req.private_tmp.clone();
    // Admitted before the process exists: a command refused (full state disk, quota of
    // running jobs) must not run. Refused after the spawn, it was killed only after its
    // exec, and a quick command (`echo x > f`) had often done its work by then.
    let admission = store.admit()?;

    let mut cmd = sandbox.command(policy, &program);
    cmd.args(&args);
    if let Some(dir) = &cwd {
        cmd.current_dir(dir);
    }
    for (k, v) in &env {
        cmd.env(k, v);
    }
    // Shell jobs share their policy (`ShellRequest::private_tmp` is `None` when the
    // private tmp is a tmpfs of the job's view): their views may be made ahead.
    cmd.view_made_ahead(true);
    cmd.stdin(if req.stdin { Io::Piped } else { Io::Null });
    cmd.stdout(Io::Piped).stderr(Io::Piped);
    // The spawn waits for the job's set-up (until it execs): off the runtime's worker,
    // so the tasks queued on it (other calls, output pumps) move on meanwhile.
    let on_worker = rt.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread;
    let mut child = if on_worker {
        tokio::task::block_in_place(|| cmd.spawn())?
    } else {
        cmd.spawn()?
    };
    let killer = child.killer();

    let handle =
        match store.create_admitted(admission, JobKind::Shell, req.session.as_deref(), &label) {
            Ok(h) => h,
            Err(e) => {
                child.kill_all();
                return Err(e);
            }
        };
    let _enter = rt.enter();
    let stdin = child
        .stdin
        .take()
        .and_then(|s| tokio::process::ChildStdin::from_std(s).ok());
    if let Some(p) = &child.stdout {
        widen_pipe(p);
    }
    if let Some(p) = &child.stderr {
        widen_pipe(p);
    }
    let stdout = child
        .stdout
        .take()
        .and_then(|s| tokio::process::ChildStdout::from_std(s).ok());
    let stderr = child
        .stderr
        .take()
        .and_then(|s| tokio::process::ChildStderr::from_std(s).ok());

    let control = Arc::new(ShellControl {
        job: handle.id().to_string(),
        killer,
        grace: req.cancel_grace.unwrap_or(DEFAULT_CANCEL_GRACE),
        exited: Arc::new(AtomicBool::new(false)),
        cancelling: AtomicBool::new(false),
        input: Mutex::new(InputState {
            tx: None,
            closed: String::new(),
        }),
        rt: rt.clone(),
    });
    match stdin {
        Some(stdin) => {
            let (tx, rx) = mpsc::unbounded_channel();
            lock(&control.input).tx = Some(tx);
            rt.spawn(feed_stdin(stdin, rx, Arc::downgrade(&control)));
        }
        None => {
            lock(&control.input).closed = "it was started without stdin (stdin: false)".into();
        }
    }
    handle.set_control(control.clone());

    let pumps: Vec<_> = [
        (stdout.map(boxed), Stream::Stdout),
        (stderr.map(boxed), Stream::Stderr),
    ]
    .into_iter()
    .filter_map(|(r, stream)| r.map(|r| rt.spawn(pump(r, handle.clone(), stream))))
    .collect();
    rt.spawn(supervise(child, pumps, control, handle.clone(), req_tmp));
    Ok(handle)
}

fn boxed<R: AsyncRead + Send + Unpin + 'static>(r: R) -> Box<dyn AsyncRead + Send + Unpin> {
    Box::new(r)
}

fn program_and_args(req: &ShellRequest) -> Result<(String, Vec<String>, String), JobError> {
    match (&req.command, &req.argv) {
        (Some(_), Some(_)) => Err(JobError::Request(
            "give either command or argv, not both".into(),
        )),
        (None, None) => Err(JobError::Request(
            "give a command (run by sh -c) or an argv list".into(),
        )),
        (Some(c), None) if c.trim().is_empty() => {
            Err(JobError::Request("the command is empty".into()))
        }
        (Some(c), None) => Ok(("/bin/sh".into(), vec!["-c".into(), c.clone()], c.clone())),
        (None, Some(argv)) => match argv.split_first() {
            Some((prog, rest)) if !prog.is_empty() => {
                Ok((prog.clone(), rest.to_vec(), argv.join(" ")))
            }
            _ => Err(JobError::Request(
                "argv is empty: give at least the program to run".into(),
            )),
        },
    }
}

/// The working directory, made absolute; it must exist and be a directory.
fn check_cwd(dir: &Path) -> Result<PathBuf, JobError> {
    let abs = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| JobError::io("could not read the server's working directory", e))?
            .join(dir)
    };
    match std::fs::metadata(&abs) {
        Ok(m) if m.is_dir() => Ok(abs),
        Ok(_) => Err(JobError::Cwd {
            path: abs,
            reason: "is not a directory".into(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(JobError::Cwd {
            path: abs,
            reason: "does not exist".into(),
        }),
        Err(e) => Err(JobError::Cwd {
            path: abs,
            reason: format!("cannot be used ({e})"),
        }),
    }
}

/// Variables from `env_file`, then `env` on top.
fn environment(
    req: &ShellRequest,
    cwd: Option<&Path>,
    policy: &ResolvedPolicy,
) -> Result<BTreeMap<String, String>, JobError> {
    let mut vars = BTreeMap::new();
    if let Some(file) = &req.env_file {
        let path = match cwd {
            Some(dir) if file.is_relative() => dir.join(file),
            _ => file.clone(),
        };
        // Read by the server, outside the sandbox: only beneath the workspace.
        vars.extend(dotenv::load_beneath(
            &policy.workspace,
            &path,
            &policy.name,
        )?);
    }
    vars.extend(req.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    for (k, v) in &vars {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(JobError::Request(format!(
                "invalid environment variable name {k:?}"
            )));
        }
        if v.contains('\0') {
            return Err(JobError::Request(format!(
                "the value of {k} contains a NUL byte"
            )));
        }
    }
    Ok(vars)
}

/// Refuse `path` unless a process under `policy` may read it (after resolving
/// symlinks). Landlock grants reading under the read, write and execute sets alike.
fn check_readable(
    policy: &ResolvedPolicy,
    path: &Path,
    what: &'static str,
) -> Result<(), JobError> {
    if policy.filesystem_unrestricted() {
        return Ok(());
    }
    let (real, canonical) = match path.canonicalize() {
        Ok(real) => (real, true),
        Err(_) => (path.to_path_buf(), false),
    };
    let roots = || {
        policy
            .read
            .iter()
            .chain(&policy.write)
            .chain(&policy.execute)
    };
    // A root that a canonical `real` starts with as written is canonical itself (a
    // prefix of a canonical path), so that is the same answer without resolving every
    // root (~40 `readlink`s per job); only otherwise are the roots resolved.
    let allowed = (canonical && roots().any(|root| real.starts_with(root)))
        || roots().any(|root| {
            let root = root.canonicalize().unwrap_or_else(|_| root.clone());
            real.starts_with(root)
        });
    if allowed {
        Ok(())
    } else {
        Err(JobError::Denied {
            what,
            path: real,
            policy: policy.name().to_string(),
        })
    }
}

/// Grow an output pipe so a fast writer is woken less often (fewer, larger chunks).
/// Best effort: the kernel may refuse (pipe-user-pages limits); the default works.
fn widen_pipe(fd: impl std::os::fd::AsFd) {
    let _ = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
}

struct InputState {
    /// Feeds the stdin writer task (`feed_stdin`). Unbounded so `send_input`, called
    /// under the `input` lock from a tool call, never waits on a process that does not
    /// read; the writer owns the pipe and applies the back-pressure. `None` once stdin is
    /// closed: dropping the sender ends the writer, which closes the pipe (EOF). At
    /// shutdown the control is dropped with the job (`Job::finish`), which closes it too.
    tx: Option<mpsc::UnboundedSender<Vec<u8>>>,
    /// Why stdin is closed, in words.
    closed: String,
}

struct ShellControl {
    job: String,
    /// Signals the job's process group (and, for SIGKILL, its cgroup); inert once the
    /// main process is reaped, so a recycled group id is never signalled.
    killer: GroupKiller,
    grace: Duration,
    /// The main process was reaped: its pid may be reused, stop signalling it.
    exited: Arc<AtomicBool>,
    cancelling: AtomicBool,
    /// The stdin sender and why it closed. Taken alone (never with a job lock): by
    /// `send_input`, and by the writer task when the process closes its stdin.
    input: Mutex<InputState>,
    rt: tokio::runtime::Handle,
}

impl ShellControl {
    fn close_input(&self, why: &str) {
        let mut input = lock(&self.input);
        if input.tx.take().is_some() {
            input.closed = why.to_string();
        }
    }
}

impl JobControl for ShellControl {
    fn cancel(&self) {
        self.cancel_within(None);
    }

    fn cancel_within(&self, grace: Option<Duration>) {
        if self.exited.load(Ordering::SeqCst) {
            return;
        }
        if self.cancelling.swap(true, Ordering::SeqCst) {
            // A second cancel does not wait for the grace period.
            self.kill();
            return;
        }
        tracing::debug!(job = %self.job, "cancel: SIGTERM to the process group");
        let _ = self.killer.signal(libc::SIGTERM);
        let _ = self.killer.signal(libc::SIGCONT);
        let (killer, grace, exited) = (
            self.killer.clone(),
            grace.unwrap_or(self.grace),
            self.exited.clone(),
        );
        // The supervisor kills the whole group once the main process exits, so
        // children that ignore SIGTERM die with it; this timer handles a main process
        // that ignores SIGTERM itself.
        let job = self.job.clone();
        self.rt.spawn(async move {
            tokio::time::sleep(grace).await;
            if exited.load(Ordering::SeqCst) {
                return; // the supervisor already killed the group
            }
            tracing::debug!(job = %job, "cancel: grace period over, SIGKILL to the process group");
            killer.kill_all();
        });
    }

    fn kill(&self) {
        if !self.exited.load(Ordering::SeqCst) {
            self.killer.kill_all();
        }
    }

    fn send_input(&self, text: &str, eof: bool) -> Result<(), String> {
        let mut input = lock(&self.input);
        let Some(tx) = input.tx.as_ref() else {
            return Err(format!("its stdin is closed: {}", input.closed));
        };
        if !text.is_empty() && tx.send(text.as_bytes().to_vec()).is_err() {
            input.tx = None;
            input.closed = "the process closed its stdin".into();
            return Err(format!("its stdin is closed: {}", input.closed));
        }
        if eof {
            // Dropping the sender ends the writer task, which closes the pipe.
            input.tx = None;
            input.closed = "EOF was sent earlier".into();
        }
        Ok(())
    }
}

async fn feed_stdin(
    mut stdin: tokio::process::ChildStdin,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
    control: Weak<ShellControl>,
) {
    while let Some(data) = rx.recv().await {
        let res = match stdin.write_all(&data).await {
            Ok(()) => stdin.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = res {
            tracing::debug!(error = %e, "shell job stdin closed by the process");
            if let Some(c) = control.upgrade() {
                c.close_input("the process closed its stdin");
            }
            return;
        }
    }
}

async fn pump(mut r: Box<dyn AsyncRead + Send + Unpin>, handle: JobHandle, stream: Stream) {
    // Most pipes only ever show their end (or a few lines): they are read into a small
    // buffer; the large one is taken once a read fills the small one.
    let mut small = [0u8; SMALL_READ];
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let read = if buf.is_empty() {
            r.read(&mut small).await
        } else {
            r.read(&mut buf).await
        };
        match read {
            Ok(0) => return,
            Ok(n) if buf.is_empty() => {
                handle.append(stream, &small[..n]);
                if n == SMALL_READ {
                    buf = vec![0u8; READ_CHUNK];
                }
            }
            Ok(n) => {
                handle.append(stream, &buf[..n]);
                // A sizeable read that drained the pipe means a fast writer: let the
                // pipe fill for a moment so the next read is large, instead of waking
                // for every few KiB (5-10x fewer wake-ups; at most 1 ms of latency).
                if (BURST..READ_CHUNK).contains(&n) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(job = %handle.id(), %stream, error = %e, "reading job output failed");
                return;
            }
        }
    }
}

async fn supervise(
    child: SandboxedChild,
    pumps: Vec<tokio::task::JoinHandle<()>>,
    control: Arc<ShellControl>,
    handle: JobHandle,
    private_tmp: Option<PathBuf>,
) {
    // What the job's network broker refused (proxy mode), read after the end.
    let denials = child.network_denials();
    // `wait` kills whatever is left of the group and cgroup (background processes,
    // children that ignored SIGTERM): nothing the job started outlives it.
    let report = child.wait().await;
    control.exited.store(true, Ordering::SeqCst);
    control.close_input("the job has finished");
    // The pipes close once every process holding them is gone; one that escaped the
    // group (and the cgroup) may keep them open: stop reading after a while.
    let deadline = tokio::time::Instant::now() + DRAIN_WAIT;
    for mut pump in pumps {
        if tokio::time::timeout_at(deadline, &mut pump).await.is_err() {
            tracing::warn!(job = %handle.id(), "an output pipe stayed open after the job ended; stopped reading it");
            pump.abort();
        }
    }
    // Wake the waiting call first (it answers from memory, and it sits in this worker's
    // next slot), then write the job's files: `result.json` and the index line are off
    // the answer's path, as for Python cells.
    let mut outcome = outcome(&report);
    let denied = denials
        .map(|d| d.lock().map(|d| d.clone()).unwrap_or_default())
        .unwrap_or_default();
    if !denied.is_empty()
        && let Some(serde_json::Value::Object(result)) = outcome.result.as_mut()
    {
        result.insert("denied".into(), serde_json::json!(denied));
    }
    if handle.finish_unpersisted(outcome) {
        tokio::task::yield_now().await;
        handle.persist();
    }
    if let Some(dir) = private_tmp {
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
    }
}

/// The job outcome for an exit report.
fn outcome(report: &ExitReport) -> JobOutcome {
    let mut out = match &report.termination {
        Termination::Exited(0) => JobOutcome {
            status: JobStatus::Completed,
            exit_code: Some(0),
            ..Default::default()
        },
        Termination::Exited(code) => JobOutcome {
            status: JobStatus::Failed,
            exit_code: Some(*code),
            message: Some(format!("exited with code {code}")),
            ..Default::default()
        },
        Termination::Signaled(sig) => JobOutcome {
            status: JobStatus::Failed,
            signal: Some(sig.clone()),
            message: Some(format!("killed by {sig}")),
            ..Default::default()
        },
        Termination::Unknown => JobOutcome {
            status: JobStatus::Failed,
            message: Some("the exit status of the process is unknown".into()),
            ..Default::default()
        },
    };
    if let Some(limit) = report.limit {
        let what = match limit {
            LimitHit::Memory => "memory",
            LimitHit::Cpu => "CPU time",
            LimitHit::WallTime => "wall-clock time",
            LimitHit::FileSize => "file size",
            LimitHit::Processes => "process count",
        };
        out.status = JobStatus::Failed;
        let prefix = out
            .message
            .take()
            .map(|m| format!("{m}: "))
            .unwrap_or_default();
        out.message = Some(format!("{prefix}stopped by the policy's {what} limit"));
    }
    out.result = Some(serde_json::json!({
        "wall_ms": report.wall.as_millis() as u64,
        "user_cpu_ms": report.user_cpu.as_millis() as u64,
        "system_cpu_ms": report.system_cpu.as_millis() as u64,
        "peak_rss_bytes": report.peak_rss_bytes,
    }));
    out
}
