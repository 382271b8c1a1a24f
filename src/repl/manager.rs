//! The named sessions: create on first use (up to a maximum), list, close, an idle-TTL
//! reaper, and shutdown.
//!
//! `sessions` (sync mutex) guards only the name → session map; it is never held across
//! an await, so sessions execute concurrently. The reaper task holds a `Weak` reference
//! and ends by itself when the manager is dropped.
//!
//! Locks, in the order they may be taken (a lock is only taken while holding the ones
//! before it; none but the start gate is held across an await):
//! 1. a name's start gate (`starting`' async mutex, held across that name's start);
//! 2. `spare`;
//! 3. `sessions`;
//! 4. `site_dirs`, `expired`, `restarted` (leaves, each taken alone under `sessions` or
//!    without it) and a session's own locks (`Session::info`, `set_site_dirs`,
//!    `mark_state_lost` under `sessions`: see session.rs).
//!
//! `starting` (the map of gates), `sandbox` and `launched_under` are taken alone.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::config::ReplConfig;
use super::error::ReplError;
use super::info::{SessionInfo, SessionState};
use super::interpreter::Language;
use super::probe_cache::{ProbeCache, discover_python_cached};
use super::python::{self, PythonInfo};
use super::session::Session;
use super::session::SessionEnv;
use super::worker::SpawnSpec;
use crate::sandbox::{Placeholders, ResolvedPolicy};

/// How many expired session names are remembered for their next cell's note.
const EXPIRED_CAP: usize = 4096;

