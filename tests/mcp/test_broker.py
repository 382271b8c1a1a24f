"""The network broker through a real MCP client (issue 11, Build 1-4).

- Code run by `python_run_script` and a build hook of a local sdist installed by
  `env_install` reach nothing of the host: TCP to 127.0.0.1 and ::1 listeners, UDP and a
  DNS query to host listeners, netlink, packet and vsock sockets are all refused, and their
  environment holds none of the proxy or index credentials the server had.
- Installs go through the broker: from a local find-links server on loopback they succeed
  when the policy allows that host:port and fail, naming it, when it does not.
- A session under `network = { mode = "proxy" }` reaches an allowed local HTTP server and
  is refused (403, in words) another one on the same machine.

Every listener is the test's own, on the host's loopback.
"""

import base64
import http.server
import io
import json
import socket
import tarfile
import threading
from pathlib import Path

import pytest
from conftest import LoopbackHTTP, make_wheel

REPO = Path(__file__).resolve().parents[2]
BASE_POLICY = (REPO / "policies" / "workspace-write.toml").read_text()

# Credentials the server has and no sandboxed code may see (UV_INDEX_URL is added by the
# fixture: a plain-HTTP index of the test's, for which the broker adds the credentials).
SECRETS = {
    "HTTPS_PROXY": "http://proxyuser:proxy-s3cret@127.0.0.1:9/",
    "HTTP_PROXY": "http://proxyuser:proxy-s3cret@127.0.0.1:9/",
    "NO_PROXY": "127.0.0.1",
    "UV_INDEX_CORP_USERNAME": "corp-user-s3cret",
    "UV_INDEX_CORP_PASSWORD": "corp-pass-s3cret",
    "PIP_INDEX_URL": "https://pipuser:pip-s3cret@pkgs.invalid/simple",
}
MARKERS = ["s3cret", "proxyuser", "idxuser", "pipuser"]


class Listeners:
    """TCP on 127.0.0.1 and ::1, a UDP echo and a DNS-ish responder, all on the host."""

    def __init__(self):
        self.socks = []
        self.tcp4 = self._tcp(socket.AF_INET, "127.0.0.1")
        self.tcp6 = self._tcp(socket.AF_INET6, "::1")
        self.udp = self._udp()
        self.dns = self._udp()

    def _tcp(self, family, addr):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.bind((addr, 0))
        s.listen(16)
        self.socks.append(s)

        def serve():
            while True:
                try:
                    c, _ = s.accept()
                    c.sendall(b"hello from the host\n")
                    c.close()
                except OSError:
                    return

        threading.Thread(target=serve, daemon=True).start()
        return s.getsockname()[1]

    def _udp(self):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        self.socks.append(s)

        def serve():
            while True:
                try:
                    data, peer = s.recvfrom(512)
                    s.sendto(data[:2] + b"\x81\x80" + data[4:], peer)  # echo, as a DNS answer
                except OSError:
                    return

        threading.Thread(target=serve, daemon=True).start()
        return s.getsockname()[1]

    def close(self):
        for s in self.socks:
            s.close()


def probe_source(l: Listeners) -> str:
    """Python that tries every way out and prints one PROBE line of JSON."""
    return f"""
import json, os, socket, urllib.request
DNS_QUERY = bytes.fromhex("abcd01000001000000000000076578616d706c6503636f6d0000010001")
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return f"{{type(e).__name__}}:{{e.errno}}"
    except Exception as e:
        return type(e).__name__
def tcp4():
    socket.create_connection(("127.0.0.1", {l.tcp4}), timeout=3).recv(5)
def tcp6():
    socket.create_connection(("::1", {l.tcp6}), timeout=3).recv(5)
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
    s.sendto(b"ping", ("127.0.0.1", {l.udp})); s.recvfrom(100)
def dns():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
    s.sendto(DNS_QUERY, ("127.0.0.1", {l.dns})); s.recvfrom(512)
def resolve():
    socket.getaddrinfo("example.com", 443)
def proxied():
    urllib.request.urlopen("http://127.0.0.1:{l.tcp4}/", timeout=5).read()
def netlink():
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()
def packet():
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close()
def vsock():
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM, 0).close()
res = {{n: attempt(f) for n, f in [("tcp4", tcp4), ("tcp6", tcp6), ("udp", udp), ("dns", dns),
        ("resolve", resolve), ("proxied", proxied), ("netlink", netlink), ("packet", packet),
        ("vsock", vsock)]}}
markers = {MARKERS!r}
res["env_hits"] = sorted(k for k, v in os.environ.items() if any(m in k + "=" + v for m in markers))
res["proxy_env"] = {{k: v for k, v in os.environ.items() if "PROXY" in k.upper()}}
print("PROBE" + json.dumps(res), flush=True)
"""


