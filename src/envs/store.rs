//! The stores installs and scripts write that outlive a job — a session's uv cache and
//! venv — kept private to one [`Owner`], and the disk they may take.
//!
//! Isolation: every session has its own uv cache, `<cache root>/sessions/<principal>/
//! <session>`; a job of the session is given (by the installer's policy) write access to
//! that cache, its session's venv, a transient environment of its own and its private temp
//! dir, and sees no other session's stores in its view. What a package's build hook writes
//! into a cache is therefore read only by later installs and scripts of the same session.
//!
//! Disk: [`Stores`] keeps what each owner's stores take (allocated blocks, see
//! [`measure`]) and bounds it per owner ([`DiskCaps::session`]) and over all owners
//! ([`DiskCaps::total`]):
//! - [`Stores::admit`] before a job: an owner over its bound has its uv cache cleared (if
//!   no other job of it runs), the least recently used idle owners' caches are cleared
//!   while the total is over; if that is not enough the job is refused in words
//!   ([`EnvError::StoreFull`]);
//! - [`Lease::exceeded`] while a uv step runs: the step's writable stores are measured
//!   again and again (with the files its processes hold open after unlinking them), and
//!   the step is killed when its owner or the total goes over ([`DiskHit`]).
//!
//! Locks: `inner` (a std mutex) is held only to read or update the accounts and to rename
//! a cache away, never across a measure or an await.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::dir::Dir;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{FileStat, Mode, SFlag};

use super::EnvError;

/// Default bound on one session's stores (uv cache + venv + what its running jobs write).
pub(crate) const DEFAULT_SESSION_CAP: u64 = 16 << 30;
/// Default bound on the stores of all sessions together.
pub(crate) const DEFAULT_TOTAL_CAP: u64 = 64 << 30;

/// Every file, directory or link counts at least this much: what an inode costs a file
/// system in practice, so a job cannot make millions of empty files for free (and the
/// measure of a store never walks more than `bound / MIN_CHARGE` entries).
pub(crate) const MIN_CHARGE: u64 = 4096;

/// Deepest relative path the measure follows (bytes); a deeper tree counts as over the
/// bound (no package needs one; the kernel's path limit is 4096).
const MAX_REL_PATH: usize = 3000;

/// Shortest pause between two measures of a running step; the pause is also at least
/// [`PAUSE_FACTOR`] times what the last measure took, so measuring costs at most about a
/// tenth of one core however large the store.
const MIN_PAUSE: Duration = Duration::from_millis(50);
const PAUSE_FACTOR: u32 = 10;

/// The disk bounds of the stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskCaps {
    /// Bytes one owner's stores may take (`--env-disk-cap`).
    pub session: u64,
    /// Bytes the stores of all owners may take together (`--env-disk-total`).
    pub total: u64,
}

impl Default for DiskCaps {
    fn default() -> Self {
        DiskCaps {
            session: DEFAULT_SESSION_CAP,
            total: DEFAULT_TOTAL_CAP,
        }
    }
}

/// Whose stores: the key of every per-session store. `principal` is who the client
/// authenticated as; `None` is the one local principal (stdio, a single HTTP token). The
/// same session name under two principals is two owners, two caches.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner {
    principal: Option<String>,
    session: String,
}

impl Owner {
    /// The local principal's session `session` (a valid session name).
    pub fn local(session: &str) -> Result<Owner, EnvError> {
        Owner::new(None, session)
    }

    /// `principal`'s session `session`.
    pub fn new(principal: Option<&str>, session: &str) -> Result<Owner, EnvError> {
        if !crate::names::is_valid_session_name(session) {
            return Err(EnvError::BadSessionName(session.to_string()));
        }
        Ok(Owner {
            principal: principal.map(str::to_string),
            session: session.to_string(),
        })
    }

    pub fn session(&self) -> &str {
        &self.session
    }

    /// `<principal>/<session>` below the cache root: `local` for the local principal,
    /// `p-<hex of the name>` for another (any name, one directory, no collision).
    fn rel_dir(&self) -> PathBuf {
        let principal = match &self.principal {
            None => "local".to_string(),
            Some(p) => format!("p-{}", hex(p.as_bytes())),
        };
        Path::new(&principal).join(&self.session)
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.principal {
            None => write!(f, "session {:?}", self.session),
            Some(p) => write!(f, "session {:?} of {p:?}", self.session),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A size in words ("64.0 MiB").
pub(crate) fn bytes_words(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// What a measure found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Measured {
    /// Bytes allocated (every inode at least [`MIN_CHARGE`]); once past the measure's
    /// `stop_above`, counting stopped there.
    pub bytes: u64,
    /// A directory deeper than the measure follows was found (counts as over any bound).
    pub too_deep: bool,
}

struct Walk {
    bytes: u64,
    stop_above: u64,
    too_deep: bool,
    /// (device, inode) of files with more than one link, counted once.
    linked: HashSet<(u64, u64)>,
}

impl Walk {
    fn new(stop_above: u64) -> Walk {
        Walk {
            bytes: 0,
            stop_above,
            too_deep: false,
            linked: HashSet::new(),
        }
    }

    fn done(&self) -> bool {
        self.too_deep || self.bytes > self.stop_above
    }

    fn charge(&mut self, dev: u64, ino: u64, nlink: u64, blocks: u64, is_dir: bool) {
        if !is_dir && nlink != 1 && !self.linked.insert((dev, ino)) {
            return;
        }
        self.bytes = self
            .bytes
            .saturating_add(blocks.saturating_mul(512).max(MIN_CHARGE));
    }

    fn charge_stat(&mut self, st: &FileStat) {
        let is_dir = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR;
        self.charge(
            st.st_dev,
            st.st_ino,
            st.st_nlink,
            u64::try_from(st.st_blocks).unwrap_or(0),
            is_dir,
        );
    }

    /// The tree at `root` (a directory or a file; nothing if missing). Every directory is
    /// opened beneath `root` without following any symlink or crossing a mount, so a job
    /// that swaps a directory of its store for a link never sends the measure elsewhere;
    /// at most two descriptors are open at a time whatever the depth.
    fn tree(&mut self, root: &Path) {
        let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
        let Ok(root_fd) = nix::fcntl::open(root, flags | OFlag::O_PATH, Mode::empty()) else {
            return;
        };
        let Ok(st) = nix::sys::stat::fstat(&root_fd) else {
            return;
        };
        self.charge_stat(&st);
        if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFDIR {
            return;
        }
        let how = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW)
            .resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS
                    | ResolveFlag::RESOLVE_NO_XDEV,
            );
        let mut todo: Vec<PathBuf> = vec![PathBuf::from(".")];
        while let Some(rel) = todo.pop() {
            if self.done() {
                return;
            }
            let Ok(fd) = openat2(root_fd.as_fd(), &rel, how) else {
                continue; // gone since it was listed, or swapped for something else
            };
            self.directory(fd, &rel, &mut todo);
        }
    }

    fn directory(&mut self, fd: OwnedFd, rel: &Path, todo: &mut Vec<PathBuf>) {
        let Ok(stat_fd) = fd.try_clone() else {
            return;
        };
        let Ok(mut dir) = Dir::from_fd(fd) else {
            return;
        };
        for entry in dir.iter().flatten() {
            let name = entry.file_name();
            let bytes = name.to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            let Ok(st) = nix::sys::stat::fstatat(
                stat_fd.as_fd(),
                name,
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            ) else {
                continue;
            };
            self.charge_stat(&st);
            if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR {
                let child =
                    rel.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(bytes));
                if child.as_os_str().len() > MAX_REL_PATH {
                    self.too_deep = true;
                }
                todo.push(child);
            }
            if self.done() {
                return;
            }
        }
    }

