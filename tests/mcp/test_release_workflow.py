"""The release workflow (.github/workflows/release.yml), checked offline: it is valid
against the GitHub Actions workflow schema that check-jsonschema ships (its builtin
`vendor.github-workflows`, no network needed), copies broken in the usual ways are not,
and it builds what a release must publish: manylinux2014 wheels for x86_64 and aarch64,
the sdist; PyPI and crates.io by trusted publishing (OIDC, no stored token). The wheels themselves are built and checked locally by `tests/wheels`."""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

WORKFLOW = REPO / ".github" / "workflows" / "release.yml"


def validate(path: Path) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("check_jsonschema") is None:
        if os.environ.get("CI"):
            pytest.fail("check-jsonschema is not installed (tests/requirements.txt pins it)")
        pytest.skip("check-jsonschema is not installed (tests/run installs it into .venv-tests)")
    # No network: the builtin schema is part of the package. (A proxy that goes nowhere
    # makes any attempt to fetch one fail rather than succeed quietly.)
    env = dict(os.environ, HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9", NO_PROXY="")
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True, text=True, timeout=120, env=env,
    )


def load(text: str):
    from ruamel.yaml import YAML  # check-jsonschema's own YAML parser

    return YAML(typ="safe").load(io.StringIO(text))


def test_the_release_workflow_is_valid():
    r = validate(WORKFLOW)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize(
    "broken",
    [
        ("runs-on: ubuntu-24.04\n    environment: crates-io", "runs_on: ubuntu-24.04\n    environment: crates-io"),
        ("      id-token: write\n    steps:\n      - uses: actions/download-artifact",
         "      id-token: always\n    steps:\n      - uses: actions/download-artifact"),
        ("    tags: [\"v*\"]", "    tagz: [\"v*\"]"),
        ("    needs: [wheels, sdist]\n    if: startsWith(github.ref, 'refs/tags/v') || inputs.publish\n    runs-on: ubuntu-24.04\n    environment:\n",
         "    needs: {wheels: true}\n    if: startsWith(github.ref, 'refs/tags/v') || inputs.publish\n    runs-on: ubuntu-24.04\n    environment:\n"),
    ],
    ids=["job-without-runs-on", "bad-permission-value", "unknown-trigger-filter", "needs-not-a-list"],
)
def test_a_broken_copy_fails(tmp_path, broken):
    old, new = broken
    text = WORKFLOW.read_text()
    assert text.count(old) == 1, old
    copy = tmp_path / "release.yml"
    copy.write_text(text.replace(old, new))
    r = validate(copy)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "Schema validation errors" in r.stdout + r.stderr, r.stdout + r.stderr


def test_it_builds_and_publishes_what_a_release_needs():
    validate(WORKFLOW)  # skips without check-jsonschema (and so ruamel.yaml)
    w = load(WORKFLOW.read_text())
    jobs = w["jobs"]
    matrix = jobs["wheels"]["strategy"]["matrix"]["include"]
    built = {(m["target"], m["compat"]) for m in matrix}
    assert built == {
        ("x86_64-unknown-linux-gnu", "manylinux2014"),
        ("aarch64-unknown-linux-gnu", "manylinux2014"),
    }
    build = next(s for s in jobs["wheels"]["steps"] if str(s.get("uses", "")).startswith("PyO3/maturin-action@"))
    assert "--zig --compatibility ${{ matrix.compat }}" in build["with"]["args"] and "--locked" in build["with"]["args"]
    assert any(s.get("with", {}).get("command") == "sdist" for s in jobs["sdist"]["steps"])
    pypi = jobs["pypi"]
    assert pypi["permissions"] == {"id-token": "write"} and pypi["environment"]["name"] == "pypi"
    assert any(str(s.get("uses", "")).startswith("pypa/gh-action-pypi-publish@") for s in pypi["steps"])
    assert not any("password" in s.get("with", {}) for s in pypi["steps"]), "trusted publishing stores no token"
    crates = jobs["crates-io"]
    assert crates["permissions"] == {"id-token": "write"}
    assert any(str(s.get("uses", "")).startswith("rust-lang/crates-io-auth-action@") for s in crates["steps"])
    assert any(str(s.get("run", "")).startswith("cargo publish --locked") for s in crates["steps"])
    assert set(pypi["needs"]) == set(crates["needs"]) == {"wheels", "sdist"}
    # Nothing publishes from an untagged push: tags, or a manual run that asks for it.
    assert w["on"]["push"] == {"tags": ["v*"]}
