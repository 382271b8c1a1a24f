#!/usr/bin/env python3
"""Launcher and cold start (issue 12): every figure beside its baseline, in one interleaved run.

    python3 tests/bench/all.py [--no-build] [--no-write] [--runs 100] [--calls 200]

Measures, in turns (A B C A B C ...), so a burst of load on a shared machine lands on
every column alike:
- the launcher: `true` and `python3 -c pass` bare, under bubblewrap (`--unshare-all`; the
  bench installs `bubblewrap` with apt-get when it is missing and it runs as root, else the
  column is skipped with a note), through `run --policy workspace-write`, and through the
  server's fallback path (a re-exec of the launcher per job: `run --spawn-route
  reexec`; the server's own path, its zygote, is measured through MCP);
- the launcher ablation: `run -- true` under policies that switch one mechanism off;
- the server, through the official `mcp` Python SDK over stdio (its client-side check
  of tool results against output schemas switched off: it is client work, and only our
  tools have output schemas), beside a no-op rmcp server (`examples/noop_server.rs`):
  spawn → initialized, a trivial tool call (also with branching snapshots off), the first
  `python_exec` right after initialize (with `python3` from PATH and with /usr/bin/python3),
  `shell_run` of `true`, interrupt → KeyboardInterrupt, `session_restart` → usable;
- output spooling: a 1 GiB shell print (`head -c 1G /dev/zero`) through a job, from the
  `shell_run` call until it answers completed (within its 60 s window), beside the same
  command writing to a file outside any job (`> file`, the baseline) and inside a job;
  and the server's peak RSS (VmHWM in /proc/<pid>/status) before and after those prints.
Records median, p95, n and /proc/loadavg before and after, and writes the section
"## Launcher and cold start" of docs/benchmarks.md. Not part of the test run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import re
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

from server import time_interrupt  # tests/bench/server.py: the same measure
from common import build_dir  # noqa: E402

# The SDK checks each tool result against the tool's output schema on the client: the
# first check lists the tools and imports and compiles `jsonschema` (~100 ms here), later
# ones cost ~0.1-1 ms. Our tools declare output schemas, the no-op tool does not, so that
# client work would be billed to our server alone; the bench measures servers, so it is
# skipped for both (tests/mcp keeps it on).
async def _no_client_validation(self, name, result):
    return None


ClientSession.validate_tool_result = _no_client_validation

ROOT = Path(__file__).resolve().parents[2]
BIN = build_dir("release") / "mcp-sandbox-repl"
NOOP = build_dir("release") / "examples" / "noop_server"
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## Launcher and cold start"

# Policies that switch one mechanism of workspace-write off (the ablation).
BASE_POLICY = (ROOT / "policies" / "workspace-write.toml").read_text()


def ablation_policies() -> list[tuple[str, str]]:
    p = BASE_POLICY
    no_cgroup = re.sub(r"^(memory|processes) = .*\n", "", p, flags=re.M)
    no_net = p.replace('mode = "none"', 'mode = "full"')
    no_seccomp = p.replace("syscall_filter = true", "syscall_filter = false")
    no_caps = p.replace("drop_capabilities = true", "drop_capabilities = false")
    no_tmpfs = re.sub(r"^tmp_size = .*\n", "", p, flags=re.M)
    no_fs = re.sub(
        r"\[filesystem\].*?(?=^\[network\])",
        '[filesystem]\nread = ["/"]\nwrite = ["/"]\nexecute = ["/"]\n\n',
        p,
        flags=re.S | re.M,
    )
    no_scope = p.replace('"scoped"', '"allow"')
    off = (
        'description = "every mechanism off"\nkernel_support = "best_effort"\n'
        '[filesystem]\nread = ["/"]\nwrite = ["/"]\nexecute = ["/"]\n'
        '[network]\nmode = "full"\n[ipc]\nabstract_unix_sockets = "allow"\nsignals = "allow"\n'
        '[environment]\npass = ["*"]\n[process]\ndrop_capabilities = false\nsyscall_filter = false\n'
    )
    return [
        ("every mechanism on (workspace-write)", p),
        ("− cgroups (no `memory`, `processes`)", no_cgroup),
        ("− network namespace (`mode = \"full\"`)", no_net),
        ("− seccomp (`syscall_filter = false`)", no_seccomp),
        ("− capability drop (`drop_capabilities = false`)", no_caps),
        ("− tmpfs `{tmp}` (no `tmp_size`)", no_tmpfs),
        ("− mount view + Landlock rules (`/` for all)", no_fs),
        ("− Landlock scopes (`ipc` = allow)", no_scope),
        ("every mechanism off", off),
    ]


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def stat(values) -> tuple[float, float, int]:
    return statistics.median(values) * 1000, pct(values, 95) * 1000, len(values)


def fmt(values) -> str:
    if not values:
        return "—"
    med, p95, n = stat(values)
    return f"{med:.2f} ms (p95 {p95:.2f}, n={n})"


def time_cmd(argv, cwd, env=None) -> float:
    t = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t


def ensure_bwrap() -> tuple[str | None, str]:
    found = shutil.which("bwrap")
    if found:
        return found, ""
    if os.getuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "bubblewrap"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        found = shutil.which("bwrap")
        if found:
            return found, ""
    return None, "bubblewrap not installed (and could not be installed): column skipped"


def launcher_part(runs: int, ws: str, pol_dir: Path, bare_only: bool = False,
                  baseline: str | None = None) -> dict:
    """The launcher rows and the ablation; `bare_only`: just the bare commands (the
    baselines the server rows cite), for `--part server`; `baseline`: an earlier build's
    `run` too (before/after)."""
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    bwrap, bwrap_note = (None, "") if bare_only else ensure_bwrap()
    variants = []  # (key, argv, env)
    for label, cmd in [("true", ["/bin/true"]), ("python3 -c pass", [python, "-c", "pass"])]:
        run = [str(BIN), "run", "--policy", "workspace-write", "--workspace", ws, "--"] + cmd
        variants.append(((label, "bare"), cmd, None))
        if bare_only:
            continue
        if bwrap:
            variants.append(((label, "bwrap"), [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/",
                                                "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--"] + cmd, None))
        variants.append(((label, "run"), run, None))
        variants.append(((label, "reexec"), run[:2] + ["--spawn-route", "reexec"] + run[2:], None))
        if baseline:
            variants.append(((label, "b_run"), [baseline] + run[1:], None))
    # The first python_exec with `python3` from PATH is set beside that interpreter's own
    # bare start (through the same PATH entry, e.g. a pyenv shim).
    path_python = shutil.which("python3")
    if path_python:
        variants.append((("path python3 -c pass", "bare"), [path_python, "-c", "pass"], None))
    for i, (name, text) in enumerate([] if bare_only else ablation_policies()):
        f = pol_dir / f"ablation{i}.toml"
        f.write_text(text)
        variants.append((("ablation", name), [str(BIN), "run", "--policy", str(f), "--workspace", ws, "--", "/bin/true"], None))
    out: dict = {k: [] for k, _, _ in variants}
    for _ in range(3):  # warm-up: page cache, dentries
        for _, argv, env in variants:
            time_cmd(argv, ws, env)
    for _ in range(runs):
        for key, argv, env in variants:
            out[key].append(time_cmd(argv, ws, env))
    out["python"] = python
    out["bwrap_note"] = bwrap_note
    return out


def server_env(root: Path, python: str | None) -> dict:
    ws, state = root / "ws", root / "state"
    ws.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_SANDBOX_")}
    env.update(MCP_SANDBOX_WORKSPACE=str(ws), MCP_SANDBOX_STATE_DIR=str(state), RUST_LOG="error")
    if python:
        env["MCP_SANDBOX_PYTHON"] = python
    return env


async def spawn_init(binary: str, env: dict) -> float:
    params = StdioServerParameters(command=binary, args=[], env=env, cwd=env.get("MCP_SANDBOX_WORKSPACE"))
    t0 = time.perf_counter()
    async with stdio_client(params, errlog=open(os.devnull, "w")) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            return time.perf_counter() - t0


async def first_exec(env: dict, binary: str = str(BIN)) -> float:
    params = StdioServerParameters(command=binary, args=[], env=env, cwd=env["MCP_SANDBOX_WORKSPACE"])
    async with stdio_client(params, errlog=open(os.devnull, "w")) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            t = time.perf_counter()
            res = await s.call_tool("python_exec", {"code": "1"})
            took = time.perf_counter() - t
            assert not res.is_error, res
            return took


async def hot_paths(root: Path, calls: int, res: dict, baseline: str | None = None):
    """One real server and one no-op server open side by side; calls alternate. With
    `baseline`, an earlier build's server too, for the before/after rows."""
    env = server_env(root / "hot", None)
    ours = StdioServerParameters(command=str(BIN), args=[], env=env, cwd=env["MCP_SANDBOX_WORKSPACE"])
    noop = StdioServerParameters(command=str(NOOP), args=[], env=env)
    # The same server with branching snapshots off: what the per-cell snapshot costs;
    # with the zygote off and with nothing made ahead: what those save a shell job.
    env_ns = dict(server_env(root / "hot-nosnap", None), MCP_SANDBOX_MAX_SNAPSHOTS="0")
    env_nz = server_env(root / "hot-nozygote", None)
    env_na = server_env(root / "hot-noahead", None)
    nosnap, nozygote, noahead = (
        StdioServerParameters(command=str(BIN), args=a, env=e, cwd=e["MCP_SANDBOX_WORKSPACE"])
        for e, a in ((env_ns, []), (env_nz, ["--spawn-route", "reexec"]), (env_na, ["--no-made-ahead"])))
    env_b = server_env(root / "hot-baseline", None)
    servers = [ours, noop, nosnap, nozygote, noahead]
    if baseline:
        servers.append(StdioServerParameters(command=baseline, args=[], env=env_b, cwd=env_b["MCP_SANDBOX_WORKSPACE"]))
    async with contextlib.AsyncExitStack() as stack:
        sessions = []
        for params in servers:
            r, w = await stack.enter_async_context(stdio_client(params, errlog=open(os.devnull, "w")))
            sessions.append(await stack.enter_async_context(ClientSession(r, w)))
        s, n, ns, nz, na = sessions[:5]
        b = sessions[5] if baseline else None
        for session in sessions:
            await session.initialize()
        for _ in range(5):
            await nz.call_tool("shell_run", {"command": "true"})
            await na.call_tool("shell_run", {"command": "true"})
        for _ in range(5):
            if b:
                await b.call_tool("python_exec", {"code": "1"})
                await b.call_tool("shell_run", {"command": "true"})
            await s.call_tool("python_exec", {"code": "1"})
            await ns.call_tool("python_exec", {"code": "1"})
            await n.call_tool("noop", {})
            await s.call_tool("shell_run", {"command": "true"})
        # Each timed call starts after a pause: a server's work after its answer (the
        # snapshot fork of a cell, 20 ms after it; pools topped up 10 ms after a take)
        # must not land on the next server's call, which it would in back-to-back turns
        # (an agent's calls are seconds apart).
        settle_gap = 0.04
        for _ in range(calls):
            await anyio.sleep(settle_gap)
            t = time.perf_counter()
            r = await s.call_tool("python_exec", {"code": "1"})
            res["exec"].append(time.perf_counter() - t)
            assert r.structured_content["value"] == "1", r
            await anyio.sleep(settle_gap)
            t = time.perf_counter()
            await n.call_tool("noop", {})
            res["noop"].append(time.perf_counter() - t)
            await anyio.sleep(settle_gap)
            t = time.perf_counter()
            r = await ns.call_tool("python_exec", {"code": "1"})
            res["exec_nosnap"].append(time.perf_counter() - t)
            assert r.structured_content["value"] == "1", r
            if b:
                await anyio.sleep(settle_gap)
                t = time.perf_counter()
                r = await b.call_tool("python_exec", {"code": "1"})
                res["b_exec"].append(time.perf_counter() - t)
                assert r.structured_content["value"] == "1", r
        for _ in range(max(10, calls // 4)):
            await anyio.sleep(settle_gap)
            t = time.perf_counter()
            r = await s.call_tool("shell_run", {"command": "true"})
            res["shell"].append(time.perf_counter() - t)
            assert not r.is_error, r
            for session, key in ((nz, "shell_nozygote"), (na, "shell_noahead")):
                await anyio.sleep(settle_gap)
                t = time.perf_counter()
                r = await session.call_tool("shell_run", {"command": "true"})
                res[key].append(time.perf_counter() - t)
                assert not r.is_error, r
            if b:
                await anyio.sleep(settle_gap)
                t = time.perf_counter()
                r = await b.call_tool("shell_run", {"command": "true"})
                res["b_shell"].append(time.perf_counter() - t)
                assert not r.is_error, r
            res["bare_true"].append(time_cmd(["/bin/true"], "/"))
        for _ in range(10):
            res["interrupt"].append(await time_interrupt(s))
        for _ in range(max(10, calls // 10)):
            await s.call_tool("python_exec", {"code": "x = 1"})
            # A restart takes the session's idle spare worker; give the one the last
            # restart started time to come up, as it has between an agent's restarts.
            await anyio.sleep(0.5)
            t = time.perf_counter()
            await s.call_tool("session_restart", {})
            r = await s.call_tool("python_exec", {"code": "1"})
            res["restart"].append(time.perf_counter() - t)
            assert r.structured_content["value"] == "1", r


def vm_hwm_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def child_server_pid(marker: str) -> int:
    """The server this process spawned whose environment holds `marker` (its state dir);
    its zygote and workers are its children, not ours."""
    me = os.getpid()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == me and marker.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                return int(pid)
        except (OSError, ValueError, IndexError):
            continue
    raise RuntimeError("could not find the server's process")


async def spooling(root: Path, runs: int, size: str, res: dict):
    """A `size` shell print through a job vs `> file` outside and inside a job, in turns;
    the server's VmHWM before and after."""
    env = server_env(root / "spool", None)
    ws = Path(env["MCP_SANDBOX_WORKSPACE"])
    params = StdioServerParameters(command=str(BIN), args=[], env=env, cwd=str(ws))
    cmd = f"head -c {size} /dev/zero"
    async with stdio_client(params, errlog=open(os.devnull, "w")) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()

            async def job(command: str) -> float:
                t = time.perf_counter()
                # As an agent runs it: the call waits for the end (up to its 60 s window).
                out = await s.call_tool("shell_run", {"command": command, "wait_seconds": 60})
                job_id = out.structured_content["job_id"]
                while out.structured_content["status"] == "running":
                    out = await s.call_tool("job_wait", {"job_id": job_id, "until_done": True,
                                                         "timeout_seconds": 60})
                took = time.perf_counter() - t
                assert out.structured_content["status"] == "completed", out
                await s.call_tool("job_prune", {"job_id": job_id})
                settle()
                return took

            def settle():
                # Deleting a GiB on a file system mounted with `discard` trims it at the
                # next journal commit; sync here so that lands outside the timed runs.
                os.sync()

            await job("true")
            pid = child_server_pid(env["MCP_SANDBOX_STATE_DIR"])
            res["rss_before"] = vm_hwm_kb(pid)
            target = ws / "out.bin"
            for _ in range(runs):
                t = time.perf_counter()
                subprocess.run(["/bin/sh", "-c", f"{cmd} > {target}"], check=True)
                res["spool_bare_file"].append(time.perf_counter() - t)
                target.unlink()
                settle()
                # The floor of any capture through a pipe: the same bytes piped to `cat`.
                t = time.perf_counter()
                subprocess.run(["/bin/sh", "-c", f"{cmd} | cat > {target}"], check=True)
                res["spool_bare_pipe"].append(time.perf_counter() - t)
                target.unlink()
                settle()
                res["spool_job_print"].append(await job(cmd))
                res["spool_job_file"].append(await job(f"{cmd} > out.bin"))
                target.unlink()
                settle()
            res["rss_after"] = vm_hwm_kb(pid)
    res["spool_size"] = size


def server_part(root: Path, spawns: int, calls: int, baseline: str | None, spool_runs: int = 0,
                spool_size: str = "1G") -> dict:
    res: dict = {k: [] for k in ("init_noop", "init_ours", "init_ours_fresh", "first_shim", "first_usr",
                                 "exec", "exec_nosnap", "noop", "shell", "bare_true", "interrupt", "restart",
                                 "shell_nozygote", "shell_noahead",
                                 "b_init", "b_first_shim", "b_first_usr", "b_exec", "b_shell",
                                 "spool_bare_file", "spool_bare_pipe", "spool_job_print", "spool_job_file")}
    shim = shutil.which("python3")
    # Interleaved: noop, ours (state dir reused), ours (fresh state dir), first execs.
    for i in range(spawns):
        res["init_noop"].append(anyio.run(spawn_init, str(NOOP), server_env(root / "noop", None)))
        res["init_ours"].append(anyio.run(spawn_init, str(BIN), server_env(root / "reused", None)))
        res["init_ours_fresh"].append(anyio.run(spawn_init, str(BIN), server_env(root / f"fresh{i}", None)))
        if baseline:
            res["b_init"].append(anyio.run(spawn_init, baseline, server_env(root / "b_reused", None)))
        if i % 2 == 0:
            # Each variant keeps its state dir, as a configured server does (what an
            # earlier server left there, e.g. the remembered interpreter probe, counts).
            res["first_shim"].append(anyio.run(first_exec, server_env(root / "fs", shim)))
            if baseline:
                res["b_first_shim"].append(anyio.run(first_exec, server_env(root / "bfs", shim), baseline))
            if os.path.exists("/usr/bin/python3"):
                res["first_usr"].append(anyio.run(first_exec, server_env(root / "fu", "/usr/bin/python3")))
                if baseline:
                    res["b_first_usr"].append(
                        anyio.run(first_exec, server_env(root / "bfu", "/usr/bin/python3"), baseline))
    anyio.run(hot_paths, root, calls, res, baseline)
    if spool_runs:
        anyio.run(spooling, root, spool_runs, spool_size, res)
    res["shim"] = shim
    return res


def fmt_s(values) -> str:
    if not values:
        return "—"
    med, p95, n = stat(values)
    return f"{med / 1000:.2f} s (p95 {p95 / 1000:.2f}, n={n})"


def render(L: dict, S: dict, load_before: str, load_after: str, runs: int) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = ""
    try:
        cpu = next(x.split(":", 1)[1].strip() for x in open("/proc/cpuinfo") if x.startswith("model name"))
    except (OSError, StopIteration):
        pass

    def med(v):
        return statistics.median(v) * 1000 if v else float("nan")

    lines = [
        SECTION,
        "",
        f"`python3 tests/bench/all.py` — {now}; {os.uname().release}, {os.cpu_count()} CPUs ({cpu}), uid {os.getuid()}.",
        f"Load average (1/5/15 min) before: {load_before}; after: {load_after}. The machine is shared with",
        "other builds and tests: absolute times are noisy, so every figure stands beside its baseline from",
        "the same interleaved run (variants measured in turns, A B C A B C …); compare the ratios.",
        "Release build; median, p95 and n of each. No peers other than bubblewrap and the no-op rmcp",
        "server are installed here, so the issue's peer figures (mcp-background-job, mcp-python,",
        "mcp-python-repl, mcp-repl) are not re-measured. The client is the official `mcp` SDK with its",
        "client-side check of tool results against output schemas off (client work; only our tools",
        "declare output schemas, and the first check lists the tools and imports `jsonschema`).",
        "",
    ]
    if L["bwrap_note"]:
        lines += [f"Note: {L['bwrap_note']}.", ""]
    lines += [
        "| figure | baseline (same run) | ours | ratio |",
        "|---|---|---|---|",
    ]
    for label in ("true", "python3 -c pass"):
        bare, bw, run, rx = (L.get((label, k), []) for k in ("bare", "bwrap", "run", "reexec"))
        if not run:
            continue  # --part server
        cmd = "/bin/true" if label == "true" else f"{L['python']} -c pass"
        base = f"bare {fmt(bare)}"
        if bw:
            base += f"; bwrap `--unshare-all` {fmt(bw)}"
        ratio = f"{med(run) / med(bare):.2f}× bare"
        if bw:
            ratio += f", {med(run) / med(bw):.2f}× bwrap"
        lines.append(f"| `run --policy workspace-write -- {cmd}` | {base} | {fmt(run)} (+{med(run) - med(bare):.2f} ms) | {ratio} |")
        lines.append(f"| same, re-exec path (the server's fallback) | bare {fmt(bare)} | {fmt(rx)} (+{med(rx) - med(bare):.2f} ms) | {med(rx) / med(bare):.2f}× bare |")
    lines += [
        f"| `shell_run` of `true` through MCP | bare `true` {fmt(S['bare_true'])}; no-op rmcp tool {fmt(S['noop'])} | {fmt(S['shell'])} | {med(S['shell']) / med(S['noop']):.2f}× no-op tool |",
        f"| same, zygote off (`--spawn-route reexec`: fork of the server + exec per job) | (same) | {fmt(S['shell_nozygote'])} | {med(S['shell_nozygote']) / med(S['noop']):.2f}× no-op tool |",
        f"| same, nothing made ahead (`--no-made-ahead`: cgroup, netns and view made per job) | (same) | {fmt(S['shell_noahead'])} | {med(S['shell_noahead']) / med(S['noop']):.2f}× no-op tool |",
        f"| spawn → initialized (state dir reused) | no-op rmcp server {fmt(S['init_noop'])} | {fmt(S['init_ours'])} | {med(S['init_ours']) / med(S['init_noop']):.2f}× |",
        f"| spawn → initialized (empty state dir) | no-op rmcp server | {fmt(S['init_ours_fresh'])} | {med(S['init_ours_fresh']) / med(S['init_noop']):.2f}× |",
        f"| first `python_exec` right after initialize (state dir reused), `python3` = `{S['shim']}` | bare `{S['shim']} -c pass` {fmt(L.get(('path python3 -c pass', 'bare'), []))} | {fmt(S['first_shim'])} | — |",
        f"| same, `MCP_SANDBOX_PYTHON=/usr/bin/python3` | bare `{L['python']} -c pass` {fmt(L[('python3 -c pass', 'bare')])} | {fmt(S['first_usr'])} | — |",
        f"| trivial `python_exec` | no-op rmcp tool {fmt(S['noop'])} | {fmt(S['exec'])} (+{med(S['exec']) - med(S['noop']):.2f} ms) | {med(S['exec']) / med(S['noop']):.2f}× |",
        f"| same, branching snapshots off (`--max-snapshots 0`) | no-op rmcp tool {fmt(S['noop'])} | {fmt(S['exec_nosnap'])} (+{med(S['exec_nosnap']) - med(S['noop']):.2f} ms) | {med(S['exec_nosnap']) / med(S['noop']):.2f}× |",
        f"| interrupt → KeyboardInterrupt reported | — | {fmt(S['interrupt'])} | — |",
        f"| `session_restart` → `python_exec` \"1\" answered (spare worker up) | — | {fmt(S['restart'])} | — |",
    ]
    if S["spool_job_print"]:
        size, base = S["spool_size"], S["spool_bare_file"]
        cmd = f"head -c {size} /dev/zero"
        lines += [
            f"| {size} shell print through a job (`{cmd}`, `shell_run` call → answered completed) | `{cmd} > file` outside a job {fmt_s(base)} | {fmt_s(S['spool_job_print'])} | {med(base) / med(S['spool_job_print']):.2f}× the speed of `> file` |",
            f"| same, `> file` inside a job | (same) | {fmt_s(S['spool_job_file'])} | {med(base) / med(S['spool_job_file']):.2f}× |",
            f"| the floor of capturing through a pipe: `{cmd} \\| cat > file` outside a job | (same) | {fmt_s(S['spool_bare_pipe'])} | {med(base) / med(S['spool_bare_pipe']):.2f}× |",
            f"| server peak RSS (VmHWM) before → after those {2 * len(base)} jobs | — | {S['rss_before'] / 1024:.1f} → {S['rss_after'] / 1024:.1f} MB | +{(S['rss_after'] - S['rss_before']) / 1024:.1f} MB |",
        ]
    lines.append("")
    if S["b_init"]:
        lines += [
            "Before/after (`--baseline`: the build before this change set, measured in turns with it):",
            "",
            "| figure | before | after |",
            "|---|---|---|",
            f"| spawn → initialized (state dir reused) | {fmt(S['b_init'])} | {fmt(S['init_ours'])} |",
            f"| first `python_exec` right after initialize, `python3` from PATH | {fmt(S['b_first_shim'])} | {fmt(S['first_shim'])} |",
            f"| same, `/usr/bin/python3` | {fmt(S['b_first_usr'])} | {fmt(S['first_usr'])} |",
            f"| trivial `python_exec` | {fmt(S['b_exec'])} | {fmt(S['exec'])} |",
            f"| `shell_run` of `true` | {fmt(S['b_shell'])} | {fmt(S['shell'])} |",
        ]
        for label in ("true", "python3 -c pass"):
            before, after = L.get((label, "b_run"), []), L.get((label, "run"), [])
            if before and after:
                cmd = "/bin/true" if label == "true" else f"{L['python']} -c pass"
                lines.append(f"| `run --policy workspace-write -- {cmd}` | {fmt(before)} | {fmt(after)} |")
        lines.append("")
    if not any(isinstance(k, tuple) and k[0] == "ablation" for k in L):  # --part server
        return "\n".join(lines)
    lines += [
        f"Launcher ablation: `run --policy <P> -- /bin/true`, each policy workspace-write with one",
        f"mechanism switched off, measured in turns with the rows above (n={runs} each). \"Cost\" is",
        "the row's median subtracted from the all-on median: what that mechanism adds.",
        "",
        "| policy | median (p95) | cost of the mechanism |",
        "|---|---|---|",
    ]
    ab = [(k[1], v) for k, v in L.items() if isinstance(k, tuple) and k[0] == "ablation"]
    on = med(ab[0][1])
    for name, v in ab:
        m, p, _ = stat(v)
        cost = "—" if v is ab[0][1] else f"{on - m:+.2f} ms"
        if name == "every mechanism off":
            cost = f"all: {on - m:+.2f} ms; off is +{m - med(L[('true', 'bare')]):.2f} ms over bare"
        lines.append(f"| {name} | {m:.2f} ms ({p:.2f}) | {cost} |")
    lines.append("")
    return "\n".join(lines)


def write_section(section: str):
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    pattern = re.compile(r"^## Launcher and cold start\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    DOC.write_text(text.rstrip("\n") + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100, help="runs of each launcher variant")
    ap.add_argument("--spawns", type=int, default=20, help="server spawns of each kind")
    ap.add_argument("--calls", type=int, default=200, help="trivial calls on the open servers")
    ap.add_argument("--baseline", help="an earlier build of the server, measured in turns with this one "
                    "for `run`, spawn → initialized, the first and a trivial python_exec and shell_run "
                    "(before/after)")
    ap.add_argument("--spool-runs", type=int, default=5,
                    help="runs of the output-spooling rows (0 skips them)")
    ap.add_argument("--spool-size", default="1G", help="bytes each spooling run prints (head -c syntax)")
    ap.add_argument("--part", choices=("all", "server"), default="all",
                    help="server: only the MCP rows (and the bare commands they cite); prints, never writes")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs alone")
    args = ap.parse_args()
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "mcp-sandbox-repl",
                        "--example", "noop_server"], cwd=ROOT, check=True)
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="msr-bench-", dir="/var/tmp") as tmp:
        ws = Path(tmp, "ws")
        ws.mkdir()
        pols = Path(tmp, "pol")
        pols.mkdir()
        baseline = os.path.abspath(args.baseline) if args.baseline else None
        L = launcher_part(args.runs, str(ws), pols, bare_only=args.part == "server", baseline=baseline)
        S = server_part(Path(tmp, "srv"), args.spawns, args.calls, baseline,
                        args.spool_runs, args.spool_size)
    load_after = loadavg()
    section = render(L, S, load_before, load_after, args.runs)
    print(section)
    if not args.no_write and args.part == "all":
        write_section(section)
        print(f"wrote {SECTION!r} in {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
