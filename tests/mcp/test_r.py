"""R sessions through MCP (issue 25): the same tools and answers as Python, an R worker
under the same sandbox. Skipped, with the reason, where R (Rscript with jsonlite) is not
installed; CI installs it (.ci/run)."""

import os
import shutil
import socket
import subprocess
import sys
import threading

import pytest

from conftest import python_real, text_of

RSCRIPT = shutil.which("Rscript")


def r_has(pkg: str) -> bool:
    if not RSCRIPT:
        return False
    out = subprocess.run([RSCRIPT, "-e", f"cat(requireNamespace('{pkg}', quietly=TRUE))"],
                         capture_output=True, text=True)
    return out.stdout.strip() == "TRUE"


needs_r = pytest.mark.skipif(not r_has("jsonlite"), reason="R with jsonlite is not installed (Debian: r-base-core r-cran-jsonlite)")


class Counted:
    """Counts the tool calls a scenario makes."""

    def __init__(self, c):
        self.c, self.calls = c, 0
        inner = c.call

        async def call(tool, *a, **k):
            self.calls += 1
            return await inner(tool, *a, **k)

        c.call = call


async def scenario_calls(c, session: str, lang: str) -> int:
    """The seed's eight steps in `lang`, in session `session`; returns the calls made."""
    counted = Counted(c)
    code = {
        "python": ['x = 42; print(f"x is {x}")', 'y = x * 2; print(f"y is {y}")',
                   'name = input("Enter your name: ")', 'print(f"Hello {name}, x={x}, y={y}")',
                   'import time\nfor i in range(5):\n    print(f"tick {i}", flush=True); time.sleep(1)'],
        "r": ['x <- 42; cat("x is", x, "\\n")', 'y <- x * 2; cat("y is", y, "\\n")',
              'name <- readline("Enter your name: ")', 'cat(sprintf("Hello %s, x=%g, y=%g\\n", name, x, y))',
              'for (i in 0:4) { cat("tick", i, "\\n"); Sys.sleep(1) }'],
    }[lang]
    r = await c.ok("python_exec", code=code[0], session=session, language=lang)
    assert r["status"] == "completed" and r["stdout"]["text"].split() == ["x", "is", "42"], r
    r = await c.ok("python_exec", code=code[1], session=session)
    assert r["stdout"]["text"].split() == ["y", "is", "84"], r
    names = {v["name"] for v in (await c.ok("python_vars", action="list", session=session))["variables"]}
    assert {"x", "y"} <= names, names
    r = await c.ok("python_exec", code=code[2], session=session)
    assert r["status"] == "awaiting_input" and r["prompt"] == "Enter your name: ", r
    r = await c.ok("job_input", job_id=r["job_id"], text="Jonathan")
    assert r["status"] == "completed", r
    r = await c.ok("python_exec", code=code[3], session=session)
    assert r["stdout"]["text"] == "Hello Jonathan, x=42, y=84\n", r
    r = await c.ok("python_exec", code=code[4], session=session, wait_seconds=1.5)
    assert r["status"] == "running" and r["job_id"], r  # went to the background
    done = await c.finish(r)
    assert done["status"] == "completed", done
    assert done["all_stdout"].split() == sum((["tick", str(i)] for i in range(5)), []), done
    await c.ok("session_restart", session=session)
    assert (await c.ok("python_vars", action="list", session=session))["variables"] == []
    return counted.calls


@needs_r
def test_the_seed_scenario_in_r_beside_python(server):
    """The seed's scenario in R (x, y, variables, readline through job_input, a print of
    both, a 5-tick loop long-polled in the background, restart, no variables), in a server
    that runs a Python session of the same scenario side by side: R takes no more calls."""

    async def scenario(c):
        calls_py = await scenario_calls(c, "py", "python")
        calls_r = await scenario_calls(c, "rs", "r")
        assert calls_r <= calls_py, (calls_r, calls_py)
        sessions = {s["name"]: s for s in (await c.ok("session_list"))["sessions"]}
        assert "Rscript" in sessions["rs"]["python"] and "R " in sessions["rs"]["python"], sessions
        assert "Rscript" not in sessions["py"]["python"], sessions
        # One surface: a language asked of a used session of the other one is refused in words.
        err = await c.err("python_exec", code="1", session="py", language="r")
        assert "is a python session, not r" in err, err

    server.run(scenario, timeout=300)


