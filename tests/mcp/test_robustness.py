"""Wedge-free sessions and honest answers (issue 9): cancel escalates to a worker restart,
a stopped worker can be cancelled, a corrupted event stream fails the cell, a closed fd 1
does not silence later cells, restart is synchronous, crashes and expiry are named."""

import os
import signal
import time

import anyio

# Finds the worker's private event descriptor the way a hostile or careless cell could:
# a high, write-only pipe that is neither fd 1 nor fd 2 (nor a copy of them).
FIND_EVENT_FD = """
import os, fcntl, stat
_std = {(os.fstat(f).st_dev, os.fstat(f).st_ino) for f in (1, 2)}
_ev = None
_fifos = []
for _n in sorted(int(x) for x in os.listdir('/proc/self/fd')):
    if _n < 10:
        continue
    try:
        _st = os.fstat(_n)
        _fl = fcntl.fcntl(_n, fcntl.F_GETFL)
    except OSError:
        continue
    if stat.S_ISFIFO(_st.st_mode):
        _fifos.append((_n, _fl & os.O_ACCMODE, (_st.st_dev, _st.st_ino)))
# The event pipe's read end is the server's (a pipe with both ends here is the worker's own).
_read = {_ino for _n, _mode, _ino in _fifos if _mode == os.O_RDONLY}
for _n, _mode, _ino in _fifos:
    if _mode == os.O_WRONLY and _ino not in _std and _ino not in _read:
        _ev = _n
"""


# SIGINT blocked first: on a loaded machine an interrupt could otherwise land between the
# print and the C call and be answered; blocked, it never is, as in a C call.
STUCK_IN_C = ("import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
              "print('started', flush=True)\nsum(range(10**11))")


async def start_stuck_cell(c) -> str:
    """Start a cell that is inside one long C call (KeyboardInterrupt cannot reach it) and
    return its job id once it is there."""
    r = await c.py(STUCK_IN_C, wait_seconds=0)
    while "started" not in r["stdout"]["text"]:
        assert r["status"] == "running", r
        r = await c.ok("job_wait", job_id=r["job_id"], timeout_seconds=30)
    return r["job_id"]


async def settle(c, job_id: str) -> dict:
    """The job's final report (a failed job is a tool error, so not through `ok`)."""
    while True:
        res = await c.call("job_wait", job_id=job_id, timeout_seconds=30, until_done=True)
        r = res.structured_content
        assert r is not None, res
        if r["status"] not in ("running", "awaiting_input"):
            return r


def test_cancel_of_a_cell_stuck_in_c_restarts_the_worker(server):
    async def scenario(c):
        await c.py("kept = 1")
        job = await start_stuck_cell(c)
        r = await c.ok("job_cancel", job_id=job, grace_seconds=0.5)
        assert r["status"] == "cancelled", r
        assert r["state_lost"] is True, r
        assert "did not respond to KeyboardInterrupt within 0.5 s; the worker was restarted" in r["message"], r
        assert r["signal"] == "SIGKILL", r
        # The next cell runs at once in the fresh worker and is told why state is gone.
        r = await c.py("kept")
        assert r["status"] == "failed" and r["exception"]["ename"] == "NameError", r
        assert r["state_lost"] is True and "KeyboardInterrupt" in r["state_note"], r
        r = await c.py("2 + 2")
        assert r["value"] == "4" and "state_lost" not in r, r

    server.run(scenario)


def test_cancel_that_the_cell_handles_keeps_the_session(server):
    async def scenario(c):
        await c.py("kept = 7")
        r = await c.py("import time\ntime.sleep(60)", wait_seconds=0)
        r = await c.ok("job_cancel", job_id=r["job_id"], grace_seconds=10)
        assert r["status"] == "cancelled" and "state_lost" not in r, r
        assert (await c.py("kept"))["value"] == "7"

    server.run(scenario)


def test_python_interrupt_escalates_too(server):
    async def scenario(c):
        # Interrupted before it starts: the cell never runs (nothing is lost).
        r = await c.py("import time; time.sleep(30)", wait_seconds=0)
        await c.ok("python_interrupt")
        r = await settle(c, r["job_id"])
        assert r["status"] == "failed" and r["exception"]["ename"] == "KeyboardInterrupt", r
        job = await start_stuck_cell(c)
        res = await c.ok("python_interrupt", grace_seconds=0.3)
        assert res.get("interrupted") is True, res
        done = await settle(c, job)
        assert done["status"] == "failed" and done["state_lost"] is True, done
        assert "did not respond to KeyboardInterrupt within 0.3 s" in done["message"], done
        assert (await c.py("1 + 1"))["value"] == "2"

    server.run(scenario)


