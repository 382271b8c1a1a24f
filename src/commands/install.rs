//! `install --client NAME`: add this server to an MCP client's configuration, editing the
//! client's file in place without damaging it.
//!
//! | client         | file                                                  | map                           |
//! |----------------|-------------------------------------------------------|-------------------------------|
//! | claude         | `~/.claude.json`                                      | `mcpServers.NAME` (JSON)      |
//! | claude-desktop | `$XDG_CONFIG_HOME/Claude/claude_desktop_config.json`  | `mcpServers.NAME` (JSON)      |
//! | codex          | `$CODEX_HOME/config.toml` (`~/.codex/config.toml`)    | `[mcp_servers.NAME]` (TOML)   |
//! | cursor         | `~/.cursor/mcp.json`                                  | `mcpServers.NAME` (JSONC)     |
//! | vscode         | `WORKSPACE/.vscode/mcp.json`                          | `servers.NAME` (JSONC)        |
//!
//! Exactly one entry, `--name`, is added or updated; the rest of the file is kept as it
//! was, comments and key order included ([`edit_toml`], [`edit_json`]). A symlinked
//! file is followed and its target written; owner and mode are kept; the write is atomic
//! ([`file`]). `--print` shows the change as a unified diff and writes nothing. The entry
//! carries the TLS, proxy and uv index variables set at install time ([`env`]).

pub(crate) mod edit_json;
pub(crate) mod edit_toml;
pub(crate) mod env;
pub(crate) mod file;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use thiserror::Error;

use crate::cli::{Client, InstallArgs, SandboxState};
use edit_json::Shape;

/// What the client should run: the binary, its arguments, extra environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// Why a configuration file could not be edited.
#[derive(Debug, Error)]
pub(crate) enum EditError {
    #[error("the file is not valid {format} ({detail}); fix or move it, then retry")]
    Syntax {
        format: &'static str,
        detail: String,
    },
    #[error("the top level is not an object; fix or move the file, then retry")]
    TopNotAnObject,
    #[error("`{0}` is not an object (table); fix it, then retry")]
    NotAnObject(&'static str),
}

/// How a client's file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Toml,
    Json(Shape),
}

/// Where a client's configuration lives and in which format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub path: PathBuf,
    pub format: Format,
}

/// The directories the configuration paths are built from.
#[derive(Debug, Clone, Default)]
pub(crate) struct Locations {
    pub home: Option<PathBuf>,
    /// `$XDG_CONFIG_HOME` (Claude Desktop); default `~/.config`.
    pub xdg_config_home: Option<PathBuf>,
    /// `$CODEX_HOME` (Codex); default `~/.codex`.
    pub codex_home: Option<PathBuf>,
    /// The project directory (VS Code's `.vscode/mcp.json` lives there).
    pub workspace: PathBuf,
}

impl Locations {
    fn from_process(workspace: Option<&Path>) -> anyhow::Result<Self> {
        let non_empty = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let workspace = match workspace {
            Some(ws) => ws.to_path_buf(),
            None => std::env::current_dir().context("cannot read the current directory")?,
        };
        Ok(Locations {
            home: non_empty("HOME"),
            xdg_config_home: non_empty("XDG_CONFIG_HOME").filter(|p| p.is_absolute()),
            codex_home: non_empty("CODEX_HOME"),
            workspace,
        })
    }
}

/// The sandbox state written when `--sandbox-state` is not given: Codex tells the server
/// its own sandbox (`codex/sandbox-state`), so it gets `inherit`.
pub(crate) fn default_state(client: Client) -> SandboxState {
    match client {
        Client::Codex => SandboxState::Inherit,
        _ => SandboxState::WorkspaceWrite,
    }
}

