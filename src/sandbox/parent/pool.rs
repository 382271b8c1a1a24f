//! Resources made ahead of need, off the spawn path: the server's jobs take a fresh one
//! (a network namespace, a job cgroup) instead of waiting while it is made. One thread
//! per pool makes them, keeping [`DEPTH`] ready of each of the last [`MAX_KINDS`] kinds
//! asked for (a kind is e.g. the limits of a cgroup; the resources of a kind nobody has
//! asked for longest are released for a new one). A resource is handed out once and never comes back:
//! what a job used ends with it, so no two jobs ever share one. When the pool has
//! nothing ready, or its maker failed once, `take` says so (`None`) and the caller
//! makes its own as it would without a pool.
//!
//! The maker tops up only [`SETTLE`] after the latest `take`: the spawn that took runs
//! on the same CPUs and needs the same kernel locks (the cgroup tree, the mount
//! namespace lock, the network namespace list), so making its replacement at once
//! slowed the very job the pool was there to speed up.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Resources kept ready of each kind.
pub(crate) const DEPTH: usize = 2;

/// At most this many kinds are kept ready (a server uses one or two policies at a time;
/// a client that changes the workspace makes a new one).
const MAX_KINDS: usize = 8;

/// How long after the latest `take` the maker waits before making the next resource.
/// A burst of jobs within it finds [`DEPTH`] ready; a steady flood of them slows the
/// maker to one resource per `SETTLE`, never stops it.
pub(crate) const SETTLE: Duration = Duration::from_millis(10);

/// A pool of resources of kinds `K`; its maker thread holds the shared part and ends
/// once the pool is dropped (or drained).
pub(crate) struct Pool<K, T> {
    shared: Arc<Shared<K, T>>,
}

/// How long `drain` waits for the maker to end (it is making one resource at most).
const DRAIN_WAIT: Duration = Duration::from_secs(5);

/// Makes one resource of a kind, or says why not.
type Maker<K, T> = Box<dyn Fn(&K) -> Result<T, String> + Send + Sync>;

struct Shared<K, T> {
    name: &'static str,
    /// [`SETTLE`], but for tests.
    settle: Duration,
    make: Maker<K, T>,
    state: Mutex<State<K, T>>,
    wake: Condvar,
}

struct State<K, T> {
    /// Least recently asked for first.
    kinds: Vec<(K, Vec<T>)>,
    started: bool,
    /// When a resource was last asked for.
    last_take: Option<Instant>,
    /// The maker could not make one: every caller makes its own from then on.
    failed: bool,
    /// The maker thread has started and not yet ended.
    maker_running: bool,
}

impl<K, T> Pool<K, T>
where
    K: Clone + PartialEq + Send + 'static,
    T: Send + 'static,
{
    /// A pool whose maker thread is called `name` and runs `make` for a kind.
    pub(crate) fn new(
        name: &'static str,
        make: impl Fn(&K) -> Result<T, String> + Send + Sync + 'static,
    ) -> Self {
        Self::with_settle(name, SETTLE, make)
    }

    /// The same, the maker waiting `settle` after the latest take (tests: a long one).
    fn with_settle(
        name: &'static str,
        settle: Duration,
        make: impl Fn(&K) -> Result<T, String> + Send + Sync + 'static,
    ) -> Self {
        Pool {
            shared: Arc::new(Shared {
                name,
                settle,
                make: Box::new(make),
                state: Mutex::new(State {
                    kinds: Vec::new(),
                    started: false,
                    last_take: None,
                    failed: false,
                    maker_running: false,
                }),
                wake: Condvar::new(),
            }),
        }
    }

    /// A fresh resource of `kind`, or `None` when none is ready (the first call for a
    /// kind always; it starts making them).
    pub(crate) fn take(&self, kind: &K) -> Option<T> {
        let shared = &self.shared;
        let mut state = shared.state.lock().ok()?;
        if state.failed {
            return None;
        }
        if !state.started {
            state.started = true;
            let maker = Arc::clone(shared);
            state.maker_running = true;
            let spawned = std::thread::Builder::new()
                .name(shared.name.into())
                .spawn(move || {
                    maker.make_forever();
                    if let Ok(mut state) = maker.state.lock() {
                        state.maker_running = false;
                    }
                    maker.wake.notify_all();
                });
            if spawned.is_err() {
                state.failed = true;
                state.maker_running = false;
                return None;
            }
        }
        state.last_take = Some(Instant::now());
        let known = state.kinds.iter().position(|(k, _)| k == kind);
        let mut released = None;
        let taken = match known {
            Some(i) => {
                let mut entry = state.kinds.remove(i);
                let taken = entry.1.pop();
                state.kinds.push(entry);
                taken
            }
            None => {
                if state.kinds.len() >= MAX_KINDS {
                    released = Some(state.kinds.remove(0));
                }
                state.kinds.push((kind.clone(), Vec::new()));
                None
            }
        };
        shared.wake.notify_one();
        drop(state);
        // Released outside the lock (a cgroup is a directory to remove).
        drop(released);
        taken
    }
}

