//! One job in memory ([`Job`]) and the producer's side of it ([`JobHandle`]).
//!
//! # Locks and channels
//!
//! Every lock is a `std::sync::Mutex` held for a few field updates or one spool write,
//! never across an `.await` and never while calling code outside this module (a
//! [`JobControl`], a session). Poisoning is recovered ([`lock`]): the data stays
//! consistent because every critical section is a handful of assignments.
//!
//! - `Job::state` ([`JobState`]): status, prompt, exit facts, the delivered cursors,
//!   `cancel_requested` / `shutting_down`. Producers (the handle), waiters (snapshots)
//!   and cancel/input routing all read and write it, from tasks and from the output
//!   pump's threads.
//! - `Job::spools[0]`, `Job::spools[1]` (stdout, stderr): the append-only spool files and
//!   their lengths. Separate from `state` so a job printing fast does not contend with
//!   the status a waiter reads; a snapshot takes both under `state` to cut a consistent
//!   range.
//! - `Job::result` ([`ResultSlot`]): the finished job's structured result while it is
//!   not yet both on disk and delivered. Separate because writing `result.json` happens
//!   outside `state`.
//! - `Job::control`: the [`JobControl`] that cancels the job or feeds its input. Only
//!   held to clone or replace the `Arc`; the clone is called after the lock is released,
//!   because a control calls into a session or a process and may call back into the
//!   handle (an input reply flips the status through `state`).
//! - `JobStore::journal` and `JobStore::table` (store.rs): the index of job records and
//!   the table.
//!
//! Lock order (a thread holding one may only take those to its right):
//! `JobStore::journal` → `JobStore::table` → `Job::state` → `Job::spools[0]` →
//! `Job::spools[1]` → `Job::result`; `Job::control` is taken alone. So
//! [`JobHandle::append`] makes room under the disk cap (the table, then each finished job's
//! `state` and spools) *before* it takes its own spool lock, not while holding it.
//!
//! Channel: `Job::version` is a `tokio::sync::watch` sender bumped after every change a
//! waiter may care about (output appended, input requested or resumed, finished). Each
//! waiter subscribes and marks the current version seen *before* checking the state, so
//! no change can slip between the check and the await. The sender lives as long as the
//! job, so a waiter never sees it close: waits end on the job's state or their timeout.
//!
//! Shutdown flows through them in one direction: `JobStore::shutdown` takes `jobs` to
//! list the running jobs and releases it; for each it sets `cancel_requested` and
//! `shutting_down` under `state`, clones the control and calls `kill` outside the lock;
//! then it waits on each job's `version` (up to a deadline) for the producer's
//! [`Job::finish`], and finishes the stragglers itself as cancelled. `finish` takes
//! `state`, closes the spools (later output is ignored), parks the result, drops the
//! control (its pipes and tasks), and bumps `version`, which wakes every waiter with the
//! final snapshot. Last, every record is written for the next start.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use super::persist::{self, JobRecord};
use super::spool::Spool;
use super::store::JobStore;
use super::{JobControl, JobId, JobKind, JobOutcome, JobStatus, JobSummary, Stream};

/// Lock a mutex, recovering the data if a thread panicked while holding it (the
/// state is simple enough to stay consistent).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A finished job's result in memory: answers come from here without touching the
/// disk. It is dropped once it is both stored and delivered by a `wait` (later reads
/// load it), so memory holds only results nobody has seen yet — and the small ones
/// stored in the job's index line ([`persist::INLINE_RESULT_MAX`] bytes of JSON at
/// most), whose text stays here for as long as the job is kept: the index is rewritten
/// from memory.
#[derive(Debug, Default)]
pub(crate) struct ResultSlot {
    pub value: Option<serde_json::Value>,
    pub on_disk: bool,
    pub delivered: bool,
    /// The result's JSON text when it is stored in the job's index line, not in
    /// `result.json`.
    pub inline: Option<Box<str>>,
}

/// Mutable state of a job.
#[derive(Debug, Clone)]
pub(crate) struct JobState {
    pub status: JobStatus,
    pub prompt: Option<String>,
    /// The pending input is a secret (getpass).
    pub secret: bool,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub message: Option<String>,
    /// Set once the job finished (or when loaded from disk).
    pub elapsed_ms: Option<u64>,
    /// How far `wait` has delivered each stream.
    pub delivered: [u64; 2],
    pub cancel_requested: bool,
    /// The caller's time limit ended the job (the cancel it caused), in words.
    pub timed_out: Option<String>,
    pub shutting_down: bool,
    pub has_result: bool,
}

