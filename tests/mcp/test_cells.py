"""Several cells behind a router, on loopback (issue 21): HAProxy from Debian configured the
way agent-sandbox's `sandbox-router` behaves (sandbox-router/README.md of
kubernetes-sigs/agent-sandbox): a request must carry `X-Sandbox-ID` (else 400
`{"detail":"X-Sandbox-ID header is required."}`), a DNS-1123 label (else 400
`{"detail":"Invalid sandbox ID format."}`); it goes to the cell of that name with
`Authorization` stripped (the router consumes the caller's credential); a cell it cannot
reach answers 502 `{"detail":"Could not connect to the backend sandbox: <id>"}`.

Three cells (`--router-auth`, each its own state dir and workspace) behind it, driven with
raw 2026-07-28 requests (each a connection of its own, as the router sees them): every
call lands on the cell it names, a request naming another cell sent straight to a cell is
refused in words, a killed cell gives the router's error, and restarted on its state dir
it answers with `state_lost`. Skipped, with the reason shown, only without haproxy."""

import http.server
import json
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
from conftest import INIT, Harness, binary, free_port, post
from test_tasks import modern_rpc

GUARD = 120
CELLS = ["cell-a", "cell-b", "cell-c"]
ID_REQUIRED = '{"detail":"X-Sandbox-ID header is required."}'
ID_INVALID = '{"detail":"Invalid sandbox ID format."}'

pytestmark = pytest.mark.skipif(
    shutil.which("haproxy") is None,
    reason="haproxy is not installed (Debian package haproxy; .ci/run installs it): "
    "the multi-cell router test cannot run",
)


def wait_port(port: int, proc: subprocess.Popen, what: str, log) -> None:
    deadline = time.monotonic() + GUARD
    while proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"hang guard: {what} never listened"
            time.sleep(0.05)
    raise AssertionError(f"{what} exited: {log.read_text()}")


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


class Cell:
    """One server as a cell: `--router-auth --cell-id <name>` on a fixed loopback port,
    so that it can be restarted where the router expects it."""

    def __init__(self, harness: Harness, name: str):
        self.h, self.name, self.port = harness, name, free_port()
        (harness.workspace / "whoami").write_text(name)
        self.proc = None

    def start(self) -> None:
        self.log = self.h.root / f"{self.name}.log"
        self.proc = subprocess.Popen(
            [binary(), "--transport", "http", "--listen", f"127.0.0.1:{self.port}",
             "--router-auth", "--cell-id", self.name],
            env=self.h.server_env(), cwd=str(self.h.workspace),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(self.log, "a"),
        )
        wait_port(self.port, self.proc, self.name, self.log)
        deadline = time.monotonic() + GUARD
        while get(f"http://127.0.0.1:{self.port}/readyz")[0] != 200:
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, f"hang guard: {self.name} never ready"
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=60)


class HeaderWitness(http.server.BaseHTTPRequestHandler):
    """A stand-in backend that records the headers the router forwards."""

    seen: list[dict] = []

    def do_POST(self):
        HeaderWitness.seen.append({k.lower(): v for k, v in self.headers.items()})
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = b'{"jsonrpc":"2.0","id":1,"result":{}}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def router_config(root, port: int, backends: dict[str, int]) -> str:
    """HAProxy as sandbox-router: validate X-Sandbox-ID, strip Authorization, route by
    name; an unreachable cell or an unknown name is the router's 502 with the id."""
    lines = [
        "defaults",
        "    mode http",
        "    timeout connect 2s",
        "    timeout client 180s",
        "    timeout server 180s",
        "    retries 3",
        "frontend router",
        f"    bind 127.0.0.1:{port}",
        "    http-request return status 400 content-type application/json "
        f"string '{ID_REQUIRED}' unless {{ req.hdr_cnt(X-Sandbox-ID) eq 1 }}",
        "    http-request return status 400 content-type application/json "
        f"string '{ID_INVALID}' unless {{ req.hdr(X-Sandbox-ID) -m reg ^[a-z0-9]([-a-z0-9]{{0,61}}[a-z0-9])?$ }}",
        "    http-request del-header Authorization",
    ]
    lines += [f"    use_backend be-{n} if {{ req.hdr(X-Sandbox-ID) -m str {n} }}" for n in backends]
    lines += [
        "    default_backend nowhere",
        "backend nowhere",
        "    http-request return status 502 content-type application/json "
        "lf-string '{\"detail\":\"Could not connect to the backend sandbox: %[req.hdr(X-Sandbox-ID)]\"}'",
    ]
    for name, p in backends.items():
        # A cell that refuses connections: the router's own words, as a 502.
        err = root / f"{name}.502.http"
        body = f'{{"detail":"Could not connect to the backend sandbox: {name}"}}'
        err.write_text(
            "HTTP/1.0 502 Bad Gateway\r\nContent-Type: application/json\r\nCache-Control: no-cache\r\n"
            f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n{body}"
        )
        lines += [f"backend be-{name}", f"    errorfile 503 {err}", f"    server {name} 127.0.0.1:{p}"]
    return "\n".join(lines) + "\n"


