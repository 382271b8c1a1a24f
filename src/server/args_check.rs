//! Words for malformed tool arguments. serde names unknown and missing fields itself, but
//! for a wrong type it only says "invalid value: integer `-1`, expected u64"; this module
//! finds the offending field by checking each argument against the tool's input schema.

use serde_json::{Map, Value};

/// The first argument whose JSON type does not fit its schema, described in words.
pub(super) fn explain(schema: &Map<String, Value>, args: &Map<String, Value>) -> Option<String> {
    let props = schema.get("properties")?.as_object()?;
    for (name, value) in args {
        let Some(prop) = props.get(name) else {
            return Some(format!(
                "`{name}` is not an argument of this tool; known: {}",
                known(props)
            ));
        };
        if let Some(problem) = misfit(prop, value) {
            return Some(format!("`{name}` {problem}, got {}", short(value)));
        }
    }
    None
}

fn known(props: &Map<String, Value>) -> String {
    props
        .keys()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 {
        format!("{}…", s.chars().take(60).collect::<String>())
    } else {
        s
    }
}

/// Why `value` does not fit `prop`, if it visibly does not (types, minimum, enum).
fn misfit(prop: &Value, value: &Value) -> Option<String> {
    let types: Vec<&str> = match prop.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => {
            if let Some(options) = prop.get("enum").and_then(Value::as_array)
                && !options.contains(value)
            {
                let names: Vec<String> = options.iter().map(|o| o.to_string()).collect();
                return Some(format!("must be one of {}", names.join(", ")));
            }
            return None;
        }
    };
    let fits = types.iter().any(|t| match *t {
        "null" => value.is_null(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        "number" => value.is_number(),
        "integer" => value.as_i64().is_some() || value.as_u64().is_some(),
        _ => true,
    });
    let wanted = types
        .iter()
        .filter(|t| **t != "null")
        .copied()
        .collect::<Vec<_>>()
        .join(" or ");
    if !fits {
        return Some(format!("must be {wanted}"));
    }
    if let (Some(min), Some(n)) = (prop.get("minimum").and_then(Value::as_f64), value.as_f64())
        && n < min
    {
        return Some(format!("must be at least {min}"));
    }
    if let Some(options) = prop.get("enum").and_then(Value::as_array)
        && !value.is_null()
        && !options.contains(value)
    {
        let names: Vec<String> = options.iter().map(|o| o.to_string()).collect();
        return Some(format!("must be one of {}", names.join(", ")));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn names_the_field_with_a_wrong_type_or_range() {
        let schema = obj(json!({"properties": {
            "offset": {"type": ["integer", "null"], "minimum": 0},
            "code": {"type": "string"},
            "stream": {"type": "string", "enum": ["stdout", "stderr"]}
        }}));
        assert_eq!(
            explain(&schema, &obj(json!({"offset": -1}))).unwrap(),
            "`offset` must be at least 0, got -1"
        );
        assert_eq!(
            explain(&schema, &obj(json!({"code": 5}))).unwrap(),
            "`code` must be string, got 5"
        );
        assert!(
            explain(&schema, &obj(json!({"stream": "stdin"})))
                .unwrap()
                .starts_with("`stream` must be one of")
        );
        assert!(
            explain(&schema, &obj(json!({"bogus": 1})))
                .unwrap()
                .contains("`bogus` is not an argument")
        );
        assert_eq!(
            explain(&schema, &obj(json!({"code": "x", "offset": 3}))),
            None
        );
    }
}
