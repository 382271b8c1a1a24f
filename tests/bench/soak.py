#!/usr/bin/env python3
"""Soak benchmark (not part of the tests): many trivial `python_exec` calls and shell
`true` jobs through one server (MCP over stdio, the official SDK), with retention on, to
show that history stays bounded: latency p50/p99 per phase, server RSS at start and end
(and its peak, sampled), state-dir size, and start-up time (spawn -> initialized) with the
big history against an empty state dir.

    python3 tests/bench/soak.py [--bin target/<triple>/release/mcp-sandbox-repl]
        [--executes 100000] [--shell 20000] [--keep-jobs 10000] [--startups 7]
        [--client sdk|raw]

The issue's full run is 100,000 executes and 20,000 shell jobs; pass smaller numbers on a
busy machine (and say so next to the figures). Server flags can be given as their env
twins (e.g. MCP_SANDBOX_MAX_SNAPSHOTS=0); those set are printed with the command. Prints a
markdown section.
"""

from __future__ import annotations

import argparse
import json
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


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def server_pid(binary: str) -> int | None:
    me, best = os.getpid(), None
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            exe = os.readlink(f"/proc/{p}/exe")
        except OSError:
            continue
        if int(fields[1]) == me and os.path.samefile(exe, binary):
            best = max(best or 0, int(p))
    return best


def params(binary: str, ws: Path, state: Path, keep: int) -> StdioServerParameters:
    env = dict(
        os.environ,
        MCP_SANDBOX_WORKSPACE=str(ws),
        MCP_SANDBOX_STATE_DIR=str(state),
        MCP_SANDBOX_KEEP_JOBS=str(keep),
        RUST_LOG="error",
    )
    return StdioServerParameters(command=binary, args=[], env=env, cwd=str(ws))


async def soak(binary: str, ws: Path, state: Path, args, out: dict):
    async with stdio_client(params(binary, ws, state, args.keep_jobs), errlog=open(os.devnull, "w")) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            await s.call_tool("python_exec", {"code": "1"})  # the worker is up
            pid = server_pid(binary)
            out["rss_start"] = rss_kib(pid)
            peak = out["rss_start"]
            for phase, n, tool, call in (
                ("execute", args.executes, "python_exec", {"code": args.code}),
                ("shell", args.shell, "shell_run", {"command": "true"}),
            ):
                lat = []
                for i in range(n):
                    t = time.perf_counter()
                    res = await s.call_tool(tool, call)
                    lat.append(time.perf_counter() - t)
                    if res.is_error:
                        raise SystemExit(f"{tool} failed: {res.content}")
                    if i % 1000 == 0:
                        now = rss_kib(pid)
                        peak = max(peak, now)
                        out.setdefault("rss_series", []).append(now)
                        print(f"{phase} {i}/{n} rss {now} KiB", file=sys.stderr, flush=True)
                out[phase] = lat
            out["rss_end"] = rss_kib(pid)
            out["rss_peak"] = max(peak, out["rss_end"])
            listed = await s.call_tool("job_list", {"limit": 500})
            out["listed"] = len(listed.structured_content["jobs"])
            out["list_bytes"] = sum(len(getattr(c, "text", "")) for c in listed.content)
    out["state_bytes"] = dir_bytes(state)
    out["index_bytes"] = (state / "jobs" / "index.log").stat().st_size


