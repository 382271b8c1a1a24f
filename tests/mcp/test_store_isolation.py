"""Stores that outlive a job, through a real MCP client (issue 26, Build 1).

- Cache poisoning: session alice installs a package; session mallory installs a local
  sdist whose build hook poisons whatever it can reach of the uv cache (appends code to
  the package's files, plants a `.pth` and lists it in RECORD, replaces a cached built
  wheel); after a server restart session bob installs the same package — with
  `env_install` and as a `python_run_script` dependency — and imports it clean. The hook
  did poison mallory's own store (so it ran, and found its targets there).
- Every place an install hook, a script's build hook, a script, a session cell and a shell
  job can write is listed from inside the job: only the workspace, the job's own temp dir
  and its own session's venv, uv cache and transient environment.
- Disk bounds: a hook writing 3 GiB (dense, and with fallocate) into the uv cache, the
  venv or a script's transient environment is stopped at the session's bound (64 MiB
  here) with words and `limit: "disk"`; a store that stays full refuses the next install
  in words; the total bound over all sessions holds too; a second install of the same
  package in one session still hits its cache.

No package index: wheels and sdists are made here, uv runs offline with find-links.
"""

import http.server
import io
import json
import os
import re
import tarfile
import threading
from pathlib import Path

import pytest
from conftest import make_wheel, uv_offline

MiB = 1 << 20
POISON = "import os as _o; _o.environ['POISONED'] = '1'; print('POISONED')"


def make_sdist(dest: Path, name: str, backend: str) -> Path:
    """A local sdist of `name` 0.1 whose in-tree build backend is `backend`."""
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "hookbackend"\nbackend-path = ["."]\n\n'
        f'[project]\nname = "{name}"\nversion = "0.1"\n',
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n",
        "hookbackend.py": backend,
    }
    path = dest / f"{name}-0.1.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for n, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-0.1/{n}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


# A build backend whose wheel is one module `NAME/__init__.py` with BODY; HOOK runs in
# get_requires_for_build_wheel (the first hook uv calls).
BACKEND = r'''
import base64, hashlib, os, shutil, sys, zipfile

def wheel_bytes(name, body):
    files = {f"{name}/__init__.py": body.encode(),
             f"{name}-0.1.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n".encode(),
             f"{name}-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    def write(z):
        for n, d in files.items():
            z.writestr(n, d)
            h = base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()
            record.append(f"{n},sha256={h},{len(d)}")
        z.writestr(f"{name}-0.1.dist-info/RECORD", "\n".join(record + [f"{name}-0.1.dist-info/RECORD,,"]) + "\n")
    return write

def get_requires_for_build_wheel(config_settings=None):
HOOK
    return []

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = "NAME-0.1-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        wheel_bytes("NAME", BODY)(z)
    return name
'''


def backend(name: str, body: str, hook: str = "    pass") -> str:
    return BACKEND.replace("HOOK", hook).replace("NAME", name).replace("BODY", repr(body))


# Mallory's hook: every directory it can reach from $UV_CACHE_DIR up to (not including)
# `/` is walked; MODE picks the attack.
POISON_HOOK = r'''
    mode, line = MODE, POISON
    tops, p = [], os.environ.get("UV_CACHE_DIR", "")
    while p not in ("", "/"):
        tops.append(p)
        p = os.path.dirname(p)
    seen, hits, errors = set(), [], 0
    for top in tops:
        for d, dirs, files in os.walk(top):
            if d in seen:
                dirs[:] = []
                continue
            seen.add(d)
            for f in files:
                path = os.path.join(d, f)
                try:
                    if mode == "append" and "victimpkg" in path and f.endswith(".py"):
                        with open(path, "a") as fh:
                            fh.write("\n" + line + "\n")
                        hits.append(path)
                    elif mode == "pth" and f == "RECORD" and os.path.basename(d).startswith("victimpkg-"):
                        root = os.path.dirname(d)
                        with open(os.path.join(root, "zz_poison.pth"), "w") as fh:
                            fh.write(line + "\n")
                        with open(path, "a") as fh:
                            fh.write("zz_poison.pth,,\n")
                        hits.append(path)
                    elif mode == "replace" and f.startswith("victimsd-") and f.endswith(".whl"):
                        with zipfile.ZipFile(path + ".new", "w") as z:
                            wheel_bytes("victimsd", line + "\nV = 'poisoned'\n")(z)
                        os.replace(path + ".new", path)
                        hits.append(path)
                    elif mode == "replace" and f == "__init__.py" and os.path.basename(d) == "victimsd":
                        # The unpacked copy uv links from: dropped, so the wheel is unpacked again.
                        shutil.rmtree(os.path.dirname(d))
                        hits.append(d)
                except OSError:
                    errors += 1
    print(f"HOOK-REACHED {len(seen)} dirs, poisoned {len(hits)}, errors {errors}", flush=True)
    sys.exit("hook done")  # a failed build shows the hook's output
'''


