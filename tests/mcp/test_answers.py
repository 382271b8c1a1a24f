"""Answers an agent can trust (issue 22), through the real MCP client: one budget for every
answer shape (many small parts page with a cursor or collapse into one summary, an image
fetched by number is scaled to the budget), rich output once (the best text form in the
answer, the HTML in the `result` stream)."""

import base64
import os
import json
import struct
import zlib

import pytest

from conftest import text_of
from test_contract import assert_bounded, read_result


async def all_variables(c) -> list[dict]:
    """Every variable, following `next_cursor` page by page; each page within the budget."""
    out, cursor, pages = [], None, 0
    while True:
        args = {"action": "list"}
        if cursor is not None:
            args["cursor"] = cursor
        res = await c.call("python_vars", **args)
        assert not res.is_error, text_of(res)
        assert_bounded(res, f"python_vars list page {pages}")
        page = res.structured_content
        out.extend(page["variables"])
        pages += 1
        cursor = page.get("next_cursor")
        if cursor is None:
            return out
        assert f"cursor={cursor!r}".replace("'", '"') in text_of(res), text_of(res)[-300:]


def test_three_thousand_variables_page_with_a_cursor(server):
    async def scenario(c):
        await c.ok("python_exec", code='exec("\\n".join(f"v{i:04} = {i}" for i in range(3000)))')
        first = await c.call("python_vars", action="list")
        assert "3000 variable(s)" in text_of(first), text_of(first)[:200]
        seen = await all_variables(c)
        assert [v["name"] for v in seen] == [f"v{i:04}" for i in range(3000)]
        assert seen[1234]["repr"] == "1234"

    server.run(scenario)


def test_more_variables_than_the_worker_lists_at_once_are_reachable(server):
    async def scenario(c):
        await c.ok("python_exec", code='exec("\\n".join(f"w{i:05} = None" for i in range(7000)))')
        seen = await all_variables(c)
        assert [v["name"] for v in seen] == [f"w{i:05}" for i in range(7000)]

    server.run(scenario, timeout=300)


def test_two_thousand_display_items_collapse_into_one_summary(server):
    async def scenario(c):
        code = "for i in range(2000):\n    display('item %04d ' % i + 'x' * 120)\n"
        res = await c.call("python_exec", code=code)
        assert not res.is_error, text_of(res)
        assert_bounded(res, "2000 display items")
        r = res.structured_content
        shown = r["display"]
        assert 0 < len(shown) < 2000
        assert all("left out" not in d["data"] for d in shown), "items shown are whole, no markers"
        held = r["display_held"]
        assert held["items"] == 2000 - len(shown)
        text = text_of(res)
        assert text.count("left out") == 1, text[-600:]
        # The rest is reachable from the offset the summary names.
        whole = await read_result(c, r["job_id"])
        assert whole.encode()[held["offset"]:].decode().startswith(f"--- display {len(shown) + 1} ")
        assert "item 1999 " in whole

    server.run(scenario)


def test_three_hundred_markdown_items_fit(server):
    async def scenario(c):
        code = (
            "class M:\n"
            "    def __init__(self, i): self.i = i\n"
            "    def _repr_markdown_(self): return f'**row {self.i}** ' + 'm' * 100\n"
            "for i in range(300):\n    display(M(i))\n"
        )
        res = await c.call("python_exec", code=code)
        assert not res.is_error, text_of(res)
        assert_bounded(res, "300 markdown items")
        r = res.structured_content
        assert r["display"][0]["mime"] == "text/markdown"
        assert r["display"][0]["data"].startswith("**row 0**")
        assert len(r["display"]) + r["display_held"]["items"] == 300

    server.run(scenario)


def png_rgb(width: int, height: int) -> bytes:
    """A valid RGB PNG of noise (it does not compress: the worst case of a busy figure)."""
    import random

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rng = random.Random(7)
    raw = b"".join(b"\x00" + rng.randbytes(width * 3) for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 1))
        + chunk(b"IEND", b"")
    )


