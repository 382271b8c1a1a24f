"""MCP resources through the official Python SDK: a running job's output read as a
resource (paged), a subscription that is notified as the output grows, a session's cell
history, and a script python_run_script ran listed, read back and rerun from its saved
arguments. Hostile URIs get a resource error, never a file."""

from __future__ import annotations

import json
import time
from contextlib import asynccontextmanager

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from conftest import Client, binary, first_leaf


@asynccontextmanager
async def connect(server, handler):
    params = StdioServerParameters(command=binary(), args=[], env=server.server_env(), cwd=str(server.workspace))
    with open(server.root / "server-stderr.log", "a") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write, message_handler=handler) as session:
                await session.initialize()
                yield Client(session, server, None)


def run(server, scenario):
    updates: list[str] = []

    async def handler(message):
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(str(message.params.uri))
        await anyio.lowlevel.checkpoint()

    async def main():
        with anyio.fail_after(150):
            async with connect(server, handler) as c:
                return await scenario(c, updates)

    try:
        return anyio.run(main)
    except BaseExceptionGroup as group:
        raise first_leaf(group) from None


def body(result) -> str:
    assert len(result.contents) == 1, result
    return result.contents[0].text


def test_running_job_output_is_a_resource_and_subscribers_hear_it_grow(server):
    async def scenario(c, updates):
        caps = c.session.server_capabilities
        assert caps.resources is not None and caps.resources.subscribe, caps
        templates = {t.uri_template for t in (await c.session.list_resource_templates()).resource_templates}
        assert "job://{job_id}/stdout{?offset,length}" in templates, templates
        # A job that prints a line, then waits for a go-ahead on stdin, then prints more.
        job = await c.ok(
            "shell_run",
            command="echo first; read go; echo second; read go; echo third",
            wait_seconds=0.5,
        )
        assert job["status"] == "running", job
        jid = job["job_id"]
        # On a loaded machine "first" may come after the call's window: wait for it, so the
        # resource read below holds it and the changes listened for are "second", "third".
        seen = job["stdout"]["text"]
        while "first\n" not in seen:
            seen += (await c.ok("job_wait", job_id=jid, timeout_seconds=30))["stdout"]["text"]
        uri = f"job://{jid}/stdout"
        await c.session.subscribe_resource(uri)
        listed = {str(r.uri) for r in (await c.session.list_resources()).resources}
        assert uri in listed, listed
        text = body(await c.session.read_resource(uri))
        assert text == "first\n", text
        for n, word in enumerate(["second", "third"], start=1):
            before = len([u for u in updates if u == uri])
            await c.ok("job_input", job_id=jid, text="go\n")
            # The notification arrives without polling the job; the deadlines only guard a
            # hang (a loaded machine may be slow to run the echo).
            deadline = time.monotonic() + 60
            while len([u for u in updates if u == uri]) <= before:
                assert time.monotonic() < deadline, f"no resources/updated for {uri} after input {n}: {updates}"
                await anyio.sleep(0.05)
            deadline = time.monotonic() + 60
            while word not in (text := body(await c.session.read_resource(uri))):
                assert time.monotonic() < deadline, text
                await anyio.sleep(0.05)
        # Ranges go through the pager, with the position in _meta.
        page = (await c.session.read_resource(f"{uri}?offset=6&length=3")).contents[0]
        assert page.text == "sec", page
        meta = page.meta or {}
        assert meta.get("offset") == 6 and meta.get("end") == 9 and meta.get("total") == 19, meta
        await c.session.unsubscribe_resource(uri)

    run(server, scenario)


def test_big_output_resource_is_bounded(server):
    async def scenario(c, updates):
        job = await c.finish(await c.ok("shell_run", command="head -c 300000 /dev/zero | tr '\\0' x"))
        res = (await c.session.read_resource(f"job://{job['job_id']}/stdout")).contents[0]
        assert 0 < len(res.text) <= 21_000, len(res.text)
        assert res.meta["total"] == 300000 and res.meta["next"].endswith(f"?offset={res.meta['end']}"), res.meta

    run(server, scenario)


def test_session_history_and_hostile_uris(server):
    async def scenario(c, updates):
        await c.ok("python_exec", code="a = 40")
        await c.ok("python_exec", code="a + 2")
        text = body(await c.session.read_resource("session://default/history"))
        assert "2 cell(s)" in text and "a = 40" in text and "a + 2" in text, text
        for bad in (
            "session://nosuch/history",
            "job://../../etc/passwd/stdout",
            "job://j999/stdout",
            "script://../../etc/passwd",
            "file:///etc/passwd",
            "job://j1/stdout?offset=-5",
        ):
            try:
                r = await c.session.read_resource(bad)
            except Exception as e:
                assert "root:" not in str(e)
            else:
                raise AssertionError(f"{bad} read: {r}")
        try:
            await c.session.subscribe_resource("session://default/history")
        except Exception as e:
            assert "only job output" in str(e), e
        else:
            raise AssertionError("subscribed to a history")

    run(server, scenario)


