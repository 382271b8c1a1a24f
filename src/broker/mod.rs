//! The network broker: code that needs the network gets it only through the server.
//!
//! A job whose policy has `network.mode = "proxy"` runs in its own empty network
//! namespace. The broker makes that namespace (`sandbox::parent::netns::namespace_with_listener`),
//! whose only listener, on 127.0.0.1 there, is this module's HTTP/HTTPS forward proxy
//! (CONNECT for TLS, absolute URIs for plain HTTP), served from the server's own tokio
//! runtime and namespace. It resolves names itself, connects only to hosts and ports the
//! job's allow list names (and to loopback/private addresses only when an entry names
//! the address or `localhost` itself), chains to the server's upstream proxy with its
//! credentials, and answers anything else with 403 and a line in the job's denials.
//!
//! Budgets: every connection holds up to two of the server's descriptors, so a job may
//! hold at most [`Limits::per_job`] connections and all jobs together
//! [`Limits::total`]; one over either is answered at once (429 / 503, in words, and a
//! line in the job's denials). A connection must send its head within
//! [`Limits::head_timeout`], and a relay (tunnel or forwarded request) that moves no
//! byte either way for [`Limits::idle_timeout`] is closed.
//!
//! Index credentials are lent only to the installer's own reads of its index: a GET or
//! HEAD under the index URL's path, on a connection held by the process the sandbox
//! marked as trusted (`uv` itself; see `peer`), never by its build hooks or anything
//! else of the job. Anything else to that host goes without them.
//!
//! - [`Broker`]: the [`ProxyProvider`] registered with the sandbox ([`install`]).
//! - `conn`: one client connection (parse with httparse, bounded head, one task each).
//! - `peer`: which process of the job holds a connection (its socket in /proc).
//! - `upstream`: the server's proxy settings and index credentials (never the job's).
//!
//! Layering: below `app`, above `sandbox` (it uses the sandbox's namespace and allow-list
//! code; the sandbox reaches it only through the `ProxyProvider` trait).

mod conn;
mod peer;
pub(crate) mod upstream;

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::task::JoinSet;

use crate::sandbox::parent::netns::namespace_with_listener;
use crate::sandbox::parent::proxy::{
    Denials, ProxyError, ProxyJob, ProxyNetwork, ProxyProvider, ProxyRequest,
};
use crate::sandbox::policy::allow::AllowEntry;
pub use upstream::Upstream;

/// Most denial lines kept per job.
const MAX_DENIALS: usize = 32;

/// Connections one job may hold through its broker at once.
pub const MAX_CONNECTIONS_PER_JOB: usize = 128;
/// Connections all brokers of the server may hold at once (fewer when the server's
/// open-file limit is low: see [`Limits::for_open_files`]).
pub const MAX_CONNECTIONS_TOTAL: usize = 1024;
/// How long a client may take to send its complete request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a tunnel or forwarded request may move no byte either way.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// The broker's budgets (constants, scaled down to the server's open-file limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub per_job: usize,
    pub total: usize,
    pub head_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Limits {
    /// The budgets for a server that may hold `open_files` descriptors: every
    /// connection holds up to two, and the brokers together may take at most half of
    /// them (the rest is for sessions, jobs and the transport); one job at most half of
    /// that, so one job never takes the whole budget.
    pub fn for_open_files(open_files: u64) -> Limits {
        let fds = usize::try_from(open_files).unwrap_or(usize::MAX);
        let total = MAX_CONNECTIONS_TOTAL.min(fds / 4).max(2);
        Limits {
            per_job: MAX_CONNECTIONS_PER_JOB.min(total / 2),
            total,
            head_timeout: HEAD_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
        }
    }
}

/// What all brokers of the server share: the limits and the connections open now.
pub(crate) struct Budget {
    pub limits: Limits,
    open: AtomicUsize,
}

impl Budget {
    pub(crate) fn new(limits: Limits) -> Budget {
        Budget {
            limits,
            open: AtomicUsize::new(0),
        }
    }
}