/// The fixed facts of a job, to build it.
pub(crate) struct JobMeta {
    pub id: JobId,
    pub kind: JobKind,
    pub session: Option<String>,
    pub label: String,
    pub created_unix_ms: u64,
    pub dir: PathBuf,
}

pub(crate) struct Job {
    pub id: JobId,
    pub kind: JobKind,
    pub session: Option<String>,
    pub label: String,
    pub created_unix_ms: u64,
    pub started: Instant,
    pub dir: PathBuf,
    /// Status and cursors; see the module docs for the lock order.
    pub state: Mutex<JobState>,
    /// stdout, stderr spools (taken after `state`, stdout before stderr).
    pub spools: [Mutex<Spool>; 2],
    /// Bumped after every change a waiter may care about (see the module docs).
    pub version: watch::Sender<u64>,
    /// Cancels the job and feeds its input; held only to clone or replace the `Arc`.
    pub control: Mutex<Option<Arc<dyn JobControl>>>,
    /// The structured result of a job that finished in this server (see [`ResultSlot`]);
    /// the last lock in the order.
    pub result: Mutex<ResultSlot>,
    /// Set when prune or eviction removed the job, so a late write of its files is
    /// undone.
    pub removed: AtomicBool,
    /// Whether we already logged that output is being dropped (disk cap).
    pub drop_warned: AtomicBool,
    /// Whether `job.json` holds the current record; until it does, rewriting the log of
    /// started jobs keeps the job's record there (a full disk must not lose a job).
    pub record_saved: AtomicBool,
}

impl Job {
    pub(crate) fn new(meta: JobMeta, state: JobState, spools: [Spool; 2]) -> Job {
        let [out, err] = spools;
        Job {
            id: meta.id,
            kind: meta.kind,
            session: meta.session,
            label: meta.label,
            created_unix_ms: meta.created_unix_ms,
            started: Instant::now(),
            dir: meta.dir,
            state: Mutex::new(state),
            spools: [Mutex::new(out), Mutex::new(err)],
            version: watch::Sender::new(0),
            control: Mutex::new(None),
            result: Mutex::new(ResultSlot::default()),
            removed: AtomicBool::new(false),
            drop_warned: AtomicBool::new(false),
            record_saved: AtomicBool::new(false),
        }
    }

