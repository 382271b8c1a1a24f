"""Red team through the MCP server: a hostile agent using only the tools (python_exec,
shell_run, python_run_file, job_output, env_create, ...) as root. tests/suite/sandbox_escape.rs
covers the sandbox itself through `run`; this file covers what the server path adds: its own
process and environment, its state directory, arguments the server resolves itself (cwd,
env_file, path, job ids, session names, venv_path) and the server's availability under attack."""

import io
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import uuid

import anyio
import pytest

from conftest import pids_with_env_marker, text_of


def out(r: dict) -> str:
    """Every text field of a tool result, flattened (stdout, stderr, value, error, message)."""
    return repr(r)


def secret_harness(server):
    secret = "REDTEAM-" + uuid.uuid4().hex
    server.env["REDTEAM_TOKEN"] = secret
    return secret


def test_server_environment_and_process_are_invisible(server):
    # Proves: a job cannot find the server in /proc (hidepid=ptraceable in the view) nor read
    # its environ/cmdline/maps/fds by its real pid (from os.getppid or the test), and a
    # secret in the server's environment never reaches any tool output (env allow-list).
    secret = secret_harness(server)

    async def scenario(c):
        spid = c.server_pid
        assert spid
        code = f"""
import os, glob
seen = []
for pid in [os.getppid(), {spid}, 1] + [int(p) for p in os.listdir('/proc') if p.isdigit()]:
    for f in ('environ', 'cmdline', 'maps'):
        try:
            seen.append(open(f'/proc/{{pid}}/{{f}}', 'rb').read().decode('latin1'))
        except OSError:
            pass
    try:
        seen += [os.readlink(f'/proc/{{pid}}/fd/' + d) for d in os.listdir(f'/proc/{{pid}}/fd')]
    except OSError:
        pass
print(os.path.exists('/proc/{spid}'), repr(dict(os.environ)))
print('\\n'.join(seen))
"""
        r = await c.py(code)
        assert r["status"] == "completed", r
        assert secret not in out(r)
        assert r["stdout"]["text"].startswith("False "), "the server's pid is visible in the job's /proc"
        r = await c.ok("shell_run", command=f"env; cat /proc/*/environ /proc/{spid}/environ; ls /proc", wait_seconds=20)
        assert secret not in out(r)
        r = await c.call("shell_run", command=f"cat /proc/{spid}/environ", wait_seconds=20)
        assert secret not in out(r.structured_content) and r.structured_content["exit_code"] != 0
        # uv-run one-off scripts and python_run_file too.
        r = await c.call("python_run_script", code=code, wait_seconds=30)
        assert secret not in repr(r.content) and "False " in repr(r.content), r
        (server.workspace / "probe.py").write_text(code)
        r = await c.call("python_run_file", path="probe.py")
        assert secret not in repr(r.content) and "False " in repr(r.content), r

    server.run(scenario)


def test_state_dir_other_sessions_and_job_spools_are_out_of_reach(server):
    # Proves: a job (python or shell, any session) cannot read or write the server's state
    # dir: another session's private tmp, job spools/records, the worker script, the venvs
    # dir. Paths are found on the host after real activity, then attacked from the sandbox.
    marker = "SPOOLED-" + uuid.uuid4().hex

    async def scenario(c):
        r = await c.py(f"open(os.environ['TMPDIR'] + '/mine', 'w').write('{marker}') if (os := __import__('os')) else 0",
                       session="victim")
        assert r["status"] == "completed", r
        r = await c.ok("shell_run", command=f"echo {marker}", wait_seconds=20)
        # Host side: every file of the state dir (spools, job table, tmp, worker script).
        files, dirs = [], []
        for root, ds, fs in os.walk(server.state_dir):
            dirs += [os.path.join(root, d) for d in ds]
            files += [os.path.join(root, f) for f in fs]
        hits = [f for f in files if marker.encode() in open(f, "rb").read()]
        assert len(hits) >= 2, f"expected a tmp file and a spool holding the marker: {files}"
        targets = files + dirs + [str(server.state_dir)]
        probe = f"""
import os
leaks, writes = [], []
for p in {targets!r}:
    try:
        if os.path.isdir(p):
            os.listdir(p); leaks.append(p)
            try:
                open(os.path.join(p, 'pwned'), 'w').write('x'); writes.append(p)
            except OSError:
                pass
        else:
            if '{marker}' in open(p, errors='replace').read(): leaks.append(p)
    except OSError:
        pass
    try:
        open(p, 'a').write('x'); writes.append(p)
    except OSError:
        pass
print('LEAKS', leaks, 'WRITES', writes)
"""
        # The venvs dir may be readable (a session's venv is a read path), never writable.
        allowed = f"LEAKS {[d for d in dirs if d.endswith('/venvs')]!r} WRITES []"
        r = await c.py(probe, session="attacker")
        assert r["status"] == "completed", r
        assert r["stdout"]["text"].strip() in ("LEAKS [] WRITES []", allowed), r["stdout"]["text"]
        # Shell jobs share one temp dir, `<state>/shell-tmp`: theirs to read and write.
        shell_tmp = str(server.state_dir / "shell-tmp")
        shell_probe = probe.replace(f"for p in {targets!r}", f"for p in {[t for t in targets if not t.startswith(shell_tmp)]!r}")
        r = await c.ok("shell_run", argv=["python3", "-c", shell_probe], wait_seconds=30)
        assert r["stdout"]["text"].strip() in ("LEAKS [] WRITES []", allowed), r
        r = await c.call("shell_run", command=f"cat {' '.join(hits)}; ls {server.state_dir}", wait_seconds=20)
        assert marker not in out(r.structured_content).replace(f"echo {marker}", "")
        # The victim session still owns its file and nothing was planted anywhere.
        for root, ds, fs in os.walk(server.state_dir):
            assert "pwned" not in fs

    server.run(scenario)


