"""One server as a cell behind an orchestrator (issue 21): `/healthz` and `/readyz` before
any authentication, a drain on SIGTERM (`/readyz` 503 at once, new jobs refused in words,
running jobs given `--drain-seconds` to finish; SIGINT or a second SIGTERM stops now),
`--router-auth` (no bearer token; every request names this cell in `X-Sandbox-ID`), and
a restart told in words (`state_lost` and a `state_note` on the first call to a session
whose worker died with the previous server). Driven through the real binary with the
official Python SDK (HTTP and stdio). No wall-clock assertions: conditions are waited
for, with generous hang guards."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import anyio
from conftest import INIT, Client, binary, free_port, launch_http, post

GUARD = 120
SHUTTING_DOWN = "this sandbox is shutting down"
# The server's default filter (the harness sets `warn`): its start-up line and the drain.
LOG_FILTER = "warn,mcp_sandbox_repl::server::transport=info,mcp_sandbox_repl::server::drain=info"


def start_http(server, *args, env=None):
    """The server over HTTP on a free loopback port; returns (process, base URL, log)."""
    proc, port, log = launch_http(
        server, *args, env={**server.server_env(), "RUST_LOG": LOG_FILTER, **(env or {})}
    )
    return proc, f"http://127.0.0.1:{port}", log


def get(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_until(cond, what, guard=GUARD):
    deadline = time.monotonic() + guard
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"hang guard: {what}"
        time.sleep(0.05)


async def over_http(url, scenario, headers=None):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    client = create_mcp_http_client(headers=headers or {})
    async with client, streamable_http_client(url, http_client=client) as streams:
        async with ClientSession(streams[0], streams[1]) as s:
            await s.initialize()
            return await scenario(Client(s, None, None))


def run(coro_fn, *args):
    async def main():
        with anyio.fail_after(GUARD):
            return await coro_fn(*args)

    try:
        return anyio.run(main)
    except BaseExceptionGroup as group:
        e = group
        while isinstance(e, BaseExceptionGroup):
            e = e.exceptions[0]
        raise e from None


def gated_python(server):
    """A `python3` shim first on PATH that waits for a gate file before it runs the real
    interpreter: interpreter discovery (and so the default worker's prewarm) waits until
    the test opens the gate, so a start-up `/readyz` 503 is seen for sure."""
    shims = server.root / "shims"
    shims.mkdir()
    gate = server.root / "gate"
    real = shutil.which("python3") or sys.executable
    shim = shims / "python3"
    shim.write_text(f"#!/bin/sh\nwhile [ ! -e '{gate}' ]; do sleep 0.05; done\nexec '{real}' \"$@\"\n")
    shim.chmod(0o755)
    server.env["PATH"] = f"{shims}:{os.environ.get('PATH', '')}"
    return gate


def job_after_restart(server, job_id):
    """The job's record as a fresh server on the same state dir reads it."""
    async def scenario(c):
        return await c.ok("job_wait", job_id=job_id, timeout_seconds=0)

    return server.run(scenario)


def test_readyz_503_then_200_then_503_in_a_drain_that_refuses_new_work_and_lets_a_job_finish(server):
    gate = gated_python(server)
    release = server.workspace / "release"
    proc, base, log = start_http(server, "--no-auth", "--drain-seconds", "600")
    try:
        # Starting: the default worker cannot be up while discovery waits at the gate.
        status, body = get(base + "/readyz")
        assert status == 503 and body.startswith("starting: "), (status, body)
        assert body.count("\n") == 1, body
        assert get(base + "/healthz") == (200, "ok\n")
        gate.touch()
        wait_until(lambda: get(base + "/readyz") == (200, "ready\n"), "readyz never turned 200")

        async def scenario(a):
            job = await a.ok(
                "shell_run", wait_seconds=0,
                command=f"while [ ! -e '{release}' ]; do sleep 0.05; done; echo finished-in-drain",
            )
            assert job["status"] == "running", job
            proc.send_signal(signal.SIGTERM)
            while True:
                status, body = await anyio.to_thread.run_sync(get, base + "/readyz")
                if status == 503:
                    break
                await anyio.sleep(0.05)
            assert body.startswith("draining: ") and SHUTTING_DOWN in body, body
            assert get(base + "/healthz") == (200, "ok\n")
            # New work is refused in words; the running job is still followed.
            for tool, args in [("shell_run", {"command": "echo new"}), ("python_exec", {"code": "1"})]:
                text = await a.err(tool, **args)
                assert SHUTTING_DOWN in text and "job_wait" in text, text
            still = await a.ok("job_wait", job_id=job["job_id"], timeout_seconds=0)
            assert still["status"] == "running", still
            assert proc.poll() is None, "the server stopped before its running job ended"
            return job["job_id"]

        job_id = run(over_http, base + "/mcp", scenario)
        release.touch()
        assert proc.wait(timeout=GUARD) == 0, log.read_text()
        log_text = log.read_text()
        assert "SIGTERM: draining" in log_text and "drained: no job is running" in log_text, log_text
    finally:
        if proc.poll() is None:
            proc.kill()
    done = job_after_restart(server, job_id)
    assert done["status"] == "completed", done
    assert "finished-in-drain" in done["stdout"]["text"], done


def test_a_drain_ends_at_its_window_or_at_sigint_or_a_second_sigterm_and_kills_what_runs(server):
    for how, drain in [("window", "1"), ("second-sigterm", "600"), ("sigint", "600")]:
        proc, base, log = start_http(server, "--no-auth", "--drain-seconds", drain)
        try:
            wait_until(lambda: get(base + "/readyz")[0] == 200, f"{how}: readyz never turned 200")

            async def scenario(a):
                job = await a.ok("shell_run", command="sleep 600", wait_seconds=0)
                assert job["status"] == "running", job
                return job["job_id"]

            job_id = run(over_http, base + "/mcp", scenario)
            if how == "sigint":
                proc.send_signal(signal.SIGINT)
            else:
                proc.send_signal(signal.SIGTERM)
            if how == "second-sigterm":
                wait_until(lambda: get(base + "/readyz")[0] == 503, "readyz never turned 503")
                assert proc.poll() is None, "the first SIGTERM did not drain"
                proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=GUARD) == 0, log.read_text()
            text = log.read_text()
            expect = {
                "window": "drain over after 1 s: stopping 1 job(s) still running",
                "second-sigterm": "second SIGTERM: shutting down now",
                "sigint": "SIGINT: shutting down",
            }[how]
            assert expect in text, (how, text)
            if how == "sigint":
                assert "draining" not in text, text
        finally:
            if proc.poll() is None:
                proc.kill()
        done = job_after_restart(server, job_id)
        assert done["status"] == "cancelled", (how, done)


