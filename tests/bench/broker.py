#!/usr/bin/env python3
"""Network broker benchmark (not part of the tests), through the real server over MCP stdio.

- install: `env_install` of one local wheel from a find-links server on the host's
  127.0.0.1, into a fresh session venv each sample, with the installer's network through
  the broker (`[installer.network] mode = "proxy"`, that host:port allowed) vs the host's
  network directly (`mode = "full"`). Two servers, calls alternated, timed at the client.
- GET: a session fetches a small page from a local HTTP server with urllib, N times in one
  cell, timed inside the cell: through the broker (`network.mode = "proxy"`) vs directly
  (`network.mode = "full"`, no proxy variables).

    python3 tests/bench/broker.py [--bin target/<triple>/debug/mcp-sandbox-repl] [--installs 7] [--gets 200]

Prints a markdown section for docs/benchmarks.md. Run as root (proxy mode needs network
namespaces).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "bench"))
from envs import make_wheel  # noqa: E402
from common import build_dir  # noqa: E402

BASE = (REPO / "policies" / "workspace-write.toml").read_text()


def serve(directory: Path) -> int:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=str(directory), **k)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd.server_address[1]


def policy(root: Path, name: str, session_net: str, installer_net: str) -> Path:
    text = BASE.replace('[network]\nmode = "none"', f"[network]\n{session_net}")
    text += f"\n[installer.network]\n{installer_net}\n"
    path = root / f"{name}.toml"
    path.write_text(text)
    return path


async def start(stack: AsyncExitStack, binary: str, root: Path, name: str, pol: Path, env: dict) -> ClientSession:
    ws, state = root / name / "ws", root / name / "state"
    ws.mkdir(parents=True)
    state.mkdir(parents=True)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_SANDBOX_") and "PROXY" not in k.upper()}
    full_env.update(env, MCP_SANDBOX_WORKSPACE=str(ws), MCP_SANDBOX_STATE_DIR=str(state), RUST_LOG="warn")
    params = StdioServerParameters(command=binary, args=["--policy", str(pol)], env=full_env, cwd=str(ws))
    read, write = await stack.enter_async_context(stdio_client(params, errlog=open(root / f"{name}.log", "w")))
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    return session


async def call(s: ClientSession, tool: str, **args) -> dict:
    r = await s.call_tool(tool, args, read_timeout_seconds=300)
    if r.is_error:
        raise SystemExit(f"{tool} failed: {r.content[0].text[:2000]}")
    return r.structured_content


async def finish(s: ClientSession, job: dict) -> dict:
    while job["status"] == "running":
        job = await call(s, "job_wait", job_id=job["job_id"], timeout_seconds=60)
    return job


async def main(args) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-broker-"))
    wheels = root / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "tinypkg", "0.1")
    wport = serve(wheels)
    (root / "page").mkdir()
    (root / "page" / "index.html").write_text("x" * 1024)
    pport = serve(root / "page")
    idx = f"127.0.0.1:{wport}"
    env = {"UV_INDEX_URL": f"http://{idx}/simple", "UV_FIND_LINKS": f"http://{idx}/", "UV_PYTHON_DOWNLOADS": "never"}
    allow = json.dumps([idx, f"127.0.0.1:{pport}"])
    proxied = policy(root, "proxied", f'mode = "proxy"\nallow = {allow}', f'mode = "proxy"\nallow = {allow}')
    direct = policy(root, "direct", 'mode = "full"', 'mode = "full"')
    async with AsyncExitStack() as stack:
        servers = {
            "broker": await start(stack, args.bin, root, "broker", proxied, env),
            "direct": await start(stack, args.bin, root, "direct", direct, env),
        }
        installs: dict[str, list[float]] = {k: [] for k in servers}
        for i in range(args.installs + 1):
            for mode, s in servers.items():
                t0 = time.perf_counter()
                job = await finish(s, await call(s, "env_install", packages=["tinypkg"], session=f"s{i}"))
                dt = time.perf_counter() - t0
                assert job["status"] == "completed", job
                await call(s, "session_close", session=f"s{i}")
                if i > 0:  # the first fills uv's cache
                    installs[mode].append(dt)
        gets: dict[str, float] = {}
        code = (
            "import time, urllib.request, statistics\n"
            f"url = 'http://127.0.0.1:{pport}/'\n"
            "urllib.request.urlopen(url).read()\n"
            "ts = []\n"
            f"for _ in range({args.gets}):\n"
            "    t = time.perf_counter(); urllib.request.urlopen(url, timeout=10).read(); ts.append(time.perf_counter() - t)\n"
            "statistics.median(ts) * 1000\n"
        )
        for mode, s in servers.items():
            r = await call(s, "python_exec", code=code, wait_seconds=60)
            assert r["status"] == "completed", r
            gets[mode] = float(r["value"])
    med = {k: statistics.median(v) * 1000 for k, v in installs.items()}
    print("## Network broker\n")
    print(
        "Through the broker (proxy mode: the job's own network namespace, the server relaying) vs the host's "
        "network directly (mode full), same machine, same run. Medians; ratio = broker / direct. "
        f"`python3 tests/bench/broker.py` ({args.installs} installs, {args.gets} GETs per mode).\n"
    )
    print("| what | broker | direct | ratio |\n|---|---|---|---|")
    print(
        f"| `env_install` of one local wheel from a find-links server on 127.0.0.1 (fresh venv, warm uv cache; client round trip) "
        f"| {med['broker']:.0f} ms | {med['direct']:.0f} ms | {med['broker'] / med['direct']:.2f} |"
    )
    print(
        f"| HTTP GET of 1 KiB from a local server, urllib in a session (per request, timed in the cell) "
        f"| {gets['broker']:.2f} ms | {gets['direct']:.2f} ms | {gets['broker'] / gets['direct']:.2f} |"
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default=str(build_dir("debug") / "mcp-sandbox-repl"))
    p.add_argument("--installs", type=int, default=7)
    p.add_argument("--gets", type=int, default=200)
    anyio.run(main, p.parse_args())
