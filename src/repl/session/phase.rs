//! The session's phase machine: what holds the worker's main thread (nothing, a short
//! operation, a cell, or nothing ever again), plus the two things that run beside any
//! phase — a cell promised to a caller but not started yet, and a spare worker starting.
//!
//! [`Machine::transition`] is pure: every change of phase goes through it, so it is
//! tested without processes (see the tests below). [`Phases`] publishes the machine on a
//! `tokio::sync::watch` channel: a call that must wait (a short operation holds the
//! thread) waits for the next published change, never polls; [`OpGuard`] is the op's
//! hold on the thread, released (phase back to idle) when it is dropped — by the
//! worker's I/O task when the worker answers or dies, not when a caller gives up.
//!
//! Lock: the watch channel's own lock is a leaf. It is taken for one pure transition at
//! a time and nothing else is locked or called while it is held; the session takes it
//! under its `inner` mutex where a transition must be atomic with `Inner`'s data
//! (numbering a cell, closing, the spare), never the other way round.

use tokio::sync::watch;

/// Who holds the worker's main thread. `op` numbers each hold, so a guard releases
/// only its own and a restart can wait for the one it killed to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Nothing runs on the worker's main thread.
    Idle,
    /// A short operation holds it (a variable operation, the ping that settles
    /// snapshots, `add_site_dirs_now`): calls that arrive wait for it.
    Short { op: u64 },
    /// A cell holds it: calls that arrive are refused "busy".
    Cell {
        op: u64,
        cell: u64,
        /// The cell's request was handed to its worker: an interrupt is sent at once.
        dispatched: bool,
        /// An interrupt came before the request was handed over: it is sent right
        /// after.
        interrupt_queued: bool,
        /// The session was restarted after this cell took the thread (or was promised,
        /// see [`Expected::Overtaken`]): it must not be handed to any worker — not the
        /// fresh one, not one a branch made for it; its call ends saying so.
        overtaken: bool,
    },
    /// The session closed while an op held the thread (its worker was killed): the op
    /// ends soon, nothing starts again.
    Closing { op: u64, cell: Option<u64> },
    /// The session closed; nothing runs or starts again.
    Closed,
}

/// A cell promised to a caller (its job exists and may be cancelled) that has not
/// taken the thread yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expected {
    No,
    Yes,
    /// An interrupt came for it: the cell is interrupted as it starts.
    Interrupted,
    /// The session was restarted after the promise: the cell is overtaken as it starts
    /// (it never runs on the fresh worker).
    Overtaken,
}

/// The whole state, as published: the phase and what runs beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Machine {
    pub(crate) phase: Phase,
    pub(crate) expected: Expected,
    /// A spare worker is being started (in the background, beside any phase): cells
    /// ending meanwhile start no other.
    pub(crate) spare_starting: bool,
    /// The number the next op gets.
    next_op: u64,
    /// The number of the latest promise ([`Event::ExpectCell`]): only the call that made
    /// it may end it ([`Event::ExpectedEnded`]), so the late end of an earlier call never
    /// drops a later call's promise (or the restart's mark on it).
    promise: u64,
}

/// What happens to the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// A cell (numbered `cell`) wants the thread.
    BeginCell { cell: u64 },
    /// A short operation wants the thread.
    BeginShort,
    /// The request of the cell of op `op` was handed to its worker.
    Dispatched { op: u64 },
    /// Op `op` ended (its guard was dropped).
    End { op: u64 },
    /// KeyboardInterrupt was asked for (`python_interrupt`, a cancel, a timeout).
    Interrupt,
    /// A cell was promised to a caller ([`Expected::Yes`]); the effect numbers the
    /// promise ([`Effect::Promised`]).
    ExpectCell,
    /// The call that made promise `id` ended, having run its cell or not.
    ExpectedEnded { id: u64 },
    /// The session is restarted: the cell holding the thread, and the one promised,
    /// are overtaken (see [`Phase::Cell`]'s `overtaken`).
    Restart,
    /// The session closes.
    Close,
    /// A spare worker starts being started.
    SpareStarting,
    /// The spare's start ended (started or failed).
    SpareDone,
}

