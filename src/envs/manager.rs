//! [`EnvManager`]: the one object the server holds for environments. It finds uv once,
//! remembers which venv each session uses, serializes installs per venv, and holds the
//! per-session stores and their disk bounds ([`Stores`]): every install, venv creation
//! and script runs under a [`Lease`] from [`EnvManager::admit`].
//!
//! Locks, and why:
//! - `sessions` (std mutex, held only to look up or insert an entry, never across
//!   an await) maps a session name to its slot.
//! - each slot is a tokio mutex held for the whole of a venv creation or an install,
//!   so two installs into one venv never run at once (uv would fight over the
//!   site-packages directory) while other sessions proceed in parallel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::install::{self, InstallReport, InstallRequest};
use super::script::{self, ScriptReport, ScriptRequest};
use super::store::{Lease, Owner, Stores};
use super::venv::{self, Venv, VenvLocation};
use super::{Canceller, EnvConfig, EnvError, EnvSink, Uv};
use crate::sandbox::{Placeholders, ResolvedPolicy};

type Slot = Arc<tokio::sync::Mutex<Option<Venv>>>;

pub struct EnvManager {
    cfg: EnvConfig,
    uv: OnceLock<Uv>,
    sessions: Mutex<HashMap<String, Slot>>,
    stores: Arc<Stores>,
}

impl EnvManager {
    pub fn new(cfg: EnvConfig) -> Arc<EnvManager> {
        Arc::new(EnvManager {
            stores: Stores::new(&cfg),
            cfg,
            uv: OnceLock::new(),
            sessions: Mutex::new(HashMap::new()),
        })
    }

    pub fn config(&self) -> &EnvConfig {
        &self.cfg
    }

    pub fn stores(&self) -> &Arc<Stores> {
        &self.stores
    }

    /// Session `session`'s own uv cache.
    pub fn cache_dir(&self, session: &str) -> Result<std::path::PathBuf, EnvError> {
        Ok(self
            .stores
            .cache_dir(&Owner::new(self.cfg.principal.as_deref(), session)?))
    }

    /// Admit a job of `session` that writes its stores (an install, a venv creation, a
    /// script), to run under `policy` (whose temp dir counts when it is on the host):
    /// refused in words when the session's stores, or all sessions', are full.
    pub async fn admit(&self, session: &str, policy: &ResolvedPolicy) -> Result<Lease, EnvError> {
        let owner = Owner::new(self.cfg.principal.as_deref(), session)?;
        if let Some(v) = self.session_venv(session).await {
            self.stores.set_venv(&owner, v.root());
        }
        let extra = super::process::host_tmp(policy).into_iter().collect();
        self.stores.admit(&owner, extra).await
    }

    /// The uv binary, found on first use. A missing uv is looked for again on the
    /// next call (it may have been installed meanwhile).
    pub fn uv(&self) -> Result<&Uv, EnvError> {
        if let Some(uv) = self.uv.get() {
            return Ok(uv);
        }
        let found = Uv::locate(self.cfg.uv.as_deref())?;
        Ok(self.uv.get_or_init(|| found))
    }

    fn slot(&self, session: &str) -> Slot {
        let mut map = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(session.to_string()).or_default().clone()
    }

    /// The venv a session uses, if it has one yet (without creating it). Managed
    /// venvs left by an earlier server run are found on disk.
    /// Does not wait for an install in progress (it answers from disk meanwhile).
    pub async fn session_venv(&self, session: &str) -> Option<Venv> {
        let slot = self.slot(session);
        let on_disk = || {
            let loc = VenvLocation::Managed {
                session: session.to_string(),
            };
            let root = venv::location_path(&self.cfg, &loc).ok()?;
            Venv::open(&root).ok()
        };
        let Ok(mut guard) = slot.try_lock() else {
            return on_disk();
        };
        if guard.is_none() {
            *guard = on_disk();
        }
        guard.clone()
    }

