"""Branching cells (issue 10): `python_exec parent=...` runs on the state right after an
earlier cell, from a copy-on-write fork snapshot; `python_history` shows the graph.
Every test drives the real binary through the official MCP client."""

import os
import signal
import time
from pathlib import Path

import anyio
import pytest

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


async def gone(name: str, timeout: float = 60) -> list[int]:
    """Wait until no process is called `name`; returns those left at the deadline (which
    only guards a process that is never killed: a loaded machine may be slow to)."""
    deadline = time.monotonic() + timeout
    while comm_pids(name) and time.monotonic() < deadline:
        await anyio.sleep(0.05)
    return comm_pids(name)


def by_cell(history: dict) -> dict:
    return {c["cell"]: c for c in history["cells"]}


@pytest.fixture(autouse=True)
def snapshot_every_cell(server: Harness):
    """These tests are about what a snapshot holds and how branches, caps and lifetimes
    treat it, with cells run back to back: they take every snapshot right after its answer
    (`--snapshot-idle-ms 0`). The default, snapshots only in idle time, is tested by
    the two `..._default_settings` tests below, which drop this."""
    server.env["MCP_SANDBOX_SNAPSHOT_IDLE_MS"] = "0"


async def until_held(c, cell: str, timeout: float = 60) -> dict:
    """python_history until `cell` is held (its snapshot was taken in idle time). A
    history call does not count as a call that skips the snapshot."""
    deadline = time.monotonic() + timeout
    while True:
        cells = by_cell(await c.ok("python_history"))
        if cells[cell]["snapshot"] == "held" or time.monotonic() > deadline:
            return cells
        await anyio.sleep(0.05)


def test_a_cell_that_had_idle_time_is_branched_by_fork_default_settings(server: Harness):
    """Default settings: the snapshot is taken once the session is idle after the answer;
    branching back to that cell forks it (the same random number, nothing replayed)."""
    del server.env["MCP_SANDBOX_SNAPSHOT_IDLE_MS"]

    async def scenario(c):
        a = await c.ok("python_exec", code="import random; r = random.random(); r")
        cells = await until_held(c, a["cell"])
        assert cells[a["cell"]]["snapshot"] == "held", cells
        await c.ok("python_exec", code="r = None")
        back = await c.ok("python_exec", code="r", parent=a["cell"])
        assert back["value"] == a["value"] and not back.get("replayed"), back

    server.run(scenario)


def test_a_back_to_back_cell_is_branchable_by_replay_said_in_words_default_settings(server: Harness):
    """A call that arrives before the session was idle long enough skips the previous
    cell's snapshot (it never waits for a fork); history says so in words, and branching
    to that cell replays. Back to back made certain: the idle time needed is 10 minutes."""
    server.env["MCP_SANDBOX_SNAPSHOT_IDLE_MS"] = "600000"

    async def scenario(c):
        a = await c.ok("python_exec", code="x = 1")
        await c.ok("python_exec", code="x = 2")
        cells = by_cell(await c.ok("python_history"))
        assert cells["c1"]["snapshot"] == "replay", cells
        assert "not taken: the next call came within 600000 ms" in cells["c1"]["note"], cells
        assert "branching from it replays" in cells["c1"]["note"], cells
        # The last cell's snapshot is still to come (history is no call that skips it).
        assert cells["c2"]["snapshot"] == "replay" and "not taken yet" in cells["c2"]["note"], cells
        text = (await c.call("python_history")).content[0].text
        assert "not taken: the next call came within" in text, text
        # No held ancestor: the replay needs consent, then rebuilds c1 and says so.
        msg = await c.err("python_exec", code="x", parent=a["cell"])
        assert "replay=true" in msg, msg
        res = await c.call("python_exec", code="x", parent=a["cell"], replay=True)
        r = res.structured_content
        assert (r["value"], r["replayed"]) == ("1", ["c1"]), r
        assert "note: replayed c1" in res.content[0].text

    server.run(scenario)


