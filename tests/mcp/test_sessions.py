"""Sessions: isolation, parallel execution, crash isolation, the sandbox on the worker."""

import os
import time

import anyio
import pytest


CRASHES = {
    "segfault": "import ctypes; ctypes.string_at(0)",
    "os_exit": "import os; os._exit(3)",
    "kill9": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
}


@pytest.mark.parametrize("kind", sorted(CRASHES))
def test_crash_is_reported_and_next_call_gets_a_fresh_worker(server, kind):
    """A crashing worker is reported in words; the next call works and says state was lost;
    another session is untouched."""

    async def scenario(c):
        await c.ok("python_exec", code="before = 1")
        await c.ok("python_exec", code="other = 'safe'", session="bystander")
        res = await c.call("python_exec", code=CRASHES[kind])
        r = res.structured_content
        assert res.is_error and r["status"] == "failed", r
        words = r["message"]
        expected = {"segfault": "SIGSEGV", "os_exit": "code 3", "kill9": "SIGKILL"}[kind]
        assert expected in words and "state" in words, words
        r = await c.ok("python_exec", code="1 + 1")
        assert r["value"] == "2" and r["state_lost"] is True
        res = await c.call("python_exec", code="before")
        assert res.structured_content["exception"]["ename"] == "NameError"
        assert (await c.ok("python_exec", code="other", session="bystander"))["value"] == "'safe'"

    server.run(scenario)


def test_memory_cap_ends_the_allocation_not_the_server(server):
    """Under a policy with a 300 MiB memory cap, a 2 GiB allocation fails (MemoryError or
    the worker is killed with the limit named); the next call works."""
    policy = server.root / "small.toml"
    from conftest import REPO

    base = (REPO / "policies" / "workspace-write.toml").read_text()
    policy.write_text(base.replace('memory = "4GiB"', 'memory = "300MiB"'))

    async def scenario(c):
        res = await c.call("python_exec", code="blob = bytearray(2 * 1024**3)\nlen(blob)", wait_seconds=20)
        r = res.structured_content
        assert res.is_error, r
        if r.get("exception"):
            assert r["exception"]["ename"] == "MemoryError", r
        else:
            assert "memory" in (r.get("message") or ""), r
        assert (await c.ok("python_exec", code="sum(range(10))"))["value"] == "45"

    server.run(scenario, "--policy", str(policy))


def test_two_sessions_are_isolated(server):
    async def scenario(c):
        await c.ok("python_exec", code="secret = 1", session="a")
        res = await c.call("python_exec", code="secret", session="b")
        assert res.structured_content["exception"]["ename"] == "NameError"
        listed = {s["name"] for s in (await c.ok("session_list"))["sessions"]}
        assert {"a", "b"} <= listed
        await c.ok("session_close", session="b")
        listed = {s["name"] for s in (await c.ok("session_list"))["sessions"]}
        assert "b" not in listed and "a" in listed
        assert "b" in await c.err("session_close", session="b")

    server.run(scenario)


def test_four_sessions_execute_at_once(server):
    """Four one-second cells in four sessions overlap: each cell stamps its own start and end
    (inside the worker, so a server that ran them one after another fails, however fast or
    slow the machine), and the latest start comes before the earliest end."""
    import ast

    async def scenario(c):
        names = [f"s{i}" for i in range(4)]
        for n in names:
            await c.ok("python_exec", code="import time", session=n)
        spans = {}

        async def one(n):
            r = await c.ok("python_exec", code="s = time.time(); time.sleep(1); (s, time.time())", session=n,
                           wait_seconds=50)
            assert r["status"] == "completed", r
            spans[n] = ast.literal_eval(r["value"])

        t0 = time.monotonic()
        async with anyio.create_task_group() as tg:
            for n in names:
                tg.start_soon(one, n)
        total = time.monotonic() - t0
        latest_start = max(s for s, _ in spans.values())
        earliest_end = min(e for _, e in spans.values())
        assert latest_start < earliest_end, f"the four cells did not overlap ({total:.2f} s in all)"

    server.run(scenario)