    /// Wake every waiter.
    pub(crate) fn bump(&self) {
        self.version.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub(crate) fn elapsed_ms(&self, st: &JobState) -> u64 {
        st.elapsed_ms
            .unwrap_or_else(|| self.started.elapsed().as_millis() as u64)
    }

    pub(crate) fn lens(&self) -> [u64; 2] {
        [lock(&self.spools[0]).len(), lock(&self.spools[1]).len()]
    }

    pub(crate) fn record(&self) -> JobRecord {
        let st = lock(&self.state);
        let bytes = Some(self.lens());
        let result_json = lock(&self.result).inline.as_deref().map(str::to_string);
        JobRecord {
            version: persist::RECORD_VERSION,
            id: self.id.clone(),
            kind: self.kind,
            session: self.session.clone(),
            label: self.label.clone(),
            status: st.status,
            prompt: st.prompt.clone(),
            exit_code: st.exit_code,
            signal: st.signal.clone(),
            message: st.message.clone(),
            created_unix_ms: self.created_unix_ms,
            elapsed_ms: self.elapsed_ms(&st),
            delivered: st.delivered,
            has_result: st.has_result,
            from_journal: false,
            bytes,
            removed: false,
            result_json,
        }
    }

    /// The stored result of a finished job: from its index line (kept in memory) or
    /// from `result.json`. Takes `result`: call it without holding that lock.
    pub(crate) fn stored_result(&self) -> Option<serde_json::Value> {
        let inline = lock(&self.result).inline.clone();
        match inline {
            Some(text) => serde_json::from_str(&text).ok(),
            None => persist::load_result(&self.dir),
        }
    }

    pub(crate) fn summary(&self) -> JobSummary {
        let st = lock(&self.state);
        let [stdout_bytes, stderr_bytes] = self.lens();
        JobSummary {
            id: self.id.clone(),
            kind: self.kind,
            session: self.session.clone(),
            label: self.label.clone(),
            status: st.status,
            created_unix_ms: self.created_unix_ms,
            elapsed_ms: self.elapsed_ms(&st),
            exit_code: st.exit_code,
            signal: st.signal.clone(),
            message: st.message.clone(),
            prompt: st.prompt.clone(),
            stdout_bytes,
            stderr_bytes,
        }
    }

    pub(crate) fn is_finished(&self) -> bool {
        lock(&self.state).status.is_finished()
    }

    /// Record how the job ended; returns false if it had already finished. `disk_cap`
    /// and `state_dir` are for the words on output that was not kept; `ended` runs under
    /// the job's state lock as the end is recorded, so nobody reads the job finished
    /// before it ran (the store frees the job's place in the running quota there). Wakes
    /// nobody: the caller does the rest of its bookkeeping, then [`bump`](Self::bump)s.
    pub(crate) fn finish(
        &self,
        outcome: JobOutcome,
        disk_cap: u64,
        state_dir: &Path,
        ended: impl FnOnce(),
    ) -> bool {
        let mut st = lock(&self.state);
        if st.status.is_finished() {
            return false;
        }
        let mut status = outcome.status;
        let mut message = outcome.message;
        if !status.is_finished() {
            tracing::warn!(job = %self.id, ?status, "job finished with a non-final status; recording it as failed");
            status = JobStatus::Failed;
        }
        if st.cancel_requested && status == JobStatus::Failed {
            status = JobStatus::Cancelled;
        }
        if let Some(words) = st.timed_out.clone()
            && status != JobStatus::Completed
        {
            // Not a cancel the caller asked for: the job failed its time limit.
            status = JobStatus::Failed;
            let rest = message
                .as_deref()
                .map(|m| m.strip_prefix("cancelled: ").unwrap_or(m))
                .filter(|m| !m.is_empty());
            message = Some(match rest {
                Some(r) => format!("{words}: {r}"),
                None => words,
            });
        }
        if st.shutting_down {
            message = Some(join_sentences(
                message,
                "ended because the server shut down",
            ));
        }
        let mut full = Vec::new();
        for (i, spool) in self.spools.iter().enumerate() {
            let mut spool = lock(spool);
            spool.close();
            let stream = if i == 0 {
                Stream::Stdout
            } else {
                Stream::Stderr
            };
            if let Some(at) = spool.full_at() {
                full.push(format!(
                    "output truncated at byte {at} ({stream}; {} bytes were not kept)",
                    spool.dropped()
                ));
            } else if spool.dropped() > 0 {
                let note = format!(
                    "{} bytes of {stream} were not kept (job output is capped: {} bytes per job, \
                     {disk_cap} bytes for all jobs together; what was kept is readable with job_output)",
                    spool.dropped(),
                    job_share(disk_cap)
                );
                message = Some(join_sentences(message, &note));
            }
        }
        if !full.is_empty() {
            // The output is incomplete: whatever the process did, the job did not
            // deliver what it printed.
            if matches!(status, JobStatus::Completed | JobStatus::Failed) {
                status = JobStatus::Failed;
            }
            let note = format!(
                "state directory is full ({}): {}; free space there (or remove old jobs with job_prune) before running more",
                state_dir.display(),
                full.join(", ")
            );
            message = Some(join_sentences(message, &note));
        }
        if let Some(result) = outcome.result {
            // Written to disk by `JobHandle::finish` after waiters were woken. A small one
            // gets its index-line text here, under the same locks as `has_result`: any
            // record that says it has a result carries it (or it is in `result.json`).
            st.has_result = true;
            let mut slot = lock(&self.result);
            slot.inline = persist::inline_text(&result);
            slot.value = Some(result);
        }
        st.elapsed_ms = Some(self.started.elapsed().as_millis() as u64);
        self.record_saved.store(false, Ordering::SeqCst);
        st.status = status;
        st.prompt = None;
        st.secret = false;
        st.exit_code = outcome.exit_code;
        st.signal = outcome.signal;
        st.message = message;
        ended();
        drop(st);
        // Drop the control: it may hold pipes and tasks of a process that is gone.
        lock(&self.control).take();
        true
    }
}

fn join_sentences(first: Option<String>, second: &str) -> String {
    match first {
        Some(f) if !f.is_empty() => format!("{f}; {second}"),
        _ => second.to_string(),
    }
}

/// The producer's side of a job: push output, report input requests, finish.
/// Cheap to clone; every clone refers to the same job.
#[derive(Clone)]
pub struct JobHandle {
    pub(crate) store: Arc<JobStore>,
    pub(crate) job: Arc<Job>,
}

impl std::fmt::Debug for JobHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobHandle")
            .field("id", &self.job.id)
            .finish()
    }
}

impl JobHandle {
    pub fn id(&self) -> &str {
        &self.job.id
    }

    pub fn kind(&self) -> JobKind {
        self.job.kind
    }