pub struct SessionManager {
    cfg: ReplConfig,
    python: tokio::sync::OnceCell<PythonInfo>,
    /// R, found and probed on the first R session's start (`repl::r`).
    r: tokio::sync::OnceCell<PythonInfo>,
    /// The language each session name was asked for ([`Self::choose_language`]); a name
    /// not in it starts in the configured default. Kept across an idle expiry, dropped
    /// by a close. Locked alone.
    languages: Mutex<HashMap<String, Language>>,
    /// The probe's answers from earlier servers (in the state dir).
    probe_cache: ProbeCache,
    /// Lock 3.
    sessions: Mutex<BTreeMap<String, Arc<Session>>>,
    /// Each session name's start-up site directories ([`Session::set_site_dirs`]), kept
    /// across a close so a session started again under that name gets them too. Lock 4:
    /// under `sessions` when written, so a start reads them in step.
    site_dirs: Mutex<HashMap<String, Vec<PathBuf>>>,
    /// The policy and workspace sessions started from now on get ([`Self::set_sandbox`]);
    /// starts as the config's. Running sessions keep what they started with. Locked alone.
    sandbox: Mutex<(crate::sandbox::Policy, PathBuf)>,
    /// Bumped by every [`Self::set_sandbox`]; each session name's worker records the
    /// value it started under, so an unused prewarmed session started before a change
    /// is started again under the new sandbox at its first use.
    sandbox_generation: std::sync::atomic::AtomicU64,
    /// Locked alone.
    launched_under: Mutex<HashMap<String, u64>>,
    /// Sessions the idle reaper closed, with how long they had been idle: the next cell
    /// of a session started again under that name is told its state was lost and why.
    /// Lock 4.
    expired: Mutex<HashMap<String, Duration>>,
    /// Sessions closed because the client's sandbox changed under them
    /// ([`SessionManager::restart_outdated`]), with why in words: the next cell of the
    /// session started again under that name is told its state was lost and why.
    /// Lock 4.
    restarted: Mutex<HashMap<String, String>>,
    /// A session started ahead of use ([`SessionManager::prewarm`]) and not used since:
    /// it does not count toward `max_sessions`, and yields its slot (is closed) when
    /// another session needs it. Lock 2 (`yield_spare` reads `sessions` under it).
    spare: Mutex<Option<String>>,
    /// One start at a time per name: concurrent first uses (the prewarm on `initialize`,
    /// the one after `initialized`, the first call) wait for the start under way instead
    /// of each spawning a worker and all but one being killed (three interpreters
    /// competing for the CPU delayed the first cell). Entries go when nobody waits. The
    /// map is locked alone; a gate is lock 1.
    starting: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl SessionManager {
    /// Create the manager. Inside a tokio runtime it also starts the idle reaper.
    pub fn new(cfg: ReplConfig) -> Arc<SessionManager> {
        let ttl = cfg.idle_ttl;
        let sandbox = Mutex::new((cfg.policy.clone(), cfg.workspace.clone()));
        let probe_cache = ProbeCache::new(&cfg.state_dir);
        let manager = Arc::new(SessionManager {
            cfg,
            sandbox,
            sandbox_generation: std::sync::atomic::AtomicU64::new(0),
            launched_under: Mutex::new(HashMap::new()),
            python: tokio::sync::OnceCell::new(),
            r: tokio::sync::OnceCell::new(),
            languages: Mutex::new(HashMap::new()),
            probe_cache,
            sessions: Mutex::new(BTreeMap::new()),
            site_dirs: Mutex::new(HashMap::new()),
            expired: Mutex::new(HashMap::new()),
            restarted: Mutex::new(HashMap::new()),
            spare: Mutex::new(None),
            starting: Mutex::new(HashMap::new()),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(reap_idle(Arc::downgrade(&manager), ttl));
            // The interpreter is probed on first use, not here: through a pyenv shim the
            // probe forks several processes, which would compete with the MCP handshake.
            // The server's prewarm (after `initialized`) makes that first use early.
        }
        manager
    }

    pub fn config(&self) -> &ReplConfig {
        &self.cfg
    }

    fn sessions(&self) -> MutexGuard<'_, BTreeMap<String, Arc<Session>>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sessions started from now on run under `policy` in `workspace`; running ones keep
    /// theirs until they are closed or restarted.
    /// A change that leaves the sandbox as it was (only the policy's name or description
    /// differ) keeps the generation: sessions started before it need not start again.
    pub(crate) fn set_sandbox(&self, policy: crate::sandbox::Policy, workspace: PathBuf) {
        let mut current = self.sandbox.lock().unwrap_or_else(|p| p.into_inner());
        let same = current.1 == workspace && {
            let mut was = current.0.clone();
            was.name.clone_from(&policy.name);
            was.description.clone_from(&policy.description);
            was == policy
        };
        *current = (policy, workspace);
        if !same {
            self.sandbox_generation
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Close session `name` if it was started under another sandbox than the current one
    /// and runs nothing (idle, or without a live worker), so that its next use starts it
    /// again under the current one; that first cell is told, with `why`, that its state
    /// is lost. Returns whether it was closed.
    pub(crate) fn restart_outdated(&self, name: &str, why: &str) -> bool {
        let Some(session) = self.sessions().get(name).cloned() else {
            return false;
        };
        let quiet = matches!(session.state(), SessionState::Idle | SessionState::Dead);
        if self.under_current_sandbox(name) || !quiet {
            return false;
        }
        let used = session.info().cells > 0;
        tracing::info!(session = %name, "{why}: closing the session so that it starts again under it");
        if self.close(name).is_err() {
            return false;
        }
        if used {
            let mut restarted = self.restarted.lock().unwrap_or_else(|p| p.into_inner());
            if restarted.len() >= EXPIRED_CAP {
                restarted.clear(); // bounded memory; only the notes of old names are lost
            }
            restarted.insert(
                name.to_string(),
                format!(
                    "session {name:?} was started again because {why}; this ran in a fresh \
                     worker and earlier state is lost"
                ),
            );
        }
        true
    }

    fn current_sandbox(&self) -> (crate::sandbox::Policy, PathBuf) {
        self.sandbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn site_dirs_of(&self, name: &str) -> Vec<PathBuf> {
        let map = self.site_dirs.lock().unwrap_or_else(|p| p.into_inner());
        map.get(name).cloned().unwrap_or_default()
    }

    /// Directories every new worker of session `name` adds to `sys.path` before its
    /// first cell (e.g. the session venv's site-packages): applied to the open session's
    /// spare and future workers (see [`Session::set_site_dirs`]), and to the session if
    /// it is started (again) later. The running worker is left alone.
    pub fn set_site_dirs(&self, name: &str, dirs: Vec<PathBuf>) {
        let sessions = self.sessions();
        self.site_dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), dirs.clone());
        if let Some(s) = sessions.get(name) {
            s.set_site_dirs(dirs);
        }
    }

    /// The interpreter workers run (discovered and probed once per server, or taken from
    /// the state dir's probe cache when that can be trusted).
    pub async fn python(&self) -> Result<&PythonInfo, ReplError> {
        self.python
            .get_or_try_init(|| async {
                let workspace = self.current_sandbox().1;
                discover_python_cached(self.cfg.python.as_deref(), &workspace, &self.probe_cache)
                    .await
            })
            .await
    }

    /// R (found on PATH and probed once per server).
    pub async fn r(&self) -> Result<&PythonInfo, ReplError> {
        self.r.get_or_try_init(super::r::discover_r).await
    }

    /// The language session `name` runs, or will run when it starts.
    pub fn language_of(&self, name: &str) -> Language {
        if let Some(s) = self.sessions().get(name) {
            return s.language();
        }
        self.languages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .copied()
            .unwrap_or(self.cfg.interpreter)
    }

    /// Session `name` is to run `language`: recorded for its start, or checked against
    /// the open session (an unused prewarmed one of the other language is closed, so it
    /// starts again in this one). A used session keeps its language: an error says so.
    pub fn choose_language(&self, name: &str, language: Language) -> Result<(), ReplError> {
        let open = self.sessions().get(name).cloned();
        if let Some(s) = open {
            let has = s.language();
            if has == language {
                return Ok(());
            }
            let unused = lock_spare(&self.spare).as_deref() == Some(name);
            if !unused {
                return Err(ReplError::LanguageMismatch {
                    session: name.to_string(),
                    has,
                    asked: language,
                });
            }
            tracing::debug!(session = %name, %language, "closing the unused session to start it in another language");
            let _ = self.close_session(name, Closing::OnPurpose);
            self.used(name);
        }
        self.languages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), language);
        Ok(())
    }

    fn open_names(map: &BTreeMap<String, Arc<Session>>) -> String {
        if map.is_empty() {
            "none".to_string()
        } else {
            map.keys().cloned().collect::<Vec<_>>().join(", ")
        }
    }

    /// The session called `name`; error if there is none. Counts as a use.
    pub fn get(&self, name: &str) -> Result<Arc<Session>, ReplError> {
        let found = {
            let map = self.sessions();
            map.get(name).cloned().ok_or_else(|| {
                match self.expired_for(name) {
                    // Closed by the idle TTL: say so, not "no session".
                    Some(idle) => ReplError::Expired {
                        name: name.to_string(),
                        idle_secs: idle.as_secs(),
                    },
                    None => ReplError::NoSuchSession {
                        name: name.to_string(),
                        open: Self::open_names(&map),
                    },
                }
            })
        };
        if found.is_ok() {
            self.used(name);
        }
        found
    }

    /// The session called `name`, started (with its worker) if it does not exist yet.
    /// Counts as a use.
    pub async fn get_or_start(&self, name: &str) -> Result<Arc<Session>, ReplError> {
        let mut r = self.open(name).await;
        if r.is_ok() && self.stale_spare(name) {
            // Started ahead of use under a sandbox the client has since changed: no call
            // has used it, so it starts again under the current one.
            tracing::debug!(session = %name, "the prewarmed session predates the client's sandbox or language; starting it again");
            // Not `close`: that forgets the language a call asked for.
            let _ = self.close_session(name, Closing::OnPurpose);
            r = self.open(name).await;
        }
        self.used(name);
        r
    }

    /// `name` is the unused prewarmed session and started before the last sandbox change,
    /// or in another language than a call has since asked for (a prewarm that was under
    /// way when [`Self::choose_language`] ran).
    pub(crate) fn stale_spare(&self, name: &str) -> bool {
        if lock_spare(&self.spare).as_deref() != Some(name) {
            return false;
        }
        !self.under_current_sandbox(name) || self.spare_in_other_language(name)
    }

    fn spare_in_other_language(&self, name: &str) -> bool {
        let wanted = self
            .languages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .copied();
        let has = self.sessions().get(name).map(|s| s.language());
        matches!((wanted, has), (Some(w), Some(h)) if w != h)
    }

    /// Whether session `name` was started under the current sandbox generation.
    fn under_current_sandbox(&self, name: &str) -> bool {
        let now = self
            .sandbox_generation
            .load(std::sync::atomic::Ordering::SeqCst);
        self.launched_under
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .copied()
            == Some(now)
    }

    /// Start `name` ahead of use (the server's `default` after the handshake). Until a
    /// call uses it, it does not count toward `max_sessions`: a session that needs its
    /// slot closes it.
    pub async fn prewarm(&self, name: &str) -> Result<Arc<Session>, ReplError> {
        if !self.sessions().contains_key(name) {
            *lock_spare(&self.spare) = Some(name.to_string());
        }
        let r = self.open(name).await;
        if r.is_err() {
            self.used(name);
        }
        r
    }

    /// `name` is in use: no longer a spare.
    fn used(&self, name: &str) {
        let mut spare = lock_spare(&self.spare);
        if spare.as_deref() == Some(name) {
            *spare = None;
        }
    }

    /// At the limit, close an unused prewarmed session (not `name`) to make room.
    fn yield_spare(&self, name: &str) {
        let victim = {
            let mut spare = lock_spare(&self.spare);
            let full = self.sessions().len() >= self.cfg.max_sessions;
            match spare.as_deref() {
                Some(s) if full && s != name => spare.take(),
                _ => None,
            }
        };
        if let Some(v) = victim {
            tracing::debug!(session = %v, "closing the unused prewarmed session to make room");
            let _ = self.close(&v);
        }
    }

    async fn open(&self, name: &str) -> Result<Arc<Session>, ReplError> {
        if let Some(s) = self.sessions().get(name) {
            return Ok(s.clone());
        }
        validate_name(name)?;
        let gate = self
            .starting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name.to_string())
            .or_default()
            .clone();
        let r = {
            let _one_at_a_time = gate.lock().await;
            let started = self.sessions().get(name).cloned(); // while we waited
            match started {
                Some(s) => Ok(s),
                None => self.start(name).await,
            }
        };
        let mut starting = self.starting.lock().unwrap_or_else(|p| p.into_inner());
        // Ours and the map's: nobody else waits on this gate.
        if Arc::strong_count(&gate) <= 2 {
            starting.remove(name);
        }
        r
    }

