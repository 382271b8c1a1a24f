"""The Python side of the sandbox REPL worker (standard library only).

The server starts this file with the protocol on inherited descriptors: fd 3 carries
requests from the server, fd 4 carries events to it, one JSON object per line (see
docs/worker-protocol.md). fds 1 and 2 are plain pipes the server reads; everything user
code, C extensions and child processes print goes there and never touches the protocol.

Threads: user code runs on the main thread (signals, KeyboardInterrupt and libraries
that insist on the main thread work). A reader thread owns the request descriptor: it
hands input replies straight to a pending input() and queues everything else for the
main thread, which handles one request at a time.

Keep this module import-light: every import here is paid on every worker start.
"""

import _ast
import _queue
import _signal
import _thread
import builtins
import errno
import os
import sys
from time import monotonic as _monotonic

# Flag of a code object compiled from top-level `await` (stable across CPython versions;
# avoids importing `inspect`).
CO_COROUTINE = 0x0080

PROTOCOL_VERSION = 1
# The server compiles this file under a fixed name; frames with it are the worker's own
# and are left out of user tracebacks.
WORKER_FILENAME = sys._getframe().f_code.co_filename
_WORKER_PID = os.getpid()
REPR_LIMIT_DEFAULT = 20_000
SHORT_REPR = 120
JSON_LIMIT = 1_000_000
# Caps that keep every protocol line far below the server's 64 MiB line limit.
DISPLAY_LIMIT = 16_000_000
TRACEBACK_LIMIT = 200_000
VARIABLES_LIMIT = 5_000


def _json_codec():
    """(dumps, loads) on the C accelerator `_json`, without importing `json` (which pulls
    in `re`: several milliseconds of every worker start). Falls back to `json` when the
    accelerator's interface differs from what this file expects."""
    try:
        import _json

        class Ctx:
            strict = True
            object_hook = None
            object_pairs_hook = None
            parse_float = float
            parse_int = int
            parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__
            memo = {}

        scan = _json.make_scanner(Ctx())

        def default(o):
            raise TypeError(f"{type(o).__name__} is not JSON serializable")

        encode = _json.make_encoder(None, default, _json.encode_basestring, None, ":", ",", False, False, True)

        def dumps(obj):
            return "".join(encode(obj, 0))

        def loads(text):
            obj, end = scan(text, 0)
            if text[end:].strip():
                raise ValueError("extra data after the JSON value")
            return obj

        probe = {"a": [1, 2.5, None, True, "\u00e9\n"], "b": {}}
        if loads(dumps(probe)) == probe and dumps(probe) == '{"a":[1,2.5,null,true,"\u00e9\\n"],"b":{}}':
            return dumps, loads
    except Exception:
        pass
    import json

    return (
        lambda obj: json.dumps(obj, ensure_ascii=False, separators=(",", ":")),
        json.loads,
    )


_dumps, _loads = _json_codec()


def _move_fd_out_of_reach(fd):
    """Duplicate `fd` to a high, close-on-exec number and close the original.

    User code sees nothing at 3/4 and child processes never inherit the protocol.
    """
    new = _high_dup(fd)
    os.close(fd)
    return new


def _high_dup(fd):
    """A close-on-exec duplicate of `fd` at the lowest free number from a high floor, out
    of the way of user code. Called only while the process has a single thread (at start,
    and in a worker just forked from a snapshot), so the free number stays free until
    dup2 takes it; `fcntl(F_DUPFD_CLOEXEC)` would do the same but costs a shared library
    load at every worker start on some builds."""
    try:
        # The soft RLIMIT_NOFILE, without importing `resource` (a shared library to load
        # on some builds: milliseconds of every worker start).
        soft = os.sysconf("SC_OPEN_MAX")
        if soft <= 0:
            soft = 1024
    except (OSError, ValueError):
        soft = 1024
    n = max(10, min(900, soft - 16))
    while True:
        try:
            os.fstat(n)
        except OSError as e:
            if e.errno == errno.EBADF:  # free (past the limit, dup2 below says so)
                return os.dup2(fd, n, inheritable=False)
        n += 1


# Copies of the original fds 1 and 2 (the output pipes), taken at start.
_STD_COPIES = []


def _fd_writable(fd):
    """Whether `fd` is open for writing, from /proc/self/fdinfo (no `fcntl` import)."""
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8) & os.O_ACCMODE != os.O_RDONLY
    except (OSError, ValueError, IndexError):
        pass
    return False


