//! The Python REPL through its Rust API (sessions, cells, input, interrupt, crashes,
//! big output, concurrency). The MCP-level tests live with the server.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mcp_sandbox_repl::repl::{
    CellOutcome, CellSink, CellStatus, OutStream, ReplConfig, SessionManager, SessionState,
};
use mcp_sandbox_repl::sandbox::Policy;

/// Collects a cell's output.
#[derive(Default)]
struct Sink {
    stdout: Mutex<Vec<u8>>,
    stderr: Mutex<Vec<u8>>,
    prompts: Mutex<Vec<String>>,
    inputs: Mutex<usize>,
}

impl CellSink for Sink {
    fn output(&self, stream: OutStream, data: &[u8]) {
        match stream {
            OutStream::Stdout => self.stdout.lock().unwrap().extend_from_slice(data),
            OutStream::Stderr => self.stderr.lock().unwrap().extend_from_slice(data),
        }
    }
    fn awaiting_input(&self, prompt: &str) {
        self.prompts.lock().unwrap().push(prompt.to_string());
    }
    fn input_received(&self) {
        *self.inputs.lock().unwrap() += 1;
    }
}

impl Sink {
    fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().unwrap()).into_owned()
    }
    fn err(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }
}

/// Workers start through the real binary's launcher mode (this test binary is not it).
fn use_real_launcher() {
    mcp_sandbox_repl::sandbox::spawn::set_launcher_exe(
        env!("CARGO_BIN_EXE_mcp-sandbox-repl").into(),
    );
}