/// What the caller of a transition must do besides publishing the new state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    Nothing,
    /// The cell is promised, as promise `id`.
    Promised {
        id: u64,
    },
    /// The thread is the caller's, as op `op`.
    Acquired {
        op: u64,
    },
    /// Send KeyboardInterrupt to the worker now.
    SendInterrupt,
    /// The interrupt is kept, for the cell that has not been handed over yet.
    Queued,
    /// The interrupt is accepted: the cell ends anyway (the session is closing).
    EndsWithClose,
}

/// Why a transition does not happen (the state stays as it was).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A cell runs: the call is refused "busy".
    Busy { cell: u64 },
    /// A short operation holds the thread: wait for the next change and try again.
    Wait,
    /// The session is closed (or closing).
    Closed,
    /// No cell runs or is expected.
    NothingToInterrupt,
    /// A spare is already being started.
    SpareStarting,
    /// An event that does not fit the phase (a guard of an op that is over, a dispatch
    /// without a cell): ignored.
    Stale,
}

impl Machine {
    pub(crate) const fn new() -> Machine {
        Machine {
            phase: Phase::Idle,
            expected: Expected::No,
            spare_starting: false,
            next_op: 1,
            promise: 0,
        }
    }

    /// The state after `ev`, and what to do about it; or why `ev` changes nothing.
    pub(crate) fn transition(self, ev: Event) -> Result<(Machine, Effect), Refusal> {
        let with = |next: Machine| Ok((next, Effect::Nothing));
        match ev {
            Event::BeginCell { cell } => self.begin(Some(cell)),
            Event::BeginShort => self.begin(None),
            Event::Dispatched { op } => self.dispatched(op),
            Event::End { op } => self.end(op),
            Event::Interrupt => self.interrupt(),
            Event::ExpectCell => {
                let id = self.promise + 1;
                let next = Machine {
                    expected: Expected::Yes,
                    promise: id,
                    ..self
                };
                Ok((next, Effect::Promised { id }))
            }
            // A cell that started took its promise with it; an earlier call's end is
            // not this promise's.
            Event::ExpectedEnded { id } if id == self.promise && self.expected != Expected::No => {
                with(Machine {
                    expected: Expected::No,
                    ..self
                })
            }
            Event::ExpectedEnded { .. } => Err(Refusal::Stale),
            Event::Restart => with(self.restart()),
            Event::Close => with(self.close()),
            Event::SpareStarting => {
                if self.is_closed() {
                    return Err(Refusal::Closed);
                }
                if self.spare_starting {
                    return Err(Refusal::SpareStarting);
                }
                with(Machine {
                    spare_starting: true,
                    ..self
                })
            }
            Event::SpareDone => with(Machine {
                spare_starting: false,
                ..self
            }),
        }
    }

    /// An op takes the thread: a cell (numbered `cell`) or a short operation.
    fn begin(self, cell: Option<u64>) -> Result<(Machine, Effect), Refusal> {
        self.free()?;
        let op = self.next_op;
        let mut next = Machine {
            next_op: op + 1,
            ..self
        };
        next.phase = match cell {
            Some(cell) => {
                // An interrupt kept for the expected cell is this cell's.
                next.expected = Expected::No;
                Phase::Cell {
                    op,
                    cell,
                    dispatched: false,
                    interrupt_queued: self.expected == Expected::Interrupted,
                    overtaken: self.expected == Expected::Overtaken,
                }
            }
            None => Phase::Short { op },
        };
        Ok((next, Effect::Acquired { op }))
    }

    /// The request of op `of`'s cell was handed to its worker.
    fn dispatched(self, of: u64) -> Result<(Machine, Effect), Refusal> {
        match self.phase {
            Phase::Cell {
                op,
                cell,
                dispatched: false,
                interrupt_queued,
                overtaken,
            } if op == of => {
                let phase = Phase::Cell {
                    op,
                    cell,
                    dispatched: true,
                    interrupt_queued: false,
                    overtaken,
                };
                let effect = if interrupt_queued {
                    Effect::SendInterrupt
                } else {
                    Effect::Nothing
                };
                Ok((Machine { phase, ..self }, effect))
            }
            // Its worker was killed by the close: the call gets the death.
            Phase::Closing { op, .. } if op == of => Ok((self, Effect::Nothing)),
            _ => Err(Refusal::Stale),
        }
    }

