//! The mount view applied for real in a child process (needs root; no launcher yet:
//! the view is applied between fork and exec, capabilities still held, so every denial
//! seen here comes from the mount view alone).

use std::os::unix::process::CommandExt;
use std::process::Command;

use super::*;
use crate::test_support::scratch_dir_in;

struct Dirs {
    /// Removes the directories on drop, also when the test fails.
    _root: tempfile::TempDir,
    ws: PathBuf,
    tmp: PathBuf,
}

/// Scratch dirs under `base` (/var/tmp: outside /tmp, so the /tmp alias applies).
fn dirs_in(base: &str, tag: &str) -> Dirs {
    let root = scratch_dir_in(Path::new(base), &format!("mounts-{tag}"));
    let (ws, tmp) = (root.path().join("ws"), root.path().join("tmp"));
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::create_dir_all(&tmp).unwrap();
    Dirs {
        _root: root,
        ws,
        tmp,
    }
}

fn dirs(tag: &str) -> Dirs {
    dirs_in("/var/tmp", tag)
}

fn run_in_view(view: MountView, script: &str) -> (String, String) {
    run_entering(move || apply_mount_view(&view, false), script)
}

/// The same through a view made ahead in this process (as the server does) and joined
/// by the child (as its job's launcher does).
fn run_in_prepared(view: MountView, script: &str) -> (String, String) {
    let prepared = prepare_view(&view).expect("a view made ahead");
    let ws = view.workspace.clone();
    run_entering(
        move || enter_prepared_view(prepared.fd(), prepared.mounts_proc(), &ws),
        script,
    )
}

fn run_entering(
    mut enter: impl FnMut() -> Result<(), MountError> + Send + Sync + 'static,
    script: &str,
) -> (String, String) {
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c").arg(script);
    // SAFETY: test only; glibc keeps malloc usable in the forked child.
    unsafe { cmd.pre_exec(move || enter().map_err(|e| io::Error::other(e.to_string()))) };
    // The error text of a failed pre_exec does not cross the fork; its errno does.
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) => return (String::new(), format!("view refused: {e}")),
    };
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn view(d: &Dirs) -> MountView {
    MountView {
        read: [
            "/usr",
            "/bin",
            "/lib",
            "/lib64",
            "/etc",
            "/nonexistent-path",
        ]
        .iter()
        .map(PathBuf::from)
        .collect(),
        write: vec![d.ws.clone()],
        tmp: d.tmp.clone(),
        workspace: d.ws.clone(),
        ..Default::default()
    }
}

/// Listed paths are there with the right mode; everything else does not exist; metadata
/// changes outside writable paths fail with EROFS even for a process holding every capability.
#[test]
fn view_has_only_listed_paths_with_their_modes() {
    check_listed_paths_and_modes("basic", run_in_view);
}

/// A view made ahead of need and joined by the job shows exactly the same.
#[test]
fn a_view_made_ahead_has_only_listed_paths_with_their_modes() {
    check_listed_paths_and_modes("ahead", run_in_prepared);
}

fn check_listed_paths_and_modes(tag: &str, run: fn(MountView, &str) -> (String, String)) {
    let d = dirs(tag);
    let script = r#"
        t() { if eval "$2" >/dev/null 2>&1; then echo "$1=ok"; else echo "$1=no"; fi; }
        t read_etc 'cat /etc/passwd'
        t shadow_has_content 'test -s /etc/shadow'
        t write_etc 'echo x > /etc/mcp-escape'
        t chmod_etc 'chmod 600 /etc/hostname'
        t touch_root 'touch /mcp-escape'
        t mkdir_usr 'mkdir /usr/mcp-escape'
        t write_ws 'echo hi > ./made-in-ws'
        t write_tmp 'echo hi > /tmp/made-in-tmp'
        t home_exists 'test -e /root'
        t run_exists 'test -e /run'
        t work_exists 'test -e /work'
        t dev_null 'echo x > /dev/null'
        t dev_urandom 'head -c 4 /dev/urandom'
        t proc_self 'test -r /proc/self/status'
        t proc_ro 'echo 1 > /proc/sys/vm/drop_caches'
        t cwd_is_ws "test \"\$(pwd)\" = '"$WS"'"
    "#
    .replace("$WS", &d.ws.display().to_string());
    let (out, err) = run(view(&d), &script);
    let expect = "read_etc=ok shadow_has_content=no write_etc=no chmod_etc=no touch_root=no mkdir_usr=no write_ws=ok write_tmp=ok \
                  home_exists=no run_exists=no work_exists=no dev_null=ok dev_urandom=ok proc_self=ok proc_ro=no cwd_is_ws=ok";
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>().join(" "),
        expect,
        "stderr: {err}"
    );
    assert!(
        d.ws.join("made-in-ws").exists(),
        "workspace writes reach the host"
    );
    assert!(
        d.tmp.join("made-in-tmp").exists(),
        "/tmp is the private tmp"
    );
    assert!(!Path::new("/etc/mcp-escape").exists());
}