struct Fixture {
    manager: Arc<SessionManager>,
    dir: std::path::PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.manager.shutdown();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fixture(tag: &str, max_sessions: usize) -> Fixture {
    use_real_launcher();
    let dir = std::env::temp_dir().join(format!("repl-suite-{tag}-{}", std::process::id()));
    let workspace = dir.join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let mut cfg = ReplConfig::new(
        workspace,
        Policy::load("workspace-write").unwrap(),
        dir.join("state"),
    );
    cfg.max_sessions = max_sessions;
    Fixture {
        manager: SessionManager::new(cfg),
        dir,
    }
}

async fn run(manager: &SessionManager, session: &str, code: &str) -> (CellOutcome, Arc<Sink>) {
    let s = manager.get_or_start(session).await.unwrap();
    let sink = Arc::new(Sink::default());
    let out = s.execute(code, sink.clone()).await.unwrap();
    (out, sink)
}

/// State persists across cells; the last expression's repr comes back; stdout and
/// stderr are separate; errors carry a traceback without the worker's own frames.
#[tokio::test]
async fn cells_keep_state_and_report_values_streams_and_errors() {
    let f = fixture("basic", 4);
    let (o, s) = run(&f.manager, "default", "x = 42; print(f'x is {x}')").await;
    assert_eq!(
        (o.status, o.value.as_deref(), s.out()),
        (CellStatus::Ok, None, "x is 42\n".to_string())
    );
    let (o, s) = run(
        &f.manager,
        "default",
        "import sys\nprint('err', file=sys.stderr)\nx * 2",
    )
    .await;
    assert_eq!(
        (o.value.as_deref(), s.out(), s.err()),
        (Some("84"), String::new(), "err\n".to_string())
    );
    assert_eq!(o.cell, 2);
    let (o, _) = run(&f.manager, "default", "def f():\n    return 1/0\nf()").await;
    assert_eq!(o.status, CellStatus::Error);
    let e = o.error.unwrap();
    assert_eq!(e.ename, "ZeroDivisionError");
    assert!(e.traceback.contains("<cell-3>"), "{}", e.traceback);
    assert!(
        !e.traceback.contains("sandbox-repl-worker"),
        "{}",
        e.traceback
    );
    let (o, _) = run(&f.manager, "default", "__name__").await;
    assert_eq!(o.value.as_deref(), Some("'__main__'"));
    let (o, _) = run(&f.manager, "default", "import sys; sys.stdin.read()").await;
    assert_eq!(
        o.value.as_deref(),
        Some("''"),
        "stdin must be empty, never the MCP stream"
    );
    let (o, _) = run(&f.manager, "default", "'x' * 100000").await;
    assert!(o.value_truncated && o.value_chars == Some(100002), "{o:?}");
    let hist = f.manager.get("default").unwrap().history();
    assert_eq!(hist.len(), 6);
    assert_eq!(hist[2].status, CellStatus::Error);
}

/// input() asks through the protocol; the reply resumes the cell; an interrupt while
/// waiting ends the cell and keeps the session.
#[tokio::test]
async fn input_round_trip_and_interrupt_while_waiting() {
    let f = fixture("input", 4);
    let s = f.manager.get_or_start("default").await.unwrap();
    let sink = Arc::new(Sink::default());
    let task = {
        let (s, sink) = (s.clone(), sink.clone());
        tokio::spawn(async move {
            s.execute("name = input('Enter your name: ')\nname", sink)
                .await
        })
    };
    wait_for(|| s.info().state == SessionState::AwaitingInput).await;
    assert_eq!(
        *sink.prompts.lock().unwrap(),
        vec!["Enter your name: ".to_string()]
    );
    assert!(s.send_input("Jonathan", false).is_ok());
    let o = task.await.unwrap().unwrap();
    assert_eq!(o.value.as_deref(), Some("'Jonathan'"));
    assert_eq!(sink.out(), "Enter your name: Jonathan\n");
    assert!(s.send_input("late", false).is_err(), "no input is pending");

    let sink = Arc::new(Sink::default());
    let task = {
        let (s, sink) = (s.clone(), sink.clone());
        tokio::spawn(async move { s.execute("input('again? ')", sink).await })
    };
    wait_for(|| s.info().state == SessionState::AwaitingInput).await;
    assert!(s.interrupt());
    let o = task.await.unwrap().unwrap();
    assert_eq!(o.status, CellStatus::Interrupted);
    let (o, _) = run(&f.manager, "default", "name").await;
    assert_eq!(o.value.as_deref(), Some("'Jonathan'"));
}

async fn wait_for(cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "condition not reached in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Interrupt stops a running loop with KeyboardInterrupt quickly; state survives.
#[tokio::test]
async fn interrupt_stops_running_code_and_keeps_state() {
    let f = fixture("interrupt", 4);
    run(&f.manager, "default", "keep = 7").await;
    let s = f.manager.get("default").unwrap();
    let sink = Arc::new(Sink::default());
    let task = {
        let (s, sink) = (s.clone(), sink.clone());
        tokio::spawn(async move {
            s.execute(
                "import time\nprint('start', flush=True)\nwhile True: time.sleep(0.01)",
                sink,
            )
            .await
        })
    };
    wait_for(|| sink.out().contains("start")).await;
    let t0 = Instant::now();
    assert!(s.interrupt());
    let o = task.await.unwrap().unwrap();
    let took = t0.elapsed();
    assert_eq!(o.status, CellStatus::Interrupted);
    assert_eq!(o.error.unwrap().ename, "KeyboardInterrupt");
    assert!(took < Duration::from_millis(500), "interrupt took {took:?}");
    let (o, _) = run(&f.manager, "default", "keep").await;
    assert_eq!(o.value.as_deref(), Some("7"));
    assert!(!s.interrupt(), "nothing runs: nothing to interrupt");
}

/// A segfault, os._exit(3) and kill -9 are reported in words; the next cell runs in a
/// fresh worker and is told its state was lost; other sessions are untouched.
#[tokio::test]
async fn crashes_are_reported_and_the_next_cell_gets_a_fresh_worker() {
    let f = fixture("crash", 4);
    run(&f.manager, "other", "survivor = 1").await;
    let cases = [
        (
            "import ctypes; ctypes.string_at(0)",
            "the Python worker was killed by SIGSEGV (segmentation fault)",
        ),
        (
            "import os; os._exit(3)",
            "the Python worker exited with code 3",
        ),
        (
            "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
            "the Python worker was killed by SIGKILL",
        ),
    ];
    for (code, words) in cases {
        run(&f.manager, "default", "x = 1").await;
        let (o, _) = run(
            &f.manager,
            "default",
            &format!("print('before', flush=True)\n{code}"),
        )
        .await;
        assert_eq!(o.status, CellStatus::WorkerDied, "{code}");
        assert!(
            o.worker_exit.as_deref().unwrap_or("").starts_with(words),
            "{code}: {:?}",
            o.worker_exit
        );
        assert!(o.state_lost);
        assert_eq!(
            f.manager.get("default").unwrap().info().state,
            SessionState::Dead
        );
        let (o, _) = run(&f.manager, "default", "'x' in dir()").await;
        assert_eq!(
            (o.status, o.value.as_deref(), o.state_lost),
            (CellStatus::Ok, Some("False"), true),
            "{code}"
        );
        let (o, _) = run(&f.manager, "default", "1").await;
        assert!(!o.state_lost, "state loss is reported once");
    }
    let (o, _) = run(&f.manager, "other", "survivor").await;
    assert_eq!(o.value.as_deref(), Some("1"));
}

/// A 20 MB print and a raw 1 MB os.write(1) arrive whole, attributed to their cell, and
/// the session works afterwards.
#[tokio::test]
async fn huge_outputs_neither_hang_nor_corrupt() {
    let f = fixture("huge", 4);
    let (o, s) = run(&f.manager, "default", "print('a' * 20_000_000)").await;
    assert_eq!(o.status, CellStatus::Ok);
    assert_eq!(s.stdout.lock().unwrap().len(), 20_000_001);
    let (o, s) = run(&f.manager, "default", "import os\nn = os.write(1, b'b' * 1_000_000)\nwhile n < 1_000_000: n += os.write(1, b'b' * (1_000_000 - n))").await;
    assert_eq!(o.status, CellStatus::Ok);
    assert_eq!(s.stdout.lock().unwrap().len(), 1_000_000);
    let (o, s) = run(&f.manager, "default", "print('ok'); 5").await;
    assert_eq!(
        (o.value.as_deref(), s.out()),
        (Some("5"), "ok\n".to_string())
    );
}

/// Output printed after a cell ended (a background thread) goes to the next cell.
#[tokio::test]
async fn late_output_goes_to_the_next_cell() {
    let f = fixture("late", 4);
    run(&f.manager, "default", "import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.2), print('late', flush=True))).start()").await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (_, s) = run(&f.manager, "default", "print('now')").await;
    assert_eq!(s.out(), "late\nnow\n");
}

/// Four sessions run one-second cells at the same time: none waits for another.
#[tokio::test]
async fn sessions_execute_concurrently_and_are_isolated() {
    let f = fixture("concurrent", 8);
    for i in 0..4 {
        run(&f.manager, &format!("s{i}"), &format!("me = {i}")).await;
    }
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let m = f.manager.clone();
            tokio::spawn(async move {
                run(&m, &format!("s{i}"), "import time; time.sleep(1); me")
                    .await
                    .0
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.unwrap().value, Some(i.to_string()));
    }
    let took = t0.elapsed();
    assert!(
        took < Duration::from_millis(1800),
        "four 1 s cells took {took:?}"
    );
    let busy = f.manager.get("s0").unwrap();
    let sink = Arc::new(Sink::default());
    let task = {
        let (s, sink) = (busy.clone(), sink.clone());
        tokio::spawn(async move { s.execute("import time; time.sleep(0.5)", sink).await })
    };
    wait_for(|| busy.info().state == SessionState::Busy).await;
    let err = busy
        .execute("1", Arc::new(Sink::default()))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("busy"), "{err}");
    task.await.unwrap().unwrap();
}

/// Variables: list, get (repr and JSON), set from JSON, delete, clear.
#[tokio::test]
async fn variables_list_get_set_delete_clear() {
    let f = fixture("vars", 4);
    run(
        &f.manager,
        "default",
        "import os\nx = 42\ndata = {'a': [1, 2]}\n_hidden = 1\nclass C: pass\nobj = C()",
    )
    .await;
    let s = f.manager.get("default").unwrap();
    let vars = s.variables().await.unwrap();
    let names: Vec<&str> = vars.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, vec!["C", "data", "obj", "x"]);
    let x = vars.iter().find(|v| v.name == "x").unwrap();
    assert_eq!(
        (x.type_name.as_str(), x.repr.as_str(), x.size),
        ("int", "42", Some(28))
    );
    assert_eq!(
        vars.iter().find(|v| v.name == "obj").unwrap().type_name,
        "__main__.C"
    );
    let d = s.get_variable("data").await.unwrap();
    assert_eq!(d.json, Some(serde_json::json!({"a": [1, 2]})));
    assert!(!s.get_variable("obj").await.unwrap().has_json);
    let err = s.get_variable("nope").await.unwrap_err().to_string();
    assert!(err.contains("no variable named 'nope'"), "{err}");
    s.set_variable("y", serde_json::json!([1, "two"]))
        .await
        .unwrap();
    assert!(
        s.set_variable("not valid", serde_json::json!(1))
            .await
            .is_err()
    );
    let (o, _) = run(&f.manager, "default", "y").await;
    assert_eq!(o.value.as_deref(), Some("[1, 'two']"));
    s.delete_variable("y").await.unwrap();
    assert!(s.delete_variable("y").await.is_err());
    s.clear_variables().await.unwrap();
    assert!(s.variables().await.unwrap().is_empty());
    let (o, _) = run(&f.manager, "default", "len([1])").await;
    assert_eq!(o.value.as_deref(), Some("1"), "builtins survive clear");
}

