//! Containment through the job cgroup: what a job leaves behind does not outlive it.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{TempDir, sh};

/// A daemon that leaves the job's process group (double fork + setsid) is still killed
/// when the job ends: the cgroup, not the process group, bounds the job.
#[test]
fn daemonized_grandchild_does_not_outlive_the_job() {
    let ws = TempDir::new("limits-daemon");
    // The daemon records its pid, then becomes a long sleep in its own session.
    let script = "setsid sh -c 'echo $$ > daemon.pid; exec sleep 300' </dev/null >/dev/null 2>&1 & \
                  while [ ! -s daemon.pid ]; do sleep 0.01; done; exit 0";
    let out = sh("workspace-write", &ws.path, script);
    assert!(out.status.success(), "{out:?}");
    let pid = std::fs::read_to_string(ws.join("daemon.pid")).expect("the daemon started");
    let proc_dir = format!("/proc/{}", pid.trim());
    let deadline = Instant::now() + Duration::from_secs(2);
    while Path::new(&proc_dir).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let comm = std::fs::read_to_string(format!("{proc_dir}/comm")).unwrap_or_default();
    assert!(
        comm.trim() != "sleep",
        "daemon {} survived the job",
        pid.trim()
    );
}
