"""Proxy mode and installs without CAP_SYS_ADMIN (issue 21, Build 8): a server run as
uid 65534, and one run as root with CAP_SYS_ADMIN dropped from every set (podman's
default), make the broker's network namespace in a user namespace of a helper's own; the
launcher enters it, so jobs reach only the broker, which forwards to allowed hosts.

Both servers are the real binary over HTTP, talked to with the MCP SDK. Every listener is
the test's own, on the host's loopback. Skipped, saying why, where user namespaces are
refused to the server.
"""

import http.server
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import LoopbackHTTP, binary, launch_http, make_wheel
from test_broker_credentials import AUTH, Index
from test_cell import GUARD, get, over_http, run, wait_until

REPO = Path(__file__).resolve().parents[2]
SHIPPED = (REPO / "policies" / "workspace-write.toml").read_text()
SETPRIV = shutil.which("setpriv") or "setpriv"
NOBODY = [SETPRIV, "--reuid=65534", "--regid=65534", "--clear-groups"]
NO_SYS_ADMIN = [SETPRIV, "--inh-caps=-sys_admin", "--bounding-set=-sys_admin"]
WHO = {"nobody": (NOBODY, "65534"), "root-without-sys-admin": (NO_SYS_ADMIN, "0")}


class Web(LoopbackHTTP):
    """A directory served over HTTP on the host's 127.0.0.1."""

    def __init__(self, directory: Path):
        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **k):
                super().__init__(*a, directory=str(directory), **k)

            def log_message(self, *a):
                pass

        super().__init__(Handler)


def real_uv() -> str:
    """uv's binary itself (a pyenv shim under /root is out of uid 65534's reach)."""
    found = subprocess.run(["python3", "-c", "import uv; print(uv.find_uv_bin())"], capture_output=True, text=True)
    path = found.stdout.strip() if found.returncode == 0 else shutil.which("uv")
    assert path, "uv is needed"
    return os.path.realpath(path)


@pytest.fixture
def tree():
    """A directory tree anyone may use: ws, state, home, a bin with uv, served dirs."""
    root = Path(tempfile.mkdtemp(prefix="mcp-broker-userns-"))
    try:
        os.chmod(root, 0o777)
        for d in ("ws", "state", "home", "bin", "uv-cache", "a", "b", "wheels"):
            (root / d).mkdir()
            os.chmod(root / d, 0o777)
        shutil.copy(real_uv(), root / "bin" / "uv")
        os.chmod(root / "bin" / "uv", 0o755)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def skip_without_user_namespaces(prefix):
    tried = subprocess.run([*prefix, "unshare", "--user", "--map-current-user", "true"],
                           capture_output=True, text=True, timeout=GUARD)
    if tried.returncode != 0:
        pytest.skip(f"user namespaces are refused to this server here: {tried.stderr.strip()}")