def test_branch_from_an_earlier_cell_and_the_graph(server: Harness):
    async def scenario(c):
        a = await c.ok("python_exec", code="x = 1")
        b = await c.ok("python_exec", code="x = 2")
        assert (a["cell"], a["parent"]) == ("c1", None)
        assert (b["cell"], b["parent"]) == ("c2", "c1")
        r = await c.ok("python_exec", code="print(x)", parent=a["cell"])
        assert r["stdout"]["text"] == "1\n" and r["parent"] == "c1"
        # The next cell without parent runs on the new head.
        n = await c.ok("python_exec", code="print('on the branch', x); x")
        assert n["value"] == "1" and n["parent"] == r["cell"]
        # Output of later cells of a branched head reaches the server too (fds 1/2 are
        # re-pointed at each cell: at this worker's pipes, not its snapshot's).
        assert n["stdout"]["text"] == "on the branch 1\n", n
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


def test_a_snapshot_is_the_state_right_after_its_cell_whatever_comes_next(server: Harness):
    """The worker forks a cell's snapshot a moment after the answer, or before the next
    request if that comes first: a variable set right behind the cell, or the next cell,
    never leaks into the snapshot, and a branch still finds it held."""

    async def scenario(c):
        a = await c.ok("python_exec", code="x = 1")
        await c.ok("python_vars", action="set", name="x", value=5)
        b = await c.ok("python_exec", code="x += 1; x")
        assert b["value"] == "6"
        await c.ok("python_exec", code="x = 0")
        back = await c.ok("python_exec", code="x", parent=a["cell"])
        assert back["value"] == "1" and not back.get("replayed"), back
        back = await c.ok("python_exec", code="x", parent=b["cell"])
        assert back["value"] == "6" and not back.get("replayed"), back
        cells = by_cell(await c.ok("python_history"))
        assert cells[a["cell"]]["snapshot"] == "held" and cells[b["cell"]]["snapshot"] == "held"

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


def test_the_memory_budget_evicts_and_an_evicted_cell_replays(server: Harness):
    """Each cell keeps ~40 MB of new data: the head frees the previous cell's, which its
    snapshot still holds privately, so the session's cgroup figure passes a 64 MiB budget
    long before the count cap (8): older snapshots are evicted, with a note saying why."""
    server.env["MCP_SANDBOX_SNAPSHOT_MEMORY"] = "64MiB"
    why = "evicted: session memory over the snapshot budget"

    async def scenario(c):
        await c.ok("python_exec", code="log = []")  # c1
        for n in range(2, 7):  # c2 .. c6
            await c.ok("python_exec", code=f"x = bytes([{n}]) * (40 << 20); log.append({n})")
        cells = by_cell(await c.ok("python_history"))
        held = sorted(k for k, v in cells.items() if v["snapshot"] == "held")
        assert "c6" in held, f"the head's own snapshot is never evicted: {cells}"
        assert len(held) < 6, f"fewer held than cells (count cap 8): {held}"
        # After c3, the head holds c3's data and c2's snapshot c2's: over 64 MiB.
        assert cells["c2"]["snapshot"] == "replay" and cells["c2"]["note"] == why, cells["c2"]
        assert all(why in (cells[k].get("note") or "") for k in cells if k not in held), cells
        s = await c.ok("session_list")
        assert s["sessions"][0]["snapshots"] == len(held)
        # Branching to an evicted cell replays (from c1's snapshot if still held, else
        # from the start: replay=true consents to that) and says so.
        res = await c.call(
            "python_exec", code="(log, x[0], len(x))", parent="c2", replay=True, wait_seconds=60
        )
        r = res.structured_content
        assert r is not None, res.content[0].text
        assert r.get("value") == f"([2], 2, {40 << 20})", r
        assert r["replayed"] and r["replayed"][-1] == "c2", r
        assert "note: replayed" in res.content[0].text and "c2" in res.content[0].text
        # The head still works, and later cells keep to the budget too.
        await c.ok("python_exec", code="x = bytes([9]) * (40 << 20)")
        cells = by_cell(await c.ok("python_history"))
        assert sum(v["snapshot"] == "held" for v in cells.values()) < len(cells) - 2, cells

    server.run(scenario)