def test_sessions_do_not_share_private_tmp(server):
    # Proves: two python sessions have separate private temp dirs (/tmp and $TMPDIR), and a
    # shell job cannot see a python session's temp dir.
    async def scenario(c):
        r = await c.py("import os; open(os.environ['TMPDIR'] + '/a_secret', 'w').write('A'); print(os.environ['TMPDIR'])",
                       session="a")
        assert r["status"] == "completed", r
        tmp_a = r["stdout"]["text"].strip()
        r = await c.py(
            f"import os; print(os.path.exists(os.environ['TMPDIR'] + '/a_secret'), os.path.exists({tmp_a!r} + '/a_secret'))",
            session="b",
        )
        assert r["stdout"]["text"] == "False False\n", r
        r = await c.call("shell_run", command=f'cat "$TMPDIR/a_secret" {tmp_a}/a_secret', wait_seconds=20)
        assert r.structured_content["exit_code"] != 0 and "A" != r.structured_content["stdout"]["text"]

    server.run(scenario)


def test_env_file_outside_workspace_is_not_read_by_the_server(server):
    # Proves: the server reads `env_file` itself (outside the sandbox), so it must refuse a
    # file outside the workspace, directly or through a symlink planted in the workspace,
    # and no content of an unreadable file (state dir, /etc/shadow) reaches the output.
    secret = "ENVSECRET" + uuid.uuid4().hex
    outside = server.root / "host.env"
    outside.write_text(f"STOLEN={secret}\n")
    (server.root / "notenv").write_text(f"{secret} is not KEY=VALUE\n")
    os.symlink(outside, server.workspace / "link.env")
    os.symlink(server.root / "notenv", server.workspace / "link2.env")
    os.symlink(server.root, server.workspace / "up")

    async def scenario(c):
        for f in [str(outside), "link.env", "link2.env", "up/host.env", "../host.env", str(server.root / "notenv"),
                  "/etc/shadow"]:
            r = await c.call("shell_run", command="env", env_file=f, wait_seconds=20)
            text = out(r.structured_content) + repr(r.content)
            assert secret not in text, f"env_file={f} leaked: {text}"
            assert "root:" not in text, f"env_file={f} leaked /etc/shadow: {text}"
        # Inside the workspace it still works.
        (server.workspace / "ok.env").write_text("FINE=1\n")
        r = await c.ok("shell_run", command="echo $FINE", env_file="ok.env", wait_seconds=20)
        assert r["stdout"]["text"] == "1\n"

    server.run(scenario)


