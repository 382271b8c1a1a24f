//! Tests of the job store through its public API: long-poll delivery, excerpts and
//! ranged reads, input/cancel routing, persistence across a restart, prune, disk cap.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::test_support::scratch_path;

/// The store configuration of most tests: a 1 GiB disk cap, 20 KB answers, default
/// retention, in `dir`.
fn config(dir: std::path::PathBuf) -> StoreConfig {
    StoreConfig {
        state_dir: dir,
        disk_cap: 1 << 30,
        response_bytes: 20_000,
        retention: Default::default(),
        max_running: None,
    }
}

/// A store in a fresh state directory, after the guard that removes it.
fn open(name: &str, response_bytes: usize, disk_cap: u64) -> (tempfile::TempDir, Arc<JobStore>) {
    let (scratch, dir) = scratch_path(&format!("jobs-store-{name}"), "state");
    let store = JobStore::open(StoreConfig {
        disk_cap,
        response_bytes,
        ..config(dir)
    })
    .unwrap();
    (scratch, store)
}

fn done() -> JobOutcome {
    JobOutcome {
        status: JobStatus::Completed,
        exit_code: Some(0),
        ..JobOutcome::default()
    }
}

/// Every job the store lists (default filter), as (short id, status), newest first.
fn listed(store: &JobStore) -> Vec<(String, JobStatus)> {
    store
        .list(&JobFilter::default())
        .into_iter()
        .map(|s| (short(&s.id), s.status))
        .collect()
}

/// A job id without its random part: `j12-k3f9q` → `j12`.
fn short(id: &str) -> String {
    id.split_once('-').map_or(id, |(n, _)| n).to_string()
}

/// The whole id of the listed job whose number `short_id` gives (`j12` → `j12-k3f9q`), or
/// `short_id` itself if none is listed.
fn full(store: &JobStore, short_id: &str) -> String {
    store
        .list(&JobFilter::default())
        .into_iter()
        .map(|s| s.id)
        .find(|id| short(id) == short_id)
        .unwrap_or_else(|| short_id.to_string())
}

fn shorts(ids: Vec<String>) -> Vec<String> {
    ids.iter().map(|id| short(id)).collect()
}

#[tokio::test]
async fn wait_delivers_each_byte_once_then_the_end() {
    let (_dir, store) = open("once", 20_000, 1 << 30);
    let h = store.create(JobKind::Shell, None, "echo").unwrap();
    h.append(Stream::Stdout, b"one\n");
    h.append(Stream::Stderr, b"warn\n");
    let s = store.wait(h.id(), Duration::from_secs(5)).await.unwrap();
    assert_eq!(s.status, JobStatus::Running);
    assert_eq!(
        s.stdout,
        Excerpt {
            offset: 0,
            end: 4,
            head: "one\n".into(),
            tail: None,
            omitted: None
        }
    );
    assert_eq!(
        (s.stderr.offset, s.stderr.end, s.stderr.head.as_str()),
        (0, 5, "warn\n")
    );
    h.append(Stream::Stdout, b"two\n");
    let s = store.wait(h.id(), Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        (s.stdout.offset, s.stdout.end, s.stdout.head.as_str()),
        (4, 8, "two\n")
    );
    assert!(s.stderr.is_empty());
    h.finish(done());
    // A finished job answers at once, not when the hour-long window ends.
    let s = tokio::time::timeout(
        Duration::from_secs(60),
        store.wait(h.id(), Duration::from_secs(3600)),
    )
    .await
    .expect("a finished job answers at once")
    .unwrap();
    assert_eq!(s.status, JobStatus::Completed);
    assert_eq!(s.exit_code, Some(0));
    assert!(s.stdout.is_empty() && s.stdout.offset == 8);
    // `read` re-reads anything.
    let c = store.read(h.id(), Stream::Stdout, 0, 100).unwrap();
    assert_eq!(
        (c.text.as_str(), c.end, c.total, c.eof),
        ("one\ntwo\n", 8, 8, true)
    );
}

#[tokio::test]
async fn wait_times_out_when_nothing_happens_and_wakes_on_output() {
    let (_dir, store) = open("timeout", 20_000, 1 << 30);
    let h = store.create(JobKind::Python, Some("s1"), "sleep").unwrap();
    let t = Instant::now();
    let s = store
        .wait(h.id(), Duration::from_millis(200))
        .await
        .unwrap();
    assert!(t.elapsed() >= Duration::from_millis(190));
    assert_eq!(s.status, JobStatus::Running);
    assert!(s.stdout.is_empty() && s.stderr.is_empty());

    let h2 = h.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        h2.append(Stream::Stdout, b"tick\n");
    });
    // Output ends the wait, not the hour-long window.
    let s = tokio::time::timeout(
        Duration::from_secs(60),
        store.wait(h.id(), Duration::from_secs(3600)),
    )
    .await
    .expect("the wait woke on output")
    .unwrap();
    assert_eq!(s.stdout.head, "tick\n");
}

