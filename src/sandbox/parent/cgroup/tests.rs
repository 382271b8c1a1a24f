//! Job cgroups on the real machine (needs root and a pids / memory controller; fails
//! loudly otherwise) plus the v2 preparation logic on a fake directory tree.

use std::os::unix::process::CommandExt;
use std::process::Command;

use super::*;
use crate::sandbox::launcher::cgroup::join_current;
use crate::test_support::scratch_dir;

/// The machine's cgroups, as one runtime of this test process sees them.
fn test_host() -> &'static CgroupHost {
    static HOST: std::sync::OnceLock<CgroupHost> = std::sync::OnceLock::new();
    HOST.get_or_init(CgroupHost::new)
}

fn unique(tag: &str) -> String {
    format!("unit-{tag}-{}", std::process::id())
}

/// Spawn `sh -c script` inside the job cgroup (joined between fork and exec).
fn run_in(cg: &JobCgroup, script: &str) -> std::process::ExitStatus {
    let files = cg.procs_files();
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script);
    // SAFETY: join_current only opens and writes files; acceptable in a test child.
    unsafe { cmd.pre_exec(move || join_current(&files).map_err(std::io::Error::other)) };
    cmd.status().expect("spawn sh")
}

/// Every pid of a `cgroup.procs` listing has ended (gone, or a zombie awaiting its
/// reaper): killed, since each was an hour's sleep.
fn assert_all_gone(listing: &str) {
    for pid in listing.split_whitespace() {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, r)| r.trim_start().chars().next())
            })
            .flatten();
        assert!(
            matches!(state, None | Some('Z') | Some('X')),
            "{pid} still runs"
        );
    }
}

/// The pids cap stops a burst of forks and is reported; kill_all and remove clean up.
#[test]
fn pids_cap_refuses_forks_and_is_reported() {
    let cg =
        JobCgroup::create(test_host(), &unique("pids"), None, Some(4)).expect("create job cgroup");
    assert!(!cg.pids_limit_hit());
    let status = run_in(&cg, "for i in 1 2 3 4 5 6 7 8; do sleep 5 & done; wait");
    assert!(status.success() || !status.success());
    assert!(
        cg.pids_limit_hit(),
        "forks beyond pids.max must be counted in pids.events"
    );
    let dirs: Vec<PathBuf> = cg.dirs().cloned().collect();
    cg.kill_all();
    cg.remove();
    for d in dirs {
        assert!(!d.exists(), "{} should be removed", d.display());
    }
}

/// A process over the memory cap is OOM-killed in the job cgroup, and the report says so.
#[test]
fn memory_cap_kills_and_is_reported() {
    let cg = JobCgroup::create(test_host(), &unique("mem"), Some(32 << 20), Some(64))
        .expect("create job cgroup");
    // `head -c` into a shell variable grows the shell's heap past the cap.
    let status = run_in(
        &cg,
        "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}",
    );
    assert!(!status.success(), "the hog must be killed");
    assert!(cg.memory_limit_hit(), "oom_kill must be counted");
    let peak = cg.peak_memory_bytes().expect("peak memory");
    assert!(
        (16 << 20..=40 << 20).contains(&peak),
        "peak {peak} near the 32 MiB cap"
    );
}

/// Drop kills what is still running and removes the directories.
#[test]
fn drop_kills_survivors() {
    let cg =
        JobCgroup::create(test_host(), &unique("drop"), None, Some(16)).expect("create job cgroup");
    // An hour's sleeps: a drop that waited for them instead of killing them would hang.
    run_in(&cg, "sleep 3600 & sleep 3600 & exit 0");
    let dir = cg.procs_files()[0].parent().unwrap().to_path_buf();
    let list = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap();
    assert_eq!(
        list.split_whitespace().count(),
        2,
        "two sleeps left behind: {list:?}"
    );
    drop(cg);
    assert!(!dir.exists());
    assert_all_gone(&list);
    assert!(!cgroup_after_kill_hit_reported());
}

fn cgroup_after_kill_hit_reported() -> bool {
    // kill_all lowers pids.max to 0; forks refused after that must not count as the job's limit.
    let cg = JobCgroup::create(test_host(), &unique("killcount"), None, Some(16)).expect("create");
    cg.kill_all();
    cg.pids_limit_hit()
}

