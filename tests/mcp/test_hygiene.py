"""Capabilities match what is answered (over stdio, through the official SDK): no prompts
and no completions are declared, so `prompts/list`, `prompts/get` and
`completion/complete` are -32601; a resource that is not found is -32002 with the URI in
`data.uri`, whether the URI is malformed or names a job that does not exist."""

from __future__ import annotations

from mcp import MCPError, types


async def expect_error(call, code: int) -> MCPError:
    try:
        await call
    except MCPError as e:
        assert e.code == code, (e.code, e.message)
        return e
    raise AssertionError(f"answered instead of error {code}")


def test_prompts_and_completions_are_neither_declared_nor_answered(server):
    async def scenario(c):
        caps = c.session.server_capabilities
        assert caps.prompts is None and caps.completions is None, caps
        e = await expect_error(c.session.list_prompts(), -32601)
        assert "prompts" in e.message, e.message
        await expect_error(c.session.get_prompt("anything"), -32601)
        ref = types.ResourceTemplateReference(type="ref/resource", uri="job://{job_id}/stdout")
        e = await expect_error(c.session.complete(ref, {"name": "job_id", "value": "j"}), -32601)
        assert "completion" in e.message, e.message

    server.run(scenario)


def test_resource_not_found_names_the_uri_in_data(server):
    async def scenario(c):
        for uri in ("job://no-such-job/stdout", "job://j1/stdin", "session://nobody/history", "script://j404"):
            e = await expect_error(c.session.read_resource(uri), -32002)
            assert e.data == {"uri": uri}, (uri, e.data, e.message)

    server.run(scenario)


def test_http_answers_a_bad_body_in_json_rpc_words_and_warns_on_a_public_listen(server):
    """Over HTTP a body that is not JSON is HTTP 400 with a JSON-RPC parse error (-32700),
    not 415; a body over the 4 MiB limit is 413 with a JSON-RPC -32600 saying the limit and
    what to do, with and without a session; a non-loopback listen is warned about."""
    import json
    import urllib.request

    from test_surface import INIT, start_http

    def raw(url, body: bytes, headers):
        req = urllib.request.Request(url, data=body, method="POST")
        for k, v in {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                     "Authorization": "Bearer tok-0123456789abcdef", **headers}.items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.headers, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read().decode()

    proc, url, port = start_http(server, "--token", "tok-0123456789abcdef")
    try:
        code, headers, body = raw(url, json.dumps(INIT).encode(), {})
        assert code == 200, (code, body)
        sid = headers["mcp-session-id"]
        big = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "ping", "params": {"x": "a" * (5 << 20)}}).encode()
        for extra in ({}, {"Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-06-18"}):
            code, _, body = raw(url, b"{not json", extra)
            assert code == 400, (extra, code, body)
            err = json.loads(body)["error"]
            assert err["code"] == -32700 and "parse error" in err["message"], body
            code, _, body = raw(url, big, extra)
            assert code == 413, (extra, code, body[:200])
            err = json.loads(body)["error"]
            assert err["code"] == -32600 and "4 MiB" in err["message"] and "file in the workspace" in err["message"], body
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    import subprocess
    import time

    from conftest import binary
    from test_surface import free_port

    log = server.root / "public.log"
    proc = subprocess.Popen(
        [binary(), "--transport", "http", "--listen", f"0.0.0.0:{free_port()}", "--token", "tok-0123456789abcdef"],
        env=server.server_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(log, "w"),
    )
    try:
        deadline = time.monotonic() + 60
        while "not a loopback address" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
