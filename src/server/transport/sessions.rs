//! MCP sessions over HTTP, bounded: at most [`SessionLimits::max_total`] open at once, a
//! session that has not sent `notifications/initialized` within
//! [`SessionLimits::handshake`] of its `initialize` is closed, and so is one that goes
//! [`SessionLimits::idle`] without a message (rmcp's own keep-alive of the session worker).
//!
//! [`BoundedSessions`] is an rmcp [`SessionManager`] around rmcp's [`LocalSessionManager`]
//! (which keeps each session's worker, channels and replay caches): it counts sessions by
//! [`Principal`], closes the ones that never finished their handshake, and forgets a
//! session whenever rmcp closes it (a DELETE, the idle timeout, the end of its service).
//! rmcp then drops the session's [`SandboxServer`](super::super::handler::SandboxServer),
//! whose own per-connection state goes with it.
//!
//! A new session is admitted before rmcp sees its `initialize` ([`BoundedSessions::admit`],
//! called by the transport's router, which answers a refusal with 503 in words); the
//! admission travels to [`SessionManager::create_session`] in a task-local
//! ([`with_admission`]), since rmcp creates the session in the request's own task.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_core::Stream;
use rmcp::model::{ClientJsonRpcMessage, ClientNotification, JsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{ServerSseMessage, SessionManager};
use rmcp::transport::streamable_http_server::{RestoreOutcome, SessionId};
use tokio_util::sync::CancellationToken;

use super::log_limit::{EVERY, Throttle, left_out};

/// Who opened a session: the key sessions are counted by. Today every HTTP client that
/// passes the bearer-token check is one principal; a tokens file will name more.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Principal(Arc<str>);

impl Principal {
    pub(crate) fn new(name: &str) -> Self {
        Principal(Arc::from(name))
    }

    /// The one principal of stdio and of a single HTTP token (or none): the server's own
    /// app.
    pub(crate) fn local() -> Self {
        Principal::new("local")
    }

    pub(crate) fn name(&self) -> &str {
        &self.0
    }
}

/// How many sessions may be open and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionLimits {
    /// Sessions open at once, all principals together.
    pub max_total: usize,
    /// From `initialize` to `notifications/initialized`.
    pub handshake: Duration,
    /// Without any message, either way.
    pub idle: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            max_total: 128,
            handshake: Duration::from_secs(30),
            idle: Duration::from_secs(300),
        }
    }
}

/// Why a new session was refused; the text is the HTTP answer.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum Refused {
    #[error(
        "too many MCP sessions for this principal: {open} of its {max} are open (max_mcp_sessions \
         in the tokens file). End sessions you no longer use (HTTP DELETE with their \
         Mcp-Session-Id) or retry later"
    )]
    Principal { open: usize, max: usize },
    #[error(
        "too many MCP sessions: {open} of {max} are open (--http-max-sessions). A session that \
         has not sent notifications/initialized is closed {handshake}s after its initialize, and \
         one without any message for {idle}s; end sessions you no longer use (HTTP DELETE with \
         their Mcp-Session-Id) or retry later"
    )]
    Total {
        open: usize,
        max: usize,
        handshake: u64,
        idle: u64,
    },
}

/// A failure of session bookkeeping, as rmcp's session manager reports it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionsError {
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
}

/// A place for one new session, taken by [`BoundedSessions::admit`]; given back when
/// dropped unused (rmcp refused the request before creating the session).
pub(crate) struct Admission {
    book: Weak<Shared>,
    principal: Principal,
    used: bool,
}

impl Drop for Admission {
    fn drop(&mut self) {
        if !self.used
            && let Some(shared) = self.book.upgrade()
        {
            shared.book().unreserve(&self.principal);
        }
    }
}

tokio::task_local! {
    static ADMITTED: RefCell<Option<Admission>>;
}

/// Run `fut` (the request that will create the session) with `admission` for its
/// `create_session`.
pub(crate) async fn with_admission<F: Future>(admission: Admission, fut: F) -> F::Output {
    ADMITTED.scope(RefCell::new(Some(admission)), fut).await
}

fn take_admission() -> Option<Admission> {
    ADMITTED
        .try_with(|cell| cell.borrow_mut().take())
        .ok()
        .flatten()
}

/// One open session.
struct Entry {
    principal: Principal,
    /// Cancelled when the client sends `notifications/initialized` or the session ends:
    /// stops the handshake timer.
    handshake_over: CancellationToken,
    established: bool,
}

/// Counts by principal: open sessions plus places taken and not yet used.
#[derive(Default)]
struct Book {
    open: HashMap<SessionId, Entry>,
    /// Sessions open or admitted, per principal and in total.
    counts: HashMap<Principal, usize>,
    total: usize,
}

impl Book {
    fn reserve(
        &mut self,
        principal: &Principal,
        limits: &SessionLimits,
        per_principal: Option<usize>,
    ) -> Result<(), Refused> {
        if self.total >= limits.max_total {
            return Err(Refused::Total {
                open: self.total,
                max: limits.max_total,
                handshake: limits.handshake.as_secs(),
                idle: limits.idle.as_secs(),
            });
        }
        let mine = self.counts.get(principal).copied().unwrap_or(0);
        if let Some(max) = per_principal
            && mine >= max
        {
            return Err(Refused::Principal { open: mine, max });
        }
        self.total += 1;
        *self.counts.entry(principal.clone()).or_default() += 1;
        Ok(())
    }