/// Restart kills the worker and clears state; a cell running during restart ends.
#[tokio::test]
async fn restart_clears_state_and_ends_a_running_cell() {
    let f = fixture("restart", 4);
    run(&f.manager, "default", "x = 1").await;
    let s = f.manager.get("default").unwrap();
    let sink = Arc::new(Sink::default());
    let task = {
        let (s, sink) = (s.clone(), sink.clone());
        tokio::spawn(async move { s.execute("import time; time.sleep(30)", sink).await })
    };
    wait_for(|| s.info().state == SessionState::Busy).await;
    let t0 = Instant::now();
    s.restart().await.unwrap();
    let took = t0.elapsed();
    let o = task.await.unwrap().unwrap();
    assert_eq!(o.status, CellStatus::WorkerDied);
    assert!(o.worker_exit.unwrap().contains("restarted"));
    let (o, _) = run(&f.manager, "default", "'x' in dir()").await;
    assert_eq!(
        (o.value.as_deref(), o.state_lost, o.cell),
        (Some("False"), false, 1)
    );
    assert!(took < Duration::from_secs(2), "restart took {took:?}");
}

/// The session limit names itself and the open sessions; close frees a slot.
#[tokio::test]
async fn session_limit_list_and_close() {
    let f = fixture("limit", 2);
    f.manager.get_or_start("a").await.unwrap();
    f.manager.get_or_start("b").await.unwrap();
    let err = f.manager.get_or_start("c").await.unwrap_err().to_string();
    assert!(
        err.contains("limit of 2 sessions") && err.contains("a, b"),
        "{err}"
    );
    let list = f.manager.list();
    assert_eq!(
        list.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
        vec!["a", "b"]
    );
    assert!(list[0].worker_pid.is_some());
    f.manager.close("a").unwrap();
    assert!(f.manager.close("a").is_err());
    f.manager.get_or_start("c").await.unwrap();
    assert!(f.manager.get_or_start("bad/name").await.is_err());
}

