"""MCP tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663) through the official
SDK's own extension mechanism: a client that declares the extension and claims the
`resultType: "task"` result gets a task for a job that outlives its window, polls it with
`tasks/get` to the job's answer, answers its input with `tasks/update` and stops it with
`tasks/cancel`. A client that does not declare it gets today's `running` report."""

from __future__ import annotations

import json
from typing import Any, Literal

import anyio
from mcp import MCPError, StdioServerParameters, types
from mcp.client.client import Client as ModernClient
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from pydantic import ConfigDict, TypeAdapter

from conftest import binary, first_leaf

TASKS = "io.modelcontextprotocol/tasks"
JOB_META = "io.github.mcp-sandbox-repl/job_id"
SLOW_CELL = "import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.7)\n'done'"


class TaskCreated(types.Result):
    """`CreateTaskResult` (SEP-2663): the task's fields flattened, `resultType: "task"`."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"]
    task_id: str
    status: str


class TaskParams(types.RequestParams):
    task_id: str
    input_responses: dict[str, Any] | None = None


class TaskRequest(types.Request[TaskParams, str]):
    pass


async def task_call(session, method: str, task_id: str, **extra: Any) -> dict:
    """Send tasks/get, tasks/update or tasks/cancel; return the raw result."""
    request = TaskRequest(method=method, params=TaskParams(task_id=task_id, **extra))
    return await session.send_request(request, TypeAdapter(dict[str, Any]))


async def poll(session, task_id: str, until: set[str], timeout: float = 60) -> dict:
    """tasks/get at the task's polling interval until its status is one of `until`."""
    with anyio.fail_after(timeout):
        while True:
            got = await task_call(session, "tasks/get", task_id)
            if got["status"] in until:
                return got
            await anyio.sleep(got.get("pollIntervalMs", 1000) / 1000)


class Tasks(ClientExtension):
    """A client's support for tasks: declares the extension, and resolves a task result
    by polling it to completion (what `call_tool` then returns)."""

    identifier = TASKS

    def __init__(self):
        self.created: list[TaskCreated] = []
        self.statuses: list[str] = []

    def claims(self):
        return [ResultClaim(result_type="task", model=TaskCreated, resolve=self.resolve)]

    async def resolve(self, created: TaskCreated, ctx: ClaimContext) -> types.CallToolResult:
        self.created.append(created)
        with anyio.fail_after(60):
            while True:
                got = await task_call(ctx.session, "tasks/get", created.task_id)
                self.statuses.append(got["status"])
                if got["status"] == "completed":
                    return types.CallToolResult.model_validate(got["result"])
                assert got["status"] == "working", got
                await anyio.sleep(got.get("pollIntervalMs", 1000) / 1000)


def run_modern(server, scenario, extensions=None):
    async def main():
        params = StdioServerParameters(command=binary(), args=[], env=server.server_env(), cwd=str(server.workspace))
        with anyio.fail_after(120):
            async with ModernClient(params, mode="auto", extensions=extensions) as c:
                return await scenario(c)

    try:
        return anyio.run(main)
    except BaseExceptionGroup as group:
        raise first_leaf(group) from None


def test_a_job_that_outlives_its_window_is_a_task_polled_to_its_answer(server):
    """A 2 s cell with a 0.3 s window: the client gets a task (its job named in `_meta` and
    the status message), polls it `working` → `completed`, and the result is the answer
    the tool gives for a finished job — output from the job's start, the value, the same
    job_id — equal to what job_output holds. A fast cell is answered at once, no task."""
    ext = Tasks()

    async def scenario(c):
        r = await c.call_tool("python_exec", {"code": SLOW_CELL, "wait_seconds": 0.3})
        assert len(ext.created) == 1, ext.created
        created = ext.created[0]
        job_id = created.meta[JOB_META]
        assert job_id in created.model_extra["statusMessage"], created
        assert ext.statuses[-1] == "completed" and "working" in ext.statuses, ext.statuses
        s = r.structured_content
        assert s["job_id"] == job_id and s["status"] == "completed", s
        assert s["stdout"]["text"] == "0\n1\n2\n" and s["stdout"]["offset"] == 0, s
        assert s["value"] == "'done'" and not r.is_error, s
        whole = (await c.call_tool("job_output", {"job_id": job_id, "offset": 0})).structured_content
        assert whole["text"] == s["stdout"]["text"], (whole, s)
        done = await task_call(c.session, "tasks/get", created.task_id)
        assert done["status"] == "completed" and done["result"]["structuredContent"] == s, done

        # A shell job that fails is a completed task whose result is the failing answer.
        r = await c.call_tool("shell_run", {"command": "sleep 1; echo out; exit 3", "wait_seconds": 0.2})
        assert len(ext.created) == 2
        assert r.is_error and r.structured_content["exit_code"] == 3, r.structured_content
        assert r.structured_content["stdout"]["text"] == "out\n", r.structured_content

        # A wide window (a loaded machine may take more than the default 3 s): a cell
        # that ends within it is answered at once, with no task.
        r = await c.call_tool("python_exec", {"code": "6*7", "wait_seconds": 60})
        assert len(ext.created) == 2 and r.structured_content["value"] == "42"

    run_modern(server, scenario, [ext])


