"""Environments through a real MCP client: a session venv managed by uv, a local package
installed as a job with progress notifications and imported in the same session with its
variables intact; one-off scripts with declared and PEP 723 dependencies; clear errors for
an unknown package and a missing Python; the sandbox keeps session code out of the venv
and off the network although the installer had both.

No package index is used: wheels are built here and uv runs with
`--offline --no-index --find-links` (through UV_* variables the server forwards to uv).
Set MCP_SANDBOX_TEST_REAL_INDEX=1 to also run the test that installs from the real index.
"""

import os
import time
from pathlib import Path

import anyio
import pytest
from conftest import descendants


def test_install_into_session_is_a_job_with_progress_and_keeps_state(offline):
    """A session's own venv gets a local package through env_install (a normal job, with
    progress notifications); the session imports it at once and keeps its variables."""

    async def scenario(c):
        r = await c.py("before = 41 + 1")
        assert r["status"] == "completed", r
        seen = []

        async def progress(value, total, message):
            seen.append((value, total, message))

        res = await c.call("env_install", packages=["tinypkg"], progress=progress)
        job = res.structured_content
        assert not res.is_error, job
        assert job["kind"] == "install" and job["session"] == "default"
        job = await c.finish(job)
        assert job["status"] == "completed", job
        assert "tinypkg==0.1" in job["result"]["installed"]
        assert job["result"]["activated"] is True, job
        assert "importable now" in job["message"]
        values = [v for v, _, _ in seen]
        assert values and values == sorted(values) and len(set(values)) == len(values), seen
        assert any(m and m.startswith("Resolved") for _, _, m in seen), seen
        # The install's own steps end at 3; the wait's heartbeats ("job j2 running: ...")
        # may come between and after them on a loaded machine (the activation cell runs
        # after the last step), nudged just above the last amount sent.
        steps = [v for v, _, m in seen if not (m or "").startswith("job ")]
        assert steps[-1] == 3.0, seen

        r = await c.py("import tinypkg\n(before, tinypkg.__version__)")
        assert r["status"] == "completed", r
        assert r["value"] == "(42, '0.1')"

        listed = await c.ok("job_list", kind="install")
        assert [j["job_id"] for j in listed["jobs"]] == [job["job_id"]]
        info = await c.ok("env_info")
        assert info["venv"]["site_packages"].startswith(str(offline.state_dir))

    offline.run(scenario)


def test_every_later_worker_of_the_session_sees_the_venv(offline):
    """After one env_install, a restarted session, the worker after a crash (kill -9) and
    the session started again after session_close all import the package without a
    second install; another session does not see it."""

    async def scenario(c):
        r = await c.py("warm = 1")  # the session now keeps a spare worker
        assert r["status"] == "completed", r
        job = await c.finish(await c.ok("env_install", packages=["tinypkg"]))
        assert job["status"] == "completed" and job["result"]["activated"] is True, job
        sp = job["result"]["site_packages"]
        check = f"import sys, tinypkg\n(tinypkg.__version__, sys.path.count({sp!r}))"

        await c.ok("session_restart")
        r = await c.py(check)
        assert r["status"] == "completed" and r["value"] == "('0.1', 1)", r

        res = await c.call("python_exec", code="import os; os.kill(os.getpid(), 9)")
        assert res.is_error, res.structured_content
        r = await c.py(check)
        assert r["status"] == "completed" and r["state_lost"] is True, r
        assert r["value"] == "('0.1', 1)", r
        # Twice in a row, so one of the workers is started on demand, not the spare.
        await c.call("python_exec", code="import os; os.kill(os.getpid(), 9)")
        await c.call("python_exec", code="import os; os.kill(os.getpid(), 9)")
        r = await c.py(check)
        assert r["value"] == "('0.1', 1)", r

        await c.ok("session_close", session="default")
        r = await c.py(check)
        assert r["value"] == "('0.1', 1)", r

        r = await c.py("import tinypkg", session="other")
        assert r["status"] == "failed" and r["exception"]["ename"] == "ModuleNotFoundError", r

    offline.run(scenario)


