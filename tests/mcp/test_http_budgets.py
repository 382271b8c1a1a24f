"""The HTTP transport's budgets, from outside: idle TCP connections (no token needed to open
them) cannot keep an authorized client out and are closed by the server; a full file table
costs a paused accept and a few log lines, not a spin; abandoned MCP sessions are closed and
their memory handed back; a new session over the cap is refused in words; a session that
never sends `notifications/initialized` is dropped after its timeout.

Every test starts the real binary with `--transport http` and talks to it as clients do:
raw sockets for the hostile ones, the official SDK's streamable HTTP client for the
authorized one. No wall-clock thresholds: each waits for its condition, with a generous
hang guard."""

from __future__ import annotations

import json
import os
import resource
import select
import shutil
import socket
import threading
import time
from pathlib import Path

import anyio
import pytest

from conftest import INIT, launch_http, post, stop

IDLE = 1100
# Generous: a loaded 2-core machine; a pass takes seconds.
GUARD = 120


def start_http(server, *extra, prefix=(), token="s3cret"):
    """Start the HTTP server (optionally under `prefix`, e.g. prlimit); stderr to a file.
    Returns (proc, url, port, stderr path)."""
    auth = ["--token", token] if token else ["--no-auth"]
    proc, port, log = launch_http(server, *auth, *extra, prefix=prefix)
    return proc, f"http://127.0.0.1:{port}/mcp", port, log


def raise_own_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4 * IDLE:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 2 * IDLE + 100


def open_idle(port: int, n: int) -> list[socket.socket]:
    """`n` TCP connections that send nothing. Connecting succeeds once the kernel has queued
    the connection, accepted by the server or not."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=GUARD)
        s.setblocking(False)
        socks.append(s)
    return socks


def closed_by_server(s: socket.socket) -> bool:
    """The server closed (or reset) this connection: EOF or an error on a non-blocking read."""
    try:
        return s.recv(4096) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except BlockingIOError:
        return False


def count_closed(socks) -> int:
    return sum(1 for s in socks if closed_by_server(s))


def wait_closed(socks, at_least: int) -> None:
    """Wait until the server has closed `at_least` of `socks` (GUARD only guards a hang)."""
    deadline = time.monotonic() + GUARD
    while (n := count_closed(socks)) < at_least:
        assert time.monotonic() < deadline, f"only {n} idle connections were closed"
        time.sleep(0.2)


def authorized_call(url: str, token: str) -> str:
    """A whole MCP client session over HTTP with the token: initialize, one tool call."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def main():
        with anyio.fail_after(GUARD):
            client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
            async with client, streamable_http_client(url, http_client=client) as streams:
                async with ClientSession(streams[0], streams[1]) as s:
                    await s.initialize()
                    res = await s.call_tool("session_list", {})
                    assert not res.is_error, res
                    return res.content[0].text

    return anyio.run(main)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_idle_connections_do_not_starve_an_authorized_client(server):
    """1,100 idle TCP connections are held open against the defaults: an authorized client
    still gets its session and its call answered, every idle connection is closed by the
    server (made room for at the connection cap, or no complete request head within the
    header timeout), and stderr stays small."""
    raise_own_fd_limit()
    proc, url, port, log = start_http(server)
    try:
        idle = open_idle(port, IDLE)
        assert "session" in authorized_call(url, "s3cret").lower()
        wait_closed(idle, IDLE)
        for s in idle:
            s.close()
        # The server still serves after the flood.
        assert "session" in authorized_call(url, "s3cret").lower()
    finally:
        stop(proc)
    size = log.stat().st_size
    assert size < 1_000_000, f"stderr grew to {size} bytes: {log.read_text()[:2000]}"


def test_out_of_descriptors_the_accept_loop_makes_room_and_logs_once(server):
    """Under `prlimit --nofile=1024`, with a connection cap above it and a header timeout
    beyond the test (so only running out of descriptors can close an idle connection):
    1,100 idle connections make accepts fail with EMFILE. An authorized client still gets
    its session and its call answered — each failed accept closes the longest-idle
    connection and pauses briefly instead of spinning — and the failures cost a log line
    per 10 s, not one each (11 million lines, 1.3 GB, in 52 s before)."""
    raise_own_fd_limit()
    assert shutil.which("prlimit"), "prlimit (util-linux) is needed"
    proc, url, port, log = start_http(
        server, "--http-max-connections", "4096", "--http-header-timeout", "3600",
        prefix=("prlimit", "--nofile=1024", "--"),
    )
    try:
        idle = open_idle(port, IDLE)
        assert "session" in authorized_call(url, "s3cret").lower()
        # The server can hold at most 1024 descriptors: the rest were closed to make room.
        wait_closed(idle, IDLE - 1024)
        for s in idle:
            s.close()
    finally:
        stop(proc)
    size = log.stat().st_size
    text = log.read_text()
    assert size < 1_000_000, f"stderr grew to {size} bytes: {text[:2000]}"
    lines = [l for l in text.splitlines() if "cannot accept an HTTP connection" in l]
    assert lines and "Too many open files" in lines[0], text[-3000:]
    assert len(lines) < 20, lines