@needs_r
def test_the_server_default_interpreter_is_r(server):
    """--interpreter r (and MCP_SANDBOX_INTERPRETER): a session named by no call's
    `language` runs R; `language: "python"` still opens a Python one."""

    async def scenario(c):
        r = await c.ok("python_exec", code="R.version$language")
        assert r["value"] == '[1] "R"', r
        r = await c.ok("python_exec", code="import sys; sys.version_info[0]", session="p", language="python")
        assert r["value"] == "3", r

    server.run(scenario, "--interpreter", "r")
    server.env["MCP_SANDBOX_INTERPRETER"] = "r"
    server.run(lambda c: check_value(c, "R.version$language", '[1] "R"'))


async def check_value(c, code, value):
    r = await c.ok("python_exec", code=code)
    assert r["value"] == value, r


@needs_r
def test_values_errors_warnings_and_variables(server):
    """The last visible value as R prints it; earlier visible values printed to stdout;
    an error with its call and the calls that led to it, apart from output; warnings on
    stderr; variables listed (class, str line, size), read (print text and JSON), set from
    JSON, deleted; new_variables."""

    async def scenario(c):
        r = await c.ok("python_exec", code="1:3\ndata.frame(a = 1:2, b = c('u', 'v'))", language="r")
        assert r["stdout"]["text"] == "[1] 1 2 3\n" and r["value"] == "  a b\n1 1 u\n2 2 v", r
        res = await c.call("python_exec", code="f <- function(v) stop('bad value: ', v)\ng <- function() f(3)\ng()")
        assert res.is_error
        r = res.structured_content
        assert r["status"] == "failed" and r["exception"]["evalue"] == "bad value: 3", r
        assert "Error in f(3) : bad value: 3" in r["exception"]["traceback"], r
        assert "Calls: g -> f" in r["exception"]["traceback"], r
        assert "sandbox_repl" not in r["exception"]["traceback"], r
        r = await c.ok("python_exec", code="h <- function() { warning('careful'); 7 }\nz <- h(); cat('out\\n')")
        assert r["stdout"]["text"] == "out\n" and "In h() : careful" in r["stderr"]["text"], r
        assert set(r["new_variables"]) == {"h", "z"}, r
        listed = {v["name"]: v for v in (await c.ok("python_vars", action="list"))["variables"]}
        assert listed["z"]["type"] == "numeric" and listed["z"]["repr"] == "num 7", listed
        await c.ok("python_vars", action="set", name="cfg", value={"a": [1, 2, 3], "b": "x"})
        r = await c.ok("python_exec", code="cfg$a * 2")
        assert r["value"] == "[1] 2 4 6", r
        got = await c.ok("python_vars", action="get", name="cfg")
        assert got["json"] == {"a": [1, 2, 3], "b": "x"} and got["type"] == "list", got
        await c.ok("python_vars", action="delete", name="cfg")
        r = await c.ok("python_exec", code="exists('cfg')")
        assert r["value"] == "[1] FALSE", r
        hist = await c.ok("python_history")
        assert any("cfg$a" in e["code"] for e in hist["cells"]), hist

    server.run(scenario)


