//! The MCP handler: one [`SandboxServer`] per client connection, all sharing one
//! [`App`] (sessions, job store). Routes tool calls, answers `tools/list`, and turns
//! malformed tool arguments and unknown tools into JSON-RPC invalid-params errors
//! (-32602) that name the field. A job that outlives its call's window becomes an MCP
//! task when the client declares the tasks extension ([`super::tasks`]).

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
    CompleteRequestParams, CompleteResult, ContentBlock, CustomNotification, CustomRequest,
    CustomResult, ErrorCode, Extensions, GetTaskParams, GetTaskResult, Implementation,
    InitializeRequestParams, InitializeResult, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ServerCapabilities, ServerConfig, SubscribeRequestParams, Tool,
    UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};

use tokio_util::sync::CancellationToken;

use super::client_state::{self, ClientLink};
use super::resources::{self, Subscriptions};
use super::tasks::{TASK_TOOLS, TaskBook};
use super::tenants::Tenants;
use super::tools::all_tools;
use super::transport::sessions::Principal;
use crate::app::App;

const INSTRUCTIONS: &str = "\
Sandboxed Python REPL and shell jobs. Every process runs under the server's sandbox policy \
(file-system, network, memory and process limits).
Async model: python_exec, python_run_file and shell_run wait a few seconds; if the work is not \
done they return status \"running\" and a job_id. Then call job_wait(job_id) — it blocks until \
new output, an input request or completion, so never sleep between calls. Status \
\"awaiting_input\" means the code called input(), getpass or read sys.stdin: answer with \
job_input (eof: true ends the input). Stop work with job_cancel or python_interrupt. Every \
answer fits one 20 KB budget: a part over its share shows a head and a tail and names the \
bytes left out; read them with job_output (stdout, stderr, or stream \"result\" for a whole \
value, traceback or display item; image=N for images held back). Sessions are named \
(default \"default\") and independent.";

#[derive(Clone)]
pub(crate) struct SandboxServer {
    /// The app the tools call: the server's own, or (a tokens file) the app of the
    /// principal this request was authenticated as (see [`SandboxServer::app_for`]).
    pub(crate) app: Arc<App>,
    /// The principals of a tokens file, if the server has one.
    tenants: Option<Arc<Tenants>>,
    /// The principal's app this connection's first request was bound to (an MCP session
    /// belongs to one principal: the transport refuses it to any other).
    bound: Arc<std::sync::OnceLock<Arc<App>>>,
    /// Cancelled when this connection goes away; long waits of its tool calls end then.
    pub(crate) closing: CancellationToken,
    /// Roots and what the agent was told of the sandbox ([`client_state`]).
    link: Arc<ClientLink>,
    /// This connection's resource subscriptions ([`resources`]).
    subscriptions: Arc<Subscriptions>,
    /// The MCP tasks of every app ([`super::tasks`]): not this connection's, so a task
    /// resolves from any later request.
    tasks: Arc<TaskBook>,
    /// Shared by every clone; its drop ends what the connection started.
    _end: Arc<ConnectionEnd>,
}

/// What a connection started that would outlive it: dropped with the last handle of its
/// [`SandboxServer`] (rmcp drops the service when the session ends — the client's DELETE,
/// the idle or handshake timeout, stdin closing), it cancels `closing` (tool calls still
/// waiting return, resource subscription watchers stop). MCP tasks are the app's and go on.
struct ConnectionEnd {
    closing: CancellationToken,
}

impl Drop for ConnectionEnd {
    fn drop(&mut self) {
        self.closing.cancel();
        tracing::debug!("MCP connection ended: its waits and subscriptions stopped");
    }
}

impl SandboxServer {
    /// A handler for one connection; its tasks live in a book of its own (stdio's one
    /// connection) until [`with_task_book`](Self::with_task_book) shares the server's.
    pub(crate) fn new(app: Arc<App>, closing: CancellationToken) -> Self {
        SandboxServer {
            app,
            tenants: None,
            bound: Arc::default(),
            _end: Arc::new(ConnectionEnd {
                closing: closing.clone(),
            }),
            // A child token: dropping this book (replaced by a shared one) stops its own
            // followers, never the connection.
            tasks: Arc::new(TaskBook::new(closing.child_token())),
            closing,
            link: Arc::default(),
            subscriptions: Arc::default(),
        }
    }

    /// Keep tasks in `book`, shared by every connection of the server.
    pub(crate) fn with_task_book(mut self, book: Arc<TaskBook>) -> Self {
        self.tasks = book;
        self
    }