    /// Op `of` ended (its guard was dropped).
    fn end(self, of: u64) -> Result<(Machine, Effect), Refusal> {
        let phase = match self.phase {
            Phase::Short { op } | Phase::Cell { op, .. } if op == of => Phase::Idle,
            Phase::Closing { op, .. } if op == of => Phase::Closed,
            _ => return Err(Refusal::Stale),
        };
        Ok((Machine { phase, ..self }, Effect::Nothing))
    }

    /// KeyboardInterrupt asked for: sent, kept for later, or nothing to interrupt.
    fn interrupt(self) -> Result<(Machine, Effect), Refusal> {
        match self.phase {
            Phase::Cell {
                dispatched: true, ..
            } => Ok((self, Effect::SendInterrupt)),
            Phase::Cell {
                op,
                cell,
                dispatched: false,
                overtaken,
                ..
            } => {
                let phase = Phase::Cell {
                    op,
                    cell,
                    dispatched: false,
                    interrupt_queued: true,
                    overtaken,
                };
                Ok((Machine { phase, ..self }, Effect::Queued))
            }
            _ if self.expected != Expected::No => {
                // An overtaken promise stays so: its cell never runs at all.
                let expected = match self.expected {
                    Expected::Overtaken => Expected::Overtaken,
                    _ => Expected::Interrupted,
                };
                let next = Machine { expected, ..self };
                Ok((next, Effect::Queued))
            }
            Phase::Closing { cell: Some(_), .. } => Ok((self, Effect::EndsWithClose)),
            _ => Err(Refusal::NothingToInterrupt),
        }
    }

    /// The session is restarted: the cell holding the thread, and a promised one, are
    /// overtaken; anything else stays as it was.
    fn restart(self) -> Machine {
        let phase = match self.phase {
            Phase::Cell {
                op,
                cell,
                dispatched,
                interrupt_queued,
                ..
            } => Phase::Cell {
                op,
                cell,
                dispatched,
                interrupt_queued,
                overtaken: true,
            },
            other => other,
        };
        let expected = match self.expected {
            Expected::No => Expected::No,
            _ => Expected::Overtaken,
        };
        Machine {
            phase,
            expected,
            ..self
        }
    }

    /// The session closes: at once when idle, else once the op holding the thread ends.
    fn close(self) -> Machine {
        let phase = match self.phase {
            Phase::Idle | Phase::Closed => Phase::Closed,
            Phase::Short { op } => Phase::Closing { op, cell: None },
            Phase::Cell { op, cell, .. } => Phase::Closing {
                op,
                cell: Some(cell),
            },
            closing @ Phase::Closing { .. } => closing,
        };
        Machine { phase, ..self }
    }

    /// Whether an op may take the thread now (and if not, why).
    fn free(self) -> Result<(), Refusal> {
        match self.phase {
            Phase::Idle => Ok(()),
            Phase::Short { .. } => Err(Refusal::Wait),
            Phase::Cell { cell, .. } => Err(Refusal::Busy { cell }),
            Phase::Closing { .. } | Phase::Closed => Err(Refusal::Closed),
        }
    }

    /// The session was closed (its op may still be ending).
    pub(crate) fn is_closed(self) -> bool {
        matches!(self.phase, Phase::Closing { .. } | Phase::Closed)
    }

    /// The op holding the thread, if any.
    pub(crate) fn held_op(self) -> Option<u64> {
        match self.phase {
            Phase::Short { op } | Phase::Cell { op, .. } | Phase::Closing { op, .. } => Some(op),
            Phase::Idle | Phase::Closed => None,
        }
    }

    /// Whether op `of` is a cell overtaken by a restart (see [`Phase::Cell`]).
    pub(crate) fn overtaken(self, of: u64) -> bool {
        matches!(self.phase, Phase::Cell { op, overtaken: true, .. } if op == of)
    }

    /// Whether a cell promised before a restart has yet to take the thread.
    pub(crate) fn promise_overtaken(self) -> bool {
        self.expected == Expected::Overtaken
    }

    /// The cell holding the thread, if a cell does.
    pub(crate) fn running_cell(self) -> Option<u64> {
        match self.phase {
            Phase::Cell { cell, .. } => Some(cell),
            _ => None,
        }
    }
}