def test_a_4500_px_image_is_scaled_to_the_budget(server, tmp_path):
    big = png_rgb(4500, 800)
    src = tmp_path / "ws" / "big.png"
    src.write_bytes(big)
    assert len(big) > 10_000_000, len(big)

    async def scenario(c):
        code = (
            "class Fig:\n"
            "    def _repr_png_(self): return open('big.png', 'rb').read()\n"
            "Fig()\n"
        )
        res = await c.call("python_exec", code=code)
        assert not res.is_error, text_of(res)
        assert_bounded(res, "cell with a 4500 px image")
        r = res.structured_content
        got = await c.call("job_output", job_id=r["job_id"], image=1)
        assert not got.is_error, text_of(got)
        assert_bounded(got, "image 1")
        blocks = [b for b in got.content if b.type == "image"]
        assert len(blocks) == 1
        data = base64.b64decode(blocks[0].data)
        print(f"image: {len(big)} B original, {len(blocks[0].data)} B of base64 returned")
        assert len(blocks[0].data) <= 1_000_000
        width, height = struct.unpack(">II", data[16:24]) if data[:4] == b"\x89PNG" else jpeg_size(data)
        assert width < 4500 and abs(width / height - 4500 / 800) < 0.1, (width, height)
        s = got.structured_content
        assert s["width"] == width and s["height"] == height
        assert s["original"] == {"width": 4500, "height": 800, "bytes": len(big)}
        assert "4500×800" in text_of(got) and "scaled" in text_of(got)

    server.run(scenario)


def jpeg_size(data: bytes) -> tuple[int, int]:
    i = 2
    while i < len(data):
        marker, length = data[i + 1], struct.unpack(">H", data[i + 2 : i + 4])[0]
        if marker in (0xC0, 0xC1, 0xC2):
            h, w = struct.unpack(">HH", data[i + 5 : i + 9])
            return w, h
        i += 2 + length
    raise AssertionError("no SOF marker")


def test_a_search_over_one_3mb_line_counts_lines(server):
    async def scenario(c):
        job = await c.ok("shell_run", command="python3 -c \"print('ab' * 1500000)\"; echo tail-ab")
        assert job["status"] == "completed", job
        res = await c.call("job_output", job_id=job["job_id"], pattern="ab")
        assert not res.is_error, text_of(res)
        assert_bounded(res, "search over one 3 MB line")
        r = res.structured_content
        assert r["matches"] == 2, r["matches"]
        assert [h["line"] for h in r["hits"]] == [1, 2]
        assert "2 matching line(s)" in text_of(res)

    server.run(scenario)


def test_history_pages_with_a_cursor(server):
    async def scenario(c):
        for i in range(40):
            await c.ok("python_exec", code=f"# cell {i}\n" + "x = 1\n" * 300 + f"'{'y' * 900}'")
        res = await c.call("python_history")
        assert_bounded(res, "history")
        h = res.structured_content
        assert h["left_out"] > 0
        seen = list(h["cells"])
        cursor = h.get("next_cursor")
        assert cursor, h.keys()
        while cursor:
            page = await c.call("python_history", cursor=cursor)
            assert_bounded(page, "history page")
            p = page.structured_content
            seen = p["cells"] + seen
            cursor = p.get("next_cursor")
        assert [x["cell"] for x in seen] == [f"c{i}" for i in range(1, 41)]

    server.run(scenario, timeout=300)


FRAME = '''
class Frame:
    """Like a pandas DataFrame: a plain repr and an HTML table."""
    def __init__(self, rows): self.rows = rows
    def __repr__(self):
        return "   a  b\\n" + "\\n".join(f"{i}  {a}  {b}" for i, (a, b) in enumerate(self.rows))
    def _repr_html_(self):
        body = "".join(f"<tr><th>{i}</th><td>{a}</td><td>{b}</td></tr>" for i, (a, b) in enumerate(self.rows))
        return ("<div><style scoped>.dataframe tbody tr th {vertical-align: top;}</style>"
                "<table border='1' class='dataframe'><thead><tr><th></th><th>a</th><th>b</th></tr></thead>"
                f"<tbody>{body}</tbody></table></div>")
'''


def no_html(res) -> None:
    blob = text_of(res) + json.dumps(res.structured_content)
    assert "<table" not in blob and "<div" not in blob, blob[:2000]


def test_a_dataframe_answer_carries_no_html_and_the_html_is_in_the_result_stream(server):
    async def scenario(c):
        await c.ok("python_exec", code=FRAME)
        res = await c.call("python_exec", code="Frame([(1, 3), (2, 4)])")
        assert not res.is_error, text_of(res)
        no_html(res)
        r = res.structured_content
        assert r["value"] == "   a  b\n0  1  3\n1  2  4"
        assert "display" not in r, r
        html = r["html"]
        assert html["items"] == 1
        text = text_of(res)
        assert sum("html" in line for line in text.splitlines()) == 1, text
        assert f"offset={html['offset']}" in text
        got = await c.ok("job_output", job_id=r["job_id"], stream="result", offset=html["offset"])
        assert got["text"].startswith("--- display 1 text/html ---\n<div>")
        assert "<td>2</td><td>4</td>" in got["text"]
        # display() of it: its repr as the text form, the HTML again in the result stream.
        res = await c.call("python_exec", code="display(Frame([(5, 6)]))")
        no_html(res)
        r = res.structured_content
        assert r["display"] == [{"mime": "text/plain", "data": "   a  b\n0  5  6"}]
        assert r["html"]["items"] == 1

    server.run(scenario)


