"""The server's own surface: the HTTP endpoint's authentication and Origin checks, and the
workspace it refuses to start with. Every test drives the real binary."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import time
from pathlib import Path

import anyio
import pytest

from conftest import INIT, REPO, binary, post, start_http, stop, uv_offline

def test_http_without_token_generates_one_and_refuses_requests_without_it(server):
    """No --token: a random token is written 0600 in the state dir, stderr names the file and
    the URL, a request without it (or with a wrong one) gets 401, the bearer scheme is matched
    in any case, and the token file is not a guessable value."""
    proc, url, port = start_http(server)
    try:
        token_file = server.state_dir / "http-token"
        assert token_file.is_file()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 32
        status, body = post(url, INIT)
        assert status == 401, body
        status, _ = post(url, INIT, {"Authorization": "Bearer " + "0" * len(token)})
        assert status == 401
        status, _ = post(url, INIT, {"Authorization": token})
        assert status == 401
        status, body = post(url, INIT, {"Authorization": f"bEaReR {token}"})
        assert status == 200, body
        log = (server.root / f"http-{port}.log").read_text()
        assert f"http://127.0.0.1:{port}/mcp" in log, log
        assert str(token_file) in log, log
        assert token not in log
    finally:
        stop(proc)
    assert not token_file.exists(), "the generated token outlived the server"


def test_http_refuses_a_cross_origin_request(server):
    """A browser request from another origin (DNS rebinding) gets 403 even with the token;
    our own loopback origin and no Origin at all pass."""
    proc, url, port = start_http(server)
    try:
        token = (server.state_dir / "http-token").read_text().strip()
        auth = {"Authorization": f"Bearer {token}"}
        status, body = post(url, INIT, {**auth, "Origin": "http://evil.example"})
        assert status == 403, body
        status, body = post(url, INIT, {**auth, "Origin": f"http://evil.example:{port}"})
        assert status == 403, body
        status, body = post(url, INIT, {**auth, "Origin": f"http://localhost:{port}"})
        assert status == 200, body
        status, body = post(url, INIT, auth)
        assert status == 200, body
    finally:
        stop(proc)


def test_no_auth_is_explicit_and_loopback_only(server):
    """--no-auth serves without a token on loopback (no token file is written); on a public
    address it is refused (test_protocol.py::test_http_refuses_public_address_without_token)."""
    proc, url, _ = start_http(server, "--no-auth")
    try:
        status, body = post(url, INIT)
        assert status == 200, body
        assert not (server.state_dir / "http-token").exists()
    finally:
        stop(proc)


def test_token_with_stdio_is_an_error(server):
    out = subprocess.run(
        [binary(), "--token", "t"], env=server.server_env(), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=20,
    )
    assert out.returncode != 0
    assert "--transport http" in out.stderr, out.stderr


CONNECT = """
import socket, sys
port = int(sys.argv[1]) if len(sys.argv) > 1 else PORT
for host in ("127.0.0.1", "::1"):
    try:
        socket.create_connection((host, port), timeout=3).close()
        print("CONNECTED", host)
    except OSError as e:
        print("REFUSED", host, type(e).__name__, e.errno)
