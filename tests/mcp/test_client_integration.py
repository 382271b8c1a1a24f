"""Client integration through the official Python SDK: Codex's `codex/sandbox-state`
handshake under `--sandbox-state inherit` (as a request and as a notification), MCP roots
as the workspace (and `roots/list_changed`), and start-up validation of the flags."""

from __future__ import annotations

import subprocess
import time
import warnings
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from conftest import Client, binary, first_leaf, python_real, text_of

SANDBOX_STATE = "codex/sandbox-state/update"


async def sandbox_request(c: Client, policy: dict, **extra) -> dict:
    """Send the update as Codex does when it waits for an answer."""
    return await c.session._dispatcher.send_raw_request(SANDBOX_STATE, {"sandboxPolicy": policy, **extra}, {})


async def sandbox_notification(c: Client, policy: dict, **extra) -> None:
    await c.session._dispatcher.notify(SANDBOX_STATE, {"sandboxPolicy": policy, **extra}, {})


async def next_notice(c: Client, needle: str, timeout: float = 60) -> str:
    """Call a cheap tool until its answer carries the notice containing `needle` (a
    notification is handled on its own; the answer after it says when it was applied).
    The deadline only guards a notice that never comes; a loaded machine may be slow."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = text_of(await c.call("session_list"))
        if needle in text:
            return text
        await anyio.sleep(0.1)
    raise AssertionError(f"no answer mentioned {needle!r}; last: {text}")


async def write_in(c: Client, path: Path):
    return await c.call("shell_run", command=f"echo hi > '{path}'")


def test_inherit_declares_the_capability_and_says_it_runs_workspace_write(server):
    async def scenario(c):
        caps = c.session.server_capabilities
        # Older Codex's capability, and today's (tests/mcp/test_codex_client.py).
        assert caps.experimental == {"codex/sandbox-state": {"version": "1.0.0"}, "codex/sandbox-state-meta": {}}, caps
        first = text_of(await c.call("session_list"))
        assert "has not sent its sandbox state" in first and "workspace-write" in first, first
        # Once per connection: the next answer does not repeat it.
        assert "has not sent" not in text_of(await c.call("session_list"))

    server.run(scenario, "--sandbox-state", "inherit")


def test_no_capability_and_no_switch_without_inherit(server):
    async def scenario(c):
        assert not (c.session.server_capabilities.experimental or {}), c.session.server_capabilities
        try:
            await sandbox_request(c, {"type": "danger-full-access"})
        except Exception as e:  # the SDK raises MCPError for an error answer
            assert "--sandbox-state inherit" in str(e), e
        else:
            raise AssertionError("a sandbox update was accepted without --sandbox-state inherit")
        res = await write_in(c, Path("/usr/not-allowed-here"))
        assert res.is_error, text_of(res)

    server.run(scenario, "--sandbox-state", "workspace-write")


def test_update_request_read_only_then_workspace_write_with_a_writable_root(server, tmp_path):
    extra = tmp_path / "extra"
    extra.mkdir()

    async def scenario(c):
        ws_file = server.workspace / "written.txt"
        # As started: workspace-write, the extra root is not writable.
        assert not (await write_in(c, ws_file)).is_error
        assert (await write_in(c, extra / "a")).is_error
        answer = await sandbox_request(c, {"type": "read-only"}, sandboxCwd=str(server.workspace))
        assert answer == {}, answer
        res = await write_in(c, server.workspace / "denied.txt")
        assert res.is_error, text_of(res)
        assert "read-only (from the client)" in text_of(res), text_of(res)
        assert not (server.workspace / "denied.txt").exists()
        # A session started now runs read-only, and session_list says so.
        r = await c.py("open('x.txt', 'w')", session="after")
        assert r["status"] == "failed", r
        sessions = {s["name"]: s for s in (await c.ok("session_list"))["sessions"]}
        assert sessions["after"]["policy"] == "read-only (from the client)", sessions
        answer = await sandbox_request(
            c,
            {
                "type": "workspace-write",
                "writable_roots": [str(extra), "/"],
                "network_access": False,
                "exclude_tmpdir_env_var": False,
                "exclude_slash_tmp": False,
            },
        )
        assert answer == {}
        res = await write_in(c, extra / "b")
        assert not res.is_error, text_of(res)
        assert (extra / "b").read_text() == "hi\n"
        text = text_of(res)
        assert "workspace-write (from the client)" in text and "writable root / refused" in text, text
        assert (await write_in(c, Path("/usr/still-denied"))).is_error

    server.run(scenario, "--sandbox-state", "inherit")


def test_update_as_a_notification(server, tmp_path):
    extra = tmp_path / "extra"
    extra.mkdir()

    async def scenario(c):
        await c.ok("session_list")  # the first answer's notice is out of the way
        await sandbox_notification(c, {"type": "read-only"})
        await next_notice(c, "read-only (from the client)")
        assert (await write_in(c, server.workspace / "n.txt")).is_error
        await sandbox_notification(c, {"type": "workspace-write", "writable_roots": [str(extra)]})
        await next_notice(c, "workspace-write (from the client)")
        assert not (await write_in(c, extra / "n.txt")).is_error
        assert not (await write_in(c, server.workspace / "n.txt")).is_error
        # Nonsense is ignored (logged), the sandbox stays as it was.
        await sandbox_notification(c, {"type": "no-such-type"})
        await c.session._dispatcher.notify(SANDBOX_STATE, None, {})
        assert not (await write_in(c, extra / "still.txt")).is_error

    server.run(scenario, "--sandbox-state", "inherit")


def test_hostile_update_requests_are_refused(server):
    async def scenario(c):
        for params in ({"sandboxPolicy": {"type": "no-such-sandbox"}}, {"sandboxPolicy": 7}, {}):
            try:
                await c.session._dispatcher.send_raw_request(SANDBOX_STATE, params, {})
            except Exception as e:
                assert "codex/sandbox-state/update" in str(e) and "params" in str(e), e
            else:
                raise AssertionError(f"{params} accepted")
        assert not (await write_in(c, server.workspace / "ok.txt")).is_error

    server.run(scenario, "--sandbox-state", "inherit")


# --- roots -------------------------------------------------------------------------


class Roots:
    def __init__(self, *paths: Path | str):
        self.uris = [Path(p).as_uri() if not str(p).startswith(("file:", "http")) else str(p) for p in paths]

    async def __call__(self, context):
        return types.ListRootsResult(roots=[types.Root(uri=u) for u in self.uris])


@asynccontextmanager
async def connect_with_roots(server, roots: Roots, cwd: Path, *args: str):
    """A client with roots, started with no --workspace (nor its variable)."""
    env = server.server_env()
    env.pop("MCP_SANDBOX_WORKSPACE", None)
    params = StdioServerParameters(command=binary(), args=list(args), env=env, cwd=str(cwd))
    with open(server.root / "server-stderr.log", "a") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write, list_roots_callback=roots) as session:
                await session.initialize()
                yield Client(session, server, None)


def run_with_roots(server, roots, cwd, scenario, *args):
    async def main():
        with anyio.fail_after(120):
            async with connect_with_roots(server, roots, cwd, *args) as c:
                return await scenario(c, roots)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # roots are deprecated by SEP-2577 in the SDK
            return anyio.run(main)
    except BaseExceptionGroup as group:
        raise first_leaf(group) from None


def test_first_root_is_the_workspace_and_list_changed_is_honoured(server, tmp_path):
    a, b, other, cwd = (tmp_path / n for n in ("proj a", "proj-b", "docs", "cwd"))
    for d in (a, b, other, cwd):
        d.mkdir()
    (other / "readme.txt").write_text("read me")

    async def scenario(c, roots):
        res = await c.ok("shell_run", command="pwd")
        assert res["stdout"]["text"].strip() == str(a), res
        r = await c.py("import os; os.getcwd()")
        assert r["value"] == repr(str(a)), r
        # The second root is readable, not writable.
        res = await c.ok("shell_run", command=f"cat '{other}/readme.txt'")
        assert res["stdout"]["text"] == "read me", res
        assert (await write_in(c, other / "no.txt")).is_error
        # The client switches project.
        roots.uris = [b.as_uri()]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            await c.session.send_roots_list_changed()
        await next_notice(c, str(b))
        res = await c.ok("shell_run", command="pwd; echo x > new.txt")
        assert res["stdout"]["text"].strip() == str(b), res
        assert (b / "new.txt").exists()
        r = await c.py("import os; os.getcwd()", session="fresh")
        assert r["value"] == repr(str(b)), r
        sessions = {s["name"] for s in (await c.ok("session_list"))["sessions"]}
        assert {"default", "fresh"} <= sessions

    run_with_roots(server, Roots(a, other), cwd, scenario)


def test_root_dir_or_home_is_never_the_workspace(server, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()

    async def scenario(c, roots):
        res = await c.call("shell_run", command="pwd")
        text = text_of(res)
        assert res.structured_content["stdout"]["text"].strip() == str(cwd), text
        assert "root / refused" in text, text

    run_with_roots(server, Roots("/"), cwd, scenario)


def test_workspace_flag_wins_over_roots(server, tmp_path):
    a = tmp_path / "a"
    a.mkdir()

    async def scenario(c, roots):
        res = await c.ok("shell_run", command="pwd")
        assert res["stdout"]["text"].strip() == str(server.workspace), res

    run_with_roots(server, Roots(a), tmp_path, scenario, "--workspace", str(server.workspace))


# --- start-up validation ---------------------------------------------------------------


def start_error(server, *args: str) -> subprocess.CompletedProcess:
    env = server.server_env()
    return subprocess.run([binary(), *args], env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)


def test_bad_start_values_fail_at_once_in_one_line(server, tmp_path):
    cases = [
        (["--workspace", "/etc/passwd"], "--workspace /etc/passwd: not a directory"),
        (["--python", str(tmp_path / "no-python")], "--python"),
        (["--python", "/bin/false"], "it failed"),
        (["--max-sessions", "0"], "--max-sessions 0 is out of range"),
        (["--token", "s3cret"], "--token (or MCP_SANDBOX_TOKEN) is for --transport http"),
    ]
    for args, needle in cases:
        p = start_error(server, *args)
        assert p.returncode != 0, (args, p)
        lines = [line for line in p.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and needle in lines[0], (args, p.stderr)
        assert "s3cret" not in p.stderr
        assert p.stdout == "", (args, p.stdout)


def test_a_good_python_passes_the_probe(server):
    async def scenario(c):
        r = await c.py("import sys; sys.version_info[0]")
        assert r["value"] == "3", r

    server.run(scenario, "--python", python_real())


def test_the_prewarmed_default_session_follows_a_later_sandbox_update(server):
    """The default session is started ahead of the first call; a sandbox the client sends
    before using it is the one its first cell runs under."""

    async def scenario(c):
        deadline = time.monotonic() + 60  # the prewarm on initialize has started the worker
        while True:
            sessions = {s["name"]: s for s in (await c.ok("session_list"))["sessions"]}
            if sessions.get("default", {}).get("state") == "idle":
                break
            assert time.monotonic() < deadline, f"the prewarmed default session never became idle: {sessions}"
            await anyio.sleep(0.05)
        assert sessions["default"]["policy"] == "workspace-write", sessions
        assert await sandbox_request(c, {"type": "read-only"}, sandboxCwd=str(server.workspace)) == {}
        r = await c.py("open('x.txt', 'w')")
        assert r["status"] == "failed", r
        assert not (server.workspace / "x.txt").exists()
        sessions = {s["name"]: s for s in (await c.ok("session_list"))["sessions"]}
        assert sessions["default"]["policy"] == "read-only (from the client)", sessions

    server.run(scenario, "--sandbox-state", "inherit")
