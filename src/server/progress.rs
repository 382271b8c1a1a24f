//! Per-call context handed from a tool to the app: the request's cancellation token and,
//! when the client asked for it, MCP progress notifications as the app's progress sink.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::RequestContext;
use rmcp::{Peer, RoleServer};
use tokio_util::sync::CancellationToken;

use crate::app::{Call, ProgressSink};

/// Progress notifications on the request that asked for them.
struct McpProgress {
    peer: Peer<RoleServer>,
    token: ProgressToken,
}

impl ProgressSink for McpProgress {
    /// Errors are ignored (a client that went away must not fail the job).
    fn report(
        &self,
        amount: f64,
        message: String,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            let param =
                ProgressNotificationParam::new(self.token.clone(), amount).with_message(message);
            if let Err(e) = self.peer.notify_progress(param).await {
                tracing::debug!("progress notification not delivered: {e}");
            }
        })
    }
}

/// The app's view of one MCP request: its cancellation, the connection's (`closing`),
/// and progress if the client sent a progress token.
pub(crate) fn call_of(ctx: &RequestContext<RoleServer>, closing: &CancellationToken) -> Call {
    let progress = ctx.meta.get_progress_token().map(|token| {
        Arc::new(McpProgress {
            peer: ctx.peer.clone(),
            token,
        }) as Arc<dyn ProgressSink>
    });
    Call::new(ctx.ct.clone(), closing.clone(), progress)
}