class RawClient:
    """JSON-RPC lines over the server's stdio, nothing else: what the server takes to
    answer, without the SDK's per-call work (pydantic models, output-schema validation),
    which on this machine costs more than the server does for a trivial call."""

    def __init__(self, binary: str, env: dict, cwd: Path):
        self.proc = subprocess.Popen([binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, cwd=cwd)
        self.next_id = 0
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "soak", "version": "0"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, msg: dict):
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: dict) -> dict:
        self.next_id += 1
        rid = self.next_id
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit(f"the server closed its output during {method}")
            msg = json.loads(line)
            if msg.get("id") == rid and "method" not in msg:
                if "error" in msg:
                    raise SystemExit(f"{method} failed: {msg['error']}")
                return msg["result"]
            if "method" in msg and "id" in msg:  # a request of the server's (e.g. ping)
                self.send({"jsonrpc": "2.0", "id": msg["id"], "result": {}})

    def call_tool(self, name: str, arguments: dict) -> dict:
        return self.request("tools/call", {"name": name, "arguments": arguments})

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def soak_raw(binary: str, ws: Path, state: Path, args, out: dict):
    p = params(binary, ws, state, args.keep_jobs)
    c = RawClient(binary, p.env, ws)
    c.call_tool("python_exec", {"code": "1"})  # the worker is up
    pid = c.proc.pid
    out["rss_start"] = rss_kib(pid)
    peak = out["rss_start"]
    echo = None
    if args.echo:
        # The no-op rmcp echo server under the same raw client, called right after each of
        # ours: the same machine, the same moment, so its tail is the machine's.
        echo = RawClient(args.echo, dict(p.env), ws)
        echo.call_tool("noop", {})
        out["echo"] = []
    out["at"] = []
    for phase, n, tool, call in (
        ("execute", args.executes, "python_exec", {"code": args.code}),
        ("shell", args.shell, "shell_run", {"command": "true"}),
    ):
        lat = []
        for i in range(n):
            if echo is not None and phase == "execute":
                t = time.perf_counter()
                echo.call_tool("noop", {})
                out["echo"].append(time.perf_counter() - t)
            t = time.perf_counter()
            if phase == "execute":
                out["at"].append(t)
            res = c.call_tool(tool, call)
            if res.get("isError"):
                raise SystemExit(f"{tool} failed: {res.get('content')}")
            job = res.get("structuredContent") or {}
            if job.get("status") in ("running", "awaiting_input"):
                # Not done within the call's wait window: follow it to its end (the
                # latency counts the whole wait), so the next call finds the session free.
                late = {"call": i, "job_id": job.get("job_id")}
                deadline = time.perf_counter() + 120
                while job.get("status") in ("running", "awaiting_input"):
                    if time.perf_counter() > deadline:
                        raise SystemExit(f"{tool} call {i}: {job.get('job_id')} still running after 120 s")
                    job = c.call_tool("job_wait", {"job_id": job["job_id"], "timeout_seconds": 30,
                                                   "until_done": True})["structuredContent"]
                late["took_s"] = round(time.perf_counter() - t, 2)
                late["status"] = job.get("status")
                out.setdefault("late", []).append((phase, late))
                print(f"{phase} {i}: not done within the wait window: {late}", file=sys.stderr, flush=True)
            lat.append(time.perf_counter() - t)
            if i % 1000 == 0:
                now = rss_kib(pid)
                peak = max(peak, now)
                out.setdefault("rss_series", []).append(now)
                print(f"{phase} {i}/{n} rss {now} KiB", file=sys.stderr, flush=True)
        out[phase] = lat
    out["rss_end"] = rss_kib(pid)
    out["rss_peak"] = max(peak, out["rss_end"])
    listed = c.call_tool("job_list", {"limit": 500})
    out["listed"] = len(listed["structuredContent"]["jobs"])
    out["list_bytes"] = sum(len(x.get("text", "")) for x in listed["content"])
    c.close()
    if echo is not None:
        echo.close()
    out["state_bytes"] = dir_bytes(state)
    out["index_bytes"] = (state / "jobs" / "index.log").stat().st_size