    fn unreserve(&mut self, principal: &Principal) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.counts.get_mut(principal) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.counts.remove(principal);
            }
        }
    }

    fn forget(&mut self, id: &SessionId) -> bool {
        let Some(entry) = self.open.remove(id) else {
            return false;
        };
        entry.handshake_over.cancel();
        self.unreserve(&entry.principal);
        // A flood leaves a large table behind: give its memory back once it is mostly empty.
        if self.open.capacity() > 64 && self.open.len() < self.open.capacity() / 4 {
            self.open.shrink_to_fit();
        }
        true
    }
}

struct Shared {
    local: LocalSessionManager,
    limits: SessionLimits,
    book: Mutex<Book>,
    /// Sessions closed since the last [`give_back_memory`] was scheduled.
    closed_since_trim: AtomicUsize,
}

/// How long after a session closes the freed memory is handed back to the system: the
/// sessions a flood leaves are closed within about this of each other and cost one trim.
const TRIM_AFTER: Duration = Duration::from_secs(1);

/// Hand memory the allocator has free back to the system. glibc's malloc keeps what
/// thousands of closed sessions freed (≈50 KB each, scattered over its arenas) mapped for
/// good: measured, 6,000 abandoned sessions left 373 MB resident after all were closed,
/// 31 MB after a trim.
fn give_back_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages of the allocator's own heaps to the
    // kernel; it takes the allocator's locks and touches no memory in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl Shared {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forget `id` and have rmcp close it (its worker ends, its service and handler are
    /// dropped). Returns whether it was open.
    async fn close(self: &Arc<Self>, id: &SessionId) -> Result<bool, LocalSessionManagerError> {
        let known = self.book().forget(id);
        self.local.close_session(id).await?;
        // rmcp's table keeps its size after a flood; give the memory back as above.
        {
            let mut sessions = self.local.sessions.write().await;
            if sessions.capacity() > 64 && sessions.len() < sessions.capacity() / 4 {
                sessions.shrink_to_fit();
            }
        }
        if known && self.closed_since_trim.fetch_add(1, Ordering::SeqCst) == 0 {
            // The session's worker and handler end after this returns: trim a little later,
            // once for every session closed meanwhile.
            let shared = Arc::downgrade(self);
            tokio::spawn(async move {
                tokio::time::sleep(TRIM_AFTER).await;
                if let Some(shared) = shared.upgrade() {
                    shared.closed_since_trim.store(0, Ordering::SeqCst);
                }
                // It walks every arena: not on a runtime worker.
                let _ = tokio::task::spawn_blocking(give_back_memory).await;
            });
        }
        Ok(known)
    }
}

static NOT_INITIALIZED: Throttle = Throttle::new(EVERY);

/// The session manager the HTTP transport gives rmcp.
#[derive(Clone)]
pub(crate) struct BoundedSessions {
    shared: Arc<Shared>,
}

impl BoundedSessions {
    pub(crate) fn new(limits: SessionLimits) -> Self {
        let mut local = LocalSessionManager::default();
        local.session_config.keep_alive = Some(limits.idle);
        BoundedSessions {
            shared: Arc::new(Shared {
                local,
                limits,
                book: Mutex::default(),
                closed_since_trim: AtomicUsize::new(0),
            }),
        }
    }

    pub(crate) fn limits(&self) -> &SessionLimits {
        &self.shared.limits
    }

    /// A place for a new session of `principal` (who may hold at most `per_principal`),
    /// or why there is none.
    pub(crate) fn admit(
        &self,
        principal: Principal,
        per_principal: Option<usize>,
    ) -> Result<Admission, Refused> {
        self.shared
            .book()
            .reserve(&principal, &self.shared.limits, per_principal)?;
        Ok(Admission {
            book: Arc::downgrade(&self.shared),
            principal,
            used: false,
        })
    }

    /// The principal that opened session `id`, if it is open.
    pub(crate) fn principal_of(&self, id: &str) -> Option<Principal> {
        self.shared.book().open.get(id).map(|e| e.principal.clone())
    }

    /// Sessions open now (and places admitted but not yet used).
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.shared.book().total
    }

    /// Close `id` after the handshake timeout unless it sent `initialized` first.
    fn watch_handshake(&self, id: SessionId, over: CancellationToken) {
        let shared = Arc::downgrade(&self.shared);
        let wait = self.shared.limits.handshake;
        tokio::spawn(async move {
            tokio::select! {
                _ = over.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let established = shared.book().open.get(&id).is_none_or(|e| e.established);
            if established {
                return;
            }
            if let Some(n) = NOT_INITIALIZED.ready() {
                tracing::info!(
                    "closed MCP session {id}: no notifications/initialized within {}s of its initialize{}",
                    wait.as_secs(),
                    left_out(n)
                );
            }
            if let Err(e) = shared.close(&id).await {
                tracing::debug!("closing MCP session {id}: {e}");
            }
        });
    }

    fn saw(&self, id: &SessionId, message: &ClientJsonRpcMessage) {
        if let JsonRpcMessage::Notification(n) = message
            && matches!(
                n.notification,
                ClientNotification::InitializedNotification(_)
            )
            && let Some(entry) = self.shared.book().open.get_mut(id)
        {
            entry.established = true;
            entry.handshake_over.cancel();
        }
    }
}