def poison_hook(mode: str) -> str:
    return POISON_HOOK.replace("MODE", repr(mode)).replace("POISON", repr(POISON))


@pytest.fixture
def wheels(server):
    """The server with a local find-links directory (victimpkg 0.1 as a wheel, victimsd
    0.1 as an sdist uv builds) as its only package source."""
    d = server.root / "wheels"
    d.mkdir()
    make_wheel(d, "victimpkg", "0.1")
    make_sdist(d, "victimsd", backend("victimsd", "V = 'clean'\n"))
    return uv_offline(server, d)


async def job_of(c, tool: str, **args) -> dict:
    """Start a job-running tool and follow the job to its end, whatever its status."""
    res = await c.call(tool, **args)
    assert res.structured_content and "job_id" in res.structured_content, res
    return await c.finish(res.structured_content, timeout=120)


async def install(c, session: str, *packages: str) -> dict:
    return await job_of(c, "env_install", packages=list(packages), session=session)


async def script(c, session: str, code: str, deps: list[str]) -> dict:
    return await job_of(c, "python_run_script", code=code, dependencies=deps, session=session)


async def poisoned_import(c, session: str, module: str) -> tuple[bool, dict]:
    """Whether importing `module` in `session` ran planted code (its stdout, or a `.pth`
    that set POISONED when the venv was activated)."""
    r = await c.py(f"import os, {module}\nprint('ENV', os.environ.get('POISONED'))", session=session)
    assert r["status"] == "completed", r
    return ("POISONED" in r["stdout"]["text"] or "ENV 1" in r["stdout"]["text"]), r


def evil_sdist(server, mode: str) -> Path:
    return make_sdist(server.workspace, f"evil{mode}", backend(f"evil{mode}", "", poison_hook(mode)))


def hook_report(job: dict) -> str:
    text = job["all_stdout"] + job["all_stderr"] + (job.get("message") or "")
    lines = [l for l in text.splitlines() if "HOOK-REACHED" in l]
    assert lines, f"the hook did not run: {text[-3000:]}"
    return lines[-1]


VICTIM = {"append": "victimpkg", "pth": "victimpkg", "replace": "victimsd"}


@pytest.mark.parametrize("mode", ["append", "pth", "replace"])
@pytest.mark.parametrize("via", ["install", "script"])
def test_a_hook_cannot_poison_another_sessions_packages(wheels, mode, via):
    """alice installs the victim; mallory installs it too, then runs a package whose build
    hook poisons every copy it can reach (through env_install, or as a python_run_script
    dependency); after a restart bob installs the victim and imports it, and runs a script
    that depends on it: both clean. alice's copy stays clean; mallory's own cache is
    poisoned (a script of mallory's with the victim shows it)."""
    victim = VICTIM[mode]
    sdist = evil_sdist(wheels, mode)

    async def first(c):
        for who in ("alice", "mallory"):
            job = await install(c, who, victim)
            assert job["status"] == "completed", job
        if via == "install":
            job = await install(c, "mallory", str(sdist))
        else:
            job = await script(c, "mallory", "print('ran')", [str(sdist)])
        report = hook_report(job)
        assert ", poisoned 0," not in report, report  # it found its targets (its own, at least)
        bad, r = await poisoned_import(c, "alice", victim)
        assert not bad, (report, r)

    async def second(c):
        job = await install(c, "bob", f"{victim}==0.1")
        assert job["status"] == "completed", job
        bad, r = await poisoned_import(c, "bob", victim)
        assert not bad, r
        check = f"import os, {victim}\nprint('ENV', os.environ.get('POISONED'))"
        job = await script(c, "bob", check, [f"{victim}==0.1"])
        assert job["status"] == "completed", job
        assert "ENV None" in job["all_stdout"] and "POISONED" not in job["all_stdout"], job
        # mallory's own cache was poisoned: a fresh environment of mallory's shows it, so
        # the hook's reach was real.
        job = await script(c, "mallory", check, [f"{victim}==0.1"])
        assert "POISONED" in job["all_stdout"] or "ENV 1" in job["all_stdout"], job

    wheels.run(first, timeout=400)
    wheels.run(second, timeout=400)


