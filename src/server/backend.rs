//! The glue between MCP tools and the subsystems (sessions, job store). PLACEHOLDER until
//! the repl and jobs subsystems land: every call answers with a clear "not available" error.

use std::time::Duration;

use rmcp::model::CallToolResult;
use serde_json::Value;

use super::progress::CallCtx;
use super::tools::ToolError;
use super::tools::jobs::{KindFilter, OutputArgs, PruneArgs, StatusFilter};
use super::tools::python::VarAction;
use super::tools::shell::ShellArgs;

type R = Result<CallToolResult, ToolError>;

fn pending() -> R {
    Err(ToolError(
        "this server build has no Python/job backend yet".into(),
    ))
}

pub struct Backend {}

impl Backend {
    pub fn new() -> Self {
        Backend {}
    }
    pub async fn python_exec(&self, _s: &str, _code: String, _w: Duration, _c: &CallCtx) -> R {
        pending()
    }
    pub async fn python_run_file(
        &self,
        _s: &str,
        _p: &str,
        _a: Vec<String>,
        _w: Duration,
        _c: &CallCtx,
    ) -> R {
        pending()
    }
    pub async fn python_interrupt(&self, _s: &str) -> R {
        pending()
    }
    pub async fn python_vars(
        &self,
        _s: &str,
        _a: VarAction,
        _n: Option<&str>,
        _v: Option<Value>,
    ) -> R {
        pending()
    }
    pub async fn python_history(&self, _s: &str, _l: Option<usize>) -> R {
        pending()
    }
    pub async fn session_list(&self) -> R {
        pending()
    }
    pub async fn session_restart(&self, _s: &str) -> R {
        pending()
    }
    pub async fn session_close(&self, _s: &str) -> R {
        pending()
    }
    pub async fn job_wait(&self, _id: &str, _t: Duration, _u: bool, _c: &CallCtx) -> R {
        pending()
    }
    pub async fn job_input(&self, _id: &str, _t: &str, _e: bool, _w: Duration, _c: &CallCtx) -> R {
        pending()
    }
    pub async fn job_cancel(&self, _id: &str) -> R {
        pending()
    }
    pub fn job_list(
        &self,
        _s: Option<StatusFilter>,
        _k: Option<KindFilter>,
        _se: Option<&str>,
    ) -> R {
        pending()
    }
    pub fn job_output(&self, _a: OutputArgs) -> R {
        pending()
    }
    pub fn job_prune(&self, _a: PruneArgs) -> R {
        pending()
    }
    pub async fn shell_run(&self, _a: ShellArgs, _w: Duration, _c: &CallCtx) -> R {
        pending()
    }
    pub async fn shutdown(&self) {}
}