@needs_r
def test_plots_are_png_images_and_help_is_text(server):
    """A ggplot (auto-printed and print()ed), a base plot() and a grid drawing each answer
    one PNG image; `?mean` and `help("lm")` answer their help text, `vignette()` its list,
    in the answer (no pager, no browser)."""
    if not r_has("ggplot2"):
        pytest.skip("ggplot2 is not installed (Debian: r-cran-ggplot2)")

    async def scenario(c):
        await c.ok("python_exec", code="library(ggplot2); d <- data.frame(a = 1:5, b = (1:5)^2)", language="r")
        for code in ["ggplot(d, aes(a, b)) + geom_point()",
                     "p <- ggplot(d, aes(a, b)) + geom_line(); print(p)",
                     "plot(d$a, d$b, main = 'base')",
                     "grid::grid.newpage(); grid::grid.rect()"]:
            res = await c.call("python_exec", code=code)
            images = [x for x in res.content if x.type == "image"]
            assert not res.is_error and len(images) == 1, (code, text_of(res))
            assert getattr(images[0], "mime_type", None) or getattr(images[0], "mimeType") == "image/png"
            import base64
            assert base64.b64decode(images[0].data, validate=True)[:8] == b"\x89PNG\r\n\x1a\n"
        r = await c.ok("python_exec", code="x <- 1")
        assert not r.get("images"), r  # the device is per cell: nothing carried over
        res = await c.call("python_exec", code="?mean")
        text = text_of(res)
        assert "Arithmetic Mean" in text and "mean(x, trim = 0, na.rm = FALSE, ...)" in text, text
        assert "\b" not in text
        text = text_of(await c.call("python_exec", code='help("lm")'))
        assert "Fitting Linear Models" in text, text
        # The listing is text in the answer (which packages have vignettes varies by machine).
        text = text_of(await c.call("python_exec", code="vignette()"))
        assert "value: Vignettes in package" in text or "value: no vignettes found" in text, text

    server.run(scenario)


@needs_r
def test_interrupt_keeps_state_and_input_is_bridged(server):
    """python_interrupt of `repeat {}` ends the cell with R's interrupt condition and keeps
    x; an interrupt while readline() waits ends it too; readLines("stdin") reads lines until
    end of input; menu() asks through job_input."""

    async def scenario(c):
        await c.ok("python_exec", code="x <- 42", language="r")
        r = await c.ok("python_exec", code="repeat {}", wait_seconds=1)
        assert r["status"] == "running", r
        await c.ok("python_interrupt")
        rep = (await c.call("job_wait", job_id=r["job_id"], until_done=True, timeout_seconds=30)).structured_content
        assert rep["status"] == "failed" and rep["exception"]["ename"] == "interrupt", rep
        assert (await c.ok("python_exec", code="x"))["value"] == "[1] 42"
        r = await c.ok("python_exec", code="Sys.sleep(30)", wait_seconds=1)
        await c.ok("python_interrupt")
        rep = (await c.call("job_wait", job_id=r["job_id"], until_done=True, timeout_seconds=30)).structured_content
        assert rep["status"] == "failed" and rep["exception"]["ename"] == "interrupt", rep

        r = await c.ok("python_exec", code='a <- readline("wait: ")')
        assert r["status"] == "awaiting_input", r
        await c.ok("python_interrupt")
        rep = (await c.call("job_wait", job_id=r["job_id"], until_done=True, timeout_seconds=30)).structured_content
        assert rep["status"] == "failed" and rep["exception"]["ename"] == "interrupt", rep
        # The interrupt is spent: the next cells run whole.
        assert (await c.ok("python_exec", code="for (i in 1:100000) NULL; x + 1"))["value"] == "[1] 43"

        r = await c.ok("python_exec", code='lines <- readLines("stdin"); length(lines)')
        assert r["status"] == "awaiting_input", r
        r = await c.ok("job_input", job_id=r["job_id"], text="one")
        assert r["status"] == "awaiting_input", r
        r = await c.ok("job_input", job_id=r["job_id"], text="two")
        r = await c.ok("job_input", job_id=r["job_id"], text="", eof=True)
        assert r["status"] == "completed" and r["value"] == "[1] 2", r
        r = await c.ok("python_exec", code='pick <- menu(c("apple", "pear"), title = "Fruit?")')
        assert r["status"] == "awaiting_input" and r["prompt"] == "Selection: ", r
        assert "1: apple" in r["stdout"]["text"], r
        r = await c.ok("job_input", job_id=r["job_id"], text="2")
        assert (await c.ok("python_exec", code="pick"))["value"] == "[1] 2"
        # askpass-style: the askpass hook asks a secret (not echoed).
        r = await c.ok("python_exec", code='pw <- getOption("askpass")("Token: "); nchar(pw)')
        assert r["status"] == "awaiting_input" and r["prompt"] == "Token: ", r
        r = await c.ok("job_input", job_id=r["job_id"], text="s3cret")
        assert r["value"] == "[1] 6" and "s3cret" not in r["stdout"]["text"], r

    server.run(scenario)


