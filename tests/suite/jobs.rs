//! Shell jobs through the jobs API (store + `start_shell_job`): output, long-poll,
//! stdin and EOF, exit codes, cancel of a process group that ignores SIGTERM,
//! shutdown, bad input, and memory staying bounded under a flood of output.
//! The MCP-level tests of the same behaviour live with the server (tests/mcp).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcp_sandbox_repl::jobs::{
    JobError, JobFilter, JobSnapshot, JobStatus, JobStore, ShellRequest, StoreConfig, Stream,
    WaitFor, start_shell_job,
};
use mcp_sandbox_repl::sandbox::{Placeholders, Policy, ResolvedPolicy};

use crate::common::{TempDir, pgid_of, pids_with_env, unique_marker, wait_for_pids_with_env};

struct Fixture {
    store: Arc<JobStore>,
    policy: Arc<ResolvedPolicy>,
    /// Dropped last (fields drop in order), after `Drop::drop` has stopped the jobs.
    dir: TempDir,
}

impl Drop for Fixture {
    /// Stop every job, and let the tasks that still hold the store (a job's supervisor
    /// writing its record a moment after the test saw the job end) finish, before the
    /// directory goes: a record written after that would make it again.
    fn drop(&mut self) {
        let store = self.store.clone();
        let _ = std::thread::spawn(move || {
            // The test's runtime may be a single thread, busy running this drop.
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
            {
                rt.block_on(store.shutdown());
            }
        })
        .join();
        // Only a multi-threaded runtime runs those tasks while this one waits.
        let multi = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        let deadline = Instant::now() + Duration::from_secs(10);
        while multi && Arc::strong_count(&self.store) > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn fixture(tag: &str) -> Fixture {
    fixture_with(tag, 20_000)
}

fn fixture_with(tag: &str, response_bytes: usize) -> Fixture {
    // In the system temp dir, where these tests always ran (their workspace under /tmp).
    let dir = TempDir::in_system_tmp(&format!("jobs-suite-{tag}"));
    let workspace = dir.join("ws");
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::create_dir_all(&tmp).unwrap();
    let placeholders = Placeholders {
        workspace,
        tmp,
        ..Placeholders::default()
    };
    let policy = Policy::load("workspace-write")
        .unwrap()
        .resolve(&placeholders)
        .unwrap();
    let store = JobStore::open(StoreConfig {
        state_dir: dir.join("state"),
        disk_cap: 1 << 32,
        response_bytes,
        retention: Default::default(),
        max_running: None,
    })
    .unwrap();
    Fixture {
        store,
        policy: Arc::new(policy),
        dir,
    }
}

impl Fixture {
    fn start(&self, req: ShellRequest) -> Result<String, JobError> {
        let req = ShellRequest {
            cwd: req.cwd.or_else(|| Some(self.dir.join("ws"))),
            ..req
        };
        start_shell_job(
            &crate::common::runtime(),
            &self.store,
            req,
            self.policy.clone(),
        )
        .map(|h| h.id().to_string())
    }

    fn sh(&self, command: &str) -> String {
        self.start(ShellRequest::command(command)).unwrap()
    }

    /// Long-poll until the job finishes; returns every snapshot. `limit` only guards a
    /// hang: a loaded machine may take far longer than the job's own work to start and
    /// end it, so it is never less than a minute.
    async fn follow(&self, id: &str, limit: Duration) -> Vec<JobSnapshot> {
        let limit = limit.max(Duration::from_secs(60));
        let start = Instant::now();
        let mut snaps = Vec::new();
        loop {
            let s = self.store.wait(id, Duration::from_secs(5)).await.unwrap();
            let finished = s.status.is_finished();
            snaps.push(s);
            if finished {
                return snaps;
            }
            assert!(
                start.elapsed() < limit,
                "job {id} still running after {limit:?}"
            );
        }
    }
}

fn stdout_of(snaps: &[JobSnapshot]) -> String {
    snaps.iter().map(|s| s.stdout.head.as_str()).collect()
}

/// Whether any live (non-zombie) process is in process group `pgid`, from /proc.
fn group_alive(pgid: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        panic!("/proc is not readable")
    };
    entries.flatten().any(|e| {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            return false;
        };
        // Fields after the command name: state ppid pgrp ...
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            return false;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        fields.len() > 2 && fields[0] != "Z" && fields[2] == pgid.to_string()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_command_settles_with_output_and_exit_code() {
    let f = fixture("quick");
    let id = f.sh("echo hi; echo oops >&2");
    // Windows wide enough for a loaded machine: the wait returns when the job ends.
    let s = f
        .store
        .wait_for(&id, Duration::from_secs(60), WaitFor::Settled)
        .await
        .unwrap();
    assert_eq!(s.status, JobStatus::Completed, "{s:?}");
    assert_eq!(
        (s.stdout.head.as_str(), s.stderr.head.as_str(), s.exit_code),
        ("hi\n", "oops\n", Some(0))
    );

    let id = f.sh("echo partial; exit 3");
    let s = f
        .store
        .wait_for(&id, Duration::from_secs(60), WaitFor::Settled)
        .await
        .unwrap();
    assert_eq!((s.status, s.exit_code), (JobStatus::Failed, Some(3)));
    assert_eq!(s.message.as_deref(), Some("exited with code 3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_streams_every_tick_once() {
    let f = fixture("ticks");
    // Each tick waits for a go-ahead, so a tick is read back before the next is printed,
    // however slowly the machine runs the job or this test (timed ticks could all land
    // in one poll on a loaded machine).
    let id = f.sh("for i in 1 2 3 4; do read go; echo tick $i; done");
    let mut snaps = Vec::new();
    for i in 1..=4 {
        f.store.send_input(&id, "go\n", false).unwrap();
        let want = format!("tick {i}\n");
        let mut got = String::new();
        while got.len() < want.len() {
            let s = f.store.wait(&id, Duration::from_secs(60)).await.unwrap();
            got.push_str(&s.stdout.head);
            let finished = s.status.is_finished();
            snaps.push(s);
            assert!(
                !finished || i == 4,
                "the job ended before tick {i}: {snaps:?}"
            );
        }
        assert_eq!(
            got,
            want,
            "poll {} returned more than tick {i}",
            snaps.len()
        );
    }
    if !snaps.last().unwrap().status.is_finished() {
        snaps.extend(f.follow(&id, Duration::from_secs(60)).await);
    }
    assert_eq!(stdout_of(&snaps), "tick 1\ntick 2\ntick 3\ntick 4\n");
    assert_eq!(snaps.last().unwrap().status, JobStatus::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_lines_and_eof_reach_the_process() {
    let f = fixture("stdin");
    let id = f.sh("read a; echo got $a");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(f.store.summary(&id).unwrap().status, JobStatus::Running);
    f.store.send_input(&id, "hello\n", false).unwrap();
    let snaps = f.follow(&id, Duration::from_secs(10)).await;
    assert_eq!(stdout_of(&snaps), "got hello\n");

    let id = f.sh("cat");
    f.store.send_input(&id, "a\n", false).unwrap();
    f.store.send_input(&id, "b\n", true).unwrap();
    let err = f
        .store
        .send_input(&id, "c\n", false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("stdin is closed: EOF was sent earlier"),
        "{err}"
    );
    let snaps = f.follow(&id, Duration::from_secs(10)).await;
    assert_eq!(stdout_of(&snaps), "a\nb\n");
    let err = f
        .store
        .send_input(&id, "late\n", false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("already finished (completed); it takes no more input"),
        "{err}"
    );

    let id = f
        .start(ShellRequest {
            stdin: false,
            ..ShellRequest::command("cat")
        })
        .unwrap();
    let err = f.store.send_input(&id, "x", false).unwrap_err().to_string();
    assert!(err.contains("started without stdin"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_ends_a_group_whose_children_ignore_sigterm() {
    let f = fixture("cancel");
    let mark = unique_marker("cancel");
    let id = f
        .start(ShellRequest {
            cancel_grace: Some(Duration::from_millis(300)),
            ..ShellRequest::command(format!(
                "export {mark}; trap '' TERM; (trap '' TERM; sleep 60) & sleep 60; wait"
            ))
        })
        .unwrap();
    let pgid = pgid_of(wait_for_pids_with_env(&mark)[0]).unwrap();
    assert!(group_alive(pgid));
    f.store.cancel(&id).unwrap();
    let snaps = f.follow(&id, Duration::from_secs(10)).await;
    let last = snaps.last().unwrap();
    assert_eq!(last.status, JobStatus::Cancelled, "{last:?}");
    assert!(
        !group_alive(pgid),
        "processes of the job's group survived the cancel"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_processes_end_with_the_job() {
    let f = fixture("background");
    let mark = unique_marker("background");
    // `sleep &` has forked (and holds the variable) before the job can end.
    let id = f.sh(&format!("export {mark}; sleep 60 & echo started"));
    let snaps = f.follow(&id, Duration::from_secs(5)).await;
    assert_eq!(snaps.last().unwrap().status, JobStatus::Completed);
    assert!(stdout_of(&snaps).contains("started"));
    assert_eq!(
        pids_with_env(&mark),
        Vec::<u32>::new(),
        "a background process outlived its job"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_kills_running_jobs_before_it_returns() {
    let f = fixture("shutdown");
    let mark = unique_marker("shutdown");
    let id = f.sh(&format!("export {mark}; sleep 60; true"));
    let pgid = pgid_of(wait_for_pids_with_env(&mark)[0]).unwrap();
    f.store.shutdown().await;
    // Killed by the time shutdown returns (how fast is the benchmarks' business).
    let s = f.store.summary(&id).unwrap();
    assert_eq!(s.status, JobStatus::Cancelled);
    assert!(s.message.unwrap().contains("server shut down"));
    assert!(!group_alive(pgid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_dict_wins_over_env_file_and_cwd_applies() {
    let f = fixture("env");
    let ws = f.dir.join("ws");
    std::fs::create_dir_all(ws.join("sub")).unwrap();
    std::fs::write(
        ws.join(".env"),
        "# settings\nexport A=from_file\nB='file b'\n",
    )
    .unwrap();
    let id = f
        .start(ShellRequest {
            env: BTreeMap::from([("B".to_string(), "dict b".to_string())]),
            env_file: Some(PathBuf::from(".env")),
            ..ShellRequest::command("echo \"$A|$B|$(pwd)\"")
        })
        .unwrap();
    let snaps = f.follow(&id, Duration::from_secs(10)).await;
    assert_eq!(
        stdout_of(&snaps),
        format!("from_file|dict b|{}\n", ws.display())
    );

    let id = f
        .start(ShellRequest {
            argv: Some(vec![
                "printf".into(),
                "%s|".into(),
                "a b".into(),
                "c".into(),
            ]),
            cwd: Some(ws.join("sub")),
            ..ShellRequest::default()
        })
        .unwrap();
    let snaps = f.follow(&id, Duration::from_secs(10)).await;
    assert_eq!(stdout_of(&snaps), "a b|c|");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_clear_errors_and_create_no_job() {
    let f = fixture("bad");
    let ws = f.dir.join("ws");
    let missing = ws.join("nope");
    let err = f
        .start(ShellRequest {
            cwd: Some(missing.clone()),
            ..ShellRequest::command("true")
        })
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("working directory {missing:?} does not exist; pass an existing directory")
    );
    std::fs::write(ws.join("bad.env"), "A=1\nnot a line\n").unwrap();
    let err = f
        .start(ShellRequest {
            env_file: Some(ws.join("bad.env")),
            ..ShellRequest::command("true")
        })
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}:2: expected KEY=VALUE, found \"not a line\"",
            ws.join("bad.env").display()
        )
    );
    let err = f
        .start(ShellRequest {
            argv: Some(vec!["true".into()]),
            ..ShellRequest::command("true")
        })
        .unwrap_err();
    assert!(err.to_string().contains("either command or argv"), "{err}");
    let err = f
        .start(ShellRequest {
            argv: Some(vec![]),
            ..ShellRequest::default()
        })
        .unwrap_err();
    assert!(err.to_string().contains("argv is empty"), "{err}");
    // Files the policy does not let a job read are not read for it either.
    let secret = f.dir.join("secret.env");
    std::fs::write(&secret, "TOKEN=hunter2\n").unwrap();
    std::os::unix::fs::symlink(&secret, ws.join("link.env")).unwrap();
    // The refusal names the path as given (resolving it would answer differently for
    // host paths that exist and those that do not).
    for env_file in [secret.clone(), ws.join("link.env")] {
        let err = f
            .start(ShellRequest {
                env_file: Some(env_file.clone()),
                ..ShellRequest::command("true")
            })
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "env file {env_file:?} is outside what policy workspace-write lets a job read; \
                 use a path inside the workspace"
            )
        );
    }
    let err = f
        .start(ShellRequest {
            cwd: Some(f.dir.path.clone()),
            ..ShellRequest::command("true")
        })
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!("working directory {:?} is outside", f.dir.path)),
        "{err}"
    );
    assert!(
        f.store.list(&JobFilter::default()).is_empty(),
        "a rejected request created a job"
    );
}

/// Peak RSS of this process, from /proc.
fn vm_hwm_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_output_is_spooled_not_held_in_memory() {
    let f = fixture_with("flood", 20_000);
    let before = vm_hwm_kb();
    // 200 MB of numbered lines.
    let id = f.sh("yes 0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz | head -c 200000000");
    let s = f
        .store
        .wait_for(&id, Duration::from_secs(120), WaitFor::Settled)
        .await
        .unwrap();
    assert_eq!(s.status, JobStatus::Completed);
    let grown_mb = (vm_hwm_kb().saturating_sub(before)) / 1024;
    assert!(
        grown_mb < 50,
        "peak RSS grew by {grown_mb} MB while spooling 200 MB"
    );
    let summary = f.store.summary(&id).unwrap();
    assert_eq!(summary.stdout_bytes, 200_000_000);
    // The snapshot is a head and a tail within the response budget.
    let [a, b] = s.stdout.omitted.unwrap();
    assert!(s.stdout.head.len() + s.stdout.tail.as_ref().unwrap().len() <= 20_000);
    assert_eq!((s.stdout.offset, s.stdout.end), (0, 200_000_000));
    assert!(a < b);
    // Any range is readable exactly.
    let c = f
        .store
        .read(&id, Stream::Stdout, 100_000_000 - 5, 10)
        .unwrap();
    assert_eq!(c.end - c.offset, 10);
    assert_eq!(c.text.len(), 10);
    let hits = f.store.search(&id, Stream::Stdout, "^0123", 0, 3).unwrap();
    assert_eq!(hits.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_confines_shell_jobs() {
    let f = fixture("policy");
    let outside = format!("/etc/jobs-suite-{}", std::process::id());
    let id = f.sh(&format!("echo inside > ok.txt && echo outside > {outside}"));
    let snaps = f.follow(&id, Duration::from_secs(10)).await;
    let last = snaps.last().unwrap();
    assert_eq!(last.status, JobStatus::Failed, "{last:?}");
    assert!(
        f.dir.join("ws/ok.txt").exists(),
        "a write inside the workspace must work"
    );
    assert!(
        !std::path::Path::new(&outside).exists(),
        "a write outside the workspace must fail"
    );
    let stderr: String = snaps.iter().map(|s| s.stderr.head.as_str()).collect();
    assert!(stderr.contains(&outside), "{stderr}");
}

/// A shell job refused for the quota of running jobs is refused before its program
/// starts, not killed after: the exec of a program reads its file and so moves its access
/// time (set older than its change time, which relatime updates), and here it stays put.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_over_the_quota_is_refused_before_its_program_starts() {
    use std::os::unix::fs::PermissionsExt;
    let mut f = fixture("quota");
    f.store = JobStore::open(StoreConfig {
        state_dir: f.dir.join("state-quota"),
        disk_cap: 1 << 32,
        response_bytes: 20_000,
        retention: Default::default(),
        max_running: Some(0),
    })
    .unwrap();
    let prog = f.dir.join("ws").join("prog.sh");
    std::fs::write(&prog, "#!/bin/sh\necho x > prog-ran\n").unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let epoch = std::time::SystemTime::UNIX_EPOCH;
    std::fs::File::options()
        .write(true)
        .open(&prog)
        .unwrap()
        .set_times(std::fs::FileTimes::new().set_accessed(epoch))
        .unwrap();
    let refused = f.start(ShellRequest {
        argv: Some(vec![prog.to_string_lossy().into_owned()]),
        ..ShellRequest::default()
    });
    assert!(
        matches!(refused, Err(JobError::TooManyRunning { limit: 0 })),
        "{refused:?}"
    );
    let accessed = std::fs::metadata(&prog).unwrap().accessed().unwrap();
    assert_eq!(accessed, epoch, "the refused job's program was started");
    assert!(!f.dir.join("ws").join("prog-ran").exists());
}
