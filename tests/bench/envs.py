#!/usr/bin/env python3
"""Environments benchmark (not part of the tests): a one-off script with one cached
dependency, run through the server's `python_run_script` tool (MCP over stdio, sandboxed)
and by hand with `uv run --with` in the same run, cold and warm.

- The dependency is a tiny local wheel, already in uv's cache (installed once into a
  throwaway venv with the same cache), so no package index is involved.
- cold: the first run that needs that dependency (uv builds the transient environment);
  each cold sample uses a different dependency so it is really cold.
- warm: the same script again (uv reuses the cached environment).
- ours and by-hand use separate caches prepared the same way, and alternate, so machine
  noise hits both. Ours is timed at the client: the whole tool call round trip.

    python3 tests/bench/envs.py [--bin target/<triple>/debug/mcp-sandbox-repl] [--cold 5] [--warm 15]

Prints a markdown section for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from common import build_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def make_wheel(out: Path, name: str, version: str) -> None:
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(out / f"{name}-{version}-py3-none-any.whl", "w") as z:
        for p, text in files.items():
            data = text.encode()
            z.writestr(p, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{p},sha256={digest},{len(data)}")
        record.append(f"{name}-{version}.dist-info/RECORD,,")
        z.writestr(f"{name}-{version}.dist-info/RECORD", "\n".join(record) + "\n")


def real_python() -> str:
    out = subprocess.run(["python3", "-c", "import sys; print(sys.executable)"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def real_uv() -> str:
    """The uv binary itself (PATH may hold a pyenv shim, which would add its own start-up)."""
    try:
        out = subprocess.run(["python3", "-c", "import uv; print(uv.find_uv_bin())"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except subprocess.CalledProcessError:
        return shutil.which("uv") or "uv"


def uv_env(cache: Path, wheels: Path) -> dict:
    return dict(
        os.environ,
        UV_CACHE_DIR=str(cache),
        UV_OFFLINE="1",
        UV_NO_INDEX="1",
        UV_FIND_LINKS=str(wheels),
        UV_PYTHON_DOWNLOADS="never",
        UV_NO_PROGRESS="1",
    )


def precache(uv: str, python: str, cache: Path, wheels: Path, deps: list[str], root: Path) -> None:
    venv = root / f"warm-{cache.name}"
    env = uv_env(cache, wheels)
    subprocess.run([uv, "venv", "-q", "--python", python, str(venv)], env=env, check=True)
    subprocess.run([uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *deps], env=env, check=True)


def by_hand(uv: str, python: str, cache: Path, wheels: Path, script: Path, dep: str) -> float:
    t = time.perf_counter()
    out = subprocess.run(
        [uv, "run", "--quiet", "--no-project", "--python", python, "--with", dep, str(script)],
        env=uv_env(cache, wheels),
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - t
    assert out.returncode == 0 and out.stdout.strip() == "0.1", out
    return elapsed


async def ours(session: ClientSession, code: str, dep: str) -> tuple[float, int]:
    t = time.perf_counter()
    res = await session.call_tool(
        "python_run_script", {"code": code, "dependencies": [dep], "benchmark": True, "wait_seconds": 60}
    )
    elapsed = time.perf_counter() - t
    job = res.structured_content
    assert not res.is_error and job["status"] == "completed", job
    assert job["stdout"]["text"].strip() == "0.1", job
    return elapsed, job["result"]["benchmark"]["peak_rss_bytes"]


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def ms(s: float) -> str:
    return f"{s * 1000:.0f} ms"


async def main_async(args) -> None:
    root = Path(tempfile.mkdtemp(prefix="envs-bench-", dir="/var/tmp"))
    try:
        python, uv = real_python(), real_uv()
        wheels = root / "wheels"
        wheels.mkdir()
        deps = [f"benchdep{i}" for i in range(args.cold)]
        for d in deps:
            make_wheel(wheels, d, "0.1")
        hand_cache, our_cache = root / "cache-hand", root / "cache-ours"
        precache(uv, python, hand_cache, wheels, deps, root)
        precache(uv, python, our_cache, wheels, deps, root)

        ws, state = root / "ws", root / "state"
        ws.mkdir()
        state.mkdir()
        env = uv_env(our_cache, wheels)
        env.update(MCP_SANDBOX_WORKSPACE=str(ws), MCP_SANDBOX_STATE_DIR=str(state), MCP_SANDBOX_UV=uv, RUST_LOG="error")
        params = StdioServerParameters(command=args.bin, args=[], env=env, cwd=str(ws))
        hand_cold, our_cold, hand_warm, our_warm, rss = [], [], [], [], []
        async with stdio_client(params, errlog=open(os.devnull, "w")) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                await s.call_tool("python_exec", {"code": "1"})  # the interpreter probe, once
                for d in deps:
                    code = f"import {d}\nprint({d}.__version__)\n"
                    script = root / f"run_{d}.py"
                    script.write_text(code)
                    hand_cold.append(by_hand(uv, python, hand_cache, wheels, script, d))
                    t, _ = await ours(s, code, d)
                    our_cold.append(t)
                d = deps[0]
                code = f"import {d}\nprint({d}.__version__)\n"
                script = root / f"run_{d}.py"
                for _ in range(args.warm):
                    hand_warm.append(by_hand(uv, python, hand_cache, wheels, script, d))
                    t, peak = await ours(s, code, d)
                    our_warm.append(t)
                    rss.append(peak)

        print("## Environments\n")
        print(
            "One-off script with one cached dependency (`python_run_script` with `dependencies`, "
            "through MCP stdio and the sandbox) against `uv run --with` of the same script by hand, "
            "same machine, same run, separate but equally prepared uv caches. Medians; ratio = ours / by hand. "
            f"`python3 tests/bench/envs.py` ({args.cold} cold, {args.warm} warm samples).\n"
        )
        print("| case | by hand (`uv run --with`) | ours (`python_run_script`) | ratio |")
        print("|---|---|---|---|")
        for name, h, o in (("cold (environment built)", hand_cold, our_cold), ("warm (environment reused)", hand_warm, our_warm)):
            print(f"| {name} | {ms(med(h))} | {ms(med(o))} | {med(o) / med(h):.2f}× |")
        print(f"\nPeak RSS of the whole process tree (uv + Python), as reported by `benchmark: true`: {med(rss) / 1e6:.1f} MB.")
        print(f"uv: `{subprocess.run([uv, '--version'], capture_output=True, text=True).stdout.strip()}`, Python {sys.version.split()[0]}.")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(build_dir("debug") / "mcp-sandbox-repl"))
    ap.add_argument("--cold", type=int, default=5)
    ap.add_argument("--warm", type=int, default=15)
    args = ap.parse_args()
    anyio.run(main_async, args)


if __name__ == "__main__":
    main()
