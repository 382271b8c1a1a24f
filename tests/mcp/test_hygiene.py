"""Over HTTP, through the real binary: a body that is not JSON or over the limit is
answered in JSON-RPC words; a public listen is warned about. (Capabilities, prompts,
completions and resource-not-found answers are tested in process: tests/suite/mcp/surface.rs.)"""

from __future__ import annotations


def test_http_answers_a_bad_body_in_json_rpc_words_and_warns_on_a_public_listen(server):
    """Over HTTP a body that is not JSON is HTTP 400 with a JSON-RPC parse error (-32700),
    not 415; a body over the 4 MiB limit is 413 with a JSON-RPC -32600 saying the limit and
    what to do, with and without a session; a non-loopback listen is warned about."""
    import json
    import urllib.request

    from conftest import INIT, launch_http, start_http

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
    import time

    # The same server on every address: warned about at start (with a token, it serves).
    proc, _, log = launch_http(server, "--token", "tok-0123456789abcdef", env=server.server_env(), host="0.0.0.0")
    try:
        deadline = time.monotonic() + 60
        while "not a loopback address" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
