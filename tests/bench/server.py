#!/usr/bin/env python3
"""Server benchmark through the official MCP Python SDK (stdio), not part of the tests.

Measures: spawn → initialized, the first python_exec (starts the worker), median and p95
of 200 trivial executes, interrupt → reported KeyboardInterrupt, restart → usable session,
and `python3 -c pass` in the same run for scale. Prints a markdown section.

    python3 tests/bench/server.py [--bin target/<triple>/release/mcp-sandbox-repl] [--baseline OTHER_BIN] [--n 200]

Builds the release binary first when --bin is the default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from common import build_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


async def time_interrupt(s: ClientSession) -> float:
    """Seconds from `python_interrupt` to the busy cell's KeyboardInterrupt reported."""
    r = await s.call_tool("python_exec", {"code": "while True: pass", "wait_seconds": 0.1})
    job = r.structured_content["job_id"]
    t = time.perf_counter()
    await s.call_tool("python_interrupt", {})
    r = await s.call_tool("job_wait", {"job_id": job, "until_done": True, "timeout_seconds": 10})
    took = time.perf_counter() - t
    sc = r.structured_content
    assert (sc.get("exception") or sc.get("error") or {}).get("ename") == "KeyboardInterrupt", r
    return took


async def one_server(binary: str, root: Path, n: int, results: dict, full: bool, pause: float = 0.0):
    ws, state = root / "ws", root / "state"
    ws.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, MCP_SANDBOX_WORKSPACE=str(ws), MCP_SANDBOX_STATE_DIR=str(state), RUST_LOG="error")
    params = StdioServerParameters(command=binary, args=[], env=env, cwd=str(ws))
    t0 = time.perf_counter()
    async with stdio_client(params, errlog=open(os.devnull, "w")) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            results.setdefault("init", []).append(time.perf_counter() - t0)
            if pause:
                # An agent's first call comes a moment after initialize; by then the
                # default session is prewarmed.
                await anyio.sleep(pause)
                t = time.perf_counter()
                res = await s.call_tool("python_exec", {"code": "1"})
                results.setdefault("first_warm", []).append(time.perf_counter() - t)
                return
            if not full:
                return
            t = time.perf_counter()
            res = await s.call_tool("python_exec", {"code": "1"})
            results["first"] = time.perf_counter() - t
            assert not res.is_error, res
            lat = []
            for _ in range(n):
                t = time.perf_counter()
                res = await s.call_tool("python_exec", {"code": "1"})
                lat.append(time.perf_counter() - t)
                assert res.structured_content["value"] == "1"
            results["trivial"] = lat

            results["interrupt"] = [await time_interrupt(s) for _ in range(5)]

            rs = []
            for _ in range(5):
                await s.call_tool("python_exec", {"code": "x = 1"})
                t = time.perf_counter()
                await s.call_tool("session_restart", {})
                res = await s.call_tool("python_exec", {"code": "'x' in globals()"})
                rs.append(time.perf_counter() - t)
                assert res.structured_content["value"] == "False", res
            results["restart"] = rs


def python_pass(runs=10):
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(["python3", "-c", "pass"], check=True)
        out.append(time.perf_counter() - t)
    return out


def measure(binary: str, n: int) -> dict:
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(10):
            anyio.run(one_server, binary, Path(tmp) / f"r{i}", n, results, False)
        for i in range(3):
            anyio.run(one_server, binary, Path(tmp) / f"w{i}", n, results, False, 1.5)
        anyio.run(one_server, binary, Path(tmp) / "full", n, results, True)
    return results


def rows(results: dict) -> list[str]:
    t = results["trivial"]
    return [
        ms(statistics.median(results["init"])),
        ms(results["first"]),
        ms(statistics.median(results["first_warm"])),
        f"{ms(statistics.median(t))} / {ms(pct(t, 95))}",
        ms(statistics.median(results["interrupt"])),
        ms(statistics.median(results["restart"])),
    ]


def main():
    ap = argparse.ArgumentParser()
    default = build_dir("release") / "mcp-sandbox-repl"
    ap.add_argument("--bin", default=str(default))
    ap.add_argument("--baseline", help="another build to measure in the same run (e.g. main's), shown as a column")
    ap.add_argument("--no-build", action="store_true", help="do not run `cargo build --release` first")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3, help="measurements of each build, taken in turns")
    args = ap.parse_args()
    if not args.no_build and args.bin == str(default):
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=REPO, check=True)
    args.bin = os.path.abspath(args.bin)
    builds = [("baseline", os.path.abspath(args.baseline))] if args.baseline else []
    builds.append(("this build" if args.baseline else "Result", args.bin))
    # Builds are measured in turns (A B A B ...) and samples pooled, so a burst of load
    # on the shared machine does not land on one column only.
    pooled = [dict() for _ in builds]
    for _ in range(args.rounds):
        for (_, b), acc in zip(builds, pooled):
            for k, v in measure(b, args.n).items():
                acc.setdefault(k, []).extend(v if isinstance(v, list) else [v])
    for acc in pooled:
        acc["first"] = statistics.median(acc["first"])
    columns = [rows(acc) for acc in pooled]
    pp = python_pass()
    profile = "release" if "/release/" in args.bin else "debug"
    names = [
        f"spawn → initialized (median of {10 * args.rounds})",
        f"first `python_exec` right after initialize (worker still starting; median of {args.rounds})",
        f"first `python_exec` 1.5 s after initialize (prewarmed; median of {3 * args.rounds})",
        f"trivial `python_exec` ×{args.n * args.rounds}: median / p95",
        f"interrupt → KeyboardInterrupt reported (median of {5 * args.rounds})",
        f"restart → usable session (median of {5 * args.rounds})",
    ]
    print("## Server\n")
    print(f"Measured with `python3 tests/bench/server.py` ({profile} build, official `mcp` Python SDK over stdio,")
    print(f"policy workspace-write, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}).\n")
    print("| What | " + " | ".join(name for name, _ in builds) + " |")
    print("|---" * (len(builds) + 1) + "|")
    for i, name in enumerate(names):
        print(f"| {name} | " + " | ".join(c[i] for c in columns) + " |")
    print(f"| `python3 -c pass` (median of 10, same run) | {ms(statistics.median(pp))} |" + " |" * (len(builds) - 1))


if __name__ == "__main__":
    sys.exit(main())