/// A workspace inside the host's /tmp stays reachable and writable; /tmp is then not the
/// private tmp (see `plan`), which stays writable at its own path.
#[test]
fn workspace_under_host_tmp() {
    let d = dirs_in("/tmp", "nested");
    let script = format!(
        "echo ok > ./f && cat ./f; echo x > {}/t && echo tmp-own-path; echo x > /tmp/alias 2>/dev/null || echo no-alias",
        d.tmp.display()
    );
    let (out, err) = run_in_view(view(&d), &script);
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["ok", "tmp-own-path", "no-alias"],
        "stderr: {err}"
    );
}

/// A read-only workspace (policy read-only) is not made writable by the view.
#[test]
fn read_only_workspace_stays_read_only() {
    let d = dirs("rows");
    let mut v = view(&d);
    v.write.clear();
    v.read.push(d.ws.clone());
    let (out, err) = run_in_view(
        v,
        "ls . >/dev/null && echo readable; echo x > ./f 2>/dev/null || echo denied",
    );
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["readable", "denied"],
        "stderr: {err}"
    );
}

/// Median microseconds of `f` run in a forked child, over `n` runs, `gap_ms` apart
/// (a gap lets RCU go idle, as between two launches of a quiet server).
fn child_median_us(n: usize, gap_ms: u64, f: &dyn Fn() -> bool) -> u64 {
    let mut samples = Vec::new();
    for _ in 0..n {
        std::thread::sleep(std::time::Duration::from_millis(gap_ms));
        let mut fds = [0; 2];
        // SAFETY: test-only pipe + fork; the child runs `f` and reports its duration.
        unsafe { libc::pipe(fds.as_mut_ptr()) };
        // SAFETY: as above; the child only runs `f`, writes 8 bytes and `_exit`s.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let t = std::time::Instant::now();
            let ok = f();
            let us = if ok {
                t.elapsed().as_micros() as u64
            } else {
                u64::MAX
            };
            // SAFETY: writes the 8 bytes of a u64 we own to the pipe opened above.
            unsafe { libc::write(fds[1], (&us as *const u64).cast(), 8) };
            // SAFETY: ends the forked child without running the parent's atexit handlers.
            unsafe { libc::_exit(0) };
        }
        let mut us = 0u64;
        // SAFETY: reads 8 bytes into a u64 we own; the descriptors are ours.
        unsafe {
            libc::read(fds[0], (&mut us as *mut u64).cast(), 8);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        samples.push(us);
    }
    samples.sort();
    samples[n / 2]
}