@pytest.mark.parametrize("who", list(WHO))
def test_proxy_mode_and_installs_go_through_the_broker_without_cap_sys_admin(server, tree, who):
    """A session under `network.mode = "proxy"` reaches an allowed loopback server through
    the broker and gets 403 in words for another; no socket reaches either directly; its
    job sits in a user namespace mapping only the server's uid, with only `lo`. An
    `env_install` from a local index on loopback that needs credentials, which the broker
    lends to uv alone (found by its connection in `/proc`), installs. `doctor`
    says the namespaces are made in a user namespace, and `/readyz` (which follows doctor's
    verdict on the chosen policy) is 200: the proxy-mode policy is enforced here."""
    prefix, uid = WHO[who]
    skip_without_user_namespaces(prefix)
    (tree / "a" / "index.html").write_text("server A")
    (tree / "b" / "index.html").write_text("server B")
    wheel = make_wheel(tree / "wheels", "tinypkg", "0.1")
    a, b, index = Web(tree / "a"), Web(tree / "b"), Index(wheel)
    where = f"127.0.0.1:{index.port}"
    policy = tree / "proxied.toml"
    policy.write_text(
        SHIPPED.replace('[network]\nmode = "none"', f'[network]\nmode = "proxy"\nallow = ["127.0.0.1:{a.port}"]')
        + f'\n[installer.network]\nmode = "proxy"\nallow = ["{where}"]\n'
    )
    assert 'mode = "proxy"' in policy.read_text()
    os.chmod(policy, 0o644)
    env = {
        **server.server_env(), "HOME": str(tree / "home"),
        "PATH": f"{tree / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "MCP_SANDBOX_WORKSPACE": str(tree / "ws"), "MCP_SANDBOX_STATE_DIR": str(tree / "state"),
        "UV_INDEX_URL": f"http://idxuser:idx-s3cret@{where}/simple",
        "UV_PYTHON_DOWNLOADS": "never", "UV_CACHE_DIR": str(tree / "uv-cache"),
    }
    doctor = subprocess.run([*prefix, binary(), "doctor", "--json"], env=env,
                            capture_output=True, text=True, timeout=GUARD, cwd=tree / "ws")
    report = json.loads(doctor.stdout)
    assert report["kernel"]["namespaces"]["in_user_namespace"], doctor.stdout
    assert report["kernel"]["euid"] == int(uid), doctor.stdout
    text = subprocess.run([*prefix, binary(), "doctor"], env=env, capture_output=True, text=True,
                          timeout=GUARD, cwd=tree / "ws").stdout
    assert "the broker's: of a helper's" in text, text
    assert f"mapping only uid {uid} to itself: {'root' if uid == '0' else 'not root'}, no CAP_SYS_ADMIN" in text, text

    proc, port, log = launch_http(server, "--no-auth", "--policy", str(policy), env=env, prefix=prefix)
    base = f"http://127.0.0.1:{port}"

    async def scenario(c):
        fetched = await c.py(
            "import urllib.request, urllib.error\n"
            "def fetch(p):\n"
            "    try:\n"
            "        return urllib.request.urlopen(f'http://127.0.0.1:{p}/', timeout=10).read().decode()\n"
            "    except urllib.error.HTTPError as e:\n"
            "        return f'{e.code} ' + e.read().decode()\n"
            f"(fetch({a.port}), fetch({b.port}))"
        )
        seen = await c.py(
            "import os, socket\n"
            "def direct(p):\n"
            "    try:\n"
            "        socket.create_connection(('127.0.0.1', p), timeout=3).close(); return 'ok'\n"
            "    except OSError as e:\n"
            "        return type(e).__name__\n"
            f"(direct({a.port}), direct({b.port}), open('/proc/self/uid_map').read().split(),"
            " [l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]],"
            " [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')])"
        )
        job = await c.finish(await c.ok("env_install", packages=["tinypkg"]), timeout=GUARD)
        imported = await c.py("import tinypkg\ntinypkg.__version__")
        return fetched, seen, job, imported

    try:
        # A uid-65534 server makes no job cgroup here: its ready answer adds doctor's
        # per-job-limits sentence after "ready" (test_cell checks its words).
        wait_until(lambda: get(base + "/readyz")[0] == 200, "readyz never turned 200")
        status, body = get(base + "/readyz")
        assert body.startswith("ready\n"), body
        assert (body == "ready\n") == (uid == "0"), body
        fetched, seen, job, imported = run(over_http, base + "/mcp", scenario)
    finally:
        proc.kill()
        proc.wait()
        for web in (a, b, index):
            web.close()
    assert fetched["status"] == "completed", (fetched, log.read_text())
    value = fetched["value"]
    assert value.startswith("('server A', '403 blocked by policy proxied: connection to 127.0.0.1:"), value
    assert f"(allowed: 127.0.0.1:{a.port})" in value, value
    assert seen["status"] == "completed", seen
    assert "'ok'" not in seen["value"], seen  # neither server reached directly
    assert f"['{uid}', '{uid}', '1'], ['lo'], ['0000000000000000'])" in seen["value"], seen
    assert job["status"] == "completed", (job, log.read_text())
    assert "tinypkg==0.1" in job["result"]["installed"], job
    assert imported["value"] == "'0.1'", imported
    uv_reads = [seen for seen in index.seen if seen[1].startswith("/simple/tinypkg")]
    assert uv_reads and all(auth == AUTH for _, _, auth in uv_reads), index.seen
