"""A full state disk is an error in words and loses nothing already written: with the
state directory on a 20 MB tmpfs, a job printing 100 MB ends `failed` with "state directory
is full (<path>): output truncated at byte N", earlier jobs stay readable, the server
keeps answering, new jobs are refused in words before they run while the disk stays full,
jobs that end while it is full keep their records, and every job record survives a restart.

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
        # The first job filled the disk: the second is refused before it runs, in words.
        res = await c.call("shell_run", command=SH_100MB)
        text = " ".join(getattr(x, "text", "") for x in res.content)
        assert res.is_error and f"state directory is full ({state})" in text, text
        for job in (py,):
            msg = job.get("message") or ""
            assert job["status"] == "failed", (job["status"], msg)
            m = re.search(r"state directory is full \((.*?)\): output truncated at byte (\d+)", msg)
            assert m, msg
            # The first job filled the disk; the second may find no room at all (byte 0).
            assert m.group(1) == state and 0 <= int(m.group(2)) < 20 << 20, msg
            job["kept"] = int(m.group(2))
            assert "disk cap" not in msg
        assert py["kept"] > 0, "the first job kept what fit"
        seen["full"] = [py["job_id"]]
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


def fill(path: str) -> None:
    """Write `path` until the file system refuses (what another process filling the disk does)."""
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"z" * (1 << 16))
                f.flush()
        except OSError:
            pass


def test_new_jobs_are_refused_in_words_before_they_run_while_the_state_disk_is_full(small_state):
    """Filled from outside (no job of ours ever hit ENOSPC): a Python cell and a shell job
    are refused in words and do not run (their side effect in the workspace never appears);
    once there is room again, both run.

    A shell job killed at once after it started may or may not have done its work, so the
    marker alone shows a refusal after the start only sometimes. The exec of a program
    reads its file, which moves the file's access time (relatime: the time is set older
    than the file's change time): a program whose access time stays put was never started."""
    server = small_state
    state = str(server.state_dir)
    prog = server.workspace / "prog.sh"
    prog.write_text("#!/bin/sh\necho x > prog-ran\n")
    prog.chmod(0o755)

    async def scenario(c):
        warm = await c.py("1")
        assert warm["status"] == "completed", warm
        os.utime(prog, (0, prog.stat().st_mtime))
        fill(os.path.join(state, "filler"))
        res = await c.call("shell_run", argv=[str(prog)])
        text = " ".join(getattr(x, "text", "") for x in res.content)
        assert res.is_error and f"state directory is full ({state})" in text, text
        assert prog.stat().st_atime == 0, f"shell_run started its program on a full disk: {text}"
        for tool, args, marker in (
            ("python_exec", {"code": "open('py-ran', 'w').write('x')"}, "py-ran"),
            ("shell_run", {"command": "echo x > sh-ran"}, "sh-ran"),
        ):
            res = await c.call(tool, **args)
            text = " ".join(getattr(x, "text", "") for x in res.content)
            assert res.is_error and f"state directory is full ({state})" in text, (tool, text)
            assert not (server.workspace / marker).exists(), f"{tool} ran its code on a full disk: {text}"
        os.unlink(os.path.join(state, "filler"))
        ok = await c.py("open('py-ran', 'w').write('x')")
        assert ok["status"] == "completed", ok
        sh = await c.ok("shell_run", command="echo x > sh-ran", wait_seconds=30)
        assert sh["status"] == "completed", sh
        ran = await c.ok("shell_run", argv=[str(prog)], wait_seconds=30)
        assert ran["status"] == "completed" and prog.stat().st_atime != 0, ran
        assert (server.workspace / "py-ran").exists() and (server.workspace / "sh-ran").exists()

    server.run(scenario)


def test_a_job_that_ends_while_the_disk_is_full_keeps_its_true_status_after_a_restart(small_state):
    server = small_state
    state = str(server.state_dir)
    seen = {}

    async def first(c):
        waiting = []
        for i in range(12):
            j = await c.ok("shell_run", command=f"while [ ! -e go ]; do sleep 0.05; done; echo end{i}", wait_seconds=0.2)
            assert j["status"] == "running", j
            waiting.append(j["job_id"])
        for i in range(3):
            code = "import os, time\nwhile not os.path.exists('go'): time.sleep(0.05)\nprint('end')"
            j = await c.ok("python_exec", code=code, session=f"s{i}", wait_seconds=0.2)
            assert j["status"] == "running", j
            waiting.append(j["job_id"])
        # Jobs running all along end while the disk is full: a job fills it first (and
        # the record reserve is released), then another process takes what is left.
        full = await c.call("shell_run", command=SH_100MB, wait_seconds=30)
        job = full.structured_content
        while job["status"] == "running":
            job = (await c.call("job_wait", job_id=job["job_id"], timeout_seconds=30)).structured_content
        fill(os.path.join(state, "filler"))
        (server.workspace / "go").write_text("")
        seen["waiting"] = {}
        for job_id in waiting:
            done = (await c.call("job_wait", job_id=job_id, timeout_seconds=60)).structured_content
            # It ran to its end (exit 0); its output found no room: failed, in words.
            assert done["status"] in ("completed", "failed") and done.get("exit_code") in (0, None), done
            seen["waiting"][job_id] = done["status"]

    server.run(first)

    async def second(c):
        listed = await c.ok("job_list")
        after = {j["job_id"]: j["status"] for j in listed["jobs"]}
        assert {j: after.get(j) for j in seen["waiting"]} == seen["waiting"], after

    server.run(second)
