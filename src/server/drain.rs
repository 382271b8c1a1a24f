//! Signals and the drain: SIGINT stops the server at once; SIGTERM too over stdio, but
//! over HTTP (a cell an orchestrator replaces) it first drains every app of the server:
//! `/readyz` answers 503, new jobs are refused in words, running jobs get up to
//! `--drain-seconds` to end; a SIGINT or a second SIGTERM cuts it short. Then `shutdown`
//! is cancelled and the app kills what is left, as without a drain.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::tenants;
use crate::app::App;

/// What a SIGTERM drains (HTTP): every app of the server, for up to `window`.
pub(super) struct Drain {
    pub window: std::time::Duration,
    pub app: Arc<App>,
    pub tenants: Option<Arc<tenants::Tenants>>,
}

impl Drain {
    /// Jobs of any app of the server not finished yet.
    fn unfinished(&self) -> usize {
        let principals = self.tenants.iter().flat_map(|t| t.apps());
        std::iter::once(self.app.clone())
            .chain(principals)
            .map(|a| a.unfinished_jobs())
            .sum()
    }

    /// Returns once no job of any app is unfinished. Polled: a drain lasts seconds, and
    /// the job tables of principals made during it are counted too.
    async fn idle(&self) {
        const POLL: std::time::Duration = std::time::Duration::from_millis(100);
        while self.unfinished() > 0 {
            tokio::time::sleep(POLL).await;
        }
    }
}

/// SIGINT cancels `shutdown` at once; so does SIGTERM without a `drain`. With one, the
/// first SIGTERM starts a drain: `/readyz` answers 503 and new jobs are refused in words
/// at once, running jobs get up to its window to end; then (or at a SIGINT or a second
/// SIGTERM) `shutdown` is cancelled, the transport returns and the app kills what is left.
/// The handlers are installed before this returns.
pub(super) fn spawn_signal_watch(shutdown: CancellationToken, drain: Option<Drain>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!(
            "cannot install signal handlers; SIGTERM will kill the server without cleanup"
        );
        return;
    };
    tokio::spawn(async move {
        let drain = tokio::select! {
            _ = term.recv() => match drain.filter(|d| !d.window.is_zero()) {
                Some(d) => d,
                None => {
                    tracing::info!("SIGTERM: shutting down");
                    shutdown.cancel();
                    return;
                }
            },
            _ = int.recv() => {
                tracing::info!("SIGINT: shutting down");
                shutdown.cancel();
                return;
            }
            _ = shutdown.cancelled() => return,
        };
        drain.app.lifecycle().begin_drain();
        let secs = drain.window.as_secs_f64();
        tracing::info!(
            "SIGTERM: draining: /readyz answers 503 and new jobs are refused; {} running job(s) get up to {secs} s to finish (SIGINT or another SIGTERM stops now)",
            drain.unfinished()
        );
        tokio::select! {
            _ = drain.idle() => tracing::info!("drained: no job is running; shutting down"),
            _ = tokio::time::sleep(drain.window) => tracing::info!(
                "drain over after {secs} s: stopping {} job(s) still running",
                drain.unfinished()
            ),
            _ = term.recv() => tracing::info!("second SIGTERM: shutting down now"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down now"),
            _ = shutdown.cancelled() => {}
        }
        shutdown.cancel();
    });
}