def test_bad_parents_are_refused_with_usable_cells_and_change_nothing(server: Harness):
    server.env["MCP_SANDBOX_MAX_SNAPSHOTS"] = "1"

    async def scenario(c):
        await c.ok("python_exec", code="x = 1")  # c1
        bad = await c.py("x = 2\n1 / 0")  # c2: raised; its snapshot holds x == 2
        assert bad["cell"] == "c2" and bad["exception"]["ename"] == "ZeroDivisionError"
        # A failed cell's snapshot is usable while it is held.
        assert (await c.ok("python_exec", code="x", parent="c2"))["value"] == "2"  # c3 (evicts c2)
        await c.ok("python_exec", code="x = 4")  # c4
        before = await c.ok("python_history")
        for parent, words in [
            ("c99", "there is no cell c99"),
            ("c2", "c2 raised an exception and has no snapshot"),
        ]:
            msg = await c.err("python_exec", code="x = 'changed'", parent=parent)
            assert words in msg and "cells you can use: c4 (head)" in msg, msg
        msg = await c.err("python_exec", code="x = 'changed'", parent="first")
        assert "not a cell id" in msg
        # Cells belong to their session: another session's id is named as such.
        for _ in range(6):
            await c.ok("python_exec", code="y = 1", session="other")
        msg = await c.err("python_exec", code="x = 'changed'", parent="c6")
        assert "no cell c6" in msg and "other" in msg, msg
        # The worker died in c5 (of session default): there is nothing to branch from.
        dead = await c.py("import os; os._exit(3)")
        assert dead["status"] == "failed" and dead["cell"] == "c5"
        msg = await c.err("python_exec", code="1", parent="c5")
        assert "the worker died in c5" in msg, msg
        # Nothing changed: the graph is the same but for c5, and no job ran the code.
        after = await c.ok("python_history")
        assert after["cells"][:4] == before["cells"][:4] or [
            (a["cell"], a["parent"]) for a in after["cells"][:4]] == [(b["cell"], b["parent"]) for b in before["cells"][:4]]
        jobs = await c.ok("job_list")
        assert not any("changed" in (j.get("label") or j.get("command") or "") for j in jobs["jobs"]), jobs

    server.run(scenario)


def test_interrupt_input_images_and_crash_on_a_branched_head(server: Harness):
    async def scenario(c):
        await c.ok("python_exec", code="x = 1")  # c1
        await c.ok("python_exec", code="x = 2")  # c2
        # Interrupt reaches the branched head's main thread; its state stays.
        job = await c.py("import time\nwhile True: time.sleep(0.05)", parent="c1", wait_seconds=0.5)
        assert job["status"] == "running" and job["parent"] == "c1"
        await c.ok("python_interrupt")
        done = (await c.call("job_wait", job_id=job["job_id"], timeout_seconds=30)).structured_content
        assert done["status"] == "failed" and done["exception"]["ename"] == "KeyboardInterrupt", done
        assert (await c.ok("python_exec", code="x"))["value"] == "1"
        # input() is bridged on a branched head.
        job = await c.py("name = input('who? ')", parent="c2", wait_seconds=60)  # returns at the prompt
        assert job["status"] == "awaiting_input" and job["prompt"] == "who? ", job
        await c.ok("job_input", job_id=job["job_id"], text="ann")
        await c.finish(await c.ok("job_wait", job_id=job["job_id"], timeout_seconds=30))
        assert (await c.ok("python_exec", code="(x, name)"))["value"] == "(2, 'ann')"
        # Images come back as image content.
        png = (
            "import base64\nclass Img:\n    def _repr_png_(self):\n"
            "        return base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
            "+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==')\nImg()"
        )
        res = await c.call("python_exec", code=png, parent="c1")
        assert [b.type for b in res.content].count("image") == 1, res.content
        # A crash of a branched head: the cell says how, the next cell has lost state,
        # and the other session is untouched.
        await c.ok("python_exec", code="keep = 'me'", session="side")
        crash = await c.py("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", parent="c1")
        assert crash["status"] == "failed" and "SIGSEGV" in crash["message"], crash
        nxt = await c.ok("python_exec", code="'x' in dir()")
        assert (nxt["value"], nxt.get("state_lost"), nxt["parent"]) == ("False", True, None), nxt
        assert (await c.ok("python_exec", code="keep", session="side"))["value"] == "'me'"
        # The crashed head's process tree (and its snapshots) went with it: c1 replays.
        msg = await c.err("python_exec", code="x", parent="c1")
        assert "replay=true" in msg, msg
        r = await c.ok("python_exec", code="x", parent="c1", replay=True)
        assert (r["value"], r["replayed"]) == ("1", ["c1"])

    server.run(scenario)