#[tokio::test]
async fn settled_wait_ignores_output_until_the_end() {
    let (_dir, store) = open("settled", 20_000, 1 << 30);
    let h = store.create(JobKind::Shell, None, "x").unwrap();
    let h2 = h.clone();
    tokio::spawn(async move {
        h2.append(Stream::Stdout, b"a");
        tokio::time::sleep(Duration::from_millis(100)).await;
        h2.append(Stream::Stdout, b"b");
        h2.finish(done());
    });
    let s = store
        .wait_for(h.id(), Duration::from_secs(5), WaitFor::Settled)
        .await
        .unwrap();
    assert_eq!(
        (s.status, s.stdout.head.as_str()),
        (JobStatus::Completed, "ab")
    );
}

#[tokio::test]
async fn input_requests_are_reported_and_routed() {
    struct Feed(Mutex<Vec<(String, bool)>>);
    impl JobControl for Feed {
        fn cancel(&self) {}
        fn send_input(&self, text: &str, eof: bool) -> Result<(), String> {
            self.0.lock().unwrap().push((text.into(), eof));
            Ok(())
        }
    }
    let (_dir, store) = open("input", 20_000, 1 << 30);
    let h = store
        .create(JobKind::Python, Some("main"), "input()")
        .unwrap();
    let err = store.send_input(h.id(), "x", false).unwrap_err();
    assert!(err.to_string().contains("nothing controls it"), "{err}");
    let feed = Arc::new(Feed(Mutex::new(Vec::new())));
    h.set_control(feed.clone());
    h.awaiting_input("name? ");
    let s = store.wait(h.id(), Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        (s.status, s.prompt.as_deref()),
        (JobStatus::AwaitingInput, Some("name? "))
    );
    store.send_input(h.id(), "bob\n", false).unwrap();
    assert!(
        store
            .send_input(h.id(), "", false)
            .unwrap_err()
            .to_string()
            .contains("nothing to send")
    );
    h.resumed();
    assert_eq!(store.summary(h.id()).unwrap().status, JobStatus::Running);
    assert_eq!(*feed.0.lock().unwrap(), vec![("bob\n".to_string(), false)]);
    h.finish(done());
    let err = store.send_input(h.id(), "more", false).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "job {} has already finished (completed); it takes no more input",
            h.id()
        )
    );
}

#[tokio::test]
async fn cancel_is_routed_and_failed_becomes_cancelled() {
    struct Cancel(Mutex<u32>);
    impl JobControl for Cancel {
        fn cancel(&self) {
            *self.0.lock().unwrap() += 1;
        }
        fn send_input(&self, _: &str, _: bool) -> Result<(), String> {
            Err("not reading".into())
        }
    }
    let (_dir, store) = open("cancel", 20_000, 1 << 30);
    let h = store.create(JobKind::Python, None, "loop").unwrap();
    // A cancel before the control is registered is applied on registration.
    store.cancel(h.id()).unwrap();
    let c = Arc::new(Cancel(Mutex::new(0)));
    h.set_control(c.clone());
    assert_eq!(*c.0.lock().unwrap(), 1);
    let err = store.send_input(h.id(), "x", false).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("job {} did not take the input: not reading", h.id())
    );
    h.finish(JobOutcome {
        status: JobStatus::Failed,
        message: Some("KeyboardInterrupt".into()),
        ..Default::default()
    });
    let s = store.peek(h.id()).unwrap();
    assert_eq!(s.status, JobStatus::Cancelled);
    assert!(
        store
            .cancel(h.id())
            .unwrap_err()
            .to_string()
            .contains("nothing to cancel")
    );
}

#[tokio::test]
async fn big_output_is_excerpted_and_every_byte_is_readable() {
    let (_dir, store) = open("big", 1000, 1 << 30);
    let h = store.create(JobKind::Shell, None, "seq").unwrap();
    let data: Vec<u8> = (0..5000)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect();
    for chunk in data.chunks(777) {
        h.append(Stream::Stdout, chunk);
    }
    h.finish(done());
    let s = store.wait(h.id(), Duration::from_secs(1)).await.unwrap();
    let [a, b] = s.stdout.omitted.unwrap();
    assert_eq!(s.stdout.head.as_bytes(), &data[..a as usize]);
    assert_eq!(
        s.stdout.tail.as_deref().unwrap().as_bytes(),
        &data[b as usize..]
    );
    assert!(s.stdout.head.len() + s.stdout.tail.as_ref().unwrap().len() <= 1000);
    // Page through everything with reads capped at response_bytes.
    let mut got = Vec::new();
    let mut off = 0;
    loop {
        let c = store.read(h.id(), Stream::Stdout, off, 1 << 20).unwrap();
        assert!(c.end - c.offset <= 1000);
        got.extend_from_slice(c.text.as_bytes());
        off = c.end;
        if c.eof {
            break;
        }
    }
    assert_eq!(got, data);
    let err = store
        .read(h.id(), Stream::Stdout, data.len() as u64 + 1, 10)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "offset {} is past the end of stdout of job {}, which has {} bytes",
            data.len() + 1,
            h.id(),
            data.len()
        )
    );
    let hits = store
        .search(h.id(), Stream::Stdout, "^4(8|9)99$", 1, 10)
        .unwrap();
    assert_eq!(
        hits.iter().map(|h| h.text.as_str()).collect::<Vec<_>>(),
        vec!["4899", "4999"]
    );
    assert_eq!(hits[0].before, vec!["4898"]);
    assert!(store.search(h.id(), Stream::Stdout, "(", 0, 10).is_err());
}

