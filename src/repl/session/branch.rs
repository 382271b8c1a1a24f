//! Branching: run a cell on the state right after an earlier cell. The session forks a
//! new live worker from that cell's snapshot (or from the nearest ancestor's, replaying
//! the cells in between; or replays from a fresh worker when the agent confirms), makes
//! it the head, and keeps the old head's process tree while it holds snapshots.
//! Snapshots themselves arrive through the hook each worker calls after a cell.

use crate::sandbox::launcher::pidns::host_pid;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Inner, Parent, Session};
use crate::repl::cell::{CellSink, CellStatus, OutStream, cell_name};
use crate::repl::error::ReplError;
use crate::repl::graph::{CellCode, Plan, Unusable};
use crate::repl::protocol::{Event, Request, WireStatus};
use crate::repl::snapshot::Snapshot;
use crate::repl::worker::{Reply, SnapshotHook, Worker};

/// Why a snapshot was evicted by the memory budget (history's note).
const MEMORY_EVICTED: &str = "evicted: session memory over the snapshot budget";

/// How long an evicted snapshot may take to exit before the budget is checked again.
const SNAPSHOT_EXIT_WAIT: Duration = Duration::from_secs(2);

/// Wait (at most `limit`) until process `pid` has exited: gone, or a zombie, whose
/// memory is already released. A snapshot's pid is not reused while it waits on our
/// socket; were it reused after it ended, this only waits out `limit`.
fn wait_exited(pid: u32, limit: Duration) {
    let deadline = Instant::now() + limit;
    let stat = format!("/proc/{pid}/stat");
    while Instant::now() < deadline {
        let running = std::fs::read_to_string(&stat).is_ok_and(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state != "Z" && state != "X")
        });
        if !running {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Output of replayed cells is not shown again.
struct Discard;

impl CellSink for Discard {
    fn output(&self, _: OutStream, _: &[u8]) {}
    fn awaiting_input(&self, _: &str) {}
    fn input_received(&self) {}
}

impl Session {
    /// The hook a worker of this session hands its snapshots to.
    pub(super) fn snapshot_hook(&self) -> SnapshotHook {
        let me = self.me.clone();
        Arc::new(move |pid, cell, snap| {
            if let Some(s) = me.upgrade() {
                s.adopt_snapshot(pid, cell, snap);
            }
        })
    }

    /// Keep a snapshot if it comes from the head (anything else, e.g. a worker replaced
    /// meanwhile, is dropped: the snapshot process exits).
    fn adopt_snapshot(&self, pid: u32, cell: u64, snap: Result<Snapshot, String>) {
        let mut inner = self.inner();
        let from_head = inner.worker.as_ref().is_some_and(|w| w.pid == pid);
        if self.phases.now().is_closed() || !from_head {
            return;
        }
        match snap {
            Ok(snap) => {
                let tree = inner.head_tree;
                tracing::debug!(session = %self.name, cell, pid = snap.pid, "snapshot held");
                let evicted = inner.graph.hold(snap, tree);
                if !evicted.is_empty() {
                    tracing::debug!(session = %self.name, ?evicted, "snapshots evicted");
                }
                drop(inner);
                self.enforce_snapshot_memory(cell);
            }
            Err(note) => inner.graph.not_held(cell, note),
        }
    }

    /// Memory the session's process trees hold now (the head's and those of earlier
    /// heads that still hold snapshots), from their job cgroups; `None` without a memory
    /// cgroup. The spare worker is not counted: it holds no snapshot.
    pub(super) fn trees_memory(inner: &Inner) -> Option<u64> {
        let head_root = inner.worker.as_ref().filter(|w| w.is_root());
        head_root
            .into_iter()
            .chain(inner.roots.values())
            .filter_map(|w| w.tree_memory_bytes())
            .reduce(|a, b| a.saturating_add(b))
    }

    /// The memory half of the snapshot cap: while the session's trees hold more than the
    /// budget, evict the least recently used snapshot other than `keep` (the head's own,
    /// just taken) and wait until it has exited, so the next reading shows its pages gone.
    /// Runs in the head's event pump, before any later event: a `ping` answered after it
    /// (see `settle`) sees the result.
    fn enforce_snapshot_memory(&self, keep: u64) {
        let Some(budget) = self.env.snapshot_memory else {
            return;
        };
        loop {
            let victim = {
                let mut inner = self.inner();
                let Some(used) = Self::trees_memory(&inner) else {
                    return;
                };
                if used <= budget {
                    return;
                }
                let Some(victim) = inner.graph.evict_lru_except(keep, MEMORY_EVICTED) else {
                    return;
                };
                tracing::debug!(session = %self.name, cell = victim.0, used, budget, "snapshot evicted for memory");
                let (_, snap, tree) = victim;
                // The snapshot reported its pid as its PID namespace numbers it.
                let pid = Self::tree_reference(&inner, tree)
                    .and_then(|reference| host_pid(reference, snap.pid));
                (snap, pid)
            };
            let (snap, pid) = victim;
            // The last reference closes its socket: the snapshot exits (a fork in flight
            // may hold another for a moment; then the wait below just times out).
            drop(snap);
            if let Some(pid) = pid {
                wait_exited(pid, SNAPSHOT_EXIT_WAIT);
            }
        }
    }

    /// A live process (host pid) of process tree `tree`: its root's Python process.
    fn tree_reference(inner: &Inner, tree: u32) -> Option<u32> {
        Self::tree_root(inner, tree).map(|root| root.python_pid())
    }

    /// The spawned worker at the root of process tree `tree`, if it is still known.
    fn tree_root(inner: &Inner, tree: u32) -> Option<&Arc<Worker>> {
        inner.roots.get(&tree).or_else(|| {
            inner
                .worker
                .as_ref()
                .filter(|w| w.is_root() && w.pid == tree)
        })
    }

    /// The head died: its process tree goes with it (snapshots included).
    pub(super) fn head_lost(inner: &mut Inner) {
        let tree = inner.head_tree;
        inner.graph.drop_tree(
            tree,
            "the worker died, and the snapshots of its process tree with it",
        );
        if let Some(root) = inner.roots.remove(&tree) {
            root.end_tree("the head of its process tree died");
        }
        inner.graph.head = None;
    }

    /// Make `new` (of process tree `tree`) the head, at cell `at`. The old head is
    /// killed alone; a spawned one is kept (unreaped) as the root of its tree.
    /// A restart that came while the branch was being made wins: `new` is killed and
    /// the head stays the restart's fresh worker (the cell is told, see `acquire_cell`).
    fn switch_head(&self, new: Arc<Worker>, tree: u32, at: Option<u64>) {
        let mut inner = self.inner();
        let now = self.phases.now();
        if now.held_op().is_some_and(|op| now.overtaken(op)) {
            new.kill("the session was restarted");
            return;
        }
        if let Some(old) = inner.worker.replace(new) {
            old.kill_alone("the session branched to another cell");
            if old.is_root() {
                inner.roots.insert(old.pid, old);
            }
        }
        inner.head_tree = tree;
        inner.graph.head = at;
        inner.lost = None;
    }

    fn bad_parent(&self, p: &Parent, why: String) -> ReplError {
        let usable = self.inner().graph.usable_near(p.cell, 8);
        ReplError::BadParent {
            session: self.name.clone(),
            parent: p.text.clone(),
            why,
            usable: if usable.is_empty() {
                "none yet (run a cell first)".into()
            } else {
                usable.join(", ")
            },
        }
    }

    /// Whether this session has (or had, before the cell cap dropped it) a cell numbered
    /// `cell`.
    pub(crate) fn has_cell(&self, cell: u64) -> bool {
        self.inner().graph.knows(cell)
    }

    /// The live head, once every snapshot it announced before now is in (a ping is
    /// answered after them).
    async fn settle(&self) -> Option<Arc<Worker>> {
        let head = self
            .inner()
            .worker
            .clone()
            .filter(|w| w.death().is_none())?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let _ = head.call(id, &Request::Ping { id }, None, None).await;
        head.death().is_none().then_some(head)
    }

    /// Wait until the snapshot of the last cell is in (or known not to be), unless a
    /// cell runs: then history shows what is known so far.
    pub async fn settle_snapshots(&self) {
        if let Some(_guard) = self.try_short() {
            self.settle().await;
        }
    }

    /// Refuse a parent that cannot be branched from, before anything runs (a busy
    /// session is not checked here: the cell itself then says it is busy).
    pub async fn check_parent(&self, p: &Parent) -> Result<(), ReplError> {
        let Some(_guard) = self.try_short() else {
            return Ok(());
        };
        let head = self.settle().await;
        self.plan_for(p, head.is_some()).map(|_| ())
    }

    /// How to get to `p`'s state, or a clear error listing usable cells.
    fn plan_for(&self, p: &Parent, head_alive: bool) -> Result<Plan, ReplError> {
        let plan = self.inner().graph.plan(p.cell, head_alive);
        match plan {
            Ok(Plan::Scratch { replay }) if !p.replay => {
                let why = self
                    .inner()
                    .graph
                    .note(p.cell)
                    .unwrap_or("no snapshot on its path")
                    .to_string();
                Err(ReplError::ReplayNeeded {
                    parent: p.text.clone(),
                    why,
                    cells: replay
                        .iter()
                        .map(|c| cell_name(*c))
                        .collect::<Vec<_>>()
                        .join(", "),
                })
            }
            Ok(plan) => Ok(plan),
            Err(Unusable::Unknown) => {
                Err(self.bad_parent(p, format!("there is no cell {} in this session", p.text)))
            }
            Err(Unusable::Died(c)) => Err(self.bad_parent(
                p,
                format!(
                    "the worker died in {}, so there is no state to branch from",
                    cell_name(c)
                ),
            )),
            Err(Unusable::Dropped(asked, gone)) => {
                let why = self.inner().graph.dropped_words(asked, gone);
                Err(self.bad_parent(p, why))
            }
            Err(Unusable::FailedNoSnapshot) => {
                let note = self
                    .inner()
                    .graph
                    .note(p.cell)
                    .unwrap_or("not taken")
                    .to_string();
                Err(self.bad_parent(
                    p,
                    format!(
                        "{} raised an exception and has no snapshot ({note}); replaying it would raise again",
                        p.text
                    ),
                ))
            }
        }
    }

    /// Put the head at the state right after `p.cell`; returns the head and the cells
    /// replayed to get there. Called by a cell that holds the worker's main thread.
    /// Returns the new head, the cells replayed on it and, for a fork from a snapshot,
    /// what that snapshot shares with its other branches (in words).
    pub(super) async fn branch_to(
        &self,
        p: &Parent,
    ) -> Result<(Arc<Worker>, Vec<u64>, Option<String>), ReplError> {
        if self.phases.now().is_closed() {
            return Err(self.closed());
        }
        let head = self.settle().await;
        let plan = self.plan_for(p, head.is_some())?;
        match plan {
            // The head runs on from the parent's state; its snapshot, which later
            // branches fork from, shares with it what it shares with them.
            Plan::Head => match head {
                Some(h) => Ok((h, Vec::new(), self.inner().graph.shared(p.cell))),
                None => Err(ReplError::Branch {
                    detail: "the head's worker is gone".into(),
                }),
            },
            Plan::Fork { from, replay } => {
                let (w, shared) = match self.fork_from(from).await {
                    Ok(forked) => forked,
                    // A snapshot that died (e.g. killed at the memory limit) is forgotten
                    // by `fork_from`: plan again, from an older snapshot or by replay.
                    Err(first) => match self.plan_for(p, head.is_some())? {
                        Plan::Fork { from: again, .. } if again == from => return Err(first),
                        Plan::Fork { from, replay } => {
                            let (w, shared) = self.fork_from(from).await?;
                            self.replay(&w, &replay).await?;
                            return Ok((w, replay, shared));
                        }
                        _ => return Err(first),
                    },
                };
                self.replay(&w, &replay).await?;
                Ok((w, replay, shared))
            }
            Plan::Scratch { replay } => {
                let w = {
                    let mut inner = self.inner();
                    self.fresh_worker(&mut inner)?
                };
                self.refill_spare();
                w.wait_ready(self.env.start_timeout).await?;
                self.switch_head(w.clone(), w.pid, None);
                self.replay(&w, &replay).await?;
                Ok((w, replay, None))
            }
        }
    }

    /// A new live worker forked from the snapshot of `from`, made the head; and what the
    /// snapshot shares with its other branches, if anything (in words).
    async fn fork_from(&self, from: u64) -> Result<(Arc<Worker>, Option<String>), ReplError> {
        let Some((snap, tree)) = self.inner().graph.use_snapshot(from) else {
            return Err(ReplError::Branch {
                detail: format!("the snapshot of {} is gone", cell_name(from)),
            });
        };
        let shared = snap.shared.clone();
        let timeout = self.env.start_timeout;
        let forked = tokio::task::spawn_blocking(move || snap.fork_live(timeout))
            .await
            .map_err(|e| ReplError::Branch {
                detail: format!("the fork task failed: {e}"),
            })?;
        let forked = match forked {
            Ok(f) => f,
            Err(e) => {
                // A snapshot that cannot fork is useless: forget it (it exits).
                self.inner()
                    .graph
                    .not_held(from, format!("its snapshot failed: {e}"));
                return Err(ReplError::Branch {
                    detail: format!(
                        "the snapshot of {} could not fork a worker: {e}",
                        cell_name(from)
                    ),
                });
            }
        };
        // A process of the snapshot's tree, to translate the pid the snapshot reports.
        let (reference, denials) = {
            let inner = self.inner();
            (
                Self::tree_reference(&inner, tree),
                Self::tree_root(&inner, tree).and_then(|root| root.network_denials()),
            )
        };
        let w = Arc::new(Worker::adopt(
            forked,
            reference,
            self.env.spec.policy.clone(),
            denials,
        )?);
        w.on_snapshot(self.snapshot_hook());
        if let Err(e) = w.wait_ready(self.env.start_timeout).await {
            w.kill_alone("it did not start");
            return Err(ReplError::Branch {
                detail: format!(
                    "the worker forked from {} did not start: {e}",
                    cell_name(from)
                ),
            });
        }
        self.switch_head(w.clone(), tree, Some(from));
        Ok((w, shared))
    }

    /// Run `cells` again on `w` (the head), in order; stop at the first that ends
    /// differently than it did the first time.
    async fn replay(&self, w: &Arc<Worker>, cells: &[u64]) -> Result<(), ReplError> {
        for &c in cells {
            let Some(node) = self.inner().graph.get(c).cloned() else {
                return Err(ReplError::Branch {
                    detail: format!("{} is no longer in the graph", cell_name(c)),
                });
            };
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let repr_limit = self.env.repr_limit;
            let req = match node.code {
                CellCode::Execute { code } => Request::Execute {
                    id,
                    cell: c,
                    code,
                    repr_limit,
                },
                CellCode::RunFile { path, argv } => Request::RunFile {
                    id,
                    cell: c,
                    path,
                    argv,
                    repr_limit,
                },
            };
            let reply = w.call(id, &req, Some(Arc::new(Discard)), None).await;
            let status = match reply {
                Ok(Reply::Event(Event::Done { status, error, .. })) => {
                    let s = match status {
                        WireStatus::Ok => CellStatus::Ok,
                        WireStatus::Error => CellStatus::Error,
                        WireStatus::Interrupted => CellStatus::Interrupted,
                    };
                    (s, error.map(|e| format!("{}: {}", e.ename, e.evalue)))
                }
                Ok(Reply::Died(message)) => {
                    let mut inner = self.inner();
                    if inner.worker.as_ref().is_some_and(|h| Arc::ptr_eq(h, w)) {
                        inner.worker = None;
                        Self::head_lost(&mut inner);
                    }
                    return Err(ReplError::WorkerDied {
                        message: format!("replaying {}: {message}", cell_name(c)),
                    });
                }
                _ => {
                    return Err(ReplError::Protocol {
                        detail: format!("no `done` for the replay of {}", cell_name(c)),
                    });
                }
            };
            if status.0 != node.status {
                return Err(ReplError::Python {
                    message: format!(
                        "replaying {} ended {:?} this time ({}), not {:?} as before; the session's head is now at the state after it",
                        cell_name(c),
                        status.0,
                        status.1.unwrap_or_default(),
                        node.status
                    ),
                });
            }
            self.inner().graph.head = Some(c);
        }
        Ok(())
    }
}