/// One admitted connection; gives its place back to the job and the server when dropped.
pub(crate) struct Permit(Arc<Rules>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        self.0.budget.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Take one from `counter` if it is below `max`.
fn take(counter: &AtomicUsize, max: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .is_ok()
}

/// The process of the job that may borrow the server's index credentials.
pub(crate) struct Trusted {
    /// Its pid as the server sees it, once it runs.
    pub pid: OnceLock<u32>,
    /// The job's network namespace (device, inode): the pid must still live there.
    pub netns: (u64, u64),
}

/// What one job's broker enforces.
pub(crate) struct Rules {
    pub policy: String,
    pub allow: Vec<AllowEntry>,
    pub denials: Denials,
    pub upstream: Arc<Upstream>,
    /// The listener's port (on 127.0.0.1 of the job's namespace).
    pub port: u16,
    pub budget: Arc<Budget>,
    /// Connections of this job open now.
    pub open: AtomicUsize,
    /// The trusted process, for a job that asked for one (the installer).
    pub trusted: Option<Trusted>,
}

impl Rules {
    /// The first entry allowing `host:port`.
    pub(crate) fn entry_for(&self, host: &str, port: u16) -> Option<&AllowEntry> {
        self.allow.iter().find(|e| e.matches(host, port))
    }

    /// Record `line` in the job's denials (once) and the log.
    pub(crate) fn note(&self, line: &str) {
        tracing::info!("{line}");
        let mut d = self.denials.lock().unwrap_or_else(|p| p.into_inner());
        if d.len() < MAX_DENIALS && !d.iter().any(|l| l == line) {
            d.push(line.to_string());
        }
    }

    /// The words for a refused connection; also recorded in the job's denials.
    pub(crate) fn deny(&self, host: &str, port: u16, why: Option<&str>) -> String {
        let allowed = if self.allow.is_empty() {
            "none".to_string()
        } else {
            self.allow
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let target = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let line = match why {
            Some(why) => format!(
                "blocked by policy {}: connection to {target}: {why} (allowed: {allowed})",
                self.policy
            ),
            None => format!(
                "blocked by policy {}: connection to {target} (allowed: {allowed})",
                self.policy
            ),
        };
        self.note(&line);
        line
    }

    /// Admit one more connection of this job, or say (in words, also in the job's
    /// denials) which budget it is over.
    pub(crate) fn admit(self: &Arc<Self>) -> Result<Permit, conn::Refusal> {
        let limits = &self.budget.limits;
        if !take(&self.open, limits.per_job) {
            let line = format!(
                "blocked by the network broker's budget: this job already holds {} connections \
                 through the broker, the most one job may hold; further ones are refused until \
                 some close",
                limits.per_job
            );
            self.note(&line);
            return Err(conn::refuse(429, "Too Many Requests", line));
        }
        if !take(&self.budget.open, limits.total) {
            self.open.fetch_sub(1, Ordering::AcqRel);
            let line = format!(
                "blocked by the network broker's budget: the server's brokers hold {} \
                 connections, the most all jobs together may hold; try again later",
                limits.total
            );
            self.note(&line);
            return Err(conn::refuse(503, "Service Unavailable", line));
        }
        Ok(Permit(self.clone()))
    }
}

/// Starts one broker per proxy-mode job, on the runtime it was installed from.
pub struct Broker {
    runtime: tokio::runtime::Handle,
    upstream: Arc<Upstream>,
    budget: Arc<Budget>,
}

impl Broker {
    pub fn new(runtime: tokio::runtime::Handle, upstream: Upstream, limits: Limits) -> Broker {
        Broker {
            runtime,
            upstream: Arc::new(upstream),
            budget: Arc::new(Budget::new(limits)),
        }
    }
}

/// Register a broker (upstream settings from this process's environment, budgets from
/// its open-file limit) with the sandbox, serving from the current tokio runtime. Call
/// once at server start; without a runtime nothing is registered and proxy-mode jobs
/// fail closed.
pub fn install(sandbox: &crate::sandbox::Runtime) {
    if sandbox.has_proxy_provider() {
        return; // one broker per process (a principal's app made later shares it)
    }
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            let upstream = Upstream::from_env(std::env::vars());
            let open_files = crate::sandbox::launcher::rlimits::open_files_limit().0;
            let limits = Limits::for_open_files(open_files);
            tracing::info!(
                "network broker: at most {} connections per job and {} in all (open-file limit {open_files})",
                limits.per_job,
                limits.total
            );
            sandbox.provide_proxy(Box::new(Broker::new(rt, upstream, limits)));
        }
        Err(_) => tracing::warn!("no tokio runtime: the network broker is not available"),
    }
}

