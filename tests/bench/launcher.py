#!/usr/bin/env python3
"""Launcher benchmark: how much `mcp-sandbox-repl run` adds to starting a command.

Measures the median wall time of `true` and `python3 -c pass`, bare and through
`run --policy workspace-write`, and writes the medians, the added milliseconds and the
ratio into the `## Launcher` section of docs/benchmarks.md.

Usage: python3 tests/bench/launcher.py [--runs N] [--no-build] [--no-write]
(builds the release binary first unless --no-build). Not part of the test run.
"""

import argparse
import datetime
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from common import build_dir  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = str(build_dir("release") / "mcp-sandbox-repl")
DOC = os.path.join(ROOT, "docs", "benchmarks.md")


def median_ms(argv, runs, cwd, env=None):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, check=True)
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def machine_note():
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs ({cpu}), uid {os.getuid()}"


def render(rows, runs):
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "## Launcher",
        "",
        f"`python3 tests/bench/launcher.py` — {today}; {machine_note()}.",
        f"Median wall time of {runs} sequential runs, release build, policy `workspace-write`",
        "(cgroup, network namespace, mount view, rlimits, capability drop, no_new_privs,",
        "Landlock, seccomp, then exec).",
        "",
        "`run` applies the sandbox in its forked child (it is single-threaded); the server,",
        "being multi-threaded, re-executes the binary as a launcher first — the",
        "`re-exec` column (`run --spawn-route reexec`) is that path.",
        "",
        "| command | bare (ms) | via `run` (ms) | added (ms) | ratio | via re-exec (ms) | added (ms) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, bare, sandboxed, reexec in rows:
        lines.append(
            f"| `{name}` | {bare:.2f} | {sandboxed:.2f} | {sandboxed - bare:.2f} | "
            f"{sandboxed / bare:.2f}x | {reexec:.2f} | {reexec - bare:.2f} |"
        )
    lines += [
        "",
        "Where the added time goes (medians for `true` with one mechanism added at a time,",
        "measured by hand on this machine, 2026-11-22): `run` with Landlock scopes, seccomp,",
        "capability drop and rlimits only adds ~4 ms — mostly starting `run` itself, its fork",
        "and exec (our own code is ~6 % of the samples in `perf`; the rest is the kernel and",
        "the dynamic loader); the mount view adds ~1.6 ms; the network namespace ~1.3 ms; the",
        "pids and memory cgroups ~1–2 ms each (create, join, remove). Joining a cgroup v1 by",
        "`cgroup.procs` waited for an RCU grace period (2–15 ms per job); the launcher now",
        "joins through `tasks` (it is single-threaded), which removed that wait — before that",
        "change `python3 -c pass` showed 20–30 ms added. The aim of < 2 ms added to `true` is",
        "not met on this machine: the namespaces, mount view and cgroups alone cost more.",
        "(Measured on a 2-CPU VM shared with other builds; absolute numbers are noisy.)",
        "",
    ]
    return "\n".join(lines)


def write_section(section):
    text = open(DOC).read() if os.path.exists(DOC) else "# Benchmarks\n"
    pattern = re.compile(r"^## Launcher\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with open(DOC, "w") as f:
        f.write(text.rstrip("\n") + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs alone")
    args = ap.parse_args()
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    python = shutil.which("python3") or sys.executable
    workspace = tempfile.mkdtemp(prefix="msr-bench-", dir="/var/tmp")
    try:
        rows = []
        for name, cmd in [("true", ["true"]), ("python3 -c pass", [python, "-c", "pass"])]:
            run = [BIN, "run", "--policy", "workspace-write", "--workspace", workspace, "--"] + cmd
            # Warm up caches (page cache, dentries) before timing either variant.
            median_ms(cmd, 5, workspace)
            median_ms(run, 5, workspace)
            reexec_run = [BIN, "run", "--spawn-route", "reexec"] + run[2:]
            bare = median_ms(cmd, args.runs, workspace)
            sandboxed = median_ms(run, args.runs, workspace)
            reexec = median_ms(reexec_run, args.runs, workspace)
            rows.append((name, bare, sandboxed, reexec))
            print(f"{name:18} bare {bare:7.2f} ms   run {sandboxed:7.2f} ms   "
                  f"added {sandboxed - bare:6.2f} ms   ratio {sandboxed / bare:5.2f}x   "
                  f"re-exec {reexec:7.2f} ms")
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    section = render(rows, args.runs)
    if not args.no_write:
        write_section(section)
        print(f"wrote the Launcher section of {os.path.relpath(DOC, ROOT)}")


if __name__ == "__main__":
    main()
