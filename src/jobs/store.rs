//! The job store: the table of jobs, long-poll `wait`, reads and searches of spooled
//! output, cancel and input routing, list/prune, disk-cap eviction, shutdown.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use super::excerpt::{make_excerpt, split_budget};
pub use super::job::JobHandle;
use super::job::{Job, JobMeta, JobState, lock, now_unix_ms};
use super::persist::{self, StoreDir, parse_id};
use super::spool::Spool;
use super::{Excerpt, JobError, JobKind, JobOutcome, JobSnapshot, JobStatus, StoreConfig};

/// Longest label kept for a job (labels are for display).
const MAX_LABEL: usize = 200;
/// After new output wakes a waiter, how long it lingers for the job to finish, so a
/// command that prints and exits answers in one response.
const COALESCE: Duration = Duration::from_millis(25);
/// How long `shutdown` waits for killed jobs to report their end.
const SHUTDOWN_WAIT: Duration = Duration::from_millis(700);

/// What makes [`JobStore::wait_for`] return before its timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitFor {
    /// New output, an input request, or the end of the job (long-poll).
    Output,
    /// Only an input request or the end of the job (the first window of a call that
    /// should answer inline when the job is quick).
    Settled,
    /// Only the end of the job (a cancel or an interrupt: a job that was awaiting input
    /// when it was stopped still is until it has ended).
    Finished,
}

pub(super) struct Jobs {
    pub(super) map: BTreeMap<u64, Arc<Job>>,
    pub(super) next_id: u64,
}

/// What is left to write after the table was read (see [`JobStore::settle`]).
struct Pending {
    /// Jobs that were running when the previous server stopped, now `lost`.
    lost: Vec<Arc<Job>>,
    /// The records of an older server's layout, to be written as an index.
    legacy: Option<Vec<persist::JobRecord>>,
    /// Lines the index held when it was read.
    lines: u64,
}

/// All jobs of this server. See the module docs of [`crate::jobs`].
pub struct JobStore {
    pub(super) cfg: StoreConfig,
    dir: StoreDir,
    /// Whether the directory had an index when it was opened.
    had_index: bool,
    /// The table and the next job number, read from the index on first use (see
    /// [`table`](Self::table)). Held only to look a job up, insert, remove or collect
    /// `Arc`s (never while a job's `JobControl` runs). Lock order, for all of the jobs
    /// module (`job.rs` has the full picture): `journal` → the table → a job's `state` →
    /// its spools → its `result`; `pending` is taken alone.
    table: OnceLock<Mutex<Jobs>>,
    /// Set by the load, taken by [`settle`](Self::settle).
    pending: Mutex<Option<Pending>>,
    /// Whether [`load_in_background`](Self::load_in_background) started its thread.
    prefetching: AtomicBool,
    /// The index (`index.log`), open for appending. Held across the insert of a new job
    /// so a compaction, which rewrites the index from the table, cannot miss it; hence it
    /// comes before the table in the lock order.
    journal: Mutex<persist::Journal>,
    /// Bytes of spooled output on disk, for the disk cap.
    disk_used: AtomicU64,
    /// Jobs started and not yet persisted as finished: each has room for its records
    /// kept at the end of the journal (`Journal::keep_room`).
    unfinished: AtomicU64,
    /// Jobs admitted and not yet finished: what the quota of running jobs counts
    /// (`max_running`). Released as a job ends, before anyone hears of its end
    /// ([`job_ended`](Self::job_ended)); `unfinished` lasts until its record is written.
    running: AtomicU64,
    /// This store, for the thread of an index rewrite ([`compact_soon`](Self::compact_soon)).
    me: std::sync::Weak<JobStore>,
    /// Records that could not be appended to the index (see [`compact_journal`](Self::compact_journal)).
    failed_saves: AtomicU64,
    /// Whether the record reserve (`.reserve`) may be missing: not taken at open, or
    /// released for a record since; set aside again after the next record written.
    reserve_missing: AtomicBool,
    /// The random part of the ids of jobs made while this store is open
    /// ([`persist::draw_tag`]): `j12-k3f9q`.
    tag: String,
    /// Other names of jobs ([`super::handles`]); taken before the table.
    pub(super) handles: super::handles::Handles,
}

impl std::fmt::Debug for JobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobStore")
            .field("dir", &self.dir.path)
            .finish()
    }
}

/// A new job's place, taken by [`JobStore::admit`] before anything of the job runs and
/// used by [`JobStore::create_admitted`]; dropped unused, it gives the place back.
#[must_use = "an admission unused is given back at once"]
pub struct Admission {
    store: Arc<JobStore>,
    used: bool,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("used", &self.used)
            .finish()
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if !self.used {
            for count in [&self.store.unfinished, &self.store.running] {
                let _ =
                    count.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            }
        }
    }
}