/// One job's broker as the sandbox holds it: aborts the accept loop (and with it every
/// connection task) when dropped; learns the trusted process's pid.
struct JobBroker {
    stop: tokio::task::AbortHandle,
    rules: Arc<Rules>,
}

impl ProxyJob for JobBroker {
    fn target_started(&self, pid: u32) {
        if let Some(t) = &self.rules.trusted {
            let _ = t.pid.set(pid);
        }
    }
}

impl Drop for JobBroker {
    fn drop(&mut self) {
        self.stop.abort();
    }
}

impl ProxyProvider for Broker {
    fn start(&self, request: &ProxyRequest<'_>) -> Result<ProxyNetwork, ProxyError> {
        let broker_err = |e: std::io::Error| ProxyError::Broker(Box::new(e));
        let allow = request
            .allow
            .iter()
            .map(|a| AllowEntry::parse(a))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ProxyError::Broker(Box::new(e)))?;
        let ns = namespace_with_listener()?;
        let port = ns.listener.local_addr().map_err(broker_err)?.port();
        ns.listener.set_nonblocking(true).map_err(broker_err)?;
        // Credentials are only ever lent to a trusted process; without any to lend,
        // nobody needs finding.
        let trusted = if request.trust_target && !self.upstream.index_auth.is_empty() {
            let st = nix::sys::stat::fstat(ns.netns.as_fd())
                .map_err(|e| broker_err(std::io::Error::from(e)))?;
            Some(Trusted {
                pid: OnceLock::new(),
                netns: (st.st_dev, st.st_ino),
            })
        } else {
            None
        };
        // The runtime of the caller if it has one (tests run several), else the server's.
        let runtime =
            tokio::runtime::Handle::try_current().unwrap_or_else(|_| self.runtime.clone());
        let listener = {
            let _enter = runtime.enter();
            tokio::net::TcpListener::from_std(ns.listener).map_err(broker_err)?
        };
        let denials: Denials = Arc::new(Mutex::new(Vec::new()));
        let rules = Arc::new(Rules {
            policy: request.policy.to_string(),
            allow,
            denials: denials.clone(),
            upstream: self.upstream.clone(),
            port,
            budget: self.budget.clone(),
            open: AtomicUsize::new(0),
            trusted,
        });
        let task = runtime.spawn(accept_loop(listener, rules.clone()));
        let url = format!("http://127.0.0.1:{port}");
        let env = ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"]
            .iter()
            .flat_map(|k| {
                [
                    (k.to_string(), url.clone()),
                    (k.to_lowercase(), url.clone()),
                ]
            })
            .collect();
        Ok(ProxyNetwork {
            netns: ns.netns,
            port,
            env,
            denials,
            job: Box::new(JobBroker {
                stop: task.abort_handle(),
                rules,
            }),
        })
    }
}

/// Accept until aborted; one task per connection, all aborted with the loop. A
/// connection over the budget is answered (in words) and closed at once.
async fn accept_loop(listener: tokio::net::TcpListener, rules: Arc<Rules>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match rules.admit() {
                    Ok(permit) => {
                        conns.spawn(conn::serve(stream, peer, rules.clone(), permit));
                    }
                    Err(refusal) => {
                        conns.spawn(conn::answer(stream, refusal));
                    }
                },
                Err(e) => {
                    // Out of descriptors (or another transient failure): the connection
                    // waits in the backlog; try again a little later.
                    tracing::debug!("broker accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

#[cfg(test)]
mod tests;
