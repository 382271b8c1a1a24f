//! The cell graph of a session: each cell's parent, code, status and whether its state
//! is held by a snapshot; which cell the live worker is at (the head); the snapshot cap
//! with least-recently-used eviction; the replay plan for a cell whose state is not
//! held; and the graph persisted as JSON lines in the session's state directory.
//!
//! Pure bookkeeping: no processes, no I/O but the graph file. `session` drives it.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::snapshot::Snapshot;
use super::{CellStatus, HistoryEntry, SnapshotState};

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
    pub cell: u64,
    pub parent: Option<u64>,
    /// What history shows: the code, or `run_file <path> <args>`.
    pub label: String,
    #[serde(flatten)]
    pub code: CellCode,
    pub status: CellStatus,
    /// Unix time the cell started, milliseconds.
    pub started_ms: u64,
    pub elapsed_ms: f64,
    /// Cells run again (in order) to rebuild the parent's state before this one ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replayed: Vec<u64>,
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
}

#[derive(Default)]
pub(crate) struct Graph {
    nodes: BTreeMap<u64, Node>,
    held: BTreeMap<u64, Held>,
    /// Why a cell's snapshot is not held (not taken, evicted), by cell.
    notes: BTreeMap<u64, String>,
    /// The cell whose state the live worker has (None: empty state).
    pub head: Option<u64>,
    cap: usize,
    tick: u64,
    file: Option<PathBuf>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

impl Graph {
    /// An empty graph keeping at most `cap` snapshots, persisted to `file` (whose cells,
    /// from an earlier server, are loaded: their snapshots are gone).
    pub fn open(cap: usize, file: Option<PathBuf>) -> Graph {
        let mut g = Graph {
            cap,
            file,
            ..Default::default()
        };
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
                if let Ok(node) = serde_json::from_str::<Node>(line) {
                    g.notes.insert(
                        node.cell,
                        "the server restarted; snapshots do not survive it".into(),
                    );
                    g.nodes.insert(node.cell, node);
                }
            }
        }
        g
    }

    /// The highest cell number, to continue numbering after a server restart.
    pub fn last_cell(&self) -> u64 {
        self.nodes.keys().next_back().copied().unwrap_or(0)
    }

    pub fn get(&self, cell: u64) -> Option<&Node> {
        self.nodes.get(&cell)
    }

    /// Record a finished cell (and append it to the graph file).
    pub fn add(&mut self, mut node: Node) {
        if node.started_ms == 0 {
            node.started_ms = now_ms();
        }
        if let Some(file) = &self.file {
            let appended = serde_json::to_string(&node)
                .map_err(std::io::Error::other)
                .and_then(|line| {
                    let mut f = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(file)?;
                    f.write_all(format!("{line}\n").as_bytes())
                });
            if let Err(e) = appended {
                tracing::warn!(file = %file.display(), error = %e, "could not persist the cell graph");
            }
        }
        self.nodes.insert(node.cell, node);
    }

    /// Forget everything (restart): cells, snapshots (they exit), the graph file.
    pub fn clear(&mut self) {
        self.nodes.clear();
        self.held.clear();
        self.notes.clear();
        self.head = None;
        if let Some(file) = &self.file {
            let _ = std::fs::remove_file(file);
        }
    }

    /// A snapshot arrived for `cell` (from tree `tree`); returns what was evicted.
    pub fn hold(&mut self, snap: Snapshot, tree: u32) -> Vec<u64> {
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
    pub fn evict_lru_except(&mut self, keep: u64, why: &str) -> Option<(u64, Arc<Snapshot>, u32)> {
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
    pub fn not_held(&mut self, cell: u64, note: String) {
        self.held.remove(&cell);
        self.notes.insert(cell, note);
    }

    /// Drop the snapshots of process tree `tree` (it was killed): `why` for each.
    pub fn drop_tree(&mut self, tree: u32, why: &str) {
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

    /// Drop every snapshot (the session is closing): `why` for each.
    pub fn drop_snapshots(&mut self, why: &str) {
        for c in std::mem::take(&mut self.held).into_keys() {
            self.notes.insert(c, why.to_string());
        }
    }

    /// Why the state of `cell` is not held, if known.
    pub fn note(&self, cell: u64) -> Option<&str> {
        self.notes.get(&cell).map(String::as_str)
    }

    /// The snapshot of `cell`, marked as just used.
    pub fn use_snapshot(&mut self, cell: u64) -> Option<(Arc<Snapshot>, u32)> {
        self.tick += 1;
        let tick = self.tick;
        self.held.get_mut(&cell).map(|h| {
            h.used = tick;
            (h.snap.clone(), h.tree)
        })
    }

    pub fn is_held(&self, cell: u64) -> bool {
        self.held.contains_key(&cell)
    }

    /// Number of held snapshots.
    pub fn held_count(&self) -> usize {
        self.held.len()
    }

    /// The cells from the root to `cell`, oldest first.
    fn path(&self, cell: u64) -> Vec<u64> {
        let mut path = Vec::new();
        let mut at = Some(cell);
        while let Some(c) = at {
            if path.contains(&c) {
                break; // a corrupt file must not loop
            }
            path.push(c);
            at = self.nodes.get(&c).and_then(|n| n.parent);
        }
        path.reverse();
        path
    }

    /// How to get the state right after `cell`, or why it cannot be had.
    pub fn plan(&self, cell: u64, head_alive: bool) -> Result<Plan, Unusable> {
        let node = self.nodes.get(&cell).ok_or(Unusable::Unknown)?;
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
        let path = self.path(cell);
        if let Some(&died) = path.iter().find(|c| {
            self.nodes
                .get(c)
                .is_some_and(|n| n.status == CellStatus::WorkerDied)
        }) {
            return Err(Unusable::Died(died));
        }
        let from = path.iter().rposition(|c| self.is_held(*c));
        Ok(match from {
            Some(i) => Plan::Fork {
                from: path[i],
                replay: path[i + 1..].to_vec(),
            },
            None => Plan::Scratch { replay: path },
        })
    }

    /// Up to `n` cells one can branch from, nearest to `cell` first, in words
    /// ("c3 (snapshot)", "c4 (replays c4 from c2)").
    pub fn usable_near(&self, cell: u64, n: usize) -> Vec<String> {
        // Forks first (no replay), then replays from a snapshot, then from the start;
        // nearest to `cell` first within each.
        let mut usable: Vec<(u8, u64, String)> = self
            .nodes
            .keys()
            .filter_map(|&c| {
                let (rank, how) = match self.plan(c, true).ok()? {
                    Plan::Head => (0, "head".to_string()),
                    Plan::Fork { replay, .. } if replay.is_empty() => (0, "snapshot".to_string()),
                    Plan::Fork { from, .. } => (1, format!("replays from the snapshot of c{from}")),
                    Plan::Scratch { .. } => {
                        (2, "replay from the start, with replay=true".to_string())
                    }
                };
                Some((rank, c.abs_diff(cell), format!("c{c} ({how})")))
            })
            .collect();
        usable.sort();
        usable.into_iter().take(n).map(|(_, _, s)| s).collect()
    }

    /// The graph as history shows it, oldest first.
    pub fn entries(&self) -> Vec<HistoryEntry> {
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
                    code: n.label.clone(),
                    status: n.status,
                    elapsed_ms: n.elapsed_ms,
                    snapshot,
                    note: self.notes.get(&n.cell).cloned(),
                    head: self.head == Some(n.cell),
                    replayed: n.replayed.clone(),
                }
            })
            .collect()
    }
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
        let mut g = Graph::open(8, None);
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
        let mut g = Graph::open(2, None);
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
        let mut g = Graph::open(8, Some(file.clone()));
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
        let again = Graph::open(8, Some(file.clone()));
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
}
