//! The REPL's errors, and how a worker ended in words.

use std::path::PathBuf;

use super::interpreter::Language;
use crate::sandbox::{ExitReport, LaunchError, LimitHit, PolicyError, ResolvedPolicy, Termination};

/// Errors of the REPL subsystem; every message says what failed, why, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ReplError {
    #[error(
        "session {session:?} is busy running cell {cell}; wait for its job to finish, interrupt it, or restart the session"
    )]
    Busy { session: String, cell: u64 },
    #[error(
        "session {session:?} is not waiting for input; input can only be sent while a cell waits in input()"
    )]
    NotAwaitingInput { session: String },
    #[error(
        "cannot start session {name:?}: the limit of {max} sessions is reached (open: {open}); close one with session_close, or reuse one"
    )]
    TooManySessions {
        name: String,
        max: usize,
        open: String,
    },
    #[error("invalid session name {name:?}: use 1-64 letters, digits, '-', '_' or '.'")]
    InvalidSessionName { name: String },
    #[error(
        "session {session:?} was restarted before this cell started; none of it ran: run it again"
    )]
    Restarted { session: String },
    #[error("session {session:?} was closed; start it again by using its name in a new call")]
    Closed { session: String },
    #[error("no session named {name:?}; open sessions: {open}")]
    NoSuchSession { name: String, open: String },
    #[error(
        "session {name:?} expired after {idle_secs} s idle and was closed: its variables and \
         history are gone; python_exec starts it again, fresh"
    )]
    Expired { name: String, idle_secs: u64 },
    #[error("no Python interpreter found: {detail}; pass --python PATH")]
    PythonNotFound { detail: String },
    #[error(
        "the Python interpreter {python:?} does not work: {detail}; pass a working one with --python PATH"
    )]
    PythonProbe { python: PathBuf, detail: String },
    #[error(
        "R is not available: {detail}; R sessions need R with jsonlite (Debian: apt-get install r-base-core r-cran-jsonlite); Python sessions are unaffected"
    )]
    RNotFound { detail: String },
    #[error(
        "session {session:?} is a {has} session, not {asked}; use another session name for {asked}, or session_close {session:?} first"
    )]
    LanguageMismatch {
        session: String,
        has: Language,
        asked: Language,
    },
    #[error("cannot apply the sandbox policy: {0}")]
    Policy(#[from] PolicyError),
    #[error("cannot start the Python worker: {0}")]
    Launch(#[from] LaunchError),
    #[error("could not {what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{message}; the session's state is lost, the next call starts a fresh worker")]
    WorkerDied { message: String },
    #[error("{message}")]
    Python { message: String },
    #[error("the Python worker broke the protocol: {detail}; restart the session")]
    Protocol { detail: String },
    #[error(
        "cannot branch from {parent:?} in session {session:?}: {why}; cells you can use: {usable}"
    )]
    BadParent {
        session: String,
        parent: String,
        why: String,
        usable: String,
    },
    #[error(
        "cell {parent} has no snapshot ({why}). Its state can be rebuilt by re-running {cells} in a fresh worker; \
         this repeats their side effects (files written, network calls) and gives new random values. \
         Nothing was run. To do it, call python_exec again with parent=\"{parent}\" and replay=true"
    )]
    ReplayNeeded {
        parent: String,
        why: String,
        cells: String,
    },
    #[error("cannot branch: {detail}; the session's head is unchanged")]
    Branch { detail: String },
}

/// How a worker ended, in words: "the Python worker was killed by SIGSEGV
/// (segmentation fault)", "... exited with code 3", "... killed: memory limit (512 MiB)
/// reached". `policy` supplies the amount of the limit that was hit.
pub(super) fn exit_words(report: &ExitReport, policy: &ResolvedPolicy) -> String {
    if let Some(limit) = report.limit {
        let what = match limit {
            LimitHit::Memory => "memory limit",
            LimitHit::Cpu => "CPU time limit",
            LimitHit::WallTime => "wall-time limit",
            LimitHit::FileSize => "file size limit",
            LimitHit::Processes => "process count limit",
        };
        return match limit_amount(policy, limit) {
            Some(amount) => format!("the Python worker was killed: {what} ({amount}) reached"),
            None => format!("the Python worker was killed: {what} reached"),
        };
    }
    match &report.termination {
        Termination::Exited(code) => format!("the Python worker exited with code {code}"),
        Termination::Signaled(sig) => match signal_meaning(sig) {
            Some(meaning) => format!("the Python worker was killed by {sig} ({meaning})"),
            None => format!("the Python worker was killed by {sig}"),
        },
        Termination::Unknown => "the Python worker ended (exit status unknown)".to_string(),
    }
}

/// The amount of a policy limit, in words ("512 MiB", "60 s").
fn limit_amount(policy: &ResolvedPolicy, limit: LimitHit) -> Option<String> {
    let l = &policy.limits;
    match limit {
        LimitHit::Memory => l.memory_bytes.map(bytes_words),
        LimitHit::Cpu => l.cpu_seconds.map(|s| format!("{s} s of CPU")),
        LimitHit::WallTime => l.wall_seconds.map(|s| format!("{s} s")),
        LimitHit::FileSize => l.file_size_bytes.map(bytes_words),
        LimitHit::Processes => l.processes.map(|n| format!("{n} processes")),
    }
}

/// "512 MiB", "4 GiB", "1500 bytes".
fn bytes_words(n: u64) -> String {
    const KIB: u64 = 1024;
    for (unit, size) in [("GiB", KIB * KIB * KIB), ("MiB", KIB * KIB), ("KiB", KIB)] {
        if n >= size && n.is_multiple_of(size) {
            return format!("{} {unit}", n / size);
        }
    }
    if n >= KIB * KIB {
        return format!("{:.1} MiB", n as f64 / (KIB * KIB) as f64);
    }
    format!("{n} bytes")
}

fn signal_meaning(sig: &str) -> Option<&'static str> {
    Some(match sig {
        "SIGSEGV" => "segmentation fault",
        "SIGKILL" => "killed from outside, or out of memory",
        "SIGABRT" => "aborted",
        "SIGBUS" => "bus error",
        "SIGFPE" => "floating-point exception",
        "SIGILL" => "illegal instruction",
        "SIGTERM" => "terminated",
        "SIGXCPU" => "CPU time limit",
        "SIGXFSZ" => "file size limit",
        "SIGSYS" => "blocked system call",
        "SIGPIPE" => "broken pipe",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::Policy;

    #[test]
    fn exit_words_name_signal_code_and_limit() {
        let placeholders = crate::sandbox::Placeholders {
            workspace: "/w".into(),
            tmp: "/t".into(),
            ..Default::default()
        };
        let policy = Policy::load("workspace-write")
            .unwrap()
            .resolve(&placeholders)
            .unwrap();
        let exit_words = |r: &ExitReport| exit_words(r, &policy);
        assert_eq!(bytes_words(512 << 20), "512 MiB");
        assert_eq!(bytes_words(4 << 30), "4 GiB");
        assert_eq!(bytes_words(1500), "1500 bytes");
        let mut r = ExitReport {
            termination: Termination::Signaled("SIGSEGV".into()),
            ..Default::default()
        };
        assert_eq!(
            exit_words(&r),
            "the Python worker was killed by SIGSEGV (segmentation fault)"
        );
        r.termination = Termination::Exited(3);
        assert_eq!(exit_words(&r), "the Python worker exited with code 3");
        r.limit = Some(LimitHit::Memory);
        assert_eq!(
            exit_words(&r),
            "the Python worker was killed: memory limit (4 GiB) reached"
        );
    }
}
