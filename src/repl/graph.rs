//! The cell graph of a session: each cell's parent, code, status and whether its state
//! is held by a snapshot; which cell the live worker is at (the head); the snapshot cap
//! with least-recently-used eviction; the retention cap on cells kept (the oldest are
//! dropped, except held snapshots and the head's line); the replay plan for a cell whose
//! state is not held; and the graph persisted as JSON lines in the session's state
//! directory, compacted when it grows past twice the cells kept.
//!
//! Pure bookkeeping: no processes, no I/O but the graph file. `session` drives it.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::cell::CellStatus;
use super::info::{HistoryEntry, SnapshotState};
use super::snapshot::Snapshot;

/// How a cell's code is run again on replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum CellCode {
    Execute { code: String },
    RunFile { path: String, argv: Vec<String> },
}

/// One cell as persisted (one JSON line in `graph.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Node {
    pub(crate) cell: u64,
    pub(crate) parent: Option<u64>,
    /// What history shows when it is not the code itself: `run_file <path> <args>`
    /// (empty for code: it is kept once, see [`Node::label`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) label: String,
    #[serde(flatten)]
    pub(crate) code: CellCode,
    pub(crate) status: CellStatus,
    /// Unix time the cell started, milliseconds.
    pub(crate) started_ms: u64,
    pub(crate) elapsed_ms: f64,
    /// Cells run again (in order) to rebuild the parent's state before this one ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) replayed: Vec<u64>,
}

/// The first line of a compacted graph file: how many cells were dropped before the
/// ones that follow (a line that is not a [`Node`], so a reader that does not know it
/// skips it).
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    dropped: u64,
}

/// How the temporary files of a compaction begin (a crash may leave one: the next open
/// removes it).
const TMP_PREFIX: &str = ".graph-compact-";

/// The longest line of a head kept whole by the retention cap (besides half the cap): a
/// line without a snapshot longer than this is not worth replaying from its start.
const LINE_KEPT: usize = 1_000;

/// Why the server restarted note, for cells loaded from an earlier server's file.
const RELOADED: &str = "the server restarted; snapshots do not survive it";

impl Node {
    /// What history shows: the code, or `run_file <path> <args>`.
    pub(super) fn label(&self) -> &str {
        match &self.code {
            CellCode::Execute { code } if self.label.is_empty() => code,
            _ => &self.label,
        }
    }
}

/// A held snapshot and when it was last used (for LRU eviction).
struct Held {
    snap: Arc<Snapshot>,
    /// Pid of the root of the process tree it belongs to (its process group).
    tree: u32,
    used: u64,
}

/// Where the state of a cell to branch from comes from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Plan {
    /// The head already is at this cell: run on it.
    Head,
    /// Fork from the snapshot of `from`, then run `replay` (oldest first).
    Fork { from: u64, replay: Vec<u64> },
    /// No snapshot on the way: a fresh worker runs `replay` from the start.
    Scratch { replay: Vec<u64> },
}

/// Why a cell cannot be branched from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Unusable {
    Unknown,
    /// It (or a cell on its path) ended with the worker's death: no state to rebuild.
    Died(u64),
    /// It raised, and its snapshot is gone: replaying it would raise again.
    FailedNoSnapshot,
    /// It, or the cell its state is rebuilt from (`.1`), was dropped by the retention
    /// cap: `.0` is the cell asked for, `.1` the dropped one.
    Dropped(u64, u64),
}

#[derive(Default)]
pub(crate) struct Graph {
    nodes: BTreeMap<u64, Node>,
    held: BTreeMap<u64, Held>,
    /// Why a cell's snapshot is not held (not taken, evicted), by cell.
    notes: BTreeMap<u64, String>,
    /// The cell whose state the live worker has (None: empty state).
    pub(crate) head: Option<u64>,
    cap: usize,
    tick: u64,
    file: Option<PathBuf>,
    /// Cells kept at most (0: all); past it the oldest are dropped (see [`Graph::trim`]).
    max_cells: usize,
    /// Cells dropped since the session started or was restarted (across server restarts).
    dropped: u64,
    /// Cells up to this one were loaded from an earlier server's file: their note says so.
    reloaded_upto: u64,
    /// Lines in the graph file (it is compacted past twice `max_cells`; never more than
    /// [`Graph::max_lines`]).
    lines: usize,
    /// The graph file, open for appending (kept between cells: opening it for every cell
    /// cost two path lookups on the answer's path). Dropped when the file is replaced
    /// (compacted) or removed (restart).
    appender: Option<std::fs::File>,
    /// A compaction running on a thread of its own ([`Graph::compact_soon`]).
    compacting: Option<Compaction>,
}

