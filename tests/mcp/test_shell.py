"""Shell jobs through MCP: inline answers, long-poll, stdin, EOF, cancel, env, policy, bad input."""

import asyncio
import os
import time
import uuid

import anyio

from conftest import REPO, pids_with_env_marker


def test_echo_answers_inline(server):
    async def scenario(c):
        r = await c.ok("shell_run", command="echo hi")
        assert (r["status"], r["exit_code"], r["stdout"]["text"]) == ("completed", 0, "hi\n")
        assert r.get("next") is None
        r = await c.ok("shell_run", argv=["printf", "%s|", "a b", "c"])
        assert r["stdout"]["text"] == "a b|c|"
        res = await c.call("shell_run", command="echo oops >&2; exit 3")
        r = res.structured_content
        assert res.is_error and r["status"] == "failed" and r["exit_code"] == 3 and r["stderr"]["text"] == "oops\n"

    server.run(scenario)


def test_ticking_loop_is_collected_by_long_poll(server):
    """A five-tick loop returns a job id; job_wait returns as each tick arrives (no blind
    polling) and together they collect every tick."""

    async def scenario(c):
        r = await c.ok("shell_run", command="for i in 1 2 3 4 5; do echo tick $i; sleep 1; done", wait_seconds=1.5)
        assert r["status"] == "running" and "job_wait" in r["next"]
        polls = 0
        seen = r["stdout"]["text"]
        while r["status"] == "running":
            r = await c.ok("job_wait", job_id=r["job_id"], timeout_seconds=30)
            polls += 1
            # On output, not at the end of its 30 s window (no tick is 30 s apart, however
            # slow the machine is): a poll that answers "running" brings new output.
            assert r["status"] != "running" or r["stdout"]["text"], r
            seen += r["stdout"]["text"]
        assert r["status"] == "completed" and r["exit_code"] == 0
        assert seen == "".join(f"tick {i}\n" for i in range(1, 6))
        assert polls >= 2

    server.run(scenario)


def test_until_done_collects_everything_in_one_answer(server):
    async def scenario(c):
        r = await c.ok("shell_run", command="for i in 1 2 3; do echo t$i; sleep 0.4; done", wait_seconds=0)
        r = await c.ok("job_wait", job_id=r["job_id"], until_done=True, timeout_seconds=30)
        assert r["status"] == "completed"
        assert r["stdout"]["text"].endswith("t3\n")

    server.run(scenario)


def test_read_stdin_and_cat_with_eof(server):
    async def scenario(c):
        r = await c.ok("shell_run", command="read a; echo got $a", wait_seconds=0.5)
        assert r["status"] == "running"
        # Windows wide enough for a loaded machine: each call returns when its job ends.
        r = await c.ok("job_input", job_id=r["job_id"], text="hello\n", wait_seconds=60)
        assert r["status"] == "completed" and r["stdout"]["text"] == "got hello\n"

        r = await c.ok("shell_run", command="cat", wait_seconds=0.3)
        r = await c.ok("job_input", job_id=r["job_id"], text="line one\n", wait_seconds=0.5)
        assert r["status"] == "running", r
        # cat echoes the line when it gets to it (maybe after the 0.5 s window): collect it.
        echoed = r["stdout"]["text"]
        while echoed != "line one\n":
            assert "line one\n".startswith(echoed), echoed
            w = await c.ok("job_wait", job_id=r["job_id"], timeout_seconds=30)
            assert w["status"] == "running", w
            echoed += w["stdout"]["text"]
        r = await c.ok("job_input", job_id=r["job_id"], text="last", eof=True, wait_seconds=60)
        assert r["status"] == "completed" and r["stdout"]["text"] == "last"

        r = await c.ok("shell_run", command="tr a-z A-Z", stdin="abc\n", stdin_eof=True, wait_seconds=60)
        assert r["stdout"]["text"] == "ABC\n"
        msg = await c.err("job_input", job_id=r["job_id"], text="late")
        assert r["job_id"] in msg and "finished" in msg

    server.run(scenario)


