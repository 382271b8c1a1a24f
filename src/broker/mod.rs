//! The network broker: code that needs the network gets it only through the server.
//!
//! A job whose policy has `network.mode = "proxy"` runs in its own empty network
//! namespace. The broker makes that namespace (`sandbox::netns::namespace_with_listener`),
//! whose only listener, on 127.0.0.1 there, is this module's HTTP/HTTPS forward proxy
//! (CONNECT for TLS, absolute URIs for plain HTTP), served from the server's own tokio
//! runtime and namespace. It resolves names itself, connects only to hosts and ports the
//! job's allow list names (and to loopback/private addresses only when an entry names
//! the address or `localhost` itself), chains to the server's upstream proxy with its
//! credentials, and answers anything else with 403 and a line in the job's denials.
//!
//! - [`Broker`]: the [`ProxyProvider`] registered with the sandbox ([`install`]).
//! - `conn`: one client connection (parse with httparse, bounded head, one task each).
//! - `upstream`: the server's proxy settings and index credentials (never the job's).
//!
//! Layering: below `app`, above `sandbox` (it uses the sandbox's namespace and allow-list
//! code; the sandbox reaches it only through the `ProxyProvider` trait).

mod conn;
pub mod upstream;

use std::sync::{Arc, Mutex};

use tokio::task::JoinSet;

use crate::sandbox::allow::AllowEntry;
use crate::sandbox::netns::namespace_with_listener;
use crate::sandbox::proxy::{Denials, ProxyError, ProxyNetwork, ProxyProvider};
pub use upstream::Upstream;

/// Most denial lines kept per job.
const MAX_DENIALS: usize = 32;

/// What one job's broker enforces.
pub(crate) struct Rules {
    pub policy: String,
    pub allow: Vec<AllowEntry>,
    pub denials: Denials,
    pub upstream: Arc<Upstream>,
}

impl Rules {
    /// The first entry allowing `host:port`.
    pub fn entry_for(&self, host: &str, port: u16) -> Option<&AllowEntry> {
        self.allow.iter().find(|e| e.matches(host, port))
    }

    /// The words for a refused connection; also recorded in the job's denials.
    pub fn deny(&self, host: &str, port: u16, why: Option<&str>) -> String {
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
        tracing::info!("{line}");
        let mut d = self.denials.lock().unwrap_or_else(|p| p.into_inner());
        if d.len() < MAX_DENIALS && !d.contains(&line) {
            d.push(line.clone());
        }
        line
    }
}

/// Starts one broker per proxy-mode job, on the runtime it was installed from.
pub struct Broker {
    runtime: tokio::runtime::Handle,
    upstream: Arc<Upstream>,
}

impl Broker {
    pub fn new(runtime: tokio::runtime::Handle, upstream: Upstream) -> Broker {
        Broker {
            runtime,
            upstream: Arc::new(upstream),
        }
    }
}

/// Register a broker (upstream settings from this process's environment) with the
/// sandbox, serving from the current tokio runtime. Call once at server start; without
/// a runtime nothing is registered and proxy-mode jobs fail closed.
pub fn install() {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            let upstream = Upstream::from_env(std::env::vars());
            crate::sandbox::proxy::set_proxy_provider(Box::new(Broker::new(rt, upstream)));
        }
        Err(_) => tracing::warn!("no tokio runtime: the network broker is not available"),
    }
}

/// Aborts a job's accept loop (and with it every connection task) when dropped.
struct StopOnDrop(tokio::task::AbortHandle);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl ProxyProvider for Broker {
    fn start(&self, policy: &str, allow: &[String]) -> Result<ProxyNetwork, ProxyError> {
        let allow = allow
            .iter()
            .map(|a| AllowEntry::parse(a))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ProxyError::Broker(Box::new(e)))?;
        let ns = namespace_with_listener()?;
        let port = ns
            .listener
            .local_addr()
            .map_err(|e| ProxyError::Broker(Box::new(e)))?
            .port();
        ns.listener
            .set_nonblocking(true)
            .map_err(|e| ProxyError::Broker(Box::new(e)))?;
        // The runtime of the caller if it has one (tests run several), else the server's.
        let runtime =
            tokio::runtime::Handle::try_current().unwrap_or_else(|_| self.runtime.clone());
        let listener = {
            let _enter = runtime.enter();
            tokio::net::TcpListener::from_std(ns.listener)
                .map_err(|e| ProxyError::Broker(Box::new(e)))?
        };
        let denials: Denials = Arc::new(Mutex::new(Vec::new()));
        let rules = Arc::new(Rules {
            policy: policy.to_string(),
            allow,
            denials: denials.clone(),
            upstream: self.upstream.clone(),
        });
        let task = runtime.spawn(accept_loop(listener, rules));
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
            guard: Box::new(StopOnDrop(task.abort_handle())),
        })
    }
}

/// Accept until aborted; one task per connection, all aborted with the loop.
async fn accept_loop(listener: tokio::net::TcpListener, rules: Arc<Rules>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    conns.spawn(conn::serve(stream, rules.clone()));
                }
                Err(e) => {
                    tracing::debug!("broker accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

#[cfg(test)]
mod tests;