def test_snapshots_die_with_restart_close_and_the_server(server: Harness):
    tag = f"br{os.getpid() % 100000}"

    async def mark_and_branch(c, session, name):
        await c.ok("python_exec", code=MARK_CODE.format(name=name), session=session)  # c1
        await c.ok("python_exec", code="x = 1", session=session)  # c2
        await c.ok("python_exec", code="x", parent="c1", session=session)  # c3, forked
        h = await c.ok("python_history", session=session)
        assert [e["snapshot"] for e in h["cells"]] == ["held"] * 3, h
        # Snapshots of c1, c2, c3 and the forked head; the old head is killed, and may take
        # a moment to go on a loaded machine (the deadline only guards a hang).
        deadline = time.monotonic() + 60
        while len(pids := comm_pids(name)) > 4 and time.monotonic() < deadline:
            await anyio.sleep(0.05)
        assert len(pids) == 4, pids
        return pids

    async def scenario(c):
        await mark_and_branch(c, "r", tag + "r")
        await c.ok("session_restart", session="r")
        assert not await gone(tag + "r"), "snapshots outlived session_restart"
        assert (await c.ok("python_history", session="r"))["cells"] == []
        await mark_and_branch(c, "k", tag + "k")
        await c.ok("session_close", session="k")
        assert not await gone(tag + "k"), "snapshots outlived session_close"
        # A session started again under the name has no graph.
        await c.ok("python_exec", code="1", session="k")
        assert [e["cell"] for e in (await c.ok("python_history", session="k"))["cells"]] == ["c1"]
        await mark_and_branch(c, "s", tag + "s")
        os.kill(c.server_pid, signal.SIGKILL)

    try:
        server.run(scenario)
    except Exception:
        pass  # the connection broke: the server was killed on purpose
    assert not anyio.run(gone, tag + "s"), "snapshots outlived the server"


def test_graph_survives_a_server_restart_and_replays_only_when_asked(server: Harness):
    async def first(c):
        await c.ok("python_exec", code="import random; r = random.random()")
        await c.ok("python_exec", code="x = 7")
        await c.ok("python_exec", code="y = 1", session="gone")
        await c.ok("session_close", session="gone")

    async def second(c):
        await c.ok("python_exec", code="1", session="gone")
        assert len((await c.ok("python_history", session="gone"))["cells"]) == 1
        h = await c.ok("python_history")
        assert [(e["cell"], e["parent"], e["snapshot"]) for e in h["cells"]] == [
            ("c1", None, "replay"), ("c2", "c1", "replay")]
        assert "server restarted" in h["cells"][0]["note"] and h["head"] is None
        msg = await c.err("python_exec", code="x", parent="c2")
        assert "re-running c1, c2" in msg and 'parent="c2" and replay=true' in msg, msg
        fresh = await c.ok("python_exec", code="'x' in dir()")
        assert fresh["value"] == "False" and fresh["cell"] == "c3" and fresh["parent"] is None
        r = await c.ok("python_exec", code="x", parent="c2", replay=True)
        assert (r["value"], r["replayed"], r["parent"]) == ("7", ["c1", "c2"], "c2")

    server.run(first)
    server.run(second)


def zombies_named(name: str, server: Harness) -> list[int]:
    """Zombies whose name (comm) is `name`, but the spawned worker (the server's child,
    kept unreaped on purpose)."""
    out = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{p}/comm").read_text().strip() != name:
                continue
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) != server.last_server_pid:
            out.append(int(p))
    return out


