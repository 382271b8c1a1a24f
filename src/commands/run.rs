//! `run`: one command under a policy, stdio passed through, exit status passed back
//! (128+N for signal N), a private temp dir created and removed, and with `--json` one
//! report line on stdout after the command ends. This is the CI runner.
//!
//! The command's stderr passes through a pipe so `run` can explain, in words, what the
//! policy blocked (the kernel only says EACCES/EROFS/EPERM): after a failed command, one
//! `blocked by policy ...` line per denial on stderr, and the same sentences under
//! `denied` in the JSON report; what the kernel could not enforce is under `unenforced`.

use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use serde::Serialize;

use crate::cli::RunArgs;
use crate::sandbox::{
    ExitReport, LimitHit, Placeholders, Policy, Termination,
    parent::child::{SignalForwarding, signal_number},
};

/// The report `--json` prints (one line).
#[derive(Debug, Serialize)]
struct RunReport<'a> {
    exit_code: Option<i32>,
    signal: Option<String>,
    wall_ms: u64,
    user_cpu_ms: u64,
    system_cpu_ms: u64,
    peak_rss_bytes: u64,
    limit: Option<LimitHit>,
    policy: &'a str,
    /// What the policy blocked, in words (found in the stderr of a command that failed).
    denied: &'a [String],
    /// What the policy asked for that this kernel did not enforce (best effort only).
    unenforced: &'a [String],
}

/// How much of the command's stderr is kept to look for denials (the last bytes).
const STDERR_KEPT: usize = 64 * 1024;

/// The command's stderr copied to ours while it runs, the last [`STDERR_KEPT`] bytes
/// kept. On this thread (a thread of its own cost a start and a wakeup per `run`): the
/// pipe and the command's pidfd are polled together until the command ends.
struct StderrTee {
    reader: std::io::PipeReader,
    kept: std::collections::VecDeque<u8>,
    open: bool,
}

impl StderrTee {
    fn new(reader: std::io::PipeReader) -> StderrTee {
        StderrTee {
            reader,
            kept: std::collections::VecDeque::new(),
            open: true,
        }
    }

    /// Copy until `end` (the command's end: its init's exit word, see
    /// `SandboxedChild::end_fd`) is readable, or `deadline` (its wall-time limit, which
    /// the wait that follows enforces) has passed.
    fn copy_until_end(&mut self, end: RawFd, deadline: Option<Instant>) {
        loop {
            let timeout = match deadline {
                None => -1,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    None => return,
                    Some(left) => left.as_millis().saturating_add(1).min(i32::MAX as u128) as i32,
                },
            };
            let pipe = if self.open {
                self.reader.as_raw_fd()
            } else {
                -1
            };
            let mut fds = [pipe, end].map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
            // SAFETY: poll of two pollfds we own (a negative fd is ignored).
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
            if rc < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            if rc <= 0 {
                return;
            }
            if fds[0].revents != 0 {
                self.copy_once();
            }
            if fds[1].revents != 0 {
                return;
            }
        }
    }

    /// One read from the pipe, copied to our stderr and kept; the pipe closed at EOF.
    fn copy_once(&mut self) {
        use std::io::{Read, Write};
        let mut buf = [0u8; 8192];
        let n = match self.reader.read(&mut buf) {
            Ok(0) | Err(_) => {
                self.open = false;
                return;
            }
            Ok(n) => n,
        };
        let _ = std::io::stderr().write_all(&buf[..n]);
        self.kept.extend(&buf[..n]);
        let excess = self.kept.len().saturating_sub(STDERR_KEPT);
        self.kept.drain(..excess);
    }

    /// The rest of the pipe once the command ended (to its end of file: every writer is
    /// gone once the command's cgroup is empty, or killed; for at most a moment more if
    /// a process outside any cgroup still holds it open), and what was kept.
    fn finish(mut self) -> String {
        let deadline = Instant::now() + std::time::Duration::from_secs(2);
        while self.open {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut fd = libc::pollfd {
                fd: self.reader.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll of one pollfd we own.
            if unsafe { libc::poll(&mut fd, 1, left.as_millis() as i32) } <= 0 && left.is_zero() {
                break;
            }
            if fd.revents != 0 {
                self.copy_once();
            }
        }
        let kept: Vec<u8> = self.kept.into_iter().collect();
        String::from_utf8_lossy(&kept).into_owned()
    }
}

