#!/usr/bin/env python3
"""Cold start of a cell: the image under podman + runc behind a router like sandbox-router,
beside the bare server (the binary on the host) in the same run. Not part of the tests.

Each trial, for the container cell and for the bare server alike:
  cold     fresh state dir: start → GET /readyz 200 (asked directly, as a kubelet does)
           → the first `python_exec` answered through the router (an MCP client that sends
           X-Sandbox-ID and no token to HAProxy, which routes on that header and strips
           Authorization, as agent-sandbox's sandbox-router does);
  restart  SIGKILL (a pod lost), then the same steps on the same state dir; that first
           answer must carry `state_lost` (the session's worker died with the old server).

    python3 tests/bench/cold_start.py [--image IMAGE] [--n 10] [--write]
    python3 tests/bench/cold_start.py --smoke [--image IMAGE]

--smoke instead starts cells in five settings behind the router — `--privileged`; podman's
defaults; a user namespace (container root = host uid 200000) without and with
CAP_SYS_ADMIN inside it, and with a delegated cgroup subtree — checks whether
python_exec and a shell job answer through the router in each (or how they are refused),
that a request naming another cell is refused, and prints `doctor` from inside each
(docs/deploy.md records it); then drains the privileged cell with `podman stop` while a job runs.

Needs root, podman, runc, haproxy; the image from deploy/build-image.sh; the release
binary (the release build under target/<host triple>/; MCP_SANDBOX_BIN overrides). --write replaces the section
"Cold start of a cell" of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import binary, cpu_model, write_section  # noqa: E402

HEADING = "## Cold start of a cell"
GUARD = 120  # hang guard for any one step, seconds
PODMAN = ["podman", "--runtime", "runc"]  # crun refuses this host's hybrid cgroups
# podman's defaults here cannot be applied by runc (rlimit errors): give them explicitly.
ULIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]
# An unprivileged cell: container root is uid 200000.. on the host; CAP_SYS_ADMIN only in
# that user namespace (it owns the cell's mount, network and PID namespaces).
MAPPED = ["--uidmap", "0:200000:65536", "--gidmap", "0:200000:65536"]
USERNS = [*MAPPED, "--cap-add", "SYS_ADMIN"]
PRIVILEGED = ["--privileged"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def wait_ready(base: str, alive) -> None:
    """Until GET /readyz answers 200 (polled every 10 ms, as fast as a probe could)."""
    deadline = time.monotonic() + GUARD
    while get(base + "/readyz")[0] != 200:
        if not alive():
            raise RuntimeError(f"the cell at {base} exited before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"hang guard: {base}/readyz never turned 200: {get(base + '/readyz')}")
        time.sleep(0.01)


async def first_exec(router: str, cell: str, code: str = "6 * 7") -> dict:
    """One MCP client through the router, as a tenant's: X-Sandbox-ID, no token."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    client = create_mcp_http_client(headers={"X-Sandbox-ID": cell, "Authorization": "Bearer stripped-by-the-router"})
    with anyio.fail_after(GUARD):
        async with client, streamable_http_client(router + "/mcp", http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                res = await s.call_tool("python_exec", {"code": code}, read_timeout_seconds=GUARD)
                text = " ".join(getattr(c, "text", "") for c in res.content)
                if res.is_error:
                    raise RuntimeError(f"python_exec in {cell} failed: {text}")
                return res.structured_content


async def exec_in_session(router: str, cell: str, session: str) -> None:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    client = create_mcp_http_client(headers={"X-Sandbox-ID": cell})
    with anyio.fail_after(GUARD):
        async with client, streamable_http_client(router + "/mcp", http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                res = await s.call_tool("python_exec", {"code": "x = list(range(1000)); len(x)", "session": session},
                                        read_timeout_seconds=GUARD)
                if res.is_error:
                    raise RuntimeError(f"python_exec in session {session} failed: {res.content}")


async def shell_nowait(router: str, cell: str, command: str) -> str:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    client = create_mcp_http_client(headers={"X-Sandbox-ID": cell})
    with anyio.fail_after(GUARD):
        async with client, streamable_http_client(router + "/mcp", http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                res = await s.call_tool("shell_run", {"command": command, "wait_seconds": 0.2}, read_timeout_seconds=GUARD)
                return f"{res.structured_content.get('job_id')} {res.structured_content.get('status')}"


async def shell(router: str, cell: str, command: str) -> dict:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    client = create_mcp_http_client(headers={"X-Sandbox-ID": cell})
    with anyio.fail_after(GUARD):
        async with client, streamable_http_client(router + "/mcp", http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                res = await s.call_tool("shell_run", {"command": command, "wait_seconds": 30}, read_timeout_seconds=GUARD)
                return {"is_error": res.is_error, **(res.structured_content or {}),
                        "text": " ".join(getattr(c, "text", "") for c in res.content)}


# --- the router -----------------------------------------------------------------------


class Router:
    """HAProxy configured like sandbox-router: route on X-Sandbox-ID (a backend per cell),
    400 without it, Authorization stripped before forwarding; an unknown id gets 502."""

    def __init__(self, root: Path, cells: dict[str, int]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = root / "haproxy.cfg"
        lines = [
            "global", "  maxconn 512", "defaults", "  mode http", "  timeout connect 5s",
            f"  timeout client {GUARD}s", f"  timeout server {GUARD}s",
            "frontend router", f"  bind 127.0.0.1:{self.port}",
            "  http-request return status 400 content-type application/json"
            ' string \'{"detail":"X-Sandbox-ID header is required."}\''
            " unless { req.hdr(X-Sandbox-ID) -m found }",
            "  http-request del-header Authorization",
            "  use_backend cell-%[req.hdr(X-Sandbox-ID),lower]",
            "  default_backend unknown",
            "backend unknown",
            "  http-request return status 502 content-type application/json"
            ' string \'{"detail":"Could not connect to the backend sandbox"}\'',
        ]
        for name, port in cells.items():
            lines += [f"backend cell-{name}", f"  server {name} 127.0.0.1:{port}"]
        cfg.write_text("\n".join(lines) + "\n")
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                                     stderr=open(root / "haproxy.log", "w"))
        deadline = time.monotonic() + GUARD
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"haproxy did not start: {(root / 'haproxy.log').read_text()}")
                time.sleep(0.02)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=GUARD)


# --- cells ----------------------------------------------------------------------------


class ContainerCell:
    def __init__(self, name: str, image: str, data: Path, port: int, mode: list[str]):
        self.name, self.image, self.data, self.port, self.mode = name, image, data, port, mode
        self.base = f"http://127.0.0.1:{port}"

    def start(self) -> None:
        subprocess.run(
            [*PODMAN, "run", "-d", "--name", self.name, *ULIMITS, *self.mode,
             "-e", "MCP_SANDBOX_ROUTER_AUTH=true", "-e", f"MCP_SANDBOX_CELL_ID={self.name}",
             "-v", f"{self.data}:/data", "-p", f"127.0.0.1:{self.port}:8888", self.image],
            check=True, capture_output=True, timeout=GUARD,
        )

    def alive(self) -> bool:
        out = subprocess.run([*PODMAN, "inspect", "-f", "{{.State.Running}}", self.name],
                             capture_output=True, text=True)
        return out.stdout.strip() == "true"

    def kill(self) -> None:
        subprocess.run([*PODMAN, "kill", "-s", "KILL", self.name], capture_output=True, timeout=GUARD)
        subprocess.run([*PODMAN, "rm", "-f", "-t", "0", self.name], capture_output=True, timeout=GUARD)

    def memory(self) -> str:
        """The container cgroup's memory use (v1: usage_in_bytes, page cache included)."""
        out = subprocess.run([*PODMAN, "stats", "--no-stream", "--format", "{{.MemUsage}}", self.name],
                             capture_output=True, text=True, timeout=GUARD)
        return out.stdout.strip() or out.stderr.strip()

    def doctor(self) -> str:
        out = subprocess.run([*PODMAN, "exec", self.name, "mcp-sandbox-repl", "doctor"],
                             capture_output=True, text=True, timeout=GUARD)
        return out.stdout + out.stderr

    def logs(self) -> str:
        out = subprocess.run([*PODMAN, "logs", self.name], capture_output=True, text=True)
        return out.stdout + out.stderr


class BareCell:
    """The same server as a process on the host: same flags, same steps."""

    def __init__(self, name: str, data: Path, port: int):
        self.name, self.data, self.port = name, data, port
        self.base = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        (self.data / "workspace").mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [binary(), "--transport", "http", "--listen", f"127.0.0.1:{self.port}", "--router-auth",
             "--cell-id", self.name, "--state-dir", str(self.data / "state"),
             "--workspace", str(self.data / "workspace"), "--python", "/usr/bin/python3"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(self.data / "server.log", "a"),
            env={k: v for k, v in os.environ.items() if not k.startswith("MCP_SANDBOX_")},
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=GUARD)


def trial(cell, router: Router) -> tuple[dict[str, float], dict]:
    """Seconds from the start to: the start command returned (`podman run -d`: the
    container is running; the bare server: spawned), /readyz 200, the first python_exec
    answered through the router; and that answer."""
    t0 = time.perf_counter()
    cell.start()
    started = time.perf_counter() - t0
    wait_ready(cell.base, cell.alive)
    ready = time.perf_counter() - t0
    answer = anyio.run(first_exec, router.url, cell.name)
    return {"started": started, "ready": ready, "answered": time.perf_counter() - t0}, answer


# --- the benchmark -------------------------------------------------------------------


def spread(values: list[float]) -> str:
    qs = statistics.quantiles(values, n=4) if len(values) >= 2 else values * 3
    return f"{statistics.median(values) * 1000:.0f} ms (IQR {qs[0] * 1000:.0f}–{qs[2] * 1000:.0f}, min {min(values) * 1000:.0f}, max {max(values) * 1000:.0f})"


def bench(args) -> str:
    root = Path(tempfile.mkdtemp(prefix="cold-start-", dir="/var/tmp"))
    ports = {"bench-cell": free_port(), "bench-bare": free_port()}
    router = Router(root, ports)
    subprocess.run([*PODMAN, "rm", "-f", "-t", "0", "bench-cell"], capture_output=True)
    results: dict[tuple[str, str], dict[str, list[float]]] = {}
    loads = []
    try:
        for i in range(args.n):
            for kind in ("container", "bare"):
                data = root / f"{kind}-{i}"
                data.mkdir()
                cell = (ContainerCell("bench-cell", args.image, data, ports["bench-cell"], PRIVILEGED)
                        if kind == "container" else BareCell("bench-bare", data, ports["bench-bare"]))
                loads.append(os.getloadavg()[0])
                try:
                    for phase in ("cold", "restart"):
                        times, answer = trial(cell, router)
                        if phase == "restart" and not answer.get("state_lost"):
                            raise RuntimeError(f"{kind} restart answered without state_lost: {answer}")
                        if answer.get("value") != "42":
                            raise RuntimeError(f"{kind} {phase}: unexpected answer {answer}")
                        r = results.setdefault((kind, phase), {k: [] for k in times})
                        for k, v in times.items():
                            r[k].append(v)
                        cell.kill()
                finally:
                    cell.kill()
                print(f"trial {i + 1}/{args.n} {kind}: "
                      + ", ".join(f"{p} {results[(kind, p)]['answered'][-1] * 1000:.0f} ms" for p in ("cold", "restart")),
                      file=sys.stderr)
    finally:
        router.stop()
        shutil.rmtree(root, ignore_errors=True)

    def med(kind, phase, what):
        return statistics.median(results[(kind, phase)][what])

    rows = []
    for phase in ("cold", "restart"):
        for what, label in (("started", "start → running (`podman run -d` returned / spawned)"),
                            ("ready", "start → `/readyz` 200"),
                            ("answered", "start → first `python_exec` answered")):
            c, b = med("container", phase, what), med("bare", phase, what)
            ratio = f"{c / b:.2f}×" if b >= 0.005 else "—"
            rows.append(f"| {phase} | {label} | {spread(results[('container', phase)][what])} | "
                        f"{spread(results[('bare', phase)][what])} | {ratio} |")
    version = subprocess.run([binary(), "--version"], capture_output=True, text=True).stdout.strip()
    return "\n".join([
        HEADING,
        "",
        f"`python3 tests/bench/cold_start.py --n {args.n}` ({time.strftime('%Y-%m-%d')}, {version}, "
        f"image `{args.image}`; {cpu_model()}, {os.cpu_count()} cores shared with other work: "
        f"1-min load {min(loads):.1f}–{max(loads):.1f}, median {statistics.median(loads):.1f}). "
        f"n = {args.n} trials of each, alternating container and bare; median (interquartile range, min, max).",
        "",
        "A **container cell** is the image under podman + runc, `--privileged`, its `/data` a host "
        "directory, its port published on loopback; the **bare server** is the same release binary run "
        "on the host with the same flags (`--router-auth --cell-id`, state dir and workspace in a fresh "
        "directory). Both are asked `/readyz` directly every 10 ms (a kubelet's probe) and answer "
        "`python_exec` through HAProxy routing on `X-Sandbox-ID` (a new MCP client: `initialize`, then "
        "the call). **cold**: a fresh state dir. **restart**: SIGKILL (`podman kill` / `kill -9`), then "
        "the same steps on the same state dir; the first answer carries `state_lost: true` (checked).",
        "",
        "| | step | container cell | bare server | ratio (medians) |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"Reading it: of the {(med('container', 'cold', 'ready') - med('bare', 'cold', 'ready')) * 1000:.0f} ms "
        f"the container adds before `/readyz` (cold), `podman run -d` itself takes "
        f"{med('container', 'cold', 'started') * 1000:.0f} ms (the container's mounts, its network namespace and "
        "port forwarding, runc); the rest is the server starting in it. A restart is quicker than a cold "
        "start on both sides, presumably because the state dir already holds what a first start makes "
        "(the remembered interpreter probe, for one; not broken down further). On Kubernetes the pod's scheduling, image pull and volume attach "
        "come on top, and a warm pool (`deploy/kubernetes/sandboxwarmpool.yaml`) takes all of it off a "
        "claim's path: a claim adopts a cell whose `/readyz` is already 200.",
        "",
    ])


# --- the smoke check ------------------------------------------------------------------


def delegate_cgroups(name: str, uid: int) -> list[str]:
    """A cgroup v1 subtree per controller for one cell, owned by its root uid, bound over
    the container's /sys/fs/cgroup/<controller> (with a private cgroup namespace the server
    finds its own cgroup at "/" and makes its jobs' cgroups there): what systemd's
    Delegate=yes or a delegating runtime does. Returns the podman arguments."""
    out = ["--cgroupns=private"]
    for controller in ("pids", "memory"):
        path = Path("/sys/fs/cgroup") / controller / "mcp-cells" / name
        path.mkdir(parents=True, exist_ok=True)
        for p in [path, *path.iterdir()]:
            os.chown(p, uid, uid)
        out += ["-v", f"{path}:/sys/fs/cgroup/{controller}:rw"]
    return out


def remove_cgroups(name: str) -> None:
    for controller in ("pids", "memory"):
        path = Path("/sys/fs/cgroup") / controller / "mcp-cells" / name
        for sub in [*sorted(path.glob("**/"), key=lambda p: len(p.parts), reverse=True), path.parent]:
            try:
                sub.rmdir()
            except OSError:
                pass  # not empty (another cell's), or gone


def settle(cell) -> tuple[int, str]:
    """/readyz once the cell is no longer starting: 200, or 503 with the reason it refuses."""
    deadline = time.monotonic() + GUARD
    while True:
        status, text = get(cell.base + "/readyz")
        if status == 200 or (status == 503 and not text.startswith("starting")):
            return status, text.strip()
        if not cell.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"{cell.name} never settled: {status} {text}\n{cell.logs()}")
        time.sleep(0.05)


def smoke(args) -> None:
    root = Path(tempfile.mkdtemp(prefix="cells-smoke-", dir="/var/tmp"))
    modes = {
        "cell-priv": PRIVILEGED,                                       # --privileged
        "cell-default": [],                                            # podman's defaults, host root
        "cell-mapped-cg": MAPPED + delegate_cgroups("cell-mapped-cg", 200000),  # user ns, no added cap
        "cell-userns": USERNS,                                         # user ns + CAP_SYS_ADMIN in it
        "cell-userns-cg": USERNS + delegate_cgroups("cell-userns-cg", 200000),  # ... + a cgroup subtree
    }
    cells = {name: ContainerCell(name, args.image, root / name, free_port(), mode) for name, mode in modes.items()}
    for name, cell in cells.items():
        cell.kill()  # one left by an interrupted run
        cell.data.mkdir()
        if "--uidmap" in cell.mode:
            os.chown(cell.data, 200000, 200000)  # the container's root owns its volume
    router = Router(root, {n: c.port for n, c in cells.items()})
    try:
        for name, cell in cells.items():
            print(f"\n######## {name}: podman run {' '.join(cell.mode)}")
            cell.start()
            status, text = settle(cell)
            print(f"== /readyz: {status} {text}")
            try:
                answer = anyio.run(first_exec, router.url, name, "import os; (6 * 7, os.getuid())")
                print(f"== python_exec through the router: value {answer.get('value')}")
            except Exception as e:  # noqa: BLE001 - the refusal is what we record
                while isinstance(e, BaseExceptionGroup):
                    e = e.exceptions[0]
                print(f"== python_exec through the router: refused: {e}")
            job = anyio.run(shell, router.url, name,
                            "cat /proc/self/uid_map; ls /proc | grep -c '^[0-9]'; cat /proc/self/cgroup | grep -E 'pids|memory';"
                            " ls /data 2>&1 | head -1; python3 -c 'import socket; socket.socket()' 2>&1 | tail -1")
            out = job.get("stdout") or {}
            err = job.get("stderr") or {}
            print(f"== shell_run through the router: error={job.get('is_error')} exit={job.get('exit_code')}"
                  f" {job.get('error') or ''}\n{out.get('text', '') if isinstance(out, dict) else out}"
                  f"{err.get('text', '') if isinstance(err, dict) else err}denied: {job.get('denied')}")
            other = next(n for n in cells if n != name)
            req = urllib.request.Request(cell.base + "/mcp", data=b"{}", method="POST",
                                         headers={"X-Sandbox-ID": other, "Content-Type": "application/json",
                                                  "Accept": "application/json, text/event-stream"})
            try:
                urllib.request.urlopen(req, timeout=10)
                print(f"== a request naming {other} sent to this cell: NOT refused")
            except urllib.error.HTTPError as e:
                print(f"== a request naming {other} sent to this cell: {e.code} {e.read().decode().strip()}")
            if name == "cell-priv":
                print(f"== memory of the container, ready and one python_exec answered: {cell.memory()}")
                for i in range(7):
                    anyio.run(exec_in_session, router.url, name, f"s{i}")
                print(f"== memory of the container, after a python_exec in each of 7 more sessions (8 in all, the default --max-sessions): {cell.memory()}")
                print(f"== disk of /data: {subprocess.run(['du', '-sh', str(cell.data)], capture_output=True, text=True).stdout.split()[0]}")
            print(f"== doctor\n{cell.doctor()}")
        status, text = get(router.url + "/mcp")
        print(f"== router, no X-Sandbox-ID: {status} {text}")
        drain(cells["cell-priv"], router)
    finally:
        for cell in cells.values():
            cell.kill()
        router.stop()
        remove_cgroups("cell-userns-cg")
        remove_cgroups("cell-mapped-cg")
        shutil.rmtree(root, ignore_errors=True)


def drain(cell: ContainerCell, router: Router) -> None:
    """`podman stop` (SIGTERM through tini) while a 4 s job runs: /readyz turns 503, a new
    job is refused in words, the running one finishes, the container stops after it."""
    async def start_job():
        return await shell_nowait(router.url, cell.name, "sleep 4; echo finished > /data/workspace/drained.txt")

    print(f"== drain: a job started: {anyio.run(start_job)}")
    t0 = time.perf_counter()
    stop = subprocess.Popen([*PODMAN, "stop", "-t", "45", cell.name], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + GUARD
    while (status := get(cell.base + "/readyz"))[0] == 200 and time.monotonic() < deadline:
        time.sleep(0.02)
    print(f"== drain: /readyz after SIGTERM: {status[0]} {status[1].strip()}")
    refused = anyio.run(shell, router.url, cell.name, "echo new")
    print(f"== drain: a new job: error={refused.get('is_error')} {refused.get('error') or refused.get('text')}")
    stop.wait(timeout=GUARD)
    done = cell.data / "workspace" / "drained.txt"
    print(f"== drain: the container stopped after {time.perf_counter() - t0:.1f} s; the running job "
          f"{'finished' if done.exists() else 'did NOT finish'}")
    print("\n".join(line for line in cell.logs().splitlines() if "drain" in line))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", default=None, help="default: localhost/mcp-sandbox-repl:<version of the binary>")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--write", action="store_true", help="replace the section in docs/benchmarks.md")
    ap.add_argument("--smoke", action="store_true", help="two cells (privileged, user namespace), doctor in each")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("cold_start.py: run as root (podman with runc, haproxy, a user-namespace mapping)")
    for tool in ("podman", "runc", "haproxy"):
        if not shutil.which(tool):
            sys.exit(f"cold_start.py: {tool} is not installed (apt-get install -y {tool})")
    if args.image is None:
        version = subprocess.run([binary(), "--version"], capture_output=True, text=True).stdout.split()[-1]
        args.image = f"localhost/mcp-sandbox-repl:{version}"
    if args.smoke:
        smoke(args)
        return
    text = bench(args)
    print(text)
    if args.write:
        write_section(HEADING, text)


if __name__ == "__main__":
    main()
