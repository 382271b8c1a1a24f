#!/usr/bin/env python3
"""Benchmark of shell jobs through the real server over MCP stdio (not part of the test run).

    python3 tests/bench/shell.py [--runs 30] [--mb 200] [--policy workspace-write]

Measures, each against running the same command directly with subprocess:
  * spawn latency of `true`: one `shell_run` round trip (the command runs sandboxed through
    the launcher, its output is spooled, the answer comes back inline), vs `sh -c true`;
    a `job_list` round trip is shown as the cost of MCP itself;
  * output throughput: a job printing N MB (`head -c N /dev/zero`), from the call until
    `job_wait(until_done)` reports it finished, vs reading the same output from a pipe;
  * the server's peak RSS (VmHWM) after the flood.
Uses $MCP_SANDBOX_BIN, else target/release, else target/debug.
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

REPO = Path(__file__).resolve().parents[2]


def binary() -> str:
    env = os.environ.get("MCP_SANDBOX_BIN")
    if env:
        return env
    for profile in ("release", "debug"):
        p = REPO / "target" / profile / "mcp-sandbox-repl"
        if p.exists():
            return str(p)
    sys.exit("no server binary: run `cargo build --release` or set MCP_SANDBOX_BIN")


def server_pid(marker: str) -> int | None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
        except OSError:
            continue
    return None


def vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def direct_ms(cmd: str) -> float:
    t = time.perf_counter()
    p = subprocess.Popen(["/bin/sh", "-c", cmd], stdout=subprocess.PIPE)
    assert p.stdout is not None
    while p.stdout.read(1 << 16):
        pass
    p.wait()
    return (time.perf_counter() - t) * 1000


async def bench(args) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-shell-") as root:
        ws, state = Path(root, "ws"), Path(root, "state")
        ws.mkdir()
        state.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_SANDBOX_")}
        env["RUST_LOG"] = "warn"
        params = StdioServerParameters(
            command=binary(),
            args=["--policy", args.policy, "--workspace", str(ws), "--state-dir", str(state)],
            env=env,
            cwd=str(ws),
        )
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                pid = server_pid(str(state))

                async def call(tool: str, **kw):
                    r = await s.call_tool(tool, kw, read_timeout_seconds=None)
                    if r.is_error:
                        raise SystemExit(f"{tool} failed: {r.content}")
                    return r.structured_content or {}

                # Warm up (first spawn pays for page cache, policy resolution).
                for _ in range(3):
                    await call("shell_run", command="true")
                    direct_ms("true")

                job, mcp, direct = [], [], []
                for _ in range(args.runs):
                    t = time.perf_counter()
                    r = await call("shell_run", command="true")
                    job.append((time.perf_counter() - t) * 1000)
                    assert r["status"] == "completed", r
                    t = time.perf_counter()
                    await call("job_list")
                    mcp.append((time.perf_counter() - t) * 1000)
                    direct.append(direct_ms("true"))

                n = args.mb * 1_000_000
                cmd = f"head -c {n} /dev/zero"
                t = time.perf_counter()
                r = await call("shell_run", command=cmd, wait_seconds=0)
                r = await call("job_wait", job_id=r["job_id"], until_done=True, timeout_seconds=300)
                job_flood = (time.perf_counter() - t) * 1000
                assert r["status"] == "completed", r
                direct_flood = statistics.median(direct_ms(cmd) for _ in range(3))
                rss = vm_hwm_mb(pid) if pid else float("nan")

        med = statistics.median
        print(f"binary: {binary()}  policy: {args.policy}  runs: {args.runs}")
        print(
            f"spawn `true`: shell_run {med(job):.1f} ms (MCP round trip alone {med(mcp):.1f} ms), "
            f"direct {med(direct):.2f} ms -> {med(job) / med(direct):.1f}x "
            f"({(med(job) - med(mcp)) / med(direct):.1f}x without the MCP round trip)"
        )
        print(
            f"{args.mb} MB output: job {args.mb / job_flood * 1000:.0f} MB/s, "
            f"direct {args.mb / direct_flood * 1000:.0f} MB/s -> {direct_flood / job_flood:.2f}x of direct throughput"
        )
        print(f"server peak RSS after the flood: {rss:.0f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--policy", default="workspace-write")
    anyio.run(bench, ap.parse_args())


if __name__ == "__main__":
    main()
