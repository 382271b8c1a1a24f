"""Bounded history through a real client: job_list pages with a cursor within the
response cap, retention (--keep-jobs) removes the oldest finished jobs, silent ones too,
and both survive a restart (the index)."""

import json
import time

import pytest


def test_job_list_pages_with_a_cursor_and_stays_within_the_response_cap(server):
    server.env["MCP_SANDBOX_RESPONSE_BYTES"] = "4000"

    async def scenario(c):
        made = []
        for i in range(30):
            job = await c.ok("python_exec", code=f"# {'x' * 150}\n{i}")
            made.append(job["job_id"])
        seen, cursor, pages = [], None, 0
        while True:
            args = {"limit": 10} if cursor is None else {"limit": 10, "cursor": cursor}
            res = await c.call("job_list", **args)
            assert not res.is_error
            page = res.structured_content
            text = "\n".join(getattr(x, "text", "") for x in res.content)
            assert len(text) <= 4000 + 500, len(text)
            assert 1 <= len(page["jobs"]) <= 10
            seen += [j["job_id"] for j in page["jobs"]]
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
            assert f"cursor=\"{cursor}\"" in text
        assert seen == list(reversed(made)), "every job once, newest first"
        assert pages > 3, "the response cap, not only the limit, ends pages"
        err = await c.err("job_list", cursor="../etc")
        assert "not a job id" in err and "next_cursor" in err
        past = await c.ok("job_list", cursor="j1")
        assert past["jobs"] == [] and past["next_cursor"] is None

    server.run(scenario)


def test_retention_removes_the_oldest_finished_jobs_even_silent_ones(server):
    server.env["MCP_SANDBOX_KEEP_JOBS"] = "5"

    async def scenario(c):
        ids = []
        for i in range(8):
            job = await c.ok("python_exec", code="pass" if i % 2 else "print('out')")
            ids.append(job["job_id"])
        listed = [j["job_id"] for j in (await c.ok("job_list"))["jobs"]]
        assert listed == list(reversed(ids[-5:])), listed
        assert "no job" in (await c.err("job_wait", job_id=ids[0])).lower()
        return ids

    ids = server.run(scenario)

    async def again(c):
        listed = [j["job_id"] for j in (await c.ok("job_list"))["jobs"]]
        assert listed == list(reversed(ids[-5:])), listed

    server.run(again)


def _record(n: int, status: str, label: str) -> str:
    return json.dumps({
        "version": 1, "id": f"j{n}", "kind": "shell", "session": None, "label": label,
        "status": status, "prompt": None, "exit_code": 0 if status == "completed" else None,
        "signal": None, "message": None, "created_unix_ms": int(time.time() * 1000) - 1000,
        "elapsed_ms": 1, "delivered": [0, 0], "has_result": False, "bytes": [0, 0],
    })


@pytest.mark.parametrize("first", ["job_list", "job_wait", "python_exec"])
def test_a_large_history_is_all_there_for_the_first_call(server, first):
    """The job table is read after start-up (on a thread of its own, or by the first call
    that needs it): whichever call comes first right after initialize sees the whole
    history, the job that was running when the last server died as `lost`, and new jobs
    get ids after every id ever used. Torn and foreign lines in the index are skipped."""
    jobs = server.state_dir / "jobs"
    jobs.mkdir()
    lines = [_record(n, "completed", f"old {n}") for n in range(1, 3001)]
    lines.insert(1500, _record(3001, "running", "sleep 300"))
    lines.insert(10, "this is not json")
    lines.insert(20, '{"version": 99, "id": "j5000"}')
    lines.append(json.dumps({**json.loads(_record(3002, "completed", "gone")), "removed": True}))
    (jobs / "index.log").write_text("\n".join(lines) + '\n{"version":1,"id":"j30')

    async def scenario(c):
        if first == "job_list":
            page = await c.ok("job_list", status="lost")
            assert [j["job_id"] for j in page["jobs"]] == ["j3001"]
        elif first == "job_wait":
            lost = await c.call("job_wait", job_id="j3001", timeout_seconds=0)
            assert lost.structured_content["status"] == "lost", lost
        else:
            job = await c.ok("python_exec", code="1")
            number, _, tag = job["job_id"].partition("-")
            assert number == "j3003", "ids after the removed j3002, not reused"
            assert len(tag) == 5, "a new id has its random part"
        old = await c.ok("job_wait", job_id="j1", timeout_seconds=0)
        assert old["status"] == "completed"
        count, cursor = 0, None
        while True:
            page = await c.ok("job_list", limit=500, **({"cursor": cursor} if cursor else {}))
            count += len(page["jobs"])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert count == 3001 + (first == "python_exec"), count

    server.run(scenario)
    index = (jobs / "index.log").read_text()
    assert any('"id":"j3001"' in l and '"status":"lost"' in l for l in index.splitlines()), \
        "the lost mark is written"
