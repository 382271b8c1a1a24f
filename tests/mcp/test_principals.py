"""Tenants on one server (`--tokens FILE`): each principal has its own sessions, jobs,
history, resources, stores and workspace. Another principal's anything, asked for by its
name or id, is answered exactly as something that never existed; quotas refuse in words;
an MCP session belongs to the principal that opened it; the file must be private and is
re-read on SIGHUP. Driven over streamable HTTP with the official Python SDK."""

import json
import os
import re
import signal
import subprocess
import time
import urllib.request

import anyio
import pytest
from conftest import INIT, Client, binary, free_port, post, start_http

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef"
CAROL = "carol-token-0123456789abcdef"
GUARD = 120


def tokens_file(path, principals: dict, mode=0o600):
    text = "".join(
        f"[principal.{name}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in spec.items()) + "\n"
        for name, spec in principals.items()
    )
    path.write_text(text)
    os.chmod(path, mode)
    return path


def start(server, tokens):
    """The server over HTTP with `tokens`; (proc, url, log path)."""
    proc, url, port = start_http(server, "--tokens", str(tokens), log_env=server.env.get("RUST_LOG"))
    return proc, url, server.root / f"http-{port}.log"


async def as_principal(url, token, scenario):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with client, streamable_http_client(url, http_client=client) as streams:
        async with ClientSession(streams[0], streams[1]) as s:
            await s.initialize()
            return await scenario(Client(s, None, None))


def same_but_id(a: str, b: str, id_a: str, id_b: str) -> bool:
    """The two texts are the same once the ids asked for are put aside."""
    return re.sub(rf"\b{id_a}\b", "ID", a) == re.sub(rf"\b{id_b}\b", "ID", b)