/// Not a test: the cost of each isolation step (run with --ignored --nocapture;
/// `tests/bench/isolation.py` records the output in docs/benchmarks.md).
#[test]
#[ignore]
fn measure_isolation_costs() {
    use crate::sandbox::launcher::netns;
    use crate::sandbox::parent::cgroup;
    let host = cgroup::CgroupHost::new();
    let n = 41;
    let none = child_median_us(n, 0, &|| netns::isolate_network(false, false).is_ok());
    println!("netns none: {none} us");
    let lo = child_median_us(n, 0, &|| netns::isolate_network(true, false).is_ok());
    println!("netns loopback: {lo} us");
    let cg = cgroup::JobCgroup::create(&host, "measure", Some(256 << 20), Some(64)).unwrap();
    let tasks = cg.procs_files();
    let procs: Vec<PathBuf> = tasks
        .iter()
        .map(|p| p.with_file_name("cgroup.procs"))
        .collect();
    let join = |files: &[PathBuf]| crate::sandbox::launcher::cgroup::join_current(files).is_ok();
    let t = child_median_us(15, 100, &|| join(&tasks));
    println!("cgroup join via tasks, idle before: {t} us");
    let p = child_median_us(15, 100, &|| join(&procs));
    println!("cgroup join via cgroup.procs, idle before: {p} us");
    let pb = child_median_us(n, 0, &|| join(&procs));
    println!("cgroup join via cgroup.procs, back to back: {pb} us");
    drop(cg);
    let mut create = Vec::new();
    for i in 0..n {
        let t = std::time::Instant::now();
        let cg =
            cgroup::JobCgroup::create(&host, &format!("measure-{i}"), Some(256 << 20), Some(64));
        drop(cg.unwrap());
        create.push(t.elapsed().as_micros());
    }
    create.sort();
    println!("cgroup create+remove (pids+memory): {} us", create[n / 2]);
    let d = dirs("measure2");
    let mut v = view(&d);
    v.read.push(PathBuf::from("/root/.pyenv"));
    let m = child_median_us(n, 0, &|| apply_mount_view(&v, false).is_ok());
    println!("mount view (workspace-write-like): {m} us");
}

/// A symlink planted in the private tmp (reused by a session's next worker) where the
/// view needs a mount point under the /tmp alias is not followed: it would otherwise
/// make the privileged launcher create directories anywhere on the host.
#[test]
fn planted_symlink_on_a_mount_point_path_is_not_followed() {
    let root = scratch_dir_in(Path::new("/tmp"), "mounts-plant");
    let tmp = root.path().join("tmp");
    let ws_dir = scratch_dir_in(Path::new("/var/tmp"), "mounts-plant-ws");
    let target_dir = scratch_dir_in(Path::new("/var/tmp"), "mounts-plant-target");
    let (ws, target) = (ws_dir.path().to_path_buf(), target_dir.path().to_path_buf());
    std::fs::create_dir_all(&tmp).unwrap();
    // In the view /tmp is `tmp`; its own path /tmp/mounts-plant-XXXXXX/tmp runs through
    // this link.
    let link = format!("../../oldroot{}", target.display());
    let name = root.path().file_name().unwrap();
    std::os::unix::fs::symlink(&link, tmp.join(name)).unwrap();
    let v = MountView {
        read: vec!["/usr".into(), "/bin".into(), "/lib".into(), "/lib64".into()],
        write: vec![ws.clone()],
        tmp: tmp.clone(),
        workspace: ws.clone(),
        ..Default::default()
    };
    let (out, err) = run_in_view(v, "echo started");
    let created = target.join("tmp").exists();
    assert!(
        !created,
        "the launcher followed the planted link (stdout {out:?}, stderr {err:?})"
    );
    assert!(
        err.starts_with("view refused"),
        "the launch is refused: {out:?} {err:?}"
    );
}

/// A policy listing /dev/shm gets a private tmpfs there: POSIX semaphores work
/// (multiprocessing locks), and nothing reaches the host's /dev/shm.
#[test]
fn dev_shm_is_private() {
    let d = dirs("shm");
    let mut v = view(&d);
    v.write.push(PathBuf::from("/dev/shm"));
    v.read.push(PathBuf::from("/root/.pyenv"));
    let py = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys; print(getattr(sys, '_base_executable', sys.executable))",
        ])
        .output()
        .unwrap();
    let py = String::from_utf8(py.stdout).unwrap();
    let tag = format!("mounts-shm-{}", std::process::id());
    let script = format!(
        "echo x > /dev/shm/{tag} && echo wrote; {} -c 'import multiprocessing as m; m.Lock(); print(\"lock\")'",
        py.trim()
    );
    let (out, err) = run_in_view(v, &script);
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["wrote", "lock"],
        "stderr: {err}"
    );
    assert!(
        !Path::new("/dev/shm").join(&tag).exists(),
        "reached the host's /dev/shm"
    );
}

/// A private tmp with no host directory (what `run` passes with `tmp_size`): made in the
/// view only, a tmpfs at its own path and at /tmp, and still absent on the host.
#[test]
fn tmpfs_tmp_without_a_host_directory() {
    check_tmpfs_tmp_without_a_host_directory("viewonly", run_in_view);
}

