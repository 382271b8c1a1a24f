"""Every request line on stdio gets exactly one answer (issue 9), driven over raw stdio
with subprocess: the SDK cannot send malformed input. After each malformed line a ping is
sent; the test reads until the ping's answer and checks that exactly one other reply, with
the expected code and id, came before it."""

import json
import os
import select
import subprocess
import time

from conftest import binary, raw_server_env

MAX_LINE = 16 << 20

# (raw line, expected error code, expected id)
CASES = [
    (b"{not json", -32700, None),
    (b"\xff\xfe garbage \x80", -32700, None),
    (b'{"jsonrpc":"2.0","id":11,"method":"ping","params":{"s":"\\ud800"}}', -32700, 11),
    (b'{"jsonrpc":"2.0","id":12,"method":"ping","params":{"a":1,"a":2}}', -32700, 12),
    (b'{"jsonrpc":"2.0","id":13,"method":"ping","params":{"n":1e999}}', -32700, 13),
    (b'{"jsonrpc":"2.0","id":14,"method":"ping","params":{"d":' + b"[" * 200 + b"]" * 200 + b"}}", -32700, 14),
    (b'{"jsonrpc":"2.0","id":15,"method":"tools/list","params":"x"}', -32600, 15),
    (b'{"jsonrpc":"2.0","id":16,"method":"tools/call","params":{"name":5}}', -32602, 16),
    (b'{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"arguments":{}}}', -32602, 17),
    (b'{"jsonrpc":"2.0","id":"s-18","method":7}', -32600, "s-18"),
    (b'{"jsonrpc":"1.0","id":19,"method":"ping"}', -32600, 19),
    (b'{"jsonrpc":"2.0","id":[20],"method":"ping"}', -32600, None),
    # An integer id beyond i64 (up to u64) is echoed, not turned into null.
    (b'{"jsonrpc":"2.0","id":18446744073709551615,"method":"ping"}', -32600, 18446744073709551615),
    (b"[]", -32600, None),
    (b'"just a string"', -32600, None),
    (b'{"jsonrpc":"2.0"}', -32600, None),
    # Over the size limit: answered, id recovered from the prefix, the rest skipped.
    (b'{"jsonrpc":"2.0","id":21,"method":"ping","params":{"pad":"' + b"x" * (MAX_LINE + 100) + b'"}}', -32600, 21),
    (b'{"jsonrpc":"2.0","method":"ping","params":{"pad":"' + b"x" * (MAX_LINE + 100) + b'"},"id":22}', -32600, None),
]


class RawServer:
    def __init__(self, tmp_path):
        env = raw_server_env(tmp_path)
        self.proc = subprocess.Popen(
            [binary()], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
        self.buf = b""

    def send(self, line: bytes):
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def read_message(self, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            assert left > 0, "no reply from the server"
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                assert chunk, "the server closed stdout"
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def until_id(self, want) -> list[dict]:
        """Every message up to and including the one answering `want`."""
        got = []
        while True:
            m = self.read_message()
            got.append(m)
            if m.get("id") == want and ("result" in m or "error" in m):
                return got

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def test_each_malformed_line_gets_exactly_one_reply_and_the_server_keeps_answering(tmp_path):
    s = RawServer(tmp_path)
    try:
        s.send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}).encode())
        init = s.until_id(0)
        assert "result" in init[-1], init
        s.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        for n, (line, code, want_id) in enumerate(CASES):
            ping_id = 1000 + n
            s.send(line)
            s.send(json.dumps({"jsonrpc": "2.0", "id": ping_id, "method": "ping"}).encode())
            got = s.until_id(ping_id)
            replies = got[:-1]
            assert len(replies) == 1, f"case {n} ({line[:80]!r}): {len(replies)} replies: {replies}"
            err = replies[0].get("error")
            assert err and err["code"] == code, f"case {n} ({line[:80]!r}): {replies[0]}"
            assert replies[0]["id"] == want_id, f"case {n} ({line[:80]!r}): {replies[0]}"
            assert err["message"], replies[0]
            assert got[-1].get("result") == {}, got[-1]
        # Well-formed requests still work after all that.
        s.send(json.dumps({"jsonrpc": "2.0", "id": 5000, "method": "tools/call",
                           "params": {"name": "python_exec", "arguments": {"code": "6 * 7"}}}).encode())
        done = s.until_id(5000)[-1]
        assert done["result"]["structuredContent"]["value"] == "42", done
        # Notifications are never answered, however malformed (JSON-RPC): nothing comes
        # before the ping's answer.
        for n, line in enumerate([
            b'{"jsonrpc":"2.0","method":"notifications/initialized","params":[1]}',
            b'{"jsonrpc":"1.0","method":"notifications/cancelled"}',
            b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":{}}}',
            b'{"jsonrpc":"2.0","method":"notifications/no-such","params":{}}',
            b'{"jsonrpc":"2.0","method":"tools/call","params":{"name":5}}',
        ]):
            s.send(line)
            s.send(json.dumps({"jsonrpc": "2.0", "id": 6000 + n, "method": "ping"}).encode())
            got = s.until_id(6000 + n)
            assert len(got) == 1, f"notification {line!r} was answered: {got[:-1]}"
        # Unknown methods stay "method not found"; a blank line is not a message.
        s.send(b"")
        s.send(b'{"jsonrpc":"2.0","id":5001,"method":"no/such"}')
        assert s.until_id(5001)[-1]["error"]["code"] == -32601
    finally:
        s.close()
