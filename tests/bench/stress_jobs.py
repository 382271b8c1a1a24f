#!/usr/bin/env python3
"""Stress of fast-ending and fast-failing jobs beside CPU-bound load (not part of the test run).

    python3 tests/bench/stress_jobs.py [--n 50000] [--clients 2] [--burners 2] [--no-write]

Starts the real server (stdio, official `mcp` Python SDK), two `while True: pass` processes
beside it, and runs N `shell_run` calls spread over `--clients` sessions, in turns:
`true` (ends at once), `exit 3` (fails at once) and a program that does not exist (the shell
fails to find it). Every call must be answered with a finished job: an answer that says
`running` gets a `job_wait` of up to 60 s and counts as a hang if the job is still running
then; a call with no answer within 120 s counts as a hang too. Records the counts, the
latency spread and the load in the `## Stress: fast-ending jobs` section of
docs/benchmarks.md (unless --no-write). Exit status 1 if anything hung or was wrong.
Uses $MCP_SANDBOX_BIN, else the release build, else the debug build (target/<host triple>/).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import binary, cpu_model, write_section  # noqa: E402

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

SECTION = "## Stress: fast-ending jobs"

KINDS = [
    ("true", "true", "completed", 0),
    ("exit 3", "exit 3", "failed", 3),
    ("missing program", "/nonexistent/no-such-program", "failed", 127),
]


async def one_client(s: ClientSession, session: str, count: int, stats: dict) -> None:
    for i in range(count):
        kind, command, want_status, want_code = KINDS[i % len(KINDS)]
        t = time.perf_counter()
        with anyio.move_on_after(120) as scope:
            res = await s.call_tool("shell_run", {"command": command, "wait_seconds": 5, "session": session})
        if scope.cancelled_caught:
            stats["unanswered"] += 1
            continue
        sc = res.structured_content or {}
        if sc.get("status") == "running":
            stats["running_answers"] += 1
            with anyio.move_on_after(120):
                res = await s.call_tool("job_wait", {"job_id": sc["job_id"], "timeout_seconds": 60})
                sc = res.structured_content or {}
            if sc.get("status") == "running":
                stats["hangs"] += 1
                stats["hung_ids"].append(sc.get("job_id"))
                continue
        stats["lat"].append(time.perf_counter() - t)
        if sc.get("status") != want_status or sc.get("exit_code") != want_code:
            stats["wrong"] += 1
            if len(stats["wrong_examples"]) < 5:
                stats["wrong_examples"].append((kind, sc.get("status"), sc.get("exit_code"), res.content[:1]))
        stats["done"] += 1


async def run(bin_path: str, n: int, clients: int) -> dict:
    stats = {"done": 0, "unanswered": 0, "running_answers": 0, "hangs": 0, "wrong": 0,
             "lat": [], "hung_ids": [], "wrong_examples": []}
    with tempfile.TemporaryDirectory() as root:
        ws, state = Path(root) / "ws", Path(root) / "state"
        ws.mkdir()
        state.mkdir()
        env = dict(os.environ, MCP_SANDBOX_WORKSPACE=str(ws), MCP_SANDBOX_STATE_DIR=str(state),
                   RUST_LOG="error")
        params = StdioServerParameters(command=bin_path, args=["--keep-jobs", "200"], env=env, cwd=str(ws))
        async with stdio_client(params, errlog=open(os.devnull, "w")) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                per = n // clients
                async with anyio.create_task_group() as tg:
                    for c in range(clients):
                        tg.start_soon(one_client, s, f"stress{c}", per + (n % clients if c == 0 else 0), stats)
    return stats


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50000)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--burners", type=int, default=2)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    bin_path = binary()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.burners)]
    load = []
    t0 = time.time()
    try:
        stats = anyio.run(run, bin_path, a.n, a.clients)
        load.append(os.getloadavg()[0])
    finally:
        for b in burners:
            b.kill()
    wall = time.time() - t0
    lat = [x * 1000 for x in stats["lat"]]
    ok = stats["hangs"] == 0 and stats["unanswered"] == 0 and stats["wrong"] == 0
    cpu = cpu_model()
    profile = "release" if "/release/" in bin_path else "debug" if "/debug/" in bin_path else "given"
    lines = [
        SECTION,
        "",
        f"`python3 tests/bench/stress_jobs.py --n {a.n} --clients {a.clients} --burners {a.burners}` — "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {platform.system()} "
        f"{platform.release()}, {os.cpu_count()} CPUs ({cpu}), {profile} build, "
        f"{a.burners} CPU-bound processes beside the server, load {load[0]:.1f} at the end, {wall:.0f} s.",
        "",
        "| calls | answered, finished | answered `running` (then waited) | hung (still running after 60 s) | never answered | wrong status/code | latency p50 / p90 / p99 / max |",
        "|---|---|---|---|---|---|---|",
        f"| {a.n} | {stats['done']} | {stats['running_answers']} | {stats['hangs']} | {stats['unanswered']} | "
        f"{stats['wrong']} | {statistics.median(lat):.1f} / {pct(lat, 90):.1f} / {pct(lat, 99):.1f} / {max(lat):.1f} ms |",
        "",
        "Kinds in turns: `true`, `exit 3`, a missing program (exit 127). Each call `shell_run` with "
        "`wait_seconds: 5`; latency is the call's round trip (plus the `job_wait` when it answered `running`).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if stats["wrong_examples"]:
        print("wrong:", stats["wrong_examples"])
    if stats["hung_ids"]:
        print("hung jobs:", stats["hung_ids"])
    if not a.no_write:
        write_section(SECTION, text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