def test_cwd_and_run_file_path_do_not_open_the_host(server):
    # Proves: `cwd` and `python_run_file`'s `path` are resolved inside the sandbox: a cwd
    # outside the workspace (absolute, `..`, a planted symlink to the state dir) gives no
    # read of the state dir and no write anywhere; a script outside the workspace is not run
    # nor shown.
    secret = "RUNFILE" + uuid.uuid4().hex
    script = server.root / "evil.py"
    script.write_text(f"print('{secret}')\n")
    os.symlink(server.state_dir, server.workspace / "st")

    async def scenario(c):
        await c.py("x = 1", session="s1")  # populate the state dir
        for cwd in ["/etc", str(server.state_dir), "st", "..", str(server.root)]:
            r = await c.call("shell_run", command="ls -a; touch pwned", cwd=cwd, wait_seconds=20)
            sc = r.structured_content or {}
            assert r.is_error, f"cwd={cwd}: {r}"
            assert "repl" not in sc.get("stdout", {}).get("text", ""), f"cwd={cwd} listed the state dir"
        for p in [str(script), "../evil.py", "st/../evil.py"]:
            r = await c.call("python_run_file", path=p, wait_seconds=20)
            assert secret not in out(r.structured_content) + repr(r.content), f"path={p} ran a host script"
        assert not list(server.root.rglob("pwned"))
        assert not (server.root / "pwned").exists()

    server.run(scenario)


def test_odd_job_ids_and_session_names_stay_in_the_state_dir(server):
    # Proves: job ids and session names are names, not paths: `../` ids read nothing, and a
    # session named with `/` or `..` is refused or kept inside the state dir.
    (server.root / "jobs").mkdir()
    (server.root / "jobs" / "x").write_text("HOSTFILE")

    async def scenario(c):
        for jid in ["../x", "../../jobs/x", "/etc/passwd", "j1/../../../x", ".."]:
            r = await c.call("job_output", job_id=jid, stream="stdout")
            assert r.is_error and "HOSTFILE" not in repr(r.content) and "root:x" not in repr(r.content), r
        before = set(os.listdir(server.root))
        for name in ["../../evil", "a/b", "..", "/abs"]:
            assert "session" in await c.invalid("python_exec", code="print(1)", session=name)
        assert set(os.listdir(server.root)) == before
        assert not (server.root.parent / "evil").exists()

    server.run(scenario)


def test_signals_cannot_reach_the_server_or_other_sessions(server):
    # Proves: kill -9 of the server pid, of pid 1 of the view, of -1 (everything) from a
    # job leaves the server and another session's worker (and its state) alive.
    async def scenario(c):
        await c.py("keep = 41", session="victim")
        spid = c.server_pid
        await c.py(f"import os\nfor p in (os.getppid(), {spid}, 1):\n    try: os.kill(p, 9)\n    except OSError: pass",
                   session="attacker")
        await c.call("shell_run", command=f"kill -9 {spid}; kill -9 -1; kill -9 1", wait_seconds=10)
        await c.call("python_exec", code="import os; os.kill(-1, 9)", session="attacker2", wait_seconds=10)
        r = await c.py("print(keep + 1)", session="victim")
        assert r["stdout"]["text"] == "42\n", r
        assert os.path.exists(f"/proc/{spid}")

    server.run(scenario)


async def answers_meanwhile(c, *endless):
    """Another session answers while the `endless` jobs (which never end by themselves) are
    still running: the server is neither starved nor blocked by them. No clock is read (a
    loaded machine may take any time): a server that could not answer until they ended
    would never answer at all, and the call's own deadline fails the test."""
    r = await c.py("print(6 * 7)", session="bystander")
    assert r["status"] == "completed" and r["stdout"]["text"] == "42\n", r
    running = {j["job_id"] for j in (await c.ok("job_list", status="running"))["jobs"]}
    assert {j["job_id"] for j in endless} <= running, (endless, running)


def test_bombs_do_not_starve_other_sessions(server):
    # Proves: a fork bomb and an output flood in one session (running in the background)
    # leave the server answering another session within seconds; the fork bomb is capped
    # (pids cgroup) and the flood is spooled, not held in the reply.
    async def scenario(c):
        await c.py("1", session="bystander")
        bomb = await c.py("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", session="forker",
                          wait_seconds=0)
        flood = await c.ok("shell_run", command="yes AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA | head -c 200000000",
                           wait_seconds=0)
        pyflood = await c.py("import sys\nwhile True: sys.stdout.write('B' * 65536)", session="flooder", wait_seconds=0)
        await anyio.sleep(2)
        await answers_meanwhile(c, bomb, pyflood)
        r = await c.ok("job_wait", job_id=flood["job_id"], timeout_seconds=1)
        assert len(out(r)) < 200_000, "a flood must not be returned whole"
        for j in (bomb, pyflood, flood):
            await c.call("job_cancel", job_id=j["job_id"])
        await answers_meanwhile(c)

    # A guard against a hang only: starting four sandboxed workers beside a fork bomb on a
    # loaded machine can take a while.
    server.run(scenario, timeout=180)


