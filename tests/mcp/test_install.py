"""`install --client ...` edits each client's config in place without damaging it.

Every check compares the WHOLE file with the expected text: a lost comment, a reordered
key, a replaced symlink or a widened mode fails the test.
"""

import json
import os
import stat
import subprocess

import pytest

from conftest import binary


def run_install(home, *args, env=None, cwd=None):
    base = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    base.update(env or {})
    return subprocess.run(
        [binary(), "install", *args], env=base, capture_output=True, text=True, timeout=30, cwd=cwd
    )


def q(s: str) -> str:
    """A string as both TOML and JSON write it (our paths need no special escapes)."""
    return json.dumps(s)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


CODEX_BEFORE = """\
# Codex settings, kept in dotfiles
model = "o3"   # the fast one

[mcp_servers.other]
command = "x"  # do not touch
args = ["--flag"]

# profiles below
[profiles.deep]
model = "o4"
"""


def test_codex_commented_toml_through_a_symlink(tmp_path):
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    real = dotfiles / "codex.toml"
    real.write_text(CODEX_BEFORE)
    os.chmod(real, 0o640)
    (tmp_path / ".codex").mkdir()
    link = tmp_path / ".codex" / "config.toml"
    link.symlink_to("../dotfiles/codex.toml")

    out = run_install(tmp_path, "--client", "codex")
    assert out.returncode == 0, out.stderr

    assert link.is_symlink() and os.readlink(link) == "../dotfiles/codex.toml"
    assert mode(real) == 0o640
    assert real.read_text() == f"""\
# Codex settings, kept in dotfiles
model = "o3"   # the fast one

[mcp_servers.other]
command = "x"  # do not touch
args = ["--flag"]

[mcp_servers.sandbox-repl]
command = {q(binary())}
args = ["--sandbox-state", "inherit"]
tool_timeout_sec = 600

# profiles below
[profiles.deep]
model = "o4"
"""
    assert sorted(p.name for p in dotfiles.iterdir()) == ["codex.toml"], "a temporary file was left behind"
    assert "-> " in out.stderr and "codex.toml" in out.stderr


def test_claude_json_keeps_mode_0600_order_and_other_entries(tmp_path):
    before = """\
{
  "numStartups": 12,
  "theme": "dark",
  "mcpServers": {
    "other": {
      "type": "stdio",
      "command": "x",
      "args": []
    }
  },
  "projects": {
    "/w": {
      "allowedTools": []
    }
  }
}
"""
    cfg = tmp_path / ".claude.json"
    cfg.write_text(before)
    os.chmod(cfg, 0o600)
    out = run_install(tmp_path, "--client", "claude", "--workspace", str(tmp_path / "w"))
    assert out.returncode == 0, out.stderr
    assert mode(cfg) == 0o600
    assert cfg.read_text() == f"""\
{{
  "numStartups": 12,
  "theme": "dark",
  "mcpServers": {{
    "other": {{
      "type": "stdio",
      "command": "x",
      "args": []
    }},
    "sandbox-repl": {{
      "type": "stdio",
      "command": {q(binary())},
      "args": ["--sandbox-state", "workspace-write", "--workspace", {q(str(tmp_path / "w"))}]
    }}
  }},
  "projects": {{
    "/w": {{
      "allowedTools": []
    }}
  }}
}}
"""


def test_cursor_jsonc_keeps_comments_and_trailing_commas(tmp_path):
    (tmp_path / ".cursor").mkdir()
    cfg = tmp_path / ".cursor" / "mcp.json"
    cfg.write_text("""\
// Cursor MCP servers
{
  "mcpServers": {
    /* the docs server */
    "docs": { "url": "http://localhost:9000/mcp", },
  },
}
""")
    out = run_install(tmp_path, "--client", "cursor", "--name", "repl", "--sandbox-state", "read-only")
    assert out.returncode == 0, out.stderr
    assert cfg.read_text() == f"""\
// Cursor MCP servers
{{
  "mcpServers": {{
    /* the docs server */
    "docs": {{ "url": "http://localhost:9000/mcp", }},
    "repl": {{
      "type": "stdio",
      "command": {q(binary())},
      "args": ["--sandbox-state", "read-only"],
    }},
  }},
}}
"""


def test_existing_entry_is_updated_in_place_and_a_rerun_changes_nothing(tmp_path):
    (tmp_path / ".codex").mkdir()
    cfg = tmp_path / ".codex" / "config.toml"
    cfg.write_text("""\
[mcp_servers.sandbox-repl]
command = "/old/mcp-sandbox-repl"  # moved since
args = ["--sandbox-state", "read-only"]
startup_timeout_sec = 30
""")
    out = run_install(tmp_path, "--client", "codex")
    assert out.returncode == 0, out.stderr
    expected = f"""\
[mcp_servers.sandbox-repl]
command = {q(binary())}  # moved since
args = ["--sandbox-state", "inherit"]
startup_timeout_sec = 30
tool_timeout_sec = 600
"""
    assert cfg.read_text() == expected
    inode = os.stat(cfg).st_ino
    again = run_install(tmp_path, "--client", "codex")
    assert again.returncode == 0 and "already has this entry" in again.stderr
    assert cfg.read_text() == expected and os.stat(cfg).st_ino == inode, "an unchanged file was rewritten"


