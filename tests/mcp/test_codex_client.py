"""Today's Codex, driven the way its own MCP client drives a server (openai/codex,
`codex-rs/codex-mcp`): it starts the server in its working directory with the arguments
`install --client codex` writes (`--sandbox-state inherit`, no `--workspace`), looks for
the experimental capability `codex/sandbox-state-meta` in the `initialize` answer, and
only then puts its sandbox state — `SandboxState` serialized: `permissionProfile`,
`sandboxPolicy`, `codexLinuxSandboxExe`, `sandboxCwd`, `useLegacyLandlock` — into the
`_meta` of every `tools/call` under that key. It no longer sends
`codex/sandbox-state/update` (the older path: tests/mcp/test_client_integration.py)."""

from __future__ import annotations

import socket
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from mcp import ClientSession, MCPError, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from conftest import WIDE_WINDOW, WINDOWED_TOOLS, binary, first_leaf, text_of

META = "codex/sandbox-state-meta"

# Codex's `PermissionProfile` for workspace-write, sent beside the legacy `sandboxPolicy`.
WORKSPACE_PROFILE = {
    "type": "managed",
    "file_system": {
        "type": "restricted",
        "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
            {"path": {"type": "special", "value": {"kind": "project_roots"}}, "access": "write"},
        ],
    },
    "network": "restricted",
}


def read_only() -> dict:
    return {"type": "read-only"}


def workspace_write(*roots: Path, network: bool = False) -> dict:
    policy = {
        "type": "workspace-write",
        "network_access": network,
        "exclude_tmpdir_env_var": False,
        "exclude_slash_tmp": False,
    }
    if roots:
        policy["writable_roots"] = [str(r) for r in roots]
    return policy


def external(network: str | None = None) -> dict:
    policy = {"type": "external-sandbox"}
    if network is not None:
        policy["network_access"] = network
    return policy


class Codex:
    """A client that speaks as Codex's: `_meta` carries the sandbox state on every call,
    once the server has declared the capability."""

    def __init__(self, session: ClientSession, cwd: Path):
        self.session = session
        self.cwd = cwd
        self.policy: dict = workspace_write()
        self.profile: dict | None = WORKSPACE_PROFILE
        experimental = session.server_capabilities.experimental or {}
        self.supports_meta = META in experimental  # `.get(..).is_some()` in Codex

    def meta(self) -> dict | None:
        if not self.supports_meta:
            return None
        state = {
            "sandboxPolicy": self.policy,
            "codexLinuxSandboxExe": None,
            "sandboxCwd": str(self.cwd),
            "useLegacyLandlock": False,
        }
        if self.profile is not None:
            state["permissionProfile"] = self.profile
        return {META: state}

    async def call(self, tool: str, **args):
        if tool in WINDOWED_TOOLS and "wait_seconds" not in args:
            args["wait_seconds"] = WIDE_WINDOW
        return await self.session.call_tool(tool, args, read_timeout_seconds=WIDE_WINDOW + 60, meta=self.meta())

    async def py(self, code: str, **args) -> tuple[dict, str]:
        res = await self.call("python_exec", code=code, **args)
        assert res.structured_content is not None, text_of(res)
        return res.structured_content, text_of(res)


@asynccontextmanager
async def codex(server, cwd: Path, *args: str):
    """Start the server as Codex does: in its working directory, no --workspace."""
    env = server.server_env()
    env.pop("MCP_SANDBOX_WORKSPACE", None)
    params = StdioServerParameters(command=binary(), args=["--sandbox-state", "inherit", *args], env=env, cwd=str(cwd))
    info = types.Implementation(name="codex-mcp-client", title="Codex", version="0.130.0")
    with open(server.root / "server-stderr.log", "a") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write, client_info=info) as session:
                await session.initialize()
                yield Codex(session, cwd)


def run_codex(server, cwd: Path, scenario, *args: str):
    async def main():
        with anyio.fail_after(240):
            async with codex(server, cwd, *args) as c:
                return await scenario(c)

    try:
        return anyio.run(main)
    except BaseExceptionGroup as group:
        raise first_leaf(group) from None


def project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir()
    return proj


def test_read_only_refuses_workspace_writes_in_words_naming_the_clients_policy(server, tmp_path):
    proj = project(tmp_path)

    async def scenario(c: Codex):
        assert c.supports_meta, c.session.server_capabilities
        c.policy, c.profile = read_only(), None
        # The prewarmed default session started before any state came: the first call
        # runs under the client's read-only all the same.
        r, text = await c.py("open('py.txt', 'w').write('no')")
        assert r["status"] == "failed", text
        assert "read-only (from the client)" in text, text
        res = await c.call("shell_run", command="pwd; echo no > sh.txt")
        text = text_of(res)
        assert res.is_error, text
        assert res.structured_content["stdout"]["text"].strip() == str(proj), text  # sandboxCwd
        assert "blocked by policy read-only (from the client)" in text, text
        assert not (proj / "py.txt").exists() and not (proj / "sh.txt").exists()
        sessions = {s["name"]: s["policy"] for s in (await c.call("session_list")).structured_content["sessions"]}
        assert sessions["default"] == "read-only (from the client)", sessions

    run_codex(server, proj, scenario)