def test_memory_bomb_is_capped_and_server_answers(server):
    # Proves: a memory bomb in a session is killed by the job's memory cap (policy default
    # 4 GiB here) and the server still answers other sessions meanwhile.
    async def scenario(c):
        await c.py("1", session="bystander")
        r = await c.py("x = []\nwhile True: x.append(bytearray(64 << 20))", session="hog", wait_seconds=0)
        await answers_meanwhile(c)
        res = await c.call("job_wait", job_id=r["job_id"], until_done=True, timeout_seconds=40)
        assert res.is_error and "memory" in repr(res.content), res
        await answers_meanwhile(c)

    server.run(scenario, timeout=180)


def test_no_network_from_python_or_shell(server):
    # Proves: neither a python session nor a shell job reaches a TCP or UDP listener on the
    # host's loopback, nor resolves a name through DNS.
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(5)
    tcp.settimeout(0.2)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.2)
    tport, uport = tcp.getsockname()[1], udp.getsockname()[1]

    async def scenario(c):
        code = f"""
import socket
res = []
try:
    socket.create_connection(('127.0.0.1', {tport}), timeout=2); res.append('tcp')
except OSError as e: pass
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('127.0.0.1', {uport})); res.append('udp')
except OSError: pass
try:
    socket.getaddrinfo('example.com', 80); res.append('dns')
except OSError: pass
print('REACHED', res)
"""
        r = await c.py(code)
        assert "REACHED []" in r["stdout"]["text"], r
        r = await c.call("shell_run", command=f"echo x > /dev/tcp/127.0.0.1/{tport} && echo TCPOK; "
                                              f"echo x > /dev/udp/127.0.0.1/{uport} && echo UDPOK", wait_seconds=20)
        assert "OK" not in r.structured_content["stdout"]["text"], r

    server.run(scenario)
    try:
        conn, _ = tcp.accept()
        pytest.fail("a job connected to the host's loopback listener")
    except TimeoutError:
        pass
    try:
        udp.recvfrom(10)
        pytest.fail("a job sent a UDP datagram to the host's loopback")
    except TimeoutError:
        pass


def test_daemons_do_not_survive_job_end_or_session_restart(server):
    # Proves: a setsid + double-fork daemon started by a shell job dies when the job ends,
    # and one started from a python session dies on session_restart (cgroup kill).
    m1, m2 = "DAEMON1" + uuid.uuid4().hex, "DAEMON2" + uuid.uuid4().hex
    daemon = "import os,time\npid=os.fork()\nif pid==0:\n    os.setsid()\n    if os.fork()==0:\n        os.execvpe('sleep', ['sleep','300'], dict(os.environ, M='{m}'))\n    os._exit(0)\nos.waitpid(pid, 0)"

    async def scenario(c):
        r = await c.ok("shell_run", argv=["python3", "-c", daemon.format(m=m1)], wait_seconds=20)
        assert r["status"] == "completed", r
        pydaemon = ("import os, subprocess\nsubprocess.Popen(['sh', '-c', 'sleep 300 &'], start_new_session=True, "
                    f"env=dict(os.environ, M='{m2}')).wait()")
        r = await c.py(pydaemon, session="d")
        assert r["status"] == "completed", r
        # Polled, not slept: the job's cgroup kill may take a moment to land on a loaded
        # machine; the daemon sleeps 300 s, so a 40 s poll still tells killed from survived.
        deadline = time.monotonic() + 40
        while pids_with_env_marker(m1) and time.monotonic() < deadline:
            await anyio.sleep(0.2)
        assert not pids_with_env_marker(m1), "a shell job's daemon outlived the job"
        assert pids_with_env_marker(m2), "the python daemon should run until the session restarts"
        await c.ok("session_restart", session="d")
        deadline = time.monotonic() + 40
        while pids_with_env_marker(m2) and time.monotonic() < deadline:
            await anyio.sleep(0.2)
        assert not pids_with_env_marker(m2), "a python session's daemon outlived session_restart"

    server.run(scenario)