    /// Files the processes of the job rooted at `pid` hold open after unlinking them (no
    /// name left in any store, still taking disk until closed), on the devices of `devs`.
    fn open_unlinked(&mut self, pid: u32, devs: &HashSet<u64>) {
        for p in descendants(pid) {
            let Ok(fds) = std::fs::read_dir(format!("/proc/{p}/fd")) else {
                continue;
            };
            for fd in fds.flatten() {
                // `metadata` follows the magic link to the open file itself.
                let Ok(m) = std::fs::metadata(fd.path()) else {
                    continue;
                };
                if m.is_file() && m.nlink() == 0 && devs.contains(&m.dev()) {
                    if !self.linked.insert((m.dev(), m.ino())) {
                        continue;
                    }
                    self.bytes = self
                        .bytes
                        .saturating_add(m.blocks().saturating_mul(512).max(MIN_CHARGE));
                }
            }
        }
    }
}

/// `pid` and every process below it (through `/proc/<pid>/task/*/children`).
fn descendants(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() && out.len() < 100_000 {
        let p = out[i];
        i += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let Ok(text) = std::fs::read_to_string(t.path().join("children")) else {
                continue;
            };
            out.extend(
                text.split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
    }
    out
}

/// What the trees at `roots` take on disk: allocated blocks (a sparse file counts only
/// what it allocated, a fallocated one all it reserved), every inode at least
/// [`MIN_CHARGE`], a file with several links once. Symlinks are not followed. Stops
/// counting once past `stop_above`.
pub(crate) fn measure(roots: &[PathBuf], stop_above: u64) -> Measured {
    let mut walk = Walk::new(stop_above);
    for root in roots {
        walk.tree(root);
        if walk.done() {
            break;
        }
    }
    Measured {
        bytes: walk.bytes,
        too_deep: walk.too_deep,
    }
}

/// A step was stopped at a disk bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskHit {
    pub owner: Owner,
    /// What the owner's stores took when measured.
    pub used: u64,
    /// The bound that was passed.
    pub bound: u64,
    /// The total bound (all sessions), not the session's.
    pub total: bool,
    /// The total bound itself.
    pub total_cap: u64,
    /// A directory deeper than the measure follows.
    pub too_deep: bool,
}

impl DiskHit {
    /// The sentence a job's report carries.
    pub fn words(&self) -> String {
        let what = if self.too_deep {
            format!(
                "made a directory tree deeper than {MAX_REL_PATH} bytes of path in {}'s package stores, which the disk measure does not follow",
                self.owner
            )
        } else if self.total {
            format!(
                "took the package stores of all sessions past their disk bound of {} (--env-disk-total): {}'s reached {} allocated, where {} was left for them",
                bytes_words(self.total_cap),
                self.owner,
                bytes_words(self.used),
                bytes_words(self.bound)
            )
        } else {
            format!(
                "reached the disk bound of {}'s package stores (uv cache, venv, temporary environment): {} allocated, {} allowed (--env-disk-cap)",
                self.owner,
                bytes_words(self.used),
                bytes_words(self.bound)
            )
        };
        format!(
            "killed: the job {what}. The session's next install clears its uv cache while the bound is still passed"
        )
    }
}

/// One part of an owner's stores, with what it took when last measured.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Part {
    /// A store tree (the uv cache, a venv, a transient environment, a host temp dir).
    Tree(PathBuf),
    /// Files a running job holds open after unlinking them.
    OpenFiles(u64),
}

#[derive(Debug, Default)]
struct Account {
    parts: HashMap<Part, u64>,
    /// The session's venv (the manager tells; managed ones are found at start).
    venv: Option<PathBuf>,
    /// Running jobs and the extra trees each writes (transient env, host temp dir).
    jobs: HashMap<u64, Vec<PathBuf>>,
    last_used: Option<Instant>,
    /// Bumped by whatever may change the stores or their list without a measure: a job
    /// admitted or ended, another venv, a cache set aside.
    epoch: u64,
    /// When `parts` were last measured whole with no job running and nothing changed
    /// since (`epoch` then): admission may use them instead of measuring again.
    settled: Option<(u64, Instant)>,
    /// Measures started, and the newest of them whose figures are in `parts`: one that
    /// ends after a newer one (an idle-time walk starved under load) brings older
    /// figures and is dropped.
    measures_started: u64,
    measure_applied: u64,
}