#[tokio::test]
async fn a_partly_written_character_is_held_back_while_running() {
    let (_dir, store) = open("utf8", 20_000, 1 << 30);
    let h = store.create(JobKind::Shell, None, "x").unwrap();
    let euro = "€".as_bytes();
    h.append(Stream::Stdout, b"a");
    h.append(Stream::Stdout, &euro[..2]);
    let s = store
        .wait(h.id(), Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!((s.stdout.head.as_str(), s.stdout.end), ("a", 1));
    h.append(Stream::Stdout, &euro[2..]);
    let s = store
        .wait(h.id(), Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(
        (s.stdout.head.as_str(), s.stdout.offset, s.stdout.end),
        ("€", 1, 4)
    );
    // A job that ends mid-character delivers the bytes, replaced.
    h.append(Stream::Stdout, &euro[..1]);
    h.finish(done());
    let s = store
        .wait(h.id(), Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(s.stdout.head, "\u{FFFD}");
}

#[tokio::test]
async fn restart_keeps_finished_jobs_and_marks_running_ones_lost() {
    let (_scratch, dir) = scratch_path("jobs-store-restart", "state");
    let cfg = config(dir.clone());
    let (done_id, running_id) = {
        let store = JobStore::open(cfg.clone()).unwrap();
        let a = store
            .create(JobKind::Shell, Some("s"), "echo kept")
            .unwrap();
        a.append(Stream::Stdout, b"kept\n");
        a.finish(JobOutcome {
            result: Some(serde_json::json!({"v": 1})),
            ..done()
        });
        let b = store.create(JobKind::Shell, None, "sleep 100").unwrap();
        b.append(Stream::Stdout, b"partial");
        (a.id().to_string(), b.id().to_string())
    };
    let store = JobStore::open(cfg).unwrap();
    let a = store.peek(&done_id).unwrap();
    assert_eq!(
        (a.status, a.session.as_deref(), a.label.as_str()),
        (JobStatus::Completed, Some("s"), "echo kept")
    );
    assert_eq!(a.result, Some(serde_json::json!({"v": 1})));
    assert_eq!(
        store.read(&done_id, Stream::Stdout, 0, 100).unwrap().text,
        "kept\n"
    );
    let b = store.summary(&running_id).unwrap();
    assert_eq!(b.status, JobStatus::Lost);
    assert!(b.message.unwrap().contains("server stopped"));
    assert_eq!(
        store
            .read(&running_id, Stream::Stdout, 0, 100)
            .unwrap()
            .text,
        "partial"
    );
    // Ids are not reused.
    let c = store.create(JobKind::Shell, None, "new").unwrap();
    assert_eq!(short(c.id()), "j3");
    assert_ne!(c.id(), "j3", "a new id has a random part");
    assert_ne!(
        c.id().split_once('-').map(|(_, t)| t),
        done_id.split_once('-').map(|(_, t)| t),
        "each opening of a store draws its own"
    );
}

#[tokio::test]
async fn list_filters_and_prune_removes_files() {
    let (_dir, store) = open("prune", 20_000, 1 << 30);
    let a = store.create(JobKind::Shell, Some("s1"), "a").unwrap();
    let b = store.create(JobKind::Python, Some("s2"), "b").unwrap();
    let c = store.create(JobKind::Shell, None, "c").unwrap();
    a.append(Stream::Stdout, b"x");
    a.finish(done());
    b.finish(JobOutcome {
        status: JobStatus::Failed,
        ..Default::default()
    });
    let ids = |v: Vec<JobSummary>| v.into_iter().map(|s| short(&s.id)).collect::<Vec<_>>();
    assert_eq!(
        ids(store.list(&JobFilter::default())),
        vec!["j3", "j2", "j1"]
    );
    let shell = JobFilter {
        kind: Some(vec![JobKind::Shell]),
        ..Default::default()
    };
    assert_eq!(ids(store.list(&shell)), vec!["j3", "j1"]);
    let failed = JobFilter {
        status: Some(vec![JobStatus::Failed]),
        ..Default::default()
    };
    assert_eq!(ids(store.list(&failed)), vec!["j2"]);
    let s1 = JobFilter {
        session: Some("s1".into()),
        ..Default::default()
    };
    assert_eq!(ids(store.list(&s1)), vec!["j1"]);

    let a_dir = store.dir().join(a.id());
    assert!(a_dir.exists());
    assert_eq!(
        shorts(store.prune(&JobFilter::default()).unwrap()),
        vec!["j1", "j2"]
    );
    assert!(!a_dir.exists());
    assert_eq!(ids(store.list(&JobFilter::default())), vec!["j3"]);
    let err = store.read(a.id(), Stream::Stdout, 0, 1).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "no job with id {:?}; known jobs: {} (pruned jobs and jobs evicted by the disk cap are gone)",
            a.id(),
            c.id()
        )
    );
    // The number alone, or with another random part, names no job.
    for other in ["j3".to_string(), format!("j3-{}", "zzzzz")] {
        assert!(store.read(&other, Stream::Stdout, 0, 1).is_err(), "{other}");
    }
    assert!(
        store
            .read(&c.id().to_uppercase(), Stream::Stdout, 0, 1)
            .is_ok()
    );
    drop(c);
}

#[tokio::test]
async fn disk_cap_evicts_oldest_finished_jobs_first() {
    let (_dir, store) = open("cap", 20_000, 1000);
    let a = store.create(JobKind::Shell, None, "a").unwrap();
    a.append(Stream::Stdout, &[b'a'; 400]);
    a.finish(done());
    let b = store.create(JobKind::Shell, None, "b").unwrap();
    b.append(Stream::Stdout, &[b'b'; 400]);
    b.finish(done());
    let c = store.create(JobKind::Shell, None, "c").unwrap();
    c.append(Stream::Stdout, &[b'c'; 400]); // 1200 > 1000: evict a
    let ids: Vec<_> = store
        .list(&JobFilter::default())
        .into_iter()
        .map(|s| short(&s.id))
        .collect();
    assert_eq!(ids, vec!["j3", "j2"]);
    c.append(Stream::Stdout, &[b'c'; 500]); // evict b
    c.append(Stream::Stdout, &[b'c'; 500]); // nothing left to evict: dropped
    c.finish(done());
    let s = store.summary(c.id()).unwrap();
    assert_eq!(s.stdout_bytes, 900);
    assert!(
        s.message
            .unwrap()
            .contains("500 bytes of stdout were not kept")
    );
}

#[tokio::test]
async fn shutdown_records_jobs_that_do_not_end_as_cancelled() {
    struct Stuck;
    impl JobControl for Stuck {
        fn cancel(&self) {}
        fn send_input(&self, _: &str, _: bool) -> Result<(), String> {
            Ok(())
        }
    }
    let (_scratch, dir) = scratch_path("jobs-store-shutdown", "state");
    let cfg = config(dir);
    let id = {
        let store = JobStore::open(cfg.clone()).unwrap();
        let h = store
            .create(JobKind::Python, Some("s"), "while True: pass")
            .unwrap();
        h.set_control(Arc::new(Stuck));
        // A job whose control never answers does not hold shutdown up.
        tokio::time::timeout(Duration::from_secs(60), store.shutdown())
            .await
            .expect("shutdown is not held up by a stuck job");
        let s = store.summary(h.id()).unwrap();
        assert_eq!(s.status, JobStatus::Cancelled);
        assert_eq!(
            s.message.as_deref(),
            Some("ended because the server shut down")
        );
        h.id().to_string()
    };
    // The next server sees it cancelled, not lost.
    let store = JobStore::open(cfg).unwrap();
    assert_eq!(store.summary(&id).unwrap().status, JobStatus::Cancelled);
}

/// A record taken between a job's end and its persisting (the exit-time save of the
/// records not yet written, an index rewrite) says it has a result only with the result:
/// a small one's text is made at the end itself, under the same locks.
#[tokio::test]
async fn a_record_taken_before_the_persist_carries_the_small_result() {
    let (_scratch, dir) = scratch_path("jobs-store-inline-early", "state");
    let store = JobStore::open(config(dir)).unwrap();
    let quick = store.create(JobKind::Python, Some("s"), "1+1").unwrap();
    assert!(quick.finish_unpersisted(JobOutcome {
        result: Some(serde_json::json!({"value": "2"})),
        ..done()
    }));
    let rec = store
        .jobs()
        .map
        .values()
        .find(|j| j.id == quick.id())
        .unwrap()
        .record();
    assert!(rec.has_result);
    assert_eq!(rec.result_json.as_deref(), Some(r#"{"value":"2"}"#));
    quick.persist();
}

#[tokio::test]
async fn silent_jobs_touch_no_files_until_they_finish_and_still_come_back_lost() {
    let (_scratch, dir) = scratch_path("jobs-store-silent", "state");
    let cfg = config(dir.clone());
    {
        let store = JobStore::open(cfg.clone()).unwrap();
        let quick = store.create(JobKind::Python, Some("s"), "1+1").unwrap();
        let job_dir = store.dir().join(quick.id());
        assert!(!job_dir.exists(), "no files for a job that printed nothing");
        quick.finish(JobOutcome {
            result: Some(serde_json::json!({"value": "2"})),
            ..done()
        });
        // Its record is a line of the index, and so is its small result: no files at all.
        assert!(
            !job_dir.exists(),
            "a small result is kept in the index line"
        );
        // The fresh result is handed out once from memory, then read from disk.
        for _ in 0..2 {
            let snap = store
                .wait(quick.id(), Duration::from_secs(1))
                .await
                .unwrap();
            assert_eq!(snap.result, Some(serde_json::json!({"value": "2"})));
            assert_eq!((snap.stdout.end, snap.stderr.end), (0, 0));
        }
        assert_eq!(
            store.read(quick.id(), Stream::Stdout, 0, 10).unwrap().text,
            ""
        );
        assert!(
            store
                .search(quick.id(), Stream::Stdout, "x", 0, 5)
                .unwrap()
                .is_empty()
        );
        let pruned = store.create(JobKind::Shell, None, "true").unwrap();
        pruned.finish(done());
        let _running = store.create(JobKind::Shell, None, "sleep 100").unwrap();
        let filter = JobFilter {
            ids: Some(vec![pruned.id().to_string()]),
            ..Default::default()
        };
        assert_eq!(shorts(store.prune(&filter).unwrap()), vec!["j2"]);
        // A result over the index line's share is the one file its job has.
        let big = store
            .create(JobKind::Python, Some("s"), "'x' * 600")
            .unwrap();
        big.finish(JobOutcome {
            result: Some(big_result()),
            ..done()
        });
        let big_dir = store.dir().join(big.id());
        assert!(big_dir.join("result.json").exists() && !big_dir.join("stdout").exists());
        // No shutdown: the server "died" with j3 running.
    }
    let store = JobStore::open(cfg).unwrap();
    let ids = listed(&store);
    assert_eq!(
        ids,
        vec![
            ("j4".to_string(), JobStatus::Completed),
            ("j3".to_string(), JobStatus::Lost),
            ("j1".to_string(), JobStatus::Completed)
        ]
    );
    let j3 = full(&store, "j3");
    assert_eq!(store.read(&j3, Stream::Stdout, 0, 10).unwrap().text, "");
    // Both results come back after the restart: from the index line and from the file.
    for (short, result) in [
        ("j1", serde_json::json!({"value": "2"})),
        ("j4", big_result()),
    ] {
        let id = full(&store, short);
        let snap = store.wait(&id, Duration::from_secs(1)).await.unwrap();
        assert_eq!(snap.result, Some(result), "{short}");
    }
    // ... and after the index is rewritten from memory (compaction).
    store.compact_journal();
    let store = {
        drop(store);
        JobStore::open(config(dir)).unwrap()
    };
    let id = full(&store, "j1");
    let snap = store.wait(&id, Duration::from_secs(1)).await.unwrap();
    assert_eq!(snap.result, Some(serde_json::json!({"value": "2"})));
}

fn big_result() -> serde_json::Value {
    serde_json::json!({"value": "x".repeat(600)})
}

/// Retention keeps at most `max_jobs` jobs, counting silent ones, removes the oldest
/// finished first, never a running one, and what it removed stays gone after a restart (the index's
/// `removed` lines), without job ids being reused.
#[tokio::test]
async fn retention_keeps_the_newest_finished_jobs_silent_or_not() {
    let (_scratch, dir) = scratch_path("jobs-store-retention", "state");
    let cfg = StoreConfig {
        retention: Retention {
            max_jobs: 3,
            max_age: Duration::from_secs(3600),
        },
        ..config(dir.clone())
    };
    let running_id = {
        let store = JobStore::open(cfg.clone()).unwrap();
        let running = store.create(JobKind::Shell, None, "sleep 100").unwrap();
        for i in 0..10 {
            let h = store
                .create(JobKind::Python, None, &format!("{i}"))
                .unwrap();
            if i % 2 == 0 {
                h.append(Stream::Stdout, b"printed\n");
            }
            h.finish(done());
        }
        let ids: Vec<String> = store
            .list(&JobFilter::default())
            .into_iter()
            .map(|s| short(&s.id))
            .collect();
        assert_eq!(
            ids,
            ["j11", "j10", "j1"],
            "three jobs: the running one stays"
        );
        assert!(
            !std::fs::read_dir(store.dir())
                .unwrap()
                .any(|e| short(&e.unwrap().file_name().to_string_lossy()) == "j2"),
            "a removed job's files go too"
        );
        store.shutdown().await;
        running.id().to_string()
    };
    let store = JobStore::open(cfg.clone()).unwrap();
    let listed = listed(&store);
    // The running job was cancelled at shutdown.
    assert_eq!(
        listed,
        [
            ("j11".to_string(), JobStatus::Completed),
            ("j10".to_string(), JobStatus::Completed),
            (short(&running_id), JobStatus::Cancelled),
        ]
    );
    assert!(store.summary(&full(&store, "j9")).is_err());
    let next = store.create(JobKind::Shell, None, "true").unwrap();
    assert_eq!(short(next.id()), "j12");
    next.finish(done());
    // Now four: the oldest finished one (the cancelled j1) goes.
    assert!(store.summary(&running_id).is_err());
    // Age: a store that keeps nothing older than 0 s removes every finished job.
    drop(store);
    let store = JobStore::open(StoreConfig {
        retention: Retention {
            max_jobs: 100,
            max_age: Duration::ZERO,
        },
        ..cfg
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(5));
    store.apply_retention();
    assert!(
        store
            .list(&JobFilter::default())
            .iter()
            .all(|s| !s.status.is_finished()),
        "{:?}",
        store.list(&JobFilter::default())
    );
}

/// The table is read from the index, not the job directories: a store whose job directories
/// are gone still lists every job, with its status and delivered cursors.
#[tokio::test]
async fn restart_reads_the_index_only() {
    let (_scratch, dir) = scratch_path("jobs-store-index-only", "state");
    let cfg = config(dir.clone());
    {
        let store = JobStore::open(cfg.clone()).unwrap();
        let h = store.create(JobKind::Shell, None, "echo hi").unwrap();
        h.append(Stream::Stdout, b"hi\n");
        h.finish(done());
        let _ = store.wait(h.id(), Duration::from_secs(1)).await.unwrap();
        store.shutdown().await;
    }
    let jobs = dir.join("jobs");
    assert!(jobs.join("index.log").exists());
    let id = std::fs::read_dir(&jobs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find(|n| short(n) == "j1")
        .unwrap();
    std::fs::remove_dir_all(jobs.join(&id)).unwrap();
    let store = JobStore::open(cfg).unwrap();
    let s = store.summary(&id).unwrap();
    assert_eq!(s.status, JobStatus::Completed);
    assert_eq!(s.label, "echo hi");
}

/// Opening a store with history reads nothing: the table is read at its first use, which
/// marks the jobs that were running as `lost` (once, in the index) and gives the next id
/// after every id ever used. A server that stops without using the table changes nothing,
/// so the next one still finds the job that was running.
#[tokio::test]
async fn the_table_is_read_on_first_use_and_lost_jobs_are_still_marked() {
    let (_scratch, dir) = scratch_path("jobs-store-lazy", "state");
    let cfg = config(dir.clone());
    {
        let store = JobStore::open(cfg.clone()).unwrap();
        for _ in 0..3 {
            store
                .create(JobKind::Python, None, "1")
                .unwrap()
                .finish(done());
        }
        let _running = store.create(JobKind::Shell, None, "sleep 100").unwrap();
        // j5 is pruned, so only next_id / the index's removed line remember it.
        let j5 = store.create(JobKind::Shell, None, "true").unwrap();
        j5.finish(done());
        let filter = JobFilter {
            ids: Some(vec![j5.id().to_string()]),
            ..Default::default()
        };
        assert_eq!(shorts(store.prune(&filter).unwrap()), vec!["j5"]);
        // No shutdown: the server "died" with j4 running.
    }
    let index = dir.join("jobs").join("index.log");
    let before = std::fs::read(&index).unwrap();
    {
        // A server that is opened and stopped without a call that needs the table.
        let store = JobStore::open(cfg.clone()).unwrap();
        assert!(!store.is_loaded(), "open read the index");
        store.shutdown().await;
        assert!(!store.is_loaded());
    }
    assert_eq!(
        std::fs::read(&index).unwrap(),
        before,
        "nothing was written"
    );
    let store = JobStore::open(cfg.clone()).unwrap();
    assert!(!store.is_loaded(), "open read the index");
    // A line written after open is seen: the index is read at first use, not at open.
    let mut late = std::fs::OpenOptions::new()
        .append(true)
        .open(&index)
        .unwrap();
    std::io::Write::write_all(
        &mut late,
        br#"{"version":1,"id":"j2","kind":"python","session":null,"label":"relabelled","status":"completed","prompt":null,"exit_code":0,"signal":null,"message":null,"created_unix_ms":1,"elapsed_ms":1,"delivered":[0,0],"has_result":false}
"#,
    )
    .unwrap();
    let j4 = full(&store, "j4");
    assert!(store.is_loaded());
    assert_eq!(store.summary(&j4).unwrap().status, JobStatus::Lost);
    // A line of an older server (no random part) is read back under its own id.
    assert_eq!(store.summary("j2").unwrap().label, "relabelled");
    let next = store.create(JobKind::Shell, None, "true").unwrap();
    assert_eq!(short(next.id()), "j6", "the pruned j5 is not reused");
    next.finish(done());
    drop((next, store));
    // The lost mark was written: it survives a restart with no shutdown.
    let after = String::from_utf8(std::fs::read(&index).unwrap()).unwrap();
    assert!(
        after
            .lines()
            .any(|l| l.contains(&format!(r#""id":"{j4}""#)) && l.contains(r#""status":"lost""#)),
        "{after}"
    );
    let store = JobStore::open(cfg).unwrap();
    let listed = listed(&store);
    assert_eq!(
        listed,
        [
            ("j6".to_string(), JobStatus::Completed),
            ("j4".to_string(), JobStatus::Lost),
            ("j3".to_string(), JobStatus::Completed),
            ("j2".to_string(), JobStatus::Completed),
            ("j1".to_string(), JobStatus::Completed),
        ]
    );
}

/// Calls that come while the table is being read on its own thread wait for it: jobs
/// created from several threads at once get distinct ids after the history's, and every
/// one of them is in the table and the index.
#[tokio::test]
async fn calls_racing_the_background_read_wait_for_it() {
    let (_scratch, dir) = scratch_path("jobs-store-racing", "state");
    let cfg = config(dir.clone());
    {
        let store = JobStore::open(cfg.clone()).unwrap();
        for i in 0..500 {
            let h = store
                .create(JobKind::Python, None, &format!("cell {i}"))
                .unwrap();
            h.append(Stream::Stdout, b"out\n");
            h.finish(done());
        }
        store.shutdown().await;
    }
    for round in 0..5 {
        let store = JobStore::open(cfg.clone()).unwrap();
        store.load_in_background();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let store = store.clone();
                std::thread::spawn(move || {
                    let h = store.create(JobKind::Shell, None, "true").unwrap();
                    h.finish(done());
                    h.id().to_string()
                })
            })
            .collect();
        let mut ids: Vec<String> = threads
            .into_iter()
            .map(|t| short(&t.join().unwrap()))
            .collect();
        ids.sort_by_key(|id| persist::parse_id(id));
        let want: Vec<String> = (0..4)
            .map(|i| format!("j{}", 501 + round * 4 + i))
            .collect();
        assert_eq!(ids, want, "round {round}");
        assert_eq!(
            store.list(&JobFilter::default()).len(),
            500 + (round + 1) * 4
        );
        // Let the background thread finish with the store before the next open.
        while Arc::strong_count(&store) > 1 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[tokio::test]
async fn a_store_with_no_history_writes_nothing_when_its_table_is_read() {
    let (scratch, store) = open("no-history", 20_000, 1 << 30);
    assert!(listed(&store).is_empty());
    let mut names: Vec<String> = std::fs::read_dir(scratch.path().join("state/jobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    // The lock, the (empty) index opened for appending and the disk reserve: no
    // `next_id`, no rewritten index.
    assert!(
        !names.iter().any(|n| n == "next_id" || n.ends_with(".tmp")),
        "{names:?}"
    );
    let index = scratch.path().join("state/jobs/index.log");
    assert_eq!(std::fs::metadata(index).unwrap().len(), 0);
}

/// Output that arrives while several callers wait on one job goes to every one of them
/// (each waiter has its own cursors from when it began), not only to the first woken.
#[tokio::test]
async fn every_concurrent_waiter_gets_the_output_that_arrived_while_it_waited() {
    let (_dir, store) = open("waiters", 20_000, 1 << 30);
    let h = store.create(JobKind::Shell, None, "x").unwrap();
    let job = store.get(h.id()).unwrap();
    let mut waiters = Vec::new();
    for _ in 0..50 {
        let (store, id) = (store.clone(), h.id().to_string());
        waiters.push(tokio::spawn(async move {
            store
                .wait_for(&id, Duration::from_secs(60), WaitFor::Settled)
                .await
                .unwrap()
        }));
    }
    // Every waiter has subscribed (so has taken its cursors) before anything arrives.
    while job.version.receiver_count() < 50 {
        tokio::task::yield_now().await;
    }
    h.append(Stream::Stdout, b"hello\n");
    h.finish(done());
    for w in waiters {
        let s = w.await.unwrap();
        assert_eq!(
            (s.status, s.stdout.head.as_str()),
            (JobStatus::Completed, "hello\n")
        );
    }
    // A later wait starts after what was delivered: nothing is handed out twice to it.
    let later = store.wait(h.id(), Duration::from_secs(1)).await.unwrap();
    assert_eq!(later.stdout.head, "");
}

/// One job keeps at most a quarter of the disk cap: a flood in one session stops there, and
/// another job's output is still kept (it was dropped once the flood had taken the cap).
#[tokio::test]
async fn a_flooding_job_keeps_only_its_share_and_others_still_get_room() {
    let cap = 8 << 20;
    let (_dir, store) = open("share", 20_000, cap);
    let flood = store.create(JobKind::Shell, None, "yes").unwrap();
    let chunk = vec![b'y'; 64 << 10];
    for _ in 0..256 {
        flood.append(Stream::Stdout, &chunk); // 16 MiB offered
    }
    let other = store
        .create(JobKind::Python, Some("b"), "print(42)")
        .unwrap();
    other.append(Stream::Stdout, b"42\n");
    other.finish(done());
    flood.finish(done());
    let f = store.summary(flood.id()).unwrap();
    assert_eq!(f.stdout_bytes, cap / 4);
    let msg = f.message.unwrap();
    assert!(
        msg.contains("bytes per job") && msg.contains("job_output"),
        "{msg}"
    );
    assert_eq!(store.summary(other.id()).unwrap().stdout_bytes, 3);
}

/// A handle given to a job names it after a restart while the job is kept; a pruned job's
/// handle names nothing, and its line is dropped from the file when next read.
#[tokio::test]
async fn handles_outlive_a_restart_with_their_job() {
    let (_scratch, dir) = scratch_path("jobs-store-handles", "state");
    let cfg = config(dir.clone());
    let (kept, gone) = {
        let store = JobStore::open(cfg.clone()).unwrap();
        let kept = store.create(JobKind::Shell, None, "kept").unwrap();
        let gone = store.create(JobKind::Shell, None, "gone").unwrap();
        store.add_handle(kept.id(), "task-a").unwrap();
        store.add_handle(gone.id(), "task-b").unwrap();
        assert!(store.add_handle("j99-zzzzz", "task-c").is_err());
        assert!(store.add_handle(kept.id(), "two\nlines").is_err());
        assert_eq!(store.job_of_handle("task-a").unwrap().job, kept.id());
        (kept.id().to_string(), gone.id().to_string())
        // No shutdown: the server "died" with both running.
    };
    let store = JobStore::open(cfg.clone()).unwrap();
    assert_eq!(store.job_of_handle("task-a").unwrap().job, kept);
    assert_eq!(store.summary(&kept).unwrap().status, JobStatus::Lost);
    let filter = JobFilter {
        ids: Some(vec![gone.clone()]),
        ..Default::default()
    };
    store.prune(&filter).unwrap();
    assert!(store.job_of_handle("task-b").is_none());
    assert!(store.job_of_handle("task-z").is_none());
    drop(store);
    let store = JobStore::open(cfg).unwrap();
    assert!(store.job_of_handle("task-b").is_none());
    let file = std::fs::read_to_string(store.dir().join("handles.log")).unwrap();
    assert!(
        file.contains("task-a") && !file.contains("task-b"),
        "{file}"
    );
}

/// A server that gives handles to jobs it later prunes keeps `handles.log` in proportion
/// to the handles still live, without a restart; live handles survive the rewrites.
#[tokio::test]
async fn the_handles_file_is_compacted_while_the_server_runs() {
    let (_scratch, dir) = scratch_path("jobs-store-handles-compact", "state");
    let store = JobStore::open(config(dir)).unwrap();
    let kept = store.create(JobKind::Shell, None, "kept").unwrap();
    store.add_handle(kept.id(), "task-kept").unwrap();
    let lines = || {
        std::fs::read_to_string(store.dir().join("handles.log"))
            .unwrap()
            .lines()
            .count()
    };
    let mut most = 0;
    for i in 0..400 {
        let job = store.create(JobKind::Shell, None, "short").unwrap();
        store.add_handle(job.id(), &format!("task-{i}")).unwrap();
        job.finish(done());
        let filter = JobFilter {
            ids: Some(vec![job.id().to_string()]),
            ..Default::default()
        };
        store.prune(&filter).unwrap();
        most = most.max(lines());
    }
    // At most two live handles when it is rewritten (the kept one, the one just added):
    // the file never holds more than 2 × 2 + SLACK + the line just added.
    assert!(most <= 2 * 2 + 64 + 1, "handles.log grew to {most} lines");
    assert!(
        most > 64,
        "the file was rewritten before it held its slack: {most}"
    );
    assert_eq!(store.job_of_handle("task-kept").unwrap().job, kept.id());
    assert!(store.job_of_handle("task-399").is_none());
}

/// Past retention, the index is rewritten on a thread of its own while jobs go on
/// starting and ending (each rewrite takes the index's lock only to begin, switch and
/// place the new file): jobs keep being made across several rewrites, the index stays
/// bounded, and a restart finds exactly the retained jobs.
#[tokio::test]
async fn index_rewrites_run_beside_new_jobs_and_keep_every_retained_one() {
    let (_scratch, dir) = scratch_path("jobs-store-rewrite", "state");
    let cfg = StoreConfig {
        retention: Retention {
            max_jobs: 5,
            max_age: Duration::from_secs(3600),
        },
        ..config(dir.clone())
    };
    let store = JobStore::open(cfg.clone()).unwrap();
    let index = store.dir().join("index.log");
    let lines = || {
        std::fs::read_to_string(&index)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    // Three lines a job past retention (start, end, removal): a rewrite every ~700 jobs.
    let (tx, rx) = std::sync::mpsc::channel();
    let made = std::thread::spawn({
        let store = store.clone();
        move || {
            for i in 0..3000 {
                let h = store
                    .create(JobKind::Python, None, &format!("{i}"))
                    .unwrap();
                h.finish(done());
            }
            let _ = tx.send(());
        }
    });
    // Hang guard only: a deadlock of a rewrite with the jobs it runs beside stops here.
    rx.recv_timeout(Duration::from_secs(120))
        .expect("jobs were still being made after 120 s: a rewrite blocked them");
    made.join().unwrap();
    // The last rewrite may still be running: wait for the index to settle.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while lines() > 2048 + 2 * 5 + 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        lines() <= 2048 + 2 * 5 + 3,
        "index not rewritten: {} lines",
        lines()
    );
    let kept = shorts(
        store
            .list(&JobFilter::default())
            .into_iter()
            .map(|s| s.id)
            .collect(),
    );
    assert_eq!(kept, ["j3000", "j2999", "j2998", "j2997", "j2996"]);
    store.shutdown().await;
    // The last rewrite's thread holds the store (and the directory's lock) until it has
    // closed the old index: a store opened before that gets a directory of its own
    // (`jobs.2`), empty.
    let gone = Arc::downgrade(&store);
    drop(store);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while gone.upgrade().is_some() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let again = JobStore::open(cfg).unwrap();
    let listed = listed(&again);
    assert_eq!(
        listed.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["j3000", "j2999", "j2998", "j2997", "j2996"]
    );
    assert!(listed.iter().all(|(_, s)| *s == JobStatus::Completed));
    let leftovers: Vec<_> = std::fs::read_dir(again.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

/// An admission holds a place among the running jobs until it is used or dropped (the
/// quota counts jobs admitted and not yet created: a shell job's process being set up),
/// or its job has finished.
#[test]
fn an_admission_holds_a_place_until_used_or_dropped() {
    let (scratch, dir) = scratch_path("jobs-store-admission", "state");
    let store = JobStore::open(StoreConfig {
        max_running: Some(1),
        ..config(dir)
    })
    .unwrap();
    let first = store.admit().unwrap();
    assert!(matches!(
        store.admit(),
        Err(JobError::TooManyRunning { limit: 1 })
    ));
    drop(first);
    let again = store.admit().unwrap();
    let h = store
        .create_admitted(again, JobKind::Shell, None, "x")
        .unwrap();
    assert!(matches!(
        store.admit(),
        Err(JobError::TooManyRunning { limit: 1 })
    ));
    // Free as soon as the job is finished, before its record is written: a caller told
    // of the end may start the next job at once.
    assert!(h.finish_unpersisted(done()));
    let next = store.admit().expect("the finished job's place is free");
    drop(next);
    h.persist();
    drop(h);
    drop(store);
    drop(scratch);
}