    /// Start session `name` (the caller holds its start gate). Before the interpreter is
    /// known, an untrusted remembered probe answer (a shim's: see `probe_cache`) starts
    /// the worker while the probe checks it; the session is admitted only if the probe
    /// agrees, so no cell ever runs on a guess.
    async fn start(&self, name: &str) -> Result<Arc<Session>, ReplError> {
        if self.language_of(name) == Language::R {
            let r = self.r().await?.clone();
            let started = self.launch(name, r, Language::R).await?;
            return self.admit(name, started);
        }
        let guess = match self.python.get() {
            Some(_) => None,
            None => self
                .python_candidate()
                .and_then(|c| self.probe_cache.lookup(&c))
                .filter(|hit| !hit.trusted),
        };
        let python = match guess {
            None => self.python().await?.clone(),
            Some(hit) => {
                let (verified, launched) =
                    tokio::join!(self.python(), self.launch(name, hit.info, Language::Python));
                let verified = verified?.clone();
                match launched {
                    Ok(s) if s.python().same_interpreter(&verified) => return self.admit(name, s),
                    Ok(s) => {
                        tracing::info!(
                            session = %name,
                            "the interpreter changed since the last server: starting the session again"
                        );
                        self.discard(s);
                    }
                    Err(e) => {
                        tracing::debug!(session = %name, error = %e, "the early start failed")
                    }
                }
                verified
            }
        };
        let started = self.launch(name, python, Language::Python).await?;
        self.admit(name, started)
    }