def test_env_dict_ld_preload_grants_nothing_outside(server):
    # Proves: `env` of shell_run is applied only to the sandboxed program, never to the
    # privileged launcher: an LD_PRELOAD library outside the view is not loaded and one in the
    # workspace runs confined (cannot write outside the workspace).
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("needs a C compiler to build the preload library")
    flag = server.root / "preloaded"
    src = server.root / "p.c"
    src.write_text(
        '#include <stdio.h>\n__attribute__((constructor)) static void f(void){'
        f'FILE*x=fopen("{flag}","w"); if(x){{fputs("x",x);fclose(x);}}}}\n'
    )
    lib = server.root / "p.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    shutil.copy(lib, server.workspace / "p.so")

    async def scenario(c):
        for so in [str(lib), str(server.workspace / "p.so")]:
            await c.call("shell_run", command="true", env={"LD_PRELOAD": so, "LD_LIBRARY_PATH": str(server.root)},
                         wait_seconds=20)
            await c.call("python_run_file", path="nonexistent.py", wait_seconds=5)
        assert not flag.exists(), "a preload library ran outside the sandbox"

    server.run(scenario)


def test_venv_path_outside_workspace_is_refused(server):
    # Proves: env_info(create)/env_install's `venv_path` cannot make the server (or uv under
    # it, which gets write access to the venv) create or write a directory outside the
    # workspace: absolute, `..`, or through a symlink planted in the workspace.
    outside = server.root / "outside"
    outside.mkdir()
    (outside / "keep").write_text("k")
    os.symlink(outside, server.workspace / "evenv")
    os.symlink(server.root / "ov", server.workspace / "dangling")

    async def scenario(c):
        for i, p in enumerate([str(server.root / "ov"), "../ov", "evenv", "evenv/sub", "sub/../../ov", "dangling", "dangling/sub"]):
            r = await c.call("env_info", create=True, venv_path=p, session=f"s{i}", timeout=60)
            assert r.is_error and "outside the workspace" in repr(r.content), (p, r)
            r = await c.call("env_install", packages=["nothing-here"], venv_path=p, session=f"t{i}", wait_seconds=5)
            assert r.is_error, (p, r)
        assert not (server.root / "ov").exists(), "a venv was created outside the workspace"
        assert sorted(os.listdir(outside)) == ["keep"]
        # Inside the workspace it still works.
        r = await c.ok("env_info", create=True, venv_path="myenv", session="ok", timeout=60)
        assert (server.workspace / "myenv" / "pyvenv.cfg").exists(), r

    server.run(scenario)


def test_run_script_path_outside_workspace_is_refused(server):
    # Proves: python_run_script's `path` (the script gets a read grant in uv's sandbox) cannot
    # name a host file outside the workspace, directly, by `..` or through a planted symlink:
    # it is neither run nor shown (a SyntaxError would quote its first line).
    (server.root / "evil.py").write_text("print('SCRIPTSECRET')\n")
    (server.root / "key").write_text("SCRIPTSECRET2 -----BEGIN PRIVATE KEY-----\n")
    os.symlink(server.root, server.workspace / "up")
    (server.workspace / "fine.py").write_text("print('fine')\n")

    async def scenario(c):
        for p in [str(server.root / "evil.py"), str(server.root / "key"), "../key", "up/evil.py", "up/key"]:
            r = await c.call("python_run_script", path=p, wait_seconds=30)
            text = repr(r.content) + repr(r.structured_content)
            assert "SCRIPTSECRET" not in text, f"path={p} leaked: {text}"
        r = await c.call("python_run_script", path="fine.py", wait_seconds=30)
        assert "fine" in repr(r.content), r

    server.run(scenario)


def test_jobs_hold_no_descriptor_of_the_server_protocol(server):
    # Proves: no job (python session, shell, uv script) inherits the server's stdin/stdout
    # (the MCP stream): it cannot forge protocol messages to the client or read its requests.
    async def scenario(c):
        spid = c.server_pid
        server_ends = {os.readlink(f"/proc/{spid}/fd/{fd}") for fd in (0, 1)}
        assert all(e.startswith(("pipe:", "socket:")) for e in server_ends), server_ends
        code = (
            "import os\nends = set()\nfor f in os.listdir('/proc/self/fd'):\n"
            "    try: ends.add(os.readlink('/proc/self/fd/' + f))\n    except OSError: pass\nprint(sorted(ends))"
        )
        texts = [repr(await c.py(code, session="fds"))]
        texts.append(repr((await c.call("shell_run", argv=["python3", "-c", code], wait_seconds=20)).content))
        texts.append(repr((await c.call("python_run_script", code=code, wait_seconds=30)).content))
        for t in texts:
            assert "pipe:" in t or "/dev/null" in t, t  # the probe really ran
            for end in server_ends:
                assert end not in t, f"a job holds the server's {end}: {t}"

    server.run(scenario)