impl Account {
    /// Take the figures of measure `seq` (started at `epoch` with no job running, if
    /// `start`), unless a newer measure's are in already.
    fn apply_measure(&mut self, seq: u64, start: Option<u64>, measured: Vec<(PathBuf, u64)>) {
        if seq < self.measure_applied {
            return;
        }
        self.measure_applied = seq;
        for (tree, bytes) in measured {
            self.parts.insert(Part::Tree(tree), bytes);
        }
        if start.is_some_and(|e| e == self.epoch) && self.jobs.is_empty() {
            self.settled = Some((self.epoch, Instant::now()));
        }
    }

    fn used(&self) -> u64 {
        self.parts.values().fold(0u64, |a, b| a.saturating_add(*b))
    }

    /// Something may have changed the stores since they were last measured.
    fn touch(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        self.settled = None;
    }

    /// The figures of the last measure still stand: it was taken whole, with no job
    /// running, nothing changed since, less than [`SETTLED_FOR`] ago.
    fn settled(&self) -> bool {
        self.jobs.is_empty()
            && self
                .settled
                .is_some_and(|(epoch, at)| epoch == self.epoch && at.elapsed() < SETTLED_FOR)
    }
}

/// How long the figures measured when a session's last job ended serve its next
/// admission (within its bound) instead of another measure: only the server's own jobs
/// write a session's stores, and each is measured as it ends; this bounds what another
/// server sharing the state dir could have added meanwhile.
const SETTLED_FOR: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
struct Inner {
    accounts: HashMap<Owner, Account>,
}

/// The per-owner stores of one server: where they are, what they take, their bounds.
#[derive(Debug)]
pub struct Stores {
    cache_root: PathBuf,
    /// `<state_dir>/venvs`: the managed venvs of the local principal.
    venvs_dir: PathBuf,
    /// The cache root is the state dir's own (`<state>/uv-cache`), so what the shared
    /// cache of earlier versions left there may be removed.
    own_root: bool,
    caps: DiskCaps,
    inner: Mutex<Inner>,
    scanned: tokio::sync::OnceCell<()>,
    next_job: AtomicU64,
}

impl Stores {
    pub fn new(cfg: &super::EnvConfig) -> Arc<Stores> {
        let cache_root = cfg.uv_cache_root();
        Arc::new(Stores {
            own_root: cache_root == cfg.state_dir.join("uv-cache"),
            cache_root,
            venvs_dir: cfg.state_dir.join("venvs"),
            caps: cfg.disk,
            inner: Mutex::new(Inner::default()),
            scanned: tokio::sync::OnceCell::new(),
            next_job: AtomicU64::new(0),
        })
    }

    pub fn caps(&self) -> DiskCaps {
        self.caps
    }

    /// The directory holding every owner's cache.
    fn sessions_dir(&self) -> PathBuf {
        self.cache_root.join("sessions")
    }