/// run_file executes a script as __main__ with argv, in the session namespace.
#[tokio::test]
async fn run_file_runs_a_script_as_main_with_argv() {
    let f = fixture("runfile", 4);
    let ws = f.dir.join("ws");
    std::fs::write(ws.join("script.py"), "import sys\nif __name__ == '__main__':\n    print(sys.argv[1:])\n    result = len(sys.argv)\n").unwrap();
    let s = f.manager.get_or_start("default").await.unwrap();
    let sink = Arc::new(Sink::default());
    let o = s
        .run_file("script.py", vec!["a".into(), "b c".into()], sink.clone())
        .await
        .unwrap();
    assert_eq!(
        (o.status, sink.out()),
        (CellStatus::Ok, "['a', 'b c']\n".to_string())
    );
    let (o, _) = run(&f.manager, "default", "result").await;
    assert_eq!(o.value.as_deref(), Some("3"));
    let o = s
        .run_file("missing.py", vec![], Arc::new(Sink::default()))
        .await
        .unwrap();
    assert_eq!(o.error.unwrap().ename, "FileNotFoundError");
}

/// Rough speed check: first cell after start, and trivial cells (printed; loose bounds).
#[tokio::test]
async fn trivial_cells_are_fast() {
    let f = fixture("speed", 4);
    let t0 = Instant::now();
    let s = f.manager.get_or_start("default").await.unwrap();
    let o = s.execute("1", Arc::new(Sink::default())).await.unwrap();
    let first = t0.elapsed();
    assert_eq!(o.value.as_deref(), Some("1"));
    let mut times = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        s.execute("x = 1", Arc::new(Sink::default())).await.unwrap();
        times.push(t.elapsed());
    }
    times.sort();
    eprintln!(
        "first cell (incl. start) {first:?}; trivial median {:?} p95 {:?}",
        times[100], times[190]
    );
    assert!(
        times[100] < Duration::from_millis(20),
        "median {:?}",
        times[100]
    );
}