/// A stale cgroup of the same name (crashed server) is replaced.
#[test]
fn stale_cgroup_is_replaced() {
    let name = unique("stale");
    let a = JobCgroup::create(test_host(), &name, None, Some(8)).expect("first");
    std::mem::forget(a);
    let b = JobCgroup::create(test_host(), &name, None, Some(8)).expect("second over a stale dir");
    drop(b);
}

/// v2: with controllers already enabled above, the parent gets them enabled for jobs.
#[test]
fn v2_prepare_on_fake_tree() {
    let scratch = scratch_dir("fakecg2");
    let root = scratch.path().to_path_buf();
    std::fs::write(root.join("cgroup.subtree_control"), "pids memory").unwrap();
    std::fs::write(root.join("cgroup.procs"), "").unwrap();
    let parent = prepare_v2(&root, &["pids", "memory"], 1, false).expect("prepare");
    assert_eq!(parent, root.join(PARENT_DIR));
    assert_eq!(
        std::fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap(),
        "+pids +memory"
    );
}

/// cgroup v2 for real, on this machine's cgroup2 mount (which holds no pids/memory
/// controller here, so no caps): a job cgroup under a fresh "own" directory, joined
/// through cgroup.procs, killed through cgroup.kill, removed. Fails loudly if this
/// machine has no cgroup2 mount.
#[test]
fn v2_job_cgroup_join_kill_remove() {
    let detected = Layout::detect();
    let mount = detected
        .v2_mount
        .clone()
        .expect("a cgroup2 mount on this machine");
    let own = mount.join(unique("own-v2"));
    std::fs::create_dir(&own).unwrap();
    let layout = Layout {
        version: CgroupVersion::V2,
        hybrid: false,
        v1: Vec::new(),
        v1_pids: None,
        v1_memory: None,
        v2_mount: Some(mount),
        v2_own: Some(own.clone()),
        v2_controllers: Vec::new(),
        v2_at_namespace_root: false,
    };
    let cg = JobCgroup::create_in(&layout, "job", None, None).expect("v2 job cgroup");
    let procs = cg.procs_files();
    assert_eq!(procs, vec![own.join(PARENT_DIR).join("job/cgroup.procs")]);
    // An hour's sleep: removal that waited for it instead of killing it would hang.
    run_in(&cg, "sleep 3600 & exit 0");
    let members = std::fs::read_to_string(&procs[0]).unwrap();
    assert_eq!(
        members.split_whitespace().count(),
        1,
        "the sleep is in the job: {members:?}"
    );
    cg.kill_all();
    cg.remove();
    assert!(!procs[0].parent().unwrap().exists(), "removed");
    assert_all_gone(&members);
    std::fs::remove_dir(own.join(PARENT_DIR)).unwrap();
    std::fs::remove_dir(&own).unwrap();
}

/// Only the job cgroups of the owners named are swept (killed, removed), busy or not;
/// those of any other owner — a live server in this or another PID namespace, another
/// state dir's — and names that are not ours stay.
#[test]
fn only_the_named_owners_cgroups_are_swept() {
    let dead = "1x0badf00d".to_string();
    let other = "2x0000beef";
    let name = |owner: &str, n: u32| format!("{JOB_PREFIX}{owner}-{}{n}", std::process::id());
    let busy = JobCgroup::create(test_host(), &name(&dead, 1), None, Some(8)).expect("create");
    let idle = JobCgroup::create(test_host(), &name(&dead, 2), None, Some(8)).expect("create");
    let others = JobCgroup::create(test_host(), &name(other, 3), None, Some(8)).expect("create");
    let legacy = JobCgroup::create(test_host(), &format!("{JOB_PREFIX}999999-4"), None, Some(8))
        .expect("create");
    run_in(&busy, "sleep 3600 & exit 0");
    let dir = |cg: &JobCgroup| cg.procs_files()[0].parent().unwrap().to_path_buf();
    let (busy_dir, idle_dir, others_dir, legacy_dir) =
        (dir(&busy), dir(&idle), dir(&others), dir(&legacy));
    let members = std::fs::read_to_string(&busy.procs_files()[0]).unwrap();
    std::mem::forget(busy); // as if its server had been SIGKILLed
    std::mem::forget(idle);
    let swept = sweep_owned_by(&Layout::detect(), "1x00000000", std::slice::from_ref(&dead));
    assert!(!busy_dir.exists() && !idle_dir.exists(), "{swept:?}");
    assert!(
        swept.contains(&busy_dir) && swept.contains(&idle_dir),
        "{swept:?}"
    );
    assert_all_gone(&members);
    assert!(others_dir.exists(), "another owner's cgroup is kept");
    assert!(
        legacy_dir.exists(),
        "a name that is not an instance id is kept"
    );
    assert_eq!(owner_of(&name(&dead, 1)), Some(dead.as_str()));
    assert_eq!(owner_of(&format!("{JOB_PREFIX}999999-4")), None);
    drop((others, legacy));
}