def test_cancel_kills_children_that_ignore_sigterm(server):
    marker = f"mark-{uuid.uuid4().hex}"

    async def scenario(c):
        cmd = "trap '' TERM; (trap '' TERM; sleep 300) & sleep 300; wait"
        r = await c.ok("shell_run", command=cmd, env={"MCP_TEST_MARK": marker}, wait_seconds=0.5)
        assert r["status"] == "running"
        # The shell forks its subshell and sleeps when it gets to it (a loaded machine may
        # take longer than the 0.5 s window): wait for them, so the cancel has them to kill.
        deadline = time.monotonic() + 60
        while len(pids_with_env_marker(marker)) < 3:
            assert time.monotonic() < deadline, pids_with_env_marker(marker)
            await anyio.sleep(0.05)
        t0 = time.monotonic()
        r = await c.ok("job_cancel", job_id=r["job_id"])
        assert r["status"] == "cancelled", r
        assert time.monotonic() - t0 < 60, "the cancel waited for the 300 s sleeps"
        # The sleeps last 300 s: a generous poll still tells "killed" from "left behind".
        deadline = time.monotonic() + 30
        while pids_with_env_marker(marker) and time.monotonic() < deadline:
            await anyio.sleep(0.05)
        assert pids_with_env_marker(marker) == []

    server.run(scenario)


def test_env_dict_env_file_and_cwd(server):
    (server.workspace / "sub").mkdir()
    (server.workspace / ".env").write_text("# comment\nA=from_file\nB='quoted value'\n")
    (server.workspace / "bad.env").write_text("OK=1\nthis line is wrong\n")

    async def scenario(c):
        r = await c.ok("shell_run", command='echo "$A|$B|$C|$(basename $PWD)"', env_file=".env",
                       env={"A": "from_dict", "C": "c"}, cwd="sub")
        assert r["stdout"]["text"] == "from_dict|quoted value|c|sub\n"
        msg = await c.err("shell_run", command="true", env_file="bad.env")
        assert "bad.env" in msg and ":2" in msg
        msg = await c.err("shell_run", command="true", cwd="no/such/dir")
        assert "no/such/dir" in msg
        assert "both" in await c.err("shell_run", command="true", argv=["true"])

    server.run(scenario)


def test_env_file_variables_expand_from_the_file_only(server):
    """`${VAR}` in a .env names an earlier key of the file; a name the file does not set is
    an error in words, never the server's own environment (the server's MCP_SANDBOX_* and
    HOME are there, and must not reach a job through a .env)."""
    (server.workspace / ".env").write_text('BASE=/srv\nURL=${BASE}/api\nQ="$URL?x=1"\n')
    (server.workspace / "leak.env").write_text("STOLEN=${MCP_SANDBOX_STATE_DIR}\n")

    async def scenario(c):
        r = await c.ok("shell_run", command='echo "$URL|$Q"', env_file=".env")
        assert r["stdout"]["text"] == "/srv/api|/srv/api?x=1\n", r
        msg = await c.err("shell_run", command="echo $STOLEN", env_file="leak.env")
        assert "leak.env:1" in msg and "$MCP_SANDBOX_STATE_DIR names no variable" in msg, msg
        assert str(server.state_dir) not in msg, msg

    server.run(scenario)


def test_policy_applies_to_shell_jobs(server):
    async def scenario(c):
        res = await c.call("shell_run", command="echo x > /etc/mcp-sandbox-shell-test")
        assert res.is_error and res.structured_content["exit_code"] != 0
        assert not os.path.exists("/etc/mcp-sandbox-shell-test")
        r = await c.ok("shell_run", command="echo ok > inside.txt && cat inside.txt")
        assert r["stdout"]["text"] == "ok\n"
        res = await c.call("shell_run", argv=["python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)"])
        assert res.is_error

    server.run(scenario)


def test_unknown_job_ids_are_clear_errors(server):
    async def scenario(c):
        for tool in ("job_wait", "job_cancel", "job_output"):
            msg = await c.err(tool, job_id="j999")
            assert "j999" in msg, msg
        msg = await c.err("job_input", job_id="j999", text="x")
        assert "j999" in msg

    server.run(scenario)



