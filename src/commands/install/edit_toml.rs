//! Codex's `config.toml`: set one `[mcp_servers.NAME]` entry with `toml_edit`, which keeps
//! every comment, blank line and key order of the rest of the file.
//!
//! An existing entry is updated in place: `command` and `args` are replaced (keeping the
//! comments around them), pass-through variables are set in its `env`, and every other key
//! the user added (`enabled`, `startup_timeout_sec`, their own `env` values, ...) stays.

use toml_edit::{Array, DocumentMut, InlineTable, Item, Table, TableLike, Value};

use super::{EditError, Entry};

/// Codex's per-call timeout for our entry when the user has not set one. Long Python
/// jobs return a job id long before this; it only guards a stuck client.
const TOOL_TIMEOUT_SEC: i64 = 600;

/// `existing` (empty for a new file) with the entry `name` set to `entry`.
pub(crate) fn merge(existing: &str, name: &str, entry: &Entry) -> Result<String, EditError> {
    let mut doc: DocumentMut =
        existing
            .parse()
            .map_err(|e: toml_edit::TomlError| EditError::Syntax {
                format: "TOML",
                detail: e.to_string(),
            })?;
    let servers = doc.as_table_mut().entry("mcp_servers").or_insert_with(|| {
        let mut t = Table::new();
        t.set_implicit(true);
        Item::Table(t)
    });
    let servers = servers
        .as_table_like_mut()
        .ok_or(EditError::NotAnObject("mcp_servers"))?;
    match servers.get_mut(name).and_then(Item::as_table_like_mut) {
        Some(existing) => update(existing, entry),
        None => {
            servers.insert(name, Item::Table(fresh(entry)));
        }
    }
    Ok(doc.to_string())
}

fn args(entry: &Entry) -> Value {
    Value::Array(entry.args.iter().map(String::as_str).collect::<Array>())
}

fn env(entry: &Entry) -> InlineTable {
    entry
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), Value::from(v.as_str())))
        .collect()
}

fn fresh(entry: &Entry) -> Table {
    let mut t = Table::new();
    t.insert("command", toml_edit::value(entry.command.as_str()));
    t.insert("args", Item::Value(args(entry)));
    if !entry.env.is_empty() {
        t.insert("env", Item::Value(Value::InlineTable(env(entry))));
    }
    t.insert("tool_timeout_sec", toml_edit::value(TOOL_TIMEOUT_SEC));
    t
}

/// Replace the value at `key`, keeping the comments and spacing around the old one.
fn set_value(table: &mut dyn TableLike, key: &str, mut new: Value) {
    match table.get_mut(key) {
        Some(Item::Value(old)) => {
            *new.decor_mut() = old.decor().clone();
            *old = new;
        }
        Some(other) => *other = Item::Value(new),
        None => {
            table.insert(key, Item::Value(new));
        }
    }
}

fn update(table: &mut dyn TableLike, entry: &Entry) {
    set_value(table, "command", Value::from(entry.command.as_str()));
    set_value(table, "args", args(entry));
    if !entry.env.is_empty() {
        match table.get_mut("env").and_then(Item::as_table_like_mut) {
            Some(env) => {
                for (k, v) in &entry.env {
                    set_value(env, k, Value::from(v.as_str()));
                }
            }
            None => set_value(table, "env", Value::InlineTable(env(entry))),
        }
    }
    if !table.contains_key("tool_timeout_sec") {
        table.insert("tool_timeout_sec", toml_edit::value(TOOL_TIMEOUT_SEC));
    }
}
