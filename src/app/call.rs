//! [`Call`]: what a long-running use case needs from whoever called it — the request's
//! cancellation, the connection's, and somewhere to report progress. The server builds
//! one from an MCP request; the app knows nothing of MCP.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

/// Receives progress reports (the server forwards them as MCP notifications).
pub trait ProgressSink: Send + Sync {
    /// Report `amount` (strictly increasing) with a sentence; failures are the sink's to
    /// swallow (a caller that went away must not fail the job).
    fn report(&self, amount: f64, message: String)
    -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// The context of one call into the app.
#[derive(Clone)]
pub struct Call {
    /// Cancelled when the caller cancels this request.
    pub ct: CancellationToken,
    /// Cancelled when the connection is going away (stdin closed, server stopping):
    /// waits must end at once so shutdown is not held up by a long-poll.
    pub closing: CancellationToken,
    /// Where progress goes, if the caller asked for it.
    pub progress: Option<Arc<dyn ProgressSink>>,
}

impl Call {
    /// A context that is never cancelled and reports no progress (tests, internal calls).
    pub fn detached() -> Self {
        Call {
            ct: CancellationToken::new(),
            closing: CancellationToken::new(),
            progress: None,
        }
    }

    /// The same cancellation, no progress.
    pub fn quiet(&self) -> Self {
        Call {
            progress: None,
            ..self.clone()
        }
    }

    /// Send a progress report if the caller asked for them.
    pub async fn progress(&self, amount: f64, message: impl Into<String>) {
        if let Some(p) = &self.progress {
            p.report(amount, message.into()).await;
        }
    }
}
