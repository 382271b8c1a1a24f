//! Job cgroups: one cgroup per sandboxed process tree, holding its memory cap and its
//! process-count cap (the limit that binds even when the server runs as root, where
//! RLIMIT_NPROC does not), reporting peak memory and which cap was hit, and killing
//! everything in it. Works on cgroup v1 (separate `pids` / `memory` hierarchies, also
//! the "hybrid" layout) and on a delegated cgroup v2 subtree; detected at runtime.
//!
//! Job cgroups live under the server's *own* cgroup in each hierarchy,
//! `<own>/mcp-sandbox-repl/<name>`, so whatever limits the server itself runs under also
//! hold for its jobs. On v2 the no-internal-processes rule means `<own>` may not hold
//! processes while it hands controllers to children: if the server is alone in `<own>`
//! it moves itself into the leaf `<own>/mcp-sandbox-repl.server` first; if other
//! processes share `<own>`, it moves them into that leaf too when `<own>` is the root of
//! its cgroup namespace (a container's: an init such as tini), and otherwise reports v2
//! cgroups as not delegated. Where no job cgroup can be made, `probe::per_job` says so
//! and names the limits of `<own>` ([`ambient`]) that still hold the server and its jobs
//! together.
//!
//! Parent side: [`JobCgroup::create`] before spawning; the launcher child calls
//! `launcher::cgroup::join_current` with [`JobCgroup::procs_files`] before anything else.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub(crate) mod ambient;
mod fs;
pub(crate) mod layout;
mod v2;

pub(crate) use fs::{PARENT_DIR, read_kernel_file};
use fs::{io, mkdir_ok_exists};

#[cfg(test)]
use v2::prepare_v2;
use v2::{V2Parent, v2_parent};

pub(crate) use crate::sandbox::launcher::cgroup::CgroupError;
pub(crate) use layout::{CgroupVersion, Layout};

/// What a runtime knows of this machine's cgroups: the layout (detected on first use)
/// and, on v2, the prepared parent of the job cgroups (prepared once: it may move the
/// server into its leaf). Held by the [`Runtime`](super::runtime::Runtime); `doctor`'s
/// probe makes its own.
#[derive(Debug, Default)]
pub(crate) struct CgroupHost {
    layout: OnceLock<Layout>,
    v2_parent: OnceLock<Result<PathBuf, std::sync::Arc<CgroupError>>>,
}

impl CgroupHost {
    pub(crate) fn new() -> CgroupHost {
        CgroupHost::default()
    }

    pub(crate) fn layout(&self) -> &Layout {
        self.layout.get_or_init(Layout::detect)
    }
}

/// The cgroup(s) of one job. Dropping it kills every process left in it and removes it.
#[derive(Debug)]
pub(crate) struct JobCgroup {
    version: CgroupVersion,
    /// pids cgroup dir (v2: the one dir).
    pids: Option<PathBuf>,
    /// memory cgroup dir (v1 only; v2 uses `pids`).
    memory: Option<PathBuf>,
    has_memory: bool,
    killed: AtomicBool,
    /// pids.events "max" count when kill_all lowered pids.max (forks refused after that are ours).
    pids_max_before_kill: AtomicU64,
    removed: AtomicBool,
}

impl JobCgroup {
    /// Create `<own>/mcp-sandbox-repl/<name>` with the given caps. A stale cgroup of the same
    /// name (a crashed earlier server) is emptied and replaced. The pids controller is
    /// always used (it is how `kill_all` finds every process); memory only with a cap.
    pub(crate) fn create(
        host: &CgroupHost,
        name: &str,
        memory_bytes: Option<u64>,
        max_pids: Option<u64>,
    ) -> Result<JobCgroup, CgroupError> {
        Self::create_with(
            host.layout(),
            Some(&host.v2_parent),
            name,
            memory_bytes,
            max_pids,
        )
    }

    /// As [`create`](Self::create) under `layout` (tests pass fake ones), the v2 parent
    /// prepared anew.
    #[cfg(test)]
    pub(crate) fn create_in(
        layout: &Layout,
        name: &str,
        memory_bytes: Option<u64>,
        max_pids: Option<u64>,
    ) -> Result<JobCgroup, CgroupError> {
        Self::create_with(layout, None, name, memory_bytes, max_pids)
    }

