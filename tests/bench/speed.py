#!/usr/bin/env python3
"""Issue 28 ("speed back ahead"): every figure beside its same-run baselines, in one run.

    python3 tests/bench/speed.py [--bin target/<triple>/release/mcp-sandbox-repl] [--calls 300]
        [--first 10] [--first-peers 30] [--launch 60] [--envs 12] [--parallel 3] [--baseline BIN] [--no-write]

Not part of the test run. Measures, in turns so load bursts land on every column alike:
- trivial `python_exec 1`: this server with default settings (snapshots on, taken only in
  idle time), the same with snapshots off, another build with default settings
  (`--baseline`, e.g. main's, to show what a change gained), beside the no-op rmcp echo server
  (`examples/noop_server.rs`) and peer REPL servers from PyPI (`mcp-python-repl`,
  `mcp-python`; installed into a venv given by --peers, skipped if absent). All open at
  once; blocks of 25 calls each in turn; official `mcp` SDK client with its client-side
  output-schema check off (client work, not server work; only our tools declare schemas);
- first `python_exec` from `initialize` (the request sent → the cell answered), a server
  per sample on the same state dir (what an earlier server remembered counts), with the
  default `python3` (on this machine a pyenv shim) and with /usr/bin/python3; the peer's
  first `repl_run_code` the same way (in the first --first-peers rounds only: a peer's
  start takes ~0.7 s);
- the launcher: `/bin/true` bare, under bubblewrap (`--unshare-all`), through
  `run --policy workspace-write` (the baselines the launcher owner's figures stand on);
- `env_install` of a small local wheel into the session venv against `uv pip install` of
  the same into a venv by hand; `python_run_script` with one dependency against `uv run
  --with`; separate but equally prepared warm uv caches, offline (find-links);
- 8 sessions executing at once (200 trivial calls each): aggregate calls/s, snapshots on
  (default) against off, alternating servers.
Writes the section "## Speed (issue 28), <date> <time> UTC" of docs/benchmarks.md unless --no-write.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from envs import make_wheel, precache, real_python, real_uv, uv_env  # noqa: E402
from common import build_dir, cpu_model, write_section  # noqa: E402


async def _no_client_validation(self, name, result):
    return None


ClientSession.validate_tool_result = _no_client_validation

REPO = Path(__file__).resolve().parents[2]
# Date and time in the heading: a second run the same day adds its own section instead of
# replacing the first run's figures (write_section replaces a section of the same heading).
SECTION = f"## Speed (issue 28), {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def q(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


def fmt(xs: list[float]) -> str:
    if not xs:
        return "—"
    return f"{statistics.median(xs) * 1000:.2f} ms (p95 {q(xs, 0.95) * 1000:.2f}, n={len(xs)})"


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# Settings of ours given on the command line (`--set NAME=VALUE`): default none.
OURS_SETTINGS: dict[str, str] = {}


def server_env(root: Path, **extra: str) -> dict:
    ws, state = root / "ws", root / "state"
    ws.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_SANDBOX_")}
    env.update(MCP_SANDBOX_WORKSPACE=str(ws), MCP_SANDBOX_STATE_DIR=str(state), RUST_LOG="error")
    env.update(OURS_SETTINGS)
    env.update(extra)
    return env


def params_of(binary: str, env: dict, args: list[str] | None = None) -> StdioServerParameters:
    return StdioServerParameters(command=binary, args=args or [], env=env, cwd=env.get("MCP_SANDBOX_WORKSPACE"))


class Peer:
    """A server and how to make one trivial call on it."""

    def __init__(self, name: str, params: StdioServerParameters, tool: str, args):
        self.name, self.params, self.tool, self.args = name, params, tool, args
        self.state: dict = {}

    async def call(self, s: ClientSession) -> float:
        a = self.args(self.state)
        t = time.perf_counter()
        res = await s.call_tool(self.tool, a)
        took = time.perf_counter() - t
        assert not res.is_error, (self.name, res)
        if self.name == "mcp-python-repl" and "sid" not in self.state:
            text = "".join(getattr(c, "text", "") for c in res.content)
            import re

            m = re.search(r'"session_id"\s*:\s*"([^"]+)"', text) or re.search(r"session[_ ]id[\"':\s]+([A-Za-z0-9_-]+)", text)
            if m:
                self.state["sid"] = m.group(1)
        return took


BASELINE_HOT = "baseline build (`--baseline`), default settings"


def peers(args, root: Path) -> list[Peer]:
    out = [
        Peer("ours (default: snapshots on)", params_of(args.bin, server_env(root / "hot")), "python_exec", lambda _: {"code": "1"}),
        Peer("ours, snapshots off", params_of(args.bin, server_env(root / "hot-off", MCP_SANDBOX_MAX_SNAPSHOTS="0")),
             "python_exec", lambda _: {"code": "1"}),
        Peer("no-op rmcp echo", params_of(args.noop, server_env(root / "noop")), "noop", lambda _: {}),
    ]
    if args.baseline:
        out.insert(1, Peer(BASELINE_HOT, params_of(args.baseline, server_env(root / "hot-base")),
                           "python_exec", lambda _: {"code": "1"}))
    bin_dir = Path(args.peers) / "bin"
    if (bin_dir / "mcp-python-repl").exists():
        out.append(Peer("mcp-python-repl", params_of(str(bin_dir / "mcp-python-repl"), server_env(root / "p1")),
                        "repl_run_code",
                        lambda st: {"params": {"code": "1", **({"session_id": st["sid"]} if "sid" in st else {})}}))
    if (bin_dir / "mcp-python").exists():
        out.append(Peer("mcp-python", params_of(str(bin_dir / "mcp-python"), server_env(root / "p2")),
                        "execute_python", lambda _: {"code": "1"}))
    return out


async def hot(args, root: Path) -> dict:
    ps = peers(args, root)
    res = {p.name: [] for p in ps}
    async with contextlib.AsyncExitStack() as stack:
        sessions = []
        for p in ps:
            r, w = await stack.enter_async_context(stdio_client(p.params, errlog=open(os.devnull, "w")))
            s = await stack.enter_async_context(ClientSession(r, w))
            await s.initialize()
            for _ in range(5):  # warm-up (worker start, first imports, a peer's session)
                await p.call(s)
            sessions.append(s)
        block = 25
        for _ in range(max(1, args.calls // block)):
            for p, s in zip(ps, sessions):
                for _ in range(block):
                    res[p.name].append(await p.call(s))
    return res


async def first_exec(params: StdioServerParameters, tool: str, a: dict) -> float:
    async with stdio_client(params, errlog=open(os.devnull, "w")) as (r, w):
        async with ClientSession(r, w) as s:
            t = time.perf_counter()
            await s.initialize()
            res = await s.call_tool(tool, a)
            took = time.perf_counter() - t
            assert not res.is_error, res
            return took


def user_path() -> str:
    """PATH as the user's shell has it: run through pyenv (`pyenv exec` puts the chosen
    version's bin first), this script would hand the server the real interpreter as
    `python3`; the user's PATH finds pyenv's shim first."""
    parts = [p for p in os.environ.get("PATH", "").split(":") if "/.pyenv/versions/" not in p]
    shims = Path(os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))) / "shims"
    if shims.is_dir() and str(shims) not in parts:
        parts.insert(0, str(shims))
    return ":".join(parts)


def firsts(args, root: Path) -> dict:
    path = user_path()
    shim = shutil.which("python3", path=path) or "python3"
    variants = [
        (f"ours, default `python3` ({shim})", params_of(args.bin, server_env(root / "f-shim", PATH=path)), "python_exec", {"code": "1"}),
        ("ours, `--python /usr/bin/python3`", params_of(args.bin, server_env(root / "f-usr", MCP_SANDBOX_PYTHON="/usr/bin/python3")),
         "python_exec", {"code": "1"}),
    ]
    bin_dir = Path(args.peers) / "bin"
    if (bin_dir / "mcp-python-repl").exists():
        variants.append(("mcp-python-repl", params_of(str(bin_dir / "mcp-python-repl"), server_env(root / "f-p1")),
                         "repl_run_code", {"params": {"code": "1"}}))
    if (bin_dir / "mcp-python").exists():
        variants.append(("mcp-python", params_of(str(bin_dir / "mcp-python"), server_env(root / "f-p2")),
                         "execute_python", {"code": "1"}))
    # Same-run baselines: the interpreters' own start (`-c pass`), bare.
    real = subprocess.run([shim, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True,
                          env=dict(os.environ, PATH=path)).stdout.strip()
    bare = [(f"bare `{shim} -c pass` (the shim)", [shim, "-c", "pass"]),
            (f"bare `{real} -c pass` (what it runs)", [real, "-c", "pass"]),
            ("bare `/usr/bin/python3 -c pass`", ["/usr/bin/python3", "-c", "pass"])]
    res = {name: [] for name, *_ in variants}
    res.update({name: [] for name, _ in bare})
    for name, p, tool, a in variants:  # one start each first: the state dir as a configured server has it
        anyio.run(first_exec, p, tool, a)
    peer_names = {name for name, *_ in variants[2:]}
    for i in range(args.first):
        for name, p, tool, a in variants:
            if name in peer_names and i >= args.first_peers:
                continue
            res[name].append(anyio.run(first_exec, p, tool, a))
            time.sleep(0.2)  # the previous server's processes are gone
        for name, argv in bare:
            t = time.perf_counter()
            subprocess.run(argv, env=dict(os.environ, PATH=path), check=True)
            res[name].append(time.perf_counter() - t)
    return res


def time_cmd(argv: list[str], cwd: str) -> float:
    t = time.perf_counter()
    subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t


def launcher(args, root: Path) -> dict:
    ws = root / "l-ws"
    ws.mkdir(exist_ok=True)
    variants = [("bare `/bin/true`", ["/bin/true"])]
    bwrap = shutil.which("bwrap")
    if bwrap:
        variants.append(("bubblewrap `--unshare-all`", [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/",
                                                        "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--", "/bin/true"]))
    variants.append(("`run --policy workspace-write -- /bin/true`",
                     [args.bin, "run", "--policy", "workspace-write", "--workspace", str(ws), "--", "/bin/true"]))
    if args.baseline:
        variants.append(("same, baseline build (`--baseline`)",
                         [args.baseline, "run", "--policy", "workspace-write", "--workspace", str(ws), "--", "/bin/true"]))
    res = {n: [] for n, _ in variants}
    for _ in range(3):
        for _, a in variants:
            time_cmd(a, str(ws))
    # Each round in an order of its own, drawn (seeded, so a rerun draws the same): what a
    # run leaves to the kernel after it exits (bubblewrap's pid 1 and its namespaces end
    # after bubblewrap has; work queued for kworkers) lands on whichever variant comes
    # next, so every variant must follow each of the others equally often. A turning
    # order did not do that: in a turned cycle each variant follows the same one in all
    # but one place, and `run` after bubblewrap read 0.05–0.07 higher than after itself.
    order = random.Random(28)
    for _ in range(args.launch):
        for n, a in order.sample(variants, len(variants)):
            res[n].append(time_cmd(a, str(ws)))
    return res


async def env_figures(args, root: Path) -> dict:
    python, uv = real_python(), real_uv()
    wheels = root / "wheels"
    wheels.mkdir()
    deps = [f"speeddep{i}" for i in range(args.envs + 2)]
    for d in deps:
        make_wheel(wheels, d, "0.1")
    # Ours: the default session's own cache below the cache root (envs::store).
    hand_cache, our_root = root / "cache-hand", root / "cache-ours"
    our_cache = our_root / "sessions" / "local" / "default"
    our_cache.mkdir(parents=True)
    precache(uv, python, hand_cache, wheels, deps, root)
    precache(uv, python, our_cache, wheels, deps, root)
    hand_venv = root / "hand-venv"
    env_h = uv_env(hand_cache, wheels)
    subprocess.run([uv, "venv", "-q", "--python", python, str(hand_venv)], env=env_h, check=True)
    env = dict(uv_env(our_cache, wheels), **server_env(root / "envs"))
    env.update(MCP_SANDBOX_UV=uv, MCP_SANDBOX_UV_CACHE=str(our_root))
    res = {k: [] for k in ("install_hand", "install_ours", "script_hand", "script_ours")}
    reused = []
    async with stdio_client(params_of(args.bin, env), errlog=open(os.devnull, "w")) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            await s.call_tool("python_exec", {"code": "1"})
            # The session venv exists from here on (the first install makes it).
            res0 = await s.call_tool("env_install", {"packages": [deps[-1]], "wait_seconds": 60})
            assert not res0.is_error and res0.structured_content["status"] == "completed", res0
            d = deps[-2]
            code = f"import {d}\nprint({d}.__version__)\n"
            script = root / "script.py"
            script.write_text(code)
            run_hand = [uv, "run", "--quiet", "--no-project", "--python", python, "--with", d, str(script)]
            subprocess.run(run_hand, env=env_h, check=True, capture_output=True)  # warm: uv's cached environment
            await s.call_tool("python_run_script", {"code": code, "dependencies": [d], "wait_seconds": 60})
            for i in range(args.envs):
                p = deps[i]
                t = time.perf_counter()
                subprocess.run([uv, "pip", "install", "-q", "--python", str(hand_venv / "bin" / "python"), p],
                               env=env_h, check=True, capture_output=True)
                res["install_hand"].append(time.perf_counter() - t)
                t = time.perf_counter()
                out = await s.call_tool("env_install", {"packages": [p], "wait_seconds": 60})
                res["install_ours"].append(time.perf_counter() - t)
                job = out.structured_content
                assert not out.is_error and job["status"] == "completed", job
                t = time.perf_counter()
                subprocess.run(run_hand, env=env_h, check=True, capture_output=True)
                res["script_hand"].append(time.perf_counter() - t)
                t = time.perf_counter()
                out = await s.call_tool("python_run_script", {"code": code, "dependencies": [d], "wait_seconds": 60})
                res["script_ours"].append(time.perf_counter() - t)
                job = out.structured_content
                assert not out.is_error and job["status"] == "completed", job
                reused.append(bool((job.get("result") or {}).get("reused_environment")))
    res["reused"] = reused
    res["uv"] = subprocess.run([uv, "--version"], capture_output=True, text=True).stdout.strip()
    return res


async def parallel_once(binary: str, env: dict, sessions: int, calls: int) -> float:
    async with stdio_client(params_of(binary, env), errlog=open(os.devnull, "w")) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            names = [f"p{i}" for i in range(sessions)]
            for n in names:  # every session's worker started first
                out = await s.call_tool("python_exec", {"code": "1", "session": n})
                assert not out.is_error, out

            async def run(n):
                for _ in range(calls):
                    out = await s.call_tool("python_exec", {"code": "1", "session": n})
                    assert not out.is_error, out

            t = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for n in names:
                    tg.start_soon(run, n)
            return sessions * calls / (time.perf_counter() - t)


def parallel(args, root: Path) -> dict:
    res = {"on": [], "off": []}
    for i in range(args.parallel):
        for mode, extra in (("on", {}), ("off", {"MCP_SANDBOX_MAX_SNAPSHOTS": "0"})):
            env = server_env(root / f"par-{mode}-{i}", MCP_SANDBOX_MAX_SESSIONS="16", **extra)
            res[mode].append(anyio.run(parallel_once, args.bin, env, 8, 200))
    return res


def report(args, L0: str, L1: str, H: dict, F: dict, La: dict, E: dict, P: dict, started: str) -> str:
    ours = H.get("ours (default: snapshots on)", [])
    echo = H.get("no-op rmcp echo", [])
    peer_names = [n for n in H if n.startswith("mcp-python")]
    best_peer = min((n for n in peer_names if H[n]), key=lambda n: med(H[n]), default=None)
    lines = [
        SECTION,
        "",
        f"`python3 tests/bench/speed.py` — {started} UTC; {os.uname().sysname} {os.uname().release}, "
        f"{os.cpu_count()} CPUs ({cpu_model()}); load average {L0} at start, {L1} at end (a shared machine: "
        "other engineers built and tested meanwhile). Binary: "
        f"`{Path(args.bin).relative_to(REPO) if Path(args.bin).is_relative_to(REPO) else args.bin}`. "
        "Medians with p95 and n; every ratio is to a baseline measured in the same run.",
        "",
        "| trivial call (`python_exec 1`; the echo's `noop`; a peer's own run-code tool) | median (p95, n) | ratio to ours |",
        "|---|---|---|",
    ]
    for n, xs in H.items():
        lines.append(f"| {n} | {fmt(xs)} | {med(ours) / med(xs):.2f}× |")
    lines += [""]
    if H.get(BASELINE_HOT) and ours and echo:
        base = H[BASELINE_HOT]
        lines += [
            f"Ours / baseline build: **{med(ours) / med(base):.2f}×**; baseline − echo: "
            f"{(med(base) - med(echo)) * 1000:.2f} ms.",
            "",
        ]
    if best_peer and ours and echo:
        lines += [
            f"Ours / best peer ({best_peer}): **{med(ours) / med(H[best_peer]):.2f}×** (target ≤ 0.5×); "
            f"ours − echo: **{(med(ours) - med(echo)) * 1000:.2f} ms** (target ≤ 0.5 ms).",
            "",
        ]
    lines += ["| first call from `initialize` (request sent → answer), and the interpreters' bare start | median (p95, n) |", "|---|---|"]
    for n, xs in F.items():
        lines.append(f"| {n} | {fmt(xs)} |")
    lines += ["", "| launcher (`/bin/true`) | median (p95, n) | ratio to bubblewrap |", "|---|---|---|"]
    bw = next((xs for n, xs in La.items() if n.startswith("bubblewrap")), [])
    for n, xs in La.items():
        lines.append(f"| {n} | {fmt(xs)} | {med(xs) / med(bw):.2f}× |" if bw else f"| {n} | {fmt(xs)} | — |")
    if E:
        lines += [
            "",
            "| environments (warm uv cache, offline find-links) | by hand with uv | ours | ratio |",
            "|---|---|---|---|",
            f"| `env_install` of one small wheel into the session venv vs `uv pip install` into a venv | {fmt(E['install_hand'])} | {fmt(E['install_ours'])} | {med(E['install_ours']) / med(E['install_hand']):.2f}× (target ≤ 1.2×) |",
            f"| `python_run_script` with one dependency vs `uv run --with` | {fmt(E['script_hand'])} | {fmt(E['script_ours'])} | {med(E['script_ours']) / med(E['script_hand']):.2f}× (target ≤ 1.3×) |",
            "",
            f"{E['uv']}; ours reused its script environment in {sum(E['reused'])} of {len(E['reused'])} runs.",
        ]
    if P:
        on, off = med(P["on"]), med(P["off"])
        lines += [
            "",
            "| 8 sessions × 200 trivial calls at once, one server | calls/s (median of runs) | runs |",
            "|---|---|---|",
            f"| snapshots on (default) | {on:.0f} | {', '.join(f'{x:.0f}' for x in P['on'])} |",
            f"| snapshots off | {off:.0f} | {', '.join(f'{x:.0f}' for x in P['off'])} |",
            "",
            f"Off / on: **{off / on:.2f}×** (target ≤ 1.3×).",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(build_dir("release") / "mcp-sandbox-repl"))
    ap.add_argument("--noop", default=None)
    ap.add_argument("--baseline", default=None, help="another build's binary, measured in turns with ours: its trivial `python_exec` "
                    "(hot) and its `run` (launcher)")
    ap.add_argument("--peers", default="/tmp/speed-peers", help="a venv with mcp-python-repl / mcp-python installed")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--first", type=int, default=10)
    ap.add_argument("--first-peers", type=int, default=30,
                    help="samples of the peers' first call (~0.7 s each here), at most --first")
    ap.add_argument("--launch", type=int, default=60)
    ap.add_argument("--envs", type=int, default=12)
    ap.add_argument("--parallel", type=int, default=3)
    ap.add_argument("--only", default="hot,first,launch,envs,parallel")
    ap.add_argument("--set", action="append", default=[], metavar="MCP_SANDBOX_X=VALUE",
                    help="a setting for every server of ours (to try one; the recorded run uses none)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    for kv in args.set:
        k, _, v = kv.partition("=")
        OURS_SETTINGS[k] = v
    if args.noop is None:
        args.noop = str(Path(args.bin).parent / "examples" / "noop_server")
    only = set(args.only.split(","))
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    L0 = loadavg()
    root = Path(tempfile.mkdtemp(prefix="speed-bench-", dir="/var/tmp"))
    try:
        H = anyio.run(hot, args, root) if "hot" in only else {}
        F = firsts(args, root) if "first" in only else {}
        La = launcher(args, root) if "launch" in only else {}
        E = anyio.run(env_figures, args, root) if "envs" in only else {}
        P = parallel(args, root) if "parallel" in only else {}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = report(args, L0, loadavg(), H, F, La, E, P, started)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