def test_router_mode_serves_requests_naming_this_cell_and_refuses_others_in_words(server):
    proc, base, log = start_http(server, "--router-auth", env={"MCP_SANDBOX_CELL_ID": "cell-a"})
    try:
        wait_until(lambda: get(base + "/readyz")[0] == 200, "readyz never turned 200")

        async def scenario(a):
            return (await a.ok("python_exec", code="6 * 7"))["value"]

        # Through the router: no bearer token (the router strips it), the cell's id.
        assert run(over_http, base + "/mcp", scenario, {"X-Sandbox-ID": "cell-a"}) == "42"
        status, text = post(base + "/mcp", INIT)
        assert status == 403 and "X-Sandbox-ID" in text and "router" in text, (status, text)
        for wrong in ["cell-b", "CELL-A", "cell-a2", "cell-a,cell-a", ""]:
            status, text = post(base + "/mcp", INIT, {"X-Sandbox-ID": wrong})
            assert status in (403, 421), (wrong, status, text)
            if status == 421:
                assert "misdirected" in text and '"cell-a"' in text and "wrong cell" in text, text
        # A bearer token is no substitute for the cell id.
        status, text = post(base + "/mcp", INIT, {"Authorization": "Bearer anything"})
        assert status == 403, (status, text)
        # Probes need neither.
        assert get(base + "/healthz") == (200, "ok\n")
        assert "router" in log.read_text() and "cell-a" in log.read_text()
    finally:
        proc.kill()
        proc.wait()


