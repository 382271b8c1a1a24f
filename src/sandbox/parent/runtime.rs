//! The sandbox runtime: everything a spawn depends on besides the command itself, in
//! one object the front end builds once (`serve` before its runtime starts a thread,
//! `run` for its one job) and hands to every spawn through [`Runtime::command`].
//!
//! It owns the launch state that used to be process-global: which route starts a
//! launcher ([`Route`]), the binary re-executed in launcher or zygote mode, the spawner
//! thread, the zygote, the pools of cgroups, views and network namespaces made ahead,
//! the network broker (a [`ProxyProvider`]) and this server's instance id. Nothing is
//! decided by environment variables; a test builds the runtime it needs.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::cgroup::CgroupHost;
use super::isolation::JobCgroupHandle;
use super::pool::Pool;
use super::proxy::ProxyProvider;
use super::spawner::Spawner;
use super::zygote::Zygote;
use crate::sandbox::launcher::mounts::{MountView, PreparedView};

/// How a launcher is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Fork this (single-threaded) process and apply the sandbox in the child: `run`.
    /// Taken only while the process has one thread (after a fork of a multi-threaded
    /// process only async-signal-safe work is sound); otherwise the launcher is
    /// re-executed.
    Fork,
    /// Ask the zygote to fork (see `zygote`); re-execute the launcher if it cannot.
    Zygote,
    /// Re-execute this binary in launcher mode per job, the spec on a memfd.
    Reexec,
}

/// What a [`Runtime`] is built from.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// How launchers are started.
    pub route: Route,
    /// Whether jobs take cgroups, network namespaces and views made ahead of need
    /// (a server's jobs; `run` makes its one job's own).
    pub made_ahead: bool,
    /// The binary re-executed in launcher or zygote mode: this one (`/proc/self/exe`),
    /// or, for programs that link the library but are not that binary (integration
    /// tests), the mcp-sandbox-repl binary.
    pub launcher_exe: PathBuf,
    /// The soft open-file limit the server had before it raised its own: the job's
    /// when its policy sets none.
    pub inherited_open_files: Option<u64>,
}

impl RuntimeConfig {
    /// The server's: a zygote, resources made ahead.
    pub fn server() -> RuntimeConfig {
        RuntimeConfig {
            route: Route::Zygote,
            made_ahead: true,
            launcher_exe: PathBuf::from("/proc/self/exe"),
            inherited_open_files: None,
        }
    }

    /// One job of a single-threaded program (`run`): a plain fork, nothing made ahead.
    pub fn single_job() -> RuntimeConfig {
        RuntimeConfig {
            route: Route::Fork,
            made_ahead: false,
            ..RuntimeConfig::server()
        }
    }
}

