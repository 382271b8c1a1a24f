"""Branching cells (issue 10): `python_exec parent=...` runs on the state right after an
earlier cell, from a copy-on-write fork snapshot; `python_history` shows the graph.
Every test drives the real binary through the official MCP client."""

import os
import signal
import time
from pathlib import Path

import anyio

from conftest import Harness, ToolFailed

MARK_CODE = "import ctypes; ctypes.CDLL(None).prctl(15, b{name!r}, 0, 0, 0)"


def comm_pids(name: str) -> list[int]:
    """Live (not zombie) processes whose name (comm) is `name`: the cell that set it, and
    every snapshot and worker forked from it since."""
    found = []
    for p in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            if Path(f"/proc/{p}/comm").read_text().strip() != name:
                continue
            if Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
        except OSError:
            continue
        found.append(p)
    return found


async def gone(name: str, timeout: float = 20) -> list[int]:
    """Wait until no process is called `name`; returns those left at the deadline."""
    deadline = time.monotonic() + timeout
    while comm_pids(name) and time.monotonic() < deadline:
        await anyio.sleep(0.05)
    return comm_pids(name)


def by_cell(history: dict) -> dict:
    return {c["cell"]: c for c in history["cells"]}


def test_branch_from_an_earlier_cell_and_the_graph(server: Harness):
    async def scenario(c):
        a = await c.ok("python_exec", code="x = 1")
        b = await c.ok("python_exec", code="x = 2")
        assert (a["cell"], a["parent"]) == ("c1", None)
        assert (b["cell"], b["parent"]) == ("c2", "c1")
        r = await c.ok("python_exec", code="print(x)", parent=a["cell"])
        assert r["stdout"]["text"] == "1\n" and r["parent"] == "c1"
        # The next cell without parent runs on the new head.
        n = await c.ok("python_exec", code="x")
        assert n["value"] == "1" and n["parent"] == r["cell"]
        r2 = await c.ok("python_exec", code="print(x)", parent=b["cell"])
        assert r2["stdout"]["text"] == "2\n" and r2["parent"] == "c2"
        h = await c.ok("python_history")
        cells = by_cell(h)
        assert {k: v["parent"] for k, v in cells.items()} == {
            "c1": None, "c2": "c1", "c3": "c1", "c4": "c3", "c5": "c2"}
        assert h["head"] == "c5" and cells["c5"]["head"] and not cells["c4"]["head"]
        assert cells["c1"]["snapshot"] == "held"
        text = (await c.call("python_history")).content[0].text
        assert "[c5, head] on c2" in text and "[c4] on c3" in text
        # The text header names the cell and its parent too.
        res = await c.call("python_exec", code="x", parent="c1")
        assert "cell c6 (on c1)" in res.content[0].text

    server.run(scenario)


def test_branching_restores_state_replay_could_not(server: Harness):
    """A random number drawn in cell a comes back exactly: the state is forked, not rebuilt."""

    async def scenario(c):
        a = await c.ok("python_exec", code="import random; r = random.random(); r")
        await c.ok("python_exec", code="r = None")
        back = await c.ok("python_exec", code="r", parent=a["cell"])
        assert back["value"] == a["value"] and back["value"] != "None"
        assert not back.get("replayed")
        # Open objects come along too: a generator half consumed, a class defined in a cell.
        await c.ok("python_exec", code="class P:\n    n = 5\ng = iter(range(10)); next(g); p = P()")
        await c.ok("python_exec", code="next(g); next(g); p.n = 0")
        back = await c.ok("python_exec", code="(next(g), p.n)", parent="c4")
        assert back["value"] == "(1, 5)"

    server.run(scenario)


def test_the_cap_evicts_and_an_evicted_cell_replays(server: Harness):
    server.env["MCP_SANDBOX_MAX_SNAPSHOTS"] = "2"

    async def scenario(c):
        await c.ok("python_exec", code="log = ['a']")
        for n in "bcd":
            await c.ok("python_exec", code=f"log.append({n!r})")
        # c1 and c2 were evicted (c3, c4 held).
        await c.ok("python_exec", code="1")  # c5: now c4, c5 held
        cells = by_cell(await c.ok("python_history"))
        held = sorted(k for k, v in cells.items() if v["snapshot"] == "held")
        assert held == ["c4", "c5"], cells
        assert "evicted" in cells["c2"]["note"]
        s = await c.ok("session_list")
        assert s["sessions"][0]["snapshots"] == 2
        # c2 has no snapshot and no held ancestor: a replay from scratch needs consent.
        msg = await c.err("python_exec", code="log", parent="c2")
        assert "replay=true" in msg and "c1, c2" in msg, msg
        assert (await c.ok("python_exec", code="log"))["value"] == "['a', 'b', 'c', 'd']", "nothing changed"
        res = await c.call("python_exec", code="log", parent="c2", replay=True)
        r = res.structured_content
        assert r["value"] == "['a', 'b']" and r["replayed"] == ["c1", "c2"], res.content[0].text
        assert "note: replayed c1, c2" in res.content[0].text
        # The replay took snapshots of c1, c2 again, then c7's evicted c1's (cap 2): c3
        # replays only itself, from c2's.
        res = await c.call("python_exec", code="log", parent="c3")
        r = res.structured_content
        assert r is not None, res.content[0].text
        assert r["value"] == "['a', 'b', 'c']" and r["replayed"] == ["c3"], r
        assert "note: replayed c3" in res.content[0].text
        h = by_cell(await c.ok("python_history"))
        assert h["c8"]["replayed"] == ["c3"] and h["c7"]["replayed"] == ["c1", "c2"]

    server.run(scenario)