    /// Serve the principals of `tenants` (a tokens file): each request goes to its
    /// principal's own app.
    pub(crate) fn with_tenants(mut self, tenants: Option<Arc<Tenants>>) -> Self {
        self.tenants = tenants;
        self
    }

    /// The app this request goes to: the server's own, or the app of the principal the
    /// HTTP transport authenticated it as (in the request's extensions). A request
    /// without a principal, with a tokens file, is refused.
    fn app_for(&self, ext: &Extensions) -> Result<Arc<App>, ErrorData> {
        let Some(tenants) = &self.tenants else {
            return Ok(self.app.clone());
        };
        let principal = ext
            .get::<hyper::http::request::Parts>()
            .and_then(|p| p.extensions.get::<Principal>())
            .ok_or_else(|| {
                ErrorData::invalid_request(
                    "unauthenticated: this server serves the principals of a tokens file; send a principal's bearer token",
                    None,
                )
            })?;
        let app = tenants
            .app(principal)
            .map_err(|e| ErrorData::internal_error(e, None))?;
        let _ = self.bound.set(app.clone());
        Ok(app)
    }

    /// The app of a request that carries no context (a subscription filter): the one
    /// this connection was bound to, if any.
    fn bound_app(&self) -> Option<Arc<App>> {
        match &self.tenants {
            None => Some(self.app.clone()),
            Some(_) => self.bound.get().cloned(),
        }
    }

    /// This handler, calling `app`.
    fn with_app(&self, app: Arc<App>) -> SandboxServer {
        SandboxServer {
            app,
            ..self.clone()
        }
    }

    /// The tools, with their schemas rewritten (see `schema`): built once per process, at
    /// the first call that needs them, not on the way to answering `initialize`.
    fn tools() -> &'static ToolRouter<SandboxServer> {
        static TOOLS: std::sync::OnceLock<ToolRouter<SandboxServer>> = std::sync::OnceLock::new();
        TOOLS.get_or_init(all_tools)
    }

    /// Names of every tool offered (used by the docs-in-step test).
    #[cfg(test)]
    pub(crate) fn tool_names() -> Vec<String> {
        Self::tools()
            .list_all()
            .into_iter()
            .map(|t| t.name.to_string())
            .collect()
    }
}

/// -32601 for a method whose capability this server does not declare.
fn not_offered(method: &str, capability: &str) -> ErrorData {
    ErrorData::new(
        ErrorCode::METHOD_NOT_FOUND,
        format!("{method}: this server offers no {capability} (the capability is not declared)"),
        None,
    )
}

fn is_deserialize_failure(r: &CallToolResult) -> bool {
    r.is_error == Some(true)
        && r.content.len() == 1
        && r.content[0]
            .as_text()
            .is_some_and(|t| t.text.starts_with("failed to deserialize parameters"))
}

impl SandboxServer {
    /// Arguments the tool cannot take, as the JSON-RPC error the spec asks for
    /// (-32602, invalid params), in words that name the field.
    fn bad_arguments(
        &self,
        tool: &str,
        message: &str,
        args: &serde_json::Map<String, serde_json::Value>,
    ) -> ErrorData {
        let detail = message
            .trim_start_matches("failed to deserialize parameters:")
            .trim();
        let which = Self::tools()
            .get(tool)
            .and_then(|t| super::args_check::explain(&t.input_schema, args));
        let text = match which {
            Some(w) => format!("invalid arguments for {tool}: {w} ({detail})"),
            None => format!("invalid arguments for {tool}: {detail}"),
        };
        ErrorData::invalid_params(text, None)
    }
}