def test_cancel_of_a_stopped_worker_continues_and_interrupts_it(server):
    async def scenario(c):
        await c.py("kept = 'yes'")
        pid = next(s["worker_pid"] for s in (await c.ok("session_list"))["sessions"] if s["name"] == "default")
        r = await c.py("import time\ntime.sleep(60)", wait_seconds=0)
        assert r["status"] == "running"
        os.kill(pid, signal.SIGSTOP)
        try:
            r = await c.ok("job_cancel", job_id=r["job_id"], grace_seconds=20)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert r["status"] == "cancelled", r
        assert "KeyboardInterrupt" in r["message"] and "state_lost" not in r, r
        assert (await c.py("kept"))["value"] == "'yes'"

    server.run(scenario)


def test_unterminated_write_to_the_event_fd_fails_the_cell(server):
    async def scenario(c):
        r = await c.py(FIND_EVENT_FD + "_ev")
        assert r["status"] == "completed" and r["value"] not in (None, "None"), r
        r = await c.py(f"import os; os.write({r['value']}, b'not a protocol line')", wait_seconds=30)
        assert r["status"] == "failed", r
        assert "protocol fault" in r["message"] and "not a protocol line" in r["message"], r
        r = await c.py("'alive'")
        assert r["value"] == "'alive'" and r["state_lost"] is True, r

    server.run(scenario)


def test_garbage_line_on_the_event_fd_fails_the_cell(server):
    async def scenario(c):
        r = await c.py(FIND_EVENT_FD + "os.write(_ev, b'{\"ev\": 1}\\n\\xff\\n'); import time; time.sleep(30)", wait_seconds=30)
        assert r["status"] == "failed" and "protocol fault" in r["message"], r

    server.run(scenario)


def test_closing_fd_1_and_2_does_not_silence_later_cells(server):
    async def scenario(c):
        await c.py("import os, sys; print('before'); sys.stdout.flush(); os.close(1); os.close(2)")
        r = await c.py("print('back'); import sys; print('err too', file=sys.stderr)")
        assert r["stdout"]["text"] == "back\n", r
        assert r["stderr"]["text"] == "err too\n", r
        await c.py("import sys; sys.stdout.close()")
        r = await c.py("print('reopened')")
        assert r["stdout"]["text"] == "reopened\n", r

    server.run(scenario)


def test_restart_is_synchronous(server):
    """50 trials of restart while a cell runs, then at once an execute: never "busy"."""

    async def scenario(c):
        busy = []
        for _ in range(50):
            r = await c.py("import time; time.sleep(60)", wait_seconds=0)
            assert r["status"] == "running", r
            await c.ok("session_restart")
            res = await c.call("python_exec", code="pass")
            text = str(res.structured_content or "") + " ".join(getattr(x, "text", "") for x in res.content)
            if "busy" in text or res.is_error:
                busy.append(text)
        assert busy == [], f"{len(busy)} of 50 answers were busy/errors: {busy[:2]}"

    server.run(scenario, timeout=600)


def test_a_crashing_cell_names_the_signal_and_only_the_next_says_fresh_worker(server):
    async def scenario(c):
        await c.py("x = 1")
        res = await c.call("python_exec", code="import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
        r = res.structured_content
        assert r["status"] == "failed" and r["signal"] == "SIGSEGV", r
        text = " ".join(getattr(x, "text", "") for x in res.content)
        assert "SIGSEGV" in text and "fresh worker and earlier state" not in text, text
        assert "state_note" not in r, r
        res = await c.call("python_exec", code="'next'")
        r = res.structured_content
        assert r["state_lost"] is True and "SIGSEGV" in r["state_note"], r
        assert "this ran in a fresh worker" in " ".join(getattr(x, "text", "") for x in res.content)

        r = await c.py("import os; os.kill(os.getpid(), 9)")
        assert r["status"] == "failed" and r["signal"] == "SIGKILL", r
        r = await c.py("import os; os._exit(3)")
        assert r["status"] == "failed" and r["exit_code"] == 3 and "signal" not in r, r

    server.run(scenario)


def test_idle_expiry_is_reported_on_the_next_call(server):
    async def scenario(c):
        await c.py("x = 1", session="ttl")
        # The reaper runs every 250 ms with a 1 s TTL; the deadline only guards a session
        # that is never closed (a loaded machine may run the reaper late).
        deadline = time.monotonic() + 60
        while any(s["name"] == "ttl" for s in (await c.ok("session_list"))["sessions"]):
            assert time.monotonic() < deadline, "the idle session was not closed"
            await anyio.sleep(0.1)
        r = await c.py("x", session="ttl")
        assert r["status"] == "failed" and r["exception"]["ename"] == "NameError", r
        assert r["state_lost"] is True and "expired after" in r["state_note"] and "s idle" in r["state_note"], r
        r = await c.py("1", session="ttl")
        assert "state_lost" not in r, r

    server.run(scenario, "--session-ttl", "1")
