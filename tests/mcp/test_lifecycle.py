"""Server lifecycle: closing stdin or SIGTERM leaves no process of ours behind."""

import signal
import subprocess
import time

from conftest import binary, descendants


def alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def start_work(c_pids, server):
    """Scenario: a Python session with a child process, a background cell, and a shell job
    with children; records every process the server started."""

    async def scenario(c):
        await c.ok("python_exec", code="import subprocess\np = subprocess.Popen(['sleep', '300'])")
        await c.ok("python_exec", code="import time\nwhile True: time.sleep(0.1)", session="busy", wait_seconds=0.2)
        await c.ok("shell_run", command="sleep 300 & sleep 300; wait", wait_seconds=0.3)
        c_pids["server"] = c.server_pid
        c_pids["all"] = descendants(c.server_pid)
        assert len(c_pids["all"]) >= 5, c_pids

    return scenario


def start_raw(server, stderr=subprocess.DEVNULL):
    """The server started by hand on the harness's settings, initialized over raw JSON-RPC;
    returns it and a `send(msg)` that writes one line to its stdin."""
    import json

    proc = subprocess.Popen(
        [binary()], env=server.server_env(), cwd=server.workspace,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
    )

    def send(msg):
        proc.stdin.write((json.dumps(msg) + "\n").encode())
        proc.stdin.flush()

    send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
    proc.stdout.readline()
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return proc, send


def test_closing_stdin_leaves_no_process_behind(server):
    pids = {}
    server.run(start_work(pids, server))
    # The client closed stdin and waited for the server to exit (the SDK does that). The
    # processes sleep 300 s or loop forever: a generous poll (no timing is asserted) still
    # tells "killed" from "left behind" on a loaded machine.
    deadline = time.monotonic() + 60
    while any(alive(p) for p in pids["all"] + [pids["server"]]) and time.monotonic() < deadline:
        time.sleep(0.02)
    left = [p for p in pids["all"] + [pids["server"]] if alive(p)]
    assert left == [], f"processes left 60 s after stdin closed: {left}"


def test_sigterm_kills_every_job_without_waiting_for_them(server):
    proc, send = start_raw(server)
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "shell_run", "arguments": {"command": "sleep 300 & sleep 300; wait", "wait_seconds": 0.3}}})
    proc.stdout.readline()
    send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "python_exec", "arguments": {"code": "import time\nwhile True: time.sleep(0.1)", "wait_seconds": 0.3}}})
    proc.stdout.readline()
    kids = descendants(proc.pid)
    assert len(kids) >= 3, kids
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    # The jobs sleep 300 s or loop for ever: bounds far below that still tell "did not wait
    # for them" on a loaded machine, where stopping may take a while.
    proc.wait(timeout=60)
    deadline = t0 + 60
    while any(alive(p) for p in kids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [p for p in kids if alive(p)] == []


def test_closing_stdin_during_a_long_poll_exits_at_once(server):
    """A client that goes away while a job_wait long-poll is in flight: the server does not
    wait for the poll; it exits and kills the job at once."""
    import json

    proc, send = start_raw(server)
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "shell_run", "arguments": {"command": "sleep 300", "wait_seconds": 0}}})
    job = json.loads(proc.stdout.readline())["result"]["structuredContent"]["job_id"]
    send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "job_wait", "arguments": {"job_id": job, "timeout_seconds": 300}}})
    time.sleep(0.3)
    kids = descendants(proc.pid)
    assert kids
    t0 = time.monotonic()
    proc.stdin.close()
    # Not held up by the 300 s long-poll: a bound far below it (a loaded machine may take a
    # while to stop the server and its job) still tells.
    proc.wait(timeout=60)
    deadline = t0 + 60
    while any(alive(p) for p in kids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [p for p in kids if alive(p)] == []


def test_closing_stdin_right_after_a_call_does_not_wait_for_the_pools(server):
    """A client that leaves right after an answer (the SDK closes stdin, then kills the
    server 2 s later): the resources made ahead stop being made at once. The pools' makers
    slept out the settle time after a take and missed the exit's wake-up, so every such
    exit waited the drain's full budget (5 s) and was killed by the SDK first."""
    proc, send = start_raw(server, stderr=subprocess.PIPE)
    for i in range(3):  # a job took from each pool within its settle time before the exit
        send({"jsonrpc": "2.0", "id": 2 + i, "method": "tools/call", "params": {
            "name": "shell_run", "arguments": {"command": "true", "wait_seconds": 5}}})
        assert '"isError":true' not in proc.stdout.readline().decode()
    proc.stdin.close()
    proc.wait(timeout=60)
    err = proc.stderr.read().decode()
    assert proc.returncode == 0, err[-2000:]
    assert "did not end within" not in err, err[-2000:]