impl JobStore {
    /// Open (or create) the store under `cfg.state_dir`: lock its directory and open
    /// the index for appending, without reading it. The table of jobs is read from the
    /// index on first use (any lookup, list or new job), or before that by
    /// [`load_in_background`](Self::load_in_background); then jobs that were running when
    /// the previous server stopped are marked `lost` and retention applies. So opening
    /// costs the same whatever the history; only a store without an index (an older
    /// server's layout, or a new directory) is read at once, to write its index.
    pub fn open(cfg: StoreConfig) -> Result<Arc<JobStore>, JobError> {
        let dir = persist::open_dir(&cfg.state_dir)?;
        let had_index = persist::has_index(&dir.path);
        let journal = persist::Journal::open(&dir.path, 0).map_err(|e| {
            JobError::io(
                format!("could not open the job log in {}", dir.path.display()),
                e,
            )
        })?;
        let store = Arc::new_cyclic(|me| JobStore {
            me: me.clone(),
            cfg,
            dir,
            had_index,
            table: OnceLock::new(),
            pending: Mutex::new(None),
            prefetching: AtomicBool::new(false),
            journal: Mutex::new(journal),
            disk_used: AtomicU64::new(0),
            unfinished: AtomicU64::new(0),
            running: AtomicU64::new(0),
            failed_saves: AtomicU64::new(0),
            reserve_missing: AtomicBool::new(true),
            tag: persist::draw_tag(),
            handles: Default::default(),
        });
        store.retake_reserve();
        if !had_index {
            // Convert an older server's layout now, before anything is appended.
            store.table();
        }
        Ok(store)
    }

    /// Read the table from the index on a thread of its own, so the first call that
    /// needs it finds it loaded (a call that comes sooner waits for it). Without this the
    /// first such call reads it.
    pub fn load_in_background(self: &Arc<Self>) {
        if self.table.get().is_some() || self.prefetching.swap(true, Ordering::SeqCst) {
            return;
        }
        let store = self.clone();
        let spawned = std::thread::Builder::new()
            .name("job-index".into())
            .spawn(move || {
                store.table();
            });
        if let Err(e) = spawned {
            tracing::debug!(error = %e, "could not start a thread to read the job index; the first call that needs it reads it");
        }
    }

    /// Whether the table has been read from the index yet.
    pub fn is_loaded(&self) -> bool {
        self.table.get().is_some()
    }

    /// The table, read from the index if this is its first use; a thread that comes
    /// while another reads it waits. Must not be called holding `journal` unless the
    /// table is already loaded (the work after a load appends to the index).
    pub(super) fn table(&self) -> &Mutex<Jobs> {
        let table = self.table.get_or_init(|| Mutex::new(self.load_table()));
        self.settle();
        table
    }