def exec_via(router: str, cell: str, code: str, token: str | None = "caller-token") -> dict:
    headers = {"X-Sandbox-ID": cell, **({"Authorization": f"Bearer {token}"} if token else {})}
    got = modern_rpc(router, "tools/call", {"name": "python_exec", "arguments": {"code": code}}, headers)
    assert "result" in got, (cell, got)
    assert not got["result"].get("isError"), (cell, got)
    return got["result"]["structuredContent"]


def test_three_cells_behind_a_sandbox_router(tmp_path):
    harnesses = {}
    for name in CELLS:
        (tmp_path / name).mkdir()
        harnesses[name] = Harness(tmp_path / name)
    cells = {name: Cell(h, name) for name, h in harnesses.items()}
    witness = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HeaderWitness)
    threading.Thread(target=witness.serve_forever, daemon=True).start()
    router_port = free_port()
    cfg = tmp_path / "haproxy.cfg"
    backends = {n: c.port for n, c in cells.items()} | {"witness": witness.server_address[1]}
    cfg.write_text(router_config(tmp_path, router_port, backends))
    check = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    router_log = tmp_path / "haproxy.log"
    router = None
    try:
        for c in cells.values():
            c.start()
        router = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdin=subprocess.DEVNULL,
                                  stdout=open(router_log, "w"), stderr=subprocess.STDOUT)
        wait_port(router_port, router, "haproxy", router_log)
        url = f"http://127.0.0.1:{router_port}/mcp"

        # 90/90 calls land on the cell they name (each cell's workspace says which it is),
        # interleaved, each a request of its own, with a caller's token the router strips.
        landed = []
        for i in range(90):
            name = CELLS[i % 3]
            r = exec_via(url, name, "open('whoami').read()")
            landed.append((name, r["value"]))
        assert landed == [(n, repr(n)) for n, _ in landed], [x for x in landed if repr(x[0]) != x[1]]
        assert len(landed) == 90

        # The router's contract: X-Sandbox-ID required, a DNS label; Authorization stripped;
        # an unknown cell is its 502.
        assert post(url, INIT) == (400, ID_REQUIRED)
        for bad in ["Cell-A", "cell-a.evil.com", "cell/a", "-a"]:
            assert post(url, INIT, {"X-Sandbox-ID": bad}) == (400, ID_INVALID), bad
        status, body = post(url, INIT, {"X-Sandbox-ID": "cell-z"})
        assert (status, json.loads(body)) == (502, {"detail": "Could not connect to the backend sandbox: cell-z"})
        post(url, INIT, {"X-Sandbox-ID": "witness", "Authorization": "Bearer secret"})
        assert HeaderWitness.seen and "authorization" not in HeaderWitness.seen[-1], HeaderWitness.seen
        assert HeaderWitness.seen[-1].get("x-sandbox-id") == "witness", HeaderWitness.seen

        # Sent straight to a cell, a request naming another cell is refused in words.
        a = cells["cell-a"]
        status, text = post(f"http://127.0.0.1:{a.port}/mcp", INIT, {"X-Sandbox-ID": "cell-b"})
        assert status == 421, (status, text)
        assert '"cell-a"' in text and '"cell-b"' in text and "wrong cell" in text, text
        direct = modern_rpc(f"http://127.0.0.1:{a.port}/mcp", "tools/call",
                            {"name": "python_exec", "arguments": {"code": "1"}}, {"X-Sandbox-ID": "cell-c"})
        assert direct.get("http") == 421 and "misdirected" in direct["body"], direct

        # A killed cell gives the router's error; the others go on.
        b = cells["cell-b"]
        exec_via(url, "cell-b", "kept = 'before the kill'")
        b.kill()
        status, body = post(url, INIT, {"X-Sandbox-ID": "cell-b"})
        assert (status, json.loads(body)) == (502, {"detail": "Could not connect to the backend sandbox: cell-b"}), body
        assert exec_via(url, "cell-c", "open('whoami').read()")["value"] == "'cell-c'"

        # Restarted on its state dir (and port), it answers again, telling the state was lost.
        b.start()
        r = exec_via(url, "cell-b", "'kept' in globals()")
        assert r["value"] == "False" and r["state_lost"] is True, r
        assert "the server restarted at" in r["state_note"] and "variables are gone" in r["state_note"], r
        again = exec_via(url, "cell-b", "open('whoami').read()")
        assert again["value"] == "'cell-b'" and not again.get("state_lost"), again
    finally:
        if router is not None:
            router.kill()
            router.wait()
        for c in cells.values():
            c.kill()
        witness.shutdown()
