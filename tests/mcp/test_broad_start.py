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


def run_in(server, cwd: Path, roots: Roots | None, scenario, **env: str):
    async def main():
        with anyio.fail_after(120):
            async with started_in(server, cwd, roots, env) as c:
                return await scenario(c)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # roots are deprecated by SEP-2577 in the SDK
            return anyio.run(main)
    except BaseExceptionGroup as group:
        raise first_leaf(group) from None


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