def test_cancel_of_a_running_task_ends_its_job(server):
    """tasks/cancel on the task of a looping cell: the task settles `cancelled`, the job is
    cancelled (as job_cancel does) and the session is free again."""

    async def scenario(c):
        created = await c.session.call_tool(
            "python_exec", {"code": "while True: pass", "wait_seconds": 0.3}, allow_claimed=True
        )
        assert isinstance(created, TaskCreated), created
        job_id = created.meta[JOB_META]
        assert (await task_call(c.session, "tasks/get", created.task_id))["status"] == "working"
        await task_call(c.session, "tasks/cancel", created.task_id)
        got = await poll(c.session, created.task_id, {"cancelled", "completed", "failed"})
        assert got["status"] == "cancelled", got
        job = (await c.call_tool("job_wait", {"job_id": job_id})).structured_content
        assert job["status"] == "cancelled", job
        r = await c.call_tool("python_exec", {"code": "1+1"})
        assert r.structured_content["value"] == "2", r.structured_content

    run_modern(server, scenario, [Tasks()])


def test_input_is_asked_as_input_required_and_answered_with_tasks_update(server):
    """A cell calling input() mid-task: tasks/get says `input_required` with an elicitation
    naming the prompt; tasks/update answers it and the task completes with the answer.
    An input answered through job_input instead withdraws the request."""

    async def scenario(c):
        code = "import time\ntime.sleep(0.5)\nname = input('name? ')\nprint('hi', name)\nname"
        created = await c.session.call_tool("python_exec", {"code": code, "wait_seconds": 0.2}, allow_claimed=True)
        assert isinstance(created, TaskCreated), created
        got = await poll(c.session, created.task_id, {"input_required", "completed", "failed"})
        assert got["status"] == "input_required", got
        ((key, request),) = got["inputRequests"].items()
        assert request["method"] == "elicitation/create" and "name? " in request["params"]["message"], request
        await task_call(
            c.session,
            "tasks/update",
            created.task_id,
            input_responses={key: {"action": "accept", "content": {"text": "Ada"}}},
        )
        got = await poll(c.session, created.task_id, {"completed", "failed", "cancelled"})
        s = got["result"]["structuredContent"]
        assert s["value"] == "'Ada'" and "hi Ada" in s["stdout"]["text"], s

        # getpass asks for a secret: the request says so; the answer shows nowhere.
        created = await c.session.call_tool(
            "python_exec", {"code": "import getpass\npw = getpass.getpass('pw: ')\nlen(pw)", "wait_seconds": 0.2},
            allow_claimed=True,
        )
        got = await poll(c.session, created.task_id, {"input_required"})
        ((key, request),) = got["inputRequests"].items()
        assert "secret" in request["params"]["message"], request
        await task_call(
            c.session, "tasks/update", created.task_id,
            input_responses={key: {"action": "accept", "content": {"text": "hunter2-XYZ"}}},
        )
        got = await poll(c.session, created.task_id, {"completed", "failed", "cancelled"})
        assert got["result"]["structuredContent"]["value"] == "11", got
        assert "hunter2-XYZ" not in json.dumps(got), got

        # Answered with job_input: the task goes back to working, then completes.
        created = await c.session.call_tool(
            "python_exec", {"code": "input('again? ')", "wait_seconds": 0.2}, allow_claimed=True
        )
        assert isinstance(created, TaskCreated), created
        await poll(c.session, created.task_id, {"input_required"})
        job_id = created.meta[JOB_META]
        await c.call_tool("job_input", {"job_id": job_id, "text": "Bob"})
        got = await poll(c.session, created.task_id, {"completed", "failed", "cancelled"})
        assert got["result"]["structuredContent"]["value"] == "'Bob'", got

    run_modern(server, scenario, [Tasks()])