    /// `owner`'s own uv cache.
    pub fn cache_dir(&self, owner: &Owner) -> PathBuf {
        self.sessions_dir().join(owner.rel_dir())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tell which venv `owner` uses (counted in its stores).
    pub fn set_venv(&self, owner: &Owner, venv: &Path) {
        let mut inner = self.lock();
        let account = inner.accounts.entry(owner.clone()).or_default();
        if account.venv.as_deref() != Some(venv) {
            if let Some(old) = account.venv.take() {
                account.parts.remove(&Part::Tree(old));
            }
            account.venv = Some(venv.to_path_buf());
            account.touch();
        }
    }

    /// What `owner`'s stores took when last measured.
    pub fn used(&self, owner: &Owner) -> u64 {
        self.lock().accounts.get(owner).map_or(0, Account::used)
    }

    /// What all owners' stores took when last measured.
    pub fn total(&self) -> u64 {
        self.lock()
            .accounts
            .values()
            .fold(0u64, |a, acc| a.saturating_add(acc.used()))
    }

    /// The trees of `owner`'s stores: its cache, its venv, its running jobs' extras.
    fn trees(&self, owner: &Owner) -> Vec<PathBuf> {
        let inner = self.lock();
        let mut out = vec![self.cache_dir(owner)];
        if let Some(account) = inner.accounts.get(owner) {
            out.extend(account.venv.iter().cloned());
            for extra in account.jobs.values().flatten() {
                if !out.contains(extra) {
                    out.push(extra.clone());
                }
            }
        }
        out
    }

    /// Measure the trees of `owner` again (each part on its own) and record them.
    async fn remeasure(&self, owner: &Owner) -> u64 {
        self.remeasure_at(owner, Urgency::Needed).await
    }

    /// [`Stores::remeasure`], the walk at `urgency` (see [`Urgency`]).
    async fn remeasure_at(&self, owner: &Owner, urgency: Urgency) -> u64 {
        let (start, seq) = {
            let mut inner = self.lock();
            let account = inner.accounts.entry(owner.clone()).or_default();
            account.measures_started += 1;
            let start = account.jobs.is_empty().then_some(account.epoch);
            (start, account.measures_started)
        };
        let trees = self.trees(owner);
        let stop = u64::MAX;
        let walk = move || {
            trees
                .into_iter()
                .map(|t| {
                    let m = measure(std::slice::from_ref(&t), stop);
                    (t, m.bytes)
                })
                .collect::<Vec<_>>()
        };
        let measured = match urgency {
            Urgency::Needed => tokio::task::spawn_blocking(walk).await.unwrap_or_default(),
            Urgency::Idle => in_idle_time(walk).await.unwrap_or_default(),
        };
        let mut inner = self.lock();
        let account = inner.accounts.entry(owner.clone()).or_default();
        account.apply_measure(seq, start, measured);
        account.used()
    }

    /// Once per server: find the stores earlier runs left (every owner's cache, the
    /// managed venvs), measure them, and remove what the shared cache of earlier
    /// versions left in the state dir's cache root (anything a job of any session may
    /// have written: it is never read again).
    async fn scan_once(&self) {
        self.scanned
            .get_or_init(|| async {
                let found = self.found_owners();
                {
                    let mut inner = self.lock();
                    for (owner, venv) in &found {
                        let account = inner.accounts.entry(owner.clone()).or_default();
                        if account.venv.is_none() {
                            account.venv.clone_from(venv);
                        }
                    }
                }
                if self.own_root {
                    let root = self.cache_root.clone();
                    let _ = tokio::task::spawn_blocking(move || remove_shared_layout(&root)).await;
                }
                for (owner, _) in found {
                    self.remeasure(&owner).await;
                }
                self.remove_trash().await;
            })
            .await;
    }

    /// Owners with a cache or a managed venv on disk.
    fn found_owners(&self) -> Vec<(Owner, Option<PathBuf>)> {
        let mut out: HashMap<Owner, Option<PathBuf>> = HashMap::new();
        if let Ok(entries) = std::fs::read_dir(self.sessions_dir().join("local")) {
            for e in entries.flatten() {
                if let Some(owner) = e.file_name().to_str().and_then(|n| Owner::local(n).ok()) {
                    out.entry(owner).or_default();
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&self.venvs_dir) {
            for e in entries.flatten() {
                if let Some(owner) = e.file_name().to_str().and_then(|n| Owner::local(n).ok()) {
                    out.insert(owner, Some(e.path()));
                }
            }
        }
        out.into_iter().collect()
    }

    /// Caches set aside for removal (`.trash-*`), by this server or one that died.
    async fn remove_trash(&self) {
        let root = self.cache_root.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if let Ok(entries) = std::fs::read_dir(&root) {
                for e in entries.flatten() {
                    if e.file_name().to_string_lossy().starts_with(".trash-") {
                        let _ = std::fs::remove_dir_all(e.path());
                    }
                }
            }
        })
        .await;
    }

    /// Set `owner`'s cache aside if no job of it but `except` runs here and no uv
    /// process uses it (of another server sharing the state dir too: uv holds a shared
    /// `flock` on the cache's `.lock` while it works); returns what it took.
    fn take_cache_if_idle(&self, owner: &Owner, except: Option<u64>) -> Option<u64> {
        static TRASH: AtomicU64 = AtomicU64::new(0);
        let mut inner = self.lock();
        let account = inner.accounts.get_mut(owner)?;
        if account.jobs.keys().any(|j| Some(*j) != except) {
            return None;
        }
        let cache = self.cache_dir(owner);
        let _unused = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(cache.join(".lock"))
        {
            Ok(file) => Some(
                nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).ok()?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(_) => return None,
        };
        let trash = self.cache_root.join(format!(
            ".trash-{}-{}",
            std::process::id(),
            TRASH.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::rename(&cache, &trash).ok()?;
        account.touch();
        tracing::info!(owner = %owner, cache = %cache.display(), "cleared a uv cache to keep the stores within their disk bounds");
        account.parts.remove(&Part::Tree(cache))
    }

    /// Admit a job of `owner` that writes its stores and `extra` trees of its own (a
    /// transient environment, a host temp dir). An owner over its bound first loses its
    /// uv cache (when no other job of it runs); over the total, the least recently used
    /// idle owners' caches go first. Refused in words when that is not enough.
    pub async fn admit(
        self: &Arc<Self>,
        owner: &Owner,
        extra: Vec<PathBuf>,
    ) -> Result<Lease, EnvError> {
        self.scan_once().await;
        let job = self.next_job.fetch_add(1, Ordering::Relaxed);
        let settled = {
            let mut inner = self.lock();
            let account = inner.accounts.entry(owner.clone()).or_default();
            // Within its bound as measured when its last job ended: no walk of the
            // stores on the way to the job (the job's own watch measures as it runs).
            let settled = account.settled() && account.used() < self.caps.session;
            account.jobs.insert(job, extra.clone());
            account.touch();
            settled.then(|| account.used())
        };
        let mut lease = Lease {
            stores: self.clone(),
            owner: owner.clone(),
            job,
            note: None,
        };
        let mut used = match settled {
            // The job's own extra trees (a host temp dir) are new: measured with the rest.
            Some(used) if extra.is_empty() => used,
            _ => self.remeasure(owner).await,
        };
        if used >= self.caps.session {
            if let Some(freed) = self.take_cache_if_idle(owner, Some(job)) {
                self.remove_trash().await;
                lease.note = Some(format!(
                    "the uv cache of {owner} ({}) was cleared: its stores had reached their disk bound of {}",
                    bytes_words(freed),
                    bytes_words(self.caps.session)
                ));
            }
            used = self.remeasure(owner).await;
            if used >= self.caps.session {
                return Err(self.full_session(owner, used));
            }
        }
        if self.total() >= self.caps.total {
            let freed = self.evict_idle(owner, job).await;
            let total = self.total();
            if total >= self.caps.total {
                return Err(EnvError::StoreFull(format!(
                    "the package stores of all sessions are full: {} allocated of the {} allowed in all (--env-disk-total){}, and no idle session's uv cache is left to clear. \
                     Wait for running installs and scripts to end, remove managed venvs no longer needed from {}, or raise --env-disk-total",
                    bytes_words(total),
                    bytes_words(self.caps.total),
                    if freed > 0 {
                        format!(
                            " after clearing {} of idle sessions' uv caches",
                            bytes_words(freed)
                        )
                    } else {
                        String::new()
                    },
                    self.venvs_dir.display()
                )));
            }
            if freed > 0 {
                let note = format!(
                    "{} of idle sessions' uv caches were cleared to keep all sessions' stores within {}",
                    bytes_words(freed),
                    bytes_words(self.caps.total)
                );
                lease.note = Some(match lease.note.take() {
                    Some(n) => format!("{n}; {note}"),
                    None => note,
                });
            }
        }
        Ok(lease)
    }

    fn full_session(&self, owner: &Owner, used: u64) -> EnvError {
        let inner = self.lock();
        let account = inner.accounts.get(owner);
        let part = |p: &Path| {
            account
                .and_then(|a| a.parts.get(&Part::Tree(p.to_path_buf())))
                .copied()
                .unwrap_or(0)
        };
        let cache = self.cache_dir(owner);
        let venv = account.and_then(|a| a.venv.clone());
        let venv_words = match &venv {
            Some(v) => format!("; its venv {}: {}", v.display(), bytes_words(part(v))),
            None => String::new(),
        };
        let free = match &venv {
            Some(v) => format!(
                "Remove the venv directory {} (a managed one is made again by the next install) or use another session",
                v.display()
            ),
            None => "Wait for its running installs and scripts to end, or use another session"
                .to_string(),
        };
        EnvError::StoreFull(format!(
            "the package stores of {owner} are full: {} allocated of the {} allowed (its uv cache: {}{venv_words}). {free}; the bound is --env-disk-cap",
            bytes_words(used),
            bytes_words(self.caps.session),
            bytes_words(part(&cache)),
        ))
    }

    /// Clear idle owners' caches, least recently used first, until the total is within
    /// its bound; `owner` itself last (if `job` is its only job). Returns what was freed.
    async fn evict_idle(&self, owner: &Owner, job: u64) -> u64 {
        let mut order: Vec<(Option<Instant>, Owner)> = {
            let inner = self.lock();
            inner
                .accounts
                .iter()
                .filter(|(o, a)| *o != owner && a.jobs.is_empty())
                .map(|(o, a)| (a.last_used, o.clone()))
                .collect()
        };
        order.sort();
        let mut freed = 0u64;
        let mut candidates: Vec<(Owner, Option<u64>)> =
            order.into_iter().map(|(_, o)| (o, None)).collect();
        candidates.push((owner.clone(), Some(job)));
        for (o, except) in candidates {
            if self.total() < self.caps.total {
                break;
            }
            if let Some(bytes) = self.take_cache_if_idle(&o, except) {
                freed = freed.saturating_add(bytes);
            }
        }
        if freed > 0 {
            self.remove_trash().await;
        }
        freed
    }
}

/// Remove what the single shared cache of earlier versions left directly in `root` (all
/// but `sessions/` and caches set aside): a job of any session could have written it.
fn remove_shared_layout(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let mut removed = false;
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name == "sessions" || name.starts_with(".trash-") {
            continue;
        }
        let r = match e.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(e.path()),
            _ => std::fs::remove_file(e.path()),
        };
        removed |= r.is_ok();
    }
    if removed {
        tracing::info!(root = %root.display(), "removed the shared uv cache of an earlier version (every session now has its own)");
    }
}

/// A job of one owner, admitted: its stores are counted while it runs. Dropping it (or
/// [`Lease::release`]) ends the job's claim.
#[derive(Debug)]
pub struct Lease {
    stores: Arc<Stores>,
    owner: Owner,
    job: u64,
    /// What admission did to make room (a cleared cache), for the job's output.
    pub note: Option<String>,
}

impl Lease {
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// The owner's uv cache (created if missing).
    pub fn cache_dir(&self) -> Result<PathBuf, EnvError> {
        let cache = self.stores.cache_dir(&self.owner);
        std::fs::create_dir_all(&cache)
            .map_err(|e| EnvError::io(format!("creating {}", cache.display()), e))?;
        Ok(cache)
    }