def test_env_file_fifo_does_not_hang_the_server(server):
    # Proves: an env_file that is a FIFO (or device) planted in the workspace is refused at
    # once; the server never blocks reading it.
    os.mkfifo(server.workspace / "fifo.env")

    async def scenario(c):
        # A FIFO with no writer blocks its opener for ever: a server that opened it would
        # never answer (the call's deadline fails the test), however fast the machine.
        r = await c.call("shell_run", command="env", env_file="fifo.env", wait_seconds=5)
        assert r.is_error and "regular file" in repr(r.content), r
        await answers_meanwhile(c)

    server.run(scenario)


def test_host_ipc_objects_are_out_of_reach(server):
    # Proves: the host's System V shared memory and message queues and its POSIX message
    # queues are per IPC namespace, and a root-uid job owns root's 0600 segments by plain
    # DAC; from a session, a shell job and a script none of them is found, listed, read,
    # written or removed (each job has an IPC namespace of its own).
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    key = int.from_bytes(os.urandom(3), "big") | 0x1000000
    mq = f"/redteam-{uuid.uuid4().hex[:12]}"
    marker = b"HOST-IPC-" + uuid.uuid4().hex[:8].encode()
    shmid = libc.shmget(key, 4096, 0o1000 | 0o600)  # IPC_CREAT
    msqid = libc.msgget(key, 0o1000 | 0o600)
    mqd = libc.mq_open(mq.encode(), os.O_CREAT | os.O_RDWR, 0o600, None)
    assert shmid >= 0 and msqid >= 0 and mqd >= 0, ctypes.get_errno()
    addr = libc.shmat(shmid, None, 0)
    ctypes.memmove(addr, marker, len(marker))
    probe = f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
print('shm', libc.shmget({key}, 0, 0), 'msg', libc.msgget({key}, 0),
      'mq', libc.mq_open({mq.encode()!r}, os.O_RDWR, 0, None))