def test_html_without_a_plain_form_is_shown_as_text(server):
    async def scenario(c):
        code = (
            "class Table:\n"
            "    def _repr_html_(self):\n"
            "        return '<table><tr><th>k</th><th>v</th></tr><tr><td>x</td><td>1 &amp; 2</td></tr></table>'\n"
            "display(Table())\n"
            "Table()"
        )
        res = await c.call("python_exec", code=code)
        assert not res.is_error, text_of(res)
        no_html(res)
        r = res.structured_content
        table = "| k | v |\n|---|---|\n| x | 1 & 2 |"
        assert r["display"] == [{"mime": "text/plain", "data": table}] * 2, r["display"]
        assert r["html"]["items"] == 2

    server.run(scenario)


def test_pandas_when_installed(server):
    import subprocess

    import pytest

    if subprocess.run(["python3", "-c", "import pandas"], capture_output=True).returncode != 0:
        pytest.skip("pandas is not installed for python3")

    async def scenario(c):
        res = await c.call("python_exec", code="import pandas as pd\npd.DataFrame({'a': [1, 2]}).describe()")
        assert not res.is_error, text_of(res)
        no_html(res)
        r = res.structured_content
        assert "count" in r["value"] and r["html"]["items"] == 1
        whole = await read_result(c, r["job_id"])
        assert "<table" in whole

    server.run(scenario)


def test_interrupt_answers_with_the_outcome_and_the_session_is_free_at_once(server):
    """50 x (a cell, python_interrupt, at once python_exec): never "busy"; the interrupt's
    answer carries the cell's outcome, as job_cancel's does."""

    async def scenario(c):
        await c.ok("python_exec", code="keep = 41")
        busy = 0
        for i in range(50):
            run = await c.py("import time\nwhile True: time.sleep(0.01)", wait_seconds=0 if i % 2 else 0.3)
            assert run["status"] == "running", run
            res = await c.call("python_interrupt")
            assert not res.is_error, text_of(res)
            got = res.structured_content
            assert got["interrupted"] is True, got
            job = got["job"]
            assert job["job_id"] == run["job_id"] and job["status"] == "failed", job
            assert job["exception"]["ename"] == "KeyboardInterrupt", job
            assert f"job {run['job_id']} ended failed" in text_of(res)
            nxt = await c.call("python_exec", code="keep + 1")
            if nxt.is_error and "busy" in text_of(nxt):
                busy += 1
                continue
            assert nxt.structured_content["value"] == "42", text_of(nxt)
        assert busy == 0, f"{busy} of 50 calls right after an interrupt were told busy"
        # A cell waiting for input: the answer is its end, not the prompt it was at.
        for tool in ("python_interrupt", "job_cancel"):
            run = await c.py("name = input('who? ')")
            assert run["status"] == "awaiting_input", run
            got = await c.ok(tool, **({"job_id": run["job_id"]} if tool == "job_cancel" else {}))
            job = got["job"] if tool == "python_interrupt" else got
            assert job["status"] in ("failed", "cancelled") and job["exception"]["ename"] == "KeyboardInterrupt", job
            assert (await c.ok("python_exec", code="keep"))["value"] == "41"
        idle = await c.ok("python_interrupt")
        assert idle["interrupted"] is False and "job" not in idle

    server.run(scenario, timeout=300)


def test_an_interactive_shell_dialog_answers_each_line_as_it_is_printed(server):
    """job_input to a shell job returns with the output the input produced; the window is
    wide (60 s), so a call that waited for it would time the test out."""

    async def scenario(c):
        job = await c.ok("shell_run", command="while read l; do echo got:$l; done", wait_seconds=0)
        assert job["status"] == "running", job
        for i in range(10):
            r = await c.ok("job_input", job_id=job["job_id"], text=f"{i}\n", wait_seconds=60, timeout=30)
            assert r["status"] == "running", r
            assert r["stdout"]["text"] == f"got:{i}\n", r
        end = await c.ok("job_input", job_id=job["job_id"], text="", eof=True, wait_seconds=60, timeout=30)
        assert end["status"] == "completed", end

    server.run(scenario, timeout=150)


