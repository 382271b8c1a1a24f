//! Tool schemas as every client can read them: standard JSON Schema 2020-12 only, small.
//! schemars writes Rust-specific formats (`uint64`, `double`, `int32`), `["integer",
//! "null"]` for optional fields (which the MCP Inspector cannot fill), `$ref`s to `$defs`
//! and titles. [`input`] and [`output`] rewrite a generated schema: formats dropped (an
//! unsigned one becomes `minimum: 0`), optional fields typed plainly (absent means the
//! default, which the field's schema states), references inlined (input) and titles gone.
//! An output schema also admits the `{"error": ...}` of a failed call.

use serde_json::{Map, Value, json};

/// An input schema: every `$ref` inlined, so simple form-filling clients see plain types.
pub(crate) fn input(schema: &Map<String, Value>) -> Map<String, Value> {
    let defs = schema.get("$defs").cloned().unwrap_or(Value::Null);
    let mut v = Value::Object(schema.clone());
    inline_refs(&mut v, &defs, 0);
    if let Value::Object(m) = &mut v {
        m.remove("$defs");
    }
    tidy(&mut v, true, true);
    into_map(v)
}

/// An output schema: tidied like an input, plus an optional `error` (the words of a failed
/// call), and the fields it requires required only when there is no `error`.
pub(crate) fn output(schema: &Map<String, Value>) -> Map<String, Value> {
    let mut v = Value::Object(schema.clone());
    tidy(&mut v, true, false);
    // Output schemas are for validation, not for the model: no descriptions (the fields
    // are documented in docs/tools and the Rust types), which keeps tools/list small.
    strip_descriptions(&mut v);
    let mut m = into_map(v);
    if let Some(Value::Object(props)) = m.get_mut("properties") {
        props.insert("error".into(), json!({"type": "string"}));
    }
    if let Some(required) = m.remove("required") {
        m.insert(
            "anyOf".into(),
            json!([{"required": required}, {"required": ["error"]}]),
        );
    }
    m
}

fn strip_descriptions(v: &mut Value) {
    match v {
        Value::Object(m) => {
            // A property *named* "description" stays; the keyword goes.
            if m.get("description").is_some_and(Value::is_string) {
                m.remove("description");
            }
            m.values_mut().for_each(strip_descriptions);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_descriptions),
        _ => {}
    }
}

fn into_map(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// Replace `{"$ref": "#/$defs/X", ...}` by the definition of X (merged with the siblings).
fn inline_refs(v: &mut Value, defs: &Value, depth: usize) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref").cloned()
                && depth < 16
                && let Some(def) = r.strip_prefix("#/$defs/").and_then(|n| defs.get(n))
            {
                m.remove("$ref");
                if let Value::Object(d) = def {
                    for (k, x) in d {
                        m.entry(k.clone()).or_insert_with(|| x.clone());
                    }
                }
                inline_refs(v, defs, depth + 1);
                return;
            }
            for x in m.values_mut() {
                inline_refs(x, defs, depth);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| inline_refs(x, defs, depth)),
        _ => {}
    }
}

/// Standard, compact keywords only (see the module docs). `plain`: optional types lose
/// their `null` (inputs, where absent means the default); outputs keep it, as a value
/// may be null there.
fn tidy(v: &mut Value, root: bool, plain: bool) {
    match v {
        Value::Object(m) => {
            m.remove("title");
            if root {
                m.remove("$schema");
            }
            if let Some(Value::String(f)) = m.remove("format")
                && f.starts_with("uint")
            {
                m.entry("minimum").or_insert(json!(0));
            }
            if m.get("default") == Some(&Value::Null) {
                m.remove("default");
            }
            // ["T", "null"] -> "T"
            if plain && let Some(Value::Array(types)) = m.get("type") {
                let plain: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                if plain.len() == 1 {
                    m.insert("type".into(), plain[0].clone());
                }
            }
            // anyOf [X, {type: null}] -> X (keeping this node's description)
            if plain && let Some(Value::Array(any)) = m.get("anyOf") {
                let rest: Vec<Value> = any
                    .iter()
                    .filter(|x| x.get("type") != Some(&json!("null")))
                    .cloned()
                    .collect();
                if rest.len() == 1 && rest.len() < any.len() {
                    m.remove("anyOf");
                    if let Value::Object(x) = &rest[0] {
                        for (k, val) in x {
                            m.entry(k.clone()).or_insert_with(|| val.clone());
                        }
                    }
                }
            }
            // oneOf of string enums / consts -> one enum (descriptions of variants dropped)
            if let Some(Value::Array(one)) = m.get("oneOf") {
                let mut names = Vec::new();
                let all_strings = one.iter().all(|x| {
                    if let Some(Value::Array(e)) = x.get("enum") {
                        names.extend(e.iter().cloned());
                        true
                    } else if let Some(c) = x.get("const") {
                        names.push(c.clone());
                        true
                    } else {
                        false
                    }
                });
                if all_strings {
                    m.remove("oneOf");
                    m.insert("type".into(), json!("string"));
                    m.insert("enum".into(), Value::Array(names));
                }
            }
            for x in m.values_mut() {
                tidy(x, false, plain);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| tidy(x, false, plain)),
        _ => {}
    }
}

/// Every `format` keyword left in a schema (none should be).
#[cfg(test)]
pub(crate) fn formats(v: &Value) -> Vec<String> {
    let mut out = Vec::new();
    match v {
        Value::Object(m) => {
            if let Some(Value::String(f)) = m.get("format") {
                out.push(f.clone());
            }
            m.values().for_each(|x| out.extend(formats(x)));
        }
        Value::Array(a) => a.iter().for_each(|x| out.extend(formats(x))),
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(v: Value) -> Map<String, Value> {
        into_map(v)
    }

    #[test]
    fn rust_formats_and_nullables_become_standard() {
        let s = map(json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "Args",
            "type": "object",
            "properties": {
                "n": {"type": ["integer", "null"], "format": "uint64", "minimum": 0, "default": null},
                "x": {"type": ["number", "null"], "format": "double", "default": 3},
                "k": {"anyOf": [{"$ref": "#/$defs/K"}, {"type": "null"}], "description": "kind"},
                "s": {"oneOf": [{"enum": ["a", "b"], "type": "string"}, {"const": "c", "type": "string"}]},
            },
            "$defs": {"K": {"enum": ["p", "q"], "type": "string"}},
        }));
        let v = Value::Object(input(&s));
        assert_eq!(
            v,
            json!({
                "type": "object",
                "properties": {
                    "n": {"type": "integer", "minimum": 0},
                    "x": {"type": "number", "default": 3},
                    "k": {"enum": ["p", "q"], "type": "string", "description": "kind"},
                    "s": {"type": "string", "enum": ["a", "b", "c"]},
                },
            })
        );
        assert!(formats(&v).is_empty());
    }

    #[test]
    fn outputs_admit_an_error() {
        let s = map(
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}),
        );
        let v = Value::Object(output(&s));
        assert_eq!(
            v["anyOf"],
            json!([{"required": ["a"]}, {"required": ["error"]}])
        );
        assert_eq!(v["properties"]["error"]["type"], "string");
    }

    #[test]
    fn self_references_do_not_loop() {
        let s = map(json!({"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/A"}}}));
        let _ = input(&s);
    }
}
