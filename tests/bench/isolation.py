#!/usr/bin/env python3
"""Isolation benchmark: the cost of each step the launcher takes for the job's cgroup,
network namespace and mount view (medians in a forked child, measured by the ignored
Rust test `measure_isolation_costs`), written into the `## Isolation` section of
docs/benchmarks.md.

Usage: python3 tests/bench/isolation.py [--no-write]   (needs root; not part of the test run)
"""

import datetime
import os
import platform
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "benchmarks.md")


def measure():
    out = subprocess.run(
        ["cargo", "test", "--release", "--lib", "measure_isolation_costs", "--", "--ignored", "--nocapture"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    return [(m.group(1), int(m.group(2))) for m in re.finditer(r"^(.+): (\d+) us$", out, re.M)]


def section(rows):
    load = os.getloadavg()[0]
    lines = [
        "## Isolation",
        "",
        f"`python3 tests/bench/isolation.py` — {datetime.date.today()}, Linux {platform.release()}, "
        f"{os.cpu_count()} CPUs, load average {load:.1f} while measuring. Medians in a forked child.",
        "",
        "| Step | Median |",
        "|---|---|",
    ]
    lines += [f"| {name} | {us / 1000:.2f} ms |" for name, us in rows]
    lines += [
        "",
        "The launcher joins v1 job cgroups through `tasks` (it is single-threaded), which skips the",
        "global threadgroup lock: a `cgroup.procs` write after an idle period waits for an RCU grace",
        "period (the \"idle before\" row), back-to-back writes do not.",
        "",
    ]
    return "\n".join(lines)


def write(text):
    doc = open(DOC).read() if os.path.exists(DOC) else "# Benchmarks\n"
    pattern = re.compile(r"^## Isolation\n.*?(?=^## |\Z)", re.M | re.S)
    doc = pattern.sub(lambda _: text + "\n", doc) if pattern.search(doc) else doc.rstrip("\n") + "\n\n" + text
    open(DOC, "w").write(doc)


if __name__ == "__main__":
    rows = measure()
    text = section(rows)
    print(text)
    if "--no-write" not in sys.argv:
        write(text)
        print("wrote the Isolation section of docs/benchmarks.md")
