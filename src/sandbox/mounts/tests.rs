//! The mount view applied for real in a child process (needs root; no launcher yet:
//! the view is applied between fork and exec, capabilities still held, so every denial
//! seen here comes from the mount view alone).

use std::os::unix::process::CommandExt;
use std::process::Command;

use super::*;

struct Dirs {
    root: PathBuf,
    ws: PathBuf,
    tmp: PathBuf,
}

fn dirs(tag: &str) -> Dirs {
    let root = std::env::temp_dir().join(format!("mounts-{tag}-{}", std::process::id()));
    let (ws, tmp) = (root.join("ws"), root.join("tmp"));
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::create_dir_all(&tmp).unwrap();
    Dirs { root, ws, tmp }
}

fn run_in_view(view: MountView, script: &str) -> (String, String) {
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c").arg(script);
    // SAFETY: test only; glibc keeps malloc usable in the forked child.
    unsafe { cmd.pre_exec(move || apply_mount_view(&view).map_err(|e| io::Error::other(e.to_string()))) };
    let out = cmd.output().expect("spawn");
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn view(d: &Dirs) -> MountView {
    MountView {
        read: ["/usr", "/bin", "/lib", "/lib64", "/etc", "/nonexistent-path"].iter().map(PathBuf::from).collect(),
        write: vec![],
        tmp: d.tmp.clone(),
        workspace: d.ws.clone(),
    }
}

/// Listed paths are there with the right mode; everything else does not exist; metadata
/// changes outside writable paths fail with EROFS even for a process holding every capability.
#[test]
fn view_has_only_listed_paths_with_their_modes() {
    let d = dirs("basic");
    let script = r#"
        t() { if eval "$2" >/dev/null 2>&1; then echo "$1=ok"; else echo "$1=no"; fi; }
        t read_etc 'cat /etc/passwd'
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
    let (out, err) = run_in_view(view(&d), &script);
    let expect = "read_etc=ok write_etc=no chmod_etc=no touch_root=no mkdir_usr=no write_ws=ok write_tmp=ok \
                  home_exists=no run_exists=no work_exists=no dev_null=ok dev_urandom=ok proc_self=ok proc_ro=no cwd_is_ws=ok";
    assert_eq!(out.split_whitespace().collect::<Vec<_>>().join(" "), expect, "stderr: {err}");
    assert!(d.ws.join("made-in-ws").exists(), "workspace writes reach the host");
    assert!(d.tmp.join("made-in-tmp").exists(), "/tmp is the private tmp");
    assert!(!Path::new("/etc/mcp-escape").exists());
    std::fs::remove_dir_all(&d.root).unwrap();
}

/// A workspace under /tmp stays reachable although /tmp is replaced by the private tmp.
#[test]
fn workspace_under_tmp_alias_is_reachable() {
    let d = dirs("nested");
    let (out, err) = run_in_view(view(&d), "echo ok > ./f && cat ./f && ls /tmp >/dev/null && echo listed");
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), ["ok", "listed"], "stderr: {err}");
    std::fs::remove_dir_all(&d.root).unwrap();
}