def control(l: Listeners):
    """The listeners answer from the host: a refusal below is the sandbox's doing."""
    for fam, addr, port in [(socket.AF_INET, "127.0.0.1", l.tcp4), (socket.AF_INET6, "::1", l.tcp6)]:
        with socket.socket(fam, socket.SOCK_STREAM) as s:
            s.settimeout(3)
            s.connect((addr, port))
            assert s.recv(5) == b"hello"
    for port in (l.udp, l.dns):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(3)
            s.sendto(b"ping", ("127.0.0.1", port))
            assert s.recvfrom(100)[0]


def parse_probe(text: str) -> dict:
    for line in text.splitlines():
        i = line.find("PROBE{")
        if i >= 0:
            return json.loads(line[i + len("PROBE") :])
    raise AssertionError(f"no PROBE line in: {text[-3000:]}")


def assert_confined(res: dict, where: str):
    for name in ["tcp4", "tcp6", "udp", "dns", "resolve", "proxied", "netlink", "packet", "vsock"]:
        assert res[name] != "ok", f"{where}: {name} got through: {res}"
    assert res["env_hits"] == [], f"{where}: credentials in the environment: {res}"
    for k, v in res["proxy_env"].items():
        assert "@" not in v and "127.0.0.1:9/" not in v, f"{where}: the server's proxy leaked: {k}={v}"


@pytest.fixture
def listeners():
    l = Listeners()
    control(l)
    yield l
    l.close()


@pytest.fixture
def local_wheels(server):
    """Wheels in a local directory; an empty plain-HTTP index on the host's loopback with
    credentials in UV_INDEX_URL; the server holds proxy and index credentials it must keep."""
    wheels = server.root / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "tinypkg", "0.1")
    (server.root / "index").mkdir()
    index = Web(server.root / "index")
    server.env.update(SECRETS)
    server.env.update(
        UV_INDEX_URL=f"http://idxuser:idx-s3cret@127.0.0.1:{index.port}/simple",
        UV_FIND_LINKS=str(wheels),
        UV_PYTHON_DOWNLOADS="never",
    )
    server.index = index
    yield server
    index.close()


def test_script_code_reaches_nothing_of_the_host(local_wheels, listeners):
    """python_run_script code, with and without dependencies (then it runs on a transient
    venv's interpreter, after uv built it through the broker), is refused every way out."""
    src = probe_source(listeners)

    async def scenario(c):
        for deps in ([], ["tinypkg"]):
            code = ("import tinypkg\n" if deps else "") + src
            job = await c.finish(await c.ok("python_run_script", code=code, dependencies=deps), timeout=120)
            assert job["status"] == "completed", job
            assert_confined(parse_probe(job["all_stdout"]), f"script deps={deps}")
        # uv asked the index through the broker, which added the credentials uv never had.
        assert "Basic " + base64.b64encode(b"idxuser:idx-s3cret").decode() in local_wheels.index.auth, local_wheels.index.auth

    local_wheels.run(scenario, timeout=240)


def make_hook_sdist(dest: Path, source: str) -> Path:
    """A local sdist whose in-tree build backend runs `source` and fails, so that uv shows
    the hook's output."""
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "hookbackend"\nbackend-path = ["."]\n\n'
        '[project]\nname = "hookpkg"\nversion = "0.1"\n',
        "PKG-INFO": "Metadata-Version: 2.1\nName: hookpkg\nVersion: 0.1\n",
        "hookbackend.py": "def get_requires_for_build_wheel(config_settings=None):\n    return []\n\n"
        "def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):\n"
        "    import sys\n"
        + "\n".join("    " + line for line in source.splitlines())
        + "\n    sys.exit('hook done')\n",
    }
    path = dest / "hookpkg-0.1.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"hookpkg-0.1/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_build_hook_reaches_nothing_of_the_host(local_wheels, listeners):
    """A local sdist's build hook, run by env_install under the installer's rules (its
    network: the broker only), is refused every way out and sees no credentials."""
    sdist = make_hook_sdist(local_wheels.workspace, probe_source(listeners))

    async def scenario(c):
        res = await c.call("env_install", packages=[str(sdist)])
        job = await c.finish(res.structured_content, timeout=120)
        text = job["all_stdout"] + job["all_stderr"] + (job.get("message") or "")
        res = parse_probe(text)
        assert_confined(res, "build hook")
        # The hook had the broker as its proxy, and the broker refused the host listener.
        assert res["proxy_env"].get("HTTP_PROXY", "").startswith("http://127.0.0.1:"), json.dumps(res)
        assert res["proxied"].startswith("HTTPError"), res

    local_wheels.run(scenario, timeout=240)