/// Timings of start, first cell, interrupt and restart (printed; loose bounds so a busy
/// CI machine does not fail it).
#[tokio::test]
async fn start_interrupt_and_restart_timings() {
    let f = fixture("timings", 4);
    f.manager.python().await.unwrap();
    let t0 = Instant::now();
    let s = f.manager.get_or_start("default").await.unwrap();
    let spawned = t0.elapsed();
    let o = s.execute("1", Arc::new(Sink::default())).await.unwrap();
    let first = t0.elapsed();
    assert_eq!(o.value.as_deref(), Some("1"));
    let mut interrupts = Vec::new();
    for _ in 0..5 {
        let sink = Arc::new(Sink::default());
        let task = {
            let (s, sink) = (s.clone(), sink.clone());
            tokio::spawn(async move {
                s.execute("print('go', flush=True)\nwhile True: pass", sink)
                    .await
            })
        };
        wait_for(|| sink.out().contains("go")).await;
        let t = Instant::now();
        s.interrupt();
        let o = task.await.unwrap().unwrap();
        interrupts.push(t.elapsed());
        assert_eq!(o.status, CellStatus::Interrupted);
    }
    let mut restarts = Vec::new();
    for _ in 0..5 {
        // An agent's calls are seconds apart: by then the spare worker is up.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let t = Instant::now();
        s.restart().await.unwrap();
        s.execute("1", Arc::new(Sink::default())).await.unwrap();
        restarts.push(t.elapsed());
    }
    eprintln!(
        "spawn {spawned:?}, first cell after spawn {first:?}, interrupts {interrupts:?}, restart+cell {restarts:?}"
    );
    assert!(first < Duration::from_secs(2));
}

/// The protocol descriptors are out of user code's reach: nothing at fds 3/4, and a child
/// process inherits only stdin/stdout/stderr.
#[tokio::test]
async fn protocol_fds_are_hidden_from_user_code_and_children() {
    let f = fixture("fds", 4);
    let (o, _) = run(&f.manager, "default", "import os\ndef probe(fd):\n    try:\n        os.fstat(fd); return True\n    except OSError:\n        return False\n[probe(3), probe(4)]").await;
    assert_eq!(o.value.as_deref(), Some("[False, False]"));
    let (o, s) = run(
        &f.manager,
        "default",
        "import subprocess\nsubprocess.run(['sh', '-c', 'ls /proc/$$/fd'], check=True)",
    )
    .await;
    assert_eq!(o.status, CellStatus::Ok);
    let mut fds: Vec<String> = s.out().split_whitespace().map(String::from).collect();
    fds.sort();
    // 0-2, plus whatever the shell itself opens for `ls` (none that are inherited).
    assert_eq!(&fds[..3], &["0", "1", "2"], "child fds: {fds:?}");
    assert!(
        fds.iter()
            .all(|fd| fd.parse::<i32>().unwrap() < 3 || fd == "3" || fd == "255"),
        "child fds: {fds:?}"
    );
}

