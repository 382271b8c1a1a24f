"""stdio over pipes (Python's SDK) and over one Unix socket for both directions (Node's
child_process): the server reads and writes them on its event loop, in non-blocking mode —
pipes in open files of its own (so the ones it was given, which may be shared with the
process that started it, a shell running `server; cat`, never change), a socket's mode
given back when it exits. Driven over raw stdio: the descriptors under test are ours as
well as the server's."""

import fcntl
import json
import os
import select
import socket
import subprocess
import time

import pytest

from conftest import binary, raw_server_env


def nonblocking(fd: int) -> bool:
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK)




class Raw:
    """JSON-RPC lines over a write descriptor and a read descriptor."""

    def __init__(self, wfd: int, rfd: int):
        self.wfd, self.rfd, self.buf = wfd, rfd, b""

    def send(self, msg: dict):
        data = (json.dumps(msg) + "\n").encode()
        while data:
            data = data[os.write(self.wfd, data):]

    def answer(self, id_: int, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout  # hang guard only
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                msg = json.loads(line)
                if msg.get("id") == id_:
                    return msg
            left = deadline - time.monotonic()
            assert left > 0, "no answer from the server"
            ready, _, _ = select.select([self.rfd], [], [], left)
            if ready:
                chunk = os.read(self.rfd, 1 << 16)
                assert chunk, "the server closed stdout"
                self.buf += chunk


def converse(raw: Raw) -> None:
    raw.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
    assert "result" in raw.answer(1)
    raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    # A long answer (every tool's schema): written in pieces when the pipe is full.
    raw.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    tools = raw.answer(2)
    assert len(tools["result"]["tools"]) > 5, tools
    raw.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
              "params": {"name": "python_exec", "arguments": {"code": "6 * 7"}}})
    res = raw.answer(3)["result"]
    assert not res.get("isError") and "42" in json.dumps(res), res


def served_nonblocking(pid: int, fd: int) -> bool:
    """Whether process `pid` holds the pipe of our `fd` in a non-blocking open file of its
    own (its /proc fdinfo flags), beside the one it was given."""
    ino = os.fstat(fd).st_ino
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.stat(f"/proc/{pid}/fd/{name}").st_ino != ino:
                continue
            flags = open(f"/proc/{pid}/fdinfo/{name}").read().split("flags:")[1].split()[0]
        except (OSError, IndexError):
            continue
        if int(flags, 8) & os.O_NONBLOCK:
            return True
    return False


@pytest.mark.parametrize("ending", ["end of input", "SIGKILL"])
def test_pipes_are_served_nonblocking_on_files_of_the_servers_own(tmp_path, ending):
    """The server reads and writes its stdio pipes on its event loop, in non-blocking
    files it opened anew: the open files it was given — shared with whoever started it —
    stay blocking all along, even when the server is SIGKILLed and can put nothing back."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    proc = subprocess.Popen([binary()], stdin=in_r, stdout=out_w, stderr=subprocess.DEVNULL, env=raw_server_env(tmp_path))
    # We keep the server's ends open too: the same open files, so we see their mode.
    try:
        raw = Raw(in_w, out_r)
        converse(raw)
        assert served_nonblocking(proc.pid, in_r) and served_nonblocking(proc.pid, out_w), \
            "stdio is served on the event loop"
        assert not nonblocking(in_r) and not nonblocking(out_w), "the shared open files were made non-blocking"
        if ending == "SIGKILL":
            proc.kill()
            proc.wait(timeout=60)
        else:
            os.close(in_w)  # end of input: the server exits
            assert proc.wait(timeout=60) == 0
        assert not nonblocking(in_r), "stdin left non-blocking"
        assert not nonblocking(out_w), "stdout left non-blocking"
    finally:
        if proc.poll() is None:
            proc.kill()
        for fd in (in_r, out_r, out_w):
            os.close(fd)


def test_one_unix_socket_for_stdin_and_stdout(tmp_path):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc = subprocess.Popen([binary()], stdin=theirs, stdout=theirs, stderr=subprocess.DEVNULL, env=raw_server_env(tmp_path))
    try:
        converse(Raw(ours.fileno(), ours.fileno()))
        assert nonblocking(theirs.fileno()), "stdio is served on the event loop"
        ours.shutdown(socket.SHUT_WR)
        assert proc.wait(timeout=60) == 0
        assert not nonblocking(theirs.fileno()), "the socket left non-blocking"
    finally:
        if proc.poll() is None:
            proc.kill()
        ours.close()
        theirs.close()