def test_idle_connections_make_room_at_the_cap(server):
    """With a header timeout far beyond the test (nothing is closed for silence), 1,100
    idle connections against a cap of 64: an authorized client still gets in, because a
    new connection at the cap closes the longest-idle one; the idle ones beyond the cap
    are closed by the server meanwhile."""
    raise_own_fd_limit()
    proc, url, port, log = start_http(
        server, "--http-max-connections", "64", "--http-header-timeout", "3600",
    )
    try:
        idle = open_idle(port, IDLE)
        assert "session" in authorized_call(url, "s3cret").lower()
        # The authorized client's own connections made room too: at least all but 64.
        wait_closed(idle, IDLE - 64)
        for s in idle:
            s.close()
    finally:
        stop(proc)
    assert log.stat().st_size < 1_000_000


def test_a_slow_request_head_is_closed(server):
    """A connection that trickles a request head, one byte at a time, is closed after the
    header timeout (slowloris) though it never goes silent."""
    proc, url, port, log = start_http(server, "--http-header-timeout", "2")
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        head = f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: " + "a" * 10_000
        deadline = time.monotonic() + GUARD
        closed = False
        for ch in head:
            assert time.monotonic() < deadline, "the trickling connection was never closed"
            try:
                s.sendall(ch.encode())
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            poller = select.poll()
            poller.register(s, select.POLLIN)
            if poller.poll(50):
                try:
                    data = s.recv(4096)
                except ConnectionResetError:
                    data = b""
                assert data == b"" or data.startswith(b"HTTP/1.1 408") or b"HTTP/1.1" in data, data
                closed = True
                break
        assert closed, "the whole 10 kB head was taken without a close"
        s.close()
    finally:
        stop(proc)