async def startup(binary: str, ws: Path, state: Path, keep: int) -> tuple[float, float]:
    """(spawn -> initialized, spawn -> the first `job_list` answered): the second shows
    what a client waits for when its first call needs the job table."""
    t = time.perf_counter()
    async with stdio_client(params(binary, ws, state, keep), errlog=open(os.devnull, "w")) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            ready = time.perf_counter() - t
            await s.call_tool("job_list", {"limit": 1})
            return ready, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(build_dir("release") / "mcp-sandbox-repl"))
    ap.add_argument("--executes", type=int, default=100_000)
    ap.add_argument("--shell", type=int, default=20_000)
    ap.add_argument("--keep-jobs", type=int, default=10_000)
    ap.add_argument("--startups", type=int, default=7)
    ap.add_argument("--code", default="1", help="the cell each execute runs")
    ap.add_argument("--client", choices=("sdk", "raw"), default="sdk",
                    help="drive the calls through the MCP SDK (what an SDK client sees) or as "
                         "raw JSON-RPC lines (what the server takes); start-up always uses the SDK")
    ap.add_argument("--echo", nargs="?", const="", default=None,
                    help="(raw client only) call the no-op rmcp echo server (default: "
                         "examples/noop_server beside --bin) right before each execute, as the "
                         "same-run baseline of the machine's own tail")
    ap.add_argument("--dump", default=None,
                    help="write each execute's start time and latency (and the echo's) as JSON "
                         "lines to this file, to line the slow calls up with what the server did")
    args = ap.parse_args()
    args.bin = os.path.abspath(args.bin)
    if args.echo == "":
        args.echo = str(Path(args.bin).parent / "examples" / "noop_server")
    if args.echo is not None and args.client != "raw":
        raise SystemExit("--echo needs --client raw")
    if args.bin == str(build_dir("release") / "mcp-sandbox-repl"):
        subprocess.run(["cargo", "build", "--release", "--quiet"] + (["--example", "noop_server"] if args.echo else []),
                       cwd=REPO, check=True)
    with tempfile.TemporaryDirectory(prefix="msr-soak-") as tmp:
        root = Path(tmp)
        ws, state, empty = root / "ws", root / "state", root / "empty"
        for d in (ws, state, empty):
            d.mkdir()
        out: dict = {"load_start": os.getloadavg()[0]}
        t0 = time.perf_counter()
        if args.client == "raw":
            soak_raw(args.bin, ws, state, args, out)
        else:
            anyio.run(soak, args.bin, ws, state, args, out)
        took = time.perf_counter() - t0
        out["load_end"] = os.getloadavg()[0]
        big, fresh, jobs_only = [], [], []
        graphs = sorted((state / "repl").glob("*/graph.jsonl"))
        out["graph_bytes"] = sum(g.stat().st_size for g in graphs)
        for _ in range(args.startups):  # alternate, so machine noise hits all
            big.append(anyio.run(startup, args.bin, ws, state, args.keep_jobs))
            fresh.append(anyio.run(startup, args.bin, ws, empty, args.keep_jobs))
            # The same history without the sessions' cell graphs: the job table's share.
            for g in graphs:
                g.rename(g.with_suffix(".aside"))
            try:
                jobs_only.append(anyio.run(startup, args.bin, ws, state, args.keep_jobs))
            finally:
                for g in graphs:
                    g.with_suffix(".aside").rename(g)
    ready_big, ready_fresh = [b[0] for b in big], [f[0] for f in fresh]
    first_big, first_fresh = [b[1] for b in big], [f[1] for f in fresh]
    ready_jobs, first_jobs = [j[0] for j in jobs_only], [j[1] for j in jobs_only]
    ms = lambda v: f"{v * 1000:.2f}"
    extra = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                     if k.startswith("MCP_SANDBOX_") and k != "MCP_SANDBOX_KEEP_JOBS")
    print(f"`{extra + ' ' if extra else ''}python3 tests/bench/soak.py --executes {args.executes} --shell {args.shell} "
          f"--keep-jobs {args.keep_jobs} --client {args.client}"
          f"{'' if args.code == '1' else ' --code ' + repr(args.code)}{' --echo' if args.echo else ''}` — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"{os.uname().sysname} {os.uname().release}, {os.cpu_count()} CPUs; {took:.0f} s in all; load average (1 min) "
          f"{out['load_start']:.2f} at start, {out['load_end']:.2f} at the end of the calls.\n")
    print("| phase | calls | p50 (ms) | p99 (ms) |\n| --- | ---: | ---: | ---: |")
    for phase in ("execute", "shell"):
        lat = out[phase]
        if lat:
            print(f"| `{'python_exec ' + args.code if phase == 'execute' else 'shell_run true'}` | {len(lat)} | "
                  f"{ms(statistics.median(lat))} | {ms(pct(lat, 99))} |")
    if out.get("echo"):
        lat = out["echo"]
        print(f"| no-op rmcp echo `noop`, called before each execute | {len(lat)} | "
              f"{ms(statistics.median(lat))} | {ms(pct(lat, 99))} |")
    print()
    if args.dump:
        with open(args.dump, "w") as f:
            for i, (at, lat) in enumerate(zip(out["at"], out["execute"])):
                row = {"i": i, "at": at - out["at"][0], "ms": lat * 1000}
                if out.get("echo"):
                    row["echo_ms"] = out["echo"][i] * 1000
                f.write(json.dumps(row) + "\n")
    print(f"- server RSS: {out['rss_start'] / 1024:.1f} MiB after the first call, "
          f"{out['rss_end'] / 1024:.1f} MiB at the end (peak sampled {out['rss_peak'] / 1024:.1f} MiB)")
    print(f"- state dir: {out['state_bytes'] / 1e6:.2f} MB on disk at the end "
          f"(index.log {out['index_bytes'] / 1e6:.2f} MB); job_list limit=500 listed {out['listed']} "
          f"jobs in {out['list_bytes']} bytes of text")
    med = statistics.median
    print(f"- start-up (spawn -> initialized), median of {args.startups}: "
          f"{ms(med(ready_big))} ms with the history, {ms(med(ready_fresh))} ms empty "
          f"({med(ready_big) / med(ready_fresh):.2f}x)")
    print(f"- spawn -> first `job_list` answered, median of {args.startups}: "
          f"{ms(med(first_big))} ms with the history, {ms(med(first_fresh))} ms empty "
          f"({med(first_big) / med(first_fresh):.2f}x)")
    print(f"- the same history without the sessions' cell graphs (`repl/*/graph.jsonl`, "
          f"{out['graph_bytes'] / 1e6:.2f} MB), median of {args.startups}: initialized in "
          f"{ms(med(ready_jobs))} ms ({med(ready_jobs) / med(ready_fresh):.2f}x empty), first "
          f"`job_list` in {ms(med(first_jobs))} ms ({med(first_jobs) / med(first_fresh):.2f}x)")
    for phase, late in out.get("late", []):
        print(f"- a `{phase}` call not done within its 3 s wait window (followed with job_wait): {late}")
    series = ", ".join(f"{v / 1024:.1f}" for v in out.get("rss_series", []))
    print(f"- RSS every 1,000 calls (MiB): {series}")


if __name__ == "__main__":
    main()