/// Rich output: `_repr_png_`/`_repr_html_` of the value, and the `display()` builtin.
#[tokio::test]
async fn rich_values_and_display_builtin_give_display_items() {
    let f = fixture("rich", 4);
    let code = "class Pic:\n    def _repr_png_(self): return b'\\x89PNG'\n    def _repr_html_(self): return '<b>hi</b>'\ndisplay('plain')\nPic()";
    let (o, _) = run(&f.manager, "default", code).await;
    let mimes: Vec<(&str, &str)> = o
        .display
        .iter()
        .map(|d| (d.mime.as_str(), d.data.as_str()))
        .collect();
    assert_eq!(
        mimes,
        vec![
            ("text/plain", "'plain'"),
            ("image/png", "iVBORw=="),
            ("text/html", "<b>hi</b>")
        ]
    );
}

/// Top-level await runs; odd text (lone surrogates, non-UTF-8 bytes) neither breaks the
/// protocol nor the output.
#[tokio::test]
async fn top_level_await_and_odd_text() {
    let f = fixture("odd", 4);
    let (o, _) = run(
        &f.manager,
        "default",
        "import asyncio\nawait asyncio.sleep(0.01)\n'done'",
    )
    .await;
    assert_eq!(
        (o.status, o.value.as_deref()),
        (CellStatus::Ok, Some("'done'"))
    );
    let (o, s) = run(
        &f.manager,
        "default",
        "import os\nprint('\\udcff')\nos.write(1, b'\\xff\\n')\nraise ValueError('\\udcff')",
    )
    .await;
    assert_eq!(o.status, CellStatus::Error);
    assert_eq!(o.error.unwrap().ename, "ValueError");
    assert_eq!(s.stdout.lock().unwrap().as_slice(), b"\\udcff\n\xff\n");
    let (o, _) = run(&f.manager, "default", "s = '\\udcff'\ns").await;
    assert_eq!(o.value.as_deref(), Some("'\\udcff'"));
}