"""


def test_sandboxed_code_cannot_reach_the_http_endpoint(server):
    """Code in a session and in a shell job can't connect to the server's own endpoint,
    on 127.0.0.1 or ::1 (the test first checks the endpoint answers from outside)."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    proc, url, port = start_http(server)
    (server.workspace / "probe.py").write_text(CONNECT.replace("PORT", str(port)))
    socket.create_connection(("127.0.0.1", port), timeout=3).close()
    token = (server.state_dir / "http-token").read_text().strip()

    async def main():
        client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with client, streamable_http_client(url, http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                shell = await s.call_tool("shell_run", {"command": f"python3 probe.py {port}"})
                py = await s.call_tool("python_exec", {"code": CONNECT.replace("PORT", str(port))})
                return shell, py

    try:
        shell, py = anyio.run(main)
    finally:
        stop(proc)
    for res in (shell, py):
        text = "\n".join(getattr(c, "text", "") for c in res.content)
        assert "CONNECTED" not in text, text
        assert text.count("REFUSED") == 2, text


def run_server_in(cwd: Path, env: dict, *args: str):
    return subprocess.run(
        [binary(), *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=30,
    )


@pytest.mark.parametrize("where", ["root", "home"])
def test_broad_workspace_refused_with_one_line(server, where):
    """Given `/` or $HOME as --workspace, the server exits non-zero with one clear line
    naming the way out; --allow-broad-workspace is the explicit opt-in. (Merely started
    there, with no --workspace, it waits for the client to name one: test_broad_start.py.)"""
    env = server.server_env()
    home = server.root / "home"
    home.mkdir()
    env["HOME"] = str(home)
    cwd = Path("/") if where == "root" else home
    env["MCP_SANDBOX_WORKSPACE"] = str(cwd)
    out = run_server_in(cwd, env)
    assert out.returncode != 0
    lines = [l for l in out.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, out.stderr
    assert "refusing workspace" in lines[0] and "--allow-broad-workspace" in lines[0], lines
    assert ("root directory" if where == "root" else "home directory") in lines[0]


def test_workspace_that_is_a_file_or_holds_the_state_dir_is_refused(server):
    env = server.server_env()
    f = server.root / "file"
    f.write_text("")
    out = run_server_in(server.root, {**env, "MCP_SANDBOX_WORKSPACE": str(f)})
    assert out.returncode != 0 and "not a directory" in out.stderr, out.stderr
    # The harness's root holds the state dir.
    out = run_server_in(server.root, {**env, "MCP_SANDBOX_WORKSPACE": str(server.root)})
    assert out.returncode != 0 and "state dir" in out.stderr, out.stderr
    (server.state_dir / "x").mkdir()
    out = run_server_in(server.root, {**env, "MCP_SANDBOX_WORKSPACE": str(server.state_dir / "x")})
    assert out.returncode != 0 and "inside the server's state dir" in out.stderr, out.stderr


def test_state_dir_is_hidden_even_inside_an_allowed_broad_workspace(server):
    """With --allow-broad-workspace and the state dir inside the workspace, code in a shell
    job and in a session sees an empty, read-only directory there: no job records, no
    spooled output; writes fail; the server's own files are untouched."""
    server.env["MCP_SANDBOX_WORKSPACE"] = str(server.root)
    state = server.state_dir

    async def scenario(c):
        first = await c.ok("shell_run", command="echo first-job-output")
        assert "first-job-output" in first["stdout"]["text"]
        records = sorted(p.name for p in state.rglob("*") if p.is_file())
        assert records, "the server keeps job records in its state dir"
        probe = (
            f"find {state} -type f | head; "
            f"grep -rl first-job-output {state} 2>&1 | head -3; "
            f"echo x > {state}/planted && echo WROTE-STATE; "
            f"echo x > {server.root}/in-workspace && echo WROTE-WS"
        )
        r = await c.ok("shell_run", command=probe)
        text = r["stdout"]["text"] + r["stderr"]["text"]
        assert "WROTE-WS" in text, text  # the workspace itself is writable
        assert "WROTE-STATE" not in text and "first-job-output" not in text, text
        assert "job.json" not in text, text
        py = await c.py(
            f"import os\nprint(sorted(os.listdir({str(state)!r})))\n"
            f"print([f for d, _, fs in os.walk({str(state)!r}) for f in fs])"
        )
        out = py["stdout"]["text"]
        assert "job" not in out and ".json" not in out, py
        return records

    server.run(scenario, "--allow-broad-workspace")
    assert not (state / "planted").exists()
    assert (server.root / "in-workspace").exists()


def small_tmp_policy(server, size: str) -> Path:
    # The repository's policy, wherever the binary under test is ($MCP_SANDBOX_BIN).
    text = (REPO / "policies" / "workspace-write.toml").read_text()
    assert 'tmp_size = "1GiB"' in text
    p = server.root / "small-tmp.toml"
    p.write_text(text.replace('tmp_size = "1GiB"', f'tmp_size = "{size}"'))
    return p


def test_a_job_cannot_fill_the_host_disk_through_tmp(server):
    """A shell job writing 2 GiB to $TMPDIR stops at the policy's tmp_size (ENOSPC): its
    {tmp} is a tmpfs in its own mount view; the host file system gains nothing."""
    policy = small_tmp_policy(server, "32MiB")
    before = os.statvfs(server.state_dir)

    async def scenario(c):
        r = await c.ok(
            "shell_run",
            command='stat -f -c %T "$TMPDIR"; head -c 2G /dev/zero > "$TMPDIR/big"; echo rc=$?; '
                    'stat -c %s "$TMPDIR/big"',
            wait_seconds=60,
        )
        return await c.finish(r, timeout=120)

    r = server.run(scenario, "--policy", str(policy), timeout=180)
    out = r["all_stdout"].split()
    assert out[0] == "tmpfs", r
    assert out[1] != "rc=0", r
    assert "No space left" in r["all_stderr"], r
    assert int(out[2]) <= 32 * 1024 * 1024, r
    # The file system's free space is shared with everything else on the machine (a busy
    # CI host writes and deletes meanwhile: tens of MB either way). A job whose 2 GiB
    # reached it would take far more than that noise: half of it is the bound.
    after = os.statvfs(server.state_dir)
    freed = (after.f_bavail - before.f_bavail) * after.f_frsize
    assert freed > -1024 * 1024 * 1024, f"host disk lost {-freed} bytes"
    host_bytes = sum(p.stat().st_size for p in server.state_dir.rglob("*") if p.is_file())
    assert host_bytes < 4 * 1024 * 1024, host_bytes


def test_bad_tmp_size_is_one_clear_line(server):
    policy = small_tmp_policy(server, "lots")
    out = subprocess.run(
        [binary(), "policy", "check", str(policy)], capture_output=True, text=True, timeout=30,
    )
    assert out.returncode != 0
    assert "limits.tmp_size" in out.stderr and str(policy) in out.stderr, out.stderr


PLANT = r"""
import os, site, subprocess, sys
line = "import sys; sys.stderr.write('PTH RAN\\n')\n"
dirs = {site.getusersitepackages(), os.environ["TMPDIR"], os.environ["HOME"]}
for d in dirs:
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "zz_planted.pth"), "w") as f:
        f.write(line)
with open(os.path.join(os.environ["TMPDIR"], "sitecustomize.py"), "w") as f:
    f.write(line)
# Control: a fresh interpreter of this same job does run the planted file.
ctl = subprocess.run([sys.executable, "-c", "pass"], capture_output=True, text=True,
                     env={**os.environ, "PYTHONPATH": os.environ["TMPDIR"]})
print("control", "PTH RAN" in ctl.stderr)
print("home", os.environ["HOME"])
"""


def test_a_pth_planted_by_one_script_does_not_run_in_the_next(server):
    """Scripts don't share HOME/TMPDIR: a .pth (and a sitecustomize) one script plants in
    its user site and temp dir is gone for the next script. Where the policy makes `{tmp}`
    a tmpfs (all shipped ones), HOME is a name only: the same path for a session's scripts,
    each job's own fresh tmpfs, with nothing of it on the host."""
    uv_offline(server)

    async def scenario(c):
        first = await c.finish(await c.ok("python_run_script", code=PLANT))
        second = await c.finish(await c.ok(
            "python_run_script",
            code="import os, sys\nprint('home', os.environ['HOME'])\nsys.path.insert(0, os.environ['TMPDIR'])\n"
                 "import importlib.util\nprint('sitecustomize', importlib.util.find_spec('sitecustomize') is not None)",
        ))
        return first, second

    first, second = server.run(scenario)
    assert first["status"] == "completed", first
    assert "control True" in first["all_stdout"], first
    assert second["status"] == "completed", second
    assert "PTH RAN" not in second["all_stdout"] + second["all_stderr"], second
    assert "sitecustomize False" in second["all_stdout"], second
    home1 = first["all_stdout"].split("home ")[1].split()[0]
    home2 = second["all_stdout"].split("home ")[1].split()[0]
    assert not Path(home1).exists(), "the first script's HOME outlived it"
    assert not Path(home2).exists(), "the second script's HOME outlived it"


SWAPPER = r"""
import os, threading
os.makedirs('sub', exist_ok=True)
def swap():
    n = aside = 0
    while not os.path.exists('stop-swapping'):
        try:
            os.replace('sub', 'sub-real')          # the directory goes away...
            os.symlink(OUT, 'sub')                 # ...a symlink out takes its place...
            os.unlink('sub')
            os.replace('sub-real', 'sub')          # ...and the directory comes back
            n += 1
        except OSError:
            if os.path.islink('sub'):
                os.unlink('sub')
            if os.path.isdir('sub-real') and os.path.isdir('sub') and not os.path.islink('sub'):
                # env_info made `sub` again (its parents, as mkdir -p) while the real one
                # was away: set that one aside, or no rename could ever succeed again.
                aside += 1
                os.replace('sub', f'sub-made-{aside}')
            if os.path.isdir('sub-real') and not os.path.exists('sub'):
                os.replace('sub-real', 'sub')
    open('swaps.tmp', 'w').write(str(n))
    os.replace('swaps.tmp', 'swaps')  # the test reads it as soon as it exists
t = threading.Thread(target=swap, daemon=True)
t.start()
'"swapping"'
"""


def test_venv_path_race_creates_nothing_outside(server):
    """A session swaps `sub` between a directory and a symlink to an outside directory in a
    tight loop while env_info(venv_path=sub/vN, create=true) is called 200 times: every
    call either works inside the workspace or is refused; nothing is created outside."""
    uv_offline(server)
    outside = server.root / "outside"
    outside.mkdir()
    before = sorted(p.name for p in server.root.iterdir())

    async def scenario(c):
        r = await c.py(SWAPPER.replace("OUT", repr(str(outside))), session="racer")
        assert r["status"] == "completed", r
        outcomes = {"ok": [], "refused": []}
        for i in range(200):
            res = await c.call("env_info", create=True, venv_path=f"sub/v{i}", session="target", timeout=120)
            outcomes["refused" if res.is_error else "ok"].append(f"v{i}")
        (server.workspace / "stop-swapping").write_text("")
        deadline = time.monotonic() + 60  # guards a swapper that never stops, only
        while not (server.workspace / "swaps").exists() and time.monotonic() < deadline:
            await anyio.sleep(0.1)
        return outcomes, int((server.workspace / "swaps").read_text())

    outcomes, swaps = server.run(scenario, timeout=600)
    assert swaps >= 10, f"the swap loop barely ran ({swaps} swaps)"
    assert list(outside.iterdir()) == [], f"created outside: {list(outside.iterdir())}"
    new = {p.name for p in server.root.iterdir()} - set(before)
    assert new <= {"server-stderr.log", "uv-cache"}, new
    # Some calls ran while `sub` was a directory and made their venv dir inside.
    made = [
        p.name
        for d in server.workspace.iterdir()
        if d.name.startswith("sub") and d.is_dir() and not d.is_symlink()
        for p in d.iterdir()
    ]
    # Every call that answered success made its venv dir inside the workspace (in `sub`,
    # or in `sub-real` / `sub-made-N` where the swapper had moved it): none was lost or
    # made elsewhere.
    # (The old check, ok + refused == 200, counted the test's own loop.)
    missing = sorted(set(outcomes["ok"]) - set(made))
    assert not missing, f"answered ok but no venv dir inside: {missing}; made: {sorted(made)}"


def test_refusals_read_the_same_whether_or_not_the_host_path_exists(server):
    """Each path argument, pointed outside the workspace at a host path that exists and at
    one that does not (absolute, by `..`, through a planted symlink, /proc/self/cwd), gets
    the same refusal once the path itself is taken out of the text."""
    uv_offline(server)
    there = server.root / "exists"
    there.mkdir()
    (there / "f.py").write_text("print('HOSTFILE')\n")
    os.symlink(server.root, server.workspace / "up")
    pairs = [
        (str(there / "f.py"), str(server.root / "nope" / "f.py")),
        ("../exists/f.py", "../nope/f.py"),
        ("up/exists/f.py", "up/nope/f.py"),
        (str(there), str(server.root / "nope")),
        ("/proc/self/cwd", "/proc/self/nope"),
        ("/root/.bashrc", "/root/.nope-bashrc"),
    ]
    calls = [
        ("python_run_file", lambda p: {"path": p}),
        ("shell_run", lambda p: {"command": "true", "cwd": p}),
        ("shell_run", lambda p: {"command": "true", "env_file": p}),
        ("env_info", lambda p: {"create": True, "venv_path": p}),
        ("python_run_script", lambda p: {"path": p}),
        ("python_run_script", lambda p: {"code": "print(1)", "cwd": p}),
    ]

    async def scenario(c):
        seen = []
        for tool, args in calls:
            for yes, no in pairs:
                a = await c.call(tool, **args(yes))
                b = await c.call(tool, **args(no))
                ta = "\n".join(getattr(x, "text", "") for x in a.content)
                tb = "\n".join(getattr(x, "text", "") for x in b.content)
                assert a.is_error and b.is_error, (tool, yes, ta, tb)
                assert "HOSTFILE" not in ta
                assert ta.replace(yes, "<P>") == tb.replace(no, "<P>"), (tool, ta, tb)
                assert "outside the workspace" in ta, (tool, yes, ta)
                seen.append((tool, yes, ta))
        return seen

    # Each refusal names the path it refused (the check here was `len(seen) == 36`,
    # which counted the test's own loop).
    unnamed = [(tool, p, text) for tool, p, text in server.run(scenario, timeout=300) if p not in text]
    assert not unnamed, unnamed
    assert not (server.workspace / "exists").exists()