    /// The session's venv, created at `location` (default: managed) if needed. A
    /// session keeps the venv it first got; asking for another one is an error.
    pub async fn ensure_session_venv(
        &self,
        session: &str,
        location: Option<&VenvLocation>,
        session_policy: &ResolvedPolicy,
        lease: &Lease,
    ) -> Result<Venv, EnvError> {
        let slot = self.slot(session);
        let mut guard = slot.lock().await;
        self.ensure_locked(session, location, session_policy, lease, &mut guard)
            .await
    }

    async fn ensure_locked(
        &self,
        session: &str,
        location: Option<&VenvLocation>,
        session_policy: &ResolvedPolicy,
        lease: &Lease,
        current: &mut Option<Venv>,
    ) -> Result<Venv, EnvError> {
        let managed = VenvLocation::Managed {
            session: session.to_string(),
        };
        let location = location.unwrap_or(&managed);
        let wanted = venv::location_path(&self.cfg, location)?;
        if let Some(v) = current.as_ref() {
            if v.root() == wanted || location == &managed {
                return Ok(v.clone());
            }
            return Err(EnvError::BadRequest(format!(
                "session {session:?} already uses the virtual environment at {}; restart the \
                 server or use another session for {}",
                v.root().display(),
                wanted.display()
            )));
        }
        let uv = self.uv()?;
        let v = venv::ensure(&self.cfg, uv, location, session_policy, lease).await?;
        *current = Some(v.clone());
        Ok(v)
    }

    /// Install into the session's venv (created first if needed), with the session's
    /// own uv cache, under `lease` (from [`EnvManager::admit`] for this session).
    /// Installs into one venv run one at a time. Returns the venv with the report, so the
    /// caller can run [`Venv::activation_code`] in the session after a success.
    #[expect(
        clippy::too_many_arguments,
        reason = "one install's inputs, each named at its one call site"
    )]
    pub async fn install(
        &self,
        session: &str,
        location: Option<&VenvLocation>,
        req: &InstallRequest,
        session_policy: &ResolvedPolicy,
        lease: &Lease,
        sink: Arc<dyn EnvSink>,
        cancel: &Canceller,
    ) -> Result<(Venv, InstallReport), EnvError> {
        install::validate(req)?;
        if lease.owner().session() != session {
            return Err(EnvError::BadRequest(format!(
                "an install into session {session:?} needs that session's lease, not {}'s",
                lease.owner()
            )));
        }
        let slot = self.slot(session);
        let mut guard = slot.lock().await;
        let venv = self
            .ensure_locked(session, location, session_policy, lease, &mut guard)
            .await?;
        let uv = self.uv()?;
        let report = install::install(
            &self.cfg,
            uv,
            &venv,
            req,
            session_policy,
            lease,
            sink,
            cancel,
        )
        .await?;
        Ok((venv, report))
    }

    /// Run a one-off script with the uv cache of `lease`'s session (see
    /// [`script::run_script`]).
    pub async fn run_script(
        &self,
        req: &ScriptRequest,
        session_policy: &ResolvedPolicy,
        lease: &Lease,
        sink: Arc<dyn EnvSink>,
        cancel: &Canceller,
    ) -> Result<ScriptReport, EnvError> {
        let uv = self.uv()?;
        script::run_script(&self.cfg, uv, req, session_policy, lease, sink, cancel).await
    }

    /// `base` with `{venv}` set to the session's venv (if it has one) and `{uv_cache}`
    /// to the session's own uv cache. The session's worker policy is resolved with
    /// these, so session code can read (not write) its venv.
    pub async fn placeholders(&self, session: &str, mut base: Placeholders) -> Placeholders {
        if let Some(v) = self.session_venv(session).await {
            base.venv = Some(v.root().to_path_buf());
        }
        base.uv_cache = self.cache_dir(session).ok();
        base
    }
}
