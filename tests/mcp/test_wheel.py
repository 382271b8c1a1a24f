"""The binary wheel: built with maturin, installed with pip into a fresh venv, and the
installed `mcp-sandbox-repl` answers `--version` and an MCP `python_exec` call from a
directory outside the repository. No Rust toolchain is on PATH after the wheel is built.

The wheel is built with the dev profile so it reuses the debug build (which `tests/run`
has just built): packaging costs seconds, not a second full release build. With
MCP_SANDBOX_WHEEL set, that wheel is checked instead: `tests/wheels` checks its
manylinux2014 and static musl wheels this way.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, build_dir


def maturin_command() -> list[str]:
    if importlib.util.find_spec("maturin") is not None:
        return [sys.executable, "-m", "maturin"]
    exe = shutil.which("maturin")
    if exe:
        return [exe]
    pytest.skip("maturin is not installed (tests/run installs it into .venv-tests)")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # A wheel built already (tests/wheels passes its manylinux2014 and musl wheels here).
    given = os.environ.get("MCP_SANDBOX_WHEEL")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("wheels")
    # maturin's own cargo build may put its build of the binary in the debug build's
    # directory (its flags differ) and then stages it out of there: keep the one every
    # other test runs (a hard link) and put it back, so that tests after this one, in any
    # order or run, find the binary they were built for.
    served = build_dir("debug") / "mcp-sandbox-repl"
    kept = out / "served-binary"
    if served.exists():
        os.link(served, kept)
    try:
        build = subprocess.run(
            [*maturin_command(), "build", "--profile", "dev", "--locked", "--out", str(out)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    finally:
        if kept.exists():
            os.replace(kept, served)
    assert build.returncode == 0, build.stderr[-4000:]
    wheels = list(out.glob("mcp_sandbox_repl-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def cargo_version() -> str:
    return tomllib.loads((REPO / "Cargo.toml").read_text())["package"]["version"]


def test_wheel_holds_the_binary_and_metadata_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    scripts = [n for n in names if ".data/scripts/" in n]
    assert [Path(n).name for n in scripts] == ["mcp-sandbox-repl"], names
    assert all(".dist-info/" in n or n in scripts for n in names), names
    meta = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))
    ).decode()
    assert f"Version: {cargo_version()}" in meta and "License-Expression: MIT" in meta


def test_installed_wheel_answers_version_and_python_exec(wheel, tmp_path, server, monkeypatch):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # No cargo or rustc on PATH from here on: the wheel must not need them.
    minimal = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    assert shutil.which("cargo", path=minimal["PATH"]) is None
    pip = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index", "--no-deps",
         "--disable-pip-version-check", str(wheel)],
        env=minimal, capture_output=True, text=True, timeout=300,
    )
    assert pip.returncode == 0, pip.stderr
    installed = venv / "bin" / "mcp-sandbox-repl"
    assert installed.is_file() and os.access(installed, os.X_OK)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    version = subprocess.run(
        [str(installed), "--version"], cwd=elsewhere, env=minimal, capture_output=True, text=True, timeout=30
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"mcp-sandbox-repl {cargo_version()}"

    # The official SDK starts the installed binary (cwd: the test's workspace, not the repo).
    monkeypatch.setenv("MCP_SANDBOX_BIN", str(installed))
    assert not str(server.workspace).startswith(str(REPO))

    async def scenario(c):
        assert os.readlink(f"/proc/{c.server_pid}/exe") == str(installed)
        r = await c.ok("python_exec", code="import sys\nprint('hi from', sys.platform)\n6*7")
        assert (r["status"], r["stdout"]["text"], r["value"]) == ("completed", "hi from linux\n", "42")

    server.run(scenario)