impl ServerHandler for SandboxServer {
    /// On `initialize`, start the default session's worker in the background (before the
    /// answer goes out, so it is under way while the client reads it and sends
    /// `initialized`) — unless the client has roots that may choose the workspace: then
    /// `on_initialized` fetches them first and prewarms after. Prewarm is idempotent.
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        let app = self.app_for(&context.extensions)?;
        if request.capabilities.roots.is_none() || !app.sources().workspace_from_roots {
            tokio::spawn(async move { app.prewarm().await });
        }
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    /// Once the client is set up, start the default session's worker in the background, so
    /// the first `python_exec` does not pay for interpreter discovery and worker start.
    /// If the client has roots (and no --workspace was given), they are fetched first.
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        if let Ok(app) = self.app_for(&context.extensions) {
            self.link.on_initialized(app, context.peer);
        }
    }

    async fn on_roots_list_changed(&self, context: NotificationContext<RoleServer>) {
        if let Ok(app) = self.app_for(&context.extensions) {
            self.link.on_roots_changed(app, context.peer);
        }
    }

    /// `codex/sandbox-state/update` as a request: applied, answered with `{}`.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        if request.method != client_state::SANDBOX_STATE_METHOD {
            return Err(ErrorData::new(
                ErrorCode::METHOD_NOT_FOUND,
                format!("unknown method {}", request.method),
                None,
            ));
        }
        let app = self.app_for(&context.extensions)?;
        client_state::apply_sandbox_state(&app, request.params.as_ref())?;
        Ok(CustomResult::new(serde_json::json!({})))
    }

    /// `codex/sandbox-state/update` as a notification: applied (a failure is logged).
    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        context: NotificationContext<RoleServer>,
    ) {
        if notification.method == client_state::SANDBOX_STATE_METHOD
            && let Ok(app) = self.app_for(&context.extensions)
            && let Err(e) = client_state::apply_sandbox_state(&app, notification.params.as_ref())
        {
            tracing::warn!("{} ignored: {}", notification.method, e.message);
        }
    }

    fn get_info(&self) -> ServerConfig {
        let mut caps = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_tasks()
            .build();
        if self.app.sources().inherit_sandbox {
            // Today's Codex checks for `codex/sandbox-state-meta` and then sends its state
            // in every tool call's `_meta`; older Codex checks for `codex/sandbox-state`
            // and sends `codex/sandbox-state/update`.
            let mut version = serde_json::Map::new();
            version.insert("version".into(), serde_json::json!("1.0.0"));
            caps.experimental = Some(
                [
                    (client_state::SANDBOX_STATE_CAPABILITY.to_string(), version),
                    (
                        client_state::SANDBOX_STATE_META.to_string(),
                        serde_json::Map::new(),
                    ),
                ]
                .into_iter()
                .collect(),
            );
        }
        ServerConfig::new(caps)
            .with_server_info(Implementation::new(
                "mcp-sandbox-repl",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(INSTRUCTIONS)
    }

    /// No prompts, and the capability is not declared: `prompts/list` is "method not
    /// found", as `prompts/get` is (rmcp would answer an empty list).
    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Err(not_offered("prompts/list", "prompts"))
    }

    /// No completions, and the capability is not declared (rmcp would answer an empty
    /// completion).
    async fn complete(
        &self,
        _request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        Err(not_offered("completion/complete", "completions"))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let app = self.app_for(&context.extensions)?;
        Ok(resources::list(&app))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(resources::templates())
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let app = self.app_for(&context.extensions)?;
        resources::read(&app, &request.uri).await.map(Into::into)
    }

    /// `subscriptions/listen` (2026-07-28): job streams can be listened to.
    fn accepted_subscription_filter(
        &self,
        requested: &rmcp::model::SubscriptionFilter,
    ) -> Option<rmcp::model::SubscriptionFilter> {
        let app = self.bound_app()?;
        self.subscriptions.accept(&app, requested)
    }

    async fn listen(&self, context: rmcp::service::SubscriptionContext) -> Result<(), ErrorData> {
        let app = self.bound_app().ok_or_else(|| {
            ErrorData::invalid_request("unauthenticated: no principal for this connection", None)
        })?;
        self.subscriptions.listen(app, context, &self.closing).await;
        Ok(())
    }

    // Legacy resources/subscribe: what clients before 2026-07-28 send.
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let app = self.app_for(&context.extensions)?;
        self.subscriptions
            .subscribe(app, context.peer, request.uri, &self.closing)
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscriptions.unsubscribe(&request.uri);
        Ok(())
    }

    /// `tasks/get`: the task's state; once `completed`, the job's answer inline.
    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let app = self.app_for(&context.extensions)?;
        self.tasks.of(&app).get(&app, &request.task_id).await
    }

    /// `tasks/update`: the answer to a job's input request.
    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let app = self.app_for(&context.extensions)?;
        self.tasks
            .of(&app)
            .update(&app, &request.task_id, request.input_responses)
    }

    /// `tasks/cancel`: cancels the job (as job_cancel does).
    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let app = self.app_for(&context.extensions)?;
        self.tasks.of(&app).cancel(&app, &request.task_id).await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(Self::tools().list_all()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        Self::tools().get(name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        if Self::tools().get(&name).is_none() {
            let known: Vec<String> = Self::tools()
                .list_all()
                .into_iter()
                .map(|t| t.name.to_string())
                .collect();
            // The spec's answer to an unknown tool: invalid params.
            return Err(ErrorData::invalid_params(
                format!("unknown tool {name:?}; tools are: {}", known.join(", ")),
                None,
            ));
        }
        let app = self.app_for(&context.extensions)?;
        let this = self.with_app(app);
        // 2026-07-28: the client's roots come with a retry of this call (MRTR).
        if let Some(ask) = client_state::modern_roots(
            &this.app,
            &context.meta,
            context.peer.peer_info().is_some(),
            request.input_responses.as_ref(),
        ) {
            return Ok(CallToolResponse::InputRequired(ask));
        }
        this.link.roots_settled(&this.app, &context.peer).await;
        // Today's Codex sends its sandbox state with the call: applied before it runs.
        let codex_state = context
            .meta
            .get(client_state::SANDBOX_STATE_META)
            .or_else(|| {
                request
                    .meta
                    .as_ref()
                    .and_then(|m| m.get(client_state::SANDBOX_STATE_META))
            });
        client_state::apply_call_meta(&this.app, codex_state)?;
        this.app.settled().await;
        // A client that declares the tasks extension gets a task for a job that
        // outlives the window; every other client gets today's `running` report.
        let may_task = TASK_TOOLS.contains(&name.as_str())
            && context
                .client_capabilities()
                .is_some_and(|caps| caps.supports_tasks());
        let args = request.arguments.clone().unwrap_or_default();
        let started = std::time::Instant::now();
        let tcc = ToolCallContext::new(&this, request, context);
        let outcome = Self::tools().call(tcc).await;
        tracing::debug!(tool = %name, micros = started.elapsed().as_micros() as u64, "tool call handled");
        let answer = match outcome {
            // Arguments that do not fit the schema (or a range the tool checks) are
            // protocol errors (-32602) naming the field; failures of the work itself
            // stay `isError` results.
            Err(e) if e.code == ErrorCode::INVALID_PARAMS => {
                Err(self.bad_arguments(&name, &e.message, &args))
            }
            Ok(CallToolResponse::Complete(r)) if is_deserialize_failure(&r) => {
                let text = r
                    .content
                    .first()
                    .and_then(|c| c.as_text())
                    .map(|t| t.text.clone())
                    .unwrap_or_default();
                Err(self.bad_arguments(&name, &text, &args))
            }
            Ok(CallToolResponse::Complete(r)) if may_task => {
                let tasks = self.tasks.of(&this.app);
                match tasks.adopt(this.app.clone(), &r, self.tasks.stop()) {
                    Some(task) => return Ok(CallToolResponse::Task(task)),
                    None => Ok(CallToolResponse::Complete(r)),
                }
            }
            other => other,
        };
        // What new sessions and jobs run under, once after every change.
        match (answer, self.link.told.pending(&this.app)) {
            (Ok(CallToolResponse::Complete(mut r)), Some(notice)) => {
                r.content.push(ContentBlock::text(notice));
                Ok(CallToolResponse::Complete(r))
            }
            (answer, _) => answer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The connection's end is its last handle's drop: `closing` is cancelled then, not
    /// while a clone (an in-flight call) still holds it.
    #[test]
    fn the_last_handle_ends_the_connection() {
        let closing = CancellationToken::new();
        let end = Arc::new(ConnectionEnd {
            closing: closing.clone(),
        });
        let held = end.clone();
        drop(end);
        assert!(!closing.is_cancelled());
        drop(held);
        assert!(closing.is_cancelled());
    }

    /// Every tool has a description file in docs/tools and every file names a tool.
    #[test]
    fn docs_and_tools_are_in_step() {
        let mut tools = SandboxServer::tool_names();
        tools.sort();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/tools");
        let mut docs: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter_map(|n| n.strip_suffix(".md").map(str::to_string))
            .collect();
        docs.sort();
        assert_eq!(tools, docs, "docs/tools/*.md and the tool list differ");
    }

    /// Argument schemas reject unknown fields and every tool has annotations.
    #[test]
    fn schemas_are_strict_and_annotated() {
        for tool in SandboxServer::tools().list_all() {
            let schema = serde_json::Value::Object((*tool.input_schema).clone());
            assert_eq!(
                schema["additionalProperties"],
                serde_json::json!(false),
                "{}",
                tool.name
            );
            assert!(
                tool.annotations.is_some(),
                "{} lacks annotations",
                tool.name
            );
            assert!(
                tool.description.as_deref().is_some_and(|d| d.len() > 80),
                "{}",
                tool.name
            );
        }
    }
}
