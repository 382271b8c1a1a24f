//! The seam between the launcher and the server's network broker (`crate::broker`, a
//! layer above): a job whose policy says `network.mode = "proxy"` gets a fresh network
//! namespace from the registered [`ProxyProvider`], whose only listener is the broker's
//! proxy. [`SandboxCommand::spawn`](super::SandboxCommand::spawn) asks the provider, hands
//! the namespace to the launcher (which `setns`es into it) and keeps the provider's
//! guard alive exactly as long as the [`SandboxedChild`](super::SandboxedChild).
//!
//! Without a registered provider a proxy-mode spawn fails closed.

use std::any::Any;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, OnceLock};

/// Denial lines of one job's broker ("blocked by policy P: connection to h:443 ...").
pub type Denials = Arc<Mutex<Vec<String>>>;

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
    pub guard: Box<dyn Any + Send + Sync>,
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
    Namespace(#[from] super::netns::NetnsError),
    #[error("cannot start the job's network broker: {0}")]
    Broker(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Starts one broker per job. Implemented by `crate::broker`, registered at start.
pub trait ProxyProvider: Send + Sync {
    /// A fresh namespace and broker for a job of `policy` allowed to reach `allow`.
    fn start(&self, policy: &str, allow: &[String]) -> Result<ProxyNetwork, ProxyError>;
}

static PROVIDER: OnceLock<Box<dyn ProxyProvider>> = OnceLock::new();

/// Register the broker; the first call wins.
pub fn set_proxy_provider(provider: Box<dyn ProxyProvider>) {
    let _ = PROVIDER.set(provider);
}

/// Start a proxy network for one job, or say why not.
pub(crate) fn start_proxy(policy: &str, allow: &[String]) -> Result<ProxyNetwork, ProxyError> {
    match PROVIDER.get() {
        Some(p) => p.start(policy, allow),
        None => Err(ProxyError::NoBroker {
            policy: policy.to_string(),
        }),
    }
}

/// Held by a [`SandboxedChild`](super::SandboxedChild): the broker lives while it does.
pub struct ProxyGuard {
    pub denials: Denials,
    _guard: Box<dyn Any + Send + Sync>,
}

impl ProxyGuard {
    pub(crate) fn new(denials: Denials, guard: Box<dyn Any + Send + Sync>) -> Self {
        ProxyGuard {
            denials,
            _guard: guard,
        }
    }
}
