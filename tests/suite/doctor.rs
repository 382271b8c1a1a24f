//! `doctor` tells the truth on this machine: what it prints is compared with direct
//! probes made by the test itself (Landlock syscall, /proc/self/cgroup, euid) and with
//! what `run` actually enforces.

use std::process::Command;

use crate::common::{TempDir, bin, sh, stdout};

fn doctor_json() -> serde_json::Value {
    let out = Command::new(bin())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "doctor failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("doctor --json prints one JSON document")
}

/// The Landlock ABI doctor reports is the one the kernel returns to a direct query.
#[test]
fn landlock_abi_matches_direct_probe() {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION).
    let direct = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    let k = &doctor_json()["kernel"];
    if direct < 0 {
        assert!(k["landlock_abi"].is_null(), "{k}");
    } else {
        assert_eq!(k["landlock_abi"], direct, "{k}");
        assert_eq!(
            k["landlock_features"].as_array().unwrap().len() as i64,
            direct.min(7)
        );
    }
    // SAFETY: geteuid takes no arguments and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(k["is_root"], euid == 0);
}

/// The cgroup layout doctor reports matches /proc/self/cgroup (doctor runs in the test's
/// cgroups) and the controllers it calls usable really are: `run` under a policy with
/// a process cap creates a job cgroup the child sits in.
#[test]
fn cgroup_report_matches_reality() {
    let k = &doctor_json()["kernel"]["cgroup"];
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let v1_path = |ctrl: &str| {
        own.lines().find_map(|l| {
            let mut it = l.splitn(3, ':');
            let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
            ctrls
                .split(',')
                .any(|c| c == ctrl)
                .then(|| path.to_string())
        })
    };
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let v1_pids_mounted = mounts
        .lines()
        .any(|l| l.contains(" cgroup ") && l.split(' ').nth(3).unwrap().contains("pids"));
    if v1_pids_mounted {
        assert_eq!(k["version"], "v1", "{k}");
        let dir = format!("/sys/fs/cgroup/pids{}", v1_path("pids").unwrap())
            .trim_end_matches('/')
            .to_string();
        assert_eq!(k["pids_dir"], dir, "{k}");
        let mem = format!("/sys/fs/cgroup/memory{}", v1_path("memory").unwrap())
            .trim_end_matches('/')
            .to_string();
        assert_eq!(k["memory_dir"], mem, "{k}");
        assert_eq!(k["hybrid"], mounts.contains(" cgroup2 "), "{k}");
    } else {
        assert_eq!(k["version"], "v2", "{k}");
    }
    assert_eq!(
        k["pids"]["ok"], true,
        "pids controller usable on this machine: {k}"
    );
    // The child of `run` really is in a job cgroup under the reported directory.
    let ws = TempDir::new("doctor-cg");
    let out = sh("workspace-write", &ws.path, "cat /proc/self/cgroup");
    let child = stdout(&out);
    let pids_line = child
        .lines()
        .find(|l| l.contains(":pids:") || l.starts_with("0::"))
        .unwrap_or("");
    assert!(
        pids_line.contains("/mcp-sandbox-repl/"),
        "child cgroups: {child}"
    );
}

/// Each shipped policy is listed; on this machine (root, Landlock, namespaces, cgroups)
/// every protection of the restricted policies is enforced, and the text output says so.
#[test]
fn policies_are_reported_enforced_here() {
    let r = doctor_json();
    let names: Vec<&str> = r["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    for expected in ["read-only", "workspace-write", "danger-full-access", "ci"] {
        assert!(names.contains(&expected), "{names:?}");
    }
    for p in r["policies"].as_array().unwrap() {
        assert_eq!(p["refuses_to_start"], false, "{p}");
        for item in p["items"].as_array().unwrap() {
            assert_eq!(item["enforced"], true, "{}: {item}", p["name"]);
        }
    }
    let text = Command::new(bin()).arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("Landlock      ABI "), "{text}");
    assert!(text.contains("workspace-write"), "{text}");
    assert!(!text.contains("NOT ENFORCED"), "{text}");
}

/// The open-file limit doctor reports is the one it runs with, and it says what the
/// server makes of it: under `prlimit --nofile=1024:4096`, soft 1024 and hard 4096, the
/// server's soft limit raised to 4096, jobs without a policy limit keeping 1024.
#[test]
fn open_files_are_reported_with_the_servers_raise() {
    let out = Command::new("prlimit")
        .args(["--nofile=1024:4096", "--"])
        .arg(bin())
        .arg("doctor")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("open files    soft 1024, hard 4096: `serve` raises its soft limit to 4096 at start; jobs whose policy sets no limits.open_files keep 1024"),
        "{text}"
    );
    let out = Command::new("prlimit")
        .args(["--nofile=1024:4096", "--"])
        .arg(bin())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = &v["open_files"];
    assert_eq!(
        (f["soft"].as_u64(), f["hard"].as_u64()),
        (Some(1024), Some(4096)),
        "{f}"
    );
    assert_eq!(f["server_soft"].as_u64(), Some(4096), "{f}");
    assert_eq!(f["broker_per_job"].as_u64(), Some(128), "{f}");
}