/// A fake v1 tree in a scratch directory: its `pids` and `memory` hierarchies and the
/// layout naming them (the scratch directory goes when the first value is dropped).
fn fake_v1(tag: &str, hybrid: bool) -> (tempfile::TempDir, PathBuf, PathBuf, Layout) {
    let scratch = scratch_dir(tag);
    let root = scratch.path().to_path_buf();
    let (pids, mem) = (root.join("pids"), root.join("memory"));
    std::fs::create_dir_all(&pids).unwrap();
    std::fs::create_dir_all(&mem).unwrap();
    let v1 = Layout {
        version: CgroupVersion::V1,
        hybrid,
        v1: Vec::new(),
        v1_pids: Some(pids.clone()),
        v1_memory: Some(mem.clone()),
        v2_mount: None,
        v2_own: None,
        v2_controllers: Vec::new(),
        v2_at_namespace_root: false,
    };
    (scratch, pids, mem, v1)
}

/// Current memory use is read from `memory.usage_in_bytes` (v1) or `memory.current` (v2)
/// of the job's memory cgroup; nothing without a memory cgroup, or from a broken file.
#[test]
fn current_memory_is_read_on_fake_trees() {
    let (scratch, pids, mem, v1) = fake_v1("fakemem", true);
    let root = scratch.path().to_path_buf();
    let capped = JobCgroup::create_in(&v1, "job", Some(64 << 20), Some(8)).expect("v1 fake");
    let dir = mem.join(PARENT_DIR).join("job");
    assert_eq!(capped.current_memory_bytes(), None, "no usage file yet");
    std::fs::write(dir.join("memory.usage_in_bytes"), "41943040\n").unwrap();
    std::fs::write(dir.join("memory.current"), "1\n").unwrap();
    assert_eq!(
        capped.current_memory_bytes(),
        Some(40 << 20),
        "v1 reads usage_in_bytes"
    );
    std::fs::write(dir.join("memory.usage_in_bytes"), "lots\n").unwrap();
    assert_eq!(capped.current_memory_bytes(), None, "garbage is no figure");
    // Without a memory cap there is no memory cgroup: no figure, even if pids has files.
    let uncapped = JobCgroup::create_in(&v1, "nomem", None, Some(8)).expect("v1 fake");
    std::fs::write(
        pids.join(PARENT_DIR).join("nomem/memory.usage_in_bytes"),
        "5\n",
    )
    .unwrap();
    assert_eq!(uncapped.current_memory_bytes(), None);

    // v2: one directory; memory.current, not v1's file.
    let own = root.join("v2own");
    std::fs::create_dir_all(&own).unwrap();
    std::fs::write(own.join("cgroup.subtree_control"), "pids memory").unwrap();
    let v2 = Layout {
        version: CgroupVersion::V2,
        hybrid: false,
        v1: Vec::new(),
        v1_pids: None,
        v1_memory: None,
        v2_mount: Some(root.clone()),
        v2_own: Some(own.clone()),
        v2_controllers: vec!["pids".into(), "memory".into()],
        v2_at_namespace_root: false,
    };
    let cg2 = JobCgroup::create_in(&v2, "job", Some(64 << 20), None).expect("v2 fake");
    let dir2 = own.join(PARENT_DIR).join("job");
    std::fs::write(dir2.join("memory.usage_in_bytes"), "7\n").unwrap();
    assert_eq!(cg2.current_memory_bytes(), None, "v2 has no usage_in_bytes");
    std::fs::write(dir2.join("memory.current"), "123456\n").unwrap();
    assert_eq!(cg2.current_memory_bytes(), Some(123456));
    let v2_uncapped = JobCgroup::create_in(&v2, "nomem", None, None).expect("v2 fake");
    std::fs::write(own.join(PARENT_DIR).join("nomem/memory.current"), "9\n").unwrap();
    assert_eq!(
        v2_uncapped.current_memory_bytes(),
        None,
        "no memory cap, no figure"
    );

    // Plain directories, not cgroups: mark them removed before dropping.
    for cg in [capped, uncapped, cg2, v2_uncapped] {
        cg.removed.store(true, Ordering::SeqCst);
    }
}