/// A compaction under way: the thread writes (and syncs) the kept cells to a temporary
/// file; the cell that finds it done puts that file in place, with the lines appended
/// meanwhile at its end.
struct Compaction {
    done: std::sync::mpsc::Receiver<std::io::Result<tempfile::NamedTempFile>>,
    /// Lines appended since the cells were taken (they are in the old file too).
    tail: Vec<u8>,
    /// Lines the thread writes (the header and the cells).
    lines: usize,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

impl Graph {
    /// An empty graph keeping at most `cap` snapshots and `max_cells` cells (0: all),
    /// persisted to `file` (whose cells, from an earlier server, are loaded — the newest
    /// `max_cells` of them; their snapshots are gone).
    pub(super) fn open(cap: usize, max_cells: usize, file: Option<PathBuf>) -> Graph {
        let mut g = Graph {
            cap,
            file,
            max_cells,
            ..Default::default()
        };
        g.remove_stale_temporaries();
        if let Some(text) = g
            .file
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f).ok())
        {
            if !text.is_empty() && !text.ends_with('\n') {
                // A torn last line (a crash while writing): end it, so the next line
                // appended is whole.
                if let Some(f) = &g.file
                    && let Ok(mut out) = std::fs::OpenOptions::new().append(true).open(f)
                {
                    let _ = out.write_all(b"\n");
                }
            }
            for line in text.lines() {
                g.lines += 1;
                if let Ok(node) = serde_json::from_str::<Node>(line) {
                    g.nodes.insert(node.cell, node);
                } else if let Ok(header) = serde_json::from_str::<Header>(line) {
                    g.dropped = header.dropped;
                }
            }
            g.reloaded_upto = g.last_cell();
            g.trim();
            if g.compaction_due() {
                g.compact();
            }
        }
        g
    }

    /// Remove what a compaction cut short by a crash left beside the graph file.
    fn remove_stale_temporaries(&self) {
        let Some(dir) = self.file.as_ref().and_then(|f| f.parent()) else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// The highest cell number, to continue numbering after a server restart.
    pub(super) fn last_cell(&self) -> u64 {
        self.nodes.keys().next_back().copied().unwrap_or(0)
    }

    pub(super) fn get(&self, cell: u64) -> Option<&Node> {
        self.nodes.get(&cell)
    }

    /// Record a finished cell (and append it to the graph file).
    pub(super) fn add(&mut self, mut node: Node) {
        if node.started_ms == 0 {
            node.started_ms = now_ms();
        }
        if matches!(&node.code, CellCode::Execute { code } if *code == node.label) {
            node.label = String::new(); // the code is the label: keep it once
        }
        if self.compacting.is_some() && self.lines >= self.max_lines() {
            // The compaction on its thread has not landed after half the cap of cells
            // more: wait for it, so the file stays bounded however slow the disk is.
            self.finish_compaction(true);
        }
        if let Some(file) = &self.file {
            let appended = serde_json::to_vec(&node)
                .map_err(std::io::Error::other)
                .and_then(|mut line| {
                    line.push(b'\n');
                    let f = match &mut self.appender {
                        Some(f) => f,
                        None => self.appender.insert(
                            std::fs::OpenOptions::new()
                                .create(true)
                                .append(true)
                                .open(file)?,
                        ),
                    };
                    // One write of the whole line (O_APPEND): never interleaved.
                    f.write_all(&line)?;
                    if let Some(c) = &mut self.compacting {
                        c.tail.extend_from_slice(&line);
                    }
                    Ok(())
                });
            match appended {
                Ok(()) => self.lines += 1,
                Err(e) => {
                    // Reopened for the next cell (the file may have been removed).
                    self.appender = None;
                    tracing::warn!(file = %file.display(), error = %e, "could not persist the cell graph")
                }
            }
        }
        self.nodes.insert(node.cell, node);
        self.trim();
        if self.compaction_due() {
            self.compact_soon();
        }
        self.finish_compaction(false);
    }

    /// The cells no trim may drop: those whose snapshot is held, and the lines of the
    /// head and of the newest cell (the head-to-be) back to their nearest held snapshot
    /// or the root — each only if it is at most half the cap and [`LINE_KEPT`] long (a
    /// longer line keeps only its last cell).
    fn protected(&self) -> BTreeSet<u64> {
        let mut keep: BTreeSet<u64> = self.held.keys().copied().collect();
        let newest = self.nodes.keys().next_back().copied();
        let mut walked: Vec<u64> = Vec::new();
        for start in [newest, self.head].into_iter().flatten() {
            if walked.contains(&start) && keep.contains(&start) {
                continue; // on the line just kept whole (the head is the newest's parent)
            }
            let mut line = Vec::new();
            let mut at = Some(start);
            let mut whole = false;
            while let Some(c) = at {
                let Some(node) = self.nodes.get(&c) else {
                    break; // dropped already: the line is broken
                };
                line.push(c);
                if self.is_held(c) || node.parent.is_none() {
                    whole = true;
                    break;
                }
                if line.len() > (self.max_cells / 2).min(LINE_KEPT) {
                    break;
                }
                at = node.parent.filter(|p| *p < c); // a corrupt file must not loop
            }
            if whole {
                keep.extend(line.iter().copied());
            } else {
                keep.insert(start);
            }
            walked = line;
        }
        keep
    }

    /// Drop the oldest cells past `max_cells`, sparing [`Graph::protected`] ones.
    fn trim(&mut self) {
        if self.max_cells == 0 {
            return;
        }
        if self.nodes.len() > self.max_cells {
            let excess = self.nodes.len() - self.max_cells;
            let keep = self.protected();
            let gone: Vec<u64> = self
                .nodes
                .keys()
                .filter(|c| !keep.contains(c))
                .take(excess)
                .copied()
                .collect();
            for c in gone {
                self.nodes.remove(&c);
                self.notes.remove(&c);
                self.dropped += 1;
            }
        }
    }

    /// Lines the graph file never exceeds: compacted past twice `max_cells`, and while
    /// that compaction runs, half `max_cells` more at most.
    fn max_lines(&self) -> usize {
        self.max_cells
            .saturating_mul(2)
            .saturating_add(self.max_cells / 2)
    }

    /// Whether the graph file is due for compaction (more than twice `max_cells` lines).
    fn compaction_due(&self) -> bool {
        self.max_cells > 0 && self.lines > self.max_cells.saturating_mul(2)
    }

    /// The kept cells, as the graph file's lines (a header first).
    fn compacted(&self) -> std::io::Result<Vec<u8>> {
        let mut out = serde_json::to_vec(&Header {
            dropped: self.dropped,
        })?;
        out.push(b'\n');
        for node in self.nodes.values() {
            serde_json::to_writer(&mut out, node)?;
            out.push(b'\n');
        }
        Ok(out)
    }

    /// Compact the graph file on a thread of its own: writing and syncing 10,000 cells
    /// took 26-36 ms on the answer's path of every 10,000th cell. Appends go on to the
    /// old file meanwhile (and are kept for the new one's end); a later cell puts the new
    /// file in place ([`finish_compaction`](Self::finish_compaction)).
    fn compact_soon(&mut self) {
        let Some(file) = &self.file else { return };
        if self.compacting.is_some() {
            return;
        }
        let dir = file
            .parent()
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("."));
        let bytes = match self.compacted() {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(file = %file.display(), error = %e, "could not compact the cell graph");
                self.lines = self.max_cells;
                return;
            }
        };
        let (tx, done) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("graph-compact".into())
            .spawn(move || {
                let written = (|| {
                    let mut tmp = tempfile::Builder::new()
                        .prefix(TMP_PREFIX)
                        .tempfile_in(&dir)?;
                    tmp.write_all(&bytes)?;
                    tmp.as_file().sync_all()?;
                    Ok(tmp)
                })();
                let _ = tx.send(written);
            });
        match spawned {
            Ok(_) => {
                self.compacting = Some(Compaction {
                    done,
                    tail: Vec::new(),
                    lines: self.nodes.len() + 1,
                })
            }
            Err(_) => self.compact(),
        }
    }

    /// Put a finished compaction's file in place (`block`: wait for it). The old file
    /// is closed on a thread (closing the replaced file frees its blocks).
    fn finish_compaction(&mut self, block: bool) {
        let Some(c) = &self.compacting else { return };
        let got = if block {
            c.done
                .recv()
                .map_err(|_| std::sync::mpsc::TryRecvError::Disconnected)
        } else {
            c.done.try_recv()
        };
        let written = match got {
            Ok(written) => written,
            Err(std::sync::mpsc::TryRecvError::Empty) => return,
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                self.compacting = None;
                return;
            }
        };
        let Some(c) = self.compacting.take() else {
            return;
        };
        let Some(file) = self.file.clone() else {
            return;
        };
        let placed = written.and_then(|mut tmp| {
            tmp.write_all(&c.tail)?;
            tmp.persist(&file).map_err(|e| e.error)?;
            std::fs::OpenOptions::new().append(true).open(&file)
        });
        match placed {
            Ok(appender) => {
                let lines = c.lines + c.tail.iter().filter(|b| **b == b'\n').count();
                tracing::debug!(file = %file.display(), lines, dropped = self.dropped, "cell graph compacted");
                self.lines = lines;
                if let Some(old) = self.appender.replace(appender) {
                    let _ = std::thread::Builder::new()
                        .name("graph-close".into())
                        .spawn(move || drop(old));
                }
            }
            Err(e) => {
                tracing::warn!(file = %file.display(), error = %e, "could not compact the cell graph");
                // Try again only after as many lines again.
                self.lines = self.max_cells;
            }
        }
    }

    /// Rewrite the graph file with the kept cells only, atomically (a temporary file in
    /// the same directory, renamed over it): a crash leaves the old file or the new one.
    fn compact(&mut self) {
        // The file is replaced: the next line goes to the new one (and a compaction
        // under way is no longer needed).
        self.compacting = None;
        self.appender = None;
        let Some(file) = &self.file else { return };
        let dir = file
            .parent()
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("."));
        let written = (|| -> std::io::Result<usize> {
            let mut tmp = tempfile::Builder::new()
                .prefix(TMP_PREFIX)
                .tempfile_in(&dir)?;
            let mut out = std::io::BufWriter::new(tmp.as_file_mut());
            serde_json::to_writer(
                &mut out,
                &Header {
                    dropped: self.dropped,
                },
            )?;
            out.write_all(b"\n")?;
            for node in self.nodes.values() {
                serde_json::to_writer(&mut out, node)?;
                out.write_all(b"\n")?;
            }
            out.flush()?;
            drop(out);
            tmp.as_file().sync_all()?;
            tmp.persist(file).map_err(|e| e.error)?;
            Ok(self.nodes.len() + 1)
        })();
        match written {
            Ok(lines) => {
                tracing::debug!(file = %file.display(), lines, dropped = self.dropped, "cell graph compacted");
                self.lines = lines;
            }
            Err(e) => {
                tracing::warn!(file = %file.display(), error = %e, "could not compact the cell graph");
                // Try again only after as many lines again.
                self.lines = self.max_cells;
            }
        }
    }

    /// Cells dropped by the retention cap, and the oldest kept (None: none dropped).
    pub(super) fn dropped(&self) -> Option<(u64, u64)> {
        let oldest = self.nodes.keys().next().copied()?;
        (self.dropped > 0).then_some((self.dropped, oldest))
    }

    /// What history says when cells were dropped: how many, and the oldest kept.
    pub(super) fn dropped_note(&self) -> Option<String> {
        self.dropped().map(|(n, oldest)| {
            format!(
                "{} older cell(s) were dropped (the session keeps its last {} cells); the oldest kept is c{oldest}",
                thousands(n),
                thousands(self.max_cells as u64)
            )
        })
    }

    /// Why `asked` cannot be branched from when `gone` (itself or the cell its state is
    /// rebuilt from) was dropped, in words, with a cell to use instead.
    pub(super) fn dropped_words(&self, asked: u64, gone: u64) -> String {
        let what = if asked == gone {
            format!("c{gone} was dropped from the history")
        } else {
            format!("c{asked} needs c{gone}, which was dropped from the history")
        };
        let instead = match self.held.keys().min_by_key(|c| c.abs_diff(asked)) {
            Some(c) => format!("branch from c{c} (held)"),
            None => match self.nodes.keys().next() {
                Some(c) => format!("branch from a kept cell (the oldest is c{c})"),
                None => "run a cell".to_string(),
            },
        };
        format!(
            "{what}: the session keeps its last {} cells; {instead} or start fresh (session_restart)",
            thousands(self.max_cells as u64)
        )
    }

    /// Forget everything (restart): cells, snapshots (they exit), the graph file.
    pub(super) fn clear(&mut self) {
        self.nodes.clear();
        self.held.clear();
        self.notes.clear();
        self.head = None;
        self.dropped = 0;
        self.reloaded_upto = 0;
        self.lines = 0;
        self.appender = None;
        self.compacting = None;
        if let Some(file) = &self.file {
            let _ = std::fs::remove_file(file);
        }
    }

    /// A snapshot arrived for `cell` (from tree `tree`); returns what was evicted.
    pub(super) fn hold(&mut self, snap: Snapshot, tree: u32) -> Vec<u64> {
        let cell = snap.cell;
        self.tick += 1;
        self.notes.remove(&cell);
        self.held.insert(
            cell,
            Held {
                snap: Arc::new(snap),
                tree,
                used: self.tick,
            },
        );
        let mut evicted = Vec::new();
        while self.held.len() > self.cap {
            let Some((&lru, _)) = self.held.iter().min_by_key(|(_, h)| h.used) else {
                break;
            };
            self.held.remove(&lru);
            self.notes.insert(
                lru,
                format!("evicted: the session keeps at most {} snapshots", self.cap),
            );
            evicted.push(lru);
        }
        evicted
    }

    /// Evict the least recently used snapshot other than `keep`'s, noting `why`; returns
    /// its cell, the snapshot (it exits once the last reference is dropped) and its tree.
    pub(super) fn evict_lru_except(
        &mut self,
        keep: u64,
        why: &str,
    ) -> Option<(u64, Arc<Snapshot>, u32)> {
        let (&lru, _) = self
            .held
            .iter()
            .filter(|(c, _)| **c != keep)
            .min_by_key(|(_, h)| h.used)?;
        let held = self.held.remove(&lru)?;
        self.notes.insert(lru, why.to_string());
        Some((lru, held.snap, held.tree))
    }

    /// The snapshot of `cell` was not taken; `note` says why.
    pub(super) fn not_held(&mut self, cell: u64, note: String) {
        self.held.remove(&cell);
        self.notes.insert(cell, note);
    }

    /// Drop the snapshots of process tree `tree` (it was killed): `why` for each.
    pub(super) fn drop_tree(&mut self, tree: u32, why: &str) {
        let gone: Vec<u64> = self
            .held
            .iter()
            .filter(|(_, h)| h.tree == tree)
            .map(|(c, _)| *c)
            .collect();
        for c in gone {
            self.held.remove(&c);
            self.notes.insert(c, why.to_string());
        }
    }

    /// The session is closing: drop every snapshot (`why` for each), and compact the
    /// graph file if it still has dropped cells, so a later server loads exactly the
    /// cells kept now (also those kept only for their snapshot or the head's line).
    pub(super) fn close(&mut self, why: &str) {
        self.drop_snapshots(why);
        if self.dropped > 0 && self.lines > self.nodes.len() + 1 {
            self.compact();
        }
    }

    /// Drop every snapshot (the session is closing): `why` for each.
    pub(super) fn drop_snapshots(&mut self, why: &str) {
        for c in std::mem::take(&mut self.held).into_keys() {
            self.notes.insert(c, why.to_string());
        }
    }

    /// Why the state of `cell` is not held, if known.
    pub(super) fn note(&self, cell: u64) -> Option<&str> {
        self.notes.get(&cell).map(String::as_str).or_else(|| {
            (cell <= self.reloaded_upto && self.nodes.contains_key(&cell)).then_some(RELOADED)
        })
    }

    /// The snapshot of `cell`, marked as just used.
    pub(super) fn use_snapshot(&mut self, cell: u64) -> Option<(Arc<Snapshot>, u32)> {
        self.tick += 1;
        let tick = self.tick;
        self.held.get_mut(&cell).map(|h| {
            h.used = tick;
            (h.snap.clone(), h.tree)
        })
    }

    /// What the held snapshot of `cell` shares with every process forked from it (and
    /// with the worker that ran on from it), in words; `None` if nothing or not held.
    pub(super) fn shared(&self, cell: u64) -> Option<String> {
        self.held.get(&cell).and_then(|h| h.snap.shared.clone())
    }

    pub(super) fn is_held(&self, cell: u64) -> bool {
        self.held.contains_key(&cell)
    }

    /// Number of held snapshots.
    pub(super) fn held_count(&self) -> usize {
        self.held.len()
    }

    /// The cells from the root to `cell`, oldest first, and the cell the path was broken
    /// at (a parent dropped by the retention cap), if it was.
    fn path(&self, cell: u64) -> (Vec<u64>, Option<u64>) {
        let mut path = Vec::new();
        let mut at = Some(cell);
        let mut broken = None;
        while let Some(c) = at {
            let Some(node) = self.nodes.get(&c) else {
                broken = Some(c);
                break;
            };
            path.push(c);
            // A parent is always an earlier cell: a corrupt file must not loop.
            at = node.parent.filter(|p| *p < c);
        }
        path.reverse();
        (path, broken)
    }

    /// Whether `cell` is a cell of this session, kept or dropped.
    pub(super) fn knows(&self, cell: u64) -> bool {
        self.nodes.contains_key(&cell) || self.was_dropped(cell)
    }

    /// Whether `cell` is missing because the retention cap dropped it (not a cell that
    /// never was).
    fn was_dropped(&self, cell: u64) -> bool {
        self.dropped > 0 && cell >= 1 && cell < self.last_cell() && !self.nodes.contains_key(&cell)
    }

    /// How to get the state right after `cell`, or why it cannot be had.
    pub(super) fn plan(&self, cell: u64, head_alive: bool) -> Result<Plan, Unusable> {
        let Some(node) = self.nodes.get(&cell) else {
            return Err(if self.was_dropped(cell) {
                Unusable::Dropped(cell, cell)
            } else {
                Unusable::Unknown
            });
        };
        if node.status == CellStatus::WorkerDied {
            return Err(Unusable::Died(cell));
        }
        if head_alive && self.head == Some(cell) {
            return Ok(Plan::Head);
        }
        if self.is_held(cell) {
            return Ok(Plan::Fork {
                from: cell,
                replay: vec![],
            });
        }
        if node.status == CellStatus::Error {
            return Err(Unusable::FailedNoSnapshot);
        }
        let (path, broken) = self.path(cell);
        if let Some(&died) = path.iter().find(|c| {
            self.nodes
                .get(c)
                .is_some_and(|n| n.status == CellStatus::WorkerDied)
        }) {
            return Err(Unusable::Died(died));
        }
        let from = path.iter().rposition(|c| self.is_held(*c));
        match (from, broken) {
            (Some(i), _) => Ok(Plan::Fork {
                from: path[i],
                replay: path[i + 1..].to_vec(),
            }),
            (None, Some(gone)) => Err(Unusable::Dropped(cell, gone)),
            (None, None) => Ok(Plan::Scratch { replay: path }),
        }
    }

    /// Up to `n` cells one can branch from, nearest to `cell` first, in words
    /// ("c3 (snapshot)", "c4 (replays c4 from c2)"). One pass over the cells, oldest
    /// first (a parent is always older than its child), deciding as [`Graph::plan`] does.
    pub(super) fn usable_near(&self, cell: u64, n: usize) -> Vec<String> {
        /// What a cell's path from the root holds, as seen from that cell.
        #[derive(Clone, Copy)]
        enum Line {
            /// A cell on it ended with the worker's death.
            Died,
            /// It reaches a dropped cell before any snapshot.
            Broken,
            /// Its nearest held snapshot.
            Held(u64),
            /// It reaches the root without a snapshot.
            Root,
        }
        let mut lines: BTreeMap<u64, Line> = BTreeMap::new();
        // Forks first (no replay), then replays from a snapshot, then from the start;
        // nearest to `cell` first within each.
        let mut usable: Vec<(u8, u64, String)> = Vec::new();
        for (&c, node) in &self.nodes {
            let above = match node.parent.filter(|p| *p < c) {
                None => Line::Root,
                Some(p) => lines.get(&p).copied().unwrap_or(Line::Broken),
            };
            let line = match above {
                _ if node.status == CellStatus::WorkerDied => Line::Died,
                Line::Died => Line::Died,
                _ if self.is_held(c) => Line::Held(c),
                other => other,
            };
            lines.insert(c, line);
            let how = if node.status == CellStatus::WorkerDied {
                None
            } else if self.head == Some(c) {
                Some((0, "head".to_string()))
            } else if self.is_held(c) {
                Some((0, "snapshot".to_string()))
            } else if node.status == CellStatus::Error {
                None
            } else {
                match line {
                    Line::Died | Line::Broken => None,
                    Line::Held(from) => Some((1, format!("replays from the snapshot of c{from}"))),
                    Line::Root => Some((2, "replay from the start, with replay=true".to_string())),
                }
            };
            if let Some((rank, how)) = how {
                usable.push((rank, c.abs_diff(cell), format!("c{c} ({how})")));
            }
        }
        usable.sort();
        usable.into_iter().take(n).map(|(_, _, s)| s).collect()
    }

    /// The graph as history shows it, oldest first.
    pub(super) fn entries(&self) -> Vec<HistoryEntry> {
        self.nodes
            .values()
            .map(|n| {
                let snapshot = if self.is_held(n.cell) {
                    SnapshotState::Held
                } else if n.status == CellStatus::WorkerDied {
                    SnapshotState::None
                } else {
                    SnapshotState::Replay
                };
                HistoryEntry {
                    cell: n.cell,
                    parent: n.parent,
                    code: n.label().to_string(),
                    status: n.status,
                    elapsed_ms: n.elapsed_ms,
                    snapshot,
                    note: self.note(n.cell).map(str::to_string),
                    head: self.head == Some(n.cell),
                    replayed: n.replayed.clone(),
                }
            })
            .collect()
    }
}