def process_tree(name: str) -> list[str]:
    """The processes named `name`, for a failure message: a live worker has several
    threads, a snapshot one."""
    out = []
    for p in sorted(map(int, filter(str.isdigit, os.listdir("/proc")))):
        try:
            if Path(f"/proc/{p}/comm").read_text().strip() != name:
                continue
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            status = Path(f"/proc/{p}/status").read_text().splitlines()
        except OSError:
            continue
        threads = next((line.split()[1] for line in status if line.startswith("Threads:")), "?")
        out.append(f"{p} ppid {fields[1]} state {fields[0]} threads {threads}")
    return out


async def no_zombies_left(name: str, server: Harness) -> None:
    """Wait (up to 60 s, twelve reap periods: a loaded machine runs timers late; the
    deadline only guards zombies that are never reaped) until no zombie named `name` is
    left."""
    deadline = time.monotonic() + 60
    while zombies_named(name, server) and time.monotonic() < deadline:
        await anyio.sleep(0.2)
    left = zombies_named(name, server)
    assert not left, (left, process_tree(name), server.stderr_log()[-6000:])


def test_replaced_heads_are_reaped_by_their_snapshot(server: Harness):
    """Each branch kills the old head; its snapshot parent reaps it a few seconds later, so
    zombies do not pile up against the session's process cap."""
    name = f"brz{os.getpid() % 100000}"
    server.env["RUST_LOG"] = "mcp_sandbox_repl=debug"

    async def scenario(c):
        await c.ok("python_exec", code=MARK_CODE.format(name=name))  # c1
        for _ in range(4):
            await c.ok("python_exec", code="1", parent="c1")
        await no_zombies_left(name, server)

    server.run(scenario)


def test_an_idle_head_reaps_the_snapshots_the_server_dropped(server: Harness):
    """With a cap of 2, the third cell's snapshot evicts the first, which exits; the head
    that forked it reaps it while it sits idle, not only when its next cell ends."""
    name = f"bri{os.getpid() % 100000}"
    server.env["RUST_LOG"] = "mcp_sandbox_repl=debug"

    async def scenario(c):
        await c.ok("python_exec", code=MARK_CODE.format(name=name))  # c1
        await c.ok("python_exec", code="2")
        await c.ok("python_exec", code="3")
        h = await c.ok("python_history")
        assert "evicted" in (h["cells"][0].get("note") or ""), h
        await no_zombies_left(name, server)

    server.run(scenario, "--max-snapshots", "2")


def test_a_dead_snapshot_falls_back_to_replay_and_the_session_goes_on(server: Harness):
    """A snapshot killed from outside (as the memory limit may) is forgotten: branching
    from its cell asks for replay; the head and the other snapshots keep working."""
    tag = f"brd{os.getpid() % 100000}"

    async def scenario(c):
        await c.ok("python_exec", code=MARK_CODE.format(name=tag + "a") + "; x = 1")  # c1
        await c.ok("python_exec", code=MARK_CODE.format(name=tag + "b") + "; x = 2")  # c2
        await c.ok("python_history")  # both snapshots are in
        (snap_c1,) = comm_pids(tag + "a")
        os.kill(snap_c1, signal.SIGKILL)
        r = await c.py("x", parent="c1")
        assert r["status"] == "failed" and "replay=true" in r["message"], r
        cells = by_cell(await c.ok("python_history"))
        assert cells["c1"]["snapshot"] == "replay" and "failed" in cells["c1"]["note"], cells["c1"]
        assert (await c.ok("python_exec", code="x", parent="c2"))["value"] == "2"
        assert (await c.ok("python_exec", code="x", parent="c1", replay=True))["value"] == "1"

    server.run(scenario)