    /// Register what cancels the job and feeds its input. If a cancel was requested
    /// before the control existed, it is applied now.
    pub fn set_control(&self, c: Arc<dyn JobControl>) {
        let cancel_now = lock(&self.job.state).cancel_requested;
        *lock(&self.job.control) = Some(c.clone());
        if cancel_now {
            c.cancel();
        }
    }

    /// Whether someone asked to cancel this job.
    pub fn cancel_requested(&self) -> bool {
        lock(&self.job.state).cancel_requested
    }

    /// Spool `data` to disk and wake waiters. Never blocks on anything but the write
    /// to the spool file; never fails (a write error is logged and the bytes are
    /// counted as dropped, reported when the job finishes).
    pub fn append(&self, stream: Stream, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let n = data.len() as u64;
        // One job may hold at most its share of the cap: a flood in one session must not
        // leave every other job's output unkept.
        let held: u64 = self.job.lens().iter().sum();
        let share = job_share(self.store.config().disk_cap);
        let room = held.saturating_add(n) <= share && self.store.make_room(n);
        {
            let mut spool = lock(&self.job.spools[stream.index()]);
            if spool.is_closed() {
                // Output racing the end of the job (e.g. a late chunk of a worker that
                // already reported its outcome): the record is final, ignore it.
                tracing::debug!(job = %self.job.id, bytes = n, "output after the job finished ignored");
                return;
            }
            if !room {
                spool.drop_bytes(n);
                if !self.job.drop_warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(job = %self.job.id, "disk cap for job output reached; dropping output");
                }
            } else {
                let before = spool.len();
                let res = spool.append(data);
                self.store.add_disk_used(spool.len() - before);
                if let Err(e) = res
                    && !self.job.drop_warned.swap(true, Ordering::Relaxed)
                {
                    tracing::warn!(job = %self.job.id, error = %e, "could not spool job output");
                }
            }
        }
        self.job.bump();
    }

    /// The job is blocked reading input; `prompt` is what it printed as a prompt.
    pub fn awaiting_input(&self, prompt: &str) {
        self.asks(prompt, false);
    }

    /// The same for a secret (getpass): the report says so.
    pub fn awaiting_secret_input(&self, prompt: &str) {
        self.asks(prompt, true);
    }

    fn asks(&self, prompt: &str, secret: bool) {
        {
            let mut st = lock(&self.job.state);
            if st.status.is_finished() {
                return;
            }
            st.status = JobStatus::AwaitingInput;
            st.prompt = Some(prompt.to_string());
            st.secret = secret;
        }
        self.job.bump();
    }

    /// The job got its input and runs again.
    pub fn resumed(&self) {
        {
            let mut st = lock(&self.job.state);
            if st.status != JobStatus::AwaitingInput {
                return;
            }
            st.status = JobStatus::Running;
            st.prompt = None;
            st.secret = false;
        }
        self.job.bump();
    }

    /// Record how the job ended. Later calls are ignored. If a cancel was requested,
    /// a `Failed` outcome is recorded as `Cancelled`.
    pub fn finish(&self, outcome: JobOutcome) {
        if self.finish_unpersisted(outcome) {
            self.persist();
        }
    }

    /// Like [`finish`](Self::finish), but the job's files are written only by
    /// [`persist`](Self::persist), which the caller must call soon after (until then a
    /// restart would report the job as lost). Lets an async producer hand the thread to
    /// the woken waiters first: they answer from memory. Returns false if the job had
    /// already finished (nothing to persist).
    pub fn finish_unpersisted(&self, outcome: JobOutcome) -> bool {
        let cfg = self.store.config();
        // The job's place in the running quota is freed as its end is recorded: whoever
        // sees it finished may start the next job at once.
        let finished = (self.job).finish(outcome, cfg.disk_cap, &cfg.state_dir, || {
            self.store.job_ended()
        });
        if finished {
            // Before anyone is woken: whoever lists the jobs at once finds the table already
            // within the retention limits (the CI once listed one job too many).
            self.store.apply_retention();
            self.job.bump();
        }
        finished
    }

    /// Write a finished job's result and record (see [`finish_unpersisted`](Self::finish_unpersisted)).
    pub fn persist(&self) {
        self.store.persist_finished(&self.job);
    }
}

/// The most output one job may keep on disk: a quarter of the cap for all jobs (at least
/// 1 MiB), so that a few floods still leave room for every other job's output.
pub(crate) fn job_share(disk_cap: u64) -> u64 {
    (disk_cap / 4).max((1 << 20).min(disk_cap))
}
