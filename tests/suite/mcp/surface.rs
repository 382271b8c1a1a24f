//! What the server declares at `initialize` and how it answers what it does not offer:
//! tools, resources (with subscriptions) and tasks declared; no prompts and no
//! completions, so `prompts/list`, `prompts/get` and `completion/complete` are -32601;
//! Codex's sandbox-state capabilities only with `--sandbox-state inherit`; a resource
//! that is not found is -32002 with its URI in `data.uri`, malformed or unknown alike.

use rmcp::model::{
    ArgumentInfo, CompleteRequestParams, ErrorData, GetPromptRequestParams,
    ReadResourceRequestParams, Reference,
};
use rmcp::service::ServiceError;
use serde_json::json;

use super::{InProcess, guard};

/// The JSON-RPC error of a request that must fail.
fn error_of<T: std::fmt::Debug>(what: &str, answer: Result<T, ServiceError>) -> ErrorData {
    match answer {
        Err(ServiceError::McpError(e)) => e,
        other => panic!("{what}: answered {other:?} instead of an error"),
    }
}

#[tokio::test]
async fn initialize_declares_tools_resources_and_tasks_only() {
    let s = InProcess::start(&[]).await;
    let info = s
        .client
        .peer_info()
        .expect("the server's initialize answer");
    let server = info.server_info.as_ref().expect("serverInfo");
    assert_eq!(server.name, "mcp-sandbox-repl");
    assert!(
        info.instructions
            .as_deref()
            .unwrap_or("")
            .contains("job_wait"),
        "{:?}",
        info.instructions
    );
    let caps = &info.capabilities;
    assert!(caps.tools.is_some(), "{caps:?}");
    assert!(
        caps.resources
            .as_ref()
            .is_some_and(|r| r.subscribe == Some(true)),
        "{caps:?}"
    );
    assert!(caps.supports_tasks(), "{caps:?}");
    assert!(
        caps.prompts.is_none() && caps.completions.is_none(),
        "{caps:?}"
    );
    assert!(
        caps.experimental.as_ref().is_none_or(|e| e.is_empty()),
        "{caps:?}"
    );
    s.stop().await;
}

/// `--sandbox-state inherit`: today's Codex looks for `codex/sandbox-state-meta`, older
/// Codex for `codex/sandbox-state` (tests/mcp/test_codex_client.py drives both).
#[tokio::test]
async fn inherit_declares_the_codex_sandbox_state_capabilities() {
    let s = InProcess::start(&["--sandbox-state", "inherit"]).await;
    let info = s.client.peer_info().unwrap();
    let experimental = serde_json::to_value(&info.capabilities.experimental).unwrap();
    assert_eq!(
        experimental,
        json!({"codex/sandbox-state": {"version": "1.0.0"}, "codex/sandbox-state-meta": {}})
    );
    s.stop().await;
}

#[tokio::test]
async fn prompts_and_completions_are_method_not_found() {
    let s = InProcess::start(&[]).await;
    let e = error_of("prompts/list", guard(s.client.list_prompts(None)).await);
    assert_eq!(e.code.0, -32601, "{e:?}");
    assert!(e.message.contains("prompts"), "{e:?}");
    let get = GetPromptRequestParams::new("anything");
    let e = error_of("prompts/get", guard(s.client.get_prompt(get)).await);
    assert_eq!(e.code.0, -32601, "{e:?}");
    let complete = CompleteRequestParams::new(
        Reference::for_resource("job://{job_id}/stdout"),
        ArgumentInfo::new("job_id", "j"),
    );
    let e = error_of(
        "completion/complete",
        guard(s.client.complete(complete)).await,
    );
    assert_eq!(e.code.0, -32601, "{e:?}");
    assert!(e.message.contains("completion"), "{e:?}");
    s.stop().await;
}

/// A resource that is not there, whether its URI is malformed or names nothing, is
/// -32002 (resource not found) with the URI in `data.uri`.
#[tokio::test]
async fn a_resource_not_found_is_32002_with_the_uri_in_data() {
    let s = InProcess::start(&[]).await;
    for uri in [
        "job://no-such-job/stdout",
        "job://j1/stdin",
        "session://nobody/history",
        "script://j404",
    ] {
        let read = guard(s.client.read_resource(ReadResourceRequestParams::new(uri))).await;
        let e = error_of(uri, read);
        assert_eq!(e.code.0, -32002, "{uri}: {e:?}");
        assert_eq!(e.data, Some(json!({ "uri": uri })), "{uri}: {e:?}");
    }
    s.stop().await;
}

/// The templates name the job streams with their paging parameters.
#[tokio::test]
async fn resource_templates_name_the_job_streams() {
    let s = InProcess::start(&[]).await;
    let templates = guard(s.client.list_all_resource_templates()).await.unwrap();
    let uris: Vec<&str> = templates.iter().map(|t| t.uri_template.as_str()).collect();
    assert!(
        uris.contains(&"job://{job_id}/stdout{?offset,length}"),
        "{uris:?}"
    );
    s.stop().await;
}
