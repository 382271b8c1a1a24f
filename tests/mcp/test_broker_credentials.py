"""Index credentials are lent to the installer alone, and broker refusals reach every
answer (issue 26, Build 2 and 5), through a real MCP client.

The server holds `UV_INDEX_URL=http://idxuser:idx-s3cret@127.0.0.1:PORT/simple` for an
index of the test's that answers 401 under /simple without those credentials and records
every request head it gets. uv itself installs from it (the broker lends it the
credentials); a build hook of a package installed by the same server, a session and a
shell job in proxy mode send GET, POST and TRACE to the same host and none of them carry
`Authorization` — nor can an echoing endpoint hand it back, nor can the hook open its
parent uv's memory.
"""

import base64
import http.server
import json
from pathlib import Path

from test_broker import make_hook_sdist
from conftest import LoopbackHTTP, make_wheel

REPO = Path(__file__).resolve().parents[2]
BASE_POLICY = (REPO / "policies" / "workspace-write.toml").read_text()
AUTH = "Basic " + base64.b64encode(b"idxuser:idx-s3cret").decode()


class Index(LoopbackHTTP):
    """A PEP 503 index on the host's 127.0.0.1 serving `tinypkg` under /simple, which
    needs the credentials; /echo answers the Authorization header it got; anything else
    answers 200. Every request is recorded: (method, path, Authorization or None)."""

    def __init__(self, wheel: Path):
        self.seen: list[tuple[str, str, str | None]] = []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self):
                auth = self.headers.get("Authorization")
                index.seen.append((self.command, self.path, auth))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                if self.path.startswith("/simple") and auth != AUTH:
                    return self._send(401, b"credentials needed", [("WWW-Authenticate", 'Basic realm="idx"')])
                if self.path.rstrip("/") == "/simple/tinypkg":
                    page = f'<a href="{wheel.name}">{wheel.name}</a>'.encode()
                    return self._send(200, page, [("Content-Type", "text/html")])
                if self.path == f"/simple/tinypkg/{wheel.name}":
                    return self._send(200, wheel.read_bytes(), [("Content-Type", "application/octet-stream")])
                if self.path.startswith("/simple"):
                    return self._send(404, b"not here")
                if self.path == "/echo":
                    return self._send(200, f"auth={auth}".encode())
                return self._send(200, b"stored")

            def _send(self, code, body, headers=()):
                self.send_response(code)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_POST = do_HEAD = do_TRACE = do_PUT = _any

            def log_message(self, *a):
                pass

        super().__init__(Handler)


# What a build hook, a session cell and a shell job each try against the index host.
PROBE = """
import os, urllib.request, urllib.error
def probe(method, path, data=None):
    req = urllib.request.Request(f'http://127.0.0.1:{port}{path}', data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return f'{r.status} {r.read().decode(errors="replace")[:80]}'
    except urllib.error.HTTPError as e:
        return f'{e.code} {e.read().decode(errors="replace")[:200]}'
    except Exception as e:
        return f'{type(e).__name__}: {e}'
for method, path, data in [('GET', '/simple/tinypkg/', None), ('POST', '/upload', b'x'),
                           ('TRACE', '/simple/', None), ('GET', '/echo', None),
                           ('GET', '/simple/../echo', None)]:
    print('PROBE', WHO, method, path, '->', probe(method, path, data), flush=True)
"""


# A build hook's parent is uv itself (pid 2 of the job). Can the hook reach into it and
# make uv's connections its own? Writing is out (the job's /proc is read-only; ptrace,
# process_vm_writev and pidfd_getfd are refused by seccomp); uv runs from an execute-only
# copy, so it is not dumpable: its memory cannot even be opened for reading.
UV_MEMORY = """
import os
for mode in ('rb', 'r+b'):
    try:
        open(f'/proc/{os.getppid()}/mem', mode).close()
        print('PROBE hook uv memory', mode, '-> opened', flush=True)
    except OSError as e:
        print('PROBE hook uv memory', mode, '->', type(e).__name__, e, flush=True)
"""


def probe_code(who: str, port: int, other: int) -> str:
    return (
        f"WHO = {who!r}\nport = {port}\n"
        + PROBE
        # A host the policy does not allow: the broker refuses it (403, in words).
        + f"\nport = {other}\nprint('PROBE', WHO, 'GET other ->', probe('GET', '/'), flush=True)\n"
    )


