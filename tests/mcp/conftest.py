"""Harness for driving the real `mcp-sandbox-repl` binary through the official MCP Python SDK.

Each test gets a fresh temp workspace and state directory. A test writes its scenario as an
`async def scenario(c)` taking a `Client`, and runs it with `server.run(scenario)`; the
server is started over stdio for the scenario and stopped afterwards. Several servers (a
restart) are just several `run` calls on the same harness: they share the state directory.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Awaitable, Callable

import anyio
import pytest
from mcp import ClientSession, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client

REPO = Path(__file__).resolve().parents[2]
# Where cargo puts a profile's artifacts: the benchmarks' helper (standard library only).
sys.path.append(str(REPO / "tests" / "bench"))
from common import build_dir  # noqa: E402


def binary() -> str:
    """The server binary: $MCP_SANDBOX_BIN, else the debug build (tests/run builds it)."""
    path = os.environ.get("MCP_SANDBOX_BIN") or str(build_dir("debug") / "mcp-sandbox-repl")
    if not os.access(path, os.X_OK):
        pytest.fail(f"server binary not found at {path}: run `cargo build` (or tests/run) first")
    return path


# The one HTTP harness: every test that starts the server over HTTP goes through
# `launch_http` (or `start_http` over it) and talks to it with `post`.

INIT = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}


def raw_server_env(tmp_path: Path) -> dict[str, str]:
    """Environment for a server started by hand (raw JSON-RPC over its stdio): a fresh
    workspace and state dir under `tmp_path`, none of the caller's MCP_SANDBOX_ settings."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "state").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_SANDBOX_")}
    env.update(
        MCP_SANDBOX_WORKSPACE=str(tmp_path / "ws"),
        MCP_SANDBOX_STATE_DIR=str(tmp_path / "state"),
        RUST_LOG="error",
    )
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_http(server: "Harness", *args: str, env: dict[str, str] | None = None, prefix=(), host="127.0.0.1"):
    """The server with `--transport http` on a free port of `host` (loopback unless a test
    is about another address; under `prefix`, e.g. prlimit), stderr to
    `<root>/http-<port>.log`, once the port answers on loopback. Returns (process,
    port, log path). The 60 s deadline only guards a server that never listens; one that
    exited is reported at once."""
    port = free_port()
    log = server.root / f"http-{port}.log"
    proc = subprocess.Popen(
        [*prefix, binary(), "--transport", "http", "--listen", f"{host}:{port}", *args],
        env=env if env is not None else server.server_env(),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(log, "w"),
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port, log
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"HTTP server did not start: {log.read_text()}")


def start_http(server: "Harness", *extra: str, log_env=None):
    """`launch_http` at the server's default log level (unless `log_env`: the harness's
    RUST_LOG), so the start-up line shows; returns (process, MCP URL, port)."""
    env = server.server_env()
    if log_env is None:
        env.pop("RUST_LOG", None)  # the default level must show the start-up line
    proc, port, _ = launch_http(server, *extra, env=env)
    return proc, f"http://127.0.0.1:{port}/mcp", port