    fn python_candidate(&self) -> Option<PathBuf> {
        let workspace = self.current_sandbox().1;
        python::candidate(self.cfg.python.as_deref(), &workspace).ok()
    }

    /// Close a session that was never admitted, and remove its temp directory.
    fn discard(&self, s: Arc<Session>) {
        s.close();
        let dir = s.tmp_dir().to_path_buf();
        std::thread::spawn(move || {
            let _ = std::fs::remove_dir_all(&dir);
        });
    }

    /// Spawn session `name`'s first worker on `python` (not yet in the map).
    /// For R, `python` is R's installation ([`Self::r`]).
    async fn launch(
        &self,
        name: &str,
        python: PythonInfo,
        language: Language,
    ) -> Result<Arc<Session>, ReplError> {
        self.yield_spare(name);
        self.check_room(name, &self.sessions())?;
        // One directory per session *instance*: a session closed (or expired) a moment ago
        // under the same name is still having its directory removed.
        let tmp = self
            .session_dir(name)
            .join(format!("tmp-{}", unique_suffix()));
        let mut dirs = vec![tmp.clone()];
        if language == Language::R {
            dirs.push(super::r::session_library(&tmp));
        }
        for dir in dirs {
            std::fs::create_dir_all(&dir).map_err(|source| ReplError::Io {
                what: format!("create the session directory {}", dir.display()),
                source,
            })?;
        }
        let generation = self
            .sandbox_generation
            .load(std::sync::atomic::Ordering::SeqCst);
        let (policy, workspace) = self.current_sandbox();
        self.launched_under
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), generation);
        let placeholders = Placeholders {
            workspace: workspace.clone(),
            tmp: tmp.clone(),
            python: python.prefixes.clone(),
            venv: match language {
                Language::Python => python.venv.clone(),
                Language::R => Some(super::r::session_library(&tmp)),
            },
            uv_cache: None,
        };
        let policy_name = policy.name.clone();
        let policy = Arc::new(policy.resolve(&placeholders)?);
        let snapshot_memory = snapshot_budget(&self.cfg, &policy);
        let env = SessionEnv {
            spec: SpawnSpec {
                sandbox: self.cfg.sandbox.clone(),
                python: python.executable.clone(),
                workspace,
                tmp,
                policy,
                code: python.driver_code(),
                snapshots: self.cfg.max_snapshots > 0 && language.snapshots(),
                snapshot_idle: self.cfg.snapshot_idle,
                language,
            },
            policy_name,
            python,
            repr_limit: self.cfg.repr_limit,
            start_timeout: self.cfg.start_timeout,
            spare: self.cfg.spare_worker,
            max_snapshots: self.cfg.max_snapshots,
            snapshot_memory,
            graph_file: Some(self.session_dir(name).join("graph.jsonl")),
            max_cells: self.cfg.max_cells,
            started: self.cfg.started,
        };
        // Start the worker without holding the map: other sessions stay reachable while
        // the launcher sets up. A concurrent start of the same name wins; ours is closed.
        let site_dirs = {
            let _map = self.sessions();
            self.site_dirs_of(name)
        };
        let started = {
            let name = name.to_string();
            tokio::task::spawn_blocking(move || Session::start(name, env, site_dirs))
                .await
                .map_err(|e| ReplError::Io {
                    what: "start the worker".into(),
                    source: std::io::Error::other(e),
                })??
        };
        Ok(started)
    }

    /// Put a launched session in the map (or close it: the name was taken meanwhile, or
    /// there is no room).
    fn admit(&self, name: &str, started: Arc<Session>) -> Result<Arc<Session>, ReplError> {
        self.yield_spare(name);
        let mut map = self.sessions();
        if let Some(existing) = map.get(name) {
            let existing = existing.clone();
            drop(map);
            self.discard(started);
            return Ok(existing);
        }
        if let Err(e) = self.check_room(name, &map) {
            drop(map);
            self.discard(started);
            return Err(e);
        }
        map.insert(name.to_string(), started.clone());
        let expired = self
            .expired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        if let Some(idle) = expired {
            started.mark_state_lost(format!(
                "session {name:?} expired after {} s idle and was closed; this ran in a fresh \
                 worker and earlier state is lost",
                idle.as_secs()
            ));
        }
        let restarted = self
            .restarted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        if let Some(note) = restarted {
            started.mark_state_lost(note);
        }
        // `set_site_dirs` may have run while the worker started.
        started.set_site_dirs(self.site_dirs_of(name));
        Ok(started)
    }

    fn check_room(
        &self,
        name: &str,
        map: &BTreeMap<String, Arc<Session>>,
    ) -> Result<(), ReplError> {
        if map.len() >= self.cfg.max_sessions {
            // Name each open session with what it is doing and how long it has been
            // idle, so the caller can pick one to close.
            let open = map
                .values()
                .map(|s| {
                    let i = s.info();
                    let state = serde_json::to_value(i.state)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default();
                    format!(
                        "{} ({state}, idle {} s, {} cells)",
                        i.name, i.idle_seconds, i.cells
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            return Err(ReplError::TooManySessions {
                name: name.to_string(),
                max: self.cfg.max_sessions,
                open,
            });
        }
        Ok(())
    }

    /// Start session `name` in the background (errors are logged and surface again on
    /// first use), so the first cell finds a running worker — e.g. `default` at server
    /// start. Costs one idle Python process until the TTL closes it.
    pub fn prestart(self: &Arc<Self>, name: &str) {
        let (me, name) = (Arc::downgrade(self), name.to_string());
        tokio::spawn(async move {
            let Some(m) = me.upgrade() else { return };
            if let Err(e) = m.get_or_start(&name).await {
                tracing::warn!(session = %name, error = %e, "could not start the session in advance");
            }
        });
    }

    /// The directory that holds the temp dirs of every instance of session `name`.
    /// How long the session `name` had been idle when the TTL closed it, if it was (and
    /// has not been started again since).
    pub(crate) fn expired_for(&self, name: &str) -> Option<Duration> {
        self.expired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .copied()
    }

    /// Whether a session `name` that is not open has a cell graph kept on disk (an
    /// earlier server's): starting it loads that history.
    pub(crate) fn has_kept_history(&self, name: &str) -> bool {
        std::fs::metadata(self.session_dir(name).join("graph.jsonl")).is_ok_and(|m| m.len() > 0)
    }

    fn session_dir(&self, name: &str) -> PathBuf {
        self.cfg.state_dir.join("repl").join(name)
    }

    /// Every session, by name.
    pub fn list(&self) -> Vec<SessionInfo> {
        let sessions: Vec<Arc<Session>> = self.sessions().values().cloned().collect();
        sessions.iter().map(|s| s.info()).collect()
    }

    /// Kill the session's worker and forget it (its directory, graph included, is removed).
    pub fn close(&self, name: &str) -> Result<(), ReplError> {
        self.forget_language(name);
        self.close_session(name, Closing::OnPurpose)
    }

    /// A later session of this name starts in the language its first call asks for.
    fn forget_language(&self, name: &str) {
        self.languages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
    }

    /// The sessions (other than `but`) that have a cell numbered `cell`.
    pub(crate) fn sessions_with_cell(&self, cell: u64, but: &str) -> Vec<String> {
        let sessions: Vec<Arc<Session>> = self.sessions().values().cloned().collect();
        sessions
            .iter()
            .filter(|s| s.name() != but && s.has_cell(cell))
            .map(|s| s.name().to_string())
            .collect()
    }

    /// Close a session; unless the server is shutting down its directory goes too,
    /// else only its temp directory goes and its cell graph stays for a later server.
    fn close_session(&self, name: &str, how: Closing) -> Result<(), ReplError> {
        let forget = how != Closing::Shutdown;
        let session = {
            let mut map = self.sessions();
            let session = map.remove(name).ok_or_else(|| ReplError::NoSuchSession {
                name: name.to_string(),
                open: Self::open_names(&map),
            })?;
            // Recorded while the name is still held (lock order: sessions -> expired), so
            // no call can find the name gone and not yet marked expired.
            let mut expired = self.expired.lock().unwrap_or_else(|p| p.into_inner());
            match how {
                Closing::Expired(idle) => {
                    if expired.len() >= EXPIRED_CAP {
                        expired.clear(); // bounded memory; only the notes of old names are lost
                    }
                    expired.insert(name.to_string(), idle);
                }
                // Closed on purpose: a later session of this name is not "expired".
                Closing::OnPurpose => {
                    expired.remove(name);
                }
                Closing::Shutdown => {}
            }
            session
        };
        session.close();
        // Removing a big temp tree can take a while; never on the caller's time. Moved
        // aside first, so it is gone from the session's directory at once (a session
        // started again under this name has a directory of its own).
        if forget {
            let _ = std::fs::remove_file(self.session_dir(name).join("graph.jsonl"));
        }
        let mut dir = session.tmp_dir().to_path_buf();
        let aside = self
            .cfg
            .state_dir
            .join("repl")
            .join(format!(".closed-{name}-{}", unique_suffix()));
        if std::fs::rename(&dir, &aside).is_ok() {
            dir = aside;
        }
        std::thread::spawn(move || {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::debug!(dir = %dir.display(), error = %e, "could not remove a session directory");
            }
        });
        Ok(())
    }

    /// Close every session.
    pub fn shutdown(&self) {
        let names: Vec<String> = self.sessions().keys().cloned().collect();
        for name in names {
            let _ = self.close_session(&name, Closing::Shutdown);
        }
    }

    /// Close sessions idle for longer than the TTL (busy or waiting sessions never are).
    pub(crate) fn reap_idle(&self) -> Vec<String> {
        let ttl = self.cfg.idle_ttl;
        let idle: Vec<(String, Duration)> = self
            .sessions()
            .iter()
            .map(|(n, s)| (n.clone(), s.idle_for(), s.state()))
            .filter(|(_, idle, state)| *idle > ttl && *state != SessionState::AwaitingInput)
            .map(|(n, idle, _)| (n, idle))
            .collect();
        let mut names = Vec::new();
        for (name, idle) in idle {
            tracing::info!(session = %name, "closing a session idle for longer than {ttl:?}");
            self.forget_language(&name);
            let _ = self.close_session(&name, Closing::Expired(idle));
            names.push(name);
        }
        names
    }
}

/// Why a session is closed: what its name means to a later call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Closing {
    /// Asked for (session_close): a later session of this name starts fresh, silently.
    OnPurpose,
    /// Idle past the TTL: a later call of this name is told so.
    Expired(Duration),
    /// The server is stopping: the session's graph stays for the next server.
    Shutdown,
}