def test_the_cell_cap_drops_the_oldest_cells_and_says_so(server: Harness):
    """Issue 9, bounded graph: with `MCP_SANDBOX_MAX_CELLS=5` a session keeps its newest
    five cells (held snapshots and the head's line first); history says how many were
    dropped and which is the oldest kept; branching to a dropped cell, or to one whose
    state needs a dropped cell, is refused in words; the graph file stays bounded and a new
    server sees exactly the kept cells."""
    server.env["MCP_SANDBOX_MAX_CELLS"] = "5"
    server.env["MCP_SANDBOX_MAX_SNAPSHOTS"] = "2"
    graph = server.state_dir / "repl" / "default" / "graph.jsonl"
    dropped_note = "7 older cell(s) were dropped (the session keeps its last 5 cells); the oldest kept is c8"

    async def first(c):
        await c.ok("python_exec", code="log = [1]")
        for n in range(2, 13):
            await c.ok("python_exec", code=f"log.append({n})")
            # Compacted past twice the cap on a thread of its own; while that runs, at most
            # half the cap more lines before a cell waits for it.
            assert len(graph.read_text().splitlines()) <= 2 * 5 + 5 // 2
        res = await c.call("python_history")
        h = res.structured_content
        assert [e["cell"] for e in h["cells"]] == ["c8", "c9", "c10", "c11", "c12"], h
        assert h["dropped"] == dropped_note, h
        assert dropped_note in res.content[0].text
        held = [e["cell"] for e in h["cells"] if e["snapshot"] == "held"]
        assert held == ["c11", "c12"], h
        # A dropped cell, and a kept cell whose state needs a dropped one: refused, with a
        # held cell to use instead; nothing ran.
        msg = await c.err("python_exec", code="log", parent="c3")
        assert "c3 was dropped from the history: the session keeps its last 5 cells; branch from c11 (held)" in msg, msg
        msg = await c.err("python_exec", code="log", parent="c9", replay=True)
        assert "c9 needs c7, which was dropped from the history" in msg, msg
        assert (await c.ok("python_exec", code="len(log)"))["value"] == "12", "the head is unchanged"
        # A held cell still branches (c13's snapshot evicted c11's: c12, c13 are held).
        r = await c.ok("python_exec", code="len(log)", parent="c12")
        assert (r["value"], r["cell"], r.get("replayed")) == ("12", "c14", None), r
        # A cell number that never was is not "dropped".
        msg = await c.err("python_exec", code="1", parent="c99")
        assert "there is no cell c99" in msg and "dropped" not in msg, msg

    async def second(c):
        # The new server loaded c10..c14 (and the count dropped before them); numbering
        # goes on, and the new cell drops c10.
        r = await c.ok("python_exec", code="1")
        assert r["cell"] == "c15", r
        h = await c.ok("python_history")
        assert [e["cell"] for e in h["cells"]] == ["c11", "c12", "c13", "c14", "c15"], h
        assert h["dropped"].startswith("10 older cell(s) were dropped"), h
        assert "server restarted" in h["cells"][0]["note"], h
        text = (await c.session.read_resource("session://default/history")).contents[0].text
        assert "the oldest kept is c11" in text, text

    server.run(first)
    server.run(second)


def test_a_branch_tells_what_it_shares_and_buffers_are_not_written_twice(server):
    """A fork copies memory but shares descriptors and child processes. Open files'
    Python buffers are flushed before the snapshot (no branch writes another's buffered
    bytes again: `A`*10 once, then each branch's own byte), and each branch's answer says
    what it shares. Before: `AAAAAAAAAABAAAAAAAAAAC` and not a word."""

    async def scenario(c):
        c1 = await c.py("f = open('x', 'a')\nf.write('A' * 10)\nimport subprocess\np = subprocess.Popen(['sleep', '300'])")
        assert c1["status"] == "completed", c1
        answers = []
        for byte in "BC":
            r = await c.call("python_exec", code=f"f.write('{byte}')\nf.close()", parent=c1["cell"])
            assert r.structured_content["status"] == "completed", r.structured_content
            answers.append(" ".join(getattr(x, "text", "") for x in r.content))
        assert (server.workspace / "x").read_text() == "A" * 10 + "BC"
        for text in answers:
            assert "shares with the parent cell's other branches" in text, text
            assert "file(s) open for writing" in text and "/x" in text, text
            assert "child process(es)" in text, text
        # A cell with nothing shared says nothing of it.
        plain = await c.py("y = 1")
        r = await c.call("python_exec", code="y", parent=plain["cell"])
        assert "shares with" not in " ".join(getattr(x, "text", "") for x in r.content)
        await c.py("p.kill()", parent=c1["cell"])

    server.run(scenario)