/// The machine, published. Cloning shares the channel.
#[derive(Clone)]
pub(crate) struct Phases(watch::Sender<Machine>);

impl Phases {
    pub(crate) fn new() -> Phases {
        Phases(watch::Sender::new(Machine::new()))
    }

    /// Apply `ev`: publish the new state if it changed; the new state and what to do.
    pub(crate) fn apply(&self, ev: Event) -> Result<(Machine, Effect), Refusal> {
        let mut result = Err(Refusal::Stale);
        self.0.send_if_modified(|m| match m.transition(ev) {
            Ok((next, effect)) => {
                result = Ok((next, effect));
                let changed = next != *m;
                *m = next;
                changed
            }
            Err(refusal) => {
                result = Err(refusal);
                false
            }
        });
        result
    }

    /// The state now.
    pub(crate) fn now(&self) -> Machine {
        *self.0.borrow()
    }

    /// A receiver that has seen the state as it is now: its `changed()` wakes at the
    /// next change.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Machine> {
        self.0.subscribe()
    }

    /// The hold of op `op` (just acquired) on the thread.
    pub(crate) fn guard(&self, op: u64) -> OpGuard {
        OpGuard {
            phases: self.clone(),
            op,
        }
    }
}

/// An op's hold on the worker's main thread: dropping it ends the op.
pub(crate) struct OpGuard {
    phases: Phases,
    op: u64,
}

impl OpGuard {
    pub(crate) fn op(&self) -> u64 {
        self.op
    }
}

