#!/usr/bin/env python3
"""Two release binaries side by side in one run (issue 24: "launcher, first execute and
trivial execute before/after in one run — no regression beyond noise").

    python3 tests/bench/before_after.py --before BIN_A --after BIN_B \
        [--label-before 325165c] [--label-after 24296ca] [--launch 300] [--first 24] \
        [--calls 300] [--repeats 3] [--python /usr/bin/python3] [--after-extra=--snapshot-idle-ms,0] [--no-write]

Not part of the test run. Both binaries run with default settings (no MCP_SANDBOX_*
variables, no switches) except `--python`; `--after-extra` adds one more AFTER server
with the given arguments (e.g. an old default) to the trivial-execute figures. Every
measurement alternates between the binaries so load bursts on the shared machine land on
both alike:
- launcher: `/bin/true` bare, and `run --policy workspace-write -- /bin/true` through each
  binary, one of each per round (the order rotated each round);
- first `python_exec` from `initialize` (request sent → cell answered), a fresh server per
  sample on one state dir per binary (one unmeasured start first), alternating binaries;
  `python3 -c pass` bare beside it;
- trivial `python_exec 1`: one server per variant open at once, one session each, five
  unmeasured calls, then blocks of 25 calls in turn.
Reports median, p95, the interquartile range (spread) and the after/before ratio of
medians with a 95 % bootstrap interval (resampling both sides); a ratio whose interval
holds 1.00 is within this run's noise. Writes the section
"## Before and after the sandbox runtime and phase machine (issue 24), <date>" of
docs/benchmarks.md unless --no-write.
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
from common import cpu_model, write_section  # noqa: E402


async def _no_client_validation(self, name, result):
    return None


# Client-side output-schema checking is client work, not server work.
ClientSession.validate_tool_result = _no_client_validation

SECTION = f"## Before and after the sandbox runtime and phase machine (issue 24), {datetime.date.today().isoformat()}"


def uptime() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def q(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def ratio_ci(a: list[float], b: list[float], reps: int = 2000, seed: int = 24) -> tuple[float, float]:
    """95 % bootstrap interval of median(b) / median(a)."""
    rng = random.Random(seed)
    rs = []
    for _ in range(reps):
        ra = med(rng.choices(a, k=len(a)))
        rb = med(rng.choices(b, k=len(b)))
        rs.append(rb / ra)
    rs.sort()
    return rs[int(0.025 * reps)], rs[int(0.975 * reps) - 1]


def server_env(root: Path) -> dict:
    ws, state = root / "ws", root / "state"
    ws.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_SANDBOX_")}
    env.update(MCP_SANDBOX_WORKSPACE=str(ws), MCP_SANDBOX_STATE_DIR=str(state), RUST_LOG="error")
    return env


def params(binary: str, root: Path, args: list[str]) -> StdioServerParameters:
    env = server_env(root)
    return StdioServerParameters(command=binary, args=args, env=env, cwd=env["MCP_SANDBOX_WORKSPACE"])


def time_cmd(argv: list[str], cwd: str) -> float:
    t = time.perf_counter()
    subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t


def launcher(variants: list[tuple[str, list[str]]], n: int, root: Path) -> dict:
    ws = root / "l-ws"
    ws.mkdir(exist_ok=True)
    res: dict = {name: [] for name, _ in variants}
    for _ in range(5):
        for _, argv in variants:
            time_cmd(argv, str(ws))
    for i in range(n):
        k = i % len(variants)
        for name, argv in variants[k:] + variants[:k]:
            res[name].append(time_cmd(argv, str(ws)))
    return res


async def first_exec(p: StdioServerParameters) -> float:
    async with stdio_client(p, errlog=open(os.devnull, "w")) as (r, w):
        async with ClientSession(r, w) as s:
            t = time.perf_counter()
            await s.initialize()
            res = await s.call_tool("python_exec", {"code": "1"})
            took = time.perf_counter() - t
            assert not res.is_error, res
            return took


def firsts(variants: list[tuple[str, StdioServerParameters]], python: str, n: int) -> dict:
    bare = f"bare `{python} -c pass`"
    res: dict = {name: [] for name, _ in variants}
    res[bare] = []
    for _, p in variants:  # the state dir as a configured server has it
        anyio.run(first_exec, p)
    for i in range(n):
        k = i % len(variants)
        for name, p in variants[k:] + variants[:k]:
            res[name].append(anyio.run(first_exec, p))
            time.sleep(0.2)  # the previous server's processes are gone
        t = time.perf_counter()
        subprocess.run([python, "-c", "pass"], check=True)
        res[bare].append(time.perf_counter() - t)
    return res


async def trivial(variants: list[tuple[str, StdioServerParameters]], calls: int) -> dict:
    res: dict = {name: [] for name, _ in variants}
    async with contextlib.AsyncExitStack() as stack:
        sessions = []
        for name, p in variants:
            r, w = await stack.enter_async_context(stdio_client(p, errlog=open(os.devnull, "w")))
            s = await stack.enter_async_context(ClientSession(r, w))
            await s.initialize()
            for _ in range(5):
                out = await s.call_tool("python_exec", {"code": "1"})
                assert not out.is_error, out
            sessions.append((name, s))
        block = 25
        for i in range(max(1, calls // block)):
            k = i % len(sessions)
            for name, s in sessions[k:] + sessions[:k]:
                for _ in range(block):
                    t = time.perf_counter()
                    out = await s.call_tool("python_exec", {"code": "1"})
                    res[name].append(time.perf_counter() - t)
                    assert not out.is_error, out
    return res


def row(name: str, xs: list[float]) -> str:
    m = 1000
    return (f"| {name} | {len(xs)} | {med(xs) * m:.2f} | {q(xs, 0.95) * m:.2f} | "
            f"{q(xs, 0.25) * m:.2f}–{q(xs, 0.75) * m:.2f} | {min(xs) * m:.2f} |")


def compare(name: str, a: list[float], b: list[float], per_rep: list[float]) -> str:
    lo, hi = ratio_ci(a, b)
    r = med(b) / med(a)
    verdict = "within noise" if lo <= 1.0 <= hi else ("slower" if lo > 1.0 else "faster")
    return (f"| {name} | {r:.3f}× | {lo:.3f}–{hi:.3f} | {q(b, 0.95) / q(a, 0.95):.3f}× | "
            f"{(med(b) - med(a)) * 1000:+.2f} ms | {', '.join(f'{x:.3f}' for x in per_rep)} | {verdict} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--label-before", default="before")
    ap.add_argument("--label-after", default="after")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--after-extra", default="", help="comma-separated extra arguments for one more AFTER server "
                    "(trivial execute only), e.g. --snapshot-idle-ms,0")
    ap.add_argument("--launch", type=int, default=300)
    ap.add_argument("--first", type=int, default=24)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--only", default="launch,first,hot")
    ap.add_argument("--repeats", type=int, default=3, help="the whole A/B sequence this many times; samples pooled, "
                    "each repeat's ratio shown (the run-to-run noise)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    only = set(args.only.split(","))
    A, B = f"BEFORE {args.label_before}", f"AFTER {args.label_after}"
    py = ["--python", args.python]
    extra = [x for x in args.after_extra.split(",") if x]
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    L0 = uptime()
    root = Path(tempfile.mkdtemp(prefix="before-after-", dir="/var/tmp"))
    La: dict = {}
    F: dict = {}
    H: dict = {}
    reps: list[tuple[dict, dict, dict]] = []

    def merge(into: dict, part: dict) -> None:
        for k, v in part.items():
            into.setdefault(k, []).extend(v)

    try:
        for rep in range(args.repeats):
            la = f = h = {}
            if "launch" in only:
                ws = str(root / "l-ws")
                run = ["run", "--policy", "workspace-write", "--workspace", ws, "--", "/bin/true"]
                la = launcher([("bare `/bin/true`", ["/bin/true"]),
                               (f"{A} `run --policy workspace-write -- /bin/true`", [args.before] + run),
                               (f"{B} `run --policy workspace-write -- /bin/true`", [args.after] + run)], args.launch, root)
                print(f"[{rep}] launcher done", uptime(), flush=True)
            if "first" in only:
                f = firsts([(f"{A} first `python_exec`", params(args.before, root / "f-a", py)),
                            (f"{B} first `python_exec`", params(args.after, root / "f-b", py))], args.python, args.first)
                print(f"[{rep}] first done", uptime(), flush=True)
            if "hot" in only:
                hv = [(f"{A} trivial `python_exec` (defaults)", params(args.before, root / f"h-a{rep}", py)),
                      (f"{B} trivial `python_exec` (defaults)", params(args.after, root / f"h-b{rep}", py))]
                if extra:
                    hv.append((f"{B} trivial `python_exec` (`{' '.join(extra)}`)",
                               params(args.after, root / f"h-c{rep}", py + extra)))
                h = anyio.run(trivial, hv, args.calls)
                print(f"[{rep}] hot done", uptime(), flush=True)
            reps.append((la, f, h))
            merge(La, la)
            merge(F, f)
            merge(H, h)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    L1 = uptime()
    lines = [
        SECTION,
        "",
        f"`python3 tests/bench/before_after.py` — {started} UTC; {os.uname().sysname} {os.uname().release}, "
        f"{os.cpu_count()} CPUs ({cpu_model()}); load average (1, 5, 15 min) {L0} at start, {L1} at end "
        "(a shared machine: other engineers built and tested meanwhile). Release builds of both commits "
        f"(`cargo build --release --locked`), default settings on both sides (no `MCP_SANDBOX_*` variables, "
        f"no switches) but `--python {args.python}`; alternating A/B in one run of {args.repeats} repeats "
        "(samples pooled below). Times in ms; spread = interquartile range (p25–p75).",
        "",
        "| measurement | n | median | p95 | spread (p25–p75) | min |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for group in (La, F, H):
        for name, xs in group.items():
            lines.append(row(name, xs))
    lines += [
        "",
        "Ratios after / before (median; 95 % bootstrap interval of the median ratio; a ratio whose "
        "interval holds 1.000 is within this run's sampling noise; the per-repeat ratios show the "
        "noise from one repeat to the next, which is larger):",
        "",
        "| measurement | median ratio | 95 % interval | p95 ratio | median difference | median ratio per repeat | reading |",
        "|---|---:|---:|---:|---:|---|---|",
    ]

    def pick(group: dict, who: str, tag: str = "") -> list[float] | None:
        return next((xs for n, xs in group.items() if n.startswith(who) and tag in n), None)

    pairs = [("launcher `run -- /bin/true`", 0, "", ""), ("first `python_exec` from `initialize`", 1, "", ""),
             ("trivial `python_exec`, defaults", 2, "(defaults)", "(defaults)")]
    if extra:
        pairs.append((f"trivial `python_exec`, AFTER with `{' '.join(extra)}` vs BEFORE defaults", 2, "(defaults)", "(`"))
    for name, i, ta, tb in pairs:
        group = (La, F, H)[i]
        a, b = pick(group, A, ta), pick(group, B, tb)
        if a and b:
            per_rep = [med(pick(r[i], B, tb)) / med(pick(r[i], A, ta)) for r in reps]
            lines.append(compare(name, a, b, per_rep))
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