def test_router_mode_is_chosen_explicitly_with_a_usable_cell_id(server):
    def refused(*args, env=None):
        r = subprocess.run(
            [binary(), *args], env={**server.server_env(), **(env or {})},
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        )
        assert r.returncode != 0, (args, r.stderr)
        return r.stderr

    http = ["--transport", "http", "--listen", f"127.0.0.1:{free_port()}"]
    assert "--cell-id" in refused(*http, "--router-auth")
    assert "cannot be used with" in refused(*http, "--router-auth", "--cell-id", "a", "--token", "t")
    assert "cannot be used with" in refused(*http, "--router-auth", "--cell-id", "a", "--no-auth")
    text = refused(*http, "--cell-id", "a")
    assert "--router-auth" in text and "not on" in text, text
    text = refused(*http, "--router-auth", "--cell-id", "two words")
    assert "X-Sandbox-ID" in text and "visible ASCII" in text, text
    text = refused("--router-auth", env={"MCP_SANDBOX_CELL_ID": "a"})
    assert "--transport http" in text, text
    text = refused("--drain-seconds", "5")
    assert "--transport http" in text, text
    assert "out of range" in refused(*http, "--drain-seconds", "100000")


def test_a_session_whose_worker_died_with_the_server_says_so_once_and_keeps_its_history(server):
    async def first(c):
        await c.ok("python_exec", code="x = 41")
        await c.ok("python_exec", code="y = x + 1", session="other")
        os.kill(c.server_pid, signal.SIGKILL)

    try:
        server.run(first)
    except Exception:
        pass  # the connection broke: the server was killed on purpose

    async def second(c):
        r = await c.py("x")
        assert r["state_lost"] is True, r
        note = r["state_note"]
        assert re.search(r"the server restarted at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", note), note
        assert "variables are gone" in note and "the venv and the history remain" in note, note
        assert r["cell"] == "c2" and "NameError" in str(r), r
        again = await c.py("1")
        assert not again.get("state_lost"), again
        h = await c.ok("python_history")
        assert [e["cell"] for e in h["cells"]] == ["c1", "c2", "c3"], h
        other = await c.py("y", session="other")
        assert other["state_lost"] is True and "server restarted" in other["state_note"], other
        # A session with no earlier graph has nothing to be told.
        fresh = await c.py("2", session="fresh")
        assert not fresh.get("state_lost"), fresh

    server.run(second)


def test_readyz_turns_200_without_a_client_when_the_client_may_choose_the_sandbox(server):
    """With `--sandbox-state inherit` the default worker waits for what the client says;
    the cell is still ready once what earlier servers left is swept and the job table read."""
    async def earlier(c):
        await c.ok("shell_run", command="echo an earlier job")

    server.run(earlier)  # the state dir now has a job index to read at start
    proc, base, log = start_http(server, "--no-auth", "--sandbox-state", "inherit")
    try:
        wait_until(lambda: get(base + "/readyz") == (200, "ready\n"), "readyz never turned 200")
        assert get(base + "/readyz", {"X-Sandbox-ID": "x"})[0] == 200
        status, text = post(base + "/readyz", INIT)
        assert status == 405 and "GET" in text, (status, text)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=GUARD)