pub(crate) fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let policy = Policy::load(&args.policy)?;
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let workspace = match &args.workspace {
        Some(w) => {
            let abs = cwd.join(w);
            if !abs.is_dir() {
                bail!(
                    "workspace {} does not exist or is not a directory; create it or pass \
                     another --workspace",
                    w.display()
                );
            }
            abs.canonicalize()
                .with_context(|| format!("cannot resolve workspace {}", w.display()))?
        }
        None => cwd
            .canonicalize()
            .context("cannot resolve the current directory")?,
    };
    let Some((program, rest)) = args.command.split_first() else {
        bail!("no command given; usage: mcp-sandbox-repl run [--policy NAME] -- CMD [ARGS]");
    };
    let mut tmp = PrivateTmp::name();
    let placeholders = placeholders(&policy, &workspace, &tmp.path, python_prefixes);
    let resolved = Arc::new(policy.resolve(&placeholders)?);
    if !tmp_in_view_only(&resolved) {
        tmp.create()?;
    }
    let dir = if cwd.starts_with(&workspace) {
        cwd
    } else {
        workspace
    };
    let (reader, writer) = std::io::pipe().context("cannot create a pipe for stderr")?;
    let dir_for_denials = dir.clone();
    // `run` is single-threaded: its one job is a plain fork (the hidden `--spawn-route`
    // takes the server's paths instead, for benchmarks and tests).
    let sandbox = crate::sandbox::Runtime::new(crate::sandbox::RuntimeConfig {
        route: args.spawn_route.into(),
        ..crate::sandbox::RuntimeConfig::single_job()
    });
    let mut cmd = sandbox.command(resolved.clone(), program);
    cmd.args(rest).current_dir(dir).stderr(writer);
    let forwarding = SignalForwarding::install();
    let child = cmd.spawn()?;
    let deadline = resolved
        .limits
        .wall_seconds
        .map(|s| Instant::now() + std::time::Duration::from_secs(s));
    child.forward_terminal_signals(&forwarding);
    let mut tee = StderrTee::new(reader);
    if let Some(end) = child.end_fd() {
        tee.copy_until_end(end, deadline);
    }
    let unenforced = child.unenforced().to_vec();
    // The answer comes on the init's word once the command's cgroup proves nothing of
    // it is left; the init, ending by itself meanwhile, is reaped after the answer is
    // out (`init`, dropped last), never handed to a parent that may not reap it.
    let (report, init) = child.wait_blocking_before_exit();
    drop(forwarding);
    let stderr = tee.finish();
    let denied = if exit_status(&report) != 0 {
        crate::sandbox::policy::explain::explain_denials_in(&resolved, &dir_for_denials, &stderr)
    } else {
        Vec::new()
    };
    for sentence in &denied {
        eprintln!("mcp-sandbox-repl: {sentence}");
    }
    if args.json {
        let line = serde_json::to_string(&render(&report, resolved.name(), &denied, &unenforced))?;
        println!("{line}");
    }
    drop(tmp);
    drop(init);
    Ok(ExitCode::from(exit_status(&report)))
}

fn render<'a>(
    r: &ExitReport,
    policy: &'a str,
    denied: &'a [String],
    unenforced: &'a [String],
) -> RunReport<'a> {
    let (exit_code, signal) = match &r.termination {
        Termination::Exited(c) => (Some(*c), None),
        Termination::Signaled(s) => (None, Some(s.clone())),
        Termination::Unknown => (None, None),
    };
    RunReport {
        exit_code,
        signal,
        wall_ms: r.wall.as_millis() as u64,
        user_cpu_ms: r.user_cpu.as_millis() as u64,
        system_cpu_ms: r.system_cpu.as_millis() as u64,
        peak_rss_bytes: r.peak_rss_bytes,
        limit: r.limit,
        policy,
        denied,
        unenforced,
    }
}

/// The shell convention: the exit code, or 128 + the signal number.
fn exit_status(r: &ExitReport) -> u8 {
    match &r.termination {
        Termination::Exited(c) => (*c & 0xff) as u8,
        Termination::Signaled(s) => (128 + signal_number(s).unwrap_or(0)).min(255) as u8,
        Termination::Unknown => 255,
    }
}