impl Drop for OpGuard {
    fn drop(&mut self) {
        if let Err(refusal) = self.phases.apply(Event::End { op: self.op }) {
            tracing::debug!(op = self.op, ?refusal, "an op ended after its phase");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Machine = Machine::new();

    fn step(m: Machine, ev: Event) -> (Machine, Effect) {
        m.transition(ev)
            .unwrap_or_else(|r| panic!("{ev:?} in {m:?} refused: {r:?}"))
    }

    fn refused(m: Machine, ev: Event) -> Refusal {
        match m.transition(ev) {
            Ok(got) => panic!("{ev:?} in {m:?} should be refused, got {got:?}"),
            Err(r) => r,
        }
    }

    fn short() -> Machine {
        step(IDLE, Event::BeginShort).0
    }

    fn cell(n: u64) -> Machine {
        step(IDLE, Event::BeginCell { cell: n }).0
    }

    fn dispatched(n: u64) -> Machine {
        step(cell(n), Event::Dispatched { op: 1 }).0
    }

    fn closing_cell() -> Machine {
        step(dispatched(1), Event::Close).0
    }

    fn closing_short() -> Machine {
        step(short(), Event::Close).0
    }

    fn closed() -> Machine {
        step(IDLE, Event::Close).0
    }

    /// Every phase the machine can be in (with and without an expected cell).
    fn all_phases() -> Vec<(String, Machine)> {
        let base = [
            ("idle", IDLE),
            ("short", short()),
            ("cell before dispatch", cell(1)),
            ("cell dispatched", dispatched(1)),
            ("closing a cell", closing_cell()),
            ("closing a short op", closing_short()),
            ("closed", closed()),
        ];
        let mut all: Vec<(String, Machine)> =
            base.iter().map(|(n, m)| (n.to_string(), *m)).collect();
        for (name, m) in base {
            let with = step(m, Event::ExpectCell).0;
            all.push((format!("{name}, cell expected"), with));
        }
        all
    }

    #[test]
    fn ops_take_the_thread_only_when_idle() {
        let (m, effect) = step(IDLE, Event::BeginShort);
        assert_eq!(effect, Effect::Acquired { op: 1 });
        assert_eq!(m.phase, Phase::Short { op: 1 });
        let (m, effect) = step(IDLE, Event::BeginCell { cell: 7 });
        assert_eq!(effect, Effect::Acquired { op: 1 });
        assert_eq!(m.running_cell(), Some(7));
        // A short op makes the next caller wait; a cell turns it away; closed is closed.
        for ev in [Event::BeginShort, Event::BeginCell { cell: 2 }] {
            assert_eq!(refused(short(), ev), Refusal::Wait);
            assert_eq!(refused(cell(1), ev), Refusal::Busy { cell: 1 });
            assert_eq!(refused(dispatched(1), ev), Refusal::Busy { cell: 1 });
            assert_eq!(refused(closing_cell(), ev), Refusal::Closed);
            assert_eq!(refused(closing_short(), ev), Refusal::Closed);
            assert_eq!(refused(closed(), ev), Refusal::Closed);
        }
    }

    #[test]
    fn each_op_gets_its_own_number_and_only_its_guard_ends_it() {
        let (m, _) = step(IDLE, Event::BeginShort);
        let (m, _) = step(m, Event::End { op: 1 });
        assert_eq!(m.phase, Phase::Idle);
        let (m, effect) = step(m, Event::BeginCell { cell: 1 });
        assert_eq!(effect, Effect::Acquired { op: 2 });
        assert_eq!(m.held_op(), Some(2));
        // The guard of the op that is over changes nothing.
        assert_eq!(refused(m, Event::End { op: 1 }), Refusal::Stale);
        assert_eq!(step(m, Event::End { op: 2 }).0.phase, Phase::Idle);
        assert_eq!(refused(IDLE, Event::End { op: 1 }), Refusal::Stale);
        assert_eq!(refused(closed(), Event::End { op: 1 }), Refusal::Stale);
    }

    #[test]
    fn dispatch_hands_over_a_queued_interrupt_once() {
        let (m, effect) = step(cell(1), Event::Dispatched { op: 1 });
        assert_eq!(effect, Effect::Nothing);
        let (queued, effect) = step(cell(1), Event::Interrupt);
        assert_eq!(effect, Effect::Queued);
        let (m2, effect) = step(queued, Event::Dispatched { op: 1 });
        assert_eq!(effect, Effect::SendInterrupt);
        assert_eq!(m, m2, "the queued interrupt is consumed by the dispatch");
        // Dispatch outside a cell is stale; while closing, the killed cell's call is
        // answered with the death.
        for m in [IDLE, short(), dispatched(1), closed()] {
            assert_eq!(refused(m, Event::Dispatched { op: 1 }), Refusal::Stale);
        }
        // The dispatch of an op that is over never touches the cell that came after.
        assert_eq!(
            refused(cell(1), Event::Dispatched { op: 2 }),
            Refusal::Stale
        );
        assert_eq!(
            step(closing_cell(), Event::Dispatched { op: 1 }).1,
            Effect::Nothing
        );
    }

    #[test]
    fn close_waits_for_the_held_op_to_end() {
        assert_eq!(closed().phase, Phase::Closed);
        let m = closing_cell();
        assert_eq!(
            m.phase,
            Phase::Closing {
                op: 1,
                cell: Some(1)
            }
        );
        assert!(m.is_closed());
        assert_eq!(step(m, Event::End { op: 1 }).0.phase, Phase::Closed);
        assert_eq!(
            step(closing_short(), Event::End { op: 1 }).0.phase,
            Phase::Closed
        );
        // Closing twice is closing once.
        assert_eq!(step(m, Event::Close).0, m);
        assert_eq!(step(closed(), Event::Close).0, closed());
    }

    #[test]
    fn an_expected_cell_keeps_an_interrupt_for_itself_only() {
        let expected = step(IDLE, Event::ExpectCell).0;
        assert_eq!(expected.expected, Expected::Yes);
        let (interrupted, effect) = step(expected, Event::Interrupt);
        assert_eq!(effect, Effect::Queued);
        assert_eq!(interrupted.expected, Expected::Interrupted);
        // The cell that starts takes the interrupt with it, and the promise is kept.
        let (m, _) = step(interrupted, Event::BeginCell { cell: 3 });
        assert_eq!(m.expected, Expected::No);
        assert!(matches!(
            m.phase,
            Phase::Cell {
                interrupt_queued: true,
                ..
            }
        ));
        assert_eq!(
            step(m, Event::Dispatched { op: 1 }).1,
            Effect::SendInterrupt
        );
        // A cell that was not interrupted while expected starts clean.
        let (m, _) = step(expected, Event::BeginCell { cell: 3 });
        assert!(matches!(
            m.phase,
            Phase::Cell {
                interrupt_queued: false,
                ..
            }
        ));
        // The call ended without running it: the kept interrupt goes with it.
        let (m, _) = step(
            interrupted,
            Event::ExpectedEnded {
                id: interrupted.promise,
            },
        );
        assert_eq!(m.expected, Expected::No);
        assert_eq!(
            step(m, Event::BeginCell { cell: 3 }).1,
            Effect::Acquired { op: 1 }
        );
        assert_eq!(refused(m, Event::Interrupt), Refusal::NothingToInterrupt);
        // Expecting again drops an interrupt kept for the earlier promise.
        assert_eq!(
            step(interrupted, Event::ExpectCell).0.expected,
            Expected::Yes
        );
        // A refused cell leaves the promise (and its interrupt) as it was.
        let busy = step(dispatched(1), Event::ExpectCell).0;
        let busy = step(busy, Event::Interrupt).0;
        assert_eq!(busy.expected, Expected::Yes, "the running cell got it");
        assert_eq!(
            refused(busy, Event::BeginCell { cell: 2 }),
            Refusal::Busy { cell: 1 }
        );
    }

    #[test]
    fn a_restart_overtakes_the_cell_without_a_worker_and_the_promised_one() {
        // Taken the thread, not handed over: overtaken (a queued interrupt is kept);
        // only that op is.
        let (m, effect) = step(cell(4), Event::Restart);
        assert_eq!(effect, Effect::Nothing);
        assert!(m.overtaken(1));
        assert!(!m.overtaken(2));
        assert_eq!(m.running_cell(), Some(4), "the cell still holds the thread");
        let m = step(m, Event::Interrupt).0;
        assert!(m.overtaken(1));
        // Handed over already: its worker is the one the restart kills; the mark is
        // harmless and stays.
        assert!(step(dispatched(1), Event::Restart).0.overtaken(1));
        // Idle, a short op: nothing is marked.
        for m in [IDLE, short()] {
            let (next, _) = step(m, Event::Restart);
            assert_eq!(next, m);
            assert!(!next.overtaken(1));
        }
        // Promised and not started (interrupted or not): the cell that takes the thread
        // for it is overtaken as it starts, an interrupt does not undo that, and the
        // promise is then used up.
        for promised in [
            step(IDLE, Event::ExpectCell).0,
            step(step(IDLE, Event::ExpectCell).0, Event::Interrupt).0,
            step(short(), Event::ExpectCell).0,
        ] {
            let m = step(promised, Event::Restart).0;
            assert!(m.promise_overtaken());
            let m = step(m, Event::Interrupt).0;
            assert!(m.promise_overtaken());
            let m = match m.phase {
                Phase::Short { op } => step(m, Event::End { op }).0,
                _ => m,
            };
            let (started, effect) = step(m, Event::BeginCell { cell: 1 });
            let Effect::Acquired { op } = effect else {
                panic!("{effect:?}")
            };
            assert!(started.overtaken(op));
            assert!(!started.promise_overtaken());
            // A call that gave up before starting it uses the promise up too.
            assert!(
                !step(m, Event::ExpectedEnded { id: m.promise })
                    .0
                    .promise_overtaken()
            );
        }
        // A cell that starts after the restart without a promise runs as any other.
        let m = step(IDLE, Event::Restart).0;
        let (m, _) = step(m, Event::BeginCell { cell: 1 });
        assert!(!m.overtaken(1));
        // A new promise after the restart is a promise like any other.
        let m = step(step(IDLE, Event::ExpectCell).0, Event::Restart).0;
        assert_eq!(step(m, Event::ExpectCell).0.expected, Expected::Yes);
    }

    #[test]
    fn only_the_call_that_made_a_promise_ends_it() {
        // Call A's promise, taken by its cell; call B promises next.
        let (a, effect) = step(IDLE, Event::ExpectCell);
        assert_eq!(effect, Effect::Promised { id: 1 });
        let (m, _) = step(a, Event::BeginCell { cell: 1 });
        let (m, _) = step(m, Event::End { op: 1 });
        let (b, effect) = step(m, Event::ExpectCell);
        assert_eq!(effect, Effect::Promised { id: 2 });
        // A's call ends late: B's promise stays, and so does a restart's mark on it.
        assert_eq!(refused(b, Event::ExpectedEnded { id: 1 }), Refusal::Stale);
        let marked = step(b, Event::Restart).0;
        assert_eq!(
            refused(marked, Event::ExpectedEnded { id: 1 }),
            Refusal::Stale
        );
        assert!(marked.promise_overtaken());
        // B's own end drops it.
        assert_eq!(
            step(marked, Event::ExpectedEnded { id: 2 }).0.expected,
            Expected::No
        );
        // Once a cell took the promise, its own call's end changes nothing.
        let (taken, _) = step(b, Event::BeginCell { cell: 2 });
        assert_eq!(
            refused(taken, Event::ExpectedEnded { id: 2 }),
            Refusal::Stale
        );
    }

    /// What an interrupt does in every phase, in words:
    /// - idle or a short op, nothing expected: refused (nothing to interrupt);
    /// - idle, a short op, closing or closed with a cell expected: queued for that cell;
    /// - a cell not handed to its worker yet: queued, sent by the dispatch;
    /// - a dispatched cell: applied (sent to the worker at once);
    /// - closing while a cell ran (nothing expected): accepted, the close ends the cell;
    /// - closing a short op or closed, nothing expected: refused.
    #[test]
    fn an_interrupt_in_each_phase() {
        for (name, m) in all_phases() {
            let got = m.transition(Event::Interrupt);
            let expected = m.expected != Expected::No;
            let want = match m.phase {
                Phase::Cell {
                    dispatched: true, ..
                } => Ok(Effect::SendInterrupt),
                Phase::Cell { .. } => Ok(Effect::Queued),
                _ if expected => Ok(Effect::Queued),
                Phase::Closing { cell: Some(_), .. } => Ok(Effect::EndsWithClose),
                _ => Err(Refusal::NothingToInterrupt),
            };
            assert_eq!(got.map(|(_, e)| e), want, "{name}");
            if let Ok((next, _)) = got {
                // The phase itself never changes: only what is kept for later.
                assert_eq!(next.held_op(), m.held_op(), "{name}");
                assert_eq!(next.running_cell(), m.running_cell(), "{name}");
            }
        }
    }

    #[test]
    fn a_spare_starts_once_and_never_on_a_closed_session() {
        for (name, m) in all_phases() {
            let got = m.transition(Event::SpareStarting);
            if m.is_closed() {
                assert_eq!(got, Err(Refusal::Closed), "{name}");
                continue;
            }
            let (m, _) = got.unwrap_or_else(|r| panic!("{name}: {r:?}"));
            assert!(m.spare_starting);
            assert_eq!(refused(m, Event::SpareStarting), Refusal::SpareStarting);
            let (m, _) = step(m, Event::SpareDone);
            assert!(!m.spare_starting);
        }
    }

    #[test]
    fn no_event_reopens_a_closed_session() {
        // Every event in every phase: none panics, none leaves closed.
        let events = [
            Event::BeginCell { cell: 9 },
            Event::BeginShort,
            Event::Dispatched { op: 1 },
            Event::End { op: 1 },
            Event::Interrupt,
            Event::ExpectCell,
            Event::ExpectedEnded { id: 1 },
            Event::Restart,
            Event::Close,
            Event::SpareStarting,
            Event::SpareDone,
        ];
        for (name, m) in all_phases() {
            for ev in events {
                // Nothing leaves closed; a refusal changes nothing (it has no state).
                if let Ok((next, _)) = m.transition(ev)
                    && m.is_closed()
                {
                    assert!(next.is_closed(), "{name}: {ev:?} reopened it");
                }
            }
        }
    }

    #[tokio::test]
    async fn a_waiter_wakes_when_the_short_op_ends() {
        let phases = Phases::new();
        let Ok((_, Effect::Acquired { op })) = phases.apply(Event::BeginShort) else {
            panic!("idle refused a short op")
        };
        let guard = phases.guard(op);
        let mut rx = phases.subscribe();
        assert_eq!(phases.apply(Event::BeginShort), Err(Refusal::Wait));
        let waiter =
            tokio::spawn(async move { rx.wait_for(|m| m.phase == Phase::Idle).await.map(|_| ()) });
        drop(guard);
        tokio::time::timeout(std::time::Duration::from_secs(60), waiter)
            .await
            .expect("the waiter woke")
            .expect("join")
            .expect("the channel is open");
        assert_eq!(phases.now().phase, Phase::Idle);
    }
}