/// The explicit launch state; cheap to clone (one shared object).
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    config: RuntimeConfig,
    instance_id: String,
    /// Numbers the job cgroups, made ahead or on the spawn path alike.
    next_job: Arc<AtomicU64>,
    spawner: Spawner,
    zygote: Mutex<Option<Zygote>>,
    cgroups: Pool<(Option<u64>, Option<u64>), JobCgroupHandle>,
    views: Pool<MountView, PreparedView>,
    netns: Pool<bool, std::os::fd::OwnedFd>,
    proxy: OnceLock<Box<dyn ProxyProvider>>,
    /// This machine's cgroups as the job cgroups use them (shared with the pool's maker).
    cgroup_host: Arc<CgroupHost>,
    /// Whether this process can make network namespaces, tried once.
    namespaces_usable: OnceLock<bool>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("config", &self.inner.config)
            .field("instance_id", &self.inner.instance_id)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    pub fn new(config: RuntimeConfig) -> Runtime {
        let instance_id = super::instance::new_id();
        let cgroup_owner = instance_id.clone();
        let next_job = Arc::new(AtomicU64::new(0));
        let cgroup_seq = Arc::clone(&next_job);
        let cgroup_host = Arc::new(CgroupHost::new());
        let pool_host = Arc::clone(&cgroup_host);
        Runtime {
            inner: Arc::new(Inner {
                config,
                next_job,
                spawner: Spawner::default(),
                zygote: Mutex::new(None),
                cgroups: Pool::new("cgroup-pool", move |kind| {
                    let name = job_cgroup_name(&cgroup_owner, &cgroup_seq);
                    make_cgroup(&pool_host, &name, kind).map_err(|e| e.to_string())
                }),
                views: Pool::new("view-pool", |view| {
                    crate::sandbox::launcher::mounts::prepare_view(view).map_err(|e| e.to_string())
                }),
                netns: Pool::new("netns-pool", |&loopback| {
                    crate::sandbox::launcher::netns::make_namespace(loopback)
                        .map_err(|e| e.to_string())
                }),
                proxy: OnceLock::new(),
                cgroup_host,
                namespaces_usable: OnceLock::new(),
                instance_id,
            }),
        }
    }

    pub fn config(&self) -> &RuntimeConfig {
        &self.inner.config
    }

    /// This server's instance id (see `instance`): the owner named in job cgroups and
    /// in the temp paths of jobs, scripts and installs.
    pub fn instance_id(&self) -> &str {
        &self.inner.instance_id
    }

    /// Register the network broker for proxy-mode jobs; `false` if one is registered
    /// already (it stays: one broker per runtime, which every app of a server shares).
    pub fn provide_proxy(&self, provider: Box<dyn ProxyProvider>) -> bool {
        self.inner.proxy.set(provider).is_ok()
    }

    pub fn has_proxy_provider(&self) -> bool {
        self.inner.proxy.get().is_some()
    }

    pub(super) fn proxy_provider(&self) -> Option<&dyn ProxyProvider> {
        self.inner.proxy.get().map(|p| p.as_ref())
    }

    /// Fork the zygote now, while this process is still single-threaded (the server,
    /// before its runtime starts): the first job then waits for no exec. Does nothing
    /// unless the route is [`Route::Zygote`] and the process has one thread.
    pub fn start_zygote_early(&self) {
        if self.inner.config.route == Route::Zygote {
            super::zygote::start_early(&self.inner.zygote);
        }
    }

    /// Remove the resources made ahead of need and stop making them, and whatever is
    /// left of this server's job cgroups: at the server's exit, after its jobs were killed.
    pub fn release_prepared(&self) {
        self.inner.cgroups.drain();
        self.inner.views.drain();
        self.inner.netns.drain();
        let left =
            super::isolation::remove_own_cgroups(&self.inner.cgroup_host, &self.inner.instance_id);
        if !left.is_empty() {
            tracing::debug!(count = left.len(), "removed job cgroups left at exit");
        }
    }

    pub(super) fn spawner(&self) -> &Spawner {
        &self.inner.spawner
    }

    pub(super) fn zygote(&self) -> &Mutex<Option<Zygote>> {
        &self.inner.zygote
    }

    /// A cgroup made ahead for jobs with these limits, if one is ready.
    pub(super) fn take_cgroup(&self, kind: &(Option<u64>, Option<u64>)) -> Option<JobCgroupHandle> {
        self.made_ahead()
            .then(|| self.inner.cgroups.take(kind))
            .flatten()
    }

    /// A fresh cgroup for one job, made now.
    pub(super) fn make_cgroup(
        &self,
        kind: &(Option<u64>, Option<u64>),
    ) -> Result<JobCgroupHandle, super::cgroup::CgroupError> {
        make_cgroup(
            &self.inner.cgroup_host,
            &job_cgroup_name(&self.inner.instance_id, &self.inner.next_job),
            kind,
        )
    }

    /// A view made ahead for `view`, if one is ready and still current.
    pub(super) fn take_view(&self, view: &MountView) -> Option<PreparedView> {
        self.made_ahead()
            .then(|| self.inner.views.take(view))
            .flatten()
            .filter(|prepared| prepared.is_current(view))
    }

    /// A network namespace made ahead (`lo` up if `loopback`), if one is ready.
    pub(super) fn take_netns(&self, loopback: bool) -> Option<std::os::fd::OwnedFd> {
        self.made_ahead()
            .then(|| self.inner.netns.take(&loopback))
            .flatten()
    }

    /// Kill and remove the job cgroups of `owners`, servers known to have ended (never
    /// this runtime's own); returns what was removed. At server start.
    pub fn sweep_cgroups_of(&self, owners: &[String]) -> Vec<PathBuf> {
        super::isolation::sweep_cgroups_of(&self.inner.cgroup_host, &self.inner.instance_id, owners)
    }

    /// Whether this process can make the broker's network namespaces (with CAP_SYS_ADMIN,
    /// or without it in a helper's user namespace: `netns::helper`): tried once, then
    /// remembered.
    pub fn namespaces_usable(&self) -> bool {
        *self
            .inner
            .namespaces_usable
            .get_or_init(super::netns::namespaces_usable)
    }

    fn made_ahead(&self) -> bool {
        self.inner.config.made_ahead
    }
}

/// `msr-<instance>-<n>`: the owner, for the sweep of what ended servers left.
fn job_cgroup_name(owner: &str, seq: &AtomicU64) -> String {
    format!(
        "{}{owner}-{}",
        super::cgroup::JOB_PREFIX,
        seq.fetch_add(1, Ordering::Relaxed)
    )
}

fn make_cgroup(
    host: &CgroupHost,
    name: &str,
    &(memory, processes): &(Option<u64>, Option<u64>),
) -> Result<JobCgroupHandle, super::cgroup::CgroupError> {
    JobCgroupHandle::create(host, name, memory, processes)
}
