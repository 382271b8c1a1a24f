"""The worker protocol (docs/worker-protocol.md) has one description and two
implementations: python/sandbox_repl_worker.py and R/sandbox_repl_worker.R. This drives
each worker directly (no server, no sandbox) with the same requests and checks every event
against the description: the tags and fields its tables list, the ids, and the semantics
both share (values, errors, input bridging, variables, interrupt, end of input)."""

import fcntl
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "worker-protocol.md").read_text()

# The bootstraps the server uses (src/repl/worker.rs, src/repl/r.rs), for the source form.
PY_BOOT = (
    "import os,sys\n"
    "n=int(sys.argv.pop(1));b=b''\n"
    "while len(b)<n:\n c=os.read(3,n-len(b))\n if not c:raise SystemExit('no driver')\n b+=c\n"
    "exec(compile(b,'<sandbox-repl-worker>','exec'))"
)
R_MARK = "#<end of the sandbox-repl R worker>"
R_BOOT = (
    "local({con <- file('/proc/self/fd/3', open = 'r', encoding = 'UTF-8', raw = TRUE); "
    "src <- character(); repeat { l <- readLines(con, 1L, warn = FALSE); "
    "if (!length(l)) quit('no', 70L); if (l == '" + R_MARK + "') break; src[length(src) + 1L] <- l }; "
    "f <- eval(parse(text = src, keep.source = FALSE), baseenv()); suspendInterrupts(f(con))})"
)


def r_ready() -> bool:
    rs = shutil.which("Rscript")
    if not rs:
        return False
    out = subprocess.run([rs, "-e", "cat(requireNamespace('jsonlite', quietly=TRUE))"], capture_output=True, text=True)
    return out.stdout.strip() == "TRUE"


def doc_table(heading: str, tag: str) -> dict[str, set[str]]:
    """`{tag value: {field names}}` from the table under `heading` of the description."""
    section = DOC.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*`(\w+)`\s*\|\s*([^|]*)\|", line)
        if m:
            rows[m.group(1)] = set(re.findall(r"`(\w+)`", m.group(2)))
    return rows


EVENTS = doc_table("## Events (worker → server", "ev")


class Worker:
    def __init__(self, lang: str, tmp: Path):
        req_r, self.req_w = os.pipe()
        self.ev_r, ev_w = os.pipe()
        # Free numbers >= 10 (never 3 or 4, which the worker's own ends take), not fixed
        # ones: a dup2 to a fixed number could clobber a descriptor another test's thread
        # still uses in this process.
        req_r, ev_w = (self._above_9(fd) for fd in (req_r, ev_w))
        env = dict(os.environ, TMPDIR=str(tmp), PYTHONIOENCODING="utf-8", R_LIBS_USER=str(tmp / "lib"))
        if lang == "python":
            source = (REPO / "python" / "sandbox_repl_worker.py").read_bytes()
            argv = [sys.executable, "-c", PY_BOOT, str(len(source))]
        else:
            source = (REPO / "R" / "sandbox_repl_worker.R").read_bytes()
            argv = [shutil.which("Rscript"), "--no-init-file", "-e", R_BOOT]
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$@" 3<&{req_r} 4>&{ev_w} {req_r}<&- {ev_w}>&-', "worker", *argv],
            pass_fds=(req_r, ev_w), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env, cwd=tmp, start_new_session=True,
        )
        os.close(req_r)
        os.close(ev_w)
        os.write(self.req_w, source)
        self.buf = b""
        self.next_id = 0
        self.lang = lang

    @staticmethod
    def _above_9(fd: int) -> int:
        moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
        os.close(fd)
        return moved

    def send(self, **req):
        os.write(self.req_w, (json.dumps(req) + "\n").encode())

    def event(self, timeout=60) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            assert left > 0, f"{self.lang}: no event within {timeout} s"
            if select.select([self.ev_r], [], [], left)[0]:
                chunk = os.read(self.ev_r, 65536)
                assert chunk, f"{self.lang}: the event pipe closed: {self.proc.stderr.read1(4096)!r}"
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        ev = json.loads(line)
        check_event(ev, self.lang)
        return ev

    def call(self, op, **fields) -> dict:
        self.next_id += 1
        self.send(op=op, id=self.next_id, **fields)
        ev = self.event()
        assert ev.get("id") == self.next_id, (self.lang, op, ev)
        return ev

    def cell(self, code, **fields) -> dict:
        return self.call("execute", cell=self.next_id + 1, code=code, repr_limit=2000, **fields)

    def close(self):
        self.send(op="shutdown")
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self.req_w)
        os.close(self.ev_r)


