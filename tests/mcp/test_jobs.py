"""The job store through MCP: list and filters, prune, persistence across restarts,
progress notifications, request cancellation."""

import time

import anyio


def test_list_filters_and_prune(server):
    async def scenario(c):
        await c.ok("shell_run", command="echo one")
        await c.call("shell_run", command="exit 1")
        await c.ok("python_exec", code="1", session="p")
        run = await c.ok("shell_run", command="sleep 30", wait_seconds=0)
        jobs = (await c.ok("job_list"))["jobs"]
        assert len(jobs) == 4
        assert [j["job_id"] for j in (await c.ok("job_list", status="running"))["jobs"]] == [run["job_id"]]
        assert len((await c.ok("job_list", kind="python"))["jobs"]) == 1
        assert len((await c.ok("job_list", session="p"))["jobs"]) == 1
        assert len((await c.ok("job_list", status="failed"))["jobs"]) == 1
        msg = await c.err("job_prune", job_id=run["job_id"])
        assert "running" in msg
        pruned = (await c.ok("job_prune", status="failed"))["pruned"]
        assert len(pruned) == 1
        pruned = (await c.ok("job_prune"))["pruned"]
        assert len(pruned) == 2
        assert [j["job_id"] for j in (await c.ok("job_list"))["jobs"]] == [run["job_id"]]
        await c.ok("job_cancel", job_id=run["job_id"])

    server.run(scenario)


def test_finished_output_survives_restart_and_running_jobs_become_lost(server):
    ids = {}

    async def first(c):
        ids["done"] = (await c.ok("shell_run", command="echo persisted"))["job_id"]
        ids["py"] = (await c.ok("python_exec", code="print('from python')"))["job_id"]
        ids["running"] = (await c.ok("shell_run", command="sleep 300", wait_seconds=0))["job_id"]

    async def second(c):
        jobs = {j["job_id"]: j for j in (await c.ok("job_list"))["jobs"]}
        assert jobs[ids["done"]]["status"] == "completed"
        assert jobs[ids["running"]]["status"] in ("lost", "cancelled"), jobs[ids["running"]]
        page = await c.ok("job_output", job_id=ids["done"])
        assert page["text"] == "persisted\n"
        assert (await c.ok("job_output", job_id=ids["py"]))["text"] == "from python\n"
        new = await c.ok("shell_run", command="echo new")
        assert new["job_id"] not in ids.values()

    server.run(first)
    server.run(second)


def test_job_killed_with_the_server_is_lost(server):
    """A server killed with SIGKILL cannot record anything: the next one marks its
    running jobs `lost`."""
    import os
    import signal

    import uuid

    from conftest import pids_with_env_marker

    ids = {}
    marker = f"mark-{uuid.uuid4().hex}"

    async def first(c):
        r = await c.ok("shell_run", command="sleep 300", env={"MCP_TEST_MARK": marker}, wait_seconds=0)
        ids["running"] = r["job_id"]
        os.kill(c.server_pid, signal.SIGKILL)

    async def second(c):
        jobs = {j["job_id"]: j for j in (await c.ok("job_list"))["jobs"]}
        assert jobs[ids["running"]]["status"] == "lost"
        res = await c.call("job_wait", job_id=ids["running"], timeout_seconds=1)
        assert res.is_error and res.structured_content["status"] == "lost"

    try:
        server.run(first)
    except Exception:
        pass  # the client sees its server vanish
    try:
        server.run(second)
    finally:
        # A SIGKILLed server cannot clean up; do not leave its job behind on the machine.
        for pid in pids_with_env_marker(marker):
            os.kill(pid, signal.SIGKILL)


def test_progress_notifications_while_waiting(server):
    async def scenario(c):
        seen = []

        async def on_progress(progress, total, message):
            seen.append((progress, message))

        res = await c.call(
            "shell_run", command="for i in 1 2 3; do echo p$i; sleep 0.6; done", wait_seconds=60, progress=on_progress
        )
        assert res.structured_content["status"] == "completed"
        assert seen, "no progress notification during a 2 s wait with output"
        assert "bytes of output" in seen[-1][1]

    server.run(scenario)


def test_cancelling_a_request_cancels_its_job(server):
    """A client that cancels a python_exec request (notifications/cancelled) interrupts
    the cell; the session stays usable."""

    async def scenario(c):
        # Cancel only once the cell is seen running (a fixed delay could fire before the
        # server has started it on a loaded machine); the poll's deadline only guards a hang.
        async def call_and_cancel(scope):
            deadline = time.monotonic() + 60
            while not [j for j in (await c.ok("job_list", kind="python"))["jobs"] if j["status"] == "running"]:
                assert time.monotonic() < deadline, "the cell never showed up as running"
                await anyio.sleep(0.05)
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(call_and_cancel, tg.cancel_scope)
            await c.call("python_exec", code="import time\nwhile True: time.sleep(0.05)", wait_seconds=30)
            raise AssertionError("the endless cell returned instead of being cancelled")
        deadline = time.monotonic() + 60
        while True:
            jobs = (await c.ok("job_list", kind="python"))["jobs"]
            if jobs and jobs[0]["status"] != "running":
                break
            assert time.monotonic() < deadline, jobs
            await anyio.sleep(0.1)
        assert jobs[0]["status"] == "cancelled"
        assert (await c.ok("python_exec", code="2 + 2"))["value"] == "4"

    server.run(scenario)


def test_concurrent_waiters_each_get_the_output_or_a_pointer_to_it(server):
    """50 `job_wait` calls on one job at once: each answer carries the job's output, or
    (a caller whose wait began after the output was handed out) says where it is."""

    async def scenario(c):
        job = await c.ok("shell_run", command="while [ ! -e go ]; do sleep 0.02; done; echo hello", wait_seconds=0)
        answers = []

        async def wait_one():
            res = await c.call("job_wait", job_id=job["job_id"], timeout_seconds=60)
            answers.append((res.structured_content, " ".join(getattr(x, "text", "") for x in res.content)))

        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(wait_one)
            # Give the calls a moment to reach the server (not a claim: a late one is
            # told where the output went, which the test accepts too).
            await anyio.sleep(1.0)
            (server.workspace / "go").write_text("")
        assert len(answers) == 50
        with_output = 0
        for sc, text in answers:
            assert sc["status"] == "completed", sc
            if sc["stdout"]["text"] == "hello\n":
                with_output += 1
            else:
                assert sc["stdout"]["text"] == "" and "earlier answers; read them with job_output" in text, text
        assert with_output >= 1, answers
        # A wait after everything was handed out points at job_output too, and it has it.
        late = await c.call("job_wait", job_id=job["job_id"], timeout_seconds=1)
        assert "read them with job_output" in " ".join(getattr(x, "text", "") for x in late.content)
        out = await c.ok("job_output", job_id=job["job_id"])
        assert "hello" in str(out), out
        return with_output

    got = server.run(scenario)
    print(f"{got}/50 waiters got the output itself")