class Web(LoopbackHTTP):
    """A directory served over HTTP on the host's 127.0.0.1 (like `python3 -m http.server`);
    the Authorization headers it was sent are kept."""

    def __init__(self, directory: Path):
        self.auth = []
        web = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **k):
                super().__init__(*a, directory=str(directory), **k)

            def do_GET(self):
                web.auth.append(self.headers.get("Authorization"))
                super().do_GET()

            def log_message(self, *a):
                pass

        super().__init__(Handler)


def installer_policy(root: Path, allow: list[str]) -> Path:
    path = root / f"installer-{len(allow)}-{abs(hash(tuple(allow)))}.toml"
    path.write_text(BASE_POLICY + f"\n[installer.network]\nmode = \"proxy\"\nallow = {json.dumps(allow)}\n")
    return path


def test_install_through_broker_from_a_local_index(server):
    """uv fetches wheels from a find-links server on the host's loopback through the
    broker: allowed host:port → installed; not allowed → failed, in words naming it."""
    wheels = server.root / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "tinypkg", "0.1")
    web = Web(wheels)
    where = f"127.0.0.1:{web.port}"
    # The same server is the (empty) index and the find-links page.
    server.env.update(
        UV_INDEX_URL=f"http://{where}/simple", UV_FIND_LINKS=f"http://{where}/", UV_PYTHON_DOWNLOADS="never"
    )

    async def allowed(c):
        job = await c.finish(await c.ok("env_install", packages=["tinypkg"]), timeout=120)
        assert job["status"] == "completed", job
        assert "tinypkg==0.1" in job["result"]["installed"]
        r = await c.py("import tinypkg\ntinypkg.__version__")
        assert r["value"] == "'0.1'", r

    async def refused(c):
        res = await c.call("env_install", packages=["tinypkg"], session="other")
        job = await c.finish(res.structured_content, timeout=120)
        assert job["status"] == "failed", job
        words = job["message"] + json.dumps(job["result"])
        assert f"connection to {where}" in words and "blocked by policy" in words, words
        assert "pypi.org" in words, words  # what is allowed instead
        assert any(d.startswith(f"blocked by policy") and where in d for d in job.get("denied", [])), job

    try:
        server.run(allowed, "--policy", str(installer_policy(server.root, [where])), timeout=240)
        server.run(refused, "--policy", str(installer_policy(server.root, ["pypi.org"])), timeout=240)
    finally:
        web.close()


def test_session_in_proxy_mode_reaches_only_the_allowed_server(server, listeners):
    """A session policy in proxy mode: the allowed local server answers through the proxy;
    another on the same machine gets 403 in words; no socket reaches either directly."""
    (server.root / "a").mkdir()
    (server.root / "a" / "index.html").write_text("server A")
    (server.root / "b").mkdir()
    (server.root / "b" / "index.html").write_text("server B")
    a, b = Web(server.root / "a"), Web(server.root / "b")
    policy = server.root / "proxy.toml"
    policy.write_text(
        BASE_POLICY.replace('[network]\nmode = "none"', f'[network]\nmode = "proxy"\nallow = ["127.0.0.1:{a.port}"]')
    )
    assert 'mode = "proxy"' in policy.read_text()

    async def scenario(c):
        r = await c.py(f"import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{a.port}/', timeout=10).read().decode()")
        assert r["status"] == "completed" and r["value"] == "'server A'", r
        r = await c.py(
            "import urllib.request, urllib.error\n"
            "try:\n"
            f"    urllib.request.urlopen('http://127.0.0.1:{b.port}/', timeout=10).read()\n"
            "    out = 'reached'\n"
            "except urllib.error.HTTPError as e:\n"
            "    out = f'{e.code} ' + e.read().decode()\n"
            "out"
        )
        assert r["status"] == "completed", r
        assert r["value"].startswith("'403 blocked by policy proxy: connection to 127.0.0.1:"), r
        assert f"(allowed: 127.0.0.1:{a.port})" in r["value"], r
        code = probe_source(listeners) + (
            "import socket\n"
            "def direct(p):\n"
            "    try:\n"
            "        socket.create_connection(('127.0.0.1', p), timeout=3).close(); return 'ok'\n"
            "    except OSError as e:\n"
            "        return type(e).__name__\n"
            f"print('DIRECT', direct({a.port}), direct({b.port}))\n"
        )
        r = await c.py(code)
        assert r["status"] == "completed", r
        out = r["stdout"]["text"]
        res = parse_probe(out)
        for name in ["tcp4", "tcp6", "udp", "dns", "resolve", "proxied", "netlink", "packet", "vsock"]:
            assert res[name] != "ok", f"session: {name} got through: {res}"
        assert out.split("DIRECT")[1].split() == [x for x in out.split("DIRECT")[1].split() if x != "ok"], out

    try:
        server.run(scenario, "--policy", str(policy), timeout=180)
    finally:
        a.close()
        b.close()