pub(crate) fn target(client: Client, loc: &Locations) -> Result<Target, TargetError> {
    let home = || loc.home.clone().ok_or(TargetError::NoHome);
    let json = |servers_key, with_type, jsonc| {
        Format::Json(Shape {
            servers_key,
            with_type,
            jsonc,
        })
    };
    Ok(match client {
        Client::Claude => Target {
            path: home()?.join(".claude.json"),
            format: json("mcpServers", true, false),
        },
        Client::ClaudeDesktop => Target {
            path: match &loc.xdg_config_home {
                Some(dir) => dir.clone(),
                None => home()?.join(".config"),
            }
            .join("Claude")
            .join("claude_desktop_config.json"),
            format: json("mcpServers", false, false),
        },
        Client::Codex => Target {
            path: match &loc.codex_home {
                Some(dir) => dir.clone(),
                None => home()?.join(".codex"),
            }
            .join("config.toml"),
            format: Format::Toml,
        },
        Client::Cursor => Target {
            path: home()?.join(".cursor").join("mcp.json"),
            format: json("mcpServers", true, true),
        },
        Client::Vscode => Target {
            path: loc.workspace.join(".vscode").join("mcp.json"),
            format: json("servers", true, true),
        },
    })
}

#[derive(Debug, Error)]
pub(crate) enum TargetError {
    #[error("HOME is not set, so the client's configuration cannot be found; set HOME and retry")]
    NoHome,
}

pub(crate) fn install(args: InstallArgs) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find the path of this executable")?;
    let state = args.sandbox_state.unwrap_or(default_state(args.client));
    let passed = if args.no_env {
        env::PassThrough::default()
    } else {
        env::pass_through(|name| std::env::var(name).ok())
    };
    let mut entry = entry_for(&exe, state, args.workspace.as_deref(), passed.vars.clone())?;
    let r = args.interpreter == Some(crate::repl::Language::R);
    if let Some(language) = args.interpreter {
        entry
            .args
            .extend(["--interpreter".to_string(), language.to_string()]);
    }
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| if r { "sandbox-repl-r" } else { "sandbox-repl" }.to_string());
    let loc = Locations::from_process(args.workspace.as_deref())?;
    let target = target(args.client, &loc)?;
    let real = file::resolve_links(&target.path)?;
    let before = file::read_existing(&real)?;
    let after = merge(
        target.format,
        before.as_deref().unwrap_or(""),
        &name,
        &entry,
    )
    .with_context(|| format!("cannot update {}", real.display()))?;
    let shown = if real == target.path {
        target.path.display().to_string()
    } else {
        format!("{} -> {}", target.path.display(), real.display())
    };
    if !passed.withheld.is_empty() {
        eprintln!(
            "mcp-sandbox-repl: not copied (the value holds credentials; add it to the entry's \
             env by hand if the server needs it): {}",
            passed.withheld.join(", ")
        );
    }
    if args.print {
        print!(
            "{}",
            diff(&target.path, before.as_deref().unwrap_or(""), &after)
        );
        if before.as_deref() == Some(after.as_str()) {
            eprintln!("mcp-sandbox-repl: {shown} already has this entry; nothing to change");
        }
        return Ok(ExitCode::SUCCESS);
    }
    if before.as_deref() == Some(after.as_str()) {
        eprintln!("mcp-sandbox-repl: {shown} already has this entry; left as it is");
        return Ok(ExitCode::SUCCESS);
    }
    file::replace_atomically(&real, &after)?;
    let env_names: Vec<&str> = entry.env.iter().map(|(k, _)| k.as_str()).collect();
    eprintln!(
        "mcp-sandbox-repl: wrote server {:?} to {shown}: {} {}{}",
        name,
        entry.command,
        entry.args.join(" "),
        if env_names.is_empty() {
            String::new()
        } else {
            format!(" (env: {})", env_names.join(", "))
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// Arguments the client passes to the server: explicit sandbox state, workspace if given.
pub(crate) fn entry_for(
    exe: &Path,
    state: SandboxState,
    workspace: Option<&Path>,
    env: Vec<(String, String)>,
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
        env,
    })
}

/// `existing` (empty for a missing file) with the entry `name` set to `entry`.
pub(crate) fn merge(
    format: Format,
    existing: &str,
    name: &str,
    entry: &Entry,
) -> Result<String, EditError> {
    match format {
        Format::Toml => edit_toml::merge(existing, name, entry),
        Format::Json(shape) => edit_json::merge(existing, shape, name, entry),
    }
}

/// A unified diff from `before` to `after`, headed with `path` (empty if equal).
pub(crate) fn diff(path: &Path, before: &str, after: &str) -> String {
    let name = path.display().to_string();
    similar::TextDiff::from_lines(before, after)
        .unified_diff()
        .context_radius(3)
        .header(&name, &name)
        .to_string()
}

#[cfg(test)]
mod tests;