def test_the_session_a_call_uses_follows_each_change_of_the_clients_sandbox(server, tmp_path):
    proj = project(tmp_path)

    async def scenario(c: Codex):
        r, text = await c.py("x = 1; open('a.txt', 'w').write('a')")
        assert r["status"] == "completed", text
        # The user switches Codex to read-only: the same session refuses the next write.
        c.policy = read_only()
        r, text = await c.py("open('b.txt', 'w').write('b')")
        assert r["status"] == "failed", text
        assert "read-only (from the client)" in text, text
        assert "started again because the client's sandbox changed" in text, text
        assert not (proj / "b.txt").exists()
        # A repeated state changes nothing: variables survive between calls under it.
        r, _ = await c.py("y = 2")
        r, text = await c.py("y")
        assert r["value"] == "2", text
        c.policy = workspace_write()
        r, text = await c.py("open('c.txt', 'w').write('c')")
        assert r["status"] == "completed", text
        assert (proj / "a.txt").exists() and (proj / "c.txt").exists()

    run_codex(server, proj, scenario)


def test_workspace_write_with_an_extra_writable_root(server, tmp_path):
    proj, extra, other = project(tmp_path), tmp_path / "extra", tmp_path / "other"
    extra.mkdir()
    other.mkdir()

    async def scenario(c: Codex):
        c.policy = workspace_write(extra)
        res = await c.call("shell_run", command=f"echo sh > '{extra}/sh.txt' && echo ws > ws.txt")
        assert not res.is_error, text_of(res)
        r, text = await c.py(f"open({str(extra / 'py.txt')!r}, 'w').write('py')")
        assert r["status"] == "completed", text
        assert (extra / "sh.txt").read_text() == "sh\n" and (extra / "py.txt").read_text() == "py"
        assert (proj / "ws.txt").read_text() == "ws\n"
        # Only what the client listed (another directory is not even visible).
        res = await c.call("shell_run", command=f"echo no > '{other}/no.txt'")
        assert res.is_error, text_of(res)
        assert not (other / "no.txt").exists()
        r, text = await c.py("open('/usr/codex-client-test.txt', 'w')")
        assert r["status"] == "failed", text
        assert "blocked by policy workspace-write (from the client)" in text, text
        assert not Path("/usr/codex-client-test.txt").exists()

    run_codex(server, proj, scenario)


def connect_code(port: int) -> str:
    return (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=10).close(); r = 'connected'\n"
        "except OSError as e:\n"
        "    r = f'refused: {e}'\n"
        "r"
    )


def test_external_sandbox_is_accepted_and_the_network_follows_it(server, tmp_path):
    proj, outside = project(tmp_path), tmp_path / "outside"
    outside.mkdir()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]

    async def scenario(c: Codex):
        c.policy, c.profile = external(), {"type": "external", "network": "restricted"}
        res = await c.call("session_list")
        text = text_of(res)
        assert not res.is_error, text
        assert "external-sandbox (from the client)" in text and "still enforced" in text, text
        # Files are the outer sandbox's business: not confined here.
        r, text = await c.py(f"open({str(outside / 'f.txt')!r}, 'w').write('x')")
        assert r["status"] == "completed", text
        # The network is off unless the client enables it.
        r, text = await c.py(connect_code(port))
        assert r["value"].startswith("'refused"), text
        c.policy = external("enabled")
        r, text = await c.py(connect_code(port))
        assert r["value"] == "'connected'", text

    try:
        run_codex(server, proj, scenario)
    finally:
        listener.close()
    assert (outside / "f.txt").read_text() == "x"


def test_a_state_that_does_not_parse_refuses_the_call(server, tmp_path):
    proj = project(tmp_path)

    async def scenario(c: Codex):
        c.policy = {"type": "no-such-sandbox"}
        try:
            await c.call("shell_run", command="echo ran > ran.txt")
        except MCPError as e:
            assert e.code == -32602, e
            assert META in e.message and "sandboxPolicy.type" in e.message, e.message
        else:
            raise AssertionError("a call with a state that does not parse ran")
        assert not (proj / "ran.txt").exists()

    run_codex(server, proj, scenario)


def test_a_working_directory_of_slash_is_refused_in_words_not_by_exiting(server, tmp_path):
    proj = project(tmp_path)

    async def scenario(c: Codex):
        c.cwd = Path("/")
        res = await c.call("shell_run", command="pwd")
        text = text_of(res)
        assert not res.is_error, text
        assert res.structured_content["stdout"]["text"].strip() == str(proj), text
        assert "working directory (sandboxCwd) / refused" in text, text

    run_codex(server, proj, scenario)