    /// Count `tree` among what this job writes (a transient environment once made).
    pub fn add_tree(&self, tree: &Path) {
        let mut inner = self.stores.lock();
        if let Some(extra) = inner
            .accounts
            .get_mut(&self.owner)
            .and_then(|a| a.jobs.get_mut(&self.job))
            && !extra.iter().any(|e| e == tree)
        {
            extra.push(tree.to_path_buf());
        }
    }

    /// Tell which venv the owner uses.
    pub fn set_venv(&self, venv: &Path) {
        self.stores.set_venv(&self.owner, venv);
    }

    /// Resolves when a step that writes `writable` (trees of this owner's stores), run by
    /// the process `pid`, takes the owner's stores or all owners' past their bound; never
    /// when `writable` is empty. Measures again and again while it is polled.
    pub async fn exceeded(&self, writable: &[PathBuf], pid: Option<u32>) -> DiskHit {
        if writable.is_empty() {
            return std::future::pending().await;
        }
        let caps = self.stores.caps;
        let mut pause = MIN_PAUSE;
        loop {
            tokio::time::sleep(pause).await;
            let started = Instant::now();
            let roots = writable.to_vec();
            let stop = caps.session.saturating_add(1);
            // Each tree on its own (the owner's other trees keep their last figures), then
            // the open unlinked files, a part of this job's own.
            let measured = tokio::task::spawn_blocking(move || {
                let mut parts: Vec<(Part, u64)> = Vec::new();
                let mut too_deep = false;
                for r in &roots {
                    let m = measure(std::slice::from_ref(r), stop);
                    too_deep |= m.too_deep;
                    parts.push((Part::Tree(r.clone()), m.bytes));
                }
                let open = pid.map_or(0, |pid| open_unlinked_bytes(&roots, pid));
                (parts, open, too_deep)
            })
            .await;
            let Ok((parts, open, too_deep)) = measured else {
                continue;
            };
            let (used, others) = {
                let mut inner = self.stores.lock();
                let account = inner.accounts.entry(self.owner.clone()).or_default();
                for (part, bytes) in parts {
                    account.parts.insert(part, bytes);
                }
                account.parts.insert(Part::OpenFiles(self.job), open);
                let used = account.used();
                let all = inner
                    .accounts
                    .values()
                    .fold(0u64, |a, acc| a.saturating_add(acc.used()));
                (used, all.saturating_sub(used))
            };
            let room = caps.total.saturating_sub(others);
            let (bound, total) = if room < caps.session {
                (room, true)
            } else {
                (caps.session, false)
            };
            if used > bound || too_deep {
                return DiskHit {
                    owner: self.owner.clone(),
                    used,
                    bound,
                    total,
                    total_cap: caps.total,
                    too_deep,
                };
            }
            pause = MIN_PAUSE.max(started.elapsed() * PAUSE_FACTOR);
        }
    }