def test_busy_session_answers_with_a_pointer_to_its_job(server):
    async def scenario(c):
        r = await c.ok("python_exec", code="import time; time.sleep(3)", wait_seconds=0.2)
        msg = await c.err("python_exec", code="1")
        assert "busy" in msg and r["job_id"] in msg
        await c.ok("job_cancel", job_id=r["job_id"])

    server.run(scenario)


def test_a_cell_called_beside_a_short_operation_runs_instead_of_being_busy(server):
    """Calls made in parallel (as agents do): a cell beside a variable read or
    `python_history` (which briefly holds the session's lock for its own round trip to the
    worker) runs, every time; only a cell that runs makes the other call busy."""

    async def scenario(c):
        await c.ok("python_exec", code="x = 1")
        refused = []
        for beside in ({"name": "python_vars", "action": "list"}, {"name": "python_history"}):
            for _ in range(30):
                results = {}

                async def call(key, name, **args):
                    results[key] = await c.call(name, **args)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(lambda: call("other", **beside))
                    tg.start_soon(lambda: call("cell", "python_exec", code="x"))
                cell, other = results["cell"], results["other"]
                if cell.is_error:
                    refused.append(cell.content[0].text)
                if other.is_error:
                    # Only a cell in progress may be the reason.
                    assert "busy running cell" in other.content[0].text, other.content[0].text
        assert refused == [], f"{len(refused)} of 60 cells refused: {refused[:2]}"

    server.run(scenario)


def test_sandbox_applies_to_the_worker(server):
    """Under workspace-write, writing outside the workspace fails; inside works."""

    async def scenario(c):
        res = await c.call("python_exec", code="open('/etc/mcp-sandbox-test', 'w')")
        r = res.structured_content
        assert res.is_error and r["exception"]["ename"] in ("PermissionError", "OSError"), r
        r = await c.ok("python_exec", code="open('inside.txt', 'w').write('ok')")
        assert (server.workspace / "inside.txt").read_text() == "ok"
        res = await c.call("python_exec", code="import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)")
        assert res.is_error, res.structured_content

    server.run(scenario)


def test_session_list_names_the_interpreter_and_the_memory_its_snapshots_hold(server):
    """`worker_pid` is the Python interpreter (as this PID namespace numbers it), not the
    launcher's supervisor; `held_memory_bytes` counts the snapshots' memory too (every
    cell is snapshotted right after its answer here: `--snapshot-idle-ms 0`)."""
    from pathlib import Path

    server.env["MCP_SANDBOX_SNAPSHOT_IDLE_MS"] = "0"

    async def scenario(c):
        inner = await c.py("import os\nblob = bytearray(128 << 20)\nos.getpid()")
        # The head lets go of c1's 128 MiB and takes 128 MiB of its own: c1's snapshot
        # still holds the first block, which the worker's RSS no longer shows.
        await c.py("del blob\nblob2 = bytearray(128 << 20)")
        await c.py("3")
        listed = await c.ok("session_list")
        s = next(s for s in listed["sessions"] if s["name"] == "default")
        pid = s["worker_pid"]
        exe = os.readlink(f"/proc/{pid}/exe")
        assert "python" in os.path.basename(exe), exe
        nspid = next(l for l in Path(f"/proc/{pid}/status").read_text().splitlines() if l.startswith("NSpid:"))
        assert nspid.split()[-1] == inner["value"], (nspid, inner)
        assert s["snapshots"] >= 2, s
        if s.get("held_memory_bytes") is not None:  # a memory cgroup is there
            assert s["memory_bytes"] >= 128 << 20, s
            assert s["held_memory_bytes"] >= s["memory_bytes"] + (96 << 20), s
            text = " ".join(getattr(x, "text", "") for x in (await c.call("session_list")).content)
            assert "snapshot(s))" in text, text

    server.run(scenario)