def proxy_policy(root: Path, allow: list[str]) -> Path:
    """workspace-write with sessions, shell jobs and installs in proxy mode to `allow`."""
    path = root / "proxy-everywhere.toml"
    text = BASE_POLICY.replace('[network]\nmode = "none"', f'[network]\nmode = "proxy"\nallow = {json.dumps(allow)}')
    assert 'mode = "proxy"' in text
    path.write_text(text + f'\n[installer.network]\nmode = "proxy"\nallow = {json.dumps(allow)}\n')
    return path


def test_credentials_go_to_uv_alone_and_refusals_reach_every_answer(server):
    wheels = server.root / "wheels"
    wheels.mkdir()
    wheel = make_wheel(wheels, "tinypkg", "0.1")
    index = Index(wheel)
    where = f"127.0.0.1:{index.port}"
    # A second port on the host, not allowed: the broker refuses it (403, in words).
    other = Index(wheel)
    hook = make_hook_sdist(server.workspace, UV_MEMORY + probe_code("hook", index.port, other.port))
    server.env.update(
        UV_INDEX_URL=f"http://idxuser:idx-s3cret@{where}/simple",
        UV_PYTHON_DOWNLOADS="never",
    )

    async def scenario(c):
        # uv installs from the index that needs the credentials: the broker lent them.
        job = await c.finish(await c.ok("env_install", packages=["tinypkg"], session="alice"), timeout=120)
        assert job["status"] == "completed", job
        assert "tinypkg==0.1" in job["result"]["installed"], job
        uv_reads = [s for s in index.seen if s[1].startswith("/simple/tinypkg")]
        assert uv_reads and all(a == AUTH and m in ("GET", "HEAD") for m, _, a in uv_reads), index.seen
        assert any(p.endswith(".whl") for _, p, _ in uv_reads), index.seen
        before = len(index.seen)

        # A build hook of a package installed the same way: its GET under the index path,
        # its POST and TRACE, the echoing endpoint — all without the credentials.
        res = await c.call("env_install", packages=[str(hook)], session="mallory")
        job = await c.finish(res.structured_content, timeout=120)
        text = job["all_stdout"] + job["all_stderr"] + (job.get("message") or "")
        assert "PROBE hook GET /simple/tinypkg/ -> 401" in text, text
        assert "PROBE hook uv memory rb -> " in text and "-> opened" not in text, text
        assert "PROBE hook GET /echo -> 200 auth=None" in text, text
        assert "PROBE hook GET other -> 403 blocked by policy" in text, text
        hook_seen = index.seen[before:]
        assert {m for m, _, _ in hook_seen} >= {"GET", "POST", "TRACE"}, hook_seen
        assert all(a is None for _, _, a in hook_seen), hook_seen
        assert any("index credentials withheld" in d for d in job.get("denied", [])), job
        before = len(index.seen)

        # A session cell in proxy mode: the same, and its answer lists the broker's refusal.
        r = await c.py(probe_code("session", index.port, other.port), session="bob")
        assert r["status"] == "completed", r
        out = r["stdout"]["text"]
        assert "PROBE session GET /simple/tinypkg/ -> 401" in out and "auth=None" in out, out
        denied = r.get("denied", [])
        assert any(d.startswith(f"blocked by policy proxy-everywhere: connection to 127.0.0.1:{other.port}") for d in denied), r
        assert any("index credentials withheld from GET" in d and "not an install" in d for d in denied), r
        # Each refusal is reported once: the next cell starts with none.
        r = await c.py("1 + 1", session="bob")
        assert r["status"] == "completed" and not r.get("denied"), r

        # A shell job in proxy mode: the same again.
        script = server.workspace / "probe.py"
        script.write_text(probe_code("shell", index.port, other.port))
        r = await c.ok("shell_run", command=f"python3 {script}", session="carol")
        assert r["status"] == "completed", r
        out = r["stdout"]["text"]
        assert "PROBE shell GET /simple/tinypkg/ -> 401" in out and "auth=None" in out, out
        denied = r.get("denied", [])
        assert any(d.startswith(f"blocked by policy proxy-everywhere: connection to 127.0.0.1:{other.port}") for d in denied), r
        later = index.seen[before:]
        assert later and all(a is None for _, _, a in later), later

    try:
        server.run(scenario, "--policy", str(proxy_policy(server.root, [where])), timeout=300)
    finally:
        index.close()
        other.close()