def test_an_idle_kept_alive_connection_is_closed(server):
    """A connection that got its answer and stays open without sending the next request
    (HTTP/1.1 keep-alive) is closed after the header timeout."""
    proc, url, port, log = start_http(server, "--http-header-timeout", "2")
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=GUARD)
        # Unauthorized: answered 401 at once, the connection kept alive.
        s.sendall(f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = s.recv(4096)
            assert chunk, answer
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 401"), answer
        assert b"connection: close" not in answer.lower(), answer
        # Then silence: the server closes it (recv returns EOF; the hang guard is the timeout).
        s.settimeout(GUARD)
        rest = answer.split(b"\r\n\r\n", 1)[1]
        while True:
            try:
                chunk = s.recv(4096)
            except ConnectionResetError:
                break
            if not chunk:
                break
            rest += chunk
            assert len(rest) < 10_000, rest
        s.close()
    finally:
        stop(proc)


def raw_initialize(port: int, token: str | None, abandon: bool = True) -> bytes:
    """POST an `initialize`; read the first bytes of the answer and (abandon) close the
    socket, as a client that gives up does. Returns what was read."""
    body = json.dumps(INIT).encode()
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    req = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json, text/event-stream\r\n{auth}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as s:
        s.sendall(req)
        return s.recv(4096)


def abandon_sessions(port: int, n: int, token: str | None, threads: int = 4):
    def worker(k):
        for _ in range(k):
            head = raw_initialize(port, token)
            assert head.startswith(b"HTTP/1.1 200"), head

    ts = [threading.Thread(target=worker, args=(n // threads,)) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


ABANDONED = int(os.environ.get("MCP_TEST_ABANDONED_SESSIONS", "2000"))


def test_abandoned_sessions_are_closed_and_their_memory_returned(server):
    """2,000 `initialize` POSTs whose client closes the socket and never sends
    `initialized` (10,000 in tests/bench/http_budgets.py): each leaves an MCP session (≈50 KB);
    after the handshake timeout all are closed and the server's RSS is back within 20 MB of
    what it was before the flood."""
    proc, url, port, log = start_http(
        server, "--http-max-sessions", str(ABANDONED + 100), "--http-handshake-timeout", "3",
    )
    try:
        # Baseline after a full client session (tool list built, runtime warm).
        authorized_call(url, "s3cret")
        time.sleep(4)  # that session's own handshake window, so it is not counted
        base = rss_mb(proc.pid)
        abandon_sessions(port, ABANDONED, "s3cret")
        peak = rss_mb(proc.pid)
        # The flood must have cost something measurable, or the test shows nothing.
        assert peak > base + 30, (base, peak)
        deadline = time.monotonic() + GUARD
        while (now := rss_mb(proc.pid)) > base + 20:
            assert time.monotonic() < deadline, f"RSS {now:.0f} MB, baseline {base:.0f} MB, peak {peak:.0f} MB"
            time.sleep(0.5)
        # Every session is gone: the cap admits as many again.
        assert "session" in authorized_call(url, "s3cret").lower()
    finally:
        stop(proc)
    assert log.stat().st_size < 1_000_000


def test_a_session_over_the_cap_is_refused_in_words_and_uninitialized_ones_are_dropped(server):
    """With --http-max-sessions 2: two sessions that never send `initialized` fill it, a
    third `initialize` gets 503 naming the limit and what frees a place; after the
    handshake timeout the two are dropped (their ids answer 404) and a new session is
    admitted. A session that did send `initialized` is not dropped by that timeout."""
    proc, url, port, log = start_http(
        server, "--http-max-sessions", "3", "--http-handshake-timeout", "2", token=None,
    )
    try:
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        import urllib.request

        def initialize():
            req = urllib.request.Request(url, data=json.dumps(INIT).encode(), headers=headers, method="POST")
            with urllib.request.urlopen(req, timeout=GUARD) as r:
                r.read()
                return r.headers["Mcp-Session-Id"]

        def send(sid, body):
            req = urllib.request.Request(
                url, data=json.dumps(body).encode(), method="POST",
                headers={**headers, "Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-06-18"},
            )
            try:
                with urllib.request.urlopen(req, timeout=GUARD) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()

        polite = initialize()
        status, _ = send(polite, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert status == 202, status
        silent = [initialize(), initialize()]
        status, body = post(url, INIT)
        assert status == 503, (status, body)
        assert "too many MCP sessions: 3 of 3 are open" in body, body
        assert "--http-max-sessions" in body and "notifications/initialized" in body, body
        # The silent ones are dropped after their timeout; the polite one stays.
        deadline = time.monotonic() + GUARD
        while any(send(s, {"jsonrpc": "2.0", "id": 9, "method": "ping"})[0] != 404 for s in silent):
            assert time.monotonic() < deadline, "sessions that never sent initialized were kept"
            time.sleep(0.3)
        status, body = send(polite, {"jsonrpc": "2.0", "id": 10, "method": "ping"})
        assert status == 200, (status, body)
        status, body = post(url, INIT)
        assert status == 200, (status, body)
    finally:
        stop(proc)
    assert "refused a new MCP session" in log.read_text()


def sse_result(body: str) -> dict:
    """The JSON-RPC answer in an SSE response body."""
    for line in body.splitlines():
        if line.startswith("data:") and line[5:].strip():
            msg = json.loads(line[5:])
            if "result" in msg or "error" in msg:
                return msg
    raise AssertionError(f"no answer in {body!r}")


def test_a_closed_session_ends_what_its_connection_started(server):
    """When an MCP session ends — the client's DELETE, or the handshake timeout — the
    server drops that connection's handler, and with it what the connection started: here a
    resource subscription watching a running job. Shown by the handler's own debug line,
    once per ended session."""
    import urllib.request

    server.env["RUST_LOG"] = "warn,mcp_sandbox_repl::server::handler=debug"
    proc, url, port, log = start_http(server, "--http-handshake-timeout", "2", token=None)
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}

    def send(body, sid=None, method="POST"):
        h = {**headers, **({"Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-06-18"} if sid else {})}
        data = json.dumps(body).encode() if body is not None else None
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=h, method=method), timeout=GUARD) as r:
            return r.headers.get("Mcp-Session-Id"), r.read().decode()

    def ended() -> int:
        return log.read_text().count("MCP connection ended")

    def wait_ended(n):
        deadline = time.monotonic() + GUARD
        while ended() < n:
            assert time.monotonic() < deadline, f"{ended()} sessions ended, expected {n}: {log.read_text()[-2000:]}"
            time.sleep(0.2)

    try:
        sid, _ = send(INIT)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
        _, body = send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "shell_run", "arguments": {"command": "sleep 60", "wait_seconds": 0}}}, sid)
        job = sse_result(body)["result"]["structuredContent"]["job_id"]
        _, body = send({"jsonrpc": "2.0", "id": 3, "method": "resources/subscribe",
                        "params": {"uri": f"job://{job}/stdout"}}, sid)
        assert "error" not in sse_result(body), body
        assert ended() == 0
        send(None, sid, method="DELETE")
        wait_ended(1)
        # A session that never sends `initialized` ends at its timeout.
        send(INIT)
        wait_ended(2)
    finally:
        stop(proc)


def test_an_idle_session_is_closed(server):
    """A session that finished its handshake and then sends nothing is closed after
    --http-session-idle (its handler's end is logged); its id then answers 404."""
    import urllib.error
    import urllib.request

    server.env["RUST_LOG"] = "warn,mcp_sandbox_repl::server::handler=debug"
    proc, url, port, log = start_http(server, "--http-session-idle", "2", token=None)
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, data=json.dumps(INIT).encode(), headers=headers, method="POST"),
            timeout=GUARD,
        ) as r:
            r.read()
            sid = r.headers["Mcp-Session-Id"]
        h = {**headers, "Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-06-18"}
        note = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode()
        with urllib.request.urlopen(urllib.request.Request(url, data=note, headers=h, method="POST"), timeout=GUARD) as r:
            assert r.status == 202
        # Waiting must not send anything to the session: watch the log, not the session.
        deadline = time.monotonic() + GUARD
        while "MCP connection ended" not in log.read_text():
            assert time.monotonic() < deadline, "the idle session was never closed"
            time.sleep(0.2)
        ping = json.dumps({"jsonrpc": "2.0", "id": 5, "method": "ping"}).encode()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(url, data=ping, headers=h, method="POST"), timeout=GUARD)
        assert e.value.code == 404
    finally:
        stop(proc)
