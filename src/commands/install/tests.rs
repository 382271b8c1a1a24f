//! Whole-file tests of the config editors: every expected file is written out in full,
//! so a lost comment, a moved key or a reformatted line fails the test.

use super::*;

fn entry(env: &[(&str, &str)]) -> Entry {
    Entry {
        command: "/opt/bin/mcp-sandbox-repl".into(),
        args: vec!["--sandbox-state".into(), "inherit".into()],
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn json(servers_key: &'static str, with_type: bool, jsonc: bool) -> Format {
    Format::Json(Shape {
        servers_key,
        with_type,
        jsonc,
    })
}

const CERT: (&str, &str) = ("SSL_CERT_FILE", "/etc/ssl/corp.pem");

#[test]
fn toml_new_entry_keeps_comments_order_and_other_tables() {
    let before = "\
# my codex config
model = \"o3\"  # fast

[mcp_servers.other]
command = \"x\" # keep

[profiles.fast]
model = \"o4\"
";
    let after = merge(Format::Toml, before, "sandbox-repl", &entry(&[CERT])).unwrap();
    assert_eq!(
        after,
        "\
# my codex config
model = \"o3\"  # fast

[mcp_servers.other]
command = \"x\" # keep

[mcp_servers.sandbox-repl]
command = \"/opt/bin/mcp-sandbox-repl\"
args = [\"--sandbox-state\", \"inherit\"]
env = { SSL_CERT_FILE = \"/etc/ssl/corp.pem\" }
tool_timeout_sec = 600

[profiles.fast]
model = \"o4\"
"
    );
}

#[test]
fn toml_existing_entry_is_updated_in_place_keeping_user_keys() {
    let before = "\
[mcp_servers.sandbox-repl]
# ours
command = \"/old\"
args = [\"a\"]
enabled = false
tool_timeout_sec = 60

[mcp_servers.sandbox-repl.env]
FOO = \"1\"
";
    let after = merge(Format::Toml, before, "sandbox-repl", &entry(&[CERT])).unwrap();
    assert_eq!(
        after,
        "\
[mcp_servers.sandbox-repl]
# ours
command = \"/opt/bin/mcp-sandbox-repl\"
args = [\"--sandbox-state\", \"inherit\"]
enabled = false
tool_timeout_sec = 60

[mcp_servers.sandbox-repl.env]
FOO = \"1\"
SSL_CERT_FILE = \"/etc/ssl/corp.pem\"
"
    );
    // A second run changes nothing.
    assert_eq!(
        merge(Format::Toml, &after, "sandbox-repl", &entry(&[CERT])).unwrap(),
        after
    );
}

#[test]
fn toml_inline_server_map_and_new_file() {
    let before = "mcp_servers = { other = { command = \"x\" } }\n";
    let after = merge(Format::Toml, before, "r", &entry(&[])).unwrap();
    let parsed: toml::Table = after.parse().unwrap();
    assert_eq!(
        parsed["mcp_servers"]["other"]["command"].as_str(),
        Some("x")
    );
    assert_eq!(
        parsed["mcp_servers"]["r"]["command"].as_str(),
        Some("/opt/bin/mcp-sandbox-repl")
    );
    assert_eq!(
        merge(Format::Toml, "", "r", &entry(&[])).unwrap(),
        "\
[mcp_servers.r]
command = \"/opt/bin/mcp-sandbox-repl\"
args = [\"--sandbox-state\", \"inherit\"]
tool_timeout_sec = 600
"
    );
}

#[test]
fn json_keeps_key_order_and_indentation() {
    let before = "{\n  \"zeta\": 1,\n  \"mcpServers\": {\n    \"other\": {\n      \"command\": \"x\"\n    }\n  },\n  \"alpha\": [1, 2]\n}\n";
    let after = merge(
        json("mcpServers", true, false),
        before,
        "sandbox-repl",
        &entry(&[CERT]),
    )
    .unwrap();
    assert_eq!(
        after,
        r#"{
  "zeta": 1,
  "mcpServers": {
    "other": {
      "command": "x"
    },
    "sandbox-repl": {
      "type": "stdio",
      "command": "/opt/bin/mcp-sandbox-repl",
      "args": ["--sandbox-state", "inherit"],
      "env": {
        "SSL_CERT_FILE": "/etc/ssl/corp.pem"
      }
    }
  },
  "alpha": [1, 2]
}
"#
    );
}

#[test]
fn jsonc_keeps_comments_and_trailing_commas() {
    let before = "// Cursor servers\n{\n    \"mcpServers\": {\n        // the other one\n        \"other\": { \"command\": \"x\", },\n    },\n}\n";
    let after = merge(
        json("mcpServers", true, true),
        before,
        "sandbox-repl",
        &entry(&[]),
    )
    .unwrap();
    assert_eq!(
        after,
        r#"// Cursor servers
{
    "mcpServers": {
        // the other one
        "other": { "command": "x", },
        "sandbox-repl": {
            "type": "stdio",
            "command": "/opt/bin/mcp-sandbox-repl",
            "args": ["--sandbox-state", "inherit"],
        },
    },
}
"#
    );
}

#[test]
fn json_existing_entry_keeps_other_keys_and_env_values() {
    let before = r#"{"mcpServers": {"r": {"command": "/old", "cwd": "/w", "env": {"A": "1"}}}}"#;
    let after = merge(
        json("mcpServers", false, false),
        before,
        "r",
        &entry(&[CERT]),
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&after).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"mcpServers": {"r": {
            "command": "/opt/bin/mcp-sandbox-repl",
            "cwd": "/w",
            "env": {"A": "1", "SSL_CERT_FILE": "/etc/ssl/corp.pem"},
            "args": ["--sandbox-state", "inherit"],
        }}})
    );
    let keys: Vec<_> = v["mcpServers"]["r"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(keys.len(), 4);
}

#[test]
fn vscode_new_file_uses_servers_and_stdio_type() {
    let after = merge(json("servers", true, true), "", "sandbox-repl", &entry(&[])).unwrap();
    assert_eq!(
        after,
        r#"{
  "servers": {
    "sandbox-repl": {
      "type": "stdio",
      "command": "/opt/bin/mcp-sandbox-repl",
      "args": ["--sandbox-state", "inherit"]
    }
  }
}
"#
    );
}

#[test]
fn hostile_values_are_escaped_not_injected() {
    let mut e = entry(&[("HTTPS_PROXY", "http://p:1\"}, \"x\": {\"")]);
    e.command = "/opt/a \"quoted\"\\path\n".into();
    for format in [Format::Toml, json("mcpServers", true, false)] {
        let after = merge(format, "", "we\"ird]name", &e).unwrap();
        let (command, proxy) = match format {
            Format::Toml => {
                let t: toml::Table = after.parse().unwrap();
                let s = &t["mcp_servers"]["we\"ird]name"];
                (
                    s["command"].as_str().unwrap().to_string(),
                    s["env"]["HTTPS_PROXY"].as_str().unwrap().to_string(),
                )
            }
            Format::Json(_) => {
                let v: serde_json::Value = serde_json::from_str(&after).unwrap();
                let s = &v["mcpServers"]["we\"ird]name"];
                (
                    s["command"].as_str().unwrap().to_string(),
                    s["env"]["HTTPS_PROXY"].as_str().unwrap().to_string(),
                )
            }
        };
        assert_eq!(command, e.command);
        assert_eq!(proxy, e.env[0].1);
    }
}

#[test]
fn broken_or_misshapen_files_are_refused() {
    let strict = json("mcpServers", true, false);
    let jsonc = json("mcpServers", true, true);
    let refused = |format, text: &str| merge(format, text, "n", &entry(&[])).is_err();
    assert!(refused(strict, "{not json"));
    assert!(refused(strict, "[]"));
    assert!(refused(strict, "{\"mcpServers\": 3}"));
    // Plain-JSON clients reject comments, so we do too; JSONC clients accept them.
    assert!(refused(strict, "// c\n{}"));
    assert!(!refused(jsonc, "// c\n{}"));
    assert!(refused(jsonc, "{'single': 1}"));
    assert!(refused(Format::Toml, "[broken"));
    assert!(refused(Format::Toml, "mcp_servers = 3"));
    let err = merge(strict, "{not json", "n", &entry(&[])).unwrap_err();
    assert!(err.to_string().contains("not valid JSON"), "{err}");
}

#[test]
fn targets_per_client() {
    let loc = Locations {
        home: Some("/h".into()),
        xdg_config_home: None,
        codex_home: None,
        workspace: "/w".into(),
    };
    let path = |c| target(c, &loc).unwrap().path;
    assert_eq!(path(Client::Claude), PathBuf::from("/h/.claude.json"));
    assert_eq!(
        path(Client::ClaudeDesktop),
        PathBuf::from("/h/.config/Claude/claude_desktop_config.json")
    );
    assert_eq!(path(Client::Codex), PathBuf::from("/h/.codex/config.toml"));
    assert_eq!(path(Client::Cursor), PathBuf::from("/h/.cursor/mcp.json"));
    assert_eq!(path(Client::Vscode), PathBuf::from("/w/.vscode/mcp.json"));
    let moved = Locations {
        home: None,
        xdg_config_home: Some("/x".into()),
        codex_home: Some("/c".into()),
        workspace: "/w".into(),
    };
    assert_eq!(
        target(Client::Codex, &moved).unwrap().path,
        PathBuf::from("/c/config.toml")
    );
    assert_eq!(
        target(Client::ClaudeDesktop, &moved).unwrap().path,
        PathBuf::from("/x/Claude/claude_desktop_config.json")
    );
    assert!(target(Client::Claude, &moved).is_err());
    assert_eq!(default_state(Client::Codex), SandboxState::Inherit);
    assert_eq!(default_state(Client::Cursor), SandboxState::WorkspaceWrite);
}

#[test]
fn diff_is_unified_and_empty_when_nothing_changes() {
    let d = diff(Path::new("/h/c.toml"), "a = 1\n", "a = 1\nb = 2\n");
    assert_eq!(
        d,
        "--- /h/c.toml\n+++ /h/c.toml\n@@ -1 +1,2 @@\n a = 1\n+b = 2\n"
    );
    assert_eq!(diff(Path::new("/h/c.toml"), "a = 1\n", "a = 1\n"), "");
}
