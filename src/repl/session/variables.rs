//! Variable operations of a session: list, get, set, delete, clear. They run on the
//! worker's main thread between cells, so a session running a cell refuses them at once.

use super::Session;
use crate::repl::error::ReplError;
use crate::repl::info::VariablePage;
use crate::repl::protocol::{Event, Request};
use crate::repl::protocol::{VariableDetail, VariableInfo};
use crate::repl::worker::Reply;

use std::sync::atomic::Ordering;
use std::time::Instant;

impl Session {
    pub(super) async fn call(
        &self,
        request: impl FnOnce(u64) -> Request,
    ) -> Result<Event, ReplError> {
        let guard = self.acquire_short().await?;
        let (worker, _) = self.live_worker(false)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let rx = worker.call(id, &request(id), None, Some(Box::new(guard)));
        self.inner().last_active = Instant::now();
        match rx.await {
            Ok(Reply::Event(Event::Failed { message, .. })) => Err(ReplError::Python { message }),
            Ok(Reply::Event(ev)) => Ok(ev),
            Ok(Reply::Died(message)) => Err(ReplError::WorkerDied {
                message: message.to_string(),
            }),
            Err(_) => Err(ReplError::WorkerDied {
                message: "the Python worker's I/O task ended".into(),
            }),
        }
    }

    /// The user's variables (names not starting with `_`, modules left out): the first
    /// page of [`Session::variables_page`].
    pub async fn variables(&self) -> Result<Vec<VariableInfo>, ReplError> {
        Ok(self.variables_page(None, None).await?.variables)
    }

    /// The user's variables by name from the first `>= start`, at most `limit`.
    pub async fn variables_page(
        &self,
        start: Option<&str>,
        limit: Option<usize>,
    ) -> Result<VariablePage, ReplError> {
        let start = start.map(str::to_string);
        match self
            .call(|id| Request::ListVariables { id, start, limit })
            .await?
        {
            Event::Variables {
                variables,
                next,
                total,
                ..
            } => Ok(VariablePage {
                variables,
                next,
                total,
            }),
            other => Err(unexpected("variables", &other)),
        }
    }

    /// One variable in full: repr (cut at the session's repr limit) and JSON if possible.
    pub async fn get_variable(&self, name: &str) -> Result<VariableDetail, ReplError> {
        let repr_limit = self.env.repr_limit;
        match self
            .call(|id| Request::GetVariable {
                id,
                name: name.to_string(),
                repr_limit,
            })
            .await?
        {
            Event::Variable { detail, .. } => Ok(detail),
            other => Err(unexpected("variable", &other)),
        }
    }

    pub async fn set_variable(
        &self,
        name: &str,
        value: serde_json::Value,
    ) -> Result<(), ReplError> {
        self.call(|id| Request::SetVariable {
            id,
            name: name.to_string(),
            value,
        })
        .await
        .and_then(expect_ok)
    }

    pub async fn delete_variable(&self, name: &str) -> Result<(), ReplError> {
        self.call(|id| Request::DeleteVariable {
            id,
            name: name.to_string(),
        })
        .await
        .and_then(expect_ok)
    }

    /// Remove every variable (builtins stay).
    pub async fn clear_variables(&self) -> Result<(), ReplError> {
        self.call(|id| Request::ClearVariables { id })
            .await
            .and_then(expect_ok)
    }
}

fn expect_ok(ev: Event) -> Result<(), ReplError> {
    match ev {
        Event::Ok { .. } => Ok(()),
        other => Err(unexpected("ok", &other)),
    }
}

pub(super) fn unexpected(wanted: &str, got: &Event) -> ReplError {
    ReplError::Protocol {
        detail: format!("expected `{wanted}`, got {got:?}"),
    }
}