/// matplotlib: `plt.show()` and figures left open at the end of a cell become PNG
/// display items. Needs an interpreter with matplotlib:
/// `SANDBOX_REPL_MPL_PYTHON=/path/to/python cargo nextest run --run-ignored all -E 'test(matplotlib)'`.
#[tokio::test]
#[ignore = "needs a Python with matplotlib in SANDBOX_REPL_MPL_PYTHON"]
async fn matplotlib_show_emits_png_display_items() {
    let python = std::env::var("SANDBOX_REPL_MPL_PYTHON")
        .expect("set SANDBOX_REPL_MPL_PYTHON to a python with matplotlib");
    use_real_launcher();
    let dir = std::env::temp_dir().join(format!("repl-suite-mpl-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("ws")).unwrap();
    let mut cfg = ReplConfig::new(
        dir.join("ws"),
        Policy::load("workspace-write").unwrap(),
        dir.join("state"),
    );
    cfg.python = Some(python.into());
    let f = Fixture {
        manager: SessionManager::new(cfg),
        dir,
    };
    let (o, s) = run(&f.manager, "default", "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\nprint(plt.get_backend())").await;
    assert_eq!(o.status, CellStatus::Ok, "{:?}", o.error);
    assert_eq!(s.out(), "module://_sandbox_repl_mpl\n");
    assert_eq!(o.display.len(), 1);
    assert_eq!(o.display[0].mime, "image/png");
    assert!(o.display[0].data.starts_with("iVBORw0KGgo"), "not a PNG");
    let (o, _) = run(
        &f.manager,
        "default",
        "fig, ax = plt.subplots()\nax.plot([3, 1])",
    )
    .await;
    assert_eq!(
        o.display.iter().filter(|d| d.mime == "image/png").count(),
        1,
        "open figure shown at cell end"
    );
    let (o, _) = run(
        &f.manager,
        "default",
        "import os\n(plt.get_fignums(), os.environ.get('MPLBACKEND'))",
    )
    .await;
    assert_eq!(
        o.value.as_deref(),
        Some("([], None)"),
        "figures closed; children get no backend override"
    );
}

/// Idle sessions are closed after the TTL; a busy one is not. A closed session's handle
/// refuses work with words.
#[tokio::test]
async fn idle_sessions_are_reaped_after_the_ttl() {
    use_real_launcher();
    let dir = std::env::temp_dir().join(format!("repl-suite-ttl-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("ws")).unwrap();
    let mut cfg = ReplConfig::new(
        dir.join("ws"),
        Policy::load("workspace-write").unwrap(),
        dir.join("state"),
    );
    cfg.idle_ttl = Duration::from_millis(800);
    let f = Fixture {
        manager: SessionManager::new(cfg),
        dir,
    };
    let idle = f.manager.get_or_start("idle").await.unwrap();
    let busy = f.manager.get_or_start("busy").await.unwrap();
    let task = tokio::spawn(async move {
        busy.execute("import time; time.sleep(2.5)", Arc::new(Sink::default()))
            .await
    });
    wait_for(|| f.manager.list().iter().all(|i| i.name != "idle")).await;
    assert_eq!(
        f.manager
            .list()
            .iter()
            .map(|i| i.name.as_str())
            .collect::<Vec<_>>(),
        vec!["busy"]
    );
    let err = idle
        .execute("1", Arc::new(Sink::default()))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("was closed"), "{err}");
    assert_eq!(task.await.unwrap().unwrap().status, CellStatus::Ok);
}
/// The sandbox applies to the worker: under workspace-write a write outside the
/// workspace fails, inside it works; the memory cap ends the worker with words.
#[tokio::test]
async fn the_policy_confines_the_worker_and_its_memory_cap_is_reported() {
    let f = fixture("policy", 4);
    let (o, _) = run(
        &f.manager,
        "default",
        "open('/etc/sandbox-repl-probe', 'w')",
    )
    .await;
    assert_eq!(o.status, CellStatus::Error);
    let e = o.error.unwrap();
    assert!(
        e.ename == "PermissionError" || e.ename == "OSError",
        "{e:?}"
    );
    let (o, _) = run(&f.manager, "default", "open('inside.txt', 'w').write('ok')").await;
    assert_eq!(o.value.as_deref(), Some("2"), "{:?}", o.error);
    assert!(f.dir.join("ws/inside.txt").exists());

    let policy_file = f.dir.join("small.toml");
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/policies/workspace-write.toml"
    ))
    .unwrap();
    std::fs::write(
        &policy_file,
        text.replace("memory = \"4GiB\"", "memory = \"256MiB\""),
    )
    .unwrap();
    let mut cfg = ReplConfig::new(
        f.dir.join("ws"),
        Policy::load(policy_file.to_str().unwrap()).unwrap(),
        f.dir.join("state2"),
    );
    cfg.spare_worker = false;
    let small = SessionManager::new(cfg);
    let (o, _) = run(&small, "default", "x = bytearray(1 << 30)").await;
    small.shutdown();
    match o.status {
        CellStatus::WorkerDied => assert_eq!(
            o.worker_exit.as_deref(),
            Some("the Python worker was killed: memory limit (256 MiB) reached")
        ),
        CellStatus::Error => assert_eq!(o.error.unwrap().ename, "MemoryError"),
        other => panic!("a 1 GiB allocation under a 256 MiB cap gave {other:?}"),
    }
}

/// Processes a cell started die with the worker when it crashes.
#[tokio::test]
async fn a_crash_takes_the_workers_children_along() {
    let f = fixture("children", 4);
    let (o, _) = run(
        &f.manager,
        "default",
        "import subprocess\np = subprocess.Popen(['sleep', '300'])\np.pid",
    )
    .await;
    let child: i32 = o.value.unwrap().parse().unwrap();
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    };
    assert!(alive(child), "the child {child} is not visible from here");
    let (o, _) = run(&f.manager, "default", "import os; os._exit(1)").await;
    assert_eq!(o.status, CellStatus::WorkerDied);
    wait_for(|| !alive(child)).await;
}
