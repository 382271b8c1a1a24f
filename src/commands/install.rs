//! `install --client claude|codex|cursor`: write MCP client configuration for this binary.
//!
//! Each client keeps a map of MCP servers in its own file. We add (or replace) exactly one
//! entry, named `--name`, and leave every other key of the file as it was. Files are
//! written to a temporary sibling and renamed, so a crash never leaves half a config.
//!
//! | client | file                     | map                          |
//! |--------|--------------------------|------------------------------|
//! | claude | `~/.claude.json`         | `mcpServers.NAME` (JSON)     |
//! | codex  | `~/.codex/config.toml`   | `[mcp_servers.NAME]` (TOML)  |
//! | cursor | `~/.cursor/mcp.json`     | `mcpServers.NAME` (JSON)     |

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::cli::{Client, InstallArgs, SandboxState};

/// What the client should run: the binary and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub command: String,
    pub args: Vec<String>,
}

pub fn install(args: InstallArgs) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find the path of this executable")?;
    let entry = entry_for(&exe, args.sandbox_state, args.workspace.as_deref())?;
    if args.print {
        print!("{}", render_fresh(args.client, &args.name, &entry)?);
        return Ok(ExitCode::SUCCESS);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).context(
        "HOME is not set; cannot locate the client's configuration (use --print instead)",
    )?;
    let path = config_path(args.client, &home);
    let existing = match std::fs::read_to_string(&path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let merged = merge(args.client, existing.as_deref(), &args.name, &entry)
        .with_context(|| format!("cannot update {}", path.display()))?;
    write_atomically(&path, &merged)?;
    eprintln!(
        "mcp-sandbox-repl: wrote server {:?} to {} ({} {})",
        args.name,
        path.display(),
        entry.command,
        entry.args.join(" ")
    );
    Ok(ExitCode::SUCCESS)
}

/// Arguments the client passes to the server: explicit sandbox state, workspace if given.
pub fn entry_for(
    exe: &Path,
    state: SandboxState,
    workspace: Option<&Path>,
) -> anyhow::Result<Entry> {
    let state = match state {
        SandboxState::ReadOnly => "read-only",
        SandboxState::WorkspaceWrite => "workspace-write",
        SandboxState::DangerFullAccess => "danger-full-access",
        SandboxState::Inherit => "inherit",
    };
    let mut args = vec!["--sandbox-state".to_string(), state.to_string()];
    if let Some(ws) = workspace {
        let ws = std::path::absolute(ws)
            .with_context(|| format!("bad workspace path {}", ws.display()))?;
        args.push("--workspace".into());
        args.push(ws.to_string_lossy().into_owned());
    }
    Ok(Entry {
        command: exe.to_string_lossy().into_owned(),
        args,
    })
}

pub fn config_path(client: Client, home: &Path) -> PathBuf {
    match client {
        Client::Claude => home.join(".claude.json"),
        Client::Codex => home.join(".codex").join("config.toml"),
        Client::Cursor => home.join(".cursor").join("mcp.json"),
    }
}

/// The configuration text for one entry alone (what `--print` shows).
pub fn render_fresh(client: Client, name: &str, entry: &Entry) -> anyhow::Result<String> {
    merge(client, None, name, entry)
}

/// `existing` with the entry `name` set to `entry`; everything else kept.
pub fn merge(
    client: Client,
    existing: Option<&str>,
    name: &str,
    entry: &Entry,
) -> anyhow::Result<String> {
    match client {
        Client::Claude | Client::Cursor => merge_json(existing, name, entry),
        Client::Codex => merge_toml(existing, name, entry),
    }
}

fn merge_json(existing: Option<&str>, name: &str, entry: &Entry) -> anyhow::Result<String> {
    let mut root: Value = match existing {
        Some(text) if !text.trim().is_empty() => serde_json::from_str(text)
            .context("the file is not valid JSON; fix or move it, then retry")?,
        _ => json!({}),
    };
    let Some(obj) = root.as_object_mut() else {
        bail!("the file's top level is not a JSON object; fix or move it, then retry");
    };
    let servers = obj.entry("mcpServers").or_insert_with(|| json!({}));
    let Some(servers) = servers.as_object_mut() else {
        bail!("`mcpServers` is not a JSON object; fix it, then retry");
    };
    servers.insert(
        name.to_string(),
        json!({ "type": "stdio", "command": entry.command, "args": entry.args }),
    );
    Ok(serde_json::to_string_pretty(&root)? + "\n")
}

fn merge_toml(existing: Option<&str>, name: &str, entry: &Entry) -> anyhow::Result<String> {
    let mut root: toml::Table = match existing {
        Some(text) => text
            .parse()
            .context("the file is not valid TOML; fix or move it, then retry")?,
        None => toml::Table::new(),
    };
    let servers = root
        .entry("mcp_servers")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let Some(servers) = servers.as_table_mut() else {
        bail!("`mcp_servers` is not a table; fix it, then retry");
    };
    let mut table = toml::Table::new();
    table.insert("command".into(), toml::Value::String(entry.command.clone()));
    table.insert(
        "args".into(),
        toml::Value::Array(
            entry
                .args
                .iter()
                .cloned()
                .map(toml::Value::String)
                .collect(),
        ),
    );
    // Long Python jobs return a job id long before this; it only guards a stuck client.
    table.insert("tool_timeout_sec".into(), toml::Value::Integer(600));
    servers.insert(name.to_string(), toml::Value::Table(table));
    Ok(toml::to_string_pretty(&root)?)
}

fn write_atomically(path: &Path, text: &str) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .context("configuration path has no parent directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = dir.join(format!(
        ".{}.mcp-sandbox-repl.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    ));
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot replace {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        Entry {
            command: "/bin/mcp-sandbox-repl".into(),
            args: vec!["--sandbox-state".into(), "workspace-write".into()],
        }
    }

    #[test]
    fn json_merge_keeps_other_servers_and_keys() {
        let before = r#"{"theme":"dark","mcpServers":{"other":{"command":"x"}}}"#;
        let after = merge(Client::Claude, Some(before), "sandbox-repl", &entry()).unwrap();
        let v: Value = serde_json::from_str(&after).unwrap();
        assert_eq!(v["theme"], "dark");
        assert_eq!(v["mcpServers"]["other"]["command"], "x");
        assert_eq!(
            v["mcpServers"]["sandbox-repl"]["command"],
            "/bin/mcp-sandbox-repl"
        );
        assert_eq!(
            v["mcpServers"]["sandbox-repl"]["args"][1],
            "workspace-write"
        );
    }

    #[test]
    fn json_merge_refuses_broken_files() {
        assert!(merge(Client::Cursor, Some("{not json"), "n", &entry()).is_err());
        assert!(merge(Client::Cursor, Some("[]"), "n", &entry()).is_err());
    }

    #[test]
    fn toml_merge_keeps_other_tables() {
        let before = "model = \"o3\"\n[mcp_servers.other]\ncommand = \"x\"\n";
        let after = merge(Client::Codex, Some(before), "sandbox-repl", &entry()).unwrap();
        let t: toml::Table = after.parse().unwrap();
        assert_eq!(t["model"].as_str(), Some("o3"));
        assert_eq!(t["mcp_servers"]["other"]["command"].as_str(), Some("x"));
        assert_eq!(
            t["mcp_servers"]["sandbox-repl"]["command"].as_str(),
            Some("/bin/mcp-sandbox-repl")
        );
    }
}
