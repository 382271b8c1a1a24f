"""A denial is named on every path, for the commonest shapes: a write to a relative path
in a read-only workspace (by a shell redirect, `touch`, Python's `open`), the file actually
refused (not the shell's own path), and a name lookup with the network off. Through
`python_exec`, `shell_run`, `python_run_script` (the MCP SDK) and `run --json`."""

import json
import os
import subprocess

import pytest
from conftest import binary

WRITES = {
    "redirect": ("echo x > out.txt", "open('out.txt', 'w').write('x')", "out.txt"),
    "touch": ("touch foo", "open('foo', 'a').close()", "foo"),
    "open": ("python3 -c \"open('out.csv', 'w')\"", "open('out.csv', 'w')", "out.csv"),
}
DNS_PY = "import urllib.request\nurllib.request.urlopen('https://pypi.org', timeout=20)"
DNS_SH = "python3 -c \"import socket; socket.getaddrinfo('pypi.org', 443)\""


def one_line(denied: list[str], want: str) -> None:
    assert any(want in d for d in denied), denied
    assert all("\n" not in d for d in denied), denied
    assert not any("/bin/sh" in d or "/usr/bin" in d for d in denied), denied


@pytest.mark.parametrize("case", sorted(WRITES))
def test_a_write_in_a_read_only_workspace_names_the_file_on_every_path(server, case):
    sh, py, name = WRITES[case]
    want = f"blocked by policy read-only: write to {server.workspace}/{name} ("

    async def scenario(c):
        shell = (await c.call("shell_run", command=sh)).structured_content
        assert shell["status"] == "failed", shell
        one_line(shell.get("denied", []), want)
        cell = await c.py(py)
        assert cell["status"] == "failed", cell
        one_line(cell.get("denied", []), want)
        res = await c.call("python_run_script", code=py, wait_seconds=60)
        script = await c.finish(res.structured_content, timeout=120)
        assert script["status"] == "failed", script
        one_line(script.get("denied", []), want)

    server.run(scenario, "--sandbox-state", "read-only")
    out = subprocess.run(
        [binary(), "run", "--policy", "read-only", "--json", "--", "sh", "-c", sh],
        cwd=server.workspace, env=server.server_env(), capture_output=True, text=True, timeout=120,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["exit_code"] != 0, report
    one_line(report["denied"], want.replace(str(server.workspace), os.path.realpath(server.workspace)))


def test_a_name_lookup_with_the_network_off_is_named_on_every_path(server):
    want = "blocked by policy workspace-write: name resolution refused (network is"

    async def scenario(c):
        cell = await c.py(DNS_PY)
        assert cell["status"] == "failed", cell
        one_line(cell.get("denied", []), want)
        shell = (await c.call("shell_run", command=DNS_SH)).structured_content
        assert shell["status"] == "failed", shell
        one_line(shell.get("denied", []), want)
        res = await c.call("python_run_script", code=DNS_PY, wait_seconds=60)
        script = await c.finish(res.structured_content, timeout=120)
        assert script["status"] == "failed", script
        one_line(script.get("denied", []), want)

    server.run(scenario)
    out = subprocess.run(
        [binary(), "run", "--json", "--", "sh", "-c", DNS_SH],
        cwd=server.workspace, env=server.server_env(), capture_output=True, text=True, timeout=120,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    one_line(report["denied"], want)