    /// End the job's claim, measuring the owner's stores as the job left them.
    pub async fn release(self) {
        let ended = self.end();
        ended.stores.remeasure(&ended.owner).await;
    }

    /// End the job's claim now (another job of the owner may clear its cache from here
    /// on); the measure of what it left is [`Ended::measure`], which may come later (after
    /// the job's answer). Until it is in, the owner's next admission measures itself.
    pub fn end(self) -> Ended {
        let ended = Ended {
            stores: self.stores.clone(),
            owner: self.owner.clone(),
        };
        drop(self);
        ended
    }
}

/// A job whose claim has ended (see [`Lease::end`]).
#[derive(Debug)]
pub struct Ended {
    stores: Arc<Stores>,
    owner: Owner,
}

impl Ended {
    /// Measure the owner's stores as the job left them, in idle time: the walk yields
    /// the CPU to everything else of the machine (the job's answer, the next call),
    /// since nothing waits for it (an admission before it is in measures itself).
    pub async fn measure(self) {
        self.stores.remeasure_at(&self.owner, Urgency::Idle).await;
    }
}

/// How a measure of the stores runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Urgency {
    /// Something waits for it (an admission): on the blocking pool, at the server's
    /// own priority.
    Needed,
    /// Nothing waits for it (the measure after a job's answer): on a thread of its own
    /// under `SCHED_IDLE`, so on a busy machine it runs only when a CPU would idle and
    /// never delays the answer or the next call it races with.
    Idle,
}

/// Run `f` on a thread of its own under `SCHED_IDLE` (at normal priority where the
/// kernel refuses that policy); `None` if the thread could not be started or panicked.
async fn in_idle_time<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let started = std::thread::Builder::new()
        .name("store-measure".into())
        .spawn(move || {
            if let Err(e) = idle_priority() {
                tracing::debug!("the measure of the stores runs at normal priority: {e}");
            }
            let _ = tx.send(f());
        });
    if let Err(e) = started {
        tracing::warn!("cannot start a thread to measure the package stores: {e}");
        return None;
    }
    rx.await.ok()
}

/// Put the calling thread (not the process: Linux applies `sched_setscheduler(0, ..)`
/// to the calling thread) under `SCHED_IDLE`. No privilege is needed to lower a
/// thread's policy; the thread cannot raise it again, so it is used for one walk.
fn idle_priority() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid, initialised sched_param that outlives the call; pid 0
    // names the calling thread; no memory is shared with the kernel beyond the call.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &raw const param) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Bytes of the files the job rooted at `pid` holds open unlinked on the devices of
