"""A person at a terminal, not an MCP client: started with stdin a TTY, the server says in
one stderr line what it is, how to connect a client and how to try it, and Ctrl-C (SIGINT)
ends it quietly; `--help` says the same. A client on pipes sees none of it."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import time

from conftest import binary

HINT = "This is an MCP server: an MCP client"


def read_until(fd: int, needle: bytes, limit: float = 60) -> bytes:
    """Read `fd` until `needle` appears (the limit is a hang guard, not a timing claim)."""
    got = b""
    deadline = time.monotonic() + limit
    os.set_blocking(fd, False)
    while needle not in got:
        assert time.monotonic() < deadline, f"never saw {needle!r}; got {got!r}"
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            time.sleep(0.02)
            continue
        if not chunk:
            break
        got += chunk
    return got


def start_at_a_terminal(server):
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [binary()],
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=server.server_env(),
        cwd=server.workspace,
    )
    os.close(terminal)
    return proc, controller


def test_at_a_terminal_one_line_says_what_this_is_and_ctrl_c_exits_quietly(server):
    proc, controller = start_at_a_terminal(server)
    try:
        err = read_until(proc.stderr.fileno(), b"Ctrl-C quits.\n")
        line = err.decode().strip()
        assert line.count("\n") == 0, line
        assert HINT in line and "install --client" in line and "--transport http" in line, line
        proc.send_signal(signal.SIGINT)  # what Ctrl-C at the terminal sends
        code = proc.wait(timeout=60)
        # read_until left the pipe non-blocking: read what is left, to its end.
        os.set_blocking(proc.stderr.fileno(), True)
        rest = proc.stderr.read().decode()
        assert code == 0, (code, rest)
        assert "failed" not in rest and "Cancelled" not in rest and "error" not in rest, rest
        assert proc.stdout.read() == b""  # stdout is the protocol's alone
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(controller)


def test_a_client_on_pipes_gets_no_terminal_line(server):
    proc = subprocess.run(
        [binary()], input=b"", capture_output=True, env=server.server_env(), cwd=server.workspace, timeout=60
    )
    assert HINT not in proc.stderr.decode(), proc.stderr
    assert proc.stdout == b""


def test_help_says_who_starts_it_how_to_connect_and_how_to_try_it():
    out = subprocess.run([binary(), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    paragraph = [p for p in out.stdout.split("\n\n") if HINT in p]
    assert len(paragraph) == 1, out.stdout
    assert "install --client" in paragraph[0] and "--transport http" in paragraph[0], paragraph