/// `10000` as "10,000".
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(cell: u64, parent: Option<u64>, status: CellStatus) -> Node {
        Node {
            cell,
            parent,
            label: format!("x = {cell}"),
            code: CellCode::Execute {
                code: format!("x = {cell}"),
            },
            status,
            started_ms: 1,
            elapsed_ms: 1.0,
            replayed: vec![],
        }
    }

    fn snap(cell: u64) -> Snapshot {
        let (a, _b) = super::super::snapshot::control_pair().unwrap();
        Snapshot::for_test(cell, a)
    }

    /// A chain c1 → c2 → c3 with a branch c1 → c4.
    fn sample() -> Graph {
        let mut g = Graph::open(8, 0, None);
        g.add(node(1, None, CellStatus::Ok));
        g.add(node(2, Some(1), CellStatus::Ok));
        g.add(node(3, Some(2), CellStatus::Ok));
        g.add(node(4, Some(1), CellStatus::Ok));
        g
    }

    #[test]
    fn plan_forks_from_the_nearest_held_ancestor_and_replays_the_rest() {
        let mut g = sample();
        g.head = Some(4);
        assert_eq!(g.plan(4, true), Ok(Plan::Head));
        assert_eq!(
            g.plan(3, true),
            Ok(Plan::Scratch {
                replay: vec![1, 2, 3]
            })
        );
        g.hold(snap(1), 10);
        assert_eq!(
            g.plan(3, true),
            Ok(Plan::Fork {
                from: 1,
                replay: vec![2, 3]
            })
        );
        g.hold(snap(3), 10);
        assert_eq!(
            g.plan(3, true),
            Ok(Plan::Fork {
                from: 3,
                replay: vec![]
            })
        );
        assert_eq!(g.plan(9, true), Err(Unusable::Unknown));
        // The head's worker is dead: the head cell is forked (or replayed) like any other.
        assert_eq!(
            g.plan(4, false),
            Ok(Plan::Fork {
                from: 1,
                replay: vec![4]
            })
        );
    }

    #[test]
    fn failed_and_dead_cells_are_refused_without_a_snapshot() {
        let mut g = sample();
        g.add(node(5, Some(3), CellStatus::Error));
        g.add(node(6, Some(5), CellStatus::Ok));
        g.add(node(7, Some(2), CellStatus::WorkerDied));
        g.add(node(8, Some(7), CellStatus::Ok));
        assert_eq!(g.plan(5, true), Err(Unusable::FailedNoSnapshot));
        assert_eq!(g.plan(7, true), Err(Unusable::Died(7)));
        assert_eq!(g.plan(8, true), Err(Unusable::Died(7)));
        g.hold(snap(5), 1);
        assert!(
            g.plan(5, true).is_ok(),
            "a failed cell's snapshot is usable"
        );
        // Usable cells are listed nearest first and never include the dead ones.
        let near = g.usable_near(7, 3);
        assert_eq!(near.len(), 3);
        assert!(
            near.iter()
                .all(|s| !s.starts_with("c7") && !s.starts_with("c8")),
            "{near:?}"
        );
        assert!(near[0].starts_with("c5 (snapshot)"), "{near:?}");
    }

    #[test]
    fn the_cap_evicts_the_least_recently_used_snapshot() {
        let mut g = Graph::open(2, 0, None);
        for c in 1..=3 {
            g.add(node(c, c.checked_sub(1).filter(|p| *p > 0), CellStatus::Ok));
        }
        assert!(g.hold(snap(1), 1).is_empty());
        assert!(g.hold(snap(2), 1).is_empty());
        g.use_snapshot(1); // 2 is now the least recently used
        assert_eq!(g.hold(snap(3), 1), vec![2]);
        assert!(g.is_held(1) && g.is_held(3) && !g.is_held(2));
        let e = g.entries();
        assert_eq!(e[1].snapshot, SnapshotState::Replay);
        assert!(e[1].note.as_deref().unwrap_or_default().contains("evicted"));
        g.drop_tree(1, "the worker died");
        assert_eq!(g.held_count(), 0);
    }

    #[test]
    fn memory_eviction_takes_the_least_recently_used_but_never_the_kept_one() {
        let mut g = sample();
        for c in [1, 2, 3] {
            g.hold(snap(c), 1);
        }
        g.use_snapshot(1); // LRU order now: 2, 3, 1
        let why = "evicted: session memory over the snapshot budget";
        let (cell, snap2, _) = g.evict_lru_except(3, why).expect("one to evict");
        assert_eq!((cell, snap2.cell), (2, 2));
        assert_eq!(g.note(2), Some(why));
        // 3 is kept (the head's own); 1 goes next, then nothing is left to evict.
        assert_eq!(g.evict_lru_except(3, why).map(|(c, _, _)| c), Some(1));
        assert!(g.evict_lru_except(3, why).is_none());
        assert!(g.is_held(3) && g.held_count() == 1);
        // Branching to an evicted cell replays it from the nearest held ancestor.
        g.hold(snap(1), 1);
        assert_eq!(
            g.plan(2, true),
            Ok(Plan::Fork {
                from: 1,
                replay: vec![2]
            })
        );
    }

    #[test]
    fn the_graph_file_survives_a_restart_without_snapshots() {
        let (_scratch, file) = crate::test_support::scratch_path("graph-test", "graph.jsonl");
        let mut g = Graph::open(8, 0, Some(file.clone()));
        g.add(node(1, None, CellStatus::Ok));
        let mut n = node(2, Some(1), CellStatus::Ok);
        n.code = CellCode::RunFile {
            path: "/w/a.py".into(),
            argv: vec!["-v".into()],
        };
        g.add(n.clone());
        g.hold(snap(2), 1);
        // A torn last line (a crash while writing) is skipped, not fatal.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&file)
            .unwrap()
            .write_all(b"{\"cell\":3,")
            .unwrap();
        let again = Graph::open(8, 0, Some(file.clone()));
        assert_eq!(again.last_cell(), 2);
        assert_eq!(again.get(2), Some(&n));
        assert_eq!(again.held_count(), 0);
        assert_eq!(
            again.plan(2, true),
            Ok(Plan::Scratch { replay: vec![1, 2] })
        );
        let mut again = again;
        again.clear();
        assert!(!file.exists());
    }

    /// A cap of 10: a line c1 → … → c5 with a snapshot at c1 and the head at c5, then
    /// fifteen more cells (each on an empty state).
    fn line_then_fifteen(file: Option<PathBuf>) -> Graph {
        let mut g = Graph::open(8, 10, file);
        for c in 1..=5 {
            g.add(node(c, (c > 1).then(|| c - 1), CellStatus::Ok));
        }
        g.hold(snap(1), 1);
        g.head = Some(5);
        for c in 6..=20 {
            g.add(node(c, None, CellStatus::Ok));
        }
        g
    }

    /// Keys of the cells kept.
    fn kept(g: &Graph) -> Vec<u64> {
        g.nodes.keys().copied().collect()
    }

    #[test]
    fn the_cell_cap_drops_the_oldest_but_keeps_held_snapshots_and_the_head_line() {
        let mut g = line_then_fifteen(None);
        assert_eq!(kept(&g), [1, 2, 3, 4, 5, 16, 17, 18, 19, 20]);
        assert_eq!(g.dropped(), Some((10, 1)));
        assert_eq!(
            g.dropped_note().as_deref(),
            Some(
                "10 older cell(s) were dropped (the session keeps its last 10 cells); \
                 the oldest kept is c1"
            )
        );
        // The head's line still replays from its snapshot.
        assert_eq!(
            g.plan(4, true),
            Ok(Plan::Fork {
                from: 1,
                replay: vec![2, 3, 4]
            })
        );
        assert_eq!(g.plan(5, true), Ok(Plan::Head));
        // A dropped cell is refused in words that name a held cell to use instead; a cell
        // that never was is still unknown.
        assert_eq!(g.plan(10, true), Err(Unusable::Dropped(10, 10)));
        assert_eq!(
            g.dropped_words(10, 10),
            "c10 was dropped from the history: the session keeps its last 10 cells; \
             branch from c1 (held) or start fresh (session_restart)"
        );
        assert_eq!(g.plan(21, true), Err(Unusable::Unknown));
        assert!(g.knows(10) && g.knows(20) && !g.knows(21) && !g.knows(0));
        // Once the head moves on and the snapshot is gone, the old line goes too.
        g.drop_snapshots("the session was closed");
        g.head = Some(20);
        g.add(node(21, Some(20), CellStatus::Ok));
        assert_eq!(kept(&g), [2, 3, 4, 5, 16, 17, 18, 19, 20, 21]);
        g.add(node(22, Some(21), CellStatus::Ok));
        assert_eq!(kept(&g)[0], 3, "one in, one out");
        assert_eq!(g.dropped(), Some((12, 3)));
        // The newest cell is always kept, even with a cap of one.
        let mut one = Graph::open(0, 1, None);
        for c in 1..=3 {
            one.add(node(c, (c > 1).then(|| c - 1), CellStatus::Ok));
        }
        assert_eq!(kept(&one), [3]);
        assert_eq!(one.last_cell(), 3);
    }

    #[test]
    fn a_closed_session_leaves_exactly_its_kept_cells_for_the_next_server() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("graph.jsonl");
        let mut g = line_then_fifteen(Some(file.clone()));
        let before = kept(&g);
        assert_eq!(before, [1, 2, 3, 4, 5, 16, 17, 18, 19, 20]);
        // Without the close, the file still has c6..c15 (not compacted yet): a reload
        // would keep the newest ten.
        assert_eq!(
            kept(&Graph::open(8, 10, Some(file.clone()))),
            (11..=20).collect::<Vec<_>>()
        );
        g.close("the session was closed");
        let again = Graph::open(8, 10, Some(file.clone()));
        assert_eq!(kept(&again), before);
        assert_eq!(again.dropped(), Some((10, 1)));
    }

    #[test]
    fn a_replay_over_a_dropped_cell_is_refused_in_words() {
        let mut g = Graph::open(8, 10, None);
        for c in 1..=20 {
            g.add(node(c, (c > 1).then(|| c - 1), CellStatus::Ok));
            g.head = Some(c);
        }
        // No snapshot on the line: nothing protects the old cells.
        assert_eq!(kept(&g), (11..=20).collect::<Vec<_>>());
        assert_eq!(g.plan(15, true), Err(Unusable::Dropped(15, 10)));
        assert_eq!(
            g.dropped_words(15, 10),
            "c15 needs c10, which was dropped from the history: the session keeps its last \
             10 cells; branch from a kept cell (the oldest is c11) or start fresh (session_restart)"
        );
        // With a snapshot on the way, the same cell forks from it instead.
        g.hold(snap(12), 1);
        assert_eq!(
            g.plan(15, true),
            Ok(Plan::Fork {
                from: 12,
                replay: vec![13, 14, 15]
            })
        );
        assert_eq!(g.plan(11, true), Err(Unusable::Dropped(11, 10)));
        // The list of usable cells agrees with `plan` for every cell.
        let near = g.usable_near(11, 100);
        for c in kept(&g) {
            let listed = near.iter().any(|s| s.starts_with(&format!("c{c} (")));
            assert_eq!(listed, g.plan(c, true).is_ok(), "c{c}: {near:?}");
        }
        assert_eq!(thousands(10_000), "10,000");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn cells_added_after_a_restart_are_in_the_new_graph_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("graph.jsonl");
        let mut g = Graph::open(8, 10, Some(file.clone()));
        for c in 1..=3 {
            g.add(node(c, (c > 1).then(|| c - 1), CellStatus::Ok));
        }
        g.clear();
        assert!(!file.exists());
        for c in 1..=2 {
            g.add(node(c, (c > 1).then(|| c - 1), CellStatus::Ok));
        }
        let again = Graph::open(8, 10, Some(file.clone()));
        assert_eq!(kept(&again), [1, 2]);
    }

    type Written = std::io::Result<tempfile::NamedTempFile>;
    use std::sync::mpsc::Sender;

    /// A graph of 21 cells (cap 10) in `file`, whose compaction (due at cell 21) has
    /// written its file on its thread; that file is handed over by the sender returned,
    /// when the test chooses — until then the compaction is still "running".
    fn graph_with_a_compaction_held(file: &std::path::Path) -> (Graph, Sender<Written>, Written) {
        let mut g = Graph::open(8, 10, Some(file.to_path_buf()));
        for c in 1..=21 {
            g.add(node(c, (c > 1).then(|| c - 1), CellStatus::Ok));
        }
        // Cell 21 made the file due: its compaction runs on a thread, and the answer
        // did not wait for it.
        assert!(g.compacting.is_some());
        assert_eq!(std::fs::read_to_string(file).unwrap().lines().count(), 21);
        let written = g.compacting.as_ref().unwrap().done.recv().unwrap();
        let (tx, done) = std::sync::mpsc::channel();
        g.compacting.as_mut().unwrap().done = done;
        (g, tx, written)
    }

    #[test]
    fn cells_added_while_a_compaction_runs_are_in_the_compacted_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("graph.jsonl");
        let lines = || std::fs::read_to_string(&file).unwrap().lines().count();
        // The thread's file is there, not yet put in place.
        let (mut g, tx, written) = graph_with_a_compaction_held(&file);
        tx.send(written).unwrap();
        // Cells 22 and 23 go to the old file (and are kept for the new one) …
        g.add(node(22, Some(21), CellStatus::Ok));
        assert!(
            g.compacting.is_none(),
            "cell 22 found it done and put it in place"
        );
        g.add(node(23, Some(22), CellStatus::Ok));
        // … and are in the compacted file: the header, cells 12-21, then 22 and 23.
        assert_eq!(lines(), 1 + 10 + 2);
        let again = Graph::open(8, 10, Some(file.clone()));
        assert_eq!(kept(&again), (14..=23).collect::<Vec<_>>());
        assert_eq!(again.dropped(), Some((13, 14)));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["graph.jsonl"], "no temporary file left");
    }

    /// A compaction that has not landed after half the cap of cells more is waited for:
    /// the file never holds more than `max_lines` lines, however slow the disk.
    #[test]
    fn a_compaction_that_lags_is_waited_for_at_two_and_a_half_times_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("graph.jsonl");
        let lines = || std::fs::read_to_string(&file).unwrap().lines().count();
        // The thread's file is held back: the compaction "runs" until we let it land.
        let (mut g, tx, written) = graph_with_a_compaction_held(&file);
        for c in 22..=25 {
            g.add(node(c, Some(c - 1), CellStatus::Ok));
            assert!(g.compacting.is_some());
        }
        assert_eq!(lines(), g.max_lines());
        let lands = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            tx.send(written).unwrap();
        });
        // At the bound: this cell waits for the compaction, then goes to the new file.
        g.add(node(26, Some(25), CellStatus::Ok));
        lands.join().unwrap();
        assert!(
            g.compacting.is_none(),
            "cell 26 did not wait for the compaction"
        );
        assert_eq!(lines(), 1 + 10 + 4 + 1);
    }

    #[test]
    fn the_graph_file_is_compacted_and_a_reload_sees_exactly_the_kept_cells() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("graph.jsonl");
        let lines = || std::fs::read_to_string(&file).unwrap().lines().count();
        let mut g = Graph::open(8, 10, Some(file.clone()));
        let mut most = 0;
        for c in 1..=95 {
            g.add(node(c, (c > 1).then(|| c - 1), CellStatus::Ok));
            // The compaction runs on a thread; the next cell puts its file in place.
            g.finish_compaction(true);
            g.head = Some(c);
            most = most.max(lines());
        }
        g.hold(snap(95), 1);
        assert!(most <= 2 * 10 + 1, "the file grew to {most} lines");
        let before = kept(&g);
        assert_eq!(before, (86..=95).collect::<Vec<_>>());
        let again = Graph::open(8, 10, Some(file.clone()));
        assert_eq!(kept(&again), before);
        assert_eq!(again.dropped(), Some((85, 86)));
        assert_eq!(again.get(90), g.get(90));
        assert_eq!(again.note(90), Some(RELOADED));
        // The code is kept once, and history still shows it.
        assert!(again.get(90).is_some_and(|n| n.label.is_empty()));
        let shown = again.entries();
        assert_eq!(shown.len(), 10);
        assert_eq!(shown[4].code, "x = 90");
        assert_eq!(again.held_count(), 0);
        // Cells dropped before the reload are still known as dropped, not unknown.
        assert_eq!(again.plan(3, true), Err(Unusable::Dropped(3, 3)));
        assert_eq!(again.plan(90, true), Err(Unusable::Dropped(90, 85)));
        drop(g);
        // A torn last line (a crash while appending) loses no earlier cell; appending
        // and compacting go on from there.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&file)
            .unwrap()
            .write_all(b"{\"cell\":96,\"par")
            .unwrap();
        let mut g = Graph::open(8, 10, Some(file.clone()));
        assert_eq!(kept(&g), before);
        for c in 96..=130 {
            g.add(node(c, (c > 1).then(|| c - 1), CellStatus::Ok));
            g.finish_compaction(true);
            assert!(lines() <= 2 * 10 + 1);
        }
        let again = Graph::open(8, 10, Some(file.clone()));
        assert_eq!(kept(&again), (121..=130).collect::<Vec<_>>());
        assert_eq!(again.dropped(), Some((120, 121)));
        // A file from before the cap (or a larger cap) is cut to the newest cells on load.
        let small = Graph::open(8, 3, Some(file.clone()));
        assert_eq!(kept(&small), [128, 129, 130]);
        assert_eq!(small.dropped(), Some((127, 128)));
        // No temporary files are left beside it, not even one a crash left.
        std::fs::write(dir.path().join(format!("{TMP_PREFIX}x1")), "{").unwrap();
        let again = Graph::open(8, 10, Some(file.clone()));
        assert_eq!(
            kept(&again),
            [128, 129, 130],
            "the smaller cap compacted the file"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["graph.jsonl"]);
    }
}
