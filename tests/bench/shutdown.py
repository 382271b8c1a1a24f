#!/usr/bin/env python3
"""SIGTERM to exit of a server that has run a cell (not part of the test run).

    python3 tests/bench/shutdown.py [--n 20] [--baseline OTHER_BINARY] [--no-write]

Each round starts a fresh server over raw stdio, initializes it, runs `python_exec "1"`
(so a worker, its snapshot and the zygote are live), waits 0.3 s, sends SIGTERM and times
until the process is reaped. The floor, measured in the same run and in turns: `cat`
blocked on the same kind of stdin pipe, SIGTERMed. With --baseline, another build in
turns too. Writes the `## Shutdown` section of docs/benchmarks.md (unless --no-write).
Uses $MCP_SANDBOX_BIN, else the release build, else the debug build (target/<host triple>/).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import binary, cpu_model, write_section  # noqa: E402

SECTION = "## Shutdown"


def send(p: subprocess.Popen, msg: dict) -> None:
    p.stdin.write(json.dumps(msg).encode() + b"\n")
    p.stdin.flush()


def one_server(bin_path: str) -> float:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "ws").mkdir()
        (Path(d) / "state").mkdir()
        env = dict(os.environ, MCP_SANDBOX_WORKSPACE=f"{d}/ws", MCP_SANDBOX_STATE_DIR=f"{d}/state", RUST_LOG="error")
        p = subprocess.Popen([bin_path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, env=env)
        send(p, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}})
        p.stdout.readline()
        send(p, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        send(p, {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                 "params": {"name": "python_exec", "arguments": {"code": "1"}}})
        p.stdout.readline()
        time.sleep(0.3)
        t = time.perf_counter()
        p.send_signal(signal.SIGTERM)
        p.wait()
        return time.perf_counter() - t


def floor() -> float:
    p = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    time.sleep(0.05)
    t = time.perf_counter()
    p.send_signal(signal.SIGTERM)
    p.wait()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--baseline", help="another build, measured in turns (e.g. main's)")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    ours = binary()
    res: dict[str, list[float]] = {"floor": [], "ours": [], "baseline": []}
    loads = []
    for _ in range(a.n):
        res["floor"].append(floor())
        res["ours"].append(one_server(ours))
        if a.baseline:
            res["baseline"].append(one_server(a.baseline))
        loads.append(os.getloadavg()[0])

    def row(name: str, xs: list[float]) -> str:
        ms = [x * 1000 for x in xs]
        q = statistics.quantiles(ms, n=10)
        ratio = statistics.median(xs) / statistics.median(res["floor"])
        return f"| {name} | {len(ms)} | {statistics.median(ms):.1f} | {q[0]:.1f} – {q[-1]:.1f} | {ratio:.0f}× |"

    cpu = cpu_model()
    lines = [
        SECTION, "",
        f"`python3 tests/bench/shutdown.py --n {a.n}{' --baseline …' if a.baseline else ''}` — "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {platform.system()} {platform.release()}, "
        f"{os.cpu_count()} CPUs ({cpu}); load {min(loads):.1f}–{max(loads):.1f}; `{Path(ours).parent.name}` build.",
        "SIGTERM to reaped, after initialize and one `python_exec` (worker, snapshot, zygote live). "
        "Floor: `cat` on a stdin pipe, SIGTERMed, in the same turns.", "",
        "| process | n | median ms | p10 – p90 ms | vs floor |", "|---|---|---|---|---|",
        row("floor (`cat`)", res["floor"]),
        row("this build", res["ours"]),
    ]
    if a.baseline:
        lines.append(row(f"baseline (`{a.baseline}`)", res["baseline"]))
    text = "\n".join(lines) + "\n"
    print(text)
    if not a.no_write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