@needs_r
def test_a_segfault_is_reported_in_words_and_the_next_call_is_fresh(server):
    """tools::pskill(Sys.getpid(), 11): the cell fails naming SIGSEGV; the next call runs
    in a fresh R that says its state was lost; an interrupt the cell ignores escalates to a
    restart (the cancel's grace)."""

    async def scenario(c):
        await c.ok("python_exec", code="x <- 42", language="r")
        res = await c.call("python_exec", code="tools::pskill(Sys.getpid(), 11)")
        r = res.structured_content
        assert res.is_error and r["status"] == "failed" and r["signal"] == "SIGSEGV", r
        assert "the R worker was killed by SIGSEGV (segmentation fault)" in text_of(res), text_of(res)
        r = await c.ok("python_exec", code="exists('x')")
        assert r["value"] == "[1] FALSE" and r["state_lost"] is True, r
        assert "R worker" in r["state_note"], r
        # A cell that does not take the interrupt (it suspends interrupts) is ended by a
        # restart after the grace; the next call runs in a fresh R.
        await c.ok("python_exec", code="y <- 1")
        r = await c.ok("python_exec", code="suspendInterrupts(repeat {})", wait_seconds=1)
        assert r["status"] == "running", r
        await c.ok("python_interrupt", grace_seconds=1)
        rep = (await c.call("job_wait", job_id=r["job_id"], until_done=True, timeout_seconds=30)).structured_content
        assert rep["status"] == "failed" and "did not respond to R's interrupt" in rep["message"], rep
        r = await c.ok("python_exec", code="exists('y')")
        assert r["value"] == "[1] FALSE" and r["state_lost"] is True, r

    server.run(scenario)


@needs_r
def test_run_file_runs_an_r_script_with_its_arguments(server):
    """python_run_file on a .R file in an R session: commandArgs(trailingOnly = TRUE) are
    the arguments, and its variables stay in the session."""
    (server.workspace / "job.R").write_text('args <- commandArgs(trailingOnly = TRUE)\ncat("args:", args, "\\n")\nn <- length(args)\n')

    async def scenario(c):
        await c.ok("python_exec", code="1", language="r")
        r = await c.ok("python_run_file", path="job.R", args=["a", "b c"])
        assert r["status"] == "completed" and r["stdout"]["text"] == "args: a b c \n", r
        assert (await c.ok("python_exec", code="n"))["value"] == "[1] 2"
        assert (await c.ok("python_exec", code="length(commandArgs(TRUE))"))["value"] == "[1] 0"

    server.run(scenario)


