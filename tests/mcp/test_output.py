"""Output that is never lost and never floods: big prints, raw writes, the pager, caps."""

import os
import time

import pytest


def text_len(res) -> int:
    return sum(len(getattr(b, "text", "")) for b in res.content)


def test_20mb_print_and_1mb_raw_write_do_not_hang(server):
    """A single 20 MB print and a raw 1 MB os.write(1, ...) finish, the answer stays small,
    the middle is marked as omitted, and the session keeps working."""

    async def scenario(c):
        res = await c.call("python_exec", code="print('x' * 20_000_000)", wait_seconds=30)
        r = res.structured_content
        if r["status"] == "running":
            r = await c.finish(r)
        assert r["status"] == "completed", r
        assert text_len(res) < 25_000
        res = await c.call("python_exec", code="import os\nn = os.write(1, b'y' * 1_000_000)\nn", wait_seconds=60)
        r = res.structured_content
        assert r["status"] == "completed" and r["value"] == "1000000", r
        assert r["stdout"]["omitted"] and r["stdout"]["end"] - r["stdout"]["offset"] == 1_000_000
        assert text_len(res) < 25_000
        # Every byte is still there: read a page from the omitted middle.
        page = await c.ok("job_output", job_id=r["job_id"], offset=500_000, length=1000)
        assert page["text"] == "y" * 1000 and page["total"] == 1_000_000
        assert (await c.ok("python_exec", code="'still' + ' fine'"))["value"] == "'still fine'"

    server.run(scenario)


def test_pager_reads_ranges_and_searches(server):
    async def scenario(c):
        r = await c.ok("shell_run", command="seq 1 100000")
        jid = r["job_id"]
        assert r["stdout"]["omitted"], "a 588 KB output must be cut to head and tail"
        assert r["stdout"]["text"].startswith("1\n2\n") and r["stdout"]["tail"].endswith("99999\n100000\n")
        page = await c.ok("job_output", job_id=jid, offset=0, length=10)
        assert page["text"] == "1\n2\n3\n4\n5\n" and page["end"] == 10
        page = await c.ok("job_output", job_id=jid, offset=page["end"], length=8)
        assert page["text"] == "6\n7\n8\n9\n"
        hits = await c.ok("job_output", job_id=jid, pattern="^4242$", context_lines=1)
        assert [h["text"] for h in hits["hits"]] == ["4242"]
        assert hits["hits"][0]["before"] == ["4241"] and hits["hits"][0]["after"] == ["4243"]
        assert "offset" in await c.invalid("job_output", job_id=jid, offset=-1)
        assert "past the end" in await c.err("job_output", job_id=jid, offset=10**9)
        assert "nope" in await c.err("job_output", job_id="nope")

    server.run(scenario)


def test_invalid_utf8_is_replaced_not_fatal(server):
    async def scenario(c):
        r = await c.ok("shell_run", command="printf 'a\\377b\\n'")
        assert r["stdout"]["text"] == "a\ufffdb\n"

    server.run(scenario)


@pytest.mark.slow
def test_200mb_job_keeps_server_memory_bounded(server):
    """A job printing 200 MB finishes with the server's peak RSS under 100 MB; any byte range
    can be read back exactly; every answer stays under the response cap."""
    line = b"0123456789abcdef\n"
    size = 200_000_000

    async def scenario(c):
        res = await c.call("shell_run", command=f"yes 0123456789abcdef | head -c {size}", wait_seconds=60)
        r = res.structured_content
        if r["status"] == "running":
            r = await c.finish(r, timeout=120)
        assert r["status"] == "completed", r
        assert text_len(res) < 25_000
        jid = r["job_id"]
        for offset in (0, 17 * 1000 + 5, 123_456_789, size - 1000):
            page = await c.ok("job_output", job_id=jid, offset=offset, length=1000)
            want = (line * (1000 // 17 + 3))[offset % 17 : offset % 17 + 1000]
            assert page["text"].encode() == want[: size - offset], offset
            assert page["total"] == size
        status = open(f"/proc/{c.server_pid}/status").read()
        hwm_kb = int(next(l for l in status.splitlines() if l.startswith("VmHWM")).split()[1])
        assert hwm_kb < 100 * 1024, f"server peak RSS {hwm_kb} kB"

    server.run(scenario, timeout=170)


def test_binary_output_is_kept_as_bytes_and_returned_in_base64(server):
    """Bytes that are not UTF-8 come back exactly (base64, said so), through job_output
    pages and resources/read, instead of U+FFFD for every byte >= 0x80."""
    import base64

    want = bytes(range(256)) * 400

    async def scenario(c):
        job = await c.ok("python_exec", code="import sys\nsys.stdout.buffer.write(bytes(range(256)) * 400)\nsys.stdout.flush()")
        job = await c.finish(job)
        got, offset = b"", 0
        while True:
            page = await c.ok("job_output", job_id=job["job_id"], offset=offset)
            assert page["encoding"] == "base64", {k: v for k, v in page.items() if k != "text"}
            got += base64.b64decode(page["text"])
            assert page["offset"] == offset and page["end"] == offset + len(base64.b64decode(page["text"]))
            offset = page["end"]
            if page["eof"]:
                break
        assert got == want
        res = (await c.session.read_resource(f"job://{job['job_id']}/stdout?offset=1000")).contents[0]
        assert res.mime_type == "application/octet-stream"
        blob = base64.b64decode(res.blob)
        assert blob and blob == want[1000 : 1000 + len(blob)]
        # Text stays text.
        txt = await c.ok("shell_run", command="printf 'caf\\303\\251\\n'")
        page = await c.ok("job_output", job_id=txt["job_id"])
        assert page["text"] == "café\n" and "encoding" not in page, page

    server.run(scenario)
