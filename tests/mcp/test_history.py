"""Bounded history through a real client: job_list pages with a cursor within the
response cap, retention (--keep-jobs) removes the oldest finished jobs, silent ones too,
and both survive a restart (the index)."""

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
