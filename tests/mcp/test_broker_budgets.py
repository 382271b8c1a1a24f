"""The server's descriptors have budgets (issue 26, Build 3), through a real MCP client.

- The server raises its soft open-file limit to the hard one at start; a job whose policy
  sets no `limits.open_files` keeps the soft limit the server was started with, one whose
  policy sets it gets that.
- Under `prlimit --nofile=1024` (soft and hard), a job that opens 1,500 connections to
  its broker gets all but its budget refused in words (and a line in its `denied`),
  while a new session, a shell job and an install in other sessions all succeed.
"""

import re
from pathlib import Path

from test_broker import Web
from conftest import make_wheel

REPO = Path(__file__).resolve().parents[2]
BASE_POLICY = (REPO / "policies" / "workspace-write.toml").read_text()
MARK = "PROBE_LIMITS"


def under_prlimit(server, monkeypatch, nofile: str):
    """Start the harness's servers as `prlimit --nofile=<nofile> -- <binary>` (prlimit
    execs the binary: same pid, same executable)."""
    from conftest import binary

    real = binary()
    wrapper = server.root / "under-prlimit"
    wrapper.write_text(f'#!/bin/sh\nexec prlimit --nofile={nofile} -- {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("MCP_SANDBOX_BIN", str(wrapper))


def limits_of(pid: int) -> tuple[int, int]:
    line = next(l for l in Path(f"/proc/{pid}/limits").read_text().splitlines() if l.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    return int(soft), int(hard)


def test_the_server_raises_its_open_file_limit_and_jobs_keep_theirs(server, monkeypatch):
    under_prlimit(server, monkeypatch, "1024:4096")
    no_limit = server.root / "no-open-files.toml"
    no_limit.write_text(re.sub(r"(?m)^open_files = \d+\n", "", BASE_POLICY))
    assert "open_files" not in no_limit.read_text()
    code = "import resource; resource.getrlimit(resource.RLIMIT_NOFILE)"

    def scenario(expected):
        async def run(c):
            assert limits_of(c.server_pid) == (4096, 4096)
            r = await c.py(code)
            assert r["status"] == "completed" and r["value"] == repr(expected), r
            r = await c.ok("shell_run", command="sh -c 'ulimit -Sn; ulimit -Hn'")
            assert r["stdout"]["text"].split() == [str(n) for n in expected], r

        return run

    # workspace-write sets open_files = 4096: the job gets that.
    server.run(scenario((4096, 4096)))
    # A policy without it: the soft limit the server was started with; the hard one stays.
    server.run(scenario((1024, 4096)), "--policy", str(no_limit))


FLOOD = """
import os, select, socket, time
port = int(os.environ['HTTP_PROXY'].rsplit(':', 1)[1])
stop = os.path.join(os.getcwd(), 'stop-flood')

def flood(n, out):
    socks = []
    for _ in range(n):
        # A broker that stops accepting (a server out of descriptors) leaves the connect
        # hanging in the backlog: give up then, holding what is open (a hang guard).
        try:
            s = socket.create_connection(('127.0.0.1', port), timeout=30)
        except OSError as e:
            os.write(out, ('!' + type(e).__name__ + '!').encode())
            break
        s.sendall(b'CONNECT half')
        socks.append(s)
    # Admitted ones hear nothing yet; every answer is reported: 'R' for a 429 (the
    # first one's words too, hex-encoded), '?' for anything else.
    pending, said = set(socks), False
    while not os.path.exists(stop):
        ready, _, _ = select.select(list(pending), [], [], 0.5)
        for s in ready:
            pending.discard(s)
            text = s.recv(4096).decode(errors='replace')
            ok = text.startswith('HTTP/1.1 429')
            os.write(out, b'R' if ok else b'?')
            if ok and not said:
                os.write(out, ('|' + ' '.join(text.split()).encode().hex() + '|').encode())
                said = True
    os._exit(0)

r, w = os.pipe()
for _ in range(2):
    if os.fork() == 0:
        os.close(r)
        flood(750, w)
os.close(w)
# Wait until every connection over the budget was refused (a hang guard only).
got, deadline = b'', time.monotonic() + 120
while got.count(b'R') < 1500 - BUDGET and got.count(b'!') < 2 and time.monotonic() < deadline:
    got += os.read(r, 65536)
words = bytes.fromhex(got.split(b'|')[1].decode()).decode() if b'|' in got else 'none'
print('FLOOD READY', got.count(b'R'), got.count(b'?') + got.count(b'!') // 2, words, flush=True)
while not os.path.exists(stop):
    time.sleep(0.1)
os.wait(); os.wait()
print('FLOOD DONE')
"""


def test_a_job_flooding_its_broker_is_refused_and_the_server_keeps_working(server, monkeypatch):
    """Under `prlimit --nofile=1024` the brokers may hold 256 connections, one job 128:
    a session holding 1,500 (from two processes, each under the job's 1024 descriptors)
    hears 429 in words for the rest; meanwhile another session starts, a shell job runs
    and an install through the broker succeeds."""
    under_prlimit(server, monkeypatch, "1024")
    wheels = server.root / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "tinypkg", "0.1")
    web = Web(wheels)
    where = f"127.0.0.1:{web.port}"
    server.env.update(UV_INDEX_URL=f"http://{where}/simple", UV_FIND_LINKS=f"http://{where}/", UV_PYTHON_DOWNLOADS="never")
    policy = server.root / "flood.toml"
    policy.write_text(
        BASE_POLICY.replace('[network]\nmode = "none"', f'[network]\nmode = "proxy"\nallow = ["{where}"]')
        + f'\n[installer.network]\nmode = "proxy"\nallow = ["{where}"]\n'
    )

    async def scenario(c):
        assert limits_of(c.server_pid) == (1024, 1024)
        job = await c.py("BUDGET = 128\n" + FLOOD, session="flood", wait_seconds=1)
        out = job["stdout"]["text"]
        while "FLOOD READY" not in out:
            assert job["status"] == "running", job
            job = await c.ok("job_wait", job_id=job["job_id"], timeout_seconds=30)
            out += job["stdout"]["text"]
        ready = out.split("FLOOD READY ", 1)[1].splitlines()[0]
        refused, other, words = ready.split(" ", 2)
        # 1,500 connections, 128 admitted: every other one was refused, in words. (The
        # admitted ones are answered 408 once their head is 30 s late: `other` counts those.)
        assert int(refused) == 1500 - 128, ready
        assert "429 Too Many Requests" in words and "this job already holds 128 connections" in words, words

        # Meanwhile: a new session, a shell job and an install, each in a session of its own.
        r = await c.py("6 * 7", session="fresh")
        assert r["status"] == "completed" and r["value"] == "42", r
        r = await c.ok("shell_run", command="echo shell-ok", session="shelly")
        assert r["status"] == "completed" and "shell-ok" in r["stdout"]["text"], r
        job2 = await c.finish(await c.ok("env_install", packages=["tinypkg"], session="installer"), timeout=120)
        assert job2["status"] == "completed", job2
        assert "tinypkg==0.1" in job2["result"]["installed"], job2

        (server.workspace / "stop-flood").write_text("")
        flood = await c.finish(job, timeout=60)
        assert flood["status"] == "completed", flood
        assert any("the most one job may hold" in d for d in flood.get("denied", [])), flood
        assert "Too many open files" not in server.stderr_log()

    try:
        server.run(scenario, "--policy", str(policy), timeout=300)
    finally:
        web.close()
