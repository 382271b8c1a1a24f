//! [`Call`]: what a long-running use case needs from whoever called it — the request's
//! cancellation, the connection's, and somewhere to report progress. The server builds
//! one from an MCP request; the app knows nothing of MCP.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

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
    /// The last amount reported on this call (shared by its clones): amounts sent are
    /// kept strictly increasing, as MCP requires, when steps and heartbeats interleave.
    last: Arc<Mutex<f64>>,
}

impl Call {
    /// A call with this cancellation and, if given, a progress sink.
    pub fn new(
        ct: CancellationToken,
        closing: CancellationToken,
        progress: Option<Arc<dyn ProgressSink>>,
    ) -> Self {
        Call {
            ct,
            closing,
            progress,
            last: Arc::new(Mutex::new(f64::NEG_INFINITY)),
        }
    }

    /// A context that is never cancelled and reports no progress (tests, internal calls).
    pub fn detached() -> Self {
        Call::new(CancellationToken::new(), CancellationToken::new(), None)
    }

    /// The same cancellation, no progress.
    pub fn quiet(&self) -> Self {
        Call {
            progress: None,
            ..self.clone()
        }
    }

    /// Whether the caller asked for progress.
    pub fn wants_progress(&self) -> bool {
        self.progress.is_some()
    }

    /// Send a progress report if the caller asked for them. An amount not above the last
    /// one sent is nudged just above it, so amounts strictly increase.
    pub async fn progress(&self, amount: f64, message: impl Into<String>) {
        let Some(p) = &self.progress else {
            return;
        };
        let amount = {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            let next = if amount > *last {
                amount
            } else {
                *last + 0.001
            };
            *last = next;
            next
        };
        p.report(amount, message.into()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Record(Mutex<Vec<f64>>);

    impl ProgressSink for Record {
        fn report(
            &self,
            amount: f64,
            _message: String,
        ) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
            self.0.lock().unwrap().push(amount);
            Box::pin(async {})
        }
    }

    #[tokio::test]
    async fn amounts_strictly_increase_across_clones() {
        let sink = Arc::new(Record(Mutex::new(Vec::new())));
        let call = Call::new(
            CancellationToken::new(),
            CancellationToken::new(),
            Some(sink.clone()),
        );
        let other = call.clone();
        call.progress(1.0, "step").await;
        other.progress(0.5, "beat").await;
        call.progress(1.0, "again").await;
        other.progress(3.0, "step").await;
        let seen = sink.0.lock().unwrap().clone();
        assert!(seen.windows(2).all(|w| w[1] > w[0]), "{seen:?}");
        assert_eq!(seen[3], 3.0);
        assert!(!Call::detached().wants_progress());
    }
}