/// The private `{tmp}`: a fresh name under the system temp dir; the directory is created
/// 0700 where the command needs one on the host, and removed on drop.
struct PrivateTmp {
    path: PathBuf,
    made: bool,
}

impl PrivateTmp {
    fn name() -> PrivateTmp {
        let base = std::env::temp_dir();
        // An absolute, symlink-free parent: the view makes the path as spelled.
        let base = base.canonicalize().unwrap_or(base);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = base.join(format!("mcp-sandbox-run-{}-{nanos:x}", std::process::id()));
        PrivateTmp { path, made: false }
    }

    fn create(&mut self) -> anyhow::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&self.path)
            .with_context(|| format!("cannot create a private temp dir {}", self.path.display()))?;
        self.made = true;
        Ok(())
    }
}

impl Drop for PrivateTmp {
    fn drop(&mut self) {
        if self.made {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Whether `{tmp}` exists only in the command's mount view, as a tmpfs: then no host
/// directory is made for it. Removing one costs a synchronous discard on a file system
/// mounted with `discard` (on this ext4: 0.1 ms with the disk idle, ~4 ms with it busy).
/// Only where the mount view cannot be skipped (`kernel_support = "required"`): with
/// best effort the command might run on the host's file system and need the directory.
fn tmp_in_view_only(policy: &crate::sandbox::ResolvedPolicy) -> bool {
    policy.limits.tmp_size_bytes.is_some()
        && !policy.filesystem_unrestricted()
        && policy.kernel_support == crate::sandbox::KernelSupportMode::Required
}

/// The placeholders of one `run`; `{python}` found (`python`: a PATH search) only for a
/// policy that names it.
fn placeholders(
    policy: &Policy,
    workspace: &Path,
    tmp: &Path,
    python: impl FnOnce() -> Vec<PathBuf>,
) -> Placeholders {
    Placeholders {
        workspace: workspace.to_path_buf(),
        tmp: tmp.to_path_buf(),
        python: (policy.uses_placeholder("{python}"))
            .then(python)
            .unwrap_or_default(),
        venv: None,
        uv_cache: None,
    }
}

/// `{python}` for `run`: the prefix of the `python3` on PATH, and for a pyenv shim the
/// pyenv root (the shim script, pyenv itself and its versions live there).
fn python_prefixes() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(found) = which::which("python3") else {
        return out;
    };
    let parent = found.parent().unwrap_or(Path::new("/"));
    if parent.file_name().is_some_and(|n| n == "shims") {
        // ~/.pyenv/shims/python3 (or a plugin's shims dir) -> the pyenv root.
        let root = std::env::var_os("PYENV_ROOT").map(PathBuf::from);
        if let Some(root) = root.filter(|r| found.starts_with(r)) {
            out.push(root);
        } else if let Some(root) = parent.parent() {
            out.push(root.to_path_buf());
        }
    } else if let Some(prefix) = found
        .canonicalize()
        .ok()
        .and_then(|real| real.parent().and_then(Path::parent).map(Path::to_path_buf))
        .filter(|p| p != Path::new("/usr") && p != Path::new("/"))
    {
        out.push(prefix);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `{python}` is looked up for a policy that names it, and resolves into its paths;
    /// a policy that does not name it never searches PATH.
    #[test]
    fn python_found_only_when_the_policy_names_it() {
        let (w, t) = (Path::new("/w"), Path::new("/t"));
        let named = Policy::load("workspace-write").unwrap();
        let ph = placeholders(&named, w, t, || vec!["/py/prefix".into()]);
        assert_eq!(ph.python, vec![PathBuf::from("/py/prefix")]);
        let resolved = named.resolve(&ph).unwrap();
        assert!(resolved.read.contains(&"/py/prefix".into()), "{resolved:?}");
        assert!(
            resolved.execute.contains(&"/py/prefix".into()),
            "{resolved:?}"
        );

        let unnamed = Policy::parse("t", "[filesystem]\nread = [\"/usr\"]\n", "t").unwrap();
        let ph = placeholders(&unnamed, w, t, || panic!("PATH searched for python3"));
        assert!(ph.python.is_empty());
        assert_eq!(ph.workspace, w);
    }
}
