#!/usr/bin/env python3
"""R sessions beside Python ones, through the official MCP Python SDK (stdio), in one run;
not part of the tests.

Measures, for each language, in a server of its own (`--interpreter`): the first execute
after spawn (the server's prewarm races it, as a client's first call would), median and
p95 of N trivial executes, interrupt of a busy loop → reported, restart → usable session;
and, for scale, bare `Rscript -e 1` and `python3 -c pass` started directly in the same run.
Prints a markdown section for docs/benchmarks.md.

    python3 tests/bench/r.py [--bin target/<triple>/debug/mcp-sandbox-repl] [--n 100]
"""

from __future__ import annotations

import argparse
import os
import shutil
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

LANG = {
    "python": dict(trivial="1", busy="while True: pass", ename="KeyboardInterrupt"),
    "r": dict(trivial="1", busy="repeat {}", ename="interrupt"),
}


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


async def one_server(binary: str, lang: str, n: int, root: Path) -> dict:
    ws, state = root / lang / "ws", root / lang / "state"
    ws.mkdir(parents=True)
    state.mkdir(parents=True)
    env = dict(os.environ, MCP_SANDBOX_WORKSPACE=str(ws), MCP_SANDBOX_STATE_DIR=str(state), RUST_LOG="error")
    params = StdioServerParameters(command=binary, args=["--interpreter", lang], env=env, cwd=str(ws))
    out = {}
    code = LANG[lang]
    async with stdio_client(params, errlog=open(os.devnull, "w")) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            t = time.perf_counter()
            res = await s.call_tool("python_exec", {"code": code["trivial"], "wait_seconds": 60})
            out["first"] = time.perf_counter() - t
            assert res.structured_content["status"] == "completed", res
            times = []
            for _ in range(n):
                t = time.perf_counter()
                await s.call_tool("python_exec", {"code": code["trivial"]})
                times.append(time.perf_counter() - t)
            out["median"], out["p95"] = statistics.median(times), pct(times, 95)
            res = await s.call_tool("python_exec", {"code": code["busy"], "wait_seconds": 0.2})
            job = res.structured_content["job_id"]
            t = time.perf_counter()
            await s.call_tool("python_interrupt", {})
            res = await s.call_tool("job_wait", {"job_id": job, "until_done": True, "timeout_seconds": 30})
            out["interrupt"] = time.perf_counter() - t
            assert res.structured_content["exception"]["ename"] == code["ename"], res
            t = time.perf_counter()
            await s.call_tool("session_restart", {})
            res = await s.call_tool("python_exec", {"code": code["trivial"]})
            out["restart"] = time.perf_counter() - t
            assert res.structured_content["status"] == "completed", res
    return out


def bare(argv: list[str], n: int = 10) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(build_dir("debug") / "mcp-sandbox-repl"))
    ap.add_argument("--n", type=int, default=100)
    args = ap.parse_args()
    if not shutil.which("Rscript"):
        sys.exit("Rscript is not on PATH: install r-base-core and r-cran-jsonlite")
    with tempfile.TemporaryDirectory() as d:
        res = {lang: anyio.run(one_server, args.bin, lang, args.n, Path(d)) for lang in ("python", "r")}
    rscript = bare([shutil.which("Rscript"), "-e", "1"])
    python = bare([sys.executable, "-c", "pass"])
    ms = lambda s: f"{s * 1000:.1f}"
    print(f"### R sessions beside Python (`python3 tests/bench/r.py --n {args.n}`, {Path(args.bin).name}, "
          f"{os.cpu_count()} cores)\n")
    print("| measure | Python session | R session |")
    print("| --- | ---: | ---: |")
    for key, label in [("first", "first execute after spawn (ms)"), ("median", f"trivial execute, median of {args.n} (ms)"),
                       ("p95", "trivial execute, p95 (ms)"), ("interrupt", "interrupt of a busy loop → reported (ms)"),
                       ("restart", "restart → next execute answered (ms)")]:
        print(f"| {label} | {ms(res['python'][key])} | {ms(res['r'][key])} |")
    print(f"| bare start, same run: `python3 -c pass` / `Rscript -e 1` (ms, median of 10) | {ms(python)} | {ms(rscript)} |")


if __name__ == "__main__":
    main()
