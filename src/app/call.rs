//! [`Call`]: what a long-running use case needs from whoever called it — the request's
//! cancellation, the connection's, and somewhere to report progress. The server builds
//! one from an MCP request; the app knows nothing of MCP.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::Mutex;
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
    /// Held while a report is sent, so two clones cannot send theirs out of order.
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
    /// one sent is nudged just above it, so amounts strictly increase. The amount is chosen
    /// and sent under one lock: clones reporting at once (an install's steps from their
    /// own task, the wait's heartbeats) are sent in the order their amounts were chosen.
    pub async fn progress(&self, amount: f64, message: impl Into<String>) {
        let Some(p) = &self.progress else {
            return;
        };
        let mut last = self.last.lock().await;
        let amount = if amount > *last {
            amount
        } else {
            *last + 0.001
        };
        *last = amount;
        p.report(amount, message.into()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Record(std::sync::Mutex<Vec<f64>>);

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
        let sink = Arc::new(Record(std::sync::Mutex::new(Vec::new())));
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

    /// A sink whose first report is held at a gate (a slow send), as a notification
    /// queued behind others is; it records amounts in the order they were delivered.
    struct Gated {
        gate: std::sync::Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
        seen: std::sync::Mutex<Vec<f64>>,
    }

    impl ProgressSink for Gated {
        fn report(
            &self,
            amount: f64,
            _message: String,
        ) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
            let gate = self.gate.lock().unwrap().take();
            Box::pin(async move {
                if let Some(gate) = gate {
                    let _ = gate.await;
                }
                self.seen.lock().unwrap().push(amount);
            })
        }
    }

    /// A heartbeat whose send is slow and an install step reported meanwhile from another
    /// task: the step waits for the heartbeat, so the client sees amounts in order (it
    /// once saw 1.0 then 0.5 on a loaded machine).
    #[tokio::test]
    async fn concurrent_reports_are_delivered_in_increasing_order() {
        let (open, gate) = tokio::sync::oneshot::channel();
        let sink = Arc::new(Gated {
            gate: std::sync::Mutex::new(Some(gate)),
            seen: std::sync::Mutex::new(Vec::new()),
        });
        let call = Call::new(
            CancellationToken::new(),
            CancellationToken::new(),
            Some(sink.clone()),
        );
        let beat = tokio::spawn({
            let call = call.clone();
            async move { call.progress(0.5, "beat").await }
        });
        // Let the heartbeat reach its (held) send before the step is reported.
        while sink.gate.lock().unwrap().is_some() {
            tokio::task::yield_now().await;
        }
        let step = tokio::spawn({
            let call = call.clone();
            async move { call.progress(1.0, "step").await }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        open.send(()).unwrap();
        beat.await.unwrap();
        step.await.unwrap();
        assert_eq!(*sink.seen.lock().unwrap(), vec![0.5, 1.0]);
    }
}
