#!/usr/bin/env python3
"""Branching benchmark through the official MCP Python SDK (stdio), not part of the tests.

Measures, for a session holding a 1 GiB bytearray (every page touched):
- branch: `python_exec code="1" parent=<the cell that made it>` (fork from its snapshot);
- replay of the same path: the same call with `replay=true` on a server with snapshots
  off (a fresh worker re-runs the cell that allocates and fills the 1 GiB);
- a trivial `python_exec code="1"` on the head, for scale;
- memory of the session with ten snapshots that each changed a few variables, against
  the same session with snapshots off: the cgroup's figure when the session has a memory
  cgroup, and the sum of PSS of its processes (which splits shared pages fairly);
- back-to-back trivial cells with snapshots on and off (a snapshot is a fork after each cell).
Prints a markdown section with n, median, spread (min–max) and the load average.

    python3 tests/bench/branching.py [--bin target/<triple>/debug/mcp-sandbox-repl] [--n 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30
BIG = "buf = bytearray(1 << 30)\nbuf[::4096] = b'x' * (len(buf) // 4096)\nlen(buf)"
MARK = "import ctypes; ctypes.CDLL(None).prctl(15, b{name!r}, 0, 0, 0)"


def ms(s: float) -> str:
    return f"{s * 1000:.1f} ms"


def summary(values: list[float]) -> str:
    return f"n={len(values)}, median {ms(statistics.median(values))} ({ms(min(values))}–{ms(max(values))})"


def comm_pids(name: str) -> list[int]:
    out = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{p}/comm").read_text().strip() == name and \
                    Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(int(p))
        except OSError:
            pass
    return out


def pss(pids: list[int]) -> int:
    total = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def cgroup_memory(pid: int) -> int | None:
    """The memory figure of the cgroup `pid` is in (v2 memory.current or v1 usage)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            f = Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.current"
        elif "memory" in controllers.split(","):
            f = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.usage_in_bytes"
        else:
            continue
        try:
            return int(f.read_text())
        except OSError:
            continue
    return None


class Server:
    def __init__(self, binary: str, root: Path, snapshots: int):
        ws, state = root / "ws", root / "state"
        ws.mkdir(parents=True, exist_ok=True)
        state.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, MCP_SANDBOX_WORKSPACE=str(ws), MCP_SANDBOX_STATE_DIR=str(state),
                   MCP_SANDBOX_MAX_SNAPSHOTS=str(snapshots), RUST_LOG="error")
        self.params = StdioServerParameters(command=binary, args=[], env=env, cwd=str(ws))


async def call(s: ClientSession, **args) -> tuple[float, dict]:
    args.setdefault("wait_seconds", 60)
    t = time.perf_counter()
    res = await s.call_tool("python_exec", args)
    took = time.perf_counter() - t
    assert not res.is_error, res.content[0].text
    assert res.structured_content["status"] == "completed", res.content[0].text
    return took, res.structured_content


async def with_server(binary: str, snapshots: int, body):
    with tempfile.TemporaryDirectory() as d:
        srv = Server(binary, Path(d), snapshots)
        async with stdio_client(srv.params, errlog=open(os.devnull, "w")) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                return await body(s)


FORK = ("import os, time\nt = time.perf_counter(); pid = os.fork()\nif pid == 0: os._exit(0)\n"
        "os.waitpid(pid, 0); time.perf_counter() - t")


async def branch_latency(s: ClientSession, n: int) -> dict:
    out = {"small": [], "branch": [], "head": [], "fork": []}
    _, a = await call(s, code="x = 0", session="small")
    await call(s, code="x = 1", session="small")
    for _ in range(n):
        out["small"].append((await call(s, code="1", parent=a["cell"], session="small"))[0])
        await anyio.sleep(0.2)
    _, a = await call(s, code=BIG, wait_seconds=60)
    await call(s, code="x = 1")
    for _ in range(n):
        await anyio.sleep(1)  # an agent's pause: the last cell's snapshot is taken by now
        t, r = await call(s, code="1", parent=a["cell"])
        assert not r.get("replayed"), r
        out["branch"].append(t)
        await anyio.sleep(1)
        t, _ = await call(s, code="1")
        out["head"].append(t)
    for _ in range(3):
        await anyio.sleep(1)
        out["fork"].append(float((await call(s, code=FORK))[1]["value"]))
    return out


