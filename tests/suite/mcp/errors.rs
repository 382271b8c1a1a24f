//! Errors as a client sees them: arguments a tool cannot take (and an unknown tool) are
//! JSON-RPC invalid-params errors (-32602) whose words name the field and what it must
//! be; a failure of the work itself is an `isError` result whose structured content
//! (`{"error": ...}`, or a failed job's whole report) the tool's output schema admits.

use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::model::JsonObject;

use serde_json::{Value, json};

use super::{InProcess, no_args, text_of, validate};

/// Each bad call and what its -32602 message must name (the field, and for a wrong type
/// or value what it must be: the word "invalid" is in every such message, and a value we
/// sent is only our own input echoed).
#[tokio::test]
async fn bad_arguments_are_invalid_params_that_name_the_field() {
    let s = InProcess::start(&[]).await;
    let cases: &[(&str, Value, &[&str])] = &[
        (
            "python_exec",
            json!({"code": "1", "sesion": "x"}),
            &["sesion"],
        ),
        ("python_exec", no_args(), &["code"]),
        ("python_exec", json!({"code": 5}), &["`code`", "string"]),
        (
            "python_exec",
            json!({"code": "1", "session": "../etc"}),
            &["session"],
        ),
        (
            "python_exec",
            json!({"code": "1", "timeout_seconds": -1}),
            &["timeout_seconds"],
        ),
        (
            "job_wait",
            json!({"job_id": "j1", "timeout_seconds": -1}),
            &["timeout_seconds"],
        ),
        (
            "job_output",
            json!({"job_id": "j1", "stream": "stdin"}),
            &["`stream`", "stdout", "result"],
        ),
        (
            "job_output",
            json!({"job_id": "j1", "pattern": "x", "offset": -5}),
            &["offset"],
        ),
        (
            "job_output",
            json!({"job_id": "j1", "image": -1}),
            &["image"],
        ),
        (
            "shell_run",
            json!({"command": "true", "timeout_seconds": 0}),
            &["timeout_seconds"],
        ),
        ("no_such_tool", no_args(), &["unknown tool", "python_exec"]),
    ];
    for (tool, args, words) in cases {
        let message = s.invalid(tool, args.clone()).await;
        for w in *words {
            assert!(
                message.contains(w),
                "{tool}({args}): {w:?} not in {message:?}"
            );
        }
    }
    // The connection is fine afterwards.
    assert!(s.tools().await.iter().any(|t| t.name == "python_exec"));
    s.stop().await;
}

/// Arguments that fit the schema but not each other, and a job that does not exist: a
/// tool error (`isError`) whose structured content is `{"error": <the text>}`.
#[tokio::test]
async fn failures_of_the_work_are_is_error_with_the_error_in_structured_content() {
    let s = InProcess::start(&[]).await;
    let r = s.call("shell_run", no_args()).await.unwrap();
    assert_eq!(r.is_error, Some(true), "{r:?}");
    let text = text_of(&r);
    assert!(text.contains("command") && text.contains("argv"), "{text}");
    assert_eq!(r.structured_content, Some(json!({ "error": text })));
    let r = s.call("job_wait", json!({"job_id": "j999"})).await.unwrap();
    assert_eq!(r.is_error, Some(true), "{r:?}");
    let error = r.structured_content.as_ref().unwrap()["error"].clone();
    assert!(error.as_str().unwrap().contains("j999"), "{error}");
    s.stop().await;
}

/// The output schemas of every tool, by name.
async fn output_schemas(s: &InProcess) -> BTreeMap<String, Arc<JsonObject>> {
    s.tools()
        .await
        .into_iter()
        .map(|t| (t.name.to_string(), t.output_schema.unwrap()))
        .collect()
}

/// `tool(args)` answers with `is_error` and structured content its output schema admits;
/// that content.
async fn answer_in_schema(
    s: &InProcess,
    schemas: &BTreeMap<String, Arc<JsonObject>>,
    tool: &str,
    args: Value,
    is_error: bool,
) -> Value {
    let r = s.call(tool, args.clone()).await.unwrap();
    assert_eq!(
        r.is_error,
        Some(is_error),
        "{tool}({args}): {}",
        text_of(&r)
    );
    let structured = r.structured_content.clone().expect("structured content");
    if let Err(e) = validate(&schemas[tool], &structured) {
        panic!("{tool}({args}) answered outside its output schema: {e}\n{structured}");
    }
    structured
}

/// A refusal (a job, session or variable that does not exist) is `isError` with an
/// error object its tool's output schema admits.
#[tokio::test]
async fn refusals_validate_against_the_output_schema() {
    let s = InProcess::start(&[]).await;
    let schemas = output_schemas(&s).await;
    for (tool, args) in [
        ("job_wait", json!({"job_id": "j404"})),
        ("job_output", json!({"job_id": "j404"})),
        ("job_cancel", json!({"job_id": "j404"})),
        ("session_close", json!({"session": "never-opened"})),
        ("shell_run", no_args()),
    ] {
        let error = answer_in_schema(&s, &schemas, tool, args, true).await;
        let keys: Vec<&String> = error.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["error"], "{tool}: {error}");
    }
    s.stop().await;
}

/// A job that ran and failed — a cell that raised, a shell command that exited 3 — is
/// `isError` with its whole report, which the output schema admits; so are successes
/// (`isError` false). The one in-process test that starts a worker and a shell job.
#[tokio::test]
async fn job_answers_validate_against_the_output_schema_failed_or_not() {
    let s = InProcess::start(&[]).await;
    let schemas = output_schemas(&s).await;
    // The windows are wide: a loaded machine may be slow to start a worker, and a
    // `running` answer is not what is checked here.
    let cell = json!({"code": "1/0", "wait_seconds": 60});
    let cell = answer_in_schema(&s, &schemas, "python_exec", cell, true).await;
    assert_eq!(cell["status"], json!("failed"), "{cell}");
    assert_eq!(
        cell["exception"]["ename"],
        json!("ZeroDivisionError"),
        "{cell}"
    );
    let var = json!({"action": "get", "name": "nope"});
    let var = answer_in_schema(&s, &schemas, "python_vars", var, true).await;
    assert!(var["error"].as_str().unwrap().contains("nope"), "{var}");
    let shell = json!({"command": "exit 3", "wait_seconds": 60});
    let shell = answer_in_schema(&s, &schemas, "shell_run", shell, true).await;
    assert_eq!(shell["status"], json!("failed"), "{shell}");
    assert_eq!(shell["exit_code"], json!(3), "{shell}");
    for (tool, args) in [
        ("python_exec", json!({"code": "6*7", "wait_seconds": 60})),
        ("python_vars", json!({"action": "list"})),
        (
            "shell_run",
            json!({"command": "echo hi", "wait_seconds": 60}),
        ),
        ("session_list", no_args()),
        ("job_list", no_args()),
    ] {
        answer_in_schema(&s, &schemas, tool, args, false).await;
    }
    s.stop().await;
}