def _restore_std():
    """Point fds 1/2 back at the output pipes: a cell that closed (or redirected) them
    must not silence every later cell. Also reopens a closed sys.stdout/sys.stderr."""
    for fd, copy in zip((1, 2), _STD_COPIES):
        try:
            os.dup2(copy, fd)
        except OSError:
            pass
    for name, line_buffering in (("stdout", False), ("stderr", True)):
        stream = getattr(sys, name, None)
        if stream is None or getattr(stream, "closed", False):
            fd = 1 if name == "stdout" else 2
            try:
                fresh = open(fd, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
                fresh.reconfigure(line_buffering=line_buffering)
                setattr(sys, name, fresh)
                setattr(sys, f"__{name}__", fresh)
            except Exception:
                pass


def _allow_sigint(on):
    """SIGINT reaches the worker only while user code runs: otherwise it is blocked in
    every worker thread, and one that arrived meanwhile is discarded when the next cell
    starts (an interrupt between cells interrupts nothing)."""
    try:
        if on:
            if _signal.SIGINT in _signal.sigpending():
                _signal.sigtimedwait((_signal.SIGINT,), 0)
            _signal.pthread_sigmask(_signal.SIG_UNBLOCK, (_signal.SIGINT,))
        else:
            _signal.pthread_sigmask(_signal.SIG_BLOCK, (_signal.SIGINT,))
    except (AttributeError, OSError):
        pass


def _block_sigint():
    """Block SIGINT on this thread; True if it was not blocked before."""
    try:
        old = _signal.pthread_sigmask(_signal.SIG_BLOCK, (_signal.SIGINT,))
    except (AttributeError, OSError):
        return False
    return _signal.SIGINT not in old


class _Channel:
    """The protocol descriptors, kept out of the user namespace."""

    current = None  # the channel in use (the flusher sends what is deferred on it)

    def __init__(self, rfd, wfd):
        self._rfd = rfd
        self._wfd = wfd
        self._lock = _thread.allocate_lock()
        self._parts = []  # a partial request line, in pieces
        self._deferred = []  # encoded lines that go out with the next one
        _Channel.current = self

    def defer(self, msg):
        """Send `msg` with the next line, or at the latest at the flusher's next tick
        while a cell runs: a note that needs no answer then costs the server no wake-up
        of its own (the note about a skipped snapshot, written as the next cell starts)."""
        data = (_dumps(msg) + "\n").encode("utf-8", "replace")
        with self._lock:
            self._deferred.append(data)

    def send_deferred(self):
        if self._deferred:
            self.send(None)

    def send(self, msg):
        """Write `msg` (None: only what is deferred) as one line, after the deferred ones."""
        if os.getpid() != _WORKER_PID:
            # A process forked by user code came back into the worker's code: it must not
            # speak for the worker. It ends here, quietly.
            _flush_std()
            os._exit(0)
        # 'replace': a lone surrogate in user text must not make the line invalid UTF-8.
        data = b"" if msg is None else (_dumps(msg) + "\n").encode("utf-8", "replace")
        # SIGINT is held back while a line is written: a KeyboardInterrupt (from a handler
        # user code installed) must never cut a protocol line in half. A held-back signal
        # is delivered right after.
        masked = _block_sigint()
        try:
            with self._lock:
                if self._deferred:
                    data = b"".join(self._deferred) + data
                    self._deferred = []
                view = memoryview(data)
                while view:
                    n = os.write(self._wfd, view)
                    view = view[n:]
        finally:
            if masked:
                _signal.pthread_sigmask(_signal.SIG_UNBLOCK, (_signal.SIGINT,))

    def read_available(self):
        """The requests complete after one read of the request pipe (None at end of file).
        A partial line is kept for the next read, as pieces: a 16 MiB line costs one pass,
        not a rescan of everything read so far at every read. 64 KiB at a time: a larger
        buffer is allocated with mmap (glibc's threshold is 128 KiB) and unmapped after every
        request, page faults and TLB shootdowns included (measured: the worker's round trip
        for a trivial cell 95-113 µs with 1 MiB reads, 45 µs with 64 KiB)."""
        chunk = os.read(self._rfd, 1 << 16)
        if not chunk:
            return None
        out = []
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                break
            self._parts.append(chunk[start:nl])
            line = b"".join(self._parts)
            self._parts = []
            if line.strip():
                out.append(_loads(line.decode("utf-8", "replace")))
            start = nl + 1
        if start < len(chunk):
            self._parts.append(chunk[start:])
        return out


class _Threads:
    """The worker's own threads — the request reader and the flusher — stop before every
    snapshot fork and start again after it, so the fork happens while the process runs one
    thread: no lock can be held by a thread the child lacks, and Python 3.12+ has no
    reason to warn that a multi-threaded process forks (the warning is avoided, not
    filtered). The reader waits on the request pipe and a wake pipe of this process
    (`poll`), the flusher on a lock with a timeout, so both stop at once when asked; the
    fork then waits until the kernel no longer lists them (/proc/self/task). Snapshots are
    reaped by the main thread between requests (no reaper thread)."""

    wake_r = wake_w = -1  # this process's wake pipe (a live worker forked from a snapshot makes its own)
    stopping = False
    reader_alive = None  # a lock the reader holds while it runs
    tids = set()  # kernel thread ids of the running worker threads

    @classmethod
    def make_wake_pipe(cls):
        """A fresh wake pipe, out of user code's reach. Only while one thread runs."""
        for fd in (cls.wake_r, cls.wake_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        r, w = os.pipe()
        cls.wake_r, cls.wake_w = _move_fd_out_of_reach(r), _move_fd_out_of_reach(w)

    @classmethod
    def start(cls, worker):
        cls.stopping = False
        cls.reader_alive = _thread.allocate_lock()
        cls.reader_alive.acquire()
        _thread.start_new_thread(worker.read_requests, (cls.reader_alive,))
        _Flusher.spawn()

    @classmethod
    def stop(cls):
        """Stop both threads and wait until they are gone (a bounded wait for the kernel
        to reap them; the flusher first stops flushing, the reader keeps a partial line)."""
        cls.stopping = True
        os.write(cls.wake_w, b"x")
        cls.reader_alive.acquire()
        _Flusher.halt()
        import time

        deadline = time.monotonic() + 1.0
        while cls.tids and time.monotonic() < deadline:
            try:
                alive = {int(t) for t in os.listdir("/proc/self/task")}
            except OSError:
                break
            cls.tids &= alive
            if cls.tids:
                time.sleep(0.0001)
        cls.tids = set()

    @classmethod
    def own_fds(cls):
        return {cls.wake_r, cls.wake_w}


class _State:
    """Mutable worker state shared by the main thread and the signal handler."""

    running_user_code = False
    current_id = None
    # The cell the server asked to interrupt (set by the reader thread), and how many
    # `interrupt` requests have come (bumped first, so whoever sees the id sees the count).
    interrupt_id = None
    interrupt_seq = 0
    # The `interrupt_seq` last raised as KeyboardInterrupt in a cell (main thread only).
    raised_seq = 0
    waiting_input_id = None
    display = []


def _short_type(value):
    t = type(value)
    mod = getattr(t, "__module__", "builtins")
    name = getattr(t, "__qualname__", t.__name__)
    return name if mod == "builtins" else f"{mod}.{name}"


_REPRS = {}


def _repr_of(kind):
    """A reprlib.Repr that never renders a huge builtin container in full (like IPython,
    which shows 1000 items): `long` for values, `short` for the variable list."""
    r = _REPRS.get(kind)
    if r is None:
        import reprlib

        r = reprlib.Repr()
        many, big = (1000, 10**9) if kind == "long" else (10, SHORT_REPR)
        for attr in ("maxtuple", "maxlist", "maxarray", "maxdict", "maxset", "maxfrozenset", "maxdeque"):
            setattr(r, attr, many)
        r.maxlevel = 6 if kind == "long" else 2
        r.maxstring = r.maxlong = r.maxother = big
        _REPRS[kind] = r
    return r


def _safe_repr(value, kind="long"):
    try:
        return _repr_of(kind).repr(value)
    except BaseException as e:  # a broken __repr__ must not break the worker
        if isinstance(e, KeyboardInterrupt):
            raise
        return f"<repr failed: {type(e).__name__}: {e}>"


def _truncate(text, limit):
    """Head and tail of `text` when it is longer than `limit` characters."""
    if limit is None or len(text) <= limit:
        return text, False
    head = limit * 2 // 3
    tail = limit - head
    omitted = len(text) - head - tail
    return f"{text[:head]}... [{omitted} characters omitted] ...{text[-tail:]}", True


def _rich_items(value):
    """Rich representations an object offers (IPython's _repr_*_ convention). Each method
    is user code: one that raises or returns the wrong type gives a one-line text item
    saying so, never a fault of the worker."""
    items = []
    for method, mime, binary in (
        ("_repr_png_", "image/png", True),
        ("_repr_jpeg_", "image/jpeg", True),
        ("_repr_svg_", "image/svg+xml", False),
        ("_repr_html_", "text/html", False),
        ("_repr_markdown_", "text/markdown", False),
    ):
        if getattr(type(value), method, None) is None:
            continue
        try:
            item = _rich_item(value, method, mime, binary)
        except Exception as e:
            item = {"mime": "text/plain", "data": f"[{method} failed: {_safe_error(e)}]"}
        if item is not None:
            items.append(item)
    return items


def _rich_item(value, method, mime, binary):
    data = getattr(value, method)()
    if isinstance(data, tuple):  # (data, metadata)
        data = data[0] if data else None
    if data is None:
        return None
    if binary:
        import base64

        if isinstance(data, str):
            data = data.encode("latin-1")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"returned {type(data).__name__}, not bytes")
        data = base64.b64encode(data).decode("ascii")
    elif isinstance(data, (bytes, bytearray)):
        data = bytes(data).decode("utf-8", errors="replace")
    elif not isinstance(data, str):
        raise TypeError(f"returned {type(data).__name__}, not str")
    if len(data) > DISPLAY_LIMIT:
        data, mime = f"[{mime} output of {len(data)} characters left out: over the limit]", "text/plain"
    return {"mime": mime, "data": data}


def _safe_error(e):
    """`Type: message` of an exception whose own __str__ may raise."""
    try:
        return f"{type(e).__name__}: {e}"
    except Exception:
        return type(e).__name__


def _has_own_repr(value):
    """Whether the object's type defines a repr of its own (not `<X object at 0x...>`)."""
    try:
        return type(value).__repr__ is not object.__repr__
    except Exception:
        return False


def _with_text_form(value, items, is_value):
    """`items` with a text form the model can read, for an object that offers HTML: the
    answer never carries HTML (it stays in the job's result stream), so the text form is
    the object's own repr (the cell's `value` already is, for the value), or its markdown,
    or text converted from the HTML. Added right before the HTML item."""
    mimes = [item["mime"] for item in items]
    if "text/html" not in mimes or "text/markdown" in mimes:
        return items
    if _has_own_repr(value):
        if is_value:
            return items
        text = _safe_repr(value)
    else:
        html = items[mimes.index("text/html")]["data"]
        try:
            text = _html_to_text(html)
        except Exception as e:
            text = f"[the HTML could not be turned into text: {_safe_error(e)}]"
    at = mimes.index("text/html")
    return items[:at] + [{"mime": "text/plain", "data": text}] + items[at:]


def _html_to_text(html):
    """Readable text of an HTML fragment (standard library only): block elements start
    lines, table rows become `| a | b |` lines (a `|---|` line after a header row),
    list items `- `, scripts and styles dropped, whitespace collapsed outside <pre>."""
    from html.parser import HTMLParser

    blocks = {"p", "div", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "table",
              "thead", "tbody", "tfoot", "section", "article", "header", "footer", "pre",
              "blockquote", "caption", "dl", "dt", "dd", "figure", "figcaption"}

    class Parser(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.lines = []  # finished lines
            self.line = []  # text pieces of the current line
            self.skip = 0  # inside <script>/<style>
            self.pre = 0
            self.row = None  # cells of the current table row
            self.cell = None  # text pieces of the current cell
            self.header_row = False
            self.rows_in_table = 0

        def flush(self):
            text = "".join(self.line)
            if not self.pre:
                text = " ".join(text.split())
            if text.strip():
                self.lines.append(text)
            self.line = []

        def handle_starttag(self, tag, attrs):
            if tag in ("script", "style"):
                self.skip += 1
            elif tag == "tr":
                self.flush()
                self.row, self.header_row = [], True
            elif tag in ("td", "th") and self.row is not None:
                self.cell = []
                if tag == "td":
                    self.header_row = False
            elif tag == "li":
                self.flush()
                self.line.append("- ")
            elif tag in blocks:
                self.flush()
                if tag == "pre":
                    self.pre += 1
                if tag == "table":
                    self.rows_in_table = 0
                if tag[0] == "h" and tag[1:].isdigit():
                    self.line.append("#" * int(tag[1:]) + " ")

        def handle_endtag(self, tag):
            if tag in ("script", "style"):
                self.skip = max(0, self.skip - 1)
            elif tag in ("td", "th") and self.row is not None and self.cell is not None:
                self.row.append(" ".join("".join(self.cell).split()))
                self.cell = None
            elif tag == "tr" and self.row is not None:
                if self.row:
                    self.lines.append("| " + " | ".join(self.row) + " |")
                    self.rows_in_table += 1
                    if self.header_row and self.rows_in_table == 1:
                        self.lines.append("|" + "---|" * len(self.row))
                self.row = self.cell = None
            elif tag in blocks or tag == "li":
                self.flush()
                if tag == "pre":
                    self.pre = max(0, self.pre - 1)

        def handle_data(self, data):
            if self.skip:
                return
            if self.cell is not None:
                self.cell.append(data)
            elif self.row is None:
                self.line.append(data)

    parser = Parser()
    parser.feed(html)
    parser.close()
    parser.flush()
    return "\n".join(parser.lines)


def display(*objs):
    """Show rich output (images, HTML, markdown) for each object, like IPython's display."""
    for obj in objs:
        items = _rich_items(obj)
        if not items:
            items = [{"mime": "text/plain", "data": _safe_repr(obj)}]
        _State.display.extend(_with_text_form(obj, items, False))


def _emit_figures():
    """Render every open matplotlib figure as a PNG display item, then close them."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    import base64
    import io

    try:
        for num in plt.get_fignums():
            fig = plt.figure(num)
            buf = io.BytesIO()
            fig.savefig(buf, format="png", bbox_inches="tight")
            _State.display.append(
                {"mime": "image/png", "data": base64.b64encode(buf.getvalue()).decode("ascii")}
            )
        plt.close("all")
    except Exception as e:
        sys.stderr.write(f"[sandbox-repl] could not render matplotlib figures: {e}\n")


def _patched_spec(finder, name, patch):
    """The real spec of module `name`, whose loader calls `patch(module)` once the module
    has run: how the worker's import hooks change a library at no cost until it is
    imported. `finder._busy` keeps the lookup from finding `finder` itself again."""
    import importlib.util

    finder._busy = True
    try:
        spec = importlib.util.find_spec(name)
    finally:
        finder._busy = False
    loader = getattr(spec, "loader", None)
    if loader is None or not hasattr(loader, "exec_module"):
        return spec
    real_exec = loader.exec_module

    def exec_module(module):
        real_exec(module)
        patch(module)

    loader.exec_module = exec_module
    return spec


class _MplBackendFinder:
    """Makes matplotlib draw with the worker's own backend, at no cost until it is imported.

    It provides the `_sandbox_repl_mpl` backend module (Agg canvas; `show()` emits PNG
    display items), and when `matplotlib` itself is imported it selects that backend —
    unless the user chose one with MPLBACKEND. Nothing goes into the environment, so
    child processes that use matplotlib are not pointed at a backend they cannot import.
    """

    NAME = "_sandbox_repl_mpl"
    _busy = False

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == cls.NAME:
            import importlib.util

            return importlib.util.spec_from_loader(name, cls)
        if name != "matplotlib" or cls._busy:
            return None

        def select_backend(module):
            if "MPLBACKEND" not in os.environ:
                try:
                    module.rcParams["backend"] = "module://" + cls.NAME
                except Exception as e:
                    sys.stderr.write(f"[sandbox-repl] could not select the inline matplotlib backend: {e}\n")

        return _patched_spec(cls, name, select_backend)

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        module.FigureCanvas = FigureCanvasAgg
        module.show = lambda *args, **kwargs: _emit_figures()


class _BridgedStdin:
    """sys.stdin in a cell: `readline()`, `read()` and iteration ask the client through
    the same `awaiting_input` path as input(), a line at a time; the client's EOF
    (job_input eof) ends the input until the next cell. Child processes keep fd 0."""

    encoding = "utf-8"
    errors = "strict"
    closed = False
    name = "<stdin>"

    def __init__(self, worker):
        self._worker = worker
        self.reset()

    def reset(self):
        self._buf = ""
        self._eof = False

    def readable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        raise OSError("sys.stdin of a cell is bridged to the client and has no descriptor")

    def _fill(self):
        if self._eof:
            return False
        try:
            self._buf += self._worker.input() + "\n"
            return True
        except EOFError:
            self._eof = True
            return False

    def readline(self, size=-1):
        while "\n" not in self._buf and self._fill():
            pass
        end = self._buf.find("\n") + 1 or len(self._buf)
        if size is not None and 0 <= size < end:
            end = size
        line, self._buf = self._buf[:end], self._buf[end:]
        return line

    def read(self, size=-1):
        while (size is None or size < 0 or len(self._buf) < size) and self._fill():
            pass
        end = len(self._buf) if size is None or size < 0 else size
        data, self._buf = self._buf[:end], self._buf[end:]
        return data

    def readlines(self, hint=-1):
        return list(iter(self.readline, ""))

    def __iter__(self):
        return iter(self.readline, "")

    def close(self):
        pass


class _GetpassFinder:
    """Routes `getpass.getpass` through the client (a secret input) once `getpass` is
    imported; costs nothing until then."""

    worker = None
    _busy = False

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "getpass" or cls._busy or cls.worker is None:
            return None

        def bridge(module):
            module.getpass = cls.worker.getpass

        return _patched_spec(cls, name, bridge)


class _Flusher:
    """Flushes stdout every 50 ms while a cell runs, so output streams live without
    line buffering (a write per line halves the speed of print-heavy loops and floods
    the server with tiny chunks). Each tick also repeats an interrupt whose SIGINT was lost
    (`_resend_lost_interrupt`). Between cells the thread blocks on `gate`; before a
    snapshot fork it ends (`halt`, see `_Threads`) and starts again after it (`spawn`).

    Fork safety: user code may fork. The flusher holds `busy` while it flushes and a fork
    waits for it (register_at_fork), so a child never inherits stdout's buffer lock held
    by a thread that does not exist in it; the child gets fresh locks."""

    INTERVAL = 0.05
    gate = _thread.allocate_lock()  # held by the main thread while no cell runs
    busy = _thread.allocate_lock()  # held while flushing
    nap = _thread.allocate_lock()  # held by the main thread: the flusher's tick waits on it
    open = False  # changed by the main thread only
    stop = False
    alive = None  # held by the thread while it runs

    @classmethod
    def start(cls):
        cls.gate.acquire()
        cls.nap.acquire()
        # The hooks look `busy` up at fork time: a child replaces it with a fresh lock, and
        # a hook bound to the old (copied while held) lock would deadlock its next fork.
        os.register_at_fork(
            before=lambda: cls.busy.acquire(),
            after_in_parent=lambda: cls.busy.release(),
            after_in_child=cls.after_fork_in_child,
        )

    @classmethod
    def spawn(cls):
        cls.stop = False
        cls.alive = _thread.allocate_lock()
        cls.alive.acquire()
        _thread.start_new_thread(cls.run, (cls.alive,))

    @classmethod
    def halt(cls):
        """End the thread (main thread, between cells: the gate is held)."""
        cls.stop = True
        cls.gate.release()
        cls.nap.release()
        cls.alive.acquire()
        cls.nap.acquire()
        cls.gate.acquire()

    @classmethod
    def after_fork_in_child(cls):
        # No flusher thread here: fresh, unlocked locks so the child's own bookkeeping
        # (cell_ended, flush) can never wait for a thread that was not copied.
        cls.gate = _thread.allocate_lock()
        cls.busy = _thread.allocate_lock()
        cls.nap = _thread.allocate_lock()
        cls.open = True

    @classmethod
    def restart(cls):
        """In a live worker forked from a snapshot (which has no flusher thread): the state
        `start` leaves (the fork hooks are inherited, not added); `_Threads.start` spawns
        the thread."""
        cls.gate = _thread.allocate_lock()
        cls.busy = _thread.allocate_lock()
        cls.nap = _thread.allocate_lock()
        cls.open = False
        cls.gate.acquire()
        cls.nap.acquire()

    @classmethod
    def run(cls, alive):
        _Threads.tids.add(_thread.get_native_id())
        try:
            while True:
                cls.gate.acquire()  # waits here between cells
                cls.gate.release()
                if cls.stop:
                    return
                if cls.nap.acquire(timeout=cls.INTERVAL):
                    cls.nap.release()
                    return  # woken: halt
                _resend_lost_interrupt()
                chan = _Channel.current
                if chan is not None:
                    chan.send_deferred()
                with cls.busy:
                    try:
                        sys.stdout.flush()
                    except Exception:
                        pass
        finally:
            alive.release()

    @classmethod
    def cell_started(cls):
        if not cls.open:
            cls.open = True
            cls.gate.release()

    @classmethod
    def cell_ended(cls):
        if cls.open:
            cls.open = False
            cls.gate.acquire()


def _flush_std():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass


class Worker:
    def __init__(self, channel):
        self.chan = channel
        # C-level queues: get() blocks interruptibly (SIGINT raises KeyboardInterrupt there).
        self.requests = _queue.SimpleQueue()
        self.inputs = _queue.SimpleQueue()
        # User code runs in the namespace of a fresh `__main__` module, so pickle,
        # multiprocessing and `__name__ == "__main__"` checks behave as in a script.
        self.main_module = type(sys)("__main__")
        sys.modules["__main__"] = self.main_module
        self.ns = self.main_module.__dict__
        self.reset_namespace()
        self.loop = None
        self.sources = {}
        # linecache's cache the sources were last published to, and the last one published.
        self.published = None
        self.last_published = None

    # ---- namespace -------------------------------------------------------------
    def reset_namespace(self):
        self.ns.clear()
        self.ns.update(
            {"__name__": "__main__", "__doc__": None, "__builtins__": builtins, "__package__": None}
        )

    def user_names(self):
        for name, value in self.ns.items():
            if name.startswith("_") or isinstance(value, type(sys)):
                continue
            yield name, value

    # ---- input bridge -------------------------------------------------------------
    def input(self, prompt="", secret=False):
        prompt = str(prompt)
        call = _State.current_id
        if call is None:
            raise EOFError("input() is only available while a cell runs")
        if prompt:
            sys.stdout.write(prompt)
        _flush_std()
        while True:  # drop replies meant for an earlier, interrupted input()
            try:
                self.inputs.get_nowait()
            except _queue.Empty:
                break
        _State.waiting_input_id = call
        request = {"ev": "input_request", "id": call, "prompt": prompt}
        if secret:
            request["secret"] = True
        self.chan.send(request)
        try:
            while True:
                rid, text = self.inputs.get()
                if rid == call:
                    break
        finally:
            _State.waiting_input_id = None
        if text is None:
            raise EOFError("end of input (the client sent EOF)")
        text = text[:-1] if text.endswith("\n") else text
        # Echoed like a terminal would, so the transcript reads naturally; a secret never.
        sys.stdout.write("\n" if secret else text + "\n")
        return text

    def getpass(self, prompt="Password: ", stream=None):
        """getpass.getpass in a cell: asked through the client, never echoed."""
        return self.input(prompt, secret=True)

    # ---- reader thread ------------------------------------------------------------
    def read_requests(self, alive):
        """The reader thread: requests as they come (`poll` on the request pipe and this
        process's wake pipe, which stops it before a snapshot fork)."""
        import select

        _Threads.tids.add(_thread.get_native_id())
        rfd = self.chan._rfd
        poller = select.poll()
        poller.register(rfd, select.POLLIN)
        poller.register(_Threads.wake_r, select.POLLIN)
        try:
            while True:
                try:
                    ready = {fd for fd, _ev in poller.poll()}
                except Exception as e:
                    sys.stderr.write(f"[sandbox-repl] protocol read failed: {e}\n")
                    os._exit(0)
                if _Threads.wake_r in ready:
                    os.read(_Threads.wake_r, 64)
                    if _Threads.stopping:
                        return
                if rfd not in ready:
                    continue
                try:
                    msgs = self.chan.read_available()
                except Exception as e:
                    sys.stderr.write(f"[sandbox-repl] protocol read failed: {e}\n")
                    msgs = None
                if msgs is None:
                    # The server went away: nothing more can be reported, so end the worker.
                    os._exit(0)
                try:
                    for msg in msgs:
                        self.dispatch(msg)
                except Exception as e:
                    sys.stderr.write(f"[sandbox-repl] protocol read failed: {e}\n")
                    os._exit(0)
        finally:
            alive.release()

    def dispatch(self, msg):
        op = msg.get("op")
        if op == "input_reply":
            self.inputs.put((msg.get("id"), msg.get("text")))
        elif op == "interrupt":
            # Set first, then look: the main thread sets running_user_code before
            # it checks interrupt_id, so one of the two always sees the other.
            _State.interrupt_seq += 1
            _State.interrupt_id = msg.get("id")
            if _State.running_user_code and _State.current_id == msg.get("id"):
                _signal.pthread_kill(_MAIN_THREAD, _signal.SIGINT)
        else:
            self.requests.put(msg)

    # ---- cells -----------------------------------------------------------------------
    def run_cell(self, req, source, filename, argv=None):
        """Run one cell on the main thread; returns the `done` event."""
        self.sources[filename] = source
        self.publish_sources(filename)
        _State.display = []
        value = None
        has_value = False
        saved_argv = saved_path0 = None
        before = {name: id(v) for name, v in self.user_names()}
        if isinstance(sys.stdin, _BridgedStdin):
            sys.stdin.reset()
        try:
            flags = getattr(_ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
            tree = compile(source, filename, "exec", _ast.PyCF_ONLY_AST | flags, dont_inherit=True)
            last = None
            if argv is None and tree.body and isinstance(tree.body[-1], _ast.Expr):
                last = _ast.Expression(tree.body.pop().value)
            # A cell that is one expression has no statements left to compile.
            body = compile(tree, filename, "exec", flags=flags, dont_inherit=True) if tree.body or not last else None
            tail = compile(last, filename, "eval", flags=flags, dont_inherit=True) if last else None
            if argv is not None:
                saved_argv = sys.argv
                sys.argv = [filename] + list(argv)
                saved_path0 = os.path.dirname(os.path.abspath(filename))
                sys.path.insert(0, saved_path0)
                self.ns["__file__"] = filename
            _restore_std()
            _Flusher.cell_started()
            try:
                _State.running_user_code = True
                _allow_sigint(True)
                if _State.interrupt_id == req["id"]:
                    _State.raised_seq = _State.interrupt_seq
                    raise KeyboardInterrupt
                if body is not None:
                    self.run_code(body)
                if tail is not None:
                    value = self.run_code(tail)
                    has_value = True
            finally:
                _State.running_user_code = False
                _allow_sigint(False)
            status, error = "ok", None
        except BaseException as e:
            _State.running_user_code = False
            _allow_sigint(False)
            status = "interrupted" if isinstance(e, KeyboardInterrupt) else "error"
            error = self.describe_error(e)
        finally:
            _State.running_user_code = False
            _Flusher.cell_ended()
            if saved_argv is not None:
                sys.argv = saved_argv
                try:
                    sys.path.remove(saved_path0)
                except ValueError:
                    pass
                self.ns.pop("__file__", None)
        done = {"ev": "done", "id": req["id"], "status": status, "display": []}
        # Names the cell created or rebound (not in-place changes), for the answer.
        changed = [name for name, v in self.user_names() if before.get(name) != id(v)]
        if changed:
            done["new_variables"] = changed[:100]
        if error is not None:
            done["error"] = error
        if has_value and value is not None:
            self.ns["_"] = value
            text = _safe_repr(value)
            limit = req.get("repr_limit") or REPR_LIMIT_DEFAULT
            shown, cut = _truncate(text, limit)
            done["value"] = {"repr": shown, "chars": len(text), "truncated": cut}
            _State.display.extend(_with_text_form(value, _rich_items(value), True))
        if "_sandbox_repl_mpl" in sys.modules:
            _emit_figures()
        done["display"] = _State.display
        _State.display = []
        return done

    def publish_sources(self, new=None):
        """Give tracebacks the source of cells, once something has imported linecache
        (importing it ourselves would slow every worker start). With `new` (the cell
        about to run), only that one when the cache still holds the others: a cell costs
        the same however many came before it."""
        linecache = sys.modules.get("linecache")
        cache = getattr(linecache, "cache", None)
        if not isinstance(cache, dict):
            return
        names = [new] if new is not None and self.published is cache and self.last_published in cache else self.sources
        for name in names:
            if name.startswith("<cell-"):
                text = self.sources[name]
                cache[name] = (len(text), None, text.splitlines(True), name)
                self.last_published = name
        self.published = cache

    def run_code(self, code):
        result = eval(code, self.ns)
        if code.co_flags & CO_COROUTINE:
            import asyncio

            if self.loop is None:
                self.loop = asyncio.new_event_loop()
            result = self.loop.run_until_complete(result)
        return result

    def describe_error(self, exc):
        import traceback

        self.publish_sources()

        # Drop the worker's own frames: the first entries belong to run_cell/run_code.
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == WORKER_FILENAME:
            tb = tb.tb_next
        try:
            te = traceback.TracebackException(type(exc), exc, tb)
            # ... and the last ones: a KeyboardInterrupt raised by the worker's own signal
            # handler would end the traceback with it.
            while te.stack and te.stack[-1].filename == WORKER_FILENAME:
                te.stack.pop()
            text = "".join(te.format())
            evalue = str(exc)
        except Exception as e:  # a broken __str__ must not break the worker
            text = evalue = f"<could not format the exception: {type(e).__name__}: {e}>"
        return {
            "ename": type(exc).__name__,
            "evalue": _truncate(evalue, REPR_LIMIT_DEFAULT)[0],
            "traceback": _truncate(text, TRACEBACK_LIMIT)[0],
        }

    # ---- variables -----------------------------------------------------------------
    def list_variables(self, req):
        out = []
        names = sorted(self.user_names(), key=lambda item: item[0])
        total = len(names)
        start = req.get("start")
        if isinstance(start, str):
            import bisect

            names = names[bisect.bisect_left([n for n, _ in names], start) :]
        limit = req.get("limit")
        limit = VARIABLES_LIMIT if not isinstance(limit, int) or limit <= 0 else min(limit, VARIABLES_LIMIT)
        omitted = max(0, len(names) - limit)
        nxt = names[limit][0] if omitted else None
        for name, value in names[:limit]:
            try:
                size = sys.getsizeof(value)
            except Exception:
                size = None
            short, _ = _truncate(_safe_repr(value, "short"), SHORT_REPR)
            out.append({"name": name, "type": _short_type(value), "repr": short, "size": size})
        return {"ev": "variables", "id": req["id"], "variables": out, "omitted": omitted, "next": nxt, "total": total}

    def get_variable(self, req):
        name = req["name"]
        if name not in self.ns:
            raise NameError(f"no variable named {name!r} in the session")
        value = self.ns[name]
        text = _safe_repr(value)
        shown, cut = _truncate(text, req.get("repr_limit") or REPR_LIMIT_DEFAULT)
        as_json = None
        try:
            import json

            encoded = json.dumps(value, allow_nan=False)
            if len(encoded) <= JSON_LIMIT:
                as_json = value
        except Exception:
            pass
        try:
            size = sys.getsizeof(value)
        except Exception:
            size = None
        return {
            "ev": "variable",
            "id": req["id"],
            "name": name,
            "type": _short_type(value),
            "repr": shown,
            "chars": len(text),
            "truncated": cut,
            "size": size,
            "json": as_json,
            "has_json": as_json is not None or value is None,
        }

    def set_variable(self, req):
        import keyword

        name = req["name"]
        if not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"{name!r} is not a valid Python identifier")
        self.ns[name] = req.get("value")
        return {"ev": "ok", "id": req["id"]}

    def delete_variable(self, req):
        name = req["name"]
        if name not in self.ns or name.startswith("__"):
            raise NameError(f"no variable named {name!r} in the session")
        del self.ns[name]
        return {"ev": "ok", "id": req["id"]}

    def clear_variables(self, req):
        self.reset_namespace()
        return {"ev": "ok", "id": req["id"]}

    # ---- start-up hook ---------------------------------------------------------------
    def add_site_dirs(self, req):
        """Put the session's site directories (a venv's site-packages) on sys.path."""
        import importlib
        import site

        missing = []
        for d in req.get("dirs") or []:
            if not os.path.isdir(d):
                missing.append(d)
            elif d not in sys.path:
                site.addsitedir(d)
        importlib.invalidate_caches()
        if missing:
            raise FileNotFoundError("no such site directory: " + ", ".join(missing))
        return {"ev": "ok", "id": req["id"]}

    # ---- main loop ------------------------------------------------------------------
    def handle(self, req):
        op = req.get("op")
        if op == "execute":
            return self.run_cell(req, req["code"], f"<cell-{req['cell']}>")
        if op == "run_file":
            path = req["path"]
            try:
                with open(path, encoding="utf-8") as f:
                    source = f.read()
            except OSError as e:
                return {
                    "ev": "done",
                    "id": req["id"],
                    "status": "error",
                    "display": [],
                    "error": {"ename": type(e).__name__, "evalue": str(e), "traceback": f"{type(e).__name__}: {e}\n"},
                }
            return self.run_cell(req, source, path, argv=req.get("argv") or [])
        handlers = {
            "list_variables": self.list_variables,
            "get_variable": self.get_variable,
            "set_variable": self.set_variable,
            "delete_variable": self.delete_variable,
            "clear_variables": self.clear_variables,
            "add_site_dirs": self.add_site_dirs,
            "ping": lambda req: {"ev": "ok", "id": req["id"]},
        }
        fn = handlers.get(op)
        if fn is None:
            return {"ev": "failed", "id": req.get("id", 0), "message": f"unknown request {op!r}"}
        try:
            return fn(req)
        except Exception as e:
            return {"ev": "failed", "id": req.get("id", 0), "message": f"{type(e).__name__}: {e}"}

    def fault_reply(self, req, e):
        import traceback

        try:
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        except Exception:
            tb = _safe_error(e) + "\n"
        message = f"the worker failed to handle {req.get('op')!r}: {_safe_error(e)} (state kept)"
        if req.get("op") in ("execute", "run_file"):
            return {
                "ev": "done",
                "id": req.get("id", 0),
                "status": "error",
                "display": [],
                "error": {"ename": "WorkerError", "evalue": message, "traceback": tb},
            }
        return {"ev": "failed", "id": req.get("id", 0), "message": message}

    def send_ready(self):
        self.chan.send(
            {
                "ev": "ready",
                "protocol": PROTOCOL_VERSION,
                "pid": os.getpid(),
                "version": sys.version.split()[0],
                "executable": sys.executable,
            }
        )

    def next_request(self):
        """The next request; while snapshots this process forked may end, they are reaped
        every few seconds meanwhile (a snapshot the server dropped would otherwise stay a
        zombie, counted against the session's process cap)."""
        while True:
            if not _Snapshots.children:
                return self.requests.get()
            # Also when requests keep coming more often than the reap period (the server's
            # pings): the wait below would then never time out.
            if _monotonic() - _Snapshots.last_reap >= _Snapshots.REAP_AFTER:
                _Snapshots.reap()
                continue
            try:
                return self.requests.get(timeout=_Snapshots.REAP_AFTER)
            except _queue.Empty:
                _Snapshots.reap()

    def serve(self):
        self.send_ready()
        pending = None  # the cell whose snapshot is still to be taken
        due = 0.0  # when (monotonic) the pending snapshot may be taken: the session idle till then
        while True:
            try:
                if pending is None:
                    req = self.next_request()
                else:
                    # The snapshot is taken only in idle time: not before the answer is on
                    # its way and the session has been idle a while. A request sooner
                    # skips it (the cell stays branchable by replay): a snapshot never
                    # delays an answer or the next call.
                    # (Zero idle, --snapshot-idle-ms 0: every snapshot right after its
                    # answer, before the next request is looked at.)
                    req = None
                    if _Snapshots.IDLE > 0:
                        wait = due - _monotonic()
                        try:
                            if wait > 0:
                                req = self.requests.get(timeout=wait)
                            else:
                                req = self.requests.get_nowait()
                        except _queue.Empty:
                            req = None
                    if req is not None and req.get("op") == "ping":
                        # The server's own bookkeeping (history, a branch's check), not a
                        # call: say the snapshot is still to come, and go on waiting.
                        _Snapshots.pending_note(self, pending)
                        self.chan.send({"ev": "ok", "id": req.get("id")})
                        continue
                    cell, pending = pending, None
                    if req is None:
                        if _Snapshots.after_cell(self, cell):
                            continue  # a new live worker, branched from that snapshot
                        continue
                    if req.get("op") != "shutdown":
                        _Snapshots.skipped(self, cell)
                if req.get("op") == "shutdown":
                    _flush_std()
                    os._exit(0)
                _State.current_id = req.get("id")
                try:
                    reply = self.handle(req)
                except Exception as e:
                    # A fault of the worker's own code (user code's faults are the cell's):
                    # answered in words, and the session's state lives on.
                    reply = self.fault_reply(req, e)
                _restore_std()  # what the cell printed after closing fd 1 still arrives
                _flush_std()
                _State.current_id = None
                self.chan.send(reply)
                if req.get("op") in ("execute", "run_file") and _Snapshots.ctl is not None:
                    pending = req.get("cell")
                    due = _monotonic() + _Snapshots.idle_needed()
            except KeyboardInterrupt:
                continue  # an interrupt between cells breaks nothing


def _random_state():
    """The `random` module's generator state, if user code imported it: CPython reseeds
    that generator in every forked child (os.register_at_fork), so a branch would not draw
    what the straight line draws. Saved before a fork, put back in the child."""
    module = sys.modules.get("random")
    try:
        return module, module.getstate()
    except Exception:
        return None, None


def _restore_random(saved):
    module, state = saved
    if module is not None and state is not None:
        try:
            module.setstate(state)
        except Exception:
            pass


def _send_msg(sock, obj, fds=()):
    """One JSON message on a SOCK_SEQPACKET socket, with descriptors (SCM_RIGHTS)."""
    import _socket

    anc = []
    if fds:
        data = b"".join(int(fd).to_bytes(4, sys.byteorder, signed=True) for fd in fds)
        anc = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, data)]
    sock.sendmsg([_dumps(obj).encode("utf-8")], anc)


def _recv_msg(sock, maxfds=8):
    """(message or None at end of file, [descriptors]) from a SOCK_SEQPACKET socket."""
    import _socket

    data, anc, _flags, _addr = sock.recvmsg(1 << 16, _socket.CMSG_SPACE(4 * maxfds))
    fds = []
    for level, kind, blob in anc:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            usable = len(blob) - len(blob) % 4
            fds.extend(int.from_bytes(blob[i : i + 4], sys.byteorder, signed=True) for i in range(0, usable, 4))
    if not data:
        return None, fds
    return _loads(data.decode("utf-8", "replace")), fds


class _Snapshots:
    """Branching cells: after each cell the worker forks a frozen copy of itself (a
    snapshot) that holds the state copy-on-write and waits on its own control socket,
    whose other end the server holds. To branch, the server sends the snapshot `fork`
    with fresh protocol descriptors; the snapshot forks a new live worker that takes
    them over and starts serving (see docs/branching.md, docs/worker-protocol.md).

    Enabled only when the server passed a control socket as fd 5 (snapshots on).
    `_socket` is imported on first use (it is a C module: no import cost to speak of)."""

    ctl = None  # control socket to the server (a _socket.socket), or None: no snapshots
    children = []  # pids of the processes this one forked (snapshots or live workers)
    REAP_AFTER = 5.0  # seconds between reaps of those that ended
    last_reap = 0.0  # when the last reap ran (time.monotonic)
    # Seconds the session must be idle after a cell's answer before its snapshot is taken
    # (the server's --snapshot-idle-ms); a request sooner skips it (see Worker.serve).
    IDLE = 0.2
    # The CPU a snapshot may take, as a share of the idle time before it: the idle wait is
    # at least BUDGET times the last fork's duration (a fork copies the page tables, so
    # its cost grows with the session's memory: ~0.2 s per GiB on a loaded VM).
    BUDGET = 10
    last_fork = 0.0  # seconds the last snapshot fork took
    reap_lock = _thread.allocate_lock()  # guards `children`
    # asyncio loops inherited from a snapshot: kept, never closed (closing one would
    # unregister descriptors from an epoll instance the snapshot shares).
    old_loops = []

    @classmethod
    def idle_needed(cls):
        return max(cls.IDLE, cls.BUDGET * cls.last_fork) if cls.IDLE > 0 else 0.0

    @classmethod
    def idle_words(cls):
        return f"{cls.idle_needed() * 1000:.0f} ms"

    @classmethod
    def skipped(cls, worker, cell):
        """The next request came before the session was idle: no snapshot of `cell`."""
        if isinstance(cell, int):
            note = (
                f"not taken: the next call came within {cls.idle_words()} of this cell's answer "
                "(snapshots are taken only in idle time, so they never delay a call); "
                "branching from it replays"
            )
            worker.chan.defer({"ev": "snapshot", "cell": cell, "held": False, "note": note})

    @classmethod
    def pending_note(cls, worker, cell):
        if isinstance(cell, int):
            note = (
                f"not taken yet: taken once the session has been idle {cls.idle_words()} "
                "after this cell (a call sooner skips it; branching from it then replays)"
            )
            worker.chan.send({"ev": "snapshot", "cell": cell, "held": False, "note": note})

    @classmethod
    def setup(cls):
        import stat

        idle = os.environ.pop("SANDBOX_REPL_SNAPSHOT_IDLE_MS", None)
        if idle is not None:
            try:
                cls.IDLE = max(0.0, int(idle) / 1000.0)
            except ValueError:
                pass

        try:
            if not stat.S_ISSOCK(os.fstat(5).st_mode):
                return
        except OSError:
            return
        cls.ctl = cls._socket(_move_fd_out_of_reach(5))

    @staticmethod
    def _socket(fd):
        import _socket

        return _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET, 0, fd)

    @classmethod
    def reap(cls, *_):
        cls.last_reap = _monotonic()
        with cls.reap_lock:
            for pid in list(cls.children):
                try:
                    done, _status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                except OSError:
                    continue
                if done:
                    cls.children.remove(pid)

    @classmethod
    def forked(cls):
        """In a new process forked from this one: fresh bookkeeping."""
        cls.children = []
        cls.reap_lock = _thread.allocate_lock()

    @classmethod
    def user_fds(cls, worker):
        """(fd, file type bits) of every descriptor that is not the worker's own: one
        /proc/self/fd listing and an fstat each (not readlink: half the cost), after every
        cell, for both `unforkable` and `shared_by_fork`."""
        own = {0, 1, 2}
        if cls.ctl is not None:
            own.add(cls.ctl.fileno())
        own.update(_STD_COPIES)
        own.update(_Threads.own_fds())
        own.update(fd for fd in (getattr(worker.chan, "_rfd", -1), getattr(worker.chan, "_wfd", -1)))
        for loop in [worker.loop, *cls.old_loops]:  # the worker's asyncio loops' self-pipes
            for attr in ("_ssock", "_csock"):
                sock = getattr(loop, attr, None)
                if sock is not None:
                    own.add(sock.fileno())
        out = []
        try:
            names = os.listdir("/proc/self/fd")
        except OSError:
            return out
        for name in names:
            fd = int(name)
            if fd in own:
                continue
            try:
                out.append((fd, os.fstat(fd).st_mode & 0o170000))
            except OSError:
                pass
        return out

    @classmethod
    def unforkable(cls, fds):
        """Why a fork would not hold this state, or None: live `threading` threads started
        by user code (a fork copies only the calling thread; C libraries' own pools, such
        as OpenBLAS's, handle fork themselves), open sockets among `fds` (a fork shares
        them), CUDA."""
        threading = sys.modules.get("threading")
        extra = 0
        if threading is not None:
            main = threading.main_thread()
            dummy = getattr(threading, "_DummyThread", ())
            extra = sum(1 for t in threading.enumerate() if t is not main and not isinstance(t, dummy))
        if extra > 0:
            return f"{extra} thread(s) started by user code are running; a fork copies only the main thread"
        if any(kind == 0o140000 for _, kind in fds):  # S_ISSOCK
            return "an open socket: a fork would share the connection, not copy it"
        torch = sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_initialized():
                return "CUDA is initialised: GPU state cannot be forked"
        except Exception:
            pass
        return None

    @classmethod
    def shared_by_fork(cls, fds):
        """What a fork of this state shares with its other forks instead of copying, in
        words (None if nothing): among `fds`, descriptors open for writing on files (one
        file offset for all branches) and pipes, and child processes of user code (one
        process, which no branch owns). Python-level write buffers of open files are
        flushed first, so no branch writes another's buffered bytes again; the object scan
        runs only when such a file is open."""
        files, pipes = [], 0
        for fd, kind in fds:
            if kind == 0o010000:  # S_ISFIFO
                pipes += 1
            elif kind == 0o100000 and _fd_writable(fd):  # S_ISREG
                try:
                    files.append(os.readlink(f"/proc/self/fd/{fd}"))
                except OSError:
                    files.append(f"fd {fd}")
        if files:
            import gc
            import io

            for obj in gc.get_objects():
                if isinstance(obj, io.IOBase) and obj not in (sys.stdout, sys.stderr):
                    try:
                        if not obj.closed and obj.writable():
                            obj.flush()
                    except Exception:
                        pass
        children = []
        with cls.reap_lock:
            snaps = set(cls.children)
        try:
            for task in os.listdir("/proc/self/task"):
                with open(f"/proc/self/task/{task}/children") as f:
                    children += [int(p) for p in f.read().split() if int(p) not in snaps]
        except (OSError, ValueError):
            pass
        parts = []
        if files:
            shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
            parts.append(f"{len(files)} file(s) open for writing ({shown}: one offset for every branch; their buffers were flushed first)")
        if pipes:
            parts.append(f"{pipes} pipe(s) (every branch reads and writes the same pipe)")
        if children:
            parts.append(f"{len(children)} child process(es) (pid {', '.join(map(str, children[:5]))}: not copied; every branch sees the same ones)")
        return "; ".join(parts) or None

    @classmethod
    def after_cell(cls, worker, cell):
        """Take the snapshot of `cell` (the state right after it ended) and announce it.
        Returns at once in the live worker (False); in the snapshot it returns only in a
        new live worker forked from it (True)."""
        if cls.ctl is None or not isinstance(cell, int):
            return False
        import _socket

        fds = cls.user_fds(worker)
        reason = cls.unforkable(fds)
        if reason is not None:
            worker.chan.send({"ev": "snapshot", "cell": cell, "held": False, "note": reason})
            return False
        try:
            mine, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET, 0)
        except OSError as e:
            worker.chan.send({"ev": "snapshot", "cell": cell, "held": False, "note": f"socketpair failed: {e}"})
            return False
        _flush_std()
        shared = cls.shared_by_fork(fds)
        rand = _random_state()
        _Threads.stop()
        started = _monotonic()
        try:
            pid = os.fork()
        except OSError as e:
            _Threads.start(worker)
            mine.close()
            theirs.close()
            worker.chan.send({"ev": "snapshot", "cell": cell, "held": False, "note": f"fork failed: {e}"})
            return False
        if pid != 0:
            cls.last_fork = _monotonic() - started
        if pid == 0:
            _restore_random(rand)
            theirs.close()
            cls.forked()
            try:
                cls.serve_snapshot(worker, mine)
            except BaseException:
                # A snapshot never goes back into the worker's loop: it would wait there
                # for ever, reaping nothing. Its children go to the namespace's init.
                os._exit(1)
            return True
        _Threads.start(worker)
        mine.close()
        with cls.reap_lock:
            cls.children.append(pid)
        try:
            # The descriptor first: the server takes it when it reads the event.
            _send_msg(cls.ctl, {"cell": cell, "pid": pid, "shared": shared}, [theirs.fileno()])
        except OSError as e:
            theirs.close()
            worker.chan.send({"ev": "snapshot", "cell": cell, "held": False, "note": f"could not hand over: {e}"})
            return False
        theirs.close()
        worker.chan.send({"ev": "snapshot", "cell": cell, "held": True, "pid": pid})
        # Snapshots the server dropped meanwhile, after the fork: the next cell may be
        # waiting for it.
        cls.reap()
        return False

    @classmethod
    def serve_snapshot(cls, worker, sock):
        """The snapshot: hold the state, fork a live worker on each `fork`, exit at end of
        file (the server dropped it: evicted, session closed or restarted, server gone)."""
        # Nothing of the live worker's channel (or its wake pipe) stays open here.
        for fd in (worker.chan._rfd, worker.chan._wfd, _Threads.wake_r, _Threads.wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        _Threads.wake_r = _Threads.wake_w = -1
        if cls.ctl is not None:
            cls.ctl.close()
            cls.ctl = None
        try:
            os.dup2(0, 1)
            os.dup2(0, 2)
        except OSError:
            pass
        # Live workers forked from here are reaped a few seconds after they end (or when
        # the next message comes), not at once: the server reads an ended one's exit
        # status in /proc while it is a zombie. Reaping keeps zombies from filling the
        # session's process cap.
        sock.settimeout(cls.REAP_AFTER)
        while True:
            try:
                msg, fds = _recv_msg(sock)
            except TimeoutError:
                cls.reap()
                continue
            except InterruptedError:
                continue
            except OSError:
                os._exit(0)
            if msg is None:
                os._exit(0)
            cls.reap()
            if not (isinstance(msg, dict) and msg.get("op") == "fork" and len(fds) == 5):
                for fd in fds:
                    os.close(fd)
                _send_msg(sock, {"error": "expected `fork` with 5 descriptors"})
                continue
            _flush_std()
            rand = _random_state()
            try:
                pid = os.fork()
            except OSError as e:
                for fd in fds:
                    os.close(fd)
                _send_msg(sock, {"error": f"fork failed: {e}"})
                continue
            if pid == 0:
                _restore_random(rand)
                sock.close()
                cls.forked()
                cls.become_live(worker, fds)
                return
            cls.children.append(pid)
            for fd in fds:
                os.close(fd)
            try:
                _send_msg(sock, {"pid": pid})
            except OSError:
                os._exit(0)

    @classmethod
    def become_live(cls, worker, fds):
        """In the new live worker: take over the descriptors the server passed (requests,
        events, stdout, stderr, control socket), restart the threads a fork did not copy,
        and report `ready`."""
        global _WORKER_PID
        _WORKER_PID = os.getpid()
        req_r, ev_w, out_w, err_w, ctl = fds
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.close(out_w)
        os.close(err_w)
        # The copies `_restore_std` points fds 1/2 back at must be this worker's pipes,
        # not the snapshot's (which the server may no longer read).
        for copy in _STD_COPIES:
            try:
                os.close(copy)
            except OSError:
                pass
        _STD_COPIES[:] = [_high_dup(1), _high_dup(2)]
        worker.chan = _Channel(_move_fd_out_of_reach(req_r), _move_fd_out_of_reach(ev_w))
        cls.ctl = cls._socket(_move_fd_out_of_reach(ctl))
        worker.requests = _queue.SimpleQueue()
        worker.inputs = _queue.SimpleQueue()
        # An asyncio loop's selector is shared with the snapshot: start a new one.
        if worker.loop is not None:
            cls.old_loops.append(worker.loop)
        worker.loop = None
        # The wake pipe is the snapshot's, shared with every branch: a new one of its own.
        _Threads.make_wake_pipe()
        _Flusher.restart()
        _Threads.start(worker)
        worker.send_ready()


def _on_sigint(signum, frame):
    if not _State.running_user_code:
        return  # idle (or inside the worker's own bookkeeping): ignore
    if _State.interrupt_id == _State.current_id:
        if _State.raised_seq == _State.interrupt_seq:
            return  # a repeat (see _resend_lost_interrupt) of an interrupt already raised
        _State.raised_seq = _State.interrupt_seq
    raise KeyboardInterrupt


def _resend_lost_interrupt():
    """SIGINT again to the main thread if the running cell was asked to stop and our
    handler has not raised it yet (called every flusher tick, so while a cell runs).

    A signal can be lost to Python: its C-level handler only sets a flag that the main
    thread acts on at its next check, and when the signal lands after that check but
    before a blocking system call (the sleep of `time.sleep`, a lock wait), the call
    blocks on, its full length. On a loaded machine that window can be wide: the reader thread
    waiting for the GIL makes the main thread hand it over on entering the call, and the
    reader sends the signal while the main thread has not reached the call yet. A repeat
    interrupts the call; `_on_sigint` raises once per interrupt. Not with a SIGINT handler
    of the user's own (we could not tell whether it ran); the cancel's kill remains."""
    if (
        _State.running_user_code
        and _State.interrupt_id is not None
        and _State.interrupt_id == _State.current_id
        and _State.raised_seq != _State.interrupt_seq
        and _signal.getsignal(_signal.SIGINT) is _on_sigint
    ):
        try:
            _signal.pthread_kill(_MAIN_THREAD, _signal.SIGINT)
        except (AttributeError, OSError):
            pass


_MAIN_THREAD = _thread.get_ident()


def main():
    _signal.signal(_signal.SIGINT, _on_sigint)
    _allow_sigint(False)  # before any thread starts: threads inherit the blocked mask
    rfd = _move_fd_out_of_reach(3)
    wfd = _move_fd_out_of_reach(4)
    try:
        _STD_COPIES.extend((_high_dup(1), _high_dup(2)))
    except OSError:
        pass
    chan = _Channel(rfd, wfd)
    sys.argv = [""]
    if sys.path and sys.path[0] != "":
        sys.path.insert(0, "")
    sys.meta_path.insert(0, _MplBackendFinder)
    try:
        sys.stdout.reconfigure(line_buffering=False, errors="backslashreplace")
        sys.stderr.reconfigure(line_buffering=True, errors="backslashreplace")
    except Exception:
        pass
    worker = Worker(chan)
    builtins.input = worker.input
    sys.stdin = _BridgedStdin(worker)
    _GetpassFinder.worker = worker
    sys.meta_path.insert(0, _GetpassFinder)
    builtins.display = display
    _Snapshots.setup()
    _Threads.make_wake_pipe()
    _Flusher.start()
    _Threads.start(worker)
    worker.serve()


if __name__ == "__main__":
    main()