def check_event(ev: dict, lang: str):
    """Every event is one the description lists, with only the fields it lists."""
    tag = ev.get("ev")
    assert tag in EVENTS, f"{lang}: event {tag!r} is not in docs/worker-protocol.md"
    extra = set(ev) - EVENTS[tag] - {"ev"}
    assert not extra, f"{lang}: {tag} has fields the description does not list: {extra}"
    if tag == "done":
        assert ev["status"] in ("ok", "error", "interrupted"), ev
        assert isinstance(ev["display"], list), ev
        if "value" in ev:
            assert set(ev["value"]) == {"repr", "chars", "truncated"}, ev
        if "error" in ev:
            assert set(ev["error"]) == {"ename", "evalue", "traceback"}, ev


# The same requests, in each language's words.
CODE = {
    "python": dict(assign="x = 42", value="x * 2", value_repr="84", error="1/0", print="print('out')",
                   ask="name = input('Name: ')", use="name", use_repr="'Ada'", loop="while True: pass",
                   after="x", after_repr="42", lines="import sys\nlen(sys.stdin.readlines())", two="2"),
    "r": dict(assign="x <- 42", value="x * 2", value_repr="[1] 84", error="stop('no')", print="cat('out\\n')",
              ask="name <- readline('Name: ')", use="name", use_repr='[1] "Ada"', loop="repeat {}",
              after="x", after_repr="[1] 42", lines='length(readLines("stdin"))', two="[1] 2"),
}


@pytest.mark.parametrize("lang", ["python", pytest.param("r", marks=pytest.mark.skipif(not r_ready(), reason="R with jsonlite is not installed"))])
def test_both_workers_speak_the_described_protocol(lang, tmp_path):
    w = Worker(lang, tmp_path)
    try:
        code = CODE[lang]
        ready = w.event()
        assert ready["ev"] == "ready" and ready["protocol"] == 1 and ready["pid"] > 0, ready
        done = w.cell(code["assign"])
        assert done["status"] == "ok" and done.get("new_variables") == ["x"], done
        assert w.cell(code["value"])["value"]["repr"] == code["value_repr"]
        err = w.cell(code["error"])
        assert err["status"] == "error" and err["error"]["traceback"], err
        # Output travels on fd 1, never on the event pipe.
        assert w.cell(code["print"])["status"] == "ok"
        assert w.proc.stdout.read1(100).startswith(b"out")

        # input bridging: input_request carries the cell's id; input_reply answers it.
        w.next_id += 1
        cid = w.next_id
        w.send(op="execute", id=cid, cell=cid, code=code["ask"], repr_limit=2000)
        ask = w.event()
        assert ask == {"ev": "input_request", "id": cid, "prompt": "Name: "}, ask
        w.send(op="input_reply", id=cid, text="Ada")
        assert w.event()["status"] == "ok"
        assert w.cell(code["use"])["value"]["repr"] == code["use_repr"]
        # stdin is read a line at a time until text null (end of input).
        w.next_id += 1
        cid = w.next_id
        w.send(op="execute", id=cid, cell=cid, code=code["lines"], repr_limit=2000)
        for text in ["a", "b", None]:
            assert w.event()["ev"] == "input_request"
            w.send(op="input_reply", id=cid, text=text)
        assert w.event()["value"]["repr"] == code["two"]

        # Variables.
        listed = w.call("list_variables")
        assert [v["name"] for v in listed["variables"]] == ["name", "x"], listed
        assert listed["total"] == 2 and listed["omitted"] == 0 and listed["next"] is None, listed
        assert all(set(v) == {"name", "type", "repr", "size"} for v in listed["variables"]), listed
        got = w.call("get_variable", name="x", repr_limit=100)
        assert got["ev"] == "variable" and got["json"] == 42 and got["has_json"] is True, got
        assert w.call("get_variable", name="nope", repr_limit=100)["ev"] == "failed"
        assert w.call("set_variable", name="cfg", value={"a": [1, 2]})["ev"] == "ok"
        assert w.call("get_variable", name="cfg", repr_limit=100)["json"] == {"a": [1, 2]}
        assert w.call("delete_variable", name="cfg")["ev"] == "ok"
        assert w.call("ping")["ev"] == "ok"

        # Interrupt: the running cell ends "interrupted" and the state stays. (The server
        # sends an R worker SIGINT ahead of the request: R reads no request mid-cell.)
        w.next_id += 1
        cid = w.next_id
        w.send(op="execute", id=cid, cell=cid, code=code["loop"], repr_limit=2000)
        time.sleep(0.5)
        if lang == "r":
            os.kill(w.proc.pid, signal.SIGINT)
        w.send(op="interrupt", id=cid)
        done = w.event()
        assert done["id"] == cid and done["status"] == "interrupted", done
        assert w.cell(code["after"])["value"]["repr"] == code["after_repr"]
        # A stale interrupt (its cell ended) interrupts nothing.
        if lang == "r":
            os.kill(w.proc.pid, signal.SIGINT)
        w.send(op="interrupt", id=cid)
        assert w.cell(code["after"])["status"] == "ok"

        assert w.call("clear_variables")["ev"] == "ok"
        assert w.call("list_variables")["variables"] == []
    finally:
        w.close()
    assert w.proc.returncode == 0, w.proc.stderr.read()


