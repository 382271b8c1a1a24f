"""Python REPL through MCP: the mcp-async-repl scenario, interrupt, variables, files, input()."""

import os
import time

import pytest


def test_async_repl_scenario(server):
    """The full mcp-async-repl walk-through: state across calls, variables, input() round
    trip, a five-second loop that goes to the background and is collected whole, restart."""

    async def scenario(c):
        r = await c.ok("python_exec", code='x = 42; print(f"x is {x}")')
        assert r["status"] == "completed" and r["stdout"]["text"] == "x is 42\n"
        r = await c.ok("python_exec", code='y = x * 2; print(f"y is {y}")')
        assert r["stdout"]["text"] == "y is 84\n"
        names = {v["name"] for v in (await c.ok("python_vars", action="list"))["variables"]}
        assert {"x", "y"} <= names

        r = await c.ok("python_exec", code='name = input("Enter your name: ")')
        assert r["status"] == "awaiting_input" and r["prompt"] == "Enter your name: "
        assert "job_input" in r["next"]
        r = await c.ok("job_input", job_id=r["job_id"], text="Jonathan")
        assert r["status"] == "completed", r
        r = await c.ok("python_exec", code='print(f"Hello {name}, x={x}")')
        assert r["stdout"]["text"] == "Hello Jonathan, x=42\n"

        r = await c.ok("python_exec", code='import time\n[print(f"tick {i}", flush=True) for i in range(5) if not time.sleep(1)]', wait_seconds=1.5)
        assert r["status"] == "running" and r["job_id"], r  # answered before the loop ended
        done = await c.finish(r)
        assert done["status"] == "completed"
        assert done["all_stdout"] == "".join(f"tick {i}\n" for i in range(5))

        await c.ok("session_restart")
        assert (await c.ok("python_vars", action="list"))["variables"] == []

    server.run(scenario)


def test_value_traceback_and_separate_streams(server):
    """Last-expression value, stderr apart from stdout, full traceback on error."""

    async def scenario(c):
        r = await c.ok("python_exec", code="import sys\nprint('out'); print('err', file=sys.stderr)\n6*7")
        assert (r["stdout"]["text"], r["stderr"]["text"], r["value"]) == ("out\n", "err\n", "42")
        # elapsed_ms encloses the cell: at least what the cell measured of itself (no
        # threshold of ours — the same monotonic clock, inside and around; `>= 0` held for
        # any u64, and a build reporting 0 fails this).
        code = "import time\nt = time.monotonic(); time.sleep(0.05)\nint((time.monotonic() - t) * 1000)"
        slept = await c.ok("python_exec", code=code)
        inside_ms = int(slept["value"])
        assert inside_ms > 0 and slept["elapsed_ms"] >= inside_ms, slept
        res = await c.call("python_exec", code="def f():\n    return 1/0\nf()")
        assert res.is_error
        r = res.structured_content
        assert r["status"] == "failed" and r["exception"]["ename"] == "ZeroDivisionError"
        assert "line 2, in f" in r["exception"]["traceback"]
        assert (await c.ok("python_exec", code="1+1"))["value"] == "2"

    server.run(scenario)


def test_interrupt_keeps_state(server):
    """python_interrupt raises KeyboardInterrupt in a busy loop; the session keeps its state."""

    async def scenario(c):
        await c.ok("python_exec", code="keep = 'me'")
        r = await c.ok("python_exec", code="while True: pass", wait_seconds=0.3)
        assert r["status"] == "running"
        await c.ok("python_interrupt")
        res = await c.call("job_wait", job_id=r["job_id"], until_done=True, timeout_seconds=10)
        rep = res.structured_content
        assert rep["status"] == "failed" and rep["exception"]["ename"] == "KeyboardInterrupt", rep
        assert (await c.ok("python_exec", code="keep"))["value"] == "'me'"

    server.run(scenario)


def test_variables_get_set_delete_clear(server):
    async def scenario(c):
        await c.ok("python_vars", action="set", name="cfg", value={"a": [1, 2], "b": None})
        r = await c.ok("python_exec", code="cfg['a'][1] + 1")
        assert r["value"] == "3"
        got = await c.ok("python_vars", action="get", name="cfg")
        assert got["name"] == "cfg" and "'a': [1, 2]" in got["repr"]
        await c.ok("python_vars", action="delete", name="cfg")
        assert "NameError" in (await c.call("python_exec", code="cfg")).structured_content["exception"]["ename"]
        await c.ok("python_exec", code="p = 1; q = 2")
        await c.ok("python_vars", action="clear")
        assert (await c.ok("python_vars", action="list"))["variables"] == []
        msg = await c.err("python_vars", action="get")
        assert "name" in msg
        msg = await c.err("python_vars", action="get", name="nope")
        assert "nope" in msg

    server.run(scenario)


def test_run_file_and_history(server):
    (server.workspace / "prog.py").write_text("import sys\nresult = sys.argv[1:]\nprint('main' if __name__ == '__main__' else 'not main')\n")

    async def scenario(c):
        r = await c.ok("python_run_file", path="prog.py", args=["a", "b"])
        assert r["stdout"]["text"] == "main\n"
        assert (await c.ok("python_exec", code="result"))["value"] == "['a', 'b']"
        h = await c.ok("python_history")
        assert len(h["cells"]) == 2 and "prog.py" in h["cells"][0]["code"]
        assert "no such file" in await c.err("python_run_file", path="missing.py")

    server.run(scenario)


