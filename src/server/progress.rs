//! Per-call context handed from a tool to the backend: the request's cancellation token and,
//! when the client asked for it, a channel for MCP progress notifications.

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::RequestContext;
use rmcp::{Peer, RoleServer};
use tokio_util::sync::CancellationToken;

/// What a long-running tool call needs from MCP while it waits on a job.
#[derive(Clone)]
pub struct CallCtx {
    /// Cancelled when the client sends `notifications/cancelled` for this request.
    pub ct: CancellationToken,
    /// Cancelled when the connection is going away (stdin closed, server stopping):
    /// waits must end at once so shutdown is not held up by a long-poll.
    pub closing: CancellationToken,
    progress: Option<(Peer<RoleServer>, ProgressToken)>,
}

impl CallCtx {
    pub fn from_request(ctx: &RequestContext<RoleServer>, closing: &CancellationToken) -> Self {
        let progress = ctx.meta.get_progress_token().map(|t| (ctx.peer.clone(), t));
        CallCtx {
            ct: ctx.ct.clone(),
            closing: closing.clone(),
            progress,
        }
    }

    /// A context that is never cancelled and reports no progress (tests, internal calls).
    pub fn detached() -> Self {
        CallCtx {
            ct: CancellationToken::new(),
            closing: CancellationToken::new(),
            progress: None,
        }
    }

    /// Send a progress notification if the client asked for them; errors are ignored
    /// (a client that went away must not fail the job).
    pub async fn progress(&self, amount: f64, message: impl Into<String>) {
        if let Some((peer, token)) = &self.progress {
            let param =
                ProgressNotificationParam::new(token.clone(), amount).with_message(message.into());
            if let Err(e) = peer.notify_progress(param).await {
                tracing::debug!("progress notification not delivered: {e}");
            }
        }
    }
}