/// cgroup v2 for real, with a controller this machine's cgroup2 hierarchy offers at its
/// root (`hugetlb` on this hybrid host, where pids and memory are bound to v1; pids or
/// memory on a v2 host), enabled there for children if it is not: in a cgroup holding
/// processes, enabling a controller for children fails (EBUSY: no internal processes).
/// Away from a cgroup namespace root the server refuses to move the other process there;
/// at one it moves itself and the other into its leaf and enables the controller for
/// `mcp-sandbox-repl/`. Fails loudly without a cgroup2 mount offering any controller.
#[test]
fn v2_prepare_moves_into_the_leaf_for_real() {
    let mount = Layout::detect()
        .v2_mount
        .expect("a cgroup2 mount on this machine");
    let offered = std::fs::read_to_string(mount.join("cgroup.controllers")).unwrap();
    let controller = ["pids", "memory", "hugetlb", "cpu", "io"]
        .into_iter()
        .find(|c| offered.split_whitespace().any(|o| o == *c))
        .unwrap_or_else(|| panic!("the cgroup2 root offers no controller: {offered:?}"));
    std::fs::write(
        mount.join("cgroup.subtree_control"),
        format!("+{controller}"),
    )
    .expect("enable the controller at the cgroup2 root");
    let own = mount.join(unique("v2leaf"));
    std::fs::create_dir(&own).unwrap();
    // Two stand-ins: the server, and an init that started it (tini). Killed, and the
    // directories removed, however the test ends.
    let mut guard = LeafTest {
        kids: (0..2)
            .map(|_| Command::new("sleep").arg("3600").spawn().unwrap())
            .collect(),
        own: own.clone(),
    };
    let kids = &guard.kids;
    for k in kids {
        std::fs::write(own.join("cgroup.procs"), k.id().to_string()).unwrap();
    }
    let (server, init) = (kids[0].id(), kids[1].id());
    let procs = |d: &Path| -> Vec<u32> {
        let mut v: Vec<u32> = std::fs::read_to_string(d.join("cgroup.procs"))
            .unwrap()
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        v.sort();
        v
    };
    let mut both = vec![server, init];
    both.sort();

    let refused = prepare_v2(&own, &[controller], server, false).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("other processes share the cgroup (1 of them)"),
        "{refused}"
    );
    assert_eq!(procs(&own), both, "nobody moved");

    let parent = prepare_v2(&own, &[controller], server, true).expect("prepare at a ns root");
    let leaf = own.join(fs::SERVER_LEAF);
    assert_eq!(procs(&own), Vec::<u32>::new(), "own holds no process");
    assert_eq!(procs(&leaf), both, "both moved into the leaf");
    for d in [&own, &parent] {
        let enabled = std::fs::read_to_string(d.join("cgroup.subtree_control")).unwrap();
        assert!(
            enabled.split_whitespace().any(|c| c == controller),
            "{d:?}: {enabled}"
        );
    }
    let job = parent.join("job");
    std::fs::create_dir(&job).unwrap();
    let has = std::fs::read_to_string(job.join("cgroup.controllers")).unwrap();
    assert!(
        has.contains(controller),
        "a job cgroup gets {controller}: {has}"
    );

    guard.clean();
    for d in [&job, &parent, &leaf, &own] {
        assert!(!d.exists(), "{d:?} left");
    }
}

struct LeafTest {
    kids: Vec<std::process::Child>,
    own: PathBuf,
}

impl LeafTest {
    fn clean(&mut self) {
        for k in &mut self.kids {
            let _ = k.kill();
            let _ = k.wait();
        }
        let (parent, leaf) = (self.own.join(PARENT_DIR), self.own.join(fs::SERVER_LEAF));
        for d in [parent.join("job"), parent, leaf, self.own.clone()] {
            remove_dir_retry(&d, Duration::from_secs(5));
        }
    }
}

impl Drop for LeafTest {
    fn drop(&mut self) {
        self.clean();
    }
}