impl<K, T> Pool<K, T> {
    /// Stop making and release what is ready (at exit: a cgroup made ahead is a
    /// directory to remove), then wait for the maker to end: a resource it was making
    /// is released before this returns. Dropping the pool does the same.
    pub(crate) fn drain(&self) {
        let ready: Vec<T> = match self.shared.state.lock() {
            Ok(mut state) => {
                state.failed = true;
                state.kinds.drain(..).flat_map(|(_, ready)| ready).collect()
            }
            Err(_) => Vec::new(),
        };
        // A maker waiting for work wakes, sees the pool drained and ends; one making a
        // resource drops it when done and ends.
        self.shared.wake.notify_all();
        drop(ready);
        if let Ok(state) = self.shared.state.lock() {
            // Bounded: a maker stuck in the kernel must not hold a server's exit.
            let waited = self
                .shared
                .wake
                .wait_timeout_while(state, DRAIN_WAIT, |s| s.maker_running);
            if waited.is_ok_and(|(_, w)| w.timed_out()) {
                tracing::warn!(
                    pool = self.shared.name,
                    "the pool's maker did not end within {DRAIN_WAIT:?} of the drain; going on without it"
                );
            }
        }
    }
}

impl<K, T> Drop for Pool<K, T> {
    fn drop(&mut self) {
        self.drain();
    }
}