    fn create_with(
        layout: &Layout,
        prepared: Option<&V2Parent>,
        name: &str,
        memory_bytes: Option<u64>,
        max_pids: Option<u64>,
    ) -> Result<JobCgroup, CgroupError> {
        let mut cg = JobCgroup {
            version: layout.version,
            pids: None,
            memory: None,
            has_memory: memory_bytes.is_some(),
            killed: AtomicBool::new(false),
            pids_max_before_kill: AtomicU64::new(0),
            removed: AtomicBool::new(false),
        };
        match layout.version {
            CgroupVersion::V2 => {
                v2_offers(layout, max_pids.is_some(), memory_bytes.is_some())?;
                let parent = v2_parent(layout, prepared)?;
                let dir = parent.join(name);
                make_fresh(&dir)?;
                cg.pids = Some(dir.clone());
                if let Some(max) = max_pids {
                    write(&dir.join("pids.max"), &max.to_string())?;
                }
                if let Some(bytes) = memory_bytes {
                    write(&dir.join("memory.max"), &bytes.to_string())?;
                    // Swap would let the job grow past the cap; best effort (no swap controller on some hosts).
                    let _ = std::fs::write(dir.join("memory.swap.max"), "0");
                }
            }
            CgroupVersion::V1 | CgroupVersion::None => {
                let pids_own = layout.v1_pids.clone().ok_or(CgroupError::NoController {
                    controller: "pids",
                    what: "process",
                })?;
                let dir = v1_job_dir(&pids_own, name)?;
                cg.pids = Some(dir.clone());
                if let Some(max) = max_pids {
                    write(&dir.join("pids.max"), &max.to_string())?;
                }
                if let Some(bytes) = memory_bytes {
                    let mem_own = layout.v1_memory.clone().ok_or(CgroupError::NoController {
                        controller: "memory",
                        what: "memory",
                    })?;
                    let dir = v1_job_dir(&mem_own, name)?;
                    cg.memory = Some(dir.clone());
                    write(&dir.join("memory.limit_in_bytes"), &bytes.to_string())?;
                    // memsw = memory + swap; equal to the cap means no swap (absent without swap accounting).
                    write_if_present(&dir.join("memory.memsw.limit_in_bytes"), &bytes.to_string())?;
                }
            }
        }
        Ok(cg)
    }

    /// The membership files the launcher child writes "0" into ([`join_current`]):
    /// v1 `tasks` (fast single-thread move), v2 `cgroup.procs`.
    pub(crate) fn procs_files(&self) -> Vec<PathBuf> {
        let file = if self.version == CgroupVersion::V2 {
            "cgroup.procs"
        } else {
            "tasks"
        };
        self.dirs().map(|d| d.join(file)).collect()
    }

    fn dirs(&self) -> impl Iterator<Item = &PathBuf> {
        self.pids.iter().chain(self.memory.iter())
    }

    fn memory_dir(&self) -> Option<&PathBuf> {
        match self.version {
            CgroupVersion::V2 if self.has_memory => self.pids.as_ref(),
            _ => self.memory.as_ref(),
        }
    }

    /// Highest memory use of the job (memory cap set only). Read by the tests only.
    #[cfg(test)]
    pub(crate) fn peak_memory_bytes(&self) -> Option<u64> {
        let dir = self.memory_dir()?;
        let file = if self.version == CgroupVersion::V2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        read_kernel_file(&dir.join(file)).ok()?.trim().parse().ok()
    }

    /// The job's memory use now, as the kernel charges it to the job's memory cgroup
    /// (v1 `memory.usage_in_bytes`, v2 `memory.current`: anonymous pages, page cache and
    /// tmpfs pages of every process in it, each page counted once however many processes
    /// share it copy-on-write). `None` without a memory cgroup (no memory cap).
    pub(crate) fn current_memory_bytes(&self) -> Option<u64> {
        memory_usage_in(self.memory_dir()?, self.version)
    }