    /// The table, locked (see [`table`](Self::table)).
    pub(super) fn jobs(&self) -> MutexGuard<'_, Jobs> {
        lock(self.table())
    }

    /// Build the table from the index (see [`persist::load_store`]); what must still be
    /// written is left in `pending` for [`settle`](Self::settle).
    fn load_table(&self) -> Jobs {
        let started = std::time::Instant::now();
        let loaded = persist::load_store(&self.dir.path, self.had_index);
        let legacy = loaded.legacy.then(|| loaded.records.clone());
        let mut map = BTreeMap::new();
        let mut lost = Vec::new();
        let mut disk_used = 0;
        for mut rec in loaded.records {
            let Some(seq) = parse_id(&rec.id) else {
                continue;
            };
            let was_running = !rec.status.is_finished();
            let (status, message) = if !was_running {
                (rec.status, rec.message)
            } else {
                (
                    JobStatus::Lost,
                    Some(
                        "the server stopped while this job was running; output up to then is kept"
                            .into(),
                    ),
                )
            };
            let job_dir = persist::job_dir(&self.dir.path, &rec.id);
            let inline = rec.result_json.take().map(String::into_boxed_str);
            let spools = match rec.bytes {
                Some([out, err]) if !was_running => [
                    Spool::finished(job_dir.join("stdout"), out),
                    Spool::finished(job_dir.join("stderr"), err),
                ],
                // A job that was running has more output than its last record says.
                _ => [
                    Spool::existing(job_dir.join("stdout")),
                    Spool::existing(job_dir.join("stderr")),
                ],
            };
            disk_used += spools[0].len() + spools[1].len();
            let state = JobState {
                status,
                prompt: None,
                secret: false,
                exit_code: rec.exit_code,
                signal: rec.signal,
                message,
                elapsed_ms: Some(rec.elapsed_ms),
                delivered: rec.delivered,
                cancel_requested: false,
                timed_out: None,
                shutting_down: false,
                has_result: rec.has_result,
            };
            let meta = JobMeta {
                id: rec.id,
                kind: rec.kind,
                session: rec.session,
                label: rec.label,
                created_unix_ms: rec.created_unix_ms,
                dir: job_dir,
            };
            let job = Arc::new(Job::new(meta, state, spools));
            if inline.is_some() {
                let mut slot = lock(&job.result);
                slot.inline = inline;
                slot.on_disk = true;
            }
            if was_running || rec.from_journal {
                lost.push(job.clone());
            } else {
                job.record_saved.store(true, Ordering::SeqCst);
            }
            map.insert(seq, job);
        }
        self.disk_used.fetch_add(disk_used, Ordering::Relaxed);
        tracing::debug!(
            jobs = map.len(),
            lost = lost.len(),
            index_lines = loaded.lines,
            ms = started.elapsed().as_secs_f64() * 1000.0,
            "read the job table from the index"
        );
        *lock(&self.pending) = Some(Pending {
            lost,
            legacy,
            lines: loaded.lines,
        });
        Jobs {
            map,
            next_id: loaded.next_id,
        }
    }

    /// The writes a load leaves: record the jobs found running as `lost`, write the
    /// index of an older layout (or compact a long one), apply the disk cap and
    /// retention. Done once, by whichever caller of [`table`](Self::table) takes it; the
    /// table in memory is already right, so other callers go on meanwhile.
    fn settle(&self) {
        let Some(pending) = lock(&self.pending).take() else {
            return;
        };
        lock(&self.journal).add_lines(pending.lines);
        for job in &pending.lost {
            self.save_job(job);
        }
        if let Some(records) = pending.legacy {
            // An older server's layout: its records are in the index from now on.
            self.compact_journal();
            persist::remove_legacy(&self.dir.path, &records);
        } else {
            self.compact_if_needed();
        }
        self.make_room(0);
        self.apply_retention();
    }

    /// The directory holding this store's table and spools.
    pub fn dir(&self) -> &Path {
        &self.dir.path
    }

    pub fn config(&self) -> &StoreConfig {
        &self.cfg
    }

    /// Start a new job (status `running`) and return the producer's handle:
    /// [`admit`](Self::admit), then [`create_admitted`](Self::create_admitted).
    pub fn create(
        self: &Arc<Self>,
        kind: JobKind,
        session: Option<&str>,
        label: &str,
    ) -> Result<JobHandle, JobError> {
        let admission = self.admit()?;
        self.create_admitted(admission, kind, session, label)
    }

    /// Decide whether a new job may start, before anything of it runs: refused while
    /// this client's quota of running jobs is used up ([`JobError::TooManyRunning`]) or
    /// the state disk is full ([`JobError::StateDirFull`]: a job started then could keep
    /// neither its output nor, at its end, its record). Once admitted the job counts as
    /// unfinished and room for its records is kept at the journal's end, so a disk that
    /// fills between this and [`create_admitted`](Self::create_admitted) (while a shell
    /// job's process is set up) still leaves room for its start line. Dropping the
    /// admission unused gives the place back.
    pub fn admit(self: &Arc<Self>) -> Result<Admission, JobError> {
        let mut journal = lock(&self.journal);
        if let Some(limit) = self.cfg.max_running
            && self.running.load(Ordering::SeqCst) >= limit
        {
            return Err(JobError::TooManyRunning { limit });
        }
        let free = persist::free_bytes(&self.cfg.state_dir);
        if free.is_some_and(|f| f < persist::MIN_FREE_BYTES) {
            tracing::debug!(dir = %self.cfg.state_dir.display(), free = ?free, "refused a new job: the state directory is full");
            return Err(JobError::StateDirFull {
                path: self.cfg.state_dir.clone(),
            });
        }
        // Room for the records of every unfinished job, this one included, kept
        // allocated past the journal's end: a job that ends while the disk is full
        // still writes its end record (else a restart would call it lost).
        let unfinished = self.unfinished.load(Ordering::SeqCst) + 1;
        if let Err(e) = journal.keep_room(unfinished * persist::RECORD_ROOM) {
            if super::spool::is_disk_full(&e) {
                tracing::debug!(dir = %self.cfg.state_dir.display(), free = ?free, error = %e, "refused a new job: no room for its records");
                return Err(JobError::StateDirFull {
                    path: self.cfg.state_dir.clone(),
                });
            }
            tracing::debug!(error = %e, "could not keep room for job records in the journal");
        }
        self.unfinished.fetch_add(1, Ordering::SeqCst);
        self.running.fetch_add(1, Ordering::SeqCst);
        Ok(Admission {
            store: self.clone(),
            used: false,
        })
    }

    /// Start the job `admission` let in (status `running`) and return the producer's
    /// handle. Refused only if its start line cannot be written (the job could vanish
    /// at a restart): the caller must then end whatever it started.
    pub fn create_admitted(
        self: &Arc<Self>,
        mut admission: Admission,
        kind: JobKind,
        session: Option<&str>,
        label: &str,
    ) -> Result<JobHandle, JobError> {
        let seq = {
            let mut jobs = self.jobs();
            let seq = jobs.next_id;
            jobs.next_id += 1;
            seq
        };
        let id = format!("j{seq}-{}", self.tag);
        let job_dir = persist::job_dir(&self.dir.path, &id);
        // The directory and spool files appear with the first output or at finish.
        let spools = [
            Spool::create(job_dir.join("stdout")),
            Spool::create(job_dir.join("stderr")),
        ];
        let state = JobState {
            status: JobStatus::Running,
            prompt: None,
            secret: false,
            exit_code: None,
            signal: None,
            message: None,
            elapsed_ms: None,
            delivered: [0, 0],
            cancel_requested: false,
            timed_out: None,
            shutting_down: false,
            has_result: false,
        };
        let meta = JobMeta {
            id,
            kind,
            session: session.map(str::to_string),
            label: shorten_label(label),
            created_unix_ms: now_unix_ms(),
            dir: job_dir,
        };
        let job = Arc::new(Job::new(meta, state, spools));
        let compact = {
            // One appended line, so a crash brings the job back as lost. Held across
            // the insert so a compaction cannot miss the new job.
            let mut journal = lock(&self.journal);
            // Room for this record was kept at its admission.
            if let Err(e) = journal.append(&job.record()) {
                if super::spool::is_disk_full(&e) {
                    // Without its line in the log the job could vanish at a restart:
                    // refuse it while the disk is full.
                    return Err(JobError::StateDirFull {
                        path: self.cfg.state_dir.clone(),
                    });
                }
                tracing::warn!(job = %job.id, error = %e, "could not log the job's start");
            }
            let mut jobs = self.jobs();
            jobs.map.insert(seq, job.clone());
            // Counted as unfinished since its admission; `persist_finished` ends that.
            admission.used = true;
            journal.needs_compaction(jobs.map.len())
        };
        if compact {
            self.compact_soon();
        }
        Ok(JobHandle {
            store: self.clone(),
            job,
        })
    }

    /// Long-poll: [`wait_for`](Self::wait_for) with [`WaitFor::Output`].
    pub async fn wait(&self, id: &str, timeout: Duration) -> Result<JobSnapshot, JobError> {
        self.wait_for(id, timeout, WaitFor::Output).await
    }

    /// Wait until the job has something to report (see [`WaitFor`]) or `timeout`
    /// passes, then return its state and the output not delivered before; the
    /// delivered cursors advance, so each byte is handed out by `wait` once.
    pub async fn wait_for(
        &self,
        id: &str,
        timeout: Duration,
        until: WaitFor,
    ) -> Result<JobSnapshot, JobError> {
        let job = self.get(id)?;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = job.version.subscribe();
        // This waiter's own cursors: output that arrives while several wait on the job
        // goes to every one of them, not only to whichever is woken first.
        let from = lock(&job.state).delivered;
        loop {
            rx.borrow_and_update();
            let (settled, has_output) = self.readiness(&job);
            if settled && (until != WaitFor::Finished || job.is_finished()) {
                break;
            }
            if has_output && until == WaitFor::Output {
                // Linger briefly so output and the end of a quick job come together.
                let linger = (tokio::time::Instant::now() + COALESCE).min(deadline);
                loop {
                    rx.borrow_and_update();
                    if self.readiness(&job).0
                        || tokio::time::timeout_at(linger, rx.changed()).await.is_err()
                    {
                        break;
                    }
                }
                break;
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                break;
            }
        }
        self.snapshot(&job, true, Some(from))
    }

    /// Wait until the job changes (output, status) or `timeout` passes, consuming
    /// nothing: for watchers (resource subscriptions) beside the agent's own `wait`.
    pub async fn changed(&self, id: &str, timeout: Duration) -> Result<(), JobError> {
        let job = self.get(id)?;
        let mut rx = job.version.subscribe();
        rx.borrow_and_update();
        let _ = tokio::time::timeout(timeout, rx.changed()).await;
        Ok(())
    }

    /// The job's state and the output not yet delivered, without waiting and without
    /// advancing the delivered cursors.
    pub fn peek(&self, id: &str) -> Result<JobSnapshot, JobError> {
        let job = self.get(id)?;
        self.snapshot(&job, false, None)
    }

    /// (finished or awaiting input, has undelivered output)
    fn readiness(&self, job: &Job) -> (bool, bool) {
        let st = lock(&job.state);
        let settled = st.status.is_finished() || st.status == JobStatus::AwaitingInput;
        let has_output = (0..2).any(|i| {
            let spool = lock(&job.spools[i]);
            spool.len() - spool.incomplete_tail() > st.delivered[i]
        });
        (settled, has_output)
    }

    /// `from`: where the output handed out starts, if not at the delivered cursors (a
    /// waiter's cursors from when it began to wait; never past the delivered ones).
    fn snapshot(
        &self,
        job: &Job,
        advance: bool,
        from: Option<[u64; 2]>,
    ) -> Result<JobSnapshot, JobError> {
        let mut ranges = [(0u64, 0u64); 2];
        let mut paths = Vec::with_capacity(2);
        let st = {
            let mut st = lock(&job.state);
            let finished = st.status.is_finished();
            for (i, range) in ranges.iter_mut().enumerate() {
                let spool = lock(&job.spools[i]);
                // Hold back a partly written character until the rest arrives.
                let end = if finished {
                    spool.len()
                } else {
                    spool.len() - spool.incomplete_tail()
                };
                let start = from
                    .map_or(st.delivered[i], |f| f[i].min(st.delivered[i]))
                    .min(end);
                *range = (start, end);
                if advance && end > st.delivered[i] {
                    st.delivered[i] = end;
                    // The cursor is part of the record: written at the next save or exit.
                    job.record_saved.store(false, Ordering::SeqCst);
                }
                paths.push(spool.path().to_path_buf());
            }
            st.clone()
        };
        let (b_out, b_err) = split_budget(
            self.cfg.response_bytes,
            ranges[0].1 - ranges[0].0,
            ranges[1].1 - ranges[1].0,
        );
        let excerpt = |i: usize, budget: usize| -> Result<Excerpt, JobError> {
            make_excerpt(&paths[i], ranges[i].0, ranges[i].1, budget).map_err(|e| {
                JobError::io(format!("could not read the output of job {}", job.id), e)
            })
        };
        let stdout = excerpt(0, b_out)?;
        let stderr = excerpt(1, b_err)?;
        // A fresh result is handed out from memory once; later reads come from disk.
        let fresh = if st.status.is_finished() {
            let mut slot = lock(&job.result);
            let value = slot.value.clone();
            if advance {
                slot.delivered = true;
                if slot.on_disk {
                    slot.value = None;
                }
            }
            value
        } else {
            None
        };
        let result = match fresh {
            Some(r) => Some(r),
            None if st.has_result => job.stored_result(),
            None => None,
        };
        Ok(JobSnapshot {
            id: job.id.clone(),
            kind: job.kind,
            session: job.session.clone(),
            label: job.label.clone(),
            status: st.status,
            prompt: st.prompt.clone(),
            secret: st.secret,
            stdout,
            stderr,
            elapsed_ms: job.elapsed_ms(&st),
            exit_code: st.exit_code,
            signal: st.signal.clone(),
            message: st.message.clone(),
            result,
        })
    }

    /// Cancel a running job (its producer decides how: interrupt, TERM then KILL).
    /// If no control is registered yet, the cancel is applied when it is.
    pub fn cancel(&self, id: &str) -> Result<(), JobError> {
        self.cancel_within(id, None)
    }

    /// [`cancel`](Self::cancel) with a grace period before the hard stop (`None` = default).
    pub fn cancel_within(
        &self,
        id: &str,
        grace: Option<std::time::Duration>,
    ) -> Result<(), JobError> {
        let job = self.get(id)?;
        {
            let mut st = lock(&job.state);
            if st.status.is_finished() {
                return Err(JobError::Finished {
                    id: job.id.clone(),
                    status: st.status,
                    what: "there is nothing to cancel".into(),
                });
            }
            st.cancel_requested = true;
        }
        let control = lock(&job.control).clone();
        if let Some(c) = control {
            c.cancel_within(grace);
        }
        Ok(())
    }

    /// End a running job that passed the caller's time limit `after`: cancelled as by
    /// [`cancel_within`](Self::cancel_within), but it ends `failed` with `timed out after
    /// N s (timeout_seconds)` leading its message. Nothing if it already finished.
    pub fn time_out(&self, id: &str, after: std::time::Duration) -> Result<(), JobError> {
        {
            let job = self.get(id)?;
            let mut st = lock(&job.state);
            if st.status.is_finished() {
                return Ok(());
            }
            st.timed_out = Some(format!(
                "timed out after {} s (timeout_seconds)",
                seconds_text(after)
            ));
        }
        match self.cancel_within(id, None) {
            Err(JobError::Finished { .. }) => Ok(()),
            other => other,
        }
    }

    /// Send `text` (and then EOF if `eof`) to a running job's input.
    pub fn send_input(&self, id: &str, text: &str, eof: bool) -> Result<(), JobError> {
        let job = self.get(id)?;
        let status = lock(&job.state).status;
        if status.is_finished() {
            return Err(JobError::Finished {
                id: job.id.clone(),
                status,
                what: "it takes no more input".into(),
            });
        }
        if text.is_empty() && !eof {
            return Err(JobError::Input {
                id: job.id.clone(),
                reason: "nothing to send: give some text, or eof to close its input".into(),
            });
        }
        let control = lock(&job.control).clone();
        let Some(c) = control else {
            return Err(JobError::NoControl {
                id: job.id.clone(),
                what: "take input",
                status,
            });
        };
        c.send_input(text, eof).map_err(|reason| JobError::Input {
            id: job.id.clone(),
            reason,
        })
    }

    /// Kill every running job (no grace), wait briefly for them to end, record the
    /// rest as cancelled, and write the table. A store whose table was never read ran
    /// no job: nothing to do.
    pub async fn shutdown(&self) {
        if !self.is_loaded() {
            return;
        }
        let running: Vec<Arc<Job>> = self
            .jobs()
            .map
            .values()
            .filter(|j| !j.is_finished())
            .cloned()
            .collect();
        for job in &running {
            {
                let mut st = lock(&job.state);
                st.cancel_requested = true;
                st.shutting_down = true;
            }
            let control = lock(&job.control).clone();
            if let Some(c) = control {
                c.kill();
            }
        }
        let deadline = tokio::time::Instant::now() + SHUTDOWN_WAIT;
        for job in &running {
            let mut rx = job.version.subscribe();
            loop {
                rx.borrow_and_update();
                if job.is_finished()
                    || tokio::time::timeout_at(deadline, rx.changed())
                        .await
                        .is_err()
                {
                    break;
                }
            }
            let ended = job.finish(
                JobOutcome {
                    status: JobStatus::Cancelled,
                    ..JobOutcome::default()
                },
                self.cfg.disk_cap,
                &self.cfg.state_dir,
                || self.job_ended(),
            );
            if ended {
                job.bump();
            }
        }
        // Record what changed since it was last written (delivered cursors, mostly): the
        // cost of exit follows the jobs touched in this run, not the history.
        let dirty: Vec<Arc<Job>> = self
            .jobs()
            .map
            .values()
            .filter(|j| !j.record_saved.load(Ordering::SeqCst))
            .cloned()
            .collect();
        for job in &dirty {
            self.save_job(job);
        }
        self.write_next_id();
    }

    // ----- internals -----

    pub(crate) fn get(&self, id: &str) -> Result<Arc<Job>, JobError> {
        let jobs = self.jobs();
        if let Some(job) = parse_id(id)
            .and_then(|seq| jobs.map.get(&seq))
            .filter(|job| persist::same_id(id, &job.id))
        {
            return Ok(job.clone());
        }
        let ids: Vec<&str> = jobs
            .map
            .values()
            .rev()
            .take(10)
            .map(|j| j.id.as_str())
            .collect();
        let known = if ids.is_empty() {
            "there are no jobs (pruned jobs and jobs evicted by the disk cap are gone)".to_string()
        } else {
            let more = if jobs.map.len() > ids.len() {
                ", ... (list jobs to see all)"
            } else {
                ""
            };
            format!(
                "known jobs: {}{more} (pruned jobs and jobs evicted by the disk cap are gone)",
                ids.join(", ")
            )
        };
        Err(JobError::UnknownJob {
            id: id.to_string(),
            known,
        })
    }

    pub(crate) fn add_disk_used(&self, n: u64) {
        self.disk_used.fetch_add(n, Ordering::Relaxed);
    }

    /// Make room for `need` more bytes under the disk cap by evicting the oldest
    /// finished jobs. Returns whether there is room.
    pub(crate) fn make_room(&self, need: u64) -> bool {
        let cap = self.cfg.disk_cap;
        if self.disk_used.load(Ordering::Relaxed).saturating_add(need) <= cap {
            return true;
        }
        let evicted: Vec<Arc<Job>> = {
            let mut jobs = self.jobs();
            let mut evicted = Vec::new();
            let finished: Vec<u64> = jobs
                .map
                .iter()
                .filter(|(_, j)| j.is_finished())
                .map(|(s, _)| *s)
                .collect();
            for seq in finished {
                if self.disk_used.load(Ordering::Relaxed).saturating_add(need) <= cap {
                    break;
                }
                if let Some(job) = jobs.map.remove(&seq) {
                    let bytes: u64 = job.lens().iter().sum();
                    self.disk_used.fetch_sub(
                        bytes.min(self.disk_used.load(Ordering::Relaxed)),
                        Ordering::Relaxed,
                    );
                    evicted.push(job);
                }
            }
            evicted
        };
        for job in &evicted {
            tracing::info!(job = %job.id, "evicted a finished job: the disk cap for job output was reached");
            self.forget_removed(job);
        }
        self.disk_used.load(Ordering::Relaxed).saturating_add(need) <= cap
    }

    /// A job taken out of the table (prune): its bytes, files and record go.
    pub(super) fn forget_files(&self, job: &Job) {
        let bytes: u64 = job.lens().iter().sum();
        self.disk_used.fetch_sub(
            bytes.min(self.disk_used.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
        self.forget_removed(job);
    }

    /// Remove the files of a job already out of the table and append its `removed` line.
    fn forget_removed(&self, job: &Job) {
        job.removed.store(true, Ordering::SeqCst);
        let mut rec = job.record();
        rec.removed = true;
        let compact = {
            let mut journal = lock(&self.journal);
            if let Err(e) = journal.append(&rec) {
                tracing::warn!(job = %job.id, error = %e, "could not record the job's removal");
            }
            journal.needs_compaction(self.jobs().map.len())
        };
        if compact {
            self.compact_soon();
        }
        persist::remove_job_files(&job.dir);
    }

    /// A job ended: its place among the running jobs is free (see `running`).
    pub(crate) fn job_ended(&self) {
        let _ = self
            .running
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }

    /// Remove the oldest finished jobs beyond the retention limits (jobs in the table,
    /// and age; the disk cap bounds bytes): jobs that print nothing count too, running
    /// jobs are never removed. O(1) when nothing is due: it looks at the oldest jobs only.
    pub(crate) fn apply_retention(&self) {
        let max_jobs = self.cfg.retention.max_jobs;
        let max_age_ms = self.cfg.retention.max_age.as_millis() as u64;
        let now = now_unix_ms();
        let removed: Vec<Arc<Job>> = {
            let mut jobs = self.jobs();
            let mut over = jobs.map.len().saturating_sub(max_jobs);
            let mut picked = Vec::new();
            for (seq, job) in jobs.map.iter() {
                if !job.is_finished() {
                    continue;
                }
                let too_old = now.saturating_sub(job.created_unix_ms) > max_age_ms;
                if over == 0 && !too_old {
                    break;
                }
                over = over.saturating_sub(1);
                picked.push(*seq);
            }
            picked
                .iter()
                .filter_map(|seq| jobs.map.remove(seq))
                .collect()
        };
        if !removed.is_empty() {
            tracing::debug!(
                count = removed.len(),
                "removed finished jobs past the retention limits"
            );
        }
        for job in &removed {
            self.forget_files(job);
        }
    }

    /// Write a job's files after it finished: its result, then its record.
    pub(crate) fn persist_finished(&self, job: &Job) {
        {
            let mut slot = lock(&job.result);
            // A small result's text was made when the job finished (`inline`): it is
            // written with the record below. A larger one goes to `result.json`.
            let saved = match (&slot.inline, &slot.value) {
                (Some(_), _) => Some(Ok(())),
                (None, Some(value)) => Some(
                    serde_json::to_string(value)
                        .map_err(std::io::Error::other)
                        .and_then(|text| persist::save_result(&job.dir, &text)),
                ),
                (None, None) => None,
            };
            match saved {
                Some(Ok(())) => {
                    slot.on_disk = true;
                    if slot.delivered {
                        slot.value = None;
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(job = %job.id, error = %e, "could not store the job's result")
                }
                None => {}
            }
        }
        self.save_job(job);
        let _ = self
            .unfinished
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if job.removed.load(Ordering::SeqCst) {
            // Pruned or evicted while we wrote: do not leave files behind.
            persist::remove_job_files(&job.dir);
        }
    }

    /// Write one job's record (errors are logged: the record is for the next start,
    /// never a reason to fail a job).
    pub(crate) fn save_job(&self, job: &Job) {
        if job.removed.load(Ordering::SeqCst) {
            return;
        }
        let rec = job.record();
        let appended = persist::with_reserve(&self.dir.path, &self.reserve_missing, || {
            lock(&self.journal).append(&rec)
        });
        match appended {
            Ok(()) => {
                job.record_saved.store(true, Ordering::SeqCst);
                // After a full disk used the reserve, set it aside again.
                self.retake_reserve();
            }
            Err(e) => {
                self.failed_saves.fetch_add(1, Ordering::SeqCst);
                job.record_saved.store(false, Ordering::SeqCst);
                tracing::warn!(job = %job.id, error = %e, "could not write the job's record; it is written again at the next change or at exit");
            }
        }
    }

    /// Set the space for job records aside again (at open, and after a full disk used
    /// it up; a stat only then, not after every record).
    fn retake_reserve(&self) {
        if self.reserve_missing.load(Ordering::SeqCst) {
            let taken = persist::take_reserve(&self.dir.path);
            self.reserve_missing.store(!taken, Ordering::SeqCst);
        }
    }

    /// Write the next job number (the index may have lost the highest ones to removals).
    fn write_next_id(&self) {
        let next_id = self.jobs().next_id;
        if let Err(e) = persist::save_next_id(&self.dir.path, next_id) {
            tracing::warn!(dir = %self.dir.path.display(), error = %e, "could not write next_id");
        }
    }

    fn compact_if_needed(&self) {
        let live = self.jobs().map.len();
        if lock(&self.journal).needs_compaction(live) {
            self.compact_journal();
        }
    }

    /// Rewrite the index on a thread of its own: not on the way of a call (a new job's
    /// start, or the retention that follows a job's end), whose next call would wait
    /// for the rewrite's file-system work.
    fn compact_soon(&self) {
        let Some(store) = self.me.upgrade() else {
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("job-index-rewrite".into())
            .spawn(move || store.compact_journal());
        if let Err(e) = spawned {
            tracing::debug!(error = %e, "no thread for the index rewrite; rewriting it here");
            self.compact_journal();
        }
    }

    /// Rewrite the index with the current record of every job in the table. The records
    /// are written without the index's lock (10,000 of them take milliseconds): jobs
    /// start and end meanwhile, and their lines go to the old file and the new one's end.
    /// One rewrite at a time; a call while one runs does nothing.
    pub(super) fn compact_journal(&self) {
        let (log, live, failures) = {
            let mut journal = lock(&self.journal);
            let Some(log) = journal.begin_rewrite() else {
                return;
            };
            let live: Vec<Arc<Job>> = self.jobs().map.values().cloned().collect();
            (log, live, self.failed_saves.load(Ordering::SeqCst))
        };
        self.write_next_id();
        let written = persist::Rewrite::write(log, live.iter().map(|j| j.record()));
        let room = self.unfinished.load(Ordering::SeqCst) * persist::RECORD_ROOM;
        // Each step takes the lock on its own statement (a guard in a longer expression
        // would live to its end).
        let switched = lock(&self.journal).switch_rewrite(written, room);
        let placed = match switched {
            Ok(rewrite) => {
                let renamed = rewrite.rename();
                let mut journal = lock(&self.journal);
                journal.place_rewrite(&rewrite, renamed)
            }
            Err(e) => Err(e),
        };
        // The old file is closed here, unlocked.
        match placed.map(drop) {
            // A record that failed to append meanwhile may be newer than the one written:
            // then its job stays marked unsaved (written again at its next change or exit).
            Ok(()) if self.failed_saves.load(Ordering::SeqCst) == failures => {
                for job in &live {
                    job.record_saved.store(true, Ordering::SeqCst);
                }
            }
            Ok(()) => {}
            Err(e) => {
                tracing::warn!(dir = %self.dir.path.display(), error = %e, "could not rewrite the job index");
            }
        }
    }
}

fn shorten_label(label: &str) -> String {
    let label = label.trim();
    if label.chars().count() <= MAX_LABEL {
        return label.to_string();
    }
    let mut s: String = label.chars().take(MAX_LABEL - 1).collect();
    s.push('…');
    s
}

/// Seconds as a short number: "5", "0.5".
fn seconds_text(d: std::time::Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}")
    } else {
        format!("{s}")
    }
}
