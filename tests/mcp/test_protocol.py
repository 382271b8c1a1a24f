"""The MCP surface over HTTP through the real binary: the bearer token, a public address
without one, the official SDK's streamable HTTP client. (The tool list, schemas,
annotations and bad arguments are tested in process: tests/suite/mcp/.)"""

import subprocess

from conftest import INIT, binary, free_port, post, start_http

EXPECTED_TOOLS = {
    "python_exec", "python_run_file", "python_interrupt", "python_vars", "python_history",
    "session_list", "session_restart", "session_close",
    "job_wait", "job_input", "job_cancel", "job_list", "job_output", "job_prune",
    "shell_run",
}


def test_http_requires_the_bearer_token_when_set(server):
    """With --token, requests without the exact bearer token get 401; with it, MCP works."""
    proc, url, _ = start_http(server, "--token", "s3cret")
    try:
        status, _ = post(url, INIT)
        assert status == 401
        status, _ = post(url, INIT, {"Authorization": "Bearer wrong"})
        assert status == 401
        status, body = post(url, INIT, {"Authorization": "Bearer s3cret"})
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

    proc, url, _ = start_http(server)
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