# A probe every kind of job runs: every directory it can create a file in, the topmost of
# each writable tree (below a writable directory everything is the same store), with the
# file system type of the mount it is on. Only read-write mounts can hold one.
PROBE = r'''
import json, os
def mounts():
    out = []
    for line in open("/proc/self/mountinfo"):
        f = line.split()
        sep = f.index("-")
        out.append((f[4], f[5].split(","), f[sep + 1]))
    return out
def fstype(path, ms):
    best = max((m for m in ms if path == m[0] or path.startswith(m[0].rstrip("/") + "/")), key=lambda m: len(m[0]))
    return best[2]
def can_create(d):
    p = os.path.join(d, ".probe-%d" % os.getpid())
    try:
        fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError:
        return False
    os.close(fd)
    os.unlink(p)
    return True
ms = mounts()
skip = ("/proc", "/sys", "/dev")
tops = sorted({m[0] for m in ms if "rw" in m[1] and not m[0].startswith(skip)} | {"/"})
found = {}
for top in tops:
    for d, dirs, files in os.walk(top):
        if d.startswith(skip) and d != "/":
            dirs[:] = []
            continue
        if can_create(d):
            if not any(d == f or d.startswith(f.rstrip("/") + "/") for f in found):
                found[d] = fstype(d, ms)
            dirs[:] = []
print("WRITABLE" + json.dumps(found), flush=True)
'''


def writable_of(text: str) -> dict:
    for line in text.splitlines():
        i = line.find("WRITABLE{")
        if i >= 0:
            return json.loads(line[i + len("WRITABLE") :])
    raise AssertionError(f"no WRITABLE line in: {text[-3000:]}")


def test_what_each_kind_of_job_can_write(wheels):
    """From inside an install's build hook, a script dependency's build hook, a script, a
    session cell and a shell job of session alice: every directory the job can create a
    file in is the workspace (not for installers), a tmpfs of its own, or one of alice's
    own stores (her uv cache, her venv, the script's transient environment) — never
    another session's store, the state directory or anything else under it."""
    state, ws = wheels.state_dir, wheels.workspace
    sdist = make_sdist(ws, "probepkg", backend("probepkg", "", PROBE.replace("\n", "\n    ") + "\n    sys.exit('probe done')"))

    # Where a job's private temp dir is: a tmpfs of its own view (the state dir may lie
    # under /tmp, where it is bound too).
    private = [str(state / "env-tmp"), str(state / "shell-tmp"), str(state / "repl" / "alice"), "/tmp"]

    def check(found: dict, where: str, stores: list[str]):
        for path, fs in found.items():
            if fs == "tmpfs" and any(path == p or path.startswith(p + "/") for p in private):
                continue  # the job's own temp dir: private, gone with the job
            ok = [s for s in stores if path == s or path.startswith(s + "/")]
            assert ok, f"{where}: {path} ({fs}) is writable: {found}"

    async def scenario(c):
        # bob has stores too: none of them may be writable from alice's jobs.
        assert (await install(c, "bob", "victimpkg"))["status"] == "completed"
        cache = str(state / "uv-cache" / "sessions" / "local" / "alice")
        venv = str(state / "venvs" / "alice")
        envs = str(state / "script-envs")
        job = await install(c, "alice", str(sdist))
        found = writable_of(job["all_stdout"] + job["all_stderr"] + (job.get("message") or ""))
        check(found, "install hook", [cache, venv])
        assert cache in found and venv in found, found  # the probe sees what it may write

        job = await script(c, "alice", "print(1)", [str(sdist)])
        found = writable_of(job["all_stdout"] + job["all_stderr"] + (job.get("message") or ""))
        check(found, "script dependency hook", [cache, envs])
        assert cache in found, found

        job = await script(c, "alice", PROBE, [])
        check(writable_of(job["all_stdout"]), "script", [str(ws)])
        job = await script(c, "alice", PROBE, ["victimpkg"])
        check(writable_of(job["all_stdout"]), "script with a dependency", [str(ws)])

        r = await c.py(PROBE, session="alice")
        assert r["status"] == "completed", r
        check(writable_of(r["stdout"]["text"]), "session cell", [str(ws)])

        (ws / "probe.py").write_text(PROBE)
        r = await c.ok("shell_run", command="python3 probe.py", session="alice")
        check(writable_of(r["stdout"]["text"]), "shell job", [str(ws)])

    wheels.run(scenario, timeout=400)