def test_the_python_worker_reads_long_and_glued_request_lines(tmp_path):
    """The request pipe is read 64 KiB at a time: a line of several MiB comes in many
    pieces, and two requests in one write are both answered, in order."""
    w = Worker("python", tmp_path)
    try:
        assert w.event()["ev"] == "ready"
        big = "s = '" + "x" * (3 << 20) + "'\nlen(s)"
        assert w.cell(big)["value"]["repr"] == str(3 << 20)
        os.write(w.req_w, b"".join(
            (json.dumps({"op": "execute", "id": i, "cell": i, "code": f"{i} * 2", "repr_limit": 100}) + "\n").encode()
            for i in (101, 102)
        ))
        assert [(e["id"], e["value"]["repr"]) for e in (w.event(), w.event())] == [(101, "202"), (102, "204")]
    finally:
        w.close()
    assert w.proc.returncode == 0, w.proc.stderr.read()


@pytest.mark.skipif(not r_ready(), reason="R with jsonlite is not installed")
def test_the_r_worker_asks_the_server_to_install_packages(tmp_path):
    """R only: install.packages() in a cell sends install_request (the cell's id, the
    names) and waits; install_reply ok lets the cell go on, not ok fails it with the
    message; an interrupt ends the wait with the state kept; a late reply is ignored."""
    w = Worker("r", tmp_path)
    try:
        assert w.event()["ev"] == "ready"
        assert w.cell("x <- 42")["status"] == "ok"
        w.next_id += 1
        cid = w.next_id
        w.send(op="execute", id=cid, cell=cid, code="install.packages(c('tinypkg', 'other')); x + 1", repr_limit=2000)
        ask = w.event()
        assert ask == {"ev": "install_request", "id": cid, "packages": ["tinypkg", "other"]}, ask
        w.send(op="install_reply", id=cid + 100, ok=True, message="not yours")  # another cell's: ignored
        w.send(op="install_reply", id=cid, ok=True, message="installed tinypkg 0.1")
        done = w.event()
        assert done["id"] == cid and done["status"] == "ok" and done["value"]["repr"] == "[1] 43", done
        assert b"installed tinypkg 0.1" in w.proc.stderr.read1(4096)
        # One package: still a list of names.
        w.next_id += 1
        cid = w.next_id
        w.send(op="execute", id=cid, cell=cid, code="install.packages('nosuchpkg')", repr_limit=2000)
        assert w.event() == {"ev": "install_request", "id": cid, "packages": ["nosuchpkg"]}
        w.send(op="install_reply", id=cid, ok=False, message="not installed: nosuchpkg")
        done = w.event()
        assert done["status"] == "error" and done["error"]["evalue"] == "not installed: nosuchpkg", done
        # Interrupted while it waits: the cell ends interrupted, x kept; the late reply
        # is ignored (no answer to it).
        w.next_id += 1
        cid = w.next_id
        w.send(op="execute", id=cid, cell=cid, code="install.packages('slowpkg')", repr_limit=2000)
        assert w.event()["ev"] == "install_request"
        os.kill(w.proc.pid, signal.SIGINT)
        w.send(op="interrupt", id=cid)
        done = w.event()
        assert done["id"] == cid and done["status"] == "interrupted", done
        w.send(op="install_reply", id=cid, ok=True, message="too late")
        assert w.cell("x")["value"]["repr"] == "[1] 42"
        assert w.call("ping")["ev"] == "ok"
    finally:
        w.close()
    assert w.proc.returncode == 0, w.proc.stderr.read()


def test_the_description_lists_both_workers():
    assert "R/sandbox_repl_worker.R" in DOC and "python/sandbox_repl_worker.py" in DOC
    assert "## The R worker" in DOC