/// A cgroup a sweep could not remove within its budget is retried later, off the
/// caller's path, and goes once it can: here it is kept busy by a child cgroup (rmdir
/// answers EBUSY) that goes away only after the late sweep has started.
#[test]
fn a_cgroup_still_busy_is_removed_by_the_late_sweep() {
    let cg = JobCgroup::create(test_host(), &unique("late"), None, Some(8)).expect("create");
    let dir = cg.procs_files()[0].parent().unwrap().to_path_buf();
    std::mem::forget(cg); // its server is gone
    let child = dir.join("busy");
    std::fs::create_dir(&child).unwrap();
    assert!(
        std::fs::remove_dir(&dir).is_err(),
        "a cgroup with a child is busy"
    );
    remove_late(vec![dir.clone()]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(dir.exists(), "removed while still busy?");
    std::fs::remove_dir(&child).unwrap();
    // Polled; the deadline only guards a hang.
    let deadline = Instant::now() + Duration::from_secs(60);
    while dir.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !dir.exists(),
        "the late sweep did not remove {}",
        dir.display()
    );
}

/// v1 on a fake tree: the first job makes `<own>/mcp-sandbox-repl`, later jobs (and a
/// stale job cgroup of the same name) find it; the memory cap goes into `memsw` only
/// where that file exists (no swap accounting: none is made).
#[test]
fn v1_job_dirs_parent_made_once_memsw_only_if_present() {
    let (_scratch, pids, mem, v1) = fake_v1("fakev1", false);
    let first = JobCgroup::create_in(&v1, "a", Some(1 << 20), Some(4)).expect("first job");
    let a = mem.join(PARENT_DIR).join("a");
    assert_eq!(
        std::fs::read_to_string(pids.join(PARENT_DIR).join("a/pids.max")).unwrap(),
        "4"
    );
    assert_eq!(
        std::fs::read_to_string(a.join("memory.limit_in_bytes")).unwrap(),
        "1048576"
    );
    assert!(
        !a.join("memory.memsw.limit_in_bytes").exists(),
        "no memsw file made"
    );
    // A second job under the parent that is there; memsw written as the kernel offers it.
    std::fs::create_dir(mem.join(PARENT_DIR).join("b")).unwrap(); // stale, as after a crash
    let b = mem.join(PARENT_DIR).join("b");
    let second = JobCgroup::create_in(&v1, "b", Some(2 << 20), None).expect("stale replaced");
    let made: Vec<_> = std::fs::read_dir(&b)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(made, vec!["memory.limit_in_bytes"], "made anew, no memsw");
    // Where the kernel offers memsw, the cap is written there too.
    let memsw = b.join("memory.memsw.limit_in_bytes");
    std::fs::write(&memsw, "9").unwrap();
    assert!(write_if_present(&memsw, "2097152").unwrap());
    assert_eq!(std::fs::read_to_string(&memsw).unwrap(), "2097152");
    assert!(!write_if_present(&b.join("memory.nothing"), "1").unwrap());
    assert!(!b.join("memory.nothing").exists());
    // Fake trees hold plain files, which no rmdir removes: no teardown (the scratch dir goes).
    std::mem::forget((first, second));
}

/// `remove_if_empty` removes a job cgroup only once nothing is left in it: refused
/// (and the directories kept) while a member runs, done at once after it ended — the
/// proof `SandboxedChild::wait_blocking` takes that nothing of a job is left.
#[test]
fn remove_if_empty_refuses_while_a_member_runs() {
    let cg = JobCgroup::create(test_host(), &unique("ifempty"), Some(64 << 20), Some(8))
        .expect("create job cgroup");
    let files = cg.procs_files();
    let mut cmd = Command::new("sleep");
    cmd.arg("600");
    // SAFETY: join_current only opens and writes files; acceptable in a test child.
    unsafe { cmd.pre_exec(move || join_current(&files).map_err(std::io::Error::other)) };
    let mut member = cmd.spawn().expect("spawn sleep");
    let dirs: Vec<PathBuf> = cg.dirs().cloned().collect();
    assert!(!cg.remove_if_empty(), "removed with a member running");
    assert!(dirs.iter().all(|d| d.exists()), "{dirs:?}");
    member.kill().unwrap();
    member.wait().unwrap();
    assert!(cg.remove_if_empty(), "an emptied cgroup must go at once");
    for d in &dirs {
        assert!(!d.exists(), "{} should be removed", d.display());
    }
    // Dropping it neither kills nor removes again.
    drop(cg);
}