# A hook that writes 3 GiB into one of the stores it may write (TARGET: "cache" = its
# $UV_CACHE_DIR, "venv" = the venv being installed into, "env" = a script's transient
# environment, both found in its view), then waits to be stopped. HOW: "dense" (1 MiB
# writes), "fallocate" (posix_fallocate of 3 GiB), "unlinked" (dense, into a file it
# unlinked first: no name in any store), "many" (4 KiB files).
FILL_HOOK = r'''
    import time
    target, how = TARGET, HOW
    d = os.environ["UV_CACHE_DIR"]
    if target != "cache":
        want = "/venvs/" if target == "venv" else "/script-envs/"
        d = [l.split()[4] for l in open("/proc/self/mountinfo") if want in l.split()[4]][0]
    path = os.path.join(d, "filler.bin")
    print("FILL-START", how, d, flush=True)
    chunk = b"\x01" * (1 << 20)
    with open(path, "wb") as f:
        if how == "unlinked":
            os.unlink(path)
        if how == "fallocate":
            os.posix_fallocate(f.fileno(), 0, 3 << 30)
        elif how == "many":
            for i in range(3 << 18):
                with open(os.path.join(d, f"f{i}"), "wb") as g:
                    g.write(chunk[:4096])
        else:
            for _ in range(3 << 10):
                f.write(chunk)
            f.flush()
    print("FILL-DONE", flush=True)
    time.sleep(600)
'''

# A hook that writes MB MiB into $UV_CACHE_DIR and fails the build (no bound passed).
SOME_HOOK = r'''
    with open(os.path.join(os.environ["UV_CACHE_DIR"], "some.bin"), "wb") as f:
        for _ in range(MB):
            f.write(b"\x01" * (1 << 20))
    sys.exit("wrote MB MiB")
'''


def allocated(*paths: Path) -> int:
    """Bytes allocated under `paths` (st_blocks), as the host sees them now."""
    total = 0
    for top in paths:
        for d, dirs, files in os.walk(top):
            for n in dirs + files:
                try:
                    total += os.lstat(os.path.join(d, n)).st_blocks * 512
                except OSError:
                    pass
    return total


def store_paths(server, session: str) -> list[Path]:
    return [server.state_dir / "uv-cache" / "sessions" / "local" / session, server.state_dir / "venvs" / session]


CAP = ["--env-disk-cap", "64MiB"]


