"""How jobs are started: every job gets its own cgroup, network namespace, mount
namespace (its file-system view, made ahead of need or not) and temp dir,
and the spawn helper (the server's zygote) holds nothing of any job and is replaced
when it dies. Needs root (namespaces, cgroups); reads /proc."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

# Prints what identifies this job's confinement, then stays running so that two jobs
# are alive at once (a namespace's inode number may be reused once it is freed).
REPORT = (
    'echo "net=$(readlink /proc/self/ns/net)"; echo "mnt=$(readlink /proc/self/ns/mnt)"; '
    'echo "pids=$(ls /proc | grep -E "^[0-9]+$" | tr "\n" " ")"; '
    'echo "cgroup=$(grep -E "pids|^0::" /proc/self/cgroup | head -1)"; '
    'touch "$TMPDIR/mark-$1"; echo "tmpdir=$TMPDIR"; echo "tmp=$(ls "$TMPDIR" | tr "\\n" " ")"; '
    "sleep 60"
)


def fields(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def zygotes(server_pid: int) -> list[int]:
    """Children of the server running the server's binary without a session of their own:
    the spawn helper (forked at start, or re-executed in zygote mode after it died). Job
    supervisors are forks of it too, but each leads a session of its own."""
    exe = os.readlink(f"/proc/{server_pid}/exe")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            same_binary = os.readlink(entry / "exe") == exe
        except OSError:
            continue
        pid, ppid, session = int(entry.name), int(stat[1]), int(stat[3])
        if ppid == server_pid and same_binary and session != pid:
            found.append(pid)
    return found


async def report(c, name: str) -> dict[str, str]:
    job = await c.ok("shell_run", command=f"sh -c '{REPORT}' sh {name}", wait_seconds=0)
    # The deadline only guards a job that never reports (a loaded machine may be slow).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = await c.ok("job_output", job_id=job["job_id"])
        got = fields(out["stdout"]["text"] if "stdout" in out else out.get("text", ""))
        if "tmp" in got:
            return {**got, "job_id": job["job_id"]}
        await c.ok("job_wait", job_id=job["job_id"], timeout_seconds=0.1)
    raise AssertionError(f"job {name} did not report: {out}")


def test_two_jobs_never_share_a_cgroup_network_namespace_or_temp_dir(server):
    async def scenario(c):
        host_net, host_mnt = os.readlink("/proc/self/ns/net"), os.readlink("/proc/self/ns/mnt")
        # The first job's view is made while it starts; the next ones were made ahead.
        a = await report(c, "a")
        b = await report(c, "b")
        third = await report(c, "c")
        assert a["net"] != host_net and b["net"] != host_net, (a, b)
        assert a["net"] != b["net"], f"two running jobs share a network namespace: {a} {b}"
        mnts = [j["mnt"] for j in (a, b, third)]
        assert host_mnt not in mnts and len(set(mnts)) == 3, f"jobs share a mount namespace: {mnts}"
        # Each job's /proc is of its own PID namespace (in a view made ahead too: the job
        # mounts it after the split): the namespace's low numbers (its init, hidden from
        # it, is 1), none of the host's, such as the server's.
        for job in (a, b, third):
            pids = {int(p) for p in job["pids"].split()}
            assert pids and max(pids) < 100 and c.server_pid not in pids, job
        assert a["cgroup"] != b["cgroup"], f"two running jobs share a cgroup: {a} {b}"
        assert "msr-" in a["cgroup"] and "msr-" in b["cgroup"], (a, b)
        assert "mark-a" in a["tmp"] and "mark-b" not in a["tmp"], a
        assert "mark-b" in b["tmp"] and "mark-a" not in b["tmp"], f"job b sees job a's temp dir: {b}"
        assert third["tmp"].split() == ["mark-c"], f"job c sees another job's temp dir: {third}"
        # Each job's temp dir is a tmpfs in its own view: nothing of it is on the host.
        assert not os.path.exists(a["tmpdir"]), a
        # The spawn helper keeps no descriptor of either job, nor the client's pipes (it is
        # forked from the server): /dev/null as stdin and stdout, stderr and its socket.
        [zygote] = zygotes(c.server_pid)
        links = {fd: os.readlink(f"/proc/{zygote}/fd/{fd}") for fd in os.listdir(f"/proc/{zygote}/fd")}
        assert len(links) <= 4 and links["0"] == links["1"] == "/dev/null", links
        for job in (a, b, third):
            assert (await c.ok("job_cancel", job_id=job["job_id"]))["status"] == "cancelled"
        # The server's instance id (`<pid>x<random>`, its ownership record): its job
        # cgroups are named after it (the pid alone could name an unrelated server's).
        [instance] = [p.name for p in (server.state_dir / "owners").glob(f"{c.server_pid}x*")]
        assert any(f"msr-{instance}-" in j["cgroup"] for j in (a, b, third)), (instance, a)
        return instance

    instance = server.run(scenario)
    # Cgroups made ahead of need and never used are removed at exit too.
    left = [d for root, dirs, _ in os.walk("/sys/fs/cgroup") for d in dirs if d.startswith(f"msr-{instance}-")]
    assert left == [], left


def test_a_killed_spawn_helper_is_replaced(server):
    async def scenario(c):
        first = await c.ok("shell_run", command="echo one")
        assert first["status"] == "completed", first
        found = zygotes(c.server_pid)
        assert len(found) == 1, (found, os.popen(f"ps -o pid,ppid,sid,args --ppid {c.server_pid}").read())
        zygote = found[0]
        os.kill(zygote, signal.SIGKILL)
        second = await c.ok("shell_run", command="echo two")
        assert second["status"] == "completed" and "two" in second["stdout"]["text"], second
        cell = await c.ok("python_exec", code="print(6 * 7)", session="after")
        assert "42" in cell["stdout"]["text"], cell
        now = zygotes(c.server_pid)
        assert len(now) == 1 and now[0] != zygote, (zygote, now)

    server.run(scenario)


def test_a_stopped_spawn_helper_fails_one_job_in_words_and_is_replaced(server):
    """A helper that stops answering is not waited for forever, and the job it may have
    forked is never started a second time: that one call fails in words."""

    async def scenario(c):
        assert (await c.ok("shell_run", command="true"))["status"] == "completed"
        found = zygotes(c.server_pid)
        assert len(found) == 1, found
        os.kill(found[0], signal.SIGSTOP)
        res = await c.call("shell_run", command="echo once >> ran.txt")
        assert res.is_error, res
        assert "did not answer" in str(res.content), res.content
        ok = await c.ok("shell_run", command="echo again")
        assert ok["status"] == "completed" and "again" in ok["stdout"]["text"], ok
        now = zygotes(c.server_pid)
        assert len(now) == 1 and now[0] != found[0], (found, now)
        assert not os.path.exists(f"/proc/{found[0]}/stat") or "Z" in open(f"/proc/{found[0]}/stat").read().rsplit(")", 1)[1][:3]

    server.run(scenario)


def test_jobs_start_with_default_signal_dispositions(server):
    """No signal is ignored in a job (an ignored one survives exec): `yes | head` ends
    quietly on SIGPIPE instead of failing with EPIPE."""

    async def scenario(c):
        job = await c.ok("shell_run", command="yes | head -1; grep SigIgn /proc/self/status")
        assert job["status"] == "completed", job
        assert job["stdout"]["text"].split() == ["y", "SigIgn:", "0000000000000000"], job
        assert "Broken pipe" not in (job.get("stderr") or {}).get("text", ""), job

    server.run(scenario)