@needs_r
def test_escape_probes_in_r_are_refused_in_words(server):
    """Under workspace-write, R's own ways out are refused and the answer says so: file()
    and writeLines() outside the workspace, socketConnection(), url(), download.file() to a
    listener on the host's loopback (which hears nothing), system() of a namespace escape,
    and a signal to the server."""
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(5)
    tcp.settimeout(0.2)
    port = tcp.getsockname()[1]

    async def scenario(c):
        await c.ok("python_exec", code="1", language="r")
        probes = {
            "file('/usr/escape-probe', 'w')": "cannot open",
            "writeLines('x', '/etc/escape-probe')": "cannot open",
            f"readLines(file('{server.state_dir}/http-token'))": "cannot open",
            f"socketConnection('127.0.0.1', {port}, timeout = 2)": "cannot open",
            f"readLines(url('http://127.0.0.1:{port}/'))": "cannot open",
            f"download.file('http://127.0.0.1:{port}/x', 'x.html', quiet = TRUE)": "cannot open",
        }
        for code, words in probes.items():
            res = await c.call("python_exec", code=code)
            r = res.structured_content
            assert res.is_error and r["status"] == "failed", (code, text_of(res))
            assert words in text_of(res), (code, text_of(res))
        r = await c.ok("python_exec", code="system('unshare -U -r id 2>&1', intern = TRUE)")
        assert "unshare failed: Operation not permitted" in r["value"], r
        res = await c.call("python_exec", code="writeLines('x', '/usr/escape-probe')")
        assert "blocked by policy workspace-write: write to /usr/escape-probe" in text_of(res), text_of(res)
        r = await c.ok("python_exec", code=f"ok <- tools::pskill({c.server_pid}, 9); ok")
        assert r["value"] == "[1] FALSE", r
        r = await c.ok("python_exec", code="system('kill -9 1; echo $?', intern = TRUE)")
        assert r["value"].startswith('[1] "1"'), r
        assert not list(server.root.rglob("escape-probe"))
        assert (await c.ok("python_exec", code="1 + 1"))["value"] == "[1] 2"

    server.run(scenario)
    with pytest.raises(TimeoutError):
        tcp.accept()