/// `roots`.
fn open_unlinked_bytes(roots: &[PathBuf], pid: u32) -> u64 {
    let devs: HashSet<u64> = roots
        .iter()
        .filter_map(|r| std::fs::symlink_metadata(r).ok())
        .map(|m| m.dev())
        .collect();
    let mut walk = Walk::new(u64::MAX);
    walk.open_unlinked(pid, &devs);
    walk.bytes
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut inner = self.stores.lock();
        if let Some(account) = inner.accounts.get_mut(&self.owner) {
            if let Some(extra) = account.jobs.remove(&self.job) {
                for tree in extra {
                    if !account.jobs.values().flatten().any(|t| *t == tree) {
                        account.parts.remove(&Part::Tree(tree));
                    }
                }
            }
            account.parts.remove(&Part::OpenFiles(self.job));
            account.last_used = Some(Instant::now());
            account.touch();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::symlink;

    /// Two measures of one owner ending out of order (an idle-time walk starved under
    /// load ends after a later one): the older figures never replace the newer, nor
    /// settle them.
    #[test]
    fn a_measure_that_ends_after_a_newer_one_is_dropped() {
        let tree = PathBuf::from("/cache");
        let mut account = Account::default();
        let (old, new) = (1, 2);
        account.apply_measure(new, Some(account.epoch), vec![(tree.clone(), 900)]);
        let settled = account.settled;
        assert!(settled.is_some());
        account.apply_measure(old, Some(account.epoch), vec![(tree.clone(), 100)]);
        assert_eq!(account.used(), 900);
        assert_eq!(account.settled, settled);
        account.apply_measure(3, None, vec![(tree, 500)]);
        assert_eq!(account.used(), 500);
    }

    fn write_dense(path: &Path, bytes: usize) {
        let mut f = std::fs::File::create(path).unwrap();
        f.write_all(&vec![1u8; bytes]).unwrap();
        f.sync_all().unwrap();
    }

    fn cfg(state: &Path, caps: DiskCaps) -> crate::envs::EnvConfig {
        crate::envs::EnvConfig {
            sandbox: crate::sandbox::Runtime::new(crate::sandbox::RuntimeConfig::server()),
            state_dir: state.to_path_buf(),
            workspace: state.join("ws"),
            python: "/usr/bin/python3".into(),
            python_version: None,
            uv: None,
            uv_cache: None,
            disk: caps,
            python_downloads: false,
            sources: Default::default(),
            principal: None,
        }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn owners_key_caches_by_principal_and_session() {
        let a = Owner::local("bob").unwrap();
        let b = Owner::new(Some("tenant/1"), "bob").unwrap();
        assert_eq!(a.rel_dir(), PathBuf::from("local/bob"));
        assert_eq!(b.rel_dir(), PathBuf::from("p-74656e616e742f31/bob"));
        assert_ne!(a, b);
        for bad in ["", "..", "a/b", "../x"] {
            assert!(Owner::local(bad).is_err(), "{bad:?}");
        }
        assert_eq!(a.to_string(), "session \"bob\"");
    }

    /// Allocated blocks count, not sizes: a sparse file costs what it allocated, a
    /// dense one all it wrote; a file linked twice counts once; a symlink is not
    /// followed; every inode costs at least MIN_CHARGE.
    #[test]
    fn measure_counts_allocated_blocks_once() {
        let d = crate::test_support::scratch_dir("store-measure");
        let root = d.path().join("store");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        write_dense(&root.join("a/dense"), 3 << 20);
        let sparse = std::fs::File::create(root.join("sparse")).unwrap();
        sparse.set_len(1 << 30).unwrap();
        std::fs::hard_link(root.join("a/dense"), root.join("a/b/link")).unwrap();
        let outside = d.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        write_dense(&outside.join("big"), 8 << 20);
        symlink(&outside, root.join("escape")).unwrap();
        let m = measure(std::slice::from_ref(&root), u64::MAX);
        assert!(!m.too_deep);
        // 3 MiB once, plus 4 KiB for each of: store, a, a/b, sparse, escape (a link).
        assert!(m.bytes >= 3 * MIB + 5 * MIN_CHARGE, "{m:?}");
        assert!(m.bytes < 4 * MIB, "{m:?}");
        // A missing root is nothing; a file root is measured.
        assert_eq!(measure(&[d.path().join("none")], u64::MAX).bytes, 0);
        assert!(measure(&[outside.join("big")], u64::MAX).bytes >= 8 * MIB);
        // Counting stops once past the bound.
        let m = measure(std::slice::from_ref(&root), MIB);
        assert!(m.bytes > MIB, "{m:?}");
    }

    #[test]
    fn a_tree_deeper_than_the_measure_follows_is_flagged() {
        let d = crate::test_support::scratch_dir("store-deep");
        let root = d.path().join("store");
        // Made with relative steps: the absolute path would be too long for the kernel.
        std::fs::create_dir_all(&root).unwrap();
        let mut fd =
            nix::fcntl::open(&root, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        let name = "d".repeat(99);
        for _ in 0..(MAX_REL_PATH / 100 + 2) {
            nix::sys::stat::mkdirat(fd.as_fd(), name.as_str(), Mode::S_IRWXU).unwrap();
            fd = nix::fcntl::openat(
                fd.as_fd(),
                name.as_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY,
                Mode::empty(),
            )
            .unwrap();
        }
        drop(fd);
        let m = measure(std::slice::from_ref(&root), u64::MAX);
        assert!(m.too_deep, "{m:?}");
        // Removed the same way (remove_dir_all copes with long paths through descriptors).
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// Files held open after unlinking take disk without a name: counted for the job's
    /// processes (here: this test process).
    #[test]
    fn open_unlinked_files_of_a_job_count() {
        let d = crate::test_support::scratch_dir("store-unlinked");
        let root = d.path().join("store");
        std::fs::create_dir_all(&root).unwrap();
        let path = root.join("gone");
        let mut f = std::fs::File::create(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        f.write_all(&vec![1u8; 2 << 20]).unwrap();
        f.sync_all().unwrap();
        assert!(open_unlinked_bytes(&[root], std::process::id()) >= 2 * MIB);
        drop(f);
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// Stores in a scratch dir bounded at `session` bytes per session (100 MiB in all),
    /// and their owner bob.
    fn bob_bounded_at(session: u64, tag: &str) -> (tempfile::TempDir, Arc<Stores>, Owner) {
        let d = crate::test_support::scratch_dir(tag);
        let caps = DiskCaps {
            session,
            total: 100 * MIB,
        };
        let stores = Stores::new(&cfg(d.path(), caps));
        (d, stores, Owner::local("bob").unwrap())
    }

    /// Stores bounded at 4 MiB per session, and bob's cache holding 5 MiB.
    fn bob_over_a_4_mib_bound(
        tag: &str,
    ) -> (tempfile::TempDir, Arc<Stores>, Owner, std::path::PathBuf) {
        let (d, stores, bob) = bob_bounded_at(4 * MIB, tag);
        let cache = stores.cache_dir(&bob);
        std::fs::create_dir_all(&cache).unwrap();
        write_dense(&cache.join("junk"), 5 << 20);
        (d, stores, bob, cache)
    }

    /// `lease` says the owner's cache was cleared, and `cache` is gone.
    fn assert_cache_cleared(lease: &Lease, cache: &Path) {
        assert!(
            lease.note.as_deref().unwrap_or("").contains("was cleared"),
            "{:?}",
            lease.note
        );
        assert!(!cache.exists());
    }

    /// An owner over its bound loses its cache at admission (and is told); when its venv
    /// alone is over, it is refused in words naming the venv and the flag.
    #[test]
    fn admission_clears_the_owners_cache_then_refuses() {
        let (d, stores, bob, cache) = bob_over_a_4_mib_bound("store-admit");
        rt().block_on(async {
            let lease = stores.admit(&bob, vec![]).await.unwrap();
            assert_cache_cleared(&lease, &cache);
            drop(lease);
            let venv = d.path().join("venvs/bob");
            std::fs::create_dir_all(&venv).unwrap();
            write_dense(&venv.join("junk"), 5 << 20);
            stores.set_venv(&bob, &venv);
            let err = stores.admit(&bob, vec![]).await.unwrap_err().to_string();
            assert!(
                err.contains("package stores of session \"bob\" are full"),
                "{err}"
            );
            assert!(
                err.contains("--env-disk-cap") && err.contains("venvs/bob"),
                "{err}"
            );
            // Another owner is not affected.
            let alice = Owner::local("alice").unwrap();
            assert!(stores.admit(&alice, vec![]).await.is_ok());
        });
    }

    /// Admission takes the figures measured as the owner's last job ended (no walk of the
    /// stores on the way to the job) while they stand; a job ended without that measure,
    /// another venv, or figures at the bound make it measure again.
    #[test]
    fn admission_uses_the_figures_measured_when_the_last_job_ended() {
        let (d, stores, bob) = bob_bounded_at(4 * MIB, "store-settled");
        let cache = stores.cache_dir(&bob);
        std::fs::create_dir_all(&cache).unwrap();
        write_dense(&cache.join("a"), 1 << 20);
        rt().block_on(async {
            stores.admit(&bob, vec![]).await.unwrap().release().await;
            let settled = stores.used(&bob);
            assert!((MIB..2 * MIB).contains(&settled), "{settled}");
            // Written by no job of this server: the settled figure stands.
            write_dense(&cache.join("b"), 1 << 20);
            let lease = stores.admit(&bob, vec![]).await.unwrap();
            assert_eq!(stores.used(&bob), settled);
            // Ended without its measure: the next admission measures.
            drop(lease);
            let lease = stores.admit(&bob, vec![]).await.unwrap();
            let measured = stores.used(&bob);
            assert!(measured >= 2 * MIB, "{measured}");
            lease.end().measure().await;
            // Another venv: measured again.
            let venv = d.path().join("venvs/bob");
            std::fs::create_dir_all(&venv).unwrap();
            write_dense(&venv.join("junk"), 1 << 20);
            stores.set_venv(&bob, &venv);
            stores.admit(&bob, vec![]).await.unwrap().release().await;
            assert!(stores.used(&bob) >= 3 * MIB, "{}", stores.used(&bob));
            // At the bound as last measured: measured again, and the cache cleared.
            write_dense(&cache.join("c"), 1 << 20);
            stores.admit(&bob, vec![]).await.unwrap().release().await;
            assert!(stores.used(&bob) >= 4 * MIB, "{}", stores.used(&bob));
            let lease = stores.admit(&bob, vec![]).await.unwrap();
            assert_cache_cleared(&lease, &cache);
        });
    }

    /// The measure after a job's answer ([`Ended::measure`]) walks on a thread of its
    /// own under `SCHED_IDLE` (never ahead of the answer or the next call on a busy
    /// machine), and its figures serve the next admission as the blocking one's do.
    #[test]
    fn the_measure_after_a_job_runs_in_idle_time_and_settles_the_figures() {
        let caller = std::thread::current().id();
        let (on, policy) = rt()
            .block_on(in_idle_time(move || {
                // SAFETY: no arguments; reads the calling thread's policy.
                let policy = unsafe { libc::sched_getscheduler(0) };
                (std::thread::current().id() != caller, policy)
            }))
            .unwrap();
        assert!(on, "the walk ran on the caller's thread");
        assert_eq!(policy, libc::SCHED_IDLE);
        // The caller's own policy is unchanged.
        // SAFETY: as above.
        assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_OTHER);

        let (_d, stores, bob) = bob_bounded_at(4 * MIB, "store-idle");
        let cache = stores.cache_dir(&bob);
        std::fs::create_dir_all(&cache).unwrap();
        rt().block_on(async {
            let lease = stores.admit(&bob, vec![]).await.unwrap();
            write_dense(&cache.join("a"), 1 << 20);
            lease.end().measure().await;
            let measured = stores.used(&bob);
            assert!((MIB..2 * MIB).contains(&measured), "{measured}");
            // Written by no job of this server: the figure measured in idle time stands.
            write_dense(&cache.join("b"), 1 << 20);
            let _lease = stores.admit(&bob, vec![]).await.unwrap();
            assert_eq!(stores.used(&bob), measured);
        });
    }

    /// A cache a uv process uses (its shared lock on `.lock`, maybe from another server
    /// sharing the state dir) is never cleared: the job is refused instead.
    #[test]
    fn a_cache_in_use_by_uv_is_not_cleared() {
        let (_d, stores, bob, cache) = bob_over_a_4_mib_bound("store-inuse");
        let lock = std::fs::File::create(cache.join(".lock")).unwrap();
        let held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockSharedNonblock).unwrap();
        rt().block_on(async {
            let err = stores.admit(&bob, vec![]).await.unwrap_err().to_string();
            assert!(err.contains("are full"), "{err}");
            assert!(cache.join("junk").exists());
            drop(held);
            let lease = stores.admit(&bob, vec![]).await.unwrap();
            assert!(lease.note.is_some() && !cache.exists());
        });
    }

    /// Over the total, idle owners' caches go, least recently used first; one with a
    /// running job keeps its cache.
    #[test]
    fn the_total_evicts_idle_caches_least_recently_used_first() {
        let d = crate::test_support::scratch_dir("store-total");
        let caps = DiskCaps {
            session: 50 * MIB,
            total: 10 * MIB,
        };
        let stores = Stores::new(&cfg(d.path(), caps));
        let [old, newer, busy, me] =
            ["old", "newer", "busy", "me"].map(|s| Owner::local(s).unwrap());
        rt().block_on(async {
            for o in [&old, &newer, &busy] {
                let lease = stores.admit(o, vec![]).await.unwrap();
                write_dense(&lease.cache_dir().unwrap().join("junk"), 3 << 20);
                lease.release().await;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let running = stores.admit(&busy, vec![]).await.unwrap();
            // 9 MiB + small: within 10 MiB; a fourth owner's 3 MiB passes it.
            let lease = stores.admit(&me, vec![]).await.unwrap();
            write_dense(&lease.cache_dir().unwrap().join("junk"), 3 << 20);
            lease.release().await;
            let lease = stores.admit(&me, vec![]).await.unwrap();
            assert!(
                lease
                    .note
                    .as_deref()
                    .unwrap_or("")
                    .contains("idle sessions' uv caches were cleared"),
                "{:?}",
                lease.note
            );
            assert!(!stores.cache_dir(&old).exists());
            assert!(stores.cache_dir(&newer).exists() && stores.cache_dir(&busy).exists());
            drop(running);
        });
    }

    /// A step that writes past the bound is seen by `exceeded`, with the bound in words.
    #[test]
    fn a_step_past_its_bound_is_stopped_with_words() {
        let (_d, stores, bob) = bob_bounded_at(2 * MIB, "store-exceeded");
        rt().block_on(async {
            let lease = stores.admit(&bob, vec![]).await.unwrap();
            let cache = lease.cache_dir().unwrap();
            write_dense(&cache.join("junk"), 3 << 20);
            let hit = lease.exceeded(&[cache], None).await;
            assert!(
                !hit.total && hit.used > 2 * MIB && hit.bound == 2 * MIB,
                "{hit:?}"
            );
            let words = hit.words();
            assert!(
                words.contains("2.0 MiB allowed (--env-disk-cap)"),
                "{words}"
            );
        });
    }
}