def test_a_sessions_venv_is_active_again_after_a_server_restart(offline):
    """The managed venv outlives the server: the next server's session (the prewarmed
    default one and one started on demand) imports its packages without an install."""

    async def install(c):
        for session in ("default", "named"):
            job = await c.finish(await c.ok("env_install", packages=["tinypkg"], session=session))
            assert job["status"] == "completed", job

    async def use(c):
        for session in ("default", "named"):
            r = await c.py("import tinypkg; tinypkg.__version__", session=session)
            assert r["status"] == "completed" and r["value"] == "'0.1'", (session, r)
        r = await c.py("import tinypkg", session="fresh")
        assert r["status"] == "failed", r

    offline.run(install)
    offline.run(use)


def test_failed_resolution_is_a_failed_job_with_uvs_explanation(offline):
    async def scenario(c):
        res = await c.call("env_install", packages=["nosuchpkg-xyz"])
        job = await c.finish(res.structured_content)
        assert job["status"] == "failed", job
        assert "nosuchpkg-xyz" in job["message"] and "unsatisfiable" in job["message"], job
        msg = await c.err("env_install", packages=["--index-url=http://example.com"])
        assert "looks like an option" in msg

    offline.run(scenario)


def test_one_off_scripts_with_dependencies(offline):
    """--with style and PEP 723 dependencies both work; args/env reach the script; the
    benchmark reports wall, CPU and peak RSS of the process tree."""

    async def scenario(c):
        job = await c.ok(
            "python_run_script",
            code="import os, sys, tinypkg\nprint(tinypkg.__version__, sys.argv[1:], os.environ['GREETING'])",
            dependencies=["tinypkg"],
            python_version="3.11",
            args=["a", "b c"],
            env={"GREETING": "hi"},
            benchmark=True,
        )
        job = await c.finish(job)
        assert job["status"] == "completed", job
        assert job["all_stdout"] == "0.1 ['a', 'b c'] hi\n"
        bench = job["result"]["benchmark"]
        assert bench["wall_ms"] > 0 and bench["cpu_ms"] > 0 and bench["peak_rss_bytes"] > 1_000_000, bench
        assert "peak RSS" in job["message"]

        script = offline.workspace / "pep723.py"
        script.write_text('# /// script\n# dependencies = ["otherpkg"]\n# ///\nimport otherpkg\nprint("other", otherpkg.__version__)\n')
        job = await c.finish(await c.ok("python_run_script", path="pep723.py"))
        assert job["status"] == "completed", job
        assert job["all_stdout"] == "other 0.2\n"

    offline.run(scenario)


def test_a_script_environment_is_reused_for_the_same_dependencies_and_python(offline):
    """A second run with the same dependencies (in any order) and Python runs in the
    environment the first one built, and says so; other dependencies get another one.
    The environment is not writable by the script."""

    code = (
        "import sys, tinypkg\nprint(sys.prefix)\n"
        "try:\n    open(sys.prefix + '/x', 'w')\n    print('written')\nexcept OSError as e:\n    print('refused', e.errno)"
    )

    async def scenario(c):
        async def run(deps):
            job = await c.finish(await c.ok("python_run_script", code=code, dependencies=deps))
            lines = job["all_stdout"].splitlines()
            assert job["status"] == "completed" and lines[1].startswith("refused"), job
            return job, lines[0]

        first, prefix = await run(["tinypkg"])
        assert not first["result"].get("reused_environment"), first
        again, prefix2 = await run(["tinypkg"])
        assert prefix2 == prefix and again["result"]["reused_environment"] is True, again
        assert "reused the environment" in again["message"], again
        other, prefix3 = await run(["otherpkg", "tinypkg"])
        assert prefix3 != prefix and not other["result"].get("reused_environment"), other
        same, prefix4 = await run(["tinypkg", "otherpkg"])
        assert prefix4 == prefix3 and same["result"]["reused_environment"] is True, same

    offline.run(scenario)


def test_script_errors_are_clear(offline):
    async def scenario(c):
        res = await c.call("python_run_script", code="print(1)", python_version="3.99")
        assert res.is_error
        job = res.structured_content
        assert job["status"] == "failed" and job["result"]["failure"] == "python_unavailable", job["message"]
        assert "Python 3.99 is not available" in job["message"], job

        res = await c.call("python_run_script", code="print(1)", dependencies=["nosuchpkg-xyz"])
        job = res.structured_content
        assert job["status"] == "failed" and job["result"]["failure"] == "environment", job
        assert "nosuchpkg-xyz" in job["message"]

        res = await c.call("python_run_script", code="import time; time.sleep(60)", timeout_seconds=1)
        job = res.structured_content
        assert job["status"] == "failed" and job["result"]["failure"] == "timed_out", job

        assert "not both" in await c.err("python_run_script", code="1", path="x.py")
        assert "does not exist" in await c.err("python_run_script", path="missing.py")

    offline.run(scenario)