type Local = LocalSessionManager;

impl SessionManager for BoundedSessions {
    type Error = SessionsError;
    type Transport = <Local as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        // The router admitted this request; without an admission (a path it did not
        // foresee) the limit is checked here.
        let mut admission = match take_admission() {
            Some(a) => a,
            None => self.admit(Principal::new("unknown"), None)?,
        };
        let (id, transport) = self.shared.local.create_session().await?;
        let over = CancellationToken::new();
        self.shared.book().open.insert(
            id.clone(),
            Entry {
                principal: admission.principal.clone(),
                handshake_over: over.clone(),
                established: false,
            },
        );
        admission.used = true;
        self.watch_handshake(id.clone(), over);
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.shared.local.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.shared.local.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.shared.close(id).await?;
        Ok(())
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.shared.local.create_stream(id, message).await?)
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.saw(id, &message);
        Ok(self.shared.local.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.shared.local.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.shared.local.resume(id, last_event_id).await?)
    }

    /// No session store is configured: a session unknown here stays unknown (404).
    async fn restore_session(
        &self,
        _id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        Ok(RestoreOutcome::NotSupported)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize) -> SessionLimits {
        SessionLimits {
            max_total: max,
            handshake: Duration::from_secs(30),
            idle: Duration::from_secs(300),
        }
    }

    /// A principal at its own quota is refused in words while another still gets a place.
    #[tokio::test]
    async fn a_principal_at_its_quota_is_refused_and_others_are_not() {
        let s = BoundedSessions::new(limits(10));
        let _a = s.admit(Principal::new("a"), Some(1)).unwrap();
        let e = s.admit(Principal::new("a"), Some(1)).err().unwrap();
        assert!(matches!(e, Refused::Principal { open: 1, max: 1 }), "{e:?}");
        assert!(e.to_string().contains("max_mcp_sessions"), "{e}");
        assert!(s.admit(Principal::new("b"), Some(1)).is_ok());
    }

    /// Places are counted per principal and in total; an unused admission gives its
    /// place back; the refusal says how many are open, the limit and the timeouts.
    #[tokio::test]
    async fn admissions_count_and_refuse_in_words() {
        let s = BoundedSessions::new(limits(2));
        let a = s.admit(Principal::new("a"), None).unwrap();
        let b = s.admit(Principal::new("b"), None).unwrap();
        let e = s
            .admit(Principal::new("a"), None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("2 of 2 are open"), "{e}");
        assert!(e.contains("--http-max-sessions"), "{e}");
        assert!(e.contains("30s") && e.contains("300s"), "{e}");
        drop(a);
        assert_eq!(s.open(), 1);
        assert_eq!(s.shared.book().counts.get(&Principal::new("a")), None);
        assert_eq!(s.shared.book().counts[&Principal::new("b")], 1);
        drop(b);
        assert_eq!(s.open(), 0);
        assert!(s.shared.book().counts.is_empty());
    }

    /// A created session holds its place until rmcp closes it; the admission travels
    /// through the task-local.
    #[tokio::test]
    async fn a_session_holds_its_place_until_closed() {
        let s = BoundedSessions::new(limits(1));
        let adm = s.admit(Principal::new("p"), None).unwrap();
        let (id, _transport) = with_admission(adm, s.create_session()).await.unwrap();
        assert_eq!(s.open(), 1);
        assert!(s.admit(Principal::new("q"), None).is_err());
        // Without an admission (an unforeseen path) the limit still holds.
        assert!(matches!(
            s.create_session().await,
            Err(SessionsError::Refused(_))
        ));
        s.close_session(&id).await.unwrap();
        assert_eq!(s.open(), 0);
        assert!(!s.has_session(&id).await.unwrap());
        s.admit(Principal::new("q"), None).unwrap();
    }

    /// A session that does not send `initialized` in time is closed; one that does stays.
    #[tokio::test]
    async fn the_handshake_timeout_closes_only_sessions_that_never_initialized() {
        let s = BoundedSessions::new(SessionLimits {
            handshake: Duration::from_millis(100),
            ..limits(4)
        });
        let (silent, _t1) = s.create_session().await.unwrap();
        let (polite, _t2) = s.create_session().await.unwrap();
        let initialized: ClientJsonRpcMessage = serde_json::from_value(
            serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )
        .unwrap();
        s.saw(&polite, &initialized);
        // Hang guard only: the silent one goes 100 ms after its creation.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while s.has_session(&silent).await.unwrap() {
            assert!(std::time::Instant::now() < deadline, "never closed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(s.has_session(&polite).await.unwrap());
        assert_eq!(s.open(), 1);
        assert!(s.shared.book().open.contains_key(&polite));
    }
}
