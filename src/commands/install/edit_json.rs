//! JSON and JSONC client configs (Claude Code, Claude Desktop, Cursor, VS Code): set one
//! server entry by editing the file's concrete syntax tree (`jsonc-parser`'s CST), so the
//! rest of the file keeps its key order, indentation, comments and trailing commas byte
//! for byte. Plain JSON files are parsed strictly (their clients reject comments);
//! JSONC files (Cursor, VS Code) accept comments and trailing commas.
//!
//! An existing entry is updated in place: `type`, `command` and `args` are replaced,
//! pass-through variables are set in its `env`, other keys are kept.

use jsonc_parser::ParseOptions;
use jsonc_parser::cst::{CstInputValue, CstObject, CstRootNode};

use super::{EditError, Entry};

/// How one client lays out its servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    /// The top-level key holding the server map (`mcpServers`, or `servers` for VS Code).
    pub servers_key: &'static str,
    /// Whether entries carry `"type": "stdio"`.
    pub with_type: bool,
    /// Whether the file may hold comments and trailing commas.
    pub jsonc: bool,
}

fn parse_options(jsonc: bool) -> ParseOptions {
    ParseOptions {
        allow_comments: jsonc,
        allow_trailing_commas: jsonc,
        allow_loose_object_property_names: false,
        allow_missing_commas: false,
        allow_single_quoted_strings: false,
        allow_hexadecimal_numbers: false,
        allow_unary_plus_numbers: false,
        allow_bare_decimal_point_numbers: false,
        allow_non_finite_numbers: false,
        allow_extended_string_escapes: false,
    }
}

/// `existing` (empty for a new file) with the entry `name` set to `entry`.
pub(crate) fn merge(
    existing: &str,
    shape: Shape,
    name: &str,
    entry: &Entry,
) -> Result<String, EditError> {
    let fresh_file = existing.trim().is_empty();
    let text = if fresh_file { "{}\n" } else { existing };
    let format = if shape.jsonc {
        "JSON (comments allowed)"
    } else {
        "JSON"
    };
    if !shape.jsonc {
        // The CST parser keeps comments whatever its options say; a plain-JSON client
        // would choke on them, so plain JSON is checked strictly first.
        serde_json::from_str::<serde::de::IgnoredAny>(text).map_err(|e| EditError::Syntax {
            format,
            detail: e.to_string(),
        })?;
    }
    let root =
        CstRootNode::parse(text, &parse_options(shape.jsonc)).map_err(|e| EditError::Syntax {
            format,
            detail: e.to_string(),
        })?;
    let top = root
        .object_value_or_create()
        .ok_or(EditError::TopNotAnObject)?;
    let servers = top
        .object_value_or_create(shape.servers_key)
        .ok_or(EditError::NotAnObject(shape.servers_key))?;
    match servers.get(name) {
        Some(prop) => match prop.object_value() {
            Some(existing) => update(&existing, shape, entry)?,
            None => prop.set_value(fresh(shape, entry)),
        },
        None => {
            servers.append(name, fresh(shape, entry));
        }
    }
    Ok(root.to_string())
}

fn string(s: &str) -> CstInputValue {
    CstInputValue::String(s.to_string())
}

fn args(entry: &Entry) -> CstInputValue {
    CstInputValue::Array(entry.args.iter().map(|a| string(a)).collect())
}

fn env(entry: &Entry) -> CstInputValue {
    CstInputValue::Object(
        entry
            .env
            .iter()
            .map(|(k, v)| (k.clone(), string(v)))
            .collect(),
    )
}

fn fresh(shape: Shape, entry: &Entry) -> CstInputValue {
    let mut props = Vec::new();
    if shape.with_type {
        props.push(("type".to_string(), string("stdio")));
    }
    props.push(("command".to_string(), string(&entry.command)));
    props.push(("args".to_string(), args(entry)));
    if !entry.env.is_empty() {
        props.push(("env".to_string(), env(entry)));
    }
    CstInputValue::Object(props)
}

fn set(obj: &CstObject, key: &str, value: CstInputValue) {
    match obj.get(key) {
        Some(prop) => prop.set_value(value),
        None => {
            obj.append(key, value);
        }
    }
}

fn update(obj: &CstObject, shape: Shape, entry: &Entry) -> Result<(), EditError> {
    if shape.with_type {
        set(obj, "type", string("stdio"));
    }
    set(obj, "command", string(&entry.command));
    set(obj, "args", args(entry));
    if !entry.env.is_empty() {
        let env = obj
            .object_value_or_create("env")
            .ok_or(EditError::NotAnObject("env"))?;
        for (k, v) in &entry.env {
            set(&env, k, string(v));
        }
    }
    Ok(())
}