def test_vscode_and_claude_desktop_new_files(tmp_path):
    ws = tmp_path / "project"
    ws.mkdir()
    out = run_install(tmp_path, "--client", "vscode", cwd=ws)
    assert out.returncode == 0, out.stderr
    cfg = ws / ".vscode" / "mcp.json"
    assert cfg.read_text() == f"""\
{{
  "servers": {{
    "sandbox-repl": {{
      "type": "stdio",
      "command": {q(binary())},
      "args": ["--sandbox-state", "workspace-write"]
    }}
  }}
}}
"""
    assert mode(cfg) == 0o600

    xdg = tmp_path / "xdg"
    out = run_install(tmp_path, "--client", "claude-desktop", env={"XDG_CONFIG_HOME": str(xdg)})
    assert out.returncode == 0, out.stderr
    desktop = json.loads((xdg / "Claude" / "claude_desktop_config.json").read_text())
    assert desktop == {
        "mcpServers": {"sandbox-repl": {"command": binary(), "args": ["--sandbox-state", "workspace-write"]}}
    }


def test_tls_and_proxy_variables_are_passed_through_but_not_credentials(tmp_path):
    env = {
        "SSL_CERT_FILE": "/etc/ssl/corp-ca.pem",
        "https_proxy": "http://proxy.corp:3128",
        "NO_PROXY": "localhost,127.0.0.1",
        "HTTP_PROXY": "http://alice:hunter2@proxy.corp:3128",
        "UV_INDEX_URL": "https://pypi.corp/simple",
        "AWS_SECRET_ACCESS_KEY": "never-copied",
    }
    out = run_install(tmp_path, "--client", "cursor", env=env)
    assert out.returncode == 0, out.stderr
    text = (tmp_path / ".cursor" / "mcp.json").read_text()
    assert text == f"""\
{{
  "mcpServers": {{
    "sandbox-repl": {{
      "type": "stdio",
      "command": {q(binary())},
      "args": ["--sandbox-state", "workspace-write"],
      "env": {{
        "SSL_CERT_FILE": "/etc/ssl/corp-ca.pem",
        "https_proxy": "http://proxy.corp:3128",
        "NO_PROXY": "localhost,127.0.0.1",
        "UV_INDEX_URL": "https://pypi.corp/simple"
      }}
    }}
  }}
}}
"""
    assert "hunter2" not in text and "never-copied" not in text
    assert "HTTP_PROXY" in out.stderr and "credentials" in out.stderr

    out = run_install(tmp_path, "--client", "claude", "--no-env", env=env)
    assert out.returncode == 0, out.stderr
    assert "env" not in json.loads((tmp_path / ".claude.json").read_text())["mcpServers"]["sandbox-repl"]


def test_print_shows_a_diff_and_writes_nothing(tmp_path):
    (tmp_path / ".codex").mkdir()
    cfg = tmp_path / ".codex" / "config.toml"
    cfg.write_text('model = "o3"\n')
    out = run_install(tmp_path, "--client", "codex", "--print")
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"""\
--- {cfg}
+++ {cfg}
@@ -1 +1,6 @@
 model = "o3"
+
+[mcp_servers.sandbox-repl]
+command = {q(binary())}
+args = ["--sandbox-state", "inherit"]
+tool_timeout_sec = 600
"""
    assert cfg.read_text() == 'model = "o3"\n'
    out = run_install(tmp_path, "--client", "cursor", "--print")
    assert out.returncode == 0 and '+      "command"' in out.stdout
    assert not (tmp_path / ".cursor").exists()


@pytest.mark.parametrize(
    "client,rel,text",
    [
        ("claude", ".claude.json", "{broken"),
        ("claude", ".claude.json", '// a comment\n{"mcpServers": {}}\n'),
        ("claude", ".claude.json", '{"mcpServers": []}\n'),
        ("cursor", ".cursor/mcp.json", "[1, 2]\n"),
        ("codex", ".codex/config.toml", "[mcp_servers\n"),
        ("codex", ".codex/config.toml", "mcp_servers = 3\n"),
    ],
)
def test_broken_or_misshapen_files_are_left_alone(tmp_path, client, rel, text):
    cfg = tmp_path / rel
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(text)
    out = run_install(tmp_path, "--client", client)
    assert out.returncode != 0
    assert str(cfg) in out.stderr and ("not valid" in out.stderr or "not an object" in out.stderr), out.stderr
    assert cfg.read_text() == text
    assert not any(p.name.startswith(".mcp-sandbox-repl.") for p in cfg.parent.iterdir())


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_owner_is_kept_when_root_edits_a_users_file(tmp_path):
    cfg = tmp_path / ".claude.json"
    cfg.write_text("{}\n")
    os.chown(cfg, 65534, 65534)
    os.chmod(cfg, 0o600)
    out = run_install(tmp_path, "--client", "claude")
    assert out.returncode == 0, out.stderr
    st = os.stat(cfg)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65534, 0o600)
    assert json.loads(cfg.read_text())["mcpServers"]["sandbox-repl"]["command"] == binary()
