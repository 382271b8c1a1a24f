//! `tools/list` as a client reads it: every tool, its strict input schema, annotations
//! and output schema; every schema standard JSON Schema 2020-12 (checked against the
//! meta-schema) in the plain shapes form-filling clients need; the model-visible table
//! within 10 KB; defaults stated.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::{InProcess, schema_value};

const EXPECTED_TOOLS: &[&str] = &[
    "python_exec",
    "python_run_file",
    "python_interrupt",
    "python_vars",
    "python_history",
    "session_list",
    "session_restart",
    "session_close",
    "job_wait",
    "job_input",
    "job_cancel",
    "job_list",
    "job_output",
    "job_prune",
    "shell_run",
];

/// Every sub-schema (object) of a schema, the schema itself first.
fn nodes(schema: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    let mut todo = vec![schema];
    while let Some(v) = todo.pop() {
        match v {
            Value::Object(m) => {
                out.push(v);
                todo.extend(m.values());
            }
            Value::Array(a) => todo.extend(a),
            _ => {}
        }
    }
    out
}

/// Every tool is listed with a description written for a model, a strict input schema
/// (no unknown fields), annotations and an output schema; the async model is spelled out.
#[tokio::test]
async fn every_tool_is_listed_strict_annotated_and_with_an_output_schema() {
    let s = InProcess::start(&[]).await;
    let tools = s.tools().await;
    let names: BTreeSet<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    let missing: Vec<&&str> = EXPECTED_TOOLS
        .iter()
        .filter(|t| !names.contains(**t))
        .collect();
    assert!(missing.is_empty(), "not listed: {missing:?}");
    for t in &tools {
        let description = t.description.as_deref().unwrap_or("");
        assert!(description.len() > 80, "{}: {description:?}", t.name);
        assert_eq!(
            t.input_schema.get("additionalProperties"),
            Some(&json!(false)),
            "{}",
            t.name
        );
        let hints = t.annotations.as_ref();
        assert!(
            hints.is_some_and(|a| a.read_only_hint.is_some()),
            "{}: {hints:?}",
            t.name
        );
        assert!(
            t.output_schema.is_some(),
            "{} lacks an output schema",
            t.name
        );
    }
    let by = |name: &str| tools.iter().find(|t| t.name == name).unwrap();
    let exec_out = by("python_exec").output_schema.clone().unwrap();
    assert!(
        exec_out["properties"].get("job_id").is_some(),
        "{exec_out:?}"
    );
    let exec_description = by("python_exec").description.clone().unwrap_or_default();
    assert!(exec_description.contains("job_wait"), "{exec_description}");
    let job_list = by("job_list").annotations.clone().unwrap();
    assert_eq!(job_list.read_only_hint, Some(true));
    let restart = by("session_restart").annotations.clone().unwrap();
    assert_eq!(restart.destructive_hint, Some(true));
    s.stop().await;
}

/// Every input and output schema is valid against the 2020-12 meta-schema, uses no
/// custom `format`, and describes an object; inputs are plain (no type lists, no `$ref`:
/// form-filling clients read them field by field), outputs may say `null`.
#[tokio::test]
async fn every_schema_is_standard_json_schema_2020_12() {
    let s = InProcess::start(&[]).await;
    for t in s.tools().await {
        let input = schema_value(&t.input_schema);
        let output = schema_value(t.output_schema.as_deref().unwrap());
        for (kind, schema) in [("input", &input), ("output", &output)] {
            if let Err(e) = jsonschema::draft202012::meta::validate(schema) {
                panic!("{} {kind} schema is not JSON Schema 2020-12: {e}", t.name);
            }
            assert_eq!(schema["type"], json!("object"), "{} {kind}", t.name);
            for node in nodes(schema) {
                assert!(
                    !node.get("format").is_some_and(Value::is_string),
                    "{} {kind} schema has a format: {node}",
                    t.name
                );
                if kind == "input" {
                    assert!(
                        !node.get("type").is_some_and(Value::is_array),
                        "{} input schema has a type list: {node}",
                        t.name
                    );
                    assert!(
                        node.get("$ref").is_none(),
                        "{} input schema has a $ref: {node}",
                        t.name
                    );
                }
            }
        }
    }
    s.stop().await;
}

/// What a model sees of `tools/list` (names, descriptions, input schemas as compact
/// JSON) is at most 10 KB.
#[tokio::test]
async fn the_model_visible_tool_table_fits_in_10_kb() {
    let s = InProcess::start(&[]).await;
    let mut sizes = Vec::new();
    for t in s.tools().await {
        let schema = serde_json::to_string(&schema_value(&t.input_schema)).unwrap();
        let description = t.description.as_deref().unwrap_or("");
        sizes.push((t.name.len() + description.len() + schema.len(), t.name));
    }
    let total: usize = sizes.iter().map(|(n, _)| n).sum();
    assert!(
        total <= 10 * 1024,
        "tools/list shows a model {total} B: {sizes:?}"
    );
    s.stop().await;
}

/// Defaults are stated in the schema (a client shows them; a model relies on them).
#[tokio::test]
async fn defaults_are_stated_in_the_input_schemas() {
    let s = InProcess::start(&[]).await;
    let tools = s.tools().await;
    let default_of = |tool: &str, field: &str| {
        let t = tools.iter().find(|t| t.name == tool).unwrap();
        t.input_schema["properties"][field]["default"].clone()
    };
    assert_eq!(default_of("python_exec", "wait_seconds"), json!(3));
    assert_eq!(default_of("job_wait", "timeout_seconds"), json!(30));
    assert_eq!(default_of("python_exec", "session"), json!("default"));
    s.stop().await;
}