# Exec argv[1:] (same pid) in a user namespace of its own (uid 0 and 65534 mapped to themselves) in
# which no further user namespace may be made (`user.max_user_namespaces` 0 there): a host
# that refuses user namespaces to the server, without touching the host's sysctls.
NO_USER_NAMESPACES = """
import ctypes, os, sys
r, w = os.pipe()
parent = os.getpid()
writer = os.fork()
if writer == 0:  # still root on the host: maps the namespace its parent makes
    os.close(w)
    os.read(r, 1)
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{parent}/{name}", "w") as f:
            f.write("0 0 1\\n65534 65534 1\\n")
    os._exit(0)
if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:
    raise OSError(ctypes.get_errno(), "unshare CLONE_NEWUSER")
os.write(w, b"x")
_, status = os.waitpid(writer, 0)
assert status == 0, "the uid and gid maps were not written"
with open("/proc/sys/user/max_user_namespaces", "w") as f:
    f.write("0")
os.execvp(sys.argv[1], sys.argv[1:])
"""


def test_readyz_is_503_with_the_reason_when_the_policy_cannot_be_enforced_here(server, tmp_path):
    """`/readyz` follows `doctor`: a server whose policy needs what this host does not give
    it (here: run as uid 65534 where user namespaces are refused to it, so no network
    namespace for the broker) is not ready, and says why in one line, instead of a 200 for
    a cell whose every call would be refused. The same server with a policy doctor finds
    enforced here is ready."""
    import json
    import tempfile

    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to run the server as another uid"
    nobody = [sys.executable, "-c", NO_USER_NAMESPACES,
              setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    # The harness's directories are root's (0700 above them): give uid 65534 its own.
    root = tempfile.mkdtemp(prefix="mcp-nobody-")
    try:
        os.chmod(root, 0o777)
        for d in ("ws", "state", "home"):
            os.mkdir(os.path.join(root, d))
            os.chmod(os.path.join(root, d), 0o777)
        # workspace-write whose jobs reach only the server's proxy.
        shipped = os.path.join(os.path.dirname(__file__), "..", "..", "policies", "workspace-write.toml")
        proxied = os.path.join(root, "proxied.toml")
        with open(shipped) as f, open(proxied, "w") as out:
            out.write(f.read().replace('mode = "none"', 'mode = "proxy"'))
        os.chmod(proxied, 0o644)
        env = {
            **server.server_env(), "RUST_LOG": LOG_FILTER, "HOME": os.path.join(root, "home"),
            "MCP_SANDBOX_WORKSPACE": os.path.join(root, "ws"),
            "MCP_SANDBOX_STATE_DIR": os.path.join(root, "state"),
        }
        doctor = subprocess.run([*nobody, binary(), "doctor", "--json"], env=env, capture_output=True,
                                text=True, timeout=GUARD, cwd=os.path.join(root, "ws"))
        doctored = json.loads(doctor.stdout)
        report = {p["name"]: p for p in doctored["policies"]}
        # No user namespace for the launcher or the broker's helper: workspace-write is
        # refused too.
        assert not doctored["kernel"]["namespaces"]["in_user_namespace"], doctored["kernel"]
        assert report["workspace-write"]["refuses_to_start"], report["workspace-write"]
        assert not report["danger-full-access"]["refuses_to_start"], report["danger-full-access"]
        missing = ["only the server's proxy reachable (host listeners unreachable)"]
        # Without --workspace (the client's roots may name it) nothing is prewarmed: only
        # the policy check can tell, and /readyz was a 200.
        from_roots = {k: v for k, v in env.items() if k != "MCP_SANDBOX_WORKSPACE"}
        in_ws = [*nobody, "env", f"--chdir={os.path.join(root, 'ws')}"]
        for policy, run_env, prefix, ready in [
            (proxied, env, nobody, False),
            (proxied, from_roots, in_ws, False),
            ("danger-full-access", env, nobody, True),
        ]:
            proc, port, log = launch_http(server, "--no-auth", "--policy", policy, env=run_env, prefix=prefix)
            base = f"http://127.0.0.1:{port}"
            try:
                if ready:
                    # Ready; uid 65534 makes no job cgroup here, and /readyz says so after "ready".
                    _, body = wait_until(lambda: (r := get(base + "/readyz"))[0] == 200 and r, f"{policy}: never ready")
                    assert body.startswith("ready\nper-job memory and process limits: not enforced: "), body
                else:
                    status, body = wait_until(
                        lambda: (r := get(base + "/readyz"))[0] == 503 and not r[1].startswith("starting") and r,
                        f"{policy}: /readyz never gave its reason",
                    )
                    assert body.startswith("policy proxied cannot be enforced here: "), body
                    assert body.count("\n") == 1 and "doctor" in body, body
                    assert all(what in body for what in missing), (missing, body)
                    assert get(base + "/healthz") == (200, "ok\n")
                    assert "not ready: policy proxied" in log.read_text()
            finally:
                proc.kill()
                proc.wait()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_cell_without_root_runs_workspace_write_in_a_user_namespace(server):
    """Issue 21, Build 8: a server run as uid 65534 (no capability, no cgroup it may
    create) is ready under `workspace-write` where the kernel allows unprivileged user
    namespaces, and its jobs run confined: the Python worker is pid 2 of its own PID
    namespace in a user namespace mapping only uid 65534, with no interface but `lo`, and
    cannot write outside the workspace (a host directory anyone may write included).
    Skipped, saying why, where unprivileged user namespaces are disabled."""
    import json
    import tempfile

    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to run the server as another uid"
    nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    tried = subprocess.run([*nobody, "unshare", "--user", "--map-current-user", "true"],
                           capture_output=True, text=True, timeout=GUARD)
    if tried.returncode != 0:
        import pytest
        pytest.skip(f"unprivileged user namespaces are disabled here: {tried.stderr.strip()}")
    root = tempfile.mkdtemp(prefix="mcp-nobody-")
    try:
        os.chmod(root, 0o777)
        for d in ("ws", "state", "home", "outside"):
            os.mkdir(os.path.join(root, d))
            os.chmod(os.path.join(root, d), 0o777)
        env = {
            **server.server_env(), "RUST_LOG": LOG_FILTER, "HOME": os.path.join(root, "home"),
            "MCP_SANDBOX_WORKSPACE": os.path.join(root, "ws"),
            "MCP_SANDBOX_STATE_DIR": os.path.join(root, "state"),
        }
        doctor = subprocess.run([*nobody, binary(), "doctor", "--json"], env=env, capture_output=True,
                                text=True, timeout=GUARD, cwd=os.path.join(root, "ws"))
        assert json.loads(doctor.stdout)["kernel"]["namespaces"]["in_user_namespace"], doctor.stdout
        proc, port, log = launch_http(server, "--no-auth", "--policy", "workspace-write", env=env, prefix=nobody)
        base = f"http://127.0.0.1:{port}"
        outside = os.path.join(root, "outside", "escaped")
        try:
            # Ready; uid 65534 makes no job cgroup here, and /readyz says so after "ready".
            _, body = wait_until(lambda: (r := get(base + "/readyz"))[0] == 200 and r, "readyz never turned 200")
            assert body.startswith("ready\nper-job memory and process limits: not enforced: "), body

            async def scenario(a):
                seen = (await a.ok("python_exec", code=(
                    "import os\n"
                    "(os.getpid(), open('/proc/self/uid_map').read().split(),"
                    " [l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]])"
                )))["value"]
                shell = await a.ok("shell_run", command=(
                    f"echo x > inside && echo WROTE; (echo x > '{outside}') 2>/dev/null || echo DENIED"))
                return seen, shell

            seen, shell = run(over_http, base + "/mcp", scenario)
            assert seen == "(2, ['65534', '65534', '1'], ['lo'])", seen
            assert "WROTE" in json.dumps(shell) and "DENIED" in json.dumps(shell), shell
            assert os.path.exists(os.path.join(root, "ws", "inside"))
            assert not os.path.exists(outside)
        finally:
            proc.kill()
            proc.wait()
    finally:
        shutil.rmtree(root, ignore_errors=True)