def python_of(version: str) -> str | None:
    """A Python `version` interpreter on this machine (PATH, pyenv's, uv's), if any."""
    import glob
    import shutil
    import subprocess

    candidates = [shutil.which(f"python{version}")]
    for pattern in ("~/.pyenv/versions/{v}*/bin/python3", "~/.local/share/uv/python/cpython-{v}*/bin/python3"):
        candidates += sorted(glob.glob(os.path.expanduser(pattern.format(v=version))))
    for path in filter(None, candidates):
        out = subprocess.run([path, "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip() == version:
            return path
    return None


def test_the_snapshot_fork_happens_with_one_thread(server):
    """What Python 3.12+ warns about (a fork while other threads run) never happens: a fork
    hook in user code counts the process's threads at every snapshot fork (every cell is
    snapshotted right after its answer here: `--snapshot-idle-ms 0`)."""
    server.env["MCP_SANDBOX_SNAPSHOT_IDLE_MS"] = "0"

    async def scenario(c):
        await c.ok("python_exec", code="import os\ncounts = []\nos.register_at_fork(before=lambda: counts.append(len(os.listdir('/proc/self/task'))))")
        for i in range(5):
            await c.ok("python_exec", code=f"x = {i}")
        r = await c.ok("python_exec", code="counts")
        counts = eval(r["value"])
        assert len(counts) >= 5 and set(counts) == {1}, counts
        # Output still streams while a cell runs (the flusher is back after each fork).
        r = await c.ok("python_exec", code="import time\nprint('a')\ntime.sleep(0.5)\nprint('b')")
        assert r["stdout"]["text"] == "a\nb\n"

    server.run(scenario)


@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_no_fork_warning_on_newer_pythons_and_branches_keep_random(server, version):
    """On Python 3.12 and 3.13 no cell's output carries the multi-threaded fork warning, and
    three branches from a seeded cell draw what the straight line drew (every cell is
    snapshotted right after its answer here: `--snapshot-idle-ms 0`)."""
    server.env["MCP_SANDBOX_SNAPSHOT_IDLE_MS"] = "0"
    python = python_of(version)
    if python is None:
        pytest.skip(f"no Python {version} here; test_the_snapshot_fork_happens_with_one_thread covers the mechanism")

    async def scenario(c):
        outputs = []
        straight = None
        for code in ("import warnings\nwarnings.simplefilter('always')\nimport sys\nsys.version_info[:2]",
                     "1", "2", "import random\nrandom.seed(1)", "random.random()", "3"):
            r = await c.ok("python_exec", code=code)
            outputs.append(r["stderr"]["text"] + r["stdout"]["text"])
            if code == "random.random()":
                straight = r["value"]
        assert outputs[0] == "", outputs
        draws = [(await c.ok("python_exec", code="random.random()", parent="c4"))["value"] for _ in range(3)]
        r = await c.ok("python_exec", code="'end'")
        outputs.append(r["stderr"]["text"])
        print(python, draws, straight)
        assert not any("DeprecationWarning" in o or "fork()" in o for o in outputs), outputs
        assert draws == [straight] * 3, (draws, straight)

    server.run(scenario, "--python", python)


def test_branches_from_a_seeded_cell_draw_the_same_numbers(server):
    server.env["MCP_SANDBOX_SNAPSHOT_IDLE_MS"] = "0"  # cells back to back, each with its snapshot

    async def scenario(c):
        await c.ok("python_exec", code="import random\nrandom.seed(1)")
        straight = (await c.ok("python_exec", code="[random.random() for _ in range(3)]"))["value"]
        for _ in range(3):
            r = await c.ok("python_exec", code="[random.random() for _ in range(3)]", parent="c1")
            assert r["value"] == straight, (r["value"], straight)

    server.run(scenario)




def test_an_install_leaves_no_cell_in_the_history(offline):
    async def scenario(c):
        r = await c.ok("python_exec", code="x = 1")
        assert r["cell"] == "c1"
        job = await c.finish(await c.ok("env_install", packages=["tinypkg"]))
        assert job["status"] == "completed" and job["result"]["activated"] is True, job
        h = await c.ok("python_history")
        assert [x["cell"] for x in h["cells"]] == ["c1"], h
        assert "site" not in json.dumps(h), h
        r = await c.ok("python_exec", code="import tinypkg\n(x, tinypkg.__version__)")
        assert r["cell"] == "c2" and r["parent"] == "c1" and r["value"] == "(1, '0.1')", r

    offline.run(scenario)


def test_a_branch_says_the_head_moved_and_how_to_return(server):
    server.env["MCP_SANDBOX_SNAPSHOT_IDLE_MS"] = "0"  # cells back to back, each with its snapshot

    async def scenario(c):
        await c.ok("python_exec", code="x = 1")  # c1
        await c.ok("python_exec", code="x = 2")  # c2
        res = await c.call("python_exec", code="y = x", parent="c1")  # c3 on c1
        r = res.structured_content
        assert "head moved from c2" in r["state_note"] and 'parent="c2"' in r["state_note"], r
        assert "head moved from c2" in text_of(res)
        assert "state_lost" not in r
        # Following cells run on the branch and say nothing more.
        r = await c.ok("python_exec", code="x")
        assert r["value"] == "1" and "state_note" not in r, r
        # The way back it named works.
        r = await c.ok("python_exec", code="x", parent="c2")
        assert r["value"] == "2" and "head moved from c4" in r["state_note"], r
        # A branch from the head itself moves nothing.
        r = await c.ok("python_exec", code="x", parent=r["cell"])
        assert "state_note" not in r, r

    server.run(scenario)


def test_an_expired_session_says_so_on_every_tool(server):
    async def scenario(c):
        import time

        import anyio

        await c.ok("python_exec", code="x = 1", session="ttl")
        deadline = time.monotonic() + 60
        while any(s["name"] == "ttl" for s in (await c.ok("session_list"))["sessions"]):
            assert time.monotonic() < deadline, "the idle session was not closed"
            await anyio.sleep(0.1)
        for tool, args in (("python_history", {}), ("python_interrupt", {})):
            err = await c.err(tool, session="ttl", **args)
            assert "expired after" in err and "python_exec starts it again" in err, (tool, err)
        res = await c.call("python_vars", action="list", session="ttl")
        assert not res.is_error, text_of(res)
        assert "expired after" in res.structured_content["state_note"], res.structured_content
        assert text_of(res).startswith("note: session \"ttl\" expired after")
        h = await c.ok("python_history", session="ttl")
        assert "expired after" in h["state_note"] and h["cells"] == [], h
        r = await c.py("x", session="ttl")
        assert r["exception"]["ename"] == "NameError" and "expired after" in r["state_note"], r
        v = await c.ok("python_vars", action="list", session="ttl")
        assert "state_note" not in v, v

    server.run(scenario, "--session-ttl", "1")


def test_history_works_after_a_server_restart(server):
    # Not the default session: that one is started ahead of the first call (prewarm).
    async def first(c):
        for i in range(3):
            await c.ok("python_exec", code=f"v = {i}", session="s1")

    async def second(c):
        h = await c.ok("python_history", session="s1")
        assert [x["cell"] for x in h["cells"]] == ["c1", "c2", "c3"], h
        assert "server restarted" in h["cells"][0]["note"], h
        err = await c.err("python_history", session="never-used")
        assert "no session named" in err

    server.run(first)
    server.run(second)


def test_timeout_seconds_ends_a_cell_and_a_shell_job_in_words(server):
    async def scenario(c):
        await c.ok("python_exec", code="keep = 41")
        res = await c.call("python_exec", code="import time\ntime.sleep(120)", timeout_seconds=1, wait_seconds=60)
        r = res.structured_content
        assert res.is_error and r["status"] == "failed", r
        assert r["message"].startswith("timed out after 1 s (timeout_seconds): KeyboardInterrupt"), r
        assert "timed out after 1 s" in text_of(res)
        # The traceback ends in the user's code, not in the worker's signal handler.
        assert "_on_sigint" not in r["exception"]["traceback"], r["exception"]
        assert r["exception"]["traceback"].rstrip().endswith("KeyboardInterrupt")
        assert (await c.ok("python_exec", code="keep + 1"))["value"] == "42"
        # A cell that ignores KeyboardInterrupt: the worker is restarted, in words.
        code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nimport time\ntime.sleep(120)"
        r = await c.py(code, timeout_seconds=0.5, wait_seconds=60)
        assert r["status"] == "failed" and r["message"].startswith("timed out after 0.5 s"), r
        assert "restarted" in r["message"] and r["state_lost"] is True, r
        # Quick work is not affected.
        r = await c.ok("python_exec", code="1 + 1", timeout_seconds=30)
        assert r["status"] == "completed" and r["value"] == "2"
        res = await c.call("shell_run", command="echo start; sleep 120", timeout_seconds=1, wait_seconds=60)
        r = res.structured_content
        assert res.is_error and r["status"] == "failed", r
        assert r["message"].startswith("timed out after 1 s (timeout_seconds)"), r
        assert r["stdout"]["text"] == "start\n"
        r = await c.ok("shell_run", command="echo ok", timeout_seconds=30)
        assert r["status"] == "completed"
        await c.invalid("shell_run", command="true", timeout_seconds=0)
        await c.invalid("python_exec", code="1", timeout_seconds=-1)

    server.run(scenario)
