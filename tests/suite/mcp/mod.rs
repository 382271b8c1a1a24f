//! The MCP protocol shape, in process: rmcp's own client and our server handler in one
//! process over a `tokio::io::duplex` pair (as rmcp's own tests do), the app built from
//! the binary's own flags. For what does not need a process: every tool's input and
//! output schema (`schemas`), bad arguments as -32602 and failures as `isError`
//! (`errors`), capabilities, resources, prompts and completions (`surface`).
//!
//! What does need the real binary — stdio framing, HTTP, signals, process behaviour — is
//! tested through it, with the official Python SDK (tests/mcp).

mod errors;
mod schemas;
mod surface;

use std::sync::Arc;
use std::time::Duration;

use mcp_sandbox_repl::app::App;
use rmcp::model::{CallToolRequestParams, CallToolResult, ErrorData, Tool};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::{ServiceExt, serve_server};
use serde_json::{Map, Value, json};

use crate::common::TempDir;

/// Every wait of a test is bounded by this: a guard against a hang, never a measure.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// A server handler over a fresh app (own workspace and state dir), and rmcp's client
/// connected to it over an in-memory duplex pipe, initialized.
pub(super) struct InProcess {
    pub(super) client: RunningService<RoleClient, ()>,
    app: Arc<App>,
    server: tokio::task::JoinHandle<()>,
    /// Removed after the app is shut down (`stop`).
    dir: TempDir,
}

impl InProcess {
    /// The server as `mcp-sandbox-repl --workspace <ws> --state-dir <state> <flags>` would
    /// run it over stdio, and a client that has completed `initialize`.
    pub(super) async fn start(flags: &[&str]) -> InProcess {
        use clap::Parser;
        let dir = TempDir::new("mcp-inproc");
        let ws = dir.join("ws");
        let state = dir.join("state");
        std::fs::create_dir_all(&ws).unwrap();
        let mut args: Vec<String> = vec!["mcp-sandbox-repl".into()];
        args.extend(["--workspace".into(), ws.display().to_string()]);
        args.extend(["--state-dir".into(), state.display().to_string()]);
        args.extend(flags.iter().map(|f| f.to_string()));
        let cli = mcp_sandbox_repl::cli::Cli::try_parse_from(&args).unwrap();
        let mut config = mcp_sandbox_repl::commands::serve::config(cli.serve, None).unwrap();
        // Sessions and shell jobs are started through the real binary's launcher mode
        // (this test binary has none): the suite's one runtime says so.
        config.app.sandbox = crate::common::runtime();
        let app = Arc::new(App::new(&config.app).unwrap());
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        let handler = mcp_sandbox_repl::server::testing::handler(app.clone());
        let server = tokio::spawn(async move {
            // The server side ends when the client goes away (`stop`).
            if let Ok(running) = serve_server(handler, server_io).await {
                let _ = running.waiting().await;
            }
        });
        let client = tokio::time::timeout(HANG_GUARD, ().serve(client_io))
            .await
            .expect("initialize did not complete")
            .expect("initialize failed");
        InProcess {
            client,
            app,
            server,
            dir,
        }
    }

    /// `tools/list`, every page.
    pub(super) async fn tools(&self) -> Vec<Tool> {
        guard(self.client.list_all_tools()).await.unwrap()
    }

    /// `tools/call` with `args` (a JSON object): the answer, or the JSON-RPC error.
    pub(super) async fn call(&self, tool: &str, args: Value) -> Result<CallToolResult, ErrorData> {
        let Value::Object(args) = args else {
            panic!("arguments must be an object: {args}")
        };
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(args);
        match guard(self.client.call_tool(params)).await {
            Ok(r) => Ok(r),
            Err(ServiceError::McpError(e)) => Err(e),
            Err(e) => panic!("{tool}: not an MCP answer: {e}"),
        }
    }

    /// A call whose arguments the tool cannot take: the JSON-RPC invalid-params error
    /// (-32602) the spec asks for; its message.
    pub(super) async fn invalid(&self, tool: &str, args: Value) -> String {
        match self.call(tool, args.clone()).await {
            Err(e) => {
                assert_eq!(e.code.0, -32602, "{tool}({args}): {e:?}");
                e.message.into_owned()
            }
            Ok(r) => panic!("{tool}({args}) answered instead of -32602: {r:?}"),
        }
    }

    /// Close the connection, end every worker and job of the app, remove the directories.
    pub(super) async fn stop(self) {
        let InProcess {
            client,
            app,
            server,
            dir,
        } = self;
        let _ = guard(client.cancel()).await;
        let _ = guard(server).await;
        guard(app.shutdown()).await;
        drop(dir);
    }
}

/// `fut`, bounded by the hang guard.
pub(super) async fn guard<F: std::future::IntoFuture>(fut: F) -> F::Output {
    tokio::time::timeout(HANG_GUARD, fut)
        .await
        .expect("no answer within the hang guard")
}

/// The text of an answer's text blocks, one per line.
pub(super) fn text_of(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A schema as a JSON value.
pub(super) fn schema_value(schema: &Map<String, Value>) -> Value {
    Value::Object(schema.clone())
}

/// `value` validates against `schema` (JSON Schema 2020-12), or the errors in words.
pub(super) fn validate(schema: &Map<String, Value>, value: &Value) -> Result<(), String> {
    let validator = jsonschema::draft202012::new(&schema_value(schema))
        .map_err(|e| format!("not a valid schema: {e}"))?;
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// The empty argument object.
pub(super) fn no_args() -> Value {
    json!({})
}