async fn reap_idle(manager: Weak<SessionManager>, ttl: Duration) {
    let period = (ttl / 4).clamp(Duration::from_millis(200), Duration::from_secs(60));
    loop {
        tokio::time::sleep(period).await;
        let Some(m) = manager.upgrade() else { return };
        m.reap_idle();
    }
}

fn validate_name(name: &str) -> Result<(), ReplError> {
    if crate::names::is_valid_session_name(name) {
        Ok(())
    } else {
        Err(ReplError::InvalidSessionName {
            name: name.to_string(),
        })
    }
}

/// A suffix no other directory made by this server has (nanoseconds since the epoch
/// plus a per-process counter).
fn unique_suffix() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{nanos:x}-{n}")
}

fn lock_spare(m: &Mutex<Option<String>>) -> std::sync::MutexGuard<'_, Option<String>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The memory budget for a session's snapshots under `policy`: the configured one,
/// else half the policy's memory limit; none without a memory limit (no memory cgroup
/// to read), or with snapshots off.
fn snapshot_budget(cfg: &ReplConfig, policy: &ResolvedPolicy) -> Option<u64> {
    if cfg.max_snapshots == 0 {
        return None;
    }
    let limit = policy.limits.memory_bytes;
    match (cfg.snapshot_memory, limit) {
        (Some(_), None) => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| tracing::warn!(
                "the snapshot memory budget is not applied: the policy has no memory limit, so sessions have no memory cgroup to read; set `memory` in the policy's [limits]"
            ));
            None
        }
        (Some(budget), Some(_)) => Some(budget),
        (None, limit) => limit.map(|l| l / 2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_names_are_checked() {
        assert!(validate_name("default").is_ok());
        assert!(validate_name("a-b_c.1").is_ok());
        for bad in ["", "..", "a/b", "x y", &"n".repeat(65)] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_snapshot_budget_defaults_to_half_the_memory_limit() {
        let placeholders = crate::sandbox::Placeholders {
            workspace: "/w".into(),
            tmp: "/t".into(),
            ..Default::default()
        };
        let policy = |name| {
            crate::sandbox::Policy::load(name)
                .unwrap()
                .resolve(&placeholders)
                .unwrap()
        };
        let capped = policy("workspace-write");
        let limit = capped
            .limits
            .memory_bytes
            .expect("workspace-write has a memory limit");
        let mut cfg = ReplConfig::new(
            crate::sandbox::Runtime::new(crate::sandbox::RuntimeConfig::server()),
            "/w".into(),
            crate::sandbox::Policy::load("workspace-write").unwrap(),
            "/s".into(),
        );
        assert_eq!(snapshot_budget(&cfg, &capped), Some(limit / 2));
        cfg.snapshot_memory = Some(64 << 20);
        assert_eq!(snapshot_budget(&cfg, &capped), Some(64 << 20));
        let mut uncapped = capped.clone();
        uncapped.limits.memory_bytes = None;
        assert_eq!(
            snapshot_budget(&cfg, &uncapped),
            None,
            "no memory cgroup to read"
        );
        cfg.max_snapshots = 0;
        assert_eq!(snapshot_budget(&cfg, &capped), None, "snapshots off");
    }
}