/// The same in views made ahead, the server's shell jobs' case: every job's `{tmp}` has
/// the same name, and each job has a tmpfs of its own there.
#[test]
fn views_made_ahead_have_a_tmpfs_tmp_each() {
    check_tmpfs_tmp_without_a_host_directory("viewonly-ahead", run_in_prepared);
}

fn check_tmpfs_tmp_without_a_host_directory(
    tag: &str,
    run: fn(MountView, &str) -> (String, String),
) {
    let d = dirs(tag);
    let tmp = d.tmp.join("not-on-host");
    let view = MountView {
        read: vec!["/usr".into(), "/bin".into(), "/lib".into(), "/lib64".into()],
        write: vec![d.ws.clone()],
        tmp: tmp.clone(),
        tmp_size: Some(1 << 20),
        hide: vec![],
        workspace: d.ws.clone(),
    };
    let script = format!(
        "ls -A /tmp; echo x > '{}/f' && cat /tmp/f && stat -f -c %T '{}'",
        tmp.display(),
        tmp.display()
    );
    for _ in 0..2 {
        // The second job finds nothing of the first's.
        let (out, err) = run(view.clone(), &script);
        assert_eq!(out, "x\ntmpfs\n", "{err}");
    }
    assert!(!tmp.exists());
}

/// Making a view ahead moves nothing of the process that makes it: its mount namespace
/// and root stay the host's.
#[test]
fn making_a_view_ahead_leaves_the_caller_where_it_was() {
    let d = dirs("ahead-caller");
    let ns = || std::fs::read_link("/proc/thread-self/ns/mnt").unwrap();
    let before = ns();
    let prepared = prepare_view(&view(&d)).unwrap();
    assert_eq!(ns(), before);
    assert!(Path::new("/proc/1/status").exists() && d.ws.exists());
    let theirs =
        std::fs::read_link(format!("/proc/self/fd/{}", prepared.fd().as_raw_fd())).unwrap();
    assert_ne!(theirs, before, "the view is a namespace of its own");
}

/// A view made before the host changed what it lists is not used: a listed path created
/// since (a venv, a cache), or replaced by another directory, makes it stale.
#[test]
fn a_view_made_before_a_listed_path_changed_is_stale() {
    let d = dirs("stale");
    let later = d.ws.join("made-later");
    let mut v = view(&d);
    v.read.push(later.clone());
    let prepared = prepare_view(&v).unwrap();
    assert!(prepared.is_current(&v));
    std::fs::create_dir(&later).unwrap();
    assert!(!prepared.is_current(&v), "a listed path created since");
    let prepared = prepare_view(&v).unwrap();
    assert!(prepared.is_current(&v));
    std::fs::rename(&later, d.ws.join("moved")).unwrap();
    std::fs::create_dir(&later).unwrap();
    assert!(!prepared.is_current(&v), "a listed path replaced since");
}

#[test]
fn a_view_only_tmp_needs_an_absolute_plain_path_under_an_existing_directory() {
    let d = dirs("scratch");
    let ok = view_only_scratch(&d.tmp.join("a/b")).unwrap();
    assert_eq!(ok, d.tmp.canonicalize().unwrap());
    for bad in ["relative/x", "/x", "/var/tmp/../x"] {
        assert!(view_only_scratch(Path::new(bad)).is_err(), "{bad}");
    }
}

/// A private tmp whose name is taken by a link (planted where `run` left the name free, or
/// anywhere): refused, never followed to the link's target.
#[test]
fn a_private_tmp_that_is_a_link_is_refused() {
    let d = dirs("tmplink");
    let target = d.tmp.join("target");
    std::fs::create_dir(&target).unwrap();
    let link = d.tmp.join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    for tmp_size in [None, Some(1 << 20)] {
        let view = MountView {
            read: vec!["/usr".into(), "/bin".into(), "/lib".into(), "/lib64".into()],
            write: vec![d.ws.clone()],
            tmp: link.clone(),
            tmp_size,
            hide: vec![],
            workspace: d.ws.clone(),
        };
        let (out, err) = run_in_view(view, "echo x > /tmp/f && echo started");
        assert!(
            err.starts_with("view refused"),
            "tmp_size {tmp_size:?}: {out:?} {err:?}"
        );
        assert!(!target.join("f").exists());
    }
}