def test_session_code_cannot_write_the_venv_nor_reach_the_network(offline):
    """Under workspace-write the installer had network and venv writes; session code has
    neither: writing into the venv and opening a socket are both denied."""

    async def scenario(c):
        job = await c.finish(await c.ok("env_install", packages=["tinypkg"]))
        assert job["status"] == "completed", job
        sp = job["result"]["site_packages"]
        # Denied by Landlock (EACCES) or by the read-only mount view (EROFS).
        denied = ("PermissionError", "OSError")
        r = await c.py(f"open({sp!r} + '/evil.py', 'w').write('x')")
        assert r["status"] == "failed" and r["exception"]["ename"] in denied, r
        r = await c.py(f"import os; os.remove({sp!r} + '/tinypkg/__init__.py')")
        assert r["status"] == "failed" and r["exception"]["ename"] in denied, r
        assert os.path.exists(os.path.join(sp, "tinypkg", "__init__.py"))
        assert not os.path.exists(os.path.join(sp, "evil.py"))
        r = await c.py(
            "import socket\ntry:\n    s = socket.create_connection(('pypi.org', 443), timeout=3); res = 'connected'\n"
            "except OSError as e:\n    res = type(e).__name__\nres"
        )
        assert r["status"] == "completed" and r["value"] != "'connected'", r
        r = await c.py("import tinypkg; tinypkg.__version__")
        assert r.get("value") == "'0.1'", r

    offline.run(scenario)


@pytest.mark.skipif(not os.environ.get("MCP_SANDBOX_TEST_REAL_INDEX"), reason="set MCP_SANDBOX_TEST_REAL_INDEX=1 to use the real package index")
def test_real_index_install_opt_in(server):
    async def scenario(c):
        job = await c.finish(await c.ok("env_install", packages=["six"], wait_seconds=60), timeout=120)
        assert job["status"] == "completed", job
        r = await c.py("import six; six.__name__")
        assert r["value"] == "'six'", r

    server.run(scenario)


def test_missing_uv_is_explained_and_the_rest_keeps_working(server):
    """Without uv the environment tools say how to get it; Python and shell still work."""
    server.env["MCP_SANDBOX_UV"] = str(server.root / "no-such-uv")

    async def scenario(c):
        for tool, args in (("env_install", {"packages": ["x"]}), ("python_run_script", {"code": "print(1)"})):
            msg = await c.err(tool, **args)
            assert "pip install uv" in msg and "no-such-uv" in msg, msg
        info = await c.ok("env_info")
        assert info["uv"] is None and "pip install uv" in info["uv_error"], info
        r = await c.py("1 + 1")
        assert r["value"] == "2", r

    server.run(scenario)


def test_a_long_script_is_a_job_that_can_be_cancelled(offline):
    """A script outliving the wait window comes back as a running job; job_cancel kills
    its whole process tree (uv and Python) and the job ends as cancelled."""

    async def scenario(c):
        job = await c.ok(
            "python_run_script",
            code="import time\nprint('started', flush=True)\ntime.sleep(120)\n",
            dependencies=["tinypkg"],
            wait_seconds=3,
        )
        assert job["status"] == "running", job
        assert "job_wait" in job["next"]
        # The script is running once it says so (uv may take longer than the window to
        # get there on a loaded machine).
        seen = job["stdout"]["text"]
        while "started" not in seen:
            w = await c.ok("job_wait", job_id=job["job_id"], timeout_seconds=30)
            assert w["status"] == "running", w
            seen += w["stdout"]["text"]
        running = [cmdline(p) for p in descendants(c.server_pid)]
        assert [l for l in running if "scripts/script-" in l], running
        done = await c.ok("job_cancel", job_id=job["job_id"])
        assert done["status"] == "cancelled", done
        assert c.server_pid is not None
        # The script sleeps 120 s: a generous poll still tells "killed" from "left".
        deadline = time.monotonic() + 60
        while True:
            left = [cmdline(p) for p in descendants(c.server_pid)]
            left = [l for l in left if "scripts/script-" in l or " run " in l]
            if not left or time.monotonic() > deadline:
                break
            await anyio.sleep(0.1)
        assert not left, left

    offline.run(scenario)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