def test_without_r_an_r_session_fails_in_one_line_and_python_works(server, tmp_path):
    """No Rscript on PATH: an R session fails with one clear line; Python is untouched."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    server.env["PATH"] = str(empty)

    async def scenario(c):
        err = await c.err("python_exec", code="1", session="r1", language="r")
        assert err.startswith("R is not available: no Rscript on PATH") and "\n" not in err.strip(), err
        assert "r-base-core" in err, err
        r = await c.ok("python_exec", code="6 * 7", session="p1")
        assert r["value"] == "42", r

    server.run(scenario, "--python", python_real())


def test_doctor_and_install_know_r(tmp_path):
    """`doctor` reports each interpreter (R found, with its paths, or why not);
    `install --client claude --interpreter r` writes an R entry beside the Python one."""
    from conftest import binary
    import json
    out = subprocess.run([binary(), "doctor", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    langs = {i["language"]: i for i in json.loads(out.stdout)["interpreters"]}
    assert set(langs) == {"python", "r"}, langs
    assert langs["r"]["ok"] is r_has("jsonlite"), langs["r"]
    if langs["r"]["ok"]:
        assert langs["r"]["program"].endswith("Rscript") and "/usr/lib/R" in langs["r"]["detail"], langs["r"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_SANDBOX_")}
    env["HOME"] = str(tmp_path)
    for extra in ([], ["--interpreter", "r"]):
        done = subprocess.run([binary(), "install", "--client", "claude", "--no-env", *extra], env=env,
                              capture_output=True, text=True, timeout=30, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    servers = json.loads((tmp_path / ".claude.json").read_text())["mcpServers"]
    assert servers["sandbox-repl-r"]["args"][-2:] == ["--interpreter", "r"], servers
    assert "--interpreter" not in servers["sandbox-repl"]["args"], servers


def loopback_cran(tmp_path, gate=None):
    """A CRAN-like repository holding tinypkg 0.1 (R CMD build, tools::write_PACKAGES),
    served on loopback: (its URL, the paths requested from it, the server to shut down).
    With `gate` (a path the installer can read), it also holds slowpkg 0.1, whose install
    waits (while its code is prepared for lazy loading) until that file exists."""
    import http.server
    import functools
    contrib = tmp_path / "repo" / "src" / "contrib"
    contrib.mkdir(parents=True)
    pkgs = {"tinypkg": 'hello <- function() "hello from tinypkg"\n'}
    if gate is not None:
        pkgs["slowpkg"] = f'local(while (!file.exists("{gate}")) Sys.sleep(0.2))\nslow <- function() 1\n'
    for name, code in pkgs.items():
        pkg = tmp_path / "src" / name
        (pkg / "R").mkdir(parents=True)
        (pkg / "DESCRIPTION").write_text(f"Package: {name}\nVersion: 0.1\nTitle: Tiny\nDescription: A tiny package.\n"
                                         "License: MIT\nAuthor: t\nMaintainer: t <t@example.com>\n")
        (pkg / "NAMESPACE").write_text("exportPattern('.')\n")
        (pkg / "R" / "code.R").write_text(code)
        subprocess.run(["R", "CMD", "build", "--no-build-vignettes", str(pkg)], cwd=contrib, check=True, capture_output=True)
    subprocess.run([RSCRIPT, "-e", f"tools::write_PACKAGES('{contrib}', type = 'source')"], check=True, capture_output=True)
    requests = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, fmt, *args):
            requests.append(self.path)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(tmp_path / "repo")))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{httpd.server_address[1]}", requests, httpd


@needs_r
def test_install_packages_from_a_loopback_repository_through_the_broker(server, tmp_path):
    """env_install in an R session runs install.packages() as a job with progress: from a
    CRAN-like repository the test builds (R CMD build, tools::write_PACKAGES) and serves on
    loopback, reached through the network broker (the session itself has no network), into
    the session library; library(tinypkg) works at once, the session's variables kept."""
    repo, requests, httpd = loopback_cran(tmp_path)
    server.env["MCP_SANDBOX_CRAN"] = repo

    async def scenario(c):
        await c.ok("python_exec", code="x <- 42", language="r")
        res = await c.call("python_exec", code=f"readLines(url('{repo}/src/contrib/PACKAGES'))")
        assert res.is_error and "cannot open" in text_of(res), text_of(res)
        assert not requests, requests  # the session reached nothing
        seen = []

        async def progress(value, total, message):
            seen.append((value, message))

        res = await c.call("env_install", packages=["tinypkg"], progress=progress)
        job = await c.finish(res.structured_content)
        assert job["status"] == "completed", job
        assert "installed: tinypkg 0.1" in job["all_stderr"], job
        assert any("/src/contrib/tinypkg_0.1.tar.gz" in p for p in requests), requests
        values = [v for v, _ in seen]
        assert values == sorted(values) and len(set(values)) == len(values), seen
        assert any("installed: tinypkg" in m for _, m in seen), seen
        r = await c.ok("python_exec", code="library(tinypkg); paste(hello(), x)")
        assert r["value"] == '[1] "hello from tinypkg 42"', r
        assert r.get("state_lost") is not True, r

    try:
        server.run(scenario, timeout=300)
    finally:
        httpd.shutdown()