async def replay_latency(s: ClientSession, n: int) -> list[float]:
    _, a = await call(s, code=BIG, wait_seconds=60)
    await call(s, code="x = 1")
    times = []
    for _ in range(n):
        t, r = await call(s, code="1", parent=a["cell"], replay=True, wait_seconds=60)
        assert r["replayed"] == [a["cell"]], r
        times.append(t)
    return times


def memory_body(tag: str):
    async def body(s: ClientSession) -> dict:
        await call(s, code=MARK.format(name=tag))
        await call(s, code=BIG, wait_seconds=60)
        for i in range(10):
            await call(s, code=f"v{i} = list(range(1000)); w = {i}")
        await s.call_tool("python_history", {})  # the last snapshot is in
        await anyio.sleep(1)
        pids = comm_pids(tag)
        info = (await s.call_tool("session_list", {})).structured_content["sessions"][0]
        return {"pids": len(pids), "pss": pss(pids), "cgroup": cgroup_memory(info["worker_pid"]),
                "snapshots": info["snapshots"]}
    return body


async def trivial(s: ClientSession, n: int) -> list[float]:
    await call(s, code="1")
    return [(await call(s, code="x = 1"))[0] for _ in range(n)]


async def main(binary: str, n: int) -> None:
    load0 = os.getloadavg()
    br = await with_server(binary, 16, lambda s: branch_latency(s, n))
    rp = await with_server(binary, 0, lambda s: replay_latency(s, max(3, n // 2)))
    tag = f"brbench{os.getpid() % 10000}"
    mem_on = await with_server(binary, 16, memory_body(tag + "a"))
    mem_off = await with_server(binary, 0, memory_body(tag + "b"))
    triv_on = await with_server(binary, 8, lambda s: trivial(s, 100))
    triv_off = await with_server(binary, 0, lambda s: trivial(s, 100))
    load1 = os.getloadavg()

    def mib(b):
        return "n/a" if b is None else f"{b / (1 << 20):.0f} MiB"

    def extra(on, off):
        if on is None or off is None:
            return "n/a"
        return f"+{(on - off) / off * 100:.1f}%"

    print(f"### Branching ({time.strftime('%Y-%m-%d')}, `{Path(binary).name}`, load average "
          f"{load0[0]:.1f} at start, {load1[0]:.1f} at end, {os.cpu_count()} cores)\n")
    print("| What (through MCP, session holding a 1 GiB bytearray, every page touched) | Result |")
    print("|---|---|")
    print(f"| branch in a small session (a few variables) | {summary(br['small'])} |")
    print(f"| branch: `python_exec code=\"1\" parent=<that cell>` (fork from its snapshot) | {summary(br['branch'])} |")
    print(f"| replay of the same path: same call, `replay=true`, snapshots off | {summary(rp)} |")
    print(f"| the same trivial cell on the head, no branch (scale) | {summary(br['head'])} |")
    print(f"| one `os.fork()` of that worker, timed inside it (what a snapshot costs) | {summary(br['fork'])} |")
    print(f"| memory, 10 snapshots, each cell changing a few variables — cgroup | {mib(mem_on['cgroup'])} vs {mib(mem_off['cgroup'])} without snapshots ({extra(mem_on['cgroup'], mem_off['cgroup'])}) |")
    print(f"| memory, same — Σ PSS of the session's processes | {mib(mem_on['pss'])} over {mem_on['pids']} processes vs {mib(mem_off['pss'])} over {mem_off['pids']} ({extra(mem_on['pss'], mem_off['pss'])}) |")
    print(f"| back-to-back trivial cells, snapshots on (cap 8) | {summary(triv_on)} |")
    print(f"| back-to-back trivial cells, snapshots off | {summary(triv_off)} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(REPO / "target/<triple>/debug/mcp-sandbox-repl"))
    ap.add_argument("--n", type=int, default=10)
    args = ap.parse_args()
    anyio.run(main, args.bin, args.n)