def test_each_shell_job_gets_its_own_private_tmp(server):
    """Shell jobs do not share a temp dir: a file one job leaves in $TMPDIR (also seen at
    /tmp) is invisible to the next job. Under the default policy the dir is a tmpfs in the
    job's own view, a name only: every job may have the same one, and nothing of it is on
    the host."""

    async def scenario(c):
        r = await c.ok("shell_run", command='echo secret > "$TMPDIR/x"; echo "$TMPDIR"; stat -f -c %T "$TMPDIR"')
        tmp1, kind = r["stdout"]["text"].split()
        assert os.path.isabs(tmp1) and kind == "tmpfs", r
        assert not os.path.exists(tmp1), f"{tmp1} is on the host"
        r = await c.ok("shell_run", command='cat "$TMPDIR/x" /tmp/x 2>&1; ls -A "$TMPDIR"; true')
        assert "secret" not in r["stdout"]["text"], r

    server.run(scenario)


def test_without_a_tmpfs_each_shell_job_gets_a_host_dir_of_its_own(server):
    """A policy without `tmp_size`: each job's $TMPDIR is a directory of its own on the
    host, invisible to the next job and removed once the job has ended."""
    text = (REPO / "policies" / "workspace-write.toml").read_text()
    assert 'tmp_size = "1GiB"' in text
    policy = server.root / "host-tmp.toml"
    policy.write_text(text.replace('tmp_size = "1GiB"', ""))

    async def scenario(c):
        r = await c.ok("shell_run", command='echo secret > "$TMPDIR/x"; echo "$TMPDIR"')
        tmp1 = r["stdout"]["text"].strip()
        assert tmp1 and os.path.isabs(tmp1), r
        r = await c.ok("shell_run", command='echo "$TMPDIR"; cat "$TMPDIR/x" /tmp/x 2>&1; true')
        out = r["stdout"]["text"]
        assert tmp1 not in out and "secret" not in out, out
        # Removing a directory can be slow on a loaded machine (deletes cost TRIM here): the
        # deadline only guards a directory that is never removed.
        deadline = time.monotonic() + 60
        while os.path.exists(tmp1) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not os.path.exists(tmp1), f"{tmp1} left behind"

    server.run(scenario, "--policy", str(policy))


def test_paths_outside_the_mount_view_are_explained(server):
    """`mkdir /var/x` fails with a bare ENOENT because the mount view does not show /var
    (the host has it); the answer says the path is not visible and how to change that, for
    shell jobs and cells alike. An ordinary ENOENT inside a visible path, or of a path the
    host lacks too, gets no such note."""

    async def scenario(c):
        res = await c.call("shell_run", command="mkdir /var/mcp-sandbox-x")
        denied = res.structured_content.get("denied", [])
        assert res.is_error and len(denied) == 1, res.structured_content
        assert denied[0].startswith("blocked by policy workspace-write: /var is not visible in the sandbox"), denied
        assert "read or write paths" in denied[0], denied
        r = await c.py("import os; os.listdir('/var/lib')")
        assert r["status"] == "failed", r
        assert any("/var/lib is not visible" in d or "/var is not visible" in d for d in r.get("denied", [])), r
        for ordinary in ("ls /usr/no-such-name-here", "cat /no-such-top-dir-xyz/a", "mkdir nope/x"):
            res = await c.call("shell_run", command=ordinary)
            assert res.is_error, ordinary
            assert "denied" not in res.structured_content, (ordinary, res.structured_content)

    server.run(scenario)


def test_denials_are_explained_in_words(server):
    """A write outside the workspace fails with the kernel's bare EROFS; the answer adds a
    sentence naming the policy and the path, for shell jobs and Python cells alike, and
    says nothing of the sort for an ordinary failure."""

    async def scenario(c):
        res = await c.call("shell_run", command="echo x > /usr/denied-by-policy")
        denied = res.structured_content.get("denied", [])
        assert res.is_error and len(denied) == 1, res.structured_content
        assert denied[0].startswith("blocked by policy workspace-write: write to /usr/denied-by-policy"), denied
        assert "blocked by policy" in res.content[0].text
        r = await c.py("open('/etc/denied-by-policy', 'w')")
        assert r["status"] == "failed"
        assert any("write to /etc/denied-by-policy" in d for d in r.get("denied", [])), r
        r = await c.py("import socket; socket.socket(socket.AF_INET, socket.SOCK_STREAM)")
        assert any("network access (network is off" in d for d in r.get("denied", [])), r
        res = await c.call("shell_run", command="exit 4")
        assert res.is_error and "denied" not in res.structured_content

    server.run(scenario)