@needs_r
def test_install_packages_typed_in_a_cell_installs_through_the_broker(server, tmp_path):
    """`install.packages("tinypkg")` typed in an R cell installs for real: the worker asks
    the server (install_request), whose installer reaches the loopback repository through
    the network broker and writes the session library, with progress notifications on the
    cell's own call and the install's output in the cell's; the cell goes on, so
    `library(tinypkg)` in the same cell works, `x` kept. The session itself still has no
    network and cannot write its library."""
    repo, requests, httpd = loopback_cran(tmp_path)
    server.env["MCP_SANDBOX_CRAN"] = repo
    direct = f"readLines(url('{repo}/src/contrib/PACKAGES'))"

    async def scenario(c):
        await c.ok("python_exec", code="x <- 42", language="r")
        seen = []

        async def progress(value, total, message):
            seen.append((value, message))

        res = await c.call("python_exec", code="install.packages('tinypkg'); library(tinypkg); paste(hello(), x)",
                           progress=progress)
        r = res.structured_content
        assert not res.is_error and r["status"] == "completed", text_of(res)
        assert r["value"] == '[1] "hello from tinypkg 42"', r
        assert r.get("state_lost") is not True, r
        assert "installed: tinypkg 0.1" in text_of(res), text_of(res)
        assert any("/src/contrib/tinypkg_0.1.tar.gz" in p for p in requests), requests
        values = [v for v, _ in seen]
        assert values == sorted(values) and len(set(values)) == len(values), seen
        assert any("installed: tinypkg" in m for _, m in seen), seen
        # The session's own way out is still closed, after the install as before.
        fetched = len(requests)
        res = await c.call("python_exec", code=direct)
        assert res.is_error and "cannot open" in text_of(res), text_of(res)
        res = await c.call("python_exec", code="writeLines('x', file.path(.libPaths()[1], 'probe'))")
        assert res.is_error and "cannot open" in text_of(res), text_of(res)
        assert len(requests) == fetched, requests
        # A package the repository does not have fails the cell in words; state kept.
        res = await c.call("python_exec", code="install.packages('nosuchpkg'); 1")
        assert res.is_error and "not installed: nosuchpkg" in text_of(res), text_of(res)
        assert (await c.ok("python_exec", code="x"))["value"] == "[1] 42"

    try:
        server.run(scenario, timeout=300)
    finally:
        httpd.shutdown()


def installers() -> list[int]:
    """Pids of running R installs (envs::r_install's script)."""
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = open(f"/proc/{d}/cmdline", "rb").read()
            except OSError:
                continue
            if b"install.packages(pkgs," in cmd:
                found.append(int(d))
    return found


@needs_r
def test_interrupting_a_cell_in_install_packages_cancels_the_install(server, tmp_path):
    """python_interrupt while a cell waits in install.packages(): the cell ends with R's
    interrupt condition, `x` kept, and the server's install for it is cancelled: its
    process is gone although the package it installs waits (for a file that does not
    exist yet) and would keep it alive."""
    import asyncio
    gate = server.workspace / "slowpkg-may-go-on"
    repo, requests, httpd = loopback_cran(tmp_path, gate)
    server.env["MCP_SANDBOX_CRAN"] = repo

    async def until(cond, what):
        for _ in range(1200):
            if cond():
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"not seen within 120 s: {what}")

    async def scenario(c):
        await c.ok("python_exec", code="x <- 42", language="r")
        r = await c.ok("python_exec", code="install.packages('slowpkg'); 'done'", wait_seconds=1)
        assert r["status"] == "running", r
        await until(lambda: any(p.endswith("/slowpkg_0.1.tar.gz") for p in requests), "the tarball fetched")
        await until(installers, "the install process")
        await c.ok("python_interrupt")
        rep = (await c.call("job_wait", job_id=r["job_id"], until_done=True, timeout_seconds=30)).structured_content
        assert rep["status"] == "failed" and rep["exception"]["ename"] == "interrupt", rep
        await until(lambda: not installers(), "the install process gone")
        gate.write_text("")
        assert (await c.ok("python_exec", code="x"))["value"] == "[1] 42"
        r = await c.ok("python_exec", code="isTRUE(requireNamespace('slowpkg', quietly = TRUE))")
        assert r["value"] == "[1] FALSE", r

    try:
        server.run(scenario, timeout=300)
    finally:
        gate.write_text("")
        httpd.shutdown()


@needs_r
def test_a_first_call_in_r_gets_r_while_the_python_prewarm_is_under_way(server):
    """The server prewarms `default` in Python; a first call naming R, made at once (the
    prewarm may still be starting), runs in R. Three servers, to meet the race."""

    async def scenario(c):
        r = await c.ok("python_exec", code="R.version$language", language="r")
        assert r["value"] == '[1] "R"', r
        sessions = (await c.ok("session_list"))["sessions"]
        assert len(sessions) == 1 and "Rscript" in sessions[0]["python"], sessions

    for _ in range(3):
        server.run(scenario)