    /// Whether the kernel OOM-killed a process of the job because of the memory cap.
    pub(crate) fn memory_limit_hit(&self) -> bool {
        let Some(dir) = self.memory_dir() else {
            return false;
        };
        let (file, key) = if self.version == CgroupVersion::V2 {
            ("memory.events", "oom_kill")
        } else {
            ("memory.oom_control", "oom_kill")
        };
        match read_key(&dir.join(file), key) {
            Some(n) => n > 0,
            // Old v1 kernels have no oom_kill count: fall back to "the cap was reached".
            None => read_u64(&dir.join("memory.failcnt")).is_some_and(|n| n > 0),
        }
    }

    /// Whether a fork or clone was refused because of the process-count cap.
    pub(crate) fn pids_limit_hit(&self) -> bool {
        let Some(dir) = &self.pids else { return false };
        if self.killed.load(Ordering::SeqCst) {
            // Read before the kill lowered pids.max (the count after it is ours).
            return self.pids_max_before_kill.load(Ordering::SeqCst) > 0;
        }
        read_key(&dir.join("pids.events"), "max").is_some_and(|n| n > 0)
    }

    /// SIGKILL every process in the job. v2 with `cgroup.kill` does it atomically; otherwise
    /// forks are stopped first (pids.max = 0) and the member list is killed until empty.
    pub(crate) fn kill_all(&self) {
        let Some(dir) = &self.pids else { return };
        if !self.killed.swap(true, Ordering::SeqCst) {
            let before = read_key(&dir.join("pids.events"), "max").unwrap_or(0);
            self.pids_max_before_kill.store(before, Ordering::SeqCst);
        }
        if self.version == CgroupVersion::V2 && std::fs::write(dir.join("cgroup.kill"), "1").is_ok()
        {
            return;
        }
        // Usual case at the end of a job: nothing left, nothing to freeze or kill.
        if has_no_member(dir) {
            return;
        }
        let procs = dir.join("cgroup.procs");
        let _ = std::fs::write(dir.join("pids.max"), "0");
        let deadline = Instant::now() + Duration::from_millis(500);
        let mut killed: Vec<i32> = Vec::new();
        loop {
            let Ok(list) = read_kernel_file(&procs) else {
                return;
            };
            let pids: Vec<i32> = list
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            if pids.is_empty() || Instant::now() > deadline {
                return;
            }
            let mut new = false;
            for pid in pids {
                if pid > 0 && !killed.contains(&pid) {
                    new = true;
                    killed.push(pid);
                }
                // SAFETY: kill(2) with a positive pid read from our own job cgroup.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if !new {
                // Only dying or zombie members left (they leave once reaped).
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Remove the cgroup directories if no process is left in them, at once (no kill, no
    /// retry): true when they are all gone. An rmdir succeeds only on a cgroup without a
    /// member (one still exiting counts until it has left), so true proves that nothing
    /// of the job is left. False when a process is still there (EBUSY); then
    /// [`kill_all`](Self::kill_all) and [`remove`](Self::remove) as usual.
    pub(crate) fn remove_if_empty(&self) -> bool {
        for dir in self.dirs() {
            match std::fs::remove_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(_) => return false,
            }
        }
        self.removed.store(true, Ordering::SeqCst);
        true
    }

    /// Remove the cgroup directories (retrying briefly while killed processes exit).
    pub(crate) fn remove(&self) {
        if self.removed.swap(true, Ordering::SeqCst) {
            return;
        }
        for dir in self.dirs() {
            remove_dir_retry(dir, Duration::from_secs(1));
        }
    }
}

impl Drop for JobCgroup {
    fn drop(&mut self) {
        if !self.removed.load(Ordering::SeqCst) {
            self.kill_all();
            self.remove();
        }
    }
}

/// v2: the server's cgroup is offered the controllers a job needs (`pids`: a process cap;
/// `memory`: a memory cap), else which one it is not, and where it looked.
fn v2_offers(layout: &Layout, pids: bool, memory: bool) -> Result<(), CgroupError> {
    for (wanted, controller, what) in [(pids, "pids", "process"), (memory, "memory", "memory")] {
        let offered = layout.v2_controllers.iter().any(|c| c == controller);
        if let (true, false, Some(own)) = (wanted, offered, &layout.v2_own) {
            return Err(CgroupError::NotOffered {
                controller,
                what,
                dir: own.clone(),
                offered: match layout.v2_controllers.join(" ") {
                    s if s.is_empty() => "none".into(),
                    s => s,
                },
            });
        }
    }
    Ok(())
}

/// The owner (the instance id of the server that made it) in a job cgroup's name
/// (`msr-<owner>-<n>`, see `spawn`), if it has one.
pub(crate) fn owner_of(name: &str) -> Option<&str> {
    let rest = name.strip_prefix(JOB_PREFIX)?;
    let (owner, n) = rest.rsplit_once('-')?;
    n.parse::<u64>().ok()?;
    super::instance::is_id(owner).then_some(owner)
}

/// Prefix of the job cgroups the server names (`msr-<instance id>-<n>`).
pub(crate) const JOB_PREFIX: &str = "msr-";

/// Job cgroups of the servers `owners` — servers known to have ended (the caller holds
/// their ownership locks, `app::owners`): kill whatever is still in them, then remove
/// them. Every other cgroup stays, whoever made it and whatever `/proc` shows: a server
/// in another PID namespace, or of another state dir, is never disturbed. Returns the
/// directories removed (best effort; at server start).
pub(crate) fn sweep_owned_by(layout: &Layout, own: &str, owners: &[String]) -> Vec<PathBuf> {
    if owners.is_empty() {
        return Vec::new();
    }
    sweep_where(layout, |owner| {
        owner != own && owners.iter().any(|o| o == owner)
    })
}

/// Server exit: kill and remove this server's own job cgroups that are still there (a
/// job whose end was still being recorded when the server stopped: its cgroup would
/// otherwise outlive the server, with nobody left to sweep it if its state dir goes).
pub(crate) fn remove_own(layout: &Layout, own: &str) -> Vec<PathBuf> {
    sweep_where(layout, |owner| owner == own)
}

/// How long a sweep waits for one killed cgroup to empty: its killed processes leave it
/// only once reaped, and orphans of a dead server are reaped by the host's init, which
/// may take seconds on a busy machine (500 ms left cgroups behind for good).
const SWEEP_RMDIR_BUDGET: Duration = Duration::from_secs(5);

/// Kill and remove every job cgroup whose owner `take` accepts; returns what was removed.
fn sweep_where(layout: &Layout, take: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let parents = [&layout.v1_pids, &layout.v1_memory, &layout.v2_own];
    let mut swept = Vec::new();
    let mut busy = Vec::new();
    for parent in parents.into_iter().flatten().map(|p| p.join(PARENT_DIR)) {
        let Ok(entries) = std::fs::read_dir(&parent) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            let Some(owner) = name.to_str().and_then(owner_of) else {
                continue;
            };
            if !take(owner) {
                continue;
            }
            let dir = entry.path();
            if std::fs::write(dir.join("cgroup.kill"), "1").is_err() {
                let _ = std::fs::write(dir.join("pids.max"), "0");
                kill_members(&dir);
            }
            remove_dir_retry(&dir, SWEEP_RMDIR_BUDGET);
            if dir.exists() {
                busy.push(dir);
            } else {
                swept.push(dir);
            }
        }
    }
    remove_late(busy);
    swept
}

/// How long cgroups still busy after a sweep's budget keep being retried, off the caller's
/// path (seen here: killed job processes still leaving their cgroups after 5 s on a loaded
/// machine, which then stayed for good).
const SWEEP_LATE_BUDGET: Duration = Duration::from_secs(120);

/// Keep killing what is in `dirs` and removing them, on a thread of its own, for up to
/// [`SWEEP_LATE_BUDGET`]; says what it removed.
fn remove_late(dirs: Vec<PathBuf>) {
    if dirs.is_empty() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("cgroup-sweep-late".into())
        .spawn(move || {
            let deadline = Instant::now() + SWEEP_LATE_BUDGET;
            let (mut left, mut removed) = (dirs, Vec::new());
            while !left.is_empty() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
                left.retain(|dir| {
                    kill_members(dir);
                    let busy = std::fs::remove_dir(dir).is_err() && dir.exists();
                    if !busy {
                        removed.push(dir.clone());
                    }
                    busy
                });
            }
            if left.is_empty() {
                tracing::info!(removed = ?removed, "removed the job cgroups still busy at the sweep");
            } else {
                tracing::warn!(left = ?left, "job cgroups still busy after the late sweep");
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the late cgroup sweep: {e}");
    }
}

/// SIGKILL every process listed in `dir`'s cgroup.procs until none is left (briefly).
fn kill_members(dir: &Path) {
    let deadline = Instant::now() + Duration::from_millis(500);
    while Instant::now() < deadline {
        let Ok(list) = read_kernel_file(&dir.join("cgroup.procs")) else {
            return;
        };
        let pids: Vec<i32> = list
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            // SAFETY: kill(2) of members of a job cgroup whose server is gone.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A job's fresh cgroup `name` in the v1 hierarchy whose server cgroup is `own`.
fn v1_job_dir(own: &Path, name: &str) -> Result<PathBuf, CgroupError> {
    let parent = own.join(PARENT_DIR);
    let dir = parent.join(name);
    // The parent is usually there (made for an earlier job): then one mkdir, not two.
    if let Err(e) = std::fs::create_dir(&dir) {
        if e.kind() == ErrorKind::NotFound {
            mkdir_ok_exists(&parent)?;
        }
        make_fresh(&dir)?;
    }
    Ok(dir)
}

/// Create `dir`; if it already exists (left by a crashed run), empty and recreate it.
fn make_fresh(dir: &Path) -> Result<(), CgroupError> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            kill_members(dir);
            remove_dir_retry(dir, Duration::from_millis(500));
            std::fs::create_dir(dir).map_err(io("create", dir))
        }
        Err(e) => Err(CgroupError::Io {
            action: "create",
            path: dir.to_path_buf(),
            source: e,
        }),
    }
}

fn remove_dir_retry(dir: &Path, budget: Duration) {
    let deadline = Instant::now() + budget;
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == ErrorKind::NotFound => return,
            Err(e) if Instant::now() < deadline => {
                tracing::trace!(dir = %dir.display(), error = %e, "cgroup busy, retrying rmdir");
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => {
                tracing::info!(dir = %dir.display(), error = %e, "job cgroup still busy");
                return;
            }
        }
    }
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(io("write", path))
}

/// Write `value` into `path` if the file is there (opened without `O_CREAT`: a missing
/// cgroup file is a feature this kernel lacks, and one open tells); whether it was.
fn write_if_present(path: &Path, value: &str) -> Result<bool, CgroupError> {
    use std::io::Write;
    match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(mut file) => file
            .write_all(value.as_bytes())
            .map(|()| true)
            .map_err(io("write", path)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io("write", path)(e)),
    }
}

/// Whether the cgroup directory `dir` lists no member (false when it cannot be read).
fn has_no_member(dir: &Path) -> bool {
    read_kernel_file(&dir.join("cgroup.procs")).is_ok_and(|l| l.trim().is_empty())
}

fn read_u64(path: &Path) -> Option<u64> {
    read_kernel_file(path).ok()?.trim().parse().ok()
}

/// The current memory use recorded in memory cgroup directory `dir` of a `version` hierarchy.
fn memory_usage_in(dir: &Path, version: CgroupVersion) -> Option<u64> {
    let file = match version {
        CgroupVersion::V2 => "memory.current",
        CgroupVersion::V1 | CgroupVersion::None => "memory.usage_in_bytes",
    };
    read_u64(&dir.join(file))
}

/// Value of `key` in a flat-keyed cgroup file ("key value" per line).
fn read_key(path: &Path, key: &str) -> Option<u64> {
    let text = read_kernel_file(path).ok()?;
    text.lines().find_map(|line| {
        let mut it = line.split_whitespace();
        (it.next() == Some(key))
            .then(|| it.next()?.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests;
