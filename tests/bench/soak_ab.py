#!/usr/bin/env python3
"""Soak A/B (not part of the tests): servers of ours (e.g. main's build and a branch's) and
the no-op rmcp echo server, called round-robin through raw JSON-RPC lines (`soak.RawClient`),
one trivial call each per round, in an order that turns every round: every server sees the
same moments of the machine's load,
so their latency percentiles compare, and the echo's are the machine's own tail.

    python3 tests/bench/soak_ab.py --n 100000 main=/path/to/main/mcp-sandbox-repl \
        branch=target/<triple>/release/mcp-sandbox-repl [--echo target/<triple>/release/examples/noop_server]
        [--dump /tmp/lat.json]

Each server gets its own workspace and state dir (retention at its default). Prints p50,
p90, p99, p99.9 and max per server, by 10,000 calls too, and the calls over 100 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import RawClient  # noqa: E402
from common import build_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--echo", default=str(build_dir("release") / "examples" / "noop_server"))
    ap.add_argument("--dump", default=None, help="write every call's latency (ms) per server as JSON")
    ap.add_argument("server", nargs="+", help="name=binary (a build of ours)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="msr-soak-ab-"))
    clients = []
    for spec in args.server:
        name, binary = spec.split("=", 1)
        ws, state = root / name / "ws", root / name / "state"
        ws.mkdir(parents=True)
        state.mkdir(parents=True)
        env = dict(os.environ, RUST_LOG="error", MCP_SANDBOX_WORKSPACE=str(ws), MCP_SANDBOX_STATE_DIR=str(state))
        c = RawClient(os.path.abspath(binary), env, ws)
        c.call_tool("python_exec", {"code": "1"})  # the worker is up
        clients.append((name, c, "python_exec", {"code": "1"}))
    echo = RawClient(args.echo, dict(os.environ), root)
    echo.call_tool("noop", {})
    clients.append(("no-op rmcp echo", echo, "noop", {}))
    lat = {name: [] for name, *_ in clients}
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    for i in range(args.n):
        # The order turns every round: a server's work after its answer (writing the job's
        # files) runs during the next one's call, so a fixed order would favour the first.
        k = i % len(clients)
        for name, c, tool, call in clients[k:] + clients[:k]:
            t = time.perf_counter()
            res = c.call_tool(tool, call)
            lat[name].append((time.perf_counter() - t) * 1000)
            if res.get("isError"):
                raise SystemExit(f"{name}: call {i} failed: {res.get('content')}")
        if i % 10_000 == 0:
            print(f"{i}/{args.n}", file=sys.stderr, flush=True)
    took, load1 = time.perf_counter() - t0, os.getloadavg()[0]
    for _, c, *_ in clients:
        c.close()
    shutil.rmtree(root, ignore_errors=True)
    print(f"`python3 tests/bench/soak_ab.py --n {args.n} {' '.join(args.server)}` — "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.uname().sysname} {os.uname().release}, "
          f"{os.cpu_count()} CPUs; {took:.0f} s; load average (1 min) {load0:.2f} at start, {load1:.2f} at the end.\n")
    print("| server | calls | p50 (ms) | p90 | p99 | p99.9 | max | calls > 100 ms |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, v in lat.items():
        print(f"| {name} | {len(v)} | {pct(v, 50):.2f} | {pct(v, 90):.2f} | {pct(v, 99):.2f} | {pct(v, 99.9):.2f} | "
              f"{max(v):.1f} | {sum(x > 100 for x in v)} |")
    print("\np99 (ms) by 10,000 calls:\n")
    for name, v in lat.items():
        print(f"- {name}: " + ", ".join(f"{pct(v[i:i + 10_000], 99):.1f}" for i in range(0, len(v), 10_000)))
    for name, v in lat.items():
        slow = [(i, round(x)) for i, x in enumerate(v) if x > 100]
        if slow:
            print(f"- {name}, calls over 100 ms (call, ms): {slow[:30]}")
    if args.dump:
        Path(args.dump).write_text(json.dumps(lat))


if __name__ == "__main__":
    main()