def test_a_script_run_earlier_is_listed_and_rerun_from_its_saved_arguments(offline):
    async def scenario(c, updates):
        job = await c.finish(
            await c.ok(
                "python_run_script",
                code="import sys, tinypkg\nprint('run', tinypkg.__version__, sys.argv[1:])",
                dependencies=["tinypkg"],
                args=["x", "y z"],
                env={"SECRET_TOKEN": "do-not-save"},
            )
        )
        assert job["status"] == "completed" and job["all_stdout"] == "run 0.1 ['x', 'y z']\n", job
        uri = f"script://{job['job_id']}"
        listed = {str(r.uri) for r in (await c.session.list_resources()).resources}
        assert uri in listed, listed
        saved = json.loads(body(await c.session.read_resource(uri)))
        assert saved["env_names"] == ["SECRET_TOKEN"] and "do-not-save" not in json.dumps(saved), saved
        again = await c.finish(await c.ok("python_run_script", **saved["arguments"]))
        assert again["status"] == "completed" and again["all_stdout"] == job["all_stdout"], again
        assert again["job_id"] != job["job_id"]
        code = body(await c.session.read_resource(f"{uri}/code?offset=12&length=9"))
        assert code == "tinypkg\np", code

    run(offline, scenario)


def test_a_flooding_job_does_not_flood_its_subscriber(server):
    """Hundreds of separate writes, a handful of notifications (at most one per quarter
    second per subscription), and one more when the job ends."""

    async def scenario(c, updates):
        # The job floods only once told to, after the subscription: on a loaded machine a
        # job that started at once could be over before the subscription was made.
        job = await c.ok(
            "shell_run",
            command="read go; i=0; while [ $i -lt 400 ]; do echo $i; i=$((i+1)); sleep 0.005; done",
            wait_seconds=0.1,
        )
        assert job["status"] == "running", job
        uri = f"job://{job['job_id']}/stdout"
        await c.session.subscribe_resource(uri)
        job = await c.ok("job_input", job_id=job["job_id"], text="go\n", wait_seconds=0)
        done = await c.finish(job)
        assert done["status"] == "completed", done
        deadline = time.monotonic() + 60  # the end is announced too; this only guards a hang
        while True:
            mine = [u for u in updates if u == uri]
            text = body(await c.session.read_resource(uri))
            if (mine and text.endswith("399\n")) or time.monotonic() > deadline:
                break
            await anyio.sleep(0.05)
        mine = [u for u in updates if u == uri]
        assert 1 <= len(mine) < 150, len(mine)

    run(server, scenario)


def test_listen_on_the_2026_protocol_is_told_as_the_output_grows(server):
    """A client on protocol 2026-07-28 (no resources/subscribe there) opens
    subscriptions/listen for a job stream; unknown URIs are left out of what is honoured."""
    from mcp.client.client import Client as ModernClient

    async def main():
        params = StdioServerParameters(command=binary(), args=[], env=server.server_env(), cwd=str(server.workspace))
        with anyio.fail_after(120):
            async with ModernClient(params, mode="auto") as c:
                r = await c.call_tool("shell_run", {"command": "echo a; read x; echo b; read x", "wait_seconds": 0.5})
                jid = r.structured_content["job_id"]
                # On a loaded machine "a" may come after the call's window: wait for it, so
                # the change listened for below is "b".
                seen = r.structured_content["stdout"]["text"]
                while "a" not in seen:
                    w = await c.call_tool("job_wait", {"job_id": jid, "timeout_seconds": 30})
                    seen += w.structured_content["stdout"]["text"]
                uri = f"job://{jid}/stdout"
                async with c.listen(resource_subscriptions=[uri, "session://none/history", "job://j999/stdout"]) as sub:
                    assert list(sub.honored.resource_subscriptions) == [uri], sub.honored
                    await c.call_tool("job_input", {"job_id": jid, "text": "go\n"})
                    async for event in sub:
                        assert str(event.uri) == uri, event
                        break
                # The event may announce "b" before all of it is readable: read until it is.
                deadline = time.monotonic() + 30
                while (text := (await c.read_resource(uri)).contents[0].text) != "a\nb\n":
                    assert time.monotonic() < deadline, text
                    await anyio.sleep(0.05)
                await c.call_tool("job_cancel", {"job_id": jid})

    try:
        anyio.run(main)
    except BaseExceptionGroup as group:
        raise first_leaf(group) from None