def test_clients_without_tasks_get_the_running_report(server):
    """Neither a legacy client nor a 2026 client that does not declare the extension gets a
    task: the same call answers `running` with a job_id, and tasks/get is refused."""

    async def legacy(c):
        r = await c.py(SLOW_CELL, wait_seconds=0.3)
        assert r["status"] == "running" and r["job_id"], r
        await c.finish(r)

    server.run(legacy)

    async def modern(c):
        r = await c.call_tool("python_exec", {"code": SLOW_CELL, "wait_seconds": 0.3})
        s = r.structured_content
        assert s["status"] == "running" and s["job_id"], s
        try:
            await task_call(c.session, "tasks/get", "no-such-task")
        except MCPError as e:  # the server requires the client capability for tasks/*
            assert e.code == -32021, (e.code, e.message)
        else:
            raise AssertionError("tasks/get answered a client that did not declare tasks")
        await c.call_tool("job_wait", {"job_id": s["job_id"], "until_done": True})

    run_modern(server, modern)


def test_hostile_task_requests_are_refused(server):
    """Unknown task ids, and answers for input keys that were never asked, are refused or
    ignored without harm."""

    async def scenario(c):
        for method in ("tasks/get", "tasks/cancel"):
            try:
                await task_call(c.session, method, "../../etc/passwd")
            except MCPError as e:
                assert e.code == -32602 and "unknown task" in e.message, (e.code, e.message)
            else:
                raise AssertionError(f"{method} accepted an unknown task")
        created = await c.session.call_tool(
            "python_exec", {"code": SLOW_CELL, "wait_seconds": 0.2}, allow_claimed=True
        )
        await task_call(
            c.session, "tasks/update", created.task_id, input_responses={"input-99": {"action": "accept"}}
        )
        got = await poll(c.session, created.task_id, {"completed", "failed", "cancelled"})
        assert got["status"] == "completed" and got["result"]["structuredContent"]["value"] == "'done'", got

    run_modern(server, scenario, [Tasks()])


def test_a_task_resolves_from_another_mcp_session_over_http(server):
    """Over HTTP the tasks are the app's, not a connection's: a task created in one MCP
    session (a client that declares the extension) is resolved by `tasks/get` in another
    session, as a 2026-07-28 request — a connection of its own — must (SEP-2663). It was
    `unknown task`: tasks lived in a per-connection manager. Raw JSON-RPC over HTTP: the
    SDK declares extensions only in its 2026 mode, which needs per-request headers its
    custom requests do not send."""
    import time
    import urllib.request

    from conftest import start_http

    proc, url, _ = start_http(server, "--no-auth")

    def rpc(body: dict, sid: str | None = None) -> tuple[dict, str | None]:
        req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if sid:
            headers |= {"Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-11-25"}
        for k, v in headers.items():
            req.add_header(k, v)
        with urllib.request.urlopen(req, timeout=60) as r:
            text = r.read().decode()
            sid = r.headers.get("mcp-session-id") or sid
        for line in text.splitlines():  # an SSE stream or a plain JSON body
            line = line.removeprefix("data:").strip()
            if line.startswith("{") and '"id"' in line:
                return json.loads(line), sid
        return {}, sid

    def session() -> str:
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "clientInfo": {"name": "raw", "version": "1"},
            "capabilities": {"extensions": {TASKS: {}}}}}
        _, sid = rpc(init)
        rpc({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
        return sid

    try:
        a = session()
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "shell_run", "arguments": {"command": "sleep 1; echo done", "wait_seconds": 0.2}}}
        created, _ = rpc(call, a)
        assert created["result"].get("resultType") == "task", created
        task = created["result"]["taskId"]
        b = session()
        deadline = time.monotonic() + 60
        while True:
            got, _ = rpc({"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"taskId": task}}, b)
            assert "result" in got, got
            if got["result"]["status"] == "completed":
                break
            assert time.monotonic() < deadline, got
            time.sleep(0.2)
        assert got["result"]["result"]["structuredContent"]["stdout"]["text"] == "done\n", got
    finally:
        proc.terminate()
        proc.wait(timeout=30)
