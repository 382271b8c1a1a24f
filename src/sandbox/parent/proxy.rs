//! The seam between the launcher and the server's network broker (`crate::broker`, a
//! layer above): a job whose policy says `network.mode = "proxy"` gets a fresh network
//! namespace from the registered [`ProxyProvider`], whose only listener is the broker's
//! proxy. [`SandboxCommand::spawn`](super::SandboxCommand::spawn) asks the provider, hands
//! the namespace to the launcher (which `setns`es into it) and keeps the provider's
//! guard alive exactly as long as the [`SandboxedChild`](super::SandboxedChild).
//!
//! Without a registered provider a proxy-mode spawn fails closed.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

/// Denial lines of one job's broker ("blocked by policy P: connection to h:443 ...").
pub(crate) type Denials = Arc<Mutex<Vec<String>>>;

/// What a provider hands back for one job.
pub struct ProxyNetwork {
    /// The job's network namespace (`/proc/thread-self/ns/net` of the thread that made it).
    pub netns: OwnedFd,
    /// The broker's port on 127.0.0.1 inside that namespace.
    pub port: u16,
    /// Variables the job gets (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, lowercase too).
    pub env: Vec<(String, String)>,
    /// Where the broker writes what it refused.
    pub denials: Denials,
    /// Dropped when the job's child handle is: stops the broker and frees the namespace.
    pub job: Box<dyn ProxyJob>,
}

/// What a job asks of its broker.
#[derive(Debug, Clone, Copy)]
pub struct ProxyRequest<'a> {
    /// The policy's name, for the broker's words.
    pub policy: &'a str,
    /// Hosts the broker may connect to (entries of `sandbox::allow`).
    pub allow: &'a [String],
    /// Whether the process the launcher execs (that process alone, not its children) is
    /// the server's own trusted client, to which the broker may lend the server's
    /// credentials (it decides which requests qualify). The broker is told its pid once
    /// it runs ([`ProxyJob::target_started`]).
    pub trust_target: bool,
}

/// One job's broker, as the sandbox holds it: dropped with the job's child handle,
/// which stops the broker.
pub trait ProxyJob: Send + Sync {
    /// The launcher exec'd the job's target: `pid` is that process as the server sees
    /// it. Called only when the request asked for `trust_target`.
    fn target_started(&self, pid: u32);
}

/// Why a provider could not set up a job's network.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error(
        "policy {policy} has network mode \"proxy\", but this program runs no network broker \
         (only the server does); use mode \"none\" here"
    )]
    NoBroker { policy: String },
    #[error("cannot set up the job's network broker: {0}")]
    Namespace(#[from] crate::sandbox::launcher::netns::NetnsError),
    #[error("cannot start the job's network broker: {0}")]
    Broker(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Starts one broker per job. Implemented by `crate::broker`, registered with the
/// runtime at start ([`Runtime::provide_proxy`](super::runtime::Runtime::provide_proxy)).
pub trait ProxyProvider: Send + Sync {
    /// A fresh namespace and broker for one job.
    fn start(&self, request: &ProxyRequest<'_>) -> Result<ProxyNetwork, ProxyError>;
}

/// Held by a [`SandboxedChild`](super::SandboxedChild): the broker lives while it does.
pub(crate) struct ProxyGuard {
    pub denials: Denials,
    _job: Box<dyn ProxyJob>,
}

impl ProxyGuard {
    pub(crate) fn new(denials: Denials, job: Box<dyn ProxyJob>) -> Self {
        ProxyGuard { denials, _job: job }
    }
}
