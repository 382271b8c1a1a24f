"""What the benchmark scripts share: the binary they measure and how a section of
docs/benchmarks.md is replaced by a run's figures."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "benchmarks.md"


@functools.cache
def build_dir(profile: str) -> Path:
    """Where cargo puts a profile's artifacts: target/<host triple>/<profile>
    (.cargo/config.toml builds for the host's target by name). Asked of rustc once."""
    out = subprocess.run(["rustc", "-vV"], capture_output=True, text=True).stdout
    triple = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("host:")), "")
    return REPO / "target" / triple / profile


def binary() -> str:
    """$MCP_SANDBOX_BIN, else the release build, else the debug build."""
    env = os.environ.get("MCP_SANDBOX_BIN")
    if env:
        return env
    for profile in ("release", "debug"):
        p = build_dir(profile) / "mcp-sandbox-repl"
        if p.exists():
            return str(p)
    sys.exit("no server binary: run `cargo build` or set MCP_SANDBOX_BIN")


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


def write_section(heading: str, text: str) -> None:
    """Replace the section `heading` (up to the next `## `) of docs/benchmarks.md with
    `text`, or append it."""
    doc = DOC.read_text()
    pattern = re.compile(re.escape(heading) + r"\n.*?(?=\n## |\Z)", re.S)
    if pattern.search(doc):
        doc = pattern.sub(lambda _: text.rstrip("\n") + "\n", doc)
    else:
        doc = doc.rstrip("\n") + "\n\n" + text
    DOC.write_text(doc)
