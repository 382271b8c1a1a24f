"""A full state disk is an error in words and loses nothing already written: with the
state directory on a 20 MB tmpfs, jobs printing 100 MB end `failed` with "state directory
is full (<path>): output truncated at byte N", earlier jobs stay readable, the server
keeps answering, new jobs fail clearly while the disk stays full, and every job record
survives a restart.

Needs root (mounts a tmpfs)."""

import os
import re
import subprocess

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mounts a tmpfs)")


@pytest.fixture
def small_state(server):
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(server.state_dir)], check=True)
    try:
        yield server
    finally:
        subprocess.run(["umount", "-l", str(server.state_dir)], check=False)


PY_100MB = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(chunk)\nsys.stdout.flush()\nprint('done')"
SH_100MB = "head -c 100000000 /dev/zero | tr '\\0' y; echo done"


def test_full_state_disk_fails_jobs_in_words_and_keeps_every_record(small_state):
    server = small_state
    state = str(server.state_dir)
    seen = {}

    async def first(c):
        early = await c.ok("shell_run", command="echo early-output")
        assert early["status"] == "completed", early
        seen["early"] = early["job_id"]
        async def settle(tool, **args):
            res = await c.call(tool, wait_seconds=30, **args)
            job = res.structured_content
            assert job is not None, "no structured result"
            while job["status"] == "running":
                job = (await c.call("job_wait", job_id=job["job_id"], timeout_seconds=30)).structured_content
            return job

        py = await settle("python_exec", code=PY_100MB)
        sh = await settle("shell_run", command=SH_100MB)
        for job in (py, sh):
            msg = job.get("message") or ""
            assert job["status"] == "failed", (job["status"], msg)
            m = re.search(r"state directory is full \((.*?)\): output truncated at byte (\d+)", msg)
            assert m, msg
            # The first job filled the disk; the second may find no room at all (byte 0).
            assert m.group(1) == state and 0 <= int(m.group(2)) < 20 << 20, msg
            job["kept"] = int(m.group(2))
            assert "disk cap" not in msg
        assert py["kept"] > 0, "the first job kept what fit"
        seen["full"] = [py["job_id"], sh["job_id"]]
        # Earlier jobs stay readable; the server keeps answering.
        again = await c.ok("job_wait", job_id=seen["early"], timeout_seconds=1)
        assert again["status"] == "completed"
        out = await c.ok("job_output", job_id=seen["early"])
        assert "early-output" in str(out), out
        # Fill what is left (the spools stop at the first ENOSPC): new jobs fail in words.
        with open(os.path.join(state, "filler"), "wb") as f:
            try:
                while True:
                    f.write(b"z" * (1 << 20))
                    f.flush()
            except OSError:
                pass
        res = await c.call("shell_run", command="echo late")
        text = " ".join(getattr(x, "text", "") for x in res.content)
        assert res.is_error and f"state directory is full ({state})" in text, text
        assert (await c.ok("job_list"))["jobs"], "the server keeps answering"
        listed = await c.ok("job_list")
        seen["before"] = {j["job_id"]: j["status"] for j in listed["jobs"]}

    server.run(first)
    assert {seen["early"], *seen["full"]} <= set(seen["before"])

    async def second(c):
        listed = await c.ok("job_list")
        after = {j["job_id"]: j["status"] for j in listed["jobs"]}
        for job_id, status in seen["before"].items():
            if status != "running":
                assert after.get(job_id) == status, (job_id, seen["before"], after)
        assert after[seen["early"]] == "completed"
        assert all(after[j] == "failed" for j in seen["full"]), after
        out = await c.ok("job_output", job_id=seen["early"])
        assert "early-output" in str(out), out

    server.run(second)