@pytest.mark.parametrize(
    "tool,target,how",
    [
        ("install", "cache", "dense"),
        ("install", "cache", "fallocate"),
        ("install", "cache", "unlinked"),
        ("install", "cache", "many"),
        ("install", "venv", "dense"),
        ("script", "env", "dense"),
        ("script", "cache", "dense"),
    ],
)
def test_a_hook_writing_3_gib_is_stopped_at_the_sessions_bound(wheels, tool, target, how):
    """With --env-disk-cap 64MiB, a build hook writing 3 GiB into a store (dense, by
    fallocate, into an unlinked file, as many small files) is killed at the bound: the job
    fails with `limit: "disk"` and words naming the bound, far below 3 GiB. Afterwards an
    install in the session either clears its cache and works (the filler was in the
    cache), or is refused in words (the filler is in its venv); another session is
    untouched and installs."""
    hook = FILL_HOOK.replace("TARGET", repr(target)).replace("HOW", repr(how))
    sdist = make_sdist(wheels.workspace, "fillpkg", backend("fillpkg", "", hook))

    async def scenario(c):
        assert (await install(c, "s", "victimpkg"))["status"] == "completed"
        if tool == "install":
            job = await install(c, "s", str(sdist))
        else:
            job = await script(c, "s", "print('never')", [str(sdist)])
            assert job["result"]["failure"] == "disk_limit", job
        text = job["all_stdout"] + job["all_stderr"]
        assert job["status"] == "failed", job
        assert job["result"]["limit"] == "disk", job["result"]
        assert "FILL-DONE" not in text, text[-2000:]
        assert "disk bound" in job["message"] and "64.0 MiB allowed" in job["message"], job["message"]
        assert "--env-disk-cap" in job["message"], job["message"]
        used = allocated(*store_paths(wheels, "s"), wheels.state_dir / "script-envs")
        assert used < 1 << 30, f"{used} bytes left in the stores: the hook was not stopped at the bound"

        res = await c.call("env_install", packages=["victimpkg"], session="s")
        if target == "venv":
            assert res.is_error, res.structured_content
            words = res.content[0].text
            assert "package stores of session \"s\" are full" in words and "--env-disk-cap" in words, words
            assert "Remove the venv directory" in words, words
        else:
            job = await c.finish(res.structured_content, timeout=120)
            assert job["status"] == "completed", job
        assert (await install(c, "other", "victimpkg"))["status"] == "completed"

    wheels.run(scenario, *CAP, timeout=400)


def test_the_total_bound_over_all_sessions(wheels):
    """--env-disk-cap 64MiB, --env-disk-total 96MiB: session a's hook leaves 50 MiB in its
    cache (within both bounds); session b's hook writing 3 GiB is killed at what is left
    of the total, in words naming --env-disk-total; session c's install then clears the
    least recently used idle cache (a's) to make room, says so, and works."""
    fill = make_sdist(wheels.workspace, "fillpkg", backend("fillpkg", "", FILL_HOOK.replace("TARGET", "'cache'").replace("HOW", "'dense'")))
    (wheels.workspace / "some").mkdir()
    some = make_sdist(wheels.workspace / "some", "somepkg", backend("somepkg", "", SOME_HOOK.replace("MB", "50")))

    async def scenario(c):
        job = await install(c, "a", str(some))
        assert job["status"] == "failed" and "wrote 50 MiB" in job["all_stderr"] + job["message"], job
        assert job["result"].get("limit") is None, job["result"]
        job = await install(c, "b", str(fill))
        assert job["status"] == "failed" and job["result"]["limit"] == "disk", job
        assert "--env-disk-total" in job["message"], job["message"]
        assert allocated(*store_paths(wheels, "b")) < 1 << 30
        job = await install(c, "c", "victimpkg")
        assert job["status"] == "completed", job
        assert "of idle sessions' uv caches were cleared" in job["all_stderr"], job["all_stderr"]
        assert not (wheels.state_dir / "uv-cache" / "sessions" / "local" / "a" / "some.bin").exists()

    wheels.run(scenario, *CAP, "--env-disk-total", "96MiB", timeout=400)


class Counting:
    """A directory served over HTTP on the host's 127.0.0.1: the paths answered 200."""

    def __init__(self, directory: Path):
        self.full = []
        web = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **k):
                super().__init__(*a, directory=str(directory), **k)

            def log_request(self, code="-", size="-"):
                if str(int(code)) == "200":
                    web.full.append(self.path)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def fetched(self, name: str) -> int:
        return sum(1 for p in self.full if p.endswith(name))

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_sessions_cache_still_serves_its_second_install(server):
    """Wheels from a find-links server on the host (through the broker): session s
    downloads tinypkg — its script with the same dependency, in a fresh environment,
    is served from s's cache; session t downloads it again, into its own cache. With
    --env-disk-cap the cache keeps working within the bound."""
    d = server.root / "wheels"
    d.mkdir()
    wheel = make_wheel(d, "tinypkg", "0.1").name
    web = Counting(d)
    server.env.update(UV_NO_INDEX="1", UV_FIND_LINKS=f"http://127.0.0.1:{web.port}/", UV_PYTHON_DOWNLOADS="never")

    async def scenario(c):
        assert (await install(c, "s", "tinypkg"))["status"] == "completed"
        first = web.fetched(wheel)  # uv may ask more than once (metadata, then the file)
        assert first >= 1, web.full
        job = await script(c, "s", "import tinypkg; print(tinypkg.__version__)", ["tinypkg"])
        assert job["status"] == "completed" and job["all_stdout"] == "0.1\n", job
        assert web.fetched(wheel) == first, web.full  # from s's cache
        assert (await install(c, "t", "tinypkg"))["status"] == "completed"
        assert web.fetched(wheel) > first, web.full  # t has a cache of its own

    try:
        server.run(scenario, *CAP, timeout=300)
    finally:
        web.close()


