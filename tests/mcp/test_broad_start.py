"""Clients launch servers from `/` or `~` (Claude Desktop, and the entries `install` writes
carry no --workspace). Started there with no --workspace, the server answers `initialize`
and waits for the client to name the workspace: a client's root (or Codex's sandboxCwd)
becomes it; with none, a call that needs a workspace is a tool error that says what to do,
not an exit before `initialize`. A broad --workspace given explicitly is still refused at
start (tests/mcp/test_client_integration.py)."""

from __future__ import annotations

import warnings
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from conftest import Client, binary, first_leaf, text_of
from test_client_integration import Roots


@asynccontextmanager
async def started_in(server, cwd: Path, roots: Roots | None, env: dict[str, str]):
    e = server.server_env()
    e.pop("MCP_SANDBOX_WORKSPACE", None)
    e.update(env)
    params = StdioServerParameters(command=binary(), args=[], env=e, cwd=str(cwd))
    with open(server.root / "server-stderr.log", "a") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write, list_roots_callback=roots) as session:
                await session.initialize()
                yield Client(session, server, None)


def run_quietly(main):
    """`main` run on anyio, the SDK's roots deprecation warning silenced (SEP-2577), the
    first real error raised rather than its exception group."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return anyio.run(main)
    except BaseExceptionGroup as group:
        raise first_leaf(group) from None


def run_in(server, cwd: Path, roots: Roots | None, scenario, **env: str):
    async def main():
        with anyio.fail_after(120):
            async with started_in(server, cwd, roots, env) as c:
                return await scenario(c)

    return run_quietly(main)


def test_started_in_slash_a_clients_root_is_the_workspace(server, tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()

    async def scenario(c):
        res = await c.ok("shell_run", command="pwd; echo x > made.txt")
        assert res["stdout"]["text"].strip() == str(proj), res
        r = await c.py("import os; os.getcwd()")
        assert r["value"] == repr(str(proj)), r

    run_in(server, Path("/"), Roots(proj), scenario)
    assert (proj / "made.txt").exists()


def test_started_in_slash_without_roots_the_refusal_is_a_tool_error_in_words(server):
    async def scenario(c):
        for tool, args in (("python_exec", {"code": "1"}), ("shell_run", {"command": "true"})):
            res = await c.call(tool, **args)
            text = text_of(res)
            assert res.is_error, text
            assert "no workspace yet" in text and "started in /" in text and "--workspace" in text, text
        # What needs no workspace still answers.
        assert (await c.ok("session_list"))["sessions"] == []

    run_in(server, Path("/"), None, scenario)


def test_started_in_home_without_roots_likewise(server, tmp_path):
    home = tmp_path / "home"
    home.mkdir()

    async def scenario(c):
        res = await c.call("shell_run", command="echo no > x.txt")
        text = text_of(res)
        assert res.is_error and "no workspace yet" in text and "your home directory" in text, text

    run_in(server, home, None, scenario, HOME=str(home))
    assert not (home / "x.txt").exists()


# --- Clients on protocol 2026-07-28 (the Python SDK's default mode) -----------------------
# That revision has no server-initiated roots/list: the server answers the first tool call
# with an InputRequiredResult asking for roots/list (SEP-2322, multi round-trip requests),
# and the client retries the call with its roots in inputResponses.


def run_modern_in(server, cwd: Path, roots: Roots | None, scenario, **env: str):
    from mcp.client.client import Client as ModernClient

    e = server.server_env()
    e.pop("MCP_SANDBOX_WORKSPACE", None)
    e.update(env)
    params = StdioServerParameters(command=binary(), args=[], env=e, cwd=str(cwd))

    async def main():
        with anyio.fail_after(120):
            async with ModernClient(params, mode="auto", list_roots_callback=roots) as c:
                assert c.session.protocol_version == "2026-07-28", c.session.protocol_version
                return await scenario(c)

    return run_quietly(main)


def test_a_2026_client_started_in_slash_names_the_workspace_with_its_roots(server, tmp_path):
    """`cd / && mcp-sandbox-repl` with a 2026-07-28 client that has a root: it starts, the
    root is the workspace of the first call already, and that answer says so."""
    proj = tmp_path / "proj"
    proj.mkdir()
    asked = []

    class Counting(Roots):
        async def __call__(self, context):
            asked.append(1)
            return await super().__call__(context)

    async def scenario(c):
        r = await c.call_tool("shell_run", {"command": "pwd; echo x > made.txt", "wait_seconds": 30})
        assert not r.is_error, text_of(r)
        assert r.structured_content["stdout"]["text"].strip() == str(proj), r.structured_content
        assert f"Workspace: {proj} (from the client's roots)" in text_of(r), text_of(r)
        r = await c.call_tool("python_exec", {"code": "import os; os.getcwd()", "wait_seconds": 30})
        assert r.structured_content["value"] == repr(str(proj)), r.structured_content
        assert "Workspace:" not in text_of(r), text_of(r)  # said once

    run_modern_in(server, Path("/"), Counting(proj), scenario)
    assert (proj / "made.txt").exists()
    assert len(asked) == 1, asked  # asked once, not on every call


def test_a_2026_client_is_asked_for_roots_with_an_input_required_result(server, tmp_path):
    """On the wire, as the spec's MRTR pattern has it: the first tools/call is answered
    `resultType: input_required` with a `roots/list` input request; the retry carrying the
    roots in `inputResponses` runs in the root."""
    from mcp import types as t

    proj = tmp_path / "proj"
    proj.mkdir()

    async def scenario(c):
        first = await c.session.call_tool("shell_run", {"command": "pwd"}, allow_input_required=True)
        assert isinstance(first, t.InputRequiredResult), first
        (key, req), = first.input_requests.items()
        assert req.method == "roots/list", req
        roots = {key: t.ListRootsResult(roots=[t.Root(uri=proj.as_uri())])}
        done = await c.session.call_tool(
            "shell_run", {"command": "pwd", "wait_seconds": 30}, input_responses=roots,
            request_state=first.request_state, allow_input_required=True,
        )
        assert done.structured_content["stdout"]["text"].strip() == str(proj), done

    run_modern_in(server, Path("/"), Roots(proj), scenario)


def test_a_2026_client_started_in_slash_without_roots_gets_a_tool_error_in_words(server):
    async def scenario(c):
        r = await c.call_tool("shell_run", {"command": "true"})
        text = text_of(r)
        assert r.is_error and "no workspace yet" in text and "started in /" in text and "--workspace" in text, text
        assert (await c.call_tool("session_list", {})).structured_content["sessions"] == []

    run_modern_in(server, Path("/"), None, scenario)


def test_a_client_without_roots_is_told_once_the_workspace_is_where_the_server_started(server, tmp_path):
    """No --workspace, started in a project directory, a client (2026-07-28 or 2025) that
    names no workspace: the first answer says the workspace is the start directory, not
    the client's; later answers do not repeat it."""
    proj = tmp_path / "started-here"
    proj.mkdir()
    told = f"Workspace: {proj}, the directory the server was started in: the client named no workspace"

    async def modern(c):
        r = await c.call_tool("python_exec", {"code": "import os; os.getcwd()", "wait_seconds": 30})
        assert r.structured_content["value"] == repr(str(proj)) and told in text_of(r), text_of(r)
        r = await c.call_tool("python_exec", {"code": "1", "wait_seconds": 30})
        assert "Workspace:" not in text_of(r), text_of(r)

    run_modern_in(server, proj, None, modern)

    async def legacy(c):
        r = await c.call("shell_run", command="pwd")
        assert r.structured_content["stdout"]["text"].strip() == str(proj) and told in text_of(r), text_of(r)
        assert "Workspace:" not in text_of(await c.call("shell_run", command="true"))

    run_in(server, proj, None, legacy)
