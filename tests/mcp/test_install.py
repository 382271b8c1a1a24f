"""`install --client ...` writes each client's config, merging into what is there."""

import json
import subprocess
import tomllib

from conftest import binary


def run_install(home, *args):
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    return subprocess.run([binary(), "install", *args], env=env, capture_output=True, text=True, timeout=10)


def test_claude_and_cursor_json_are_merged(tmp_path):
    (tmp_path / ".claude.json").write_text(json.dumps({"theme": "dark", "mcpServers": {"other": {"command": "x"}}}))
    out = run_install(tmp_path, "--client", "claude")
    assert out.returncode == 0, out.stderr
    cfg = json.loads((tmp_path / ".claude.json").read_text())
    assert cfg["theme"] == "dark" and cfg["mcpServers"]["other"] == {"command": "x"}
    entry = cfg["mcpServers"]["sandbox-repl"]
    assert entry["command"] == binary() and entry["args"][:2] == ["--sandbox-state", "workspace-write"]

    out = run_install(tmp_path, "--client", "cursor", "--name", "repl", "--sandbox-state", "read-only")
    assert out.returncode == 0, out.stderr
    cfg = json.loads((tmp_path / ".cursor" / "mcp.json").read_text())
    assert cfg["mcpServers"]["repl"]["args"] == ["--sandbox-state", "read-only"]


def test_codex_toml_is_merged(tmp_path):
    (tmp_path / ".codex").mkdir()
    (tmp_path / ".codex" / "config.toml").write_text('model = "o3"\n\n[mcp_servers.other]\ncommand = "x"\n')
    out = run_install(tmp_path, "--client", "codex", "--workspace", str(tmp_path))
    assert out.returncode == 0, out.stderr
    cfg = tomllib.loads((tmp_path / ".codex" / "config.toml").read_text())
    assert cfg["model"] == "o3" and cfg["mcp_servers"]["other"]["command"] == "x"
    entry = cfg["mcp_servers"]["sandbox-repl"]
    assert entry["command"] == binary()
    assert entry["args"] == ["--sandbox-state", "workspace-write", "--workspace", str(tmp_path)]


def test_print_writes_nothing_and_broken_files_are_left_alone(tmp_path):
    out = run_install(tmp_path, "--client", "codex", "--print")
    assert out.returncode == 0 and "[mcp_servers.sandbox-repl]" in out.stdout
    assert not (tmp_path / ".codex").exists()
    (tmp_path / ".claude.json").write_text("{broken")
    out = run_install(tmp_path, "--client", "claude")
    assert out.returncode != 0 and "not valid JSON" in out.stderr
    assert (tmp_path / ".claude.json").read_text() == "{broken"