def test_two_principals_share_nothing_and_quotas_refuse_in_words(server):
    tokens = tokens_file(server.root / "tokens.toml", {
        "alice": {"token": ALICE, "max_sessions": 2, "max_running_jobs": 1},
        "bob": {"token": BOB},
    })
    proc, url, log = start(server, tokens)
    seen = {}
    try:
        async def alice(a):
            assert (await a.ok("python_exec", code="x = 'alice'\nx"))["value"] == "'alice'"
            jobs = [(await a.ok("shell_run", command=f"echo alice-{i}"))["job_id"] for i in range(4)]
            await a.ok("python_exec", code="y = 1", session="alpha")
            seen["alice_jobs"] = jobs
            # Quotas: a third Python session, a second running job.
            text = await a.err("python_exec", code="1", session="beta")
            assert "session" in text and "2" in text, text
            running = await a.ok("shell_run", command="sleep 60", wait_seconds=0)
            assert running["status"] == "running", running
            text = await a.err("shell_run", command="echo two")
            assert "too many jobs running: 1 at once is this client's quota" in text, text
            await a.ok("job_cancel", job_id=running["job_id"])

        async def bob(b):
            assert (await b.ok("python_exec", code="'x' in globals()"))["value"] == "False"
            await b.ok("python_exec", code="x = 'bob'")
            assert (await b.ok("python_exec", code="x"))["value"] == "'bob'"
            own = {j["job_id"] for j in (await b.ok("job_list"))["jobs"]}
            theirs = [j for j in seen["alice_jobs"] if j not in own]
            assert theirs, (own, seen["alice_jobs"])
            sessions = {s["name"] for s in (await b.ok("session_list"))["sessions"]}
            assert "alpha" not in sessions, sessions
            unknown = "j999999"
            for tool, extra in (("job_output", {}), ("job_wait", {"timeout_seconds": 0}),
                                ("job_cancel", {}), ("job_input", {"text": "x"})):
                for jid in theirs:
                    mine = await b.err(tool, job_id=jid, **extra)
                    ref = await b.err(tool, job_id=unknown, **extra)
                    assert same_but_id(mine, ref, jid, unknown), (tool, mine, ref)
                    assert "alice" not in mine and not any(j in mine for j in theirs if j != jid), mine
            pruned = await b.ok("job_prune")
            assert not set(pruned["pruned"]) & set(theirs) - own, pruned
            for tool in ("session_close", "python_history"):
                mine = await b.err(tool, session="alpha")
                ref = await b.err(tool, session="zzz")
                assert same_but_id(mine, ref, "alpha", "zzz"), (tool, mine, ref)
            for jid in theirs[:1]:
                with pytest.raises(Exception) as e_theirs:
                    await b.session.read_resource(f"job://{jid}/stdout")
                with pytest.raises(Exception) as e_unknown:
                    await b.session.read_resource(f"job://{unknown}/stdout")
                assert same_but_id(str(e_theirs.value), str(e_unknown.value), jid, unknown)

        async def alice_again(a):
            # Nothing bob did reached alice: her variable, session and jobs are there.
            assert (await a.ok("python_exec", code="x"))["value"] == "'alice'"
            assert (await a.ok("python_exec", code="y", session="alpha"))["value"] == "1"
            listed = {j["job_id"] for j in (await a.ok("job_list"))["jobs"]}
            assert set(seen["alice_jobs"]) <= listed
            out = await a.ok("job_output", job_id=seen["alice_jobs"][2])
            assert "alice-2" in out["text"], out

        async def main():
            with anyio.fail_after(GUARD):
                await as_principal(url, ALICE, alice)
                await as_principal(url, BOB, bob)
                await as_principal(url, ALICE, alice_again)

        anyio.run(main)
        # Structurally apart: each principal's state and workspace of its own.
        assert (server.state_dir / "principals" / "alice").is_dir()
        assert (server.state_dir / "principals" / "bob").is_dir()
        assert (server.workspace / "alice").is_dir() and (server.workspace / "bob").is_dir()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_an_mcp_session_belongs_to_its_principal_and_tokens_are_checked(server):
    tokens = tokens_file(server.root / "tokens.toml", {"alice": {"token": ALICE}, "bob": {"token": BOB}})
    server.env["RUST_LOG"] = "info"  # the SIGHUP lines
    proc, url, log = start(server, tokens)
    try:
        req = urllib.request.Request(url, data=json.dumps(INIT).encode(), method="POST")
        for k, v in {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                     "Authorization": f"Bearer {ALICE}"}.items():
            req.add_header(k, v)
        with urllib.request.urlopen(req, timeout=30) as r:
            sid = r.headers["mcp-session-id"]
            r.read()
        assert sid
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        base = {"Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-06-18"}
        # Bob with alice's session: as unknown as a session that never was.
        code, body = post(url, ping, {**base, "Authorization": f"Bearer {BOB}"})
        code_u, body_u = post(url, ping, {**base, "Mcp-Session-Id": "no-such-session", "Authorization": f"Bearer {BOB}"})
        assert (code, body) == (code_u, body_u) == (404, "Not Found: Session not found"), (code, body, code_u, body_u)
        # No token, a wrong one, the old single-token style: 401.
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": f"Basic {ALICE}"}):
            code, body = post(url, INIT, headers)
            assert code == 401 and "principal's token" in body, (code, body)
        # SIGHUP: carol added, bob removed.
        tokens_file(tokens, {"alice": {"token": ALICE}, "carol": {"token": CAROL}})
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while "tokens file re-read" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        assert post(url, INIT, {"Authorization": f"Bearer {CAROL}"})[0] == 200
        assert post(url, INIT, {"Authorization": f"Bearer {BOB}"})[0] == 401
        # A file that does not read keeps the table in force, said in the log.
        tokens.write_text("not toml [")
        proc.send_signal(signal.SIGHUP)
        while "previous principals stay in force" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        assert post(url, INIT, {"Authorization": f"Bearer {CAROL}"})[0] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_tokens_file_others_can_read_is_refused_at_start(server):
    tokens = tokens_file(server.root / "tokens.toml", {"alice": {"token": ALICE}}, mode=0o644)
    out = subprocess.run(
        [binary(), "--transport", "http", "--listen", f"127.0.0.1:{free_port()}", "--tokens", str(tokens)],
        env=server.server_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode != 0
    assert "its mode is 644" in out.stderr and "chmod 600" in out.stderr, out.stderr
