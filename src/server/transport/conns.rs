//! The HTTP transport's TCP connections, bounded: at most `cap` open at once. A connection
//! is *busy* while one of its requests is being answered (its response body not yet sent
//! or dropped) and *idle* otherwise (before its first request head is complete, or
//! between requests on a kept-alive connection). At the cap, a new connection closes the
//! longest-idle one, so idle sockets (no token needed to open them) cannot keep an
//! authorized client out; when every connection is busy, the new one is refused with a
//! 503 in words. hyper closes a connection that sends no complete head within the header
//! timeout by itself; [`Connections::evict_oldest_idle`] also makes room when the process
//! is out of file descriptors.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio_util::sync::CancellationToken;

/// The default cap, unless a quarter of the open-file limit is lower.
pub(super) const DEFAULT_CAP: usize = 256;

/// The cap to use: the configured one, else [`DEFAULT_CAP`] or a quarter of the soft
/// open-file limit `nofile` if that is lower (the rest is for sessions, jobs and the
/// broker), but at least 8.
pub(super) fn cap_for(configured: Option<usize>, nofile: Option<u64>) -> usize {
    if let Some(n) = configured {
        return n;
    }
    let quarter = nofile.map_or(usize::MAX, |n| usize::try_from(n / 4).unwrap_or(usize::MAX));
    DEFAULT_CAP.min(quarter).max(8)
}

/// This process's soft open-file limit.
pub(super) fn nofile_limit() -> Option<u64> {
    let (soft, _hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).ok()?;
    (soft != rlimit::INFINITY).then_some(soft)
}

struct Slot {
    busy: Arc<AtomicUsize>,
    evict: CancellationToken,
}

/// The open connections, oldest first.
pub(super) struct Connections {
    cap: usize,
    open: Mutex<BTreeMap<u64, Slot>>,
    next: AtomicUsize,
}

/// One admitted connection's place; the connection task holds it and gives it back at its
/// end. `evict` is cancelled when a newer connection needs the place: the task then shuts
/// the connection down gracefully (hyper closes it at once when no request is in progress).
pub(super) struct ConnSlot {
    conns: Arc<Connections>,
    id: u64,
    pub busy: Arc<AtomicUsize>,
    pub evict: CancellationToken,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.conns.book().remove(&self.id);
    }
}

impl Connections {
    pub(super) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Connections {
            cap: cap.max(1),
            open: Mutex::default(),
            next: AtomicUsize::new(0),
        })
    }

    pub(super) fn cap(&self) -> usize {
        self.cap
    }

    fn book(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Slot>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a new connection, closing the longest-idle one at the cap; `None` when
    /// the cap is reached and every connection is busy.
    pub(super) fn admit(self: &Arc<Self>) -> Option<ConnSlot> {
        let mut open = self.book();
        if open.len() >= self.cap && !evict_oldest_idle(&mut open) {
            return None;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed) as u64;
        let busy = Arc::new(AtomicUsize::new(0));
        let evict = CancellationToken::new();
        open.insert(
            id,
            Slot {
                busy: busy.clone(),
                evict: evict.clone(),
            },
        );
        Some(ConnSlot {
            conns: self.clone(),
            id,
            busy,
            evict,
        })
    }

    /// Close the longest-idle connection (its place is free at once); false if none is idle.
    pub(super) fn evict_oldest_idle(&self) -> bool {
        evict_oldest_idle(&mut self.book())
    }

    /// Connections open now.
    pub(super) fn open(&self) -> usize {
        self.book().len()
    }
}

fn evict_oldest_idle(open: &mut BTreeMap<u64, Slot>) -> bool {
    let victim = open
        .iter()
        .find(|(_, s)| s.busy.load(Ordering::SeqCst) == 0)
        .map(|(id, _)| *id);
    match victim.and_then(|id| open.remove(&id)) {
        Some(slot) => {
            slot.evict.cancel();
            true
        }
        None => false,
    }
}

/// A request in progress on a connection: counted from the complete head until the
/// response body is sent or dropped.
pub(super) struct Busy(Arc<AtomicUsize>);

impl Busy {
    pub(super) fn enter(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Busy(count.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that keeps its request counted as [`Busy`] until it is done.
pub(super) struct Tracked<B> {
    body: B,
    _busy: Busy,
}

impl<B> Tracked<B> {
    pub(super) fn new(body: B, busy: Busy) -> Self {
        Tracked { body, _busy: busy }
    }
}

impl<B> Body for Tracked<B>
where
    B: Body<Data = Bytes, Error = Infallible> + Unpin,
{
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_leaves_most_descriptors_to_the_rest() {
        assert_eq!(cap_for(None, Some(1024)), 256);
        assert_eq!(cap_for(None, Some(1 << 20)), DEFAULT_CAP);
        assert_eq!(cap_for(None, Some(400)), 100);
        assert_eq!(cap_for(None, Some(16)), 8);
        assert_eq!(cap_for(None, None), DEFAULT_CAP);
        assert_eq!(cap_for(Some(5000), Some(1024)), 5000);
    }

    /// At the cap the oldest idle connection makes room; busy ones are never chosen; with
    /// every one busy a new connection is refused; a slot's end frees its place.
    #[test]
    fn at_the_cap_the_longest_idle_connection_makes_room() {
        let conns = Connections::new(2);
        let a = conns.admit().unwrap();
        let b = conns.admit().unwrap();
        let busy_a = Busy::enter(&a.busy);
        let c = conns.admit().unwrap();
        assert!(b.evict.is_cancelled(), "the idle one is closed");
        assert!(!a.evict.is_cancelled(), "the busy one is kept");
        assert_eq!(conns.open(), 2);
        let busy_c = Busy::enter(&c.busy);
        assert!(conns.admit().is_none(), "all busy: refused");
        drop(busy_c);
        let d = conns.admit().unwrap();
        assert!(c.evict.is_cancelled());
        drop(b); // the evicted connection's task ends: nothing more to free
        assert_eq!(conns.open(), 2);
        drop(busy_a);
        assert!(conns.evict_oldest_idle());
        assert!(a.evict.is_cancelled());
        drop(d);
        assert_eq!(conns.open(), 0);
        assert!(!conns.evict_oldest_idle());
    }
}