impl<K, T> Shared<K, T>
where
    K: Clone + PartialEq + Send + 'static,
    T: Send + 'static,
{
    /// The maker thread: top up whichever kind is short, sleep while none is. Before
    /// each resource it waits until [`SETTLE`] after the latest take, once (so takes
    /// that keep coming slow it down but never stop it).
    fn make_forever(&self) {
        loop {
            let kind = {
                let Ok(mut state) = self.state.lock() else {
                    return;
                };
                loop {
                    if state.failed {
                        return;
                    }
                    // Waited out once, on the condition variable rather than asleep: a
                    // drain meanwhile ends it (a drain's wake-up missed during a sleep
                    // held a server's exit for DRAIN_WAIT); takes meanwhile do not
                    // extend it.
                    let quiet = state.last_take.map(|t| t + self.settle);
                    while let Some(wait) =
                        quiet.and_then(|q| q.checked_duration_since(Instant::now()))
                    {
                        if state.failed {
                            return;
                        }
                        state = match self.wake.wait_timeout(state, wait) {
                            Ok((s, _)) => s,
                            Err(_) => return,
                        };
                    }
                    if state.failed {
                        return;
                    }
                    // The kind asked for most recently first.
                    let short = state
                        .kinds
                        .iter()
                        .rev()
                        .find(|(_, ready)| ready.len() < DEPTH);
                    if let Some((k, _)) = short {
                        break k.clone();
                    }
                    state = match self.wake.wait(state) {
                        Ok(s) => s,
                        Err(_) => return,
                    };
                }
            };
            let made = (self.make)(&kind);
            let Ok(mut state) = self.state.lock() else {
                return;
            };
            if state.failed {
                // Drained while this one was being made: it goes too.
                drop(state);
                drop(made);
                return;
            }
            match made {
                Ok(item) => {
                    if let Some((_, ready)) = state.kinds.iter_mut().find(|(k, _)| *k == kind) {
                        ready.push(item);
                    }
                }
                Err(e) => {
                    tracing::debug!(pool = self.name, error = %e, "nothing made ahead; jobs make their own");
                    state.failed = true;
                    state.kinds.clear();
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

    static MADE: AtomicU32 = AtomicU32::new(0);
    static COUNTING: std::sync::LazyLock<Pool<u8, u32>> = std::sync::LazyLock::new(|| {
        Pool::new("test-pool", |kind| {
            Ok(u32::from(*kind) * 1000 + MADE.fetch_add(1, Ordering::SeqCst))
        })
    });
    static FAILING: std::sync::LazyLock<Pool<u8, u32>> =
        std::sync::LazyLock::new(|| Pool::new("test-pool-fail", |_| Err("no".into())));

    /// Every item is handed out once, of the kind asked for; the first ask of a kind
    /// finds nothing ready.
    #[test]
    fn items_are_fresh_and_of_their_kind() {
        assert_eq!(COUNTING.take(&1), None);
        let mut seen = std::collections::HashSet::new();
        let mut got = 0;
        for _ in 0..2000 {
            if let Some(item) = COUNTING.take(&1) {
                assert_eq!(item / 1000, 1);
                assert!(seen.insert(item), "{item} handed out twice");
                got += 1;
                if got == 5 {
                    break;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(got, 5, "the maker never filled the pool");
    }

    static SLOW_LIVE: AtomicUsize = AtomicUsize::new(0);
    static SLOW_MAKING: AtomicUsize = AtomicUsize::new(0);

    /// An item of the slow pool: counted while it lives.
    struct Live;
    impl Drop for Live {
        fn drop(&mut self) {
            SLOW_LIVE.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// `drain` returns only once the maker has ended: an item it was making when the
    /// drain came is dropped by then (a server's exit sweep must not race a cgroup
    /// being made ahead).
    #[test]
    fn drain_waits_for_the_item_being_made() {
        let pool: Pool<u8, Live> = Pool::new("test-pool-slow", |_| {
            // Made (a directory exists), then finished off.
            SLOW_LIVE.fetch_add(1, Ordering::SeqCst);
            SLOW_MAKING.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(200));
            Ok(Live)
        });
        assert!(pool.take(&0).is_none());
        while SLOW_MAKING.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        pool.drain();
        assert_eq!(
            SLOW_LIVE.load(Ordering::SeqCst),
            0,
            "an item outlived the drain"
        );
    }

    /// A drain while the maker waits out the settle time after a take (a server whose
    /// client leaves right after a call) ends the maker at once: it was asleep there,
    /// missed the drain's wake-up and waited for work that never came, so every such exit
    /// waited the drain's full budget.
    #[test]
    fn a_drain_during_the_settle_time_ends_the_maker() {
        let pool: Pool<u8, u32> =
            Pool::with_settle("test-pool-settle", Duration::from_secs(3600), |_| Ok(1));
        assert!(pool.take(&0).is_none());
        // The maker reaches its settle wait (were it not there yet, it would still end).
        std::thread::sleep(Duration::from_millis(50));
        pool.drain();
        assert!(
            !pool.shared.state.lock().unwrap().maker_running,
            "the maker was still running when the drain gave up waiting for it"
        );
    }

    static DRAINED: std::sync::LazyLock<Pool<u8, std::sync::Arc<()>>> =
        std::sync::LazyLock::new(|| Pool::new("test-pool-drain", |_| Ok(std::sync::Arc::new(()))));

    /// After `drain` nothing is ready or made, and what was ready has been dropped.
    #[test]
    fn drain_releases_what_is_ready_and_stops() {
        assert!(DRAINED.take(&0).is_none());
        for _ in 0..2000 {
            if DRAINED.shared.state.lock().unwrap().kinds[0].1.len() == DEPTH {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let ready: Vec<_> = DRAINED.shared.state.lock().unwrap().kinds[0]
            .1
            .iter()
            .map(std::sync::Arc::downgrade)
            .collect();
        assert_eq!(ready.len(), DEPTH);
        DRAINED.drain();
        assert!(
            ready.iter().all(|w| w.upgrade().is_none()),
            "drained items are dropped"
        );
        assert!(DRAINED.take(&0).is_none());
    }

    static KINDS: std::sync::LazyLock<Pool<u32, std::sync::Arc<()>>> =
        std::sync::LazyLock::new(|| Pool::new("test-pool-kinds", |_| Ok(std::sync::Arc::new(()))));

    /// A new kind beyond `MAX_KINDS` releases what is ready of the kind asked for least
    /// recently; a kind asked for again is kept.
    #[test]
    fn the_kind_asked_for_least_recently_makes_room() {
        let ready = |kind: u32| {
            for _ in 0..2000 {
                let state = KINDS.shared.state.lock().unwrap();
                if let Some((_, r)) = state.kinds.iter().find(|(k, _)| *k == kind)
                    && r.len() == DEPTH
                {
                    return r.iter().map(std::sync::Arc::downgrade).collect::<Vec<_>>();
                }
                drop(state);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            panic!("kind {kind} was never filled");
        };
        assert!(KINDS.take(&0).is_none());
        let first = ready(0);
        assert!(KINDS.take(&1).is_none());
        let second = ready(1);
        for kind in 2..MAX_KINDS as u32 {
            assert!(KINDS.take(&kind).is_none());
        }
        // Kind 0 asked for again: kind 1 is now the least recently asked for.
        assert!(KINDS.take(&0).is_some());
        assert!(KINDS.take(&(MAX_KINDS as u32)).is_none());
        assert!(
            second.iter().all(|w| w.upgrade().is_none()),
            "kind 1 released"
        );
        assert!(first.iter().any(|w| w.upgrade().is_some()), "kind 0 kept");
        let kinds: Vec<u32> = KINDS
            .shared
            .state
            .lock()
            .unwrap()
            .kinds
            .iter()
            .map(|(k, _)| *k)
            .collect();
        assert_eq!(kinds.len(), MAX_KINDS);
        assert!(!kinds.contains(&1), "{kinds:?}");
    }

    static MADE_AT: Mutex<Vec<Instant>> = Mutex::new(Vec::new());
    static SETTLING: std::sync::LazyLock<Pool<u8, ()>> = std::sync::LazyLock::new(|| {
        Pool::new("test-pool-settle", |_| {
            MADE_AT.lock().unwrap().push(Instant::now());
            Ok(())
        })
    });

    /// Nothing is made sooner than `SETTLE` after a take (the spawn that took has the
    /// CPUs and kernel locks to itself meanwhile), and the pool still fills.
    #[test]
    fn the_maker_waits_for_the_take_to_settle() {
        let asked = Instant::now();
        assert!(SETTLING.take(&0).is_none());
        for _ in 0..2000 {
            if MADE_AT.lock().unwrap().len() == DEPTH {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let made = MADE_AT.lock().unwrap().clone();
        assert_eq!(made.len(), DEPTH, "the maker never filled the pool");
        for at in made {
            assert!(
                at.duration_since(asked) >= SETTLE,
                "made {:?} after the take",
                at.duration_since(asked)
            );
        }
    }

    #[test]
    fn a_failing_maker_makes_every_caller_make_its_own() {
        for _ in 0..50 {
            assert_eq!(FAILING.take(&0), None);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(FAILING.shared.state.lock().unwrap().failed);
    }
}