MEMORY_HOOK = r'''
    blocks = []
    for _ in range(64):
        blocks.append(bytearray(64 << 20))  # touches every page: 4 GiB in all
    print("MEMORY-DONE", flush=True)
'''


@pytest.mark.parametrize("tool", ["install", "script"])
def test_a_hook_or_script_killed_at_the_memory_cap_says_so(wheels, tool):
    """Under a policy with `memory = "256MiB"`, an install's build hook and a script that
    allocate gigabytes are killed at the cap: the job fails with `limit: "memory"` and words
    naming the limit, not only "signal SIGKILL"."""
    src = (Path(__file__).resolve().parents[2] / "policies" / "workspace-write.toml").read_text()
    policy = wheels.root / "small-memory.toml"
    policy.write_text(re.sub(r'(?m)^memory = .*$', 'memory = "256MiB"', src))
    sdist = make_sdist(wheels.workspace, "hogpkg", backend("hogpkg", "", MEMORY_HOOK))

    async def scenario(c):
        if tool == "install":
            job = await install(c, "s", str(sdist))
        else:
            code = "blocks = [bytearray(64 << 20) for _ in range(64)]\nprint('MEMORY-DONE')"
            job = await script(c, "s", code, [])
        text = job["all_stdout"] + job["all_stderr"]
        assert job["status"] == "failed", job
        assert "MEMORY-DONE" not in text, text[-2000:]
        assert job["result"]["limit"] == "memory", job["result"]
        assert "memory" in (job.get("message") or "") and "256" in job["message"], job["message"]

    wheels.run(scenario, "--policy", str(policy), timeout=400)


# A hook that reports what an earlier install's hook left in its temp dirs, then leaves
# a file in each of them itself.
TMP_HOOK = r'''
    dirs = sorted({d for d in (os.environ.get("TMPDIR"), os.environ.get("HOME"), "/tmp") if d})
    mark = "left-by-an-earlier-install"
    seen = [d for d in dirs if os.path.exists(os.path.join(d, mark))]
    wrote = 0
    for d in dirs:
        try:
            with open(os.path.join(d, mark), "w") as fh:
                fh.write("x")
            wrote += 1
        except OSError:
            pass
    print(f"TMP-SEEN {seen} WROTE {wrote} of {dirs}", flush=True)
    sys.exit("hook done")
'''


def test_each_install_of_a_session_has_its_own_temp_dir(wheels):
    """A session's installs share one sandbox view, which the server may make ahead of the
    next install: still, a file a build hook leaves in its TMPDIR, HOME or /tmp is not seen
    by the hook of the session's next install (each has a temp dir of its own)."""
    sdist = make_sdist(wheels.workspace, "tmppkg", backend("tmppkg", "", TMP_HOOK))

    async def scenario(c):
        assert (await install(c, "s", "victimpkg"))["status"] == "completed"
        for _ in range(4):
            job = await install(c, "s", str(sdist))
            assert job["status"] == "failed", job
            text = job["all_stdout"] + job["all_stderr"]
            line = [l for l in text.splitlines() if "TMP-SEEN" in l]
            assert line, text[-3000:]
            assert "TMP-SEEN [] WROTE" in line[-1], line[-1]
            assert "WROTE 0 " not in line[-1], line[-1]

    wheels.run(scenario, timeout=400)