print([l.split()[0] for l in open('/proc/sysvipc/shm').readlines()[1:]])
"""
    absent = "shm -1 msg -1 mq -1\n"

    async def scenario(c):
        r = await c.py(probe)
        assert r["status"] == "completed", r
        assert r["stdout"]["text"].startswith(absent), r
        assert str(key) not in r["stdout"]["text"], r
        r = await c.ok("python_run_script", code=probe, wait_seconds=60)
        r = await c.finish(r)
        assert r["all_stdout"].startswith(absent), r
        r = await c.ok("shell_run", command=f"ipcs -m; ipcrm -M {key}; ipcrm -Q {key}; cat /proc/sysvipc/msg", wait_seconds=20)
        r = await c.finish(r)
        assert f"{key:#010x}" not in r["all_stdout"] and str(key) not in r["all_stdout"], r

    try:
        server.run(scenario)
        assert ctypes.string_at(addr, len(marker)) == marker
        assert libc.shmget(key, 0, 0) == shmid and libc.msgget(key, 0) == msqid
    finally:
        libc.shmdt(ctypes.c_void_p(addr))
        libc.shmctl(shmid, 0, None)  # IPC_RMID
        libc.msgctl(msqid, 0, None)
        libc.mq_close(mqd)
        libc.mq_unlink(mq.encode())


def test_a_huge_sparse_script_does_not_fill_the_servers_memory(server):
    # Proves: python_run_script path= naming a 3 GiB sparse file in the workspace (no disk
    # used; any job can make one) does not make the server read it into its own memory
    # (it looks for a PEP 723 block in a bounded prefix); the server's peak RSS stays far
    # below the file's size and it keeps answering.
    with open(server.workspace / "big.py", "wb") as f:
        f.truncate(3 << 30)

    def peak_kib(pid):
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise AssertionError("no VmHWM")

    async def scenario(c):
        # Python reads the whole file before it says the null bytes are a syntax error: a
        # fast machine may get there within the window (the job then failed), a slow one not.
        res = await c.call("python_run_script", path="big.py", wait_seconds=10)
        r = res.structured_content or {}
        assert r.get("status") in ("running", "failed"), r
        if r["status"] == "failed":
            assert "null bytes" in text_of(res), text_of(res)
        if r.get("status") == "running":
            await c.ok("job_cancel", job_id=r["job_id"], grace_seconds=1)
        r = await c.py("print(6 * 7)")
        assert r["stdout"]["text"] == "42\n", r
        assert peak_kib(c.server_pid) < 1 << 20, f"server peak RSS {peak_kib(c.server_pid)} KiB"

    server.run(scenario)


HOOK_WIDENING_HOME = r"""
import base64, hashlib, os, zipfile
def get_requires_for_build_wheel(config_settings=None):
    return []
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    # The venv being installed into is bound at its host path: append a `home` to it.
    for line in open("/proc/self/mountinfo"):
        cfg = os.path.join(line.split()[4], "pyvenv.cfg")
        if "/script-envs/" in cfg and os.path.exists(cfg):
            with open(cfg, "a") as f:
                f.write("\nhome = SECRET_DIR/bin\n")
            print("HOOK-WROTE", cfg, flush=True)
    files = {"hookpkg/__init__.py": b"",
             "hookpkg-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: hookpkg\nVersion: 0.1\n",
             "hookpkg-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    name, record = "hookpkg-0.1-py3-none-any.whl", []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for n, d in files.items():
            z.writestr(n, d)
            h = base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()
            record.append(f"{n},sha256={h},{len(d)}")
        z.writestr("hookpkg-0.1.dist-info/RECORD", "\n".join(record + ["hookpkg-0.1.dist-info/RECORD,,"]) + "\n")
    return name
"""


def test_a_build_hook_cannot_widen_the_scripts_policy_through_pyvenv_cfg(server):
    # Proves: a dependency's build hook (a local sdist, run by uv while python_run_script
    # builds its transient venv) that appends `home = <host dir>/bin` to that venv's
    # pyvenv.cfg does not get the script read access to <host dir>: the interpreter's
    # prefixes are read as `uv venv` left them, before any hook ran.
    secret_dir = f"/var/tmp/redteam-{uuid.uuid4().hex[:12]}"
    os.makedirs(secret_dir + "/bin")
    marker = "HOST-SECRET-" + uuid.uuid4().hex
    with open(secret_dir + "/secret.txt", "w") as f:
        f.write(marker)
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "hookbackend"\nbackend-path = ["."]\n\n'
        '[project]\nname = "hookpkg"\nversion = "0.1"\n',
        "PKG-INFO": "Metadata-Version: 2.1\nName: hookpkg\nVersion: 0.1\n",
        "hookbackend.py": HOOK_WIDENING_HOME.replace("SECRET_DIR", secret_dir),
    }
    sdist = server.workspace / "hookpkg-0.1.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(f"hookpkg-0.1/{name}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    server.env.update(UV_PYTHON_DOWNLOADS="never", UV_OFFLINE="1")
    code = f"""
import hookpkg, os, sys
print('planted:', {secret_dir!r} in open(os.path.join(sys.prefix, 'pyvenv.cfg')).read())
try:
    print(open({secret_dir + '/secret.txt'!r}).read())
except OSError as e:
    print('refused', e.errno)
"""

    async def scenario(c):
        job = await c.finish(await c.ok("python_run_script", code=code, dependencies=[str(sdist)]), timeout=120)
        assert job["status"] == "completed", job
        assert "planted: True" in job["all_stdout"], job  # the hook did rewrite the venv
        assert marker not in out(job), job
        assert "refused 2" in job["all_stdout"], job

    try:
        server.run(scenario, timeout=240)
    finally:
        shutil.rmtree(secret_dir, ignore_errors=True)


def run_and_check_marker(server, scenario, marker: str, why: str) -> None:
    """Run `scenario`; code outside the sandbox would have written `marker` (removed after)."""
    try:
        server.run(scenario)
        assert not os.path.exists(marker), why
    finally:
        if os.path.exists(marker):
            os.unlink(marker)


def test_the_interpreter_probe_imports_nothing_from_the_workspace(server):
    # Proves: a `json.py` left in the workspace (by a job of an earlier server, or in a
    # checkout) is not imported by the server's interpreter probe, which runs outside the
    # sandbox when no remembered answer can be used (a fresh state dir here), with the
    # server's working directory being the workspace, as clients start it.
    marker = f"/var/tmp/redteam-probe-{uuid.uuid4().hex[:12]}"
    (server.workspace / "json.py").write_text(
        "import importlib, sys\n"
        f"try:\n    open({marker!r}, 'w').write('imported outside the sandbox')\nexcept OSError:\n    pass\n"
        "sys.path = [p for p in sys.path if p not in ('', '.', __import__('os').getcwd())]\n"
        "del sys.modules['json']\nsys.modules['json'] = importlib.import_module('json')\n"
    )

    async def scenario(c):
        r = await c.py("print(6 * 7)")
        assert r["stdout"]["text"] == "42\n", r

    run_and_check_marker(server, scenario, marker, "the probe imported the workspace's json.py outside the sandbox")


def test_a_venv_python_a_job_wrote_never_runs_outside_the_sandbox(server):
    # Proves: a shell job that writes `.venv/bin/python` into the workspace cannot have the
    # next server (fresh state dir, no --python) run it outside the sandbox when it probes
    # the interpreter: the server does not use a venv whose interpreter is a file sandboxed
    # code can write; it says so and uses python3 from PATH.
    marker = f"/var/tmp/redteam-venv-{uuid.uuid4().hex[:12]}"
    planted = f"#!/bin/sh\n(id > {marker}) 2>/dev/null\nexec python3 \"$@\"\n"

    async def plant(c):
        r = await c.ok("shell_run", command=(
            "mkdir -p .venv/bin && printf 'home = /usr/bin\\n' > .venv/pyvenv.cfg && "
            f"cat > .venv/bin/python <<'EOF'\n{planted}EOF\nchmod +x .venv/bin/python"),
            wait_seconds=10)
        assert r["status"] == "completed", r

    async def next_server(c):
        r = await c.py("import sys; print(sys.prefix)")
        assert r["stdout"]["text"].strip() != str(server.workspace / ".venv"), r

    try:
        server.run(plant)
        assert (server.workspace / ".venv/bin/python").exists()
        shutil.rmtree(server.state_dir)
        server.state_dir.mkdir()
        server.env["RUST_LOG"] = "warn"
        server.run(next_server)
        assert not os.path.exists(marker), "the planted .venv/bin/python ran outside the sandbox"
        assert "not using the workspace's virtual environment" in server.stderr_log()
    finally:
        if os.path.exists(marker):
            os.unlink(marker)


def test_a_workspace_venv_linked_to_a_real_interpreter_is_still_used(server):
    # The usual `python -m venv .venv` (bin/python links to the base interpreter) is still
    # the sessions' interpreter: its real path is probed, its own path runs in the sandbox.
    base = sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", str(server.workspace / ".venv")], check=True)

    async def scenario(c):
        r = await c.py("import sys; print(sys.prefix)")
        assert r["stdout"]["text"].strip() == str(server.workspace / ".venv"), r

    server.run(scenario)


def test_finding_uv_imports_nothing_from_the_workspace(server):
    # Proves: when `uv` on PATH is a wrapper script (a shim), the server asks Python's
    # `uv` package where the binary is, outside the sandbox; a `uv.py` a shell job left in
    # the workspace (the server's working directory) is not what it imports.
    marker = f"/var/tmp/redteam-uv-{uuid.uuid4().hex[:12]}"
    real = shutil.which("uv")
    assert real, "uv is needed on PATH"
    shim = server.root / "shim"
    shim.mkdir()
    (shim / "real-uv").symlink_to(real)
    (shim / "uv").write_text('#!/bin/sh\nexec "$(dirname "$0")/real-uv" "$@"\n')
    (shim / "uv").chmod(0o755)
    server.env["PATH"] = f"{shim}:{os.environ['PATH']}"
    planted = f"try:\n    open({marker!r}, 'w').write('x')\nexcept OSError:\n    pass\ndef find_uv_bin():\n    return {real!r}\n"

    async def scenario(c):
        job = await c.finish(await c.ok("shell_run", command=f"cat > uv.py <<'EOF'\n{planted}EOF\n", wait_seconds=20))
        assert job["status"] == "completed", job
        assert (server.workspace / "uv.py").exists()
        await c.call("env_info")

    run_and_check_marker(server, scenario, marker, "finding uv imported the workspace's uv.py outside the sandbox")


def test_a_fifo_pyvenv_cfg_in_the_workspace_venv_does_not_hang_the_server(server):
    # Proves: a shell job that makes `.venv/pyvenv.cfg` a FIFO does not make the server
    # block reading it when sessions adopt the workspace venv (env_info
    # use_workspace_venv=true, several sessions at once): every call answers and the
    # server keeps serving cells.
    async def scenario(c):
        job = await c.finish(await c.ok(
            "shell_run",
            command="mkdir -p .venv/bin .venv/lib/python3/site-packages && ln -s \"$(command -v python3)\" .venv/bin/python"
            " && mkfifo .venv/pyvenv.cfg",
            wait_seconds=20,
        ))
        assert job["status"] == "completed", job
        answers = []

        async def adopt(i):
            answers.append(await c.call("env_info", use_workspace_venv=True, create=True, session=f"v{i}", timeout=30))

        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(adopt, i)
        assert len(answers) == 4
        r = await c.py("print(6 * 7)")
        assert r["stdout"]["text"] == "42\n", r

    server.run(scenario, timeout=180)
