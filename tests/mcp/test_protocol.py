"""The MCP surface itself: tool list, schemas, annotations, bad arguments, HTTP auth."""

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

from conftest import binary, text_of

EXPECTED_TOOLS = {
    "python_exec", "python_run_file", "python_interrupt", "python_vars", "python_history",
    "session_list", "session_restart", "session_close",
    "job_wait", "job_input", "job_cancel", "job_list", "job_output", "job_prune",
    "shell_run",
}


def test_tools_are_listed_with_schemas_and_annotations(server):
    """Every tool has a description written for an LLM, a strict input schema and hints."""

    async def scenario(c):
        tools = (await c.session.list_tools()).tools
        names = {t.name for t in tools}
        assert EXPECTED_TOOLS <= names, EXPECTED_TOOLS - names
        for t in tools:
            assert len(t.description) > 80, t.name
            assert t.input_schema.get("additionalProperties") is False, t.name
            assert t.annotations is not None and t.annotations.read_only_hint is not None, t.name
        by = {t.name: t for t in tools}
        assert by["python_exec"].output_schema["properties"]["job_id"]
        assert "job_wait" in by["python_exec"].description  # the async model is spelled out
        assert by["job_list"].annotations.read_only_hint is True
        assert by["session_restart"].annotations.destructive_hint is True

    server.run(scenario)


def test_malformed_arguments_name_the_field(server):
    """Bad tool arguments and unknown tools are JSON-RPC invalid-params errors (-32602)
    naming the offending field; a failure of the work itself is an isError result with
    structured content."""

    async def scenario(c):
        msg = await c.invalid("python_exec", code="1", sesion="x")
        assert "sesion" in msg
        msg = await c.invalid("python_exec")
        assert "code" in msg
        msg = await c.invalid("python_exec", code=5)
        # The field and what it must be (every -32602 message has the word "invalid").
        assert "`code`" in msg and "string" in msg, msg
        msg = await c.invalid("job_wait", job_id="j1", timeout_seconds=-1)
        assert "timeout_seconds" in msg
        msg = await c.invalid("python_exec", code="1", session="../etc")
        assert "session" in msg
        msg = await c.invalid("job_output", job_id="j1", stream="stdin")
        # The field and the values it takes ("stdin" alone is only our own input echoed).
        assert "`stream`" in msg and "stdout" in msg and "result" in msg, msg
        msg = await c.invalid("no_such_tool")
        assert "unknown tool" in msg and "python_exec" in msg
        # Arguments that fit the schema but not each other: a tool error, structured.
        res = await c.call("shell_run")
        assert res.is_error
        assert "command" in text_of(res) and "argv" in text_of(res)
        assert res.structured_content == {"error": text_of(res)}
        res = await c.call("job_wait", job_id="j999")
        assert res.is_error and "j999" in res.structured_content["error"]
        # The server is still fine afterwards.
        assert "python_exec" in {t.name for t in (await c.session.list_tools()).tools}

    server.run(scenario)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def post(url, body, token=None):
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


INIT = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}


def start_http(server, *extra):
    port = free_port()
    env = server.server_env()
    proc = subprocess.Popen(
        [binary(), "--transport", "http", "--listen", f"127.0.0.1:{port}", *extra],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    # The deadline only guards a server that never listens (a loaded machine may be slow to
    # start one); a server that exited is reported at once.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"HTTP server did not start: {proc.stderr.read().decode()}")


def test_http_requires_the_bearer_token_when_set(server):
    """With --token, requests without the exact bearer token get 401; with it, MCP works."""
    proc, url = start_http(server, "--token", "s3cret")
    try:
        status, _ = post(url, INIT)
        assert status == 401
        status, _ = post(url, INIT, token="wrong")
        assert status == 401
        status, body = post(url, INIT, token="s3cret")
        assert status == 200, body
        assert "mcp-sandbox-repl" in body
    finally:
        proc.terminate()
        assert proc.wait(timeout=5) == 0


def test_http_refuses_public_address_without_token(server):
    """Binding a non-loopback address with authentication turned off (--no-auth) is refused
    with a clear message (without --token a token is generated)."""
    out = subprocess.run(
        [binary(), "--transport", "http", "--no-auth", "--listen", f"0.0.0.0:{free_port()}"],
        env=server.server_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=10,
    )
    assert out.returncode != 0
    assert "token" in out.stderr


def test_http_streamable_client_works(server):
    """The official SDK's streamable HTTP client can list tools (loopback, no --token: the
    client reads the token the server generated)."""
    import anyio
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    from mcp.shared._httpx_utils import create_mcp_http_client

    proc, url = start_http(server)
    token = (server.state_dir / "http-token").read_text().strip()

    async def main():
        client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with client, streamable_http_client(url, http_client=client) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as s:
                await s.initialize()
                return {t.name for t in (await s.list_tools()).tools}

    try:
        names = anyio.run(main)
        assert EXPECTED_TOOLS <= names
    finally:
        proc.terminate()
        proc.wait(timeout=5)