def test_input_never_reads_the_mcp_stream(server):
    """Reading stdin from user code must not consume MCP messages: sys.stdin is not the
    server's stdin, and a pending input() is answered only by job_input."""

    async def scenario(c):
        r = await c.ok("python_exec", code="import sys, os\nprint(repr(sys.stdin.read()))", wait_seconds=5)
        # sys.stdin is bridged to the client (an input request), never the MCP stream.
        assert r["status"] == "awaiting_input", r
        r = await c.ok("job_input", job_id=r["job_id"], text="", eof=True)
        assert r["status"] == "completed" and "''" in r["stdout"]["text"], r
        # The call returns at the input request (however long the cell takes to get there).
        r = await c.ok("python_exec", code="a = input('? ')", wait_seconds=60)
        assert r["status"] == "awaiting_input", r
        # Other MCP traffic goes on while input() waits, and none of it reaches the worker.
        for _ in range(3):
            await c.ok("session_list")
        r2 = await c.ok("job_wait", job_id=r["job_id"], timeout_seconds=0.5)
        assert r2["status"] == "awaiting_input"
        r3 = await c.ok("job_input", job_id=r["job_id"], text="from tool")
        assert r3["status"] == "completed"
        assert (await c.ok("python_exec", code="a"))["value"] == "'from tool'"

    server.run(scenario)


def test_images_come_back_as_image_content(server):
    """An object with _repr_png_ as the last expression is returned as MCP image content."""
    png = (
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    )

    async def scenario(c):
        code = (
            "import base64\n"
            "class Pic:\n"
            f"    def _repr_png_(self): return base64.b64decode('{png}')\n"
            "Pic()"
        )
        res = await c.call("python_exec", code=code)
        assert not res.is_error, res
        kinds = [b.type for b in res.content]
        if "image" not in kinds:
            pytest.fail(f"no image content returned: {kinds} {res.structured_content}")
        img = next(b for b in res.content if b.type == "image")
        assert img.mime_type == "image/png"

    server.run(scenario)


def test_a_cell_that_forks_twice_completes(server):
    """A cell that daemonizes by hand (fork, setsid, fork, exec) finishes: the worker's
    fork hooks must not leave a lock held in the child (which deadlocked its next fork)."""

    async def scenario(c):
        code = (
            "import os\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        os.execvp('true', ['true'])\n"
            "    os._exit(0)\n"
            "os.waitpid(pid, 0)[1]\n"
        )
        r = await c.py(code, wait_seconds=10)
        assert (r["status"], r.get("value")) == ("completed", "0"), r

    server.run(scenario)


@pytest.mark.parametrize("policy", ["workspace-write", "read-only", "ci"])
def test_multiprocessing_works_under_every_sandboxing_policy_with_a_private_dev_shm(server, policy):
    """multiprocessing.Pool and ProcessPoolExecutor need POSIX semaphores in /dev/shm: each
    job gets a private, size-bounded tmpfs there (not the host's), under every policy."""
    marker = f"shm-marker-{os.getpid()}-{policy}"

    async def scenario(c):
        code = (
            "import multiprocessing, concurrent.futures, os\n"
            "with multiprocessing.Pool(2) as p:\n"
            "    a = p.map(abs, [-1, -2, -3])\n"
            "with concurrent.futures.ProcessPoolExecutor(2) as ex:\n"
            "    b = list(ex.map(abs, [-4, -5]))\n"
            f"open('/dev/shm/{marker}', 'w').write('x')\n"
            "st = os.statvfs('/dev/shm')\n"
            "(a, b, st.f_blocks * st.f_frsize <= (1 << 30))"
        )
        cell = await c.py(code)
        assert cell["status"] == "completed", cell
        assert cell["value"] == "([1, 2, 3], [4, 5], True)", cell
        # Private: not on the host, not in another job.
        assert not os.path.exists(f"/dev/shm/{marker}")
        other = await c.ok("shell_run", command=f"ls /dev/shm/{marker} 2>&1 || echo absent", wait_seconds=30)
        assert "absent" in other["stdout"]["text"], other

    server.run(scenario, "--sandbox-state" if policy != "ci" else "--policy", policy)


def test_the_worker_survives_bad_rich_reprs_and_hooks(server):
    """User hooks are user code: a `_repr_png_` returning an int (which killed the worker
    and every variable), a raising `__repr__`, a `_repr_html_` returning bytes, a raising
    `_repr_markdown_` and a raising `__del__` leave the session's state intact."""

    async def scenario(c):
        await c.py("keep = 41")
        png = await c.py("class X:\n def _repr_png_(self): return 5\nX()")
        assert png["status"] == "completed", png
        shown = str(png.get("display"))
        assert "_repr_png_ failed: TypeError: returned int, not bytes" in shown, png
        for code in (
            "class Y:\n def __repr__(self): raise ValueError('bad repr')\nY()",
            "class Z:\n def _repr_html_(self): return b'<b>z</b>'\nZ()",
            "class V:\n def _repr_markdown_(self): raise KeyError('md')\nV()",
            "class W:\n def __del__(self): raise RuntimeError('del')\nw = W()\ndel w",
        ):
            r = await c.py(code)
            assert r["status"] == "completed", (code, r)
            assert (await c.py("keep + 1"))["value"] == "42", code
        html = await c.py("Z()")
        # Bytes decoded; the answer carries the text form, the HTML is in the result stream.
        assert html["display"] == [{"mime": "text/plain", "data": "z"}], html
        whole = await c.ok("job_output", job_id=html["job_id"], stream="result", offset=html["html"]["offset"])
        assert "<b>z</b>" in whole["text"], whole

    server.run(scenario)