def post(url, body, headers=None):
    """POST `body` as JSON-RPC; returns (HTTP status, body text), errors included."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Accept", "application/json, text/event-stream")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def stop(proc):
    """SIGINT stops at once (an HTTP server's SIGTERM first drains running jobs: test_cell)."""
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 0


class ToolFailed(AssertionError):
    pass


# Tools that answer within a `wait_seconds` window of 3 s by default, and the window the
# harness gives them when a test names none: the server's widest. A call returns as soon
# as its job ends (or asks for input), so a quick call costs no more; but a loaded machine
# can take longer than 3 s to start a worker or fork a sandboxed shell, and a test that
# checks what a finished call answers must not get "running" instead. A test about the
# window itself names its own `wait_seconds`.
WINDOWED_TOOLS = {"python_exec", "python_run_file", "shell_run", "job_input"}
WIDE_WINDOW = 60


class Client:
    """A thin wrapper over `ClientSession` with helpers that keep tests short."""

    def __init__(self, session: ClientSession, harness: "Harness", proc_pid: int | None):
        self.session = session
        self.harness = harness
        self.server_pid = proc_pid

    async def call(self, tool: str, timeout: float = 60, progress=None, **args: Any):
        """Call a tool; return the raw CallToolResult (may be an error result). A windowed
        tool gets WIDE_WINDOW unless the test names its `wait_seconds`; the read timeout
        always outlasts the window."""
        if tool in WINDOWED_TOOLS and "wait_seconds" not in args:
            args["wait_seconds"] = WIDE_WINDOW
        window = args.get("wait_seconds")
        if isinstance(window, (int, float)) and timeout <= window:
            timeout = window + 60
        return await self.session.call_tool(tool, args, read_timeout_seconds=timeout, progress_callback=progress)

    async def ok(self, tool: str, timeout: float = 60, **args: Any) -> dict:
        """Call a tool that must succeed; return its structured content (or {'text': ...})."""
        res = await self.call(tool, timeout=timeout, **args)
        if res.is_error:
            raise ToolFailed(f"{tool}({args}) failed: {text_of(res)}")
        return res.structured_content if res.structured_content is not None else {"text": text_of(res)}

    async def err(self, tool: str, **args: Any) -> str:
        """Call a tool that must fail with a tool error; return the error text."""
        res = await self.call(tool, **args)
        assert res.is_error, f"{tool}({args}) unexpectedly succeeded: {text_of(res)}"
        return text_of(res)

    async def invalid(self, tool: str, **args: Any) -> str:
        """Call a tool with arguments it cannot take: a JSON-RPC invalid-params error
        (-32602), as the MCP spec answers; return its words."""
        try:
            res = await self.call(tool, **args)
        except MCPError as e:
            assert e.code == -32602, (tool, args, e.code, e.message)
            return e.message
        raise AssertionError(f"{tool}({args}) answered instead of -32602: {text_of(res)}")

    async def py(self, code: str, **args: Any) -> dict:
        """python_exec whose result is returned whatever its status (structured)."""
        res = await self.call("python_exec", code=code, **args)
        assert res.structured_content is not None, f"no structured result: {text_of(res)}"
        return res.structured_content

    async def finish(self, job: dict, timeout: float = 60) -> dict:
        """Follow a job with job_wait until it is finished; return the last report with
        stdout/stderr replaced by everything collected along the way."""
        out, err = [job["stdout"]["text"] + (job["stdout"].get("tail") or "")], [job["stderr"]["text"]]
        deadline = time.monotonic() + timeout
        while job["status"] in ("running", "awaiting_input"):
            assert job["status"] == "running", f"job waits for input: {job}"
            assert time.monotonic() < deadline, f"job did not finish in {timeout}s: {job}"
            job = await self.ok("job_wait", job_id=job["job_id"], timeout_seconds=30)
            out.append(job["stdout"]["text"] + (job["stdout"].get("tail") or ""))
            err.append(job["stderr"]["text"])
        job = dict(job)
        job["all_stdout"] = "".join(out)
        job["all_stderr"] = "".join(err)
        return job


def first_leaf(e: BaseException) -> BaseException:
    while isinstance(e, BaseExceptionGroup):
        e = e.exceptions[0]
    return e


def text_of(res) -> str:
    return "\n".join(getattr(c, "text", f"<{c.type}>") for c in res.content)


class Harness:
    def __init__(self, root: Path):
        self.root = root
        self.workspace = root / "ws"
        self.state_dir = root / "state"
        self.workspace.mkdir()
        self.state_dir.mkdir()
        self.extra_args: list[str] = []
        self.env: dict[str, str] = {}
        self.last_server_pid: int | None = None

    def server_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_SANDBOX_")}
        env.update(
            MCP_SANDBOX_WORKSPACE=str(self.workspace),
            MCP_SANDBOX_STATE_DIR=str(self.state_dir),
            RUST_LOG=os.environ.get("RUST_LOG", "warn"),
        )
        env.update(self.env)
        return env

    @asynccontextmanager
    async def connect(self, *args: str):
        params = StdioServerParameters(
            command=binary(), args=[*self.extra_args, *args], env=self.server_env(), cwd=str(self.workspace)
        )
        errlog = open(self.root / "server-stderr.log", "a")
        try:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    pid = newest_server_pid()
                    self.last_server_pid = pid
                    yield Client(session, self, pid)
        finally:
            errlog.close()

    def run(self, scenario: Callable[[Client], Awaitable[Any]], *args: str, timeout: float = 120) -> Any:
        async def main():
            with anyio.fail_after(timeout):
                async with self.connect(*args) as c:
                    return await scenario(c)

        try:
            return anyio.run(main)
        except BaseExceptionGroup as group:  # show the test's own failure, not the task-group wrapper
            raise first_leaf(group) from None

    def stderr_log(self) -> str:
        p = self.root / "server-stderr.log"
        return p.read_text() if p.exists() else ""


def newest_server_pid() -> int | None:
    """The pid of the most recently started server process that is our child."""
    me = os.getpid()
    best = None
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == me and exe.endswith("mcp-sandbox-repl"):
            best = pid if best is None or pid > best else best
    return best


def descendants(pid: int) -> list[int]:
    """All live processes whose parent chain leads to `pid` (excluding zombies)."""
    children: dict[int, list[int]] = {}
    for p in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(p)
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def pids_with_env_marker(marker: str) -> list[int]:
    """Live processes whose environment or command line contains `marker`."""
    found = []
    for p in map(int, filter(str.isdigit, os.listdir("/proc"))):
        if p == os.getpid():
            continue
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue
            blob = Path(f"/proc/{p}/cmdline").read_bytes() + Path(f"/proc/{p}/environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in blob:
            found.append(p)
    return found


@pytest.fixture
def server(tmp_path) -> Harness:
    return Harness(tmp_path)


class LoopbackHTTP:
    """An HTTP server of the test's own on the host's 127.0.0.1 (a free port, `port`),
    answering with `handler` on a daemon thread until `close()`."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]):
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def python_real() -> str:
    out = subprocess.run(["python3", "-c", "import sys; print(sys.executable)"], capture_output=True, text=True)
    return out.stdout.strip() or shutil.which("python3") or "python3"


# The one offline-uv setup: uv never reaches an index or downloads a Python; packages come
# only from `find_links` (a directory or a URL), if given.

def make_wheel(out: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel `name-version` in `out`."""
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    path = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, text in files.items():
            data = text.encode()
            z.writestr(p, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{p},sha256={digest},{len(data)}")
        record.append(f"{name}-{version}.dist-info/RECORD,,")
        z.writestr(f"{name}-{version}.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def uv_offline(server: Harness, find_links=None) -> Harness:
    """The server's uv offline, with a cache of the test's own and no Python downloads;
    `find_links` (a directory or URL) its only package source."""
    server.env.update(
        UV_OFFLINE="1", UV_NO_INDEX="1", UV_CACHE_DIR=str(server.root / "uv-cache"),
        UV_PYTHON_DOWNLOADS="never",
    )
    if find_links is not None:
        server.env["UV_FIND_LINKS"] = str(find_links)
    return server


@pytest.fixture
def offline(server):
    """The server with a local wheel directory (tinypkg 0.1, otherpkg 0.2) as its only
    package source."""
    wheels = server.root / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "tinypkg", "0.1")
    make_wheel(wheels, "otherpkg", "0.2")
    return uv_offline(server, wheels)
