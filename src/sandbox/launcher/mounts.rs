//! The job's mount view: a private mount namespace whose root is a fresh, read-only
//! tmpfs holding only what the policy lists — read paths bound read-only, write paths
//! (workspace, private tmp) bound read-write, the private tmp also at `/tmp`, a minimal
//! `/dev` (null, zero, full, random, urandom, tty; a private tmpfs `/dev/shm` if the
//! policy lists it) and a read-only `/proc` that hides
//! processes the job may not ptrace (`hidepid=ptraceable`, so with Landlock's ptrace
//! scoping the server and every other outside process are invisible).
//!
//! Well-known secret files inside listed directories (/etc/shadow, ssh host keys) are
//! covered with an empty node: a job running as uid 0 could otherwise read them.
//!
//! What this adds on top of Landlock: paths the policy leaves out do not exist at all
//! (so a pathname unix socket such as /run/docker.sock cannot be connected, which
//! Landlock does not mediate), and metadata changes outside writable paths (chmod,
//! chown, utimes, xattrs — also outside Landlock's reach) fail with EROFS.
//!
//! Called in the launcher child, single-threaded and still privileged, after the
//! cgroup join and network namespace and before capabilities are dropped — or ahead of
//! need, in a short-lived thread of the server ([`prepare_view`]), the child then only
//! joining the finished view ([`enter_prepared_view`]).

pub(crate) mod plan;
mod sys;

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use plan::{Bind, OWN_DEVICES, Plan};
use sys::{mkdir_open, mount, open_beneath, pivot_root};

/// What the job sees. Paths are host paths; nonexistent ones are skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MountView {
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
    /// The private temp dir: writable at its own path and at /tmp. With `tmp_size` the
    /// host directory need not exist (`run` does not make one: a directory removed from
    /// an ext4 mounted with `discard` costs a synchronous TRIM: 0.1 ms here with the disk
    /// idle, ~4 ms with it busy); the path is
    /// then made in the view only.
    pub tmp: PathBuf,
    /// When set, the private temp dir is a fresh tmpfs of this many bytes (at both
    /// places) rather than the host directory: nothing written there reaches the host's
    /// disk, it is bounded, and it vanishes with the job's mount namespace.
    pub tmp_size: Option<u64>,
    /// Paths covered by an empty read-only tmpfs (the server's state dir), with listed
    /// paths beneath them bound again on top.
    pub hide: Vec<PathBuf>,
    /// Writable; also the working directory after the switch.
    pub workspace: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error(
        "cannot create a mount and IPC namespace (unshare CLONE_NEWNS|CLONE_NEWIPC): {0}; the launcher \
         needs CAP_SYS_ADMIN \
         (run the server as root or in a user namespace), or use a policy that allows best effort"
    )]
    Unshare(io::Error),
    #[error("cannot build the sandbox's file-system view: {step} {path}: {source}")]
    Step {
        step: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

// Mount API constants (linux/mount.h), spelled out so no libc version gap matters.
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Where the old root is reachable while the view is built, and where the view grows.
const OLD: &str = "/oldroot";
const NO_SRC: Option<&str> = None;
const NEW: &str = "/newroot";

/// Launcher child: switch this process into the view (see the module docs), in a fresh
/// mount and IPC namespace: made here, or by the job's init (`made_by_init`, see
/// `pidns::Hold`), which holds it — the view is then built in the namespace this
/// process already shares with the init alone, and the init's root moves with it.
pub(crate) fn apply_mount_view(view: &MountView, made_by_init: bool) -> Result<(), MountError> {
    let layout = layout(view)?;
    // A private IPC namespace with the view: System V shared memory, message queues and
    // semaphores, and POSIX message queues (mq_open needs no /dev/mqueue) are per IPC
    // namespace, and a root-uid job owns the host's root-owned segments by plain DAC.
    // SAFETY: unshare(2) with constant flags, affecting only this process.
    if !made_by_init && unsafe { libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWIPC) } != 0 {
        return Err(MountError::Unshare(io::Error::last_os_error()));
    }
    switch_root(&layout, &view.workspace, ProcFs::Mount)
}

/// A view made ahead of need (the server's shell jobs): a mount namespace no process is
/// in, whose root is the finished view but for `/proc` (a procfs shows the PID namespace
/// of whoever mounts it: the job mounts its own, [`enter_prepared_view`]). It is used by
/// one job at most; dropping it unused releases the namespace.
#[derive(Debug)]
pub(crate) struct PreparedView {
    ns: OwnedFd,
    mount_proc: bool,
    seen: Seen,
}

impl PreparedView {
    /// The namespace, for the job's launcher (which owns its copy from then on).
    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.ns
    }
    /// Whether the job must mount its `/proc`.
    pub(crate) fn mounts_proc(&self) -> bool {
        self.mount_proc
    }
    /// Whether the host still shows what this view was made from: every listed path the
    /// same file (or still missing), the same secret files to cover. A view made before
    /// a listed directory was created (a venv, a cache) would not show it: such a view is
    /// not used, the job makes its own.
    pub(crate) fn is_current(&self, view: &MountView) -> bool {
        Seen::now(view) == self.seen
    }
}

/// What a view was made from, as the host shows it: the identity (device, inode) of each
/// listed path following links, `None` for a missing one; the secret files covered.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    paths: Vec<Option<(u64, u64)>>,
    masked: Vec<PathBuf>,
}

impl Seen {
    fn now(view: &MountView) -> Seen {
        use std::os::unix::fs::MetadataExt;
        let listed = view.read.iter().chain(&view.write).chain(&view.hide);
        Seen {
            paths: listed
                .chain([&view.tmp, &view.workspace])
                .map(|p| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino())))
                .collect(),
            masked: plan::MASKED
                .iter()
                .flat_map(|pattern| expand(Path::new(pattern)))
                .collect(),
        }
    }
}

/// Make `view` ahead of need. Namespaces are per thread: a short-lived thread of the
/// caller unshares, builds the view and ends; the namespace lives on in the descriptor.
pub(crate) fn prepare_view(view: &MountView) -> Result<PreparedView, MountError> {
    let view = view.clone();
    let maker = std::thread::Builder::new()
        .name("view-maker".into())
        .spawn(move || prepare_here(&view))
        .map_err(step("start a thread to make a view", "/"))?;
    maker
        .join()
        .map_err(|_| step("make a view", "/")(io::Error::other("the view's thread panicked")))?
}

fn prepare_here(view: &MountView) -> Result<PreparedView, MountError> {
    // Taken first: whatever changes while the view is built makes it stale, never wrong.
    let seen = Seen::now(view);
    let layout = layout(view)?;
    // SAFETY: unshare(2) with a constant flag; it moves only this thread (and gives it a
    // file-system context of its own), which ends right after.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(MountError::Unshare(io::Error::last_os_error()));
    }
    let ns = std::fs::File::open("/proc/thread-self/ns/mnt")
        .map_err(step("open the namespace of", "/proc/thread-self/ns/mnt"))?;
    switch_root(&layout, &view.workspace, ProcFs::Later)?;
    Ok(PreparedView {
        ns: ns.into(),
        mount_proc: layout.plan.own_proc,
        seen,
    })
}

/// Launcher child: join a view made ahead (`ns`), with a private IPC namespace as
/// [`apply_mount_view`] gives, and mount its `/proc` here, after the PID namespace split.
pub(crate) fn enter_prepared_view(
    ns: &OwnedFd,
    mount_proc: bool,
    workspace: &Path,
) -> Result<(), MountError> {
    // SAFETY: unshare(2) with a constant flag, affecting only this process.
    if unsafe { libc::unshare(libc::CLONE_NEWIPC) } != 0 {
        return Err(MountError::Unshare(io::Error::last_os_error()));
    }
    // SAFETY: setns(2) on a descriptor we own; this process is single-threaded, so its
    // root and working directory move to the view's root.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNS) } != 0 {
        return Err(step("join the view made ahead at", "/")(
            io::Error::last_os_error(),
        ));
    }
    if mount_proc {
        mount_procfs(Path::new("/proc")).map_err(step("mount a procfs on", "/proc"))?;
    }
    enter_workspace(workspace)
}

/// What a view needs that `switch_root` must not look up again in the new namespace.
struct Layout {
    plan: Plan,
    /// Where the scratch root is mounted for a moment (the private tmp or its parent).
    scratch: PathBuf,
    /// The private tmp's path and size when it is a tmpfs.
    tmpfs: Option<(PathBuf, u64)>,
}

fn layout(view: &MountView) -> Result<Layout, MountError> {
    let mut write = view.write.clone();
    // A private tmp that is a tmpfs in the view needs no host directory (see
    // [`MountView::tmp`]): it is a name only, made in the view alone. What is there must
    // be a directory itself, never a link followed to somewhere else (the caller made it,
    // or left the name free).
    let in_view_only = match std::fs::symlink_metadata(&view.tmp) {
        Ok(meta) if meta.is_dir() => false,
        Ok(_) => {
            let why = io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a directory (a link or a file)",
            );
            return Err(step("find the private temp dir", &view.tmp)(why));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound && view.tmp_size.is_some() => true,
        Err(e) => return Err(step("find the private temp dir", &view.tmp)(e)),
    };
    // The workspace is writable only if the policy says so (read-only policy: it is not).
    if !in_view_only {
        write.push(view.tmp.clone());
    }
    let mut entries = plan::entries(&view.read, &write);
    let (tmp, scratch) = if in_view_only {
        let scratch = view_only_scratch(&view.tmp)?;
        entries.push(plan::Entry {
            given: view.tmp.clone(),
            canonical: view.tmp.clone(),
            is_dir: true,
            writable: true,
        });
        (view.tmp.clone(), scratch)
    } else {
        let tmp = std::fs::canonicalize(&view.tmp)
            .map_err(step("find the private temp dir", &view.tmp))?;
        (tmp.clone(), tmp)
    };
    let mut plan = plan::plan(&entries, Some(&tmp));
    plan::hide(&mut plan, &view.hide);
    Ok(Layout {
        plan,
        scratch,
        tmpfs: view.tmp_size.map(|size| (tmp, size)),
    })
}

/// Whether `/proc` is mounted while the view is built, or left to the job.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ProcFs {
    Mount,
    Later,
}

/// In a fresh mount namespace: build the view and make it the root.
fn switch_root(layout: &Layout, workspace: &Path, proc: ProcFs) -> Result<(), MountError> {
    let scratch = &layout.scratch;
    // Nothing we do may propagate back to the host.
    mount(NO_SRC, "/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(step("make / private", "/"))?;

    // A scratch tmpfs becomes the root for a moment, with the host's root under /oldroot.
    // Any existing directory but / works as its mount point: pivot_root moves the tmpfs
    // off it, so /oldroot shows what was underneath.
    mount(
        Some("tmpfs"),
        scratch,
        Some("tmpfs"),
        libc::MS_NOSUID,
        Some("mode=0755,size=1m"),
    )
    .map_err(step("mount a scratch tmpfs on", scratch))?;
    mkdir(&scratch.join("oldroot"))?;
    pivot_root(scratch, &scratch.join("oldroot")).map_err(step("pivot_root into", scratch))?;
    chdir("/")?;
    mkdir(Path::new(NEW))?;
    // The new root is a directory of the scratch tmpfs, made a mount point by a self-bind
    // (cheaper than a second tmpfs; /oldroot, beside it, is not part of it).
    mount(Some(NEW), NEW, None, libc::MS_BIND, None).map_err(step("bind-mount", NEW))?;

    let tmpfs = layout.tmpfs.as_ref().map(|(p, size)| (p.as_path(), *size));
    build(&layout.plan, tmpfs, proc)?;

    // The root tmpfs only holds mount points: read-only from here on.
    mount(
        NO_SRC,
        NEW,
        None,
        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID,
        None,
    )
    .map_err(step("make the new root read-only", NEW))?;
    // Stack the old root on the new one and detach it: the host tree is gone.
    chdir(NEW)?;
    pivot_root(Path::new("."), Path::new(".")).map_err(step("pivot_root into", NEW))?;
    // SAFETY: umount2 of the stacked old root by a constant path.
    if unsafe { libc::umount2(c".".as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(step("detach the old root", "/")(io::Error::last_os_error()));
    }
    enter_workspace(workspace)
}

/// From the view's root into its workspace (if the view has one writable).
fn enter_workspace(workspace: &Path) -> Result<(), MountError> {
    chdir("/")?;
    if !workspace.as_os_str().is_empty() {
        let _ = std::env::set_current_dir(workspace);
    }
    Ok(())
}

/// For a private tmp that exists in the view only: its absolute path checked, and the
/// nearest existing directory above it (not /) to mount the scratch root on.
fn view_only_scratch(tmp: &Path) -> Result<PathBuf, MountError> {
    let invalid = || step("find the private temp dir", tmp)(io::ErrorKind::InvalidInput.into());
    if !tmp.is_absolute()
        || tmp
            .components()
            .any(|c| !matches!(c, Component::RootDir | Component::Normal(_)))
    {
        return Err(invalid());
    }
    let scratch = tmp
        .ancestors()
        .skip(1)
        .find(|a| a.is_dir())
        .filter(|a| *a != Path::new("/"))
        .ok_or_else(invalid)?;
    std::fs::canonicalize(scratch).map_err(step("find the parent of the private temp dir", tmp))
}

/// Create every mount point and mount of `plan` under /newroot. With `tmpfs` (the
/// private tmp's host path and a size), binds of that path get one fresh tmpfs instead.
fn build(plan: &Plan, tmpfs: Option<(&Path, u64)>, proc: ProcFs) -> Result<(), MountError> {
    // The tmpfs, once mounted: later binds of the private tmp bind it.
    let mut tmp_mount: Option<OwnedFd> = None;
    for bind in &plan.binds {
        place_bind(bind, tmpfs, &mut tmp_mount)?;
    }
    // Attributes after all binds (mount points inside a read-only bind could not be made),
    // parents first so each path ends with the mode of its most specific entry.
    for bind in &plan.binds {
        set_attrs(&under(NEW, &bind.dst), bind)?;
    }
    for (link, target) in &plan.symlinks {
        let at = under(NEW, link);
        if at.symlink_metadata().is_err() {
            if let Some(parent) = at.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            std::os::unix::fs::symlink(target, &at).map_err(step("create symlink", link))?;
        }
    }
    if plan.own_dev {
        build_dev(plan.private_shm, tmpfs.map(|(_, size)| size))?;
    }
    match (plan.own_proc, proc) {
        (true, ProcFs::Mount) => mount_proc()?,
        (true, ProcFs::Later) => procfs_point()?,
        (false, _) => {}
    }
    mask_secrets()
}

/// One entry of the view: an empty tmpfs over a hidden path, the private tmpfs (mounted
/// at its first entry, bound at the others), or a bind of the host path.
fn place_bind(
    bind: &Bind,
    tmpfs: Option<(&Path, u64)>,
    tmp_mount: &mut Option<OwnedFd>,
) -> Result<(), MountError> {
    let src = under(OLD, &bind.src);
    let dst = under(NEW, &bind.dst);
    let target = make_mount_point(&dst, bind.is_dir)?;
    if bind.mask {
        let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        return mount(
            Some("tmpfs"),
            fd_path(&target),
            Some("tmpfs"),
            flags,
            Some("mode=0755,size=64k"),
        )
        .map_err(step("hide (empty tmpfs over)", &bind.dst));
    }
    if let Some((tmp, size)) = tmpfs
        && bind.src == tmp
    {
        return place_private_tmp(bind, &dst, &target, size, tmp_mount);
    }
    // Bind what was checked: the canonical path opened without following any symlink
    // (a job sharing the workspace could swap a directory for a link in between).
    let source = open_beneath(None, &src, 0).map_err(step("open (no symlinks)", &bind.src))?;
    mount(
        Some(fd_path(&source)),
        fd_path(&target),
        None,
        libc::MS_BIND | libc::MS_REC,
        None,
    )
    .map_err(step("bind-mount", &bind.src))
}

/// The private tmpfs of `size` at `target`: mounted the first time, bound afterwards.
fn place_private_tmp(
    bind: &Bind,
    dst: &Path,
    target: &OwnedFd,
    size: u64,
    tmp_mount: &mut Option<OwnedFd>,
) -> Result<(), MountError> {
    if let Some(first) = tmp_mount {
        return mount(
            Some(fd_path(first)),
            fd_path(target),
            None,
            libc::MS_BIND,
            None,
        )
        .map_err(step("bind-mount the private tmpfs on", &bind.dst));
    }
    let data = format!("mode=1777,size={size}");
    mount(
        Some("tmpfs"),
        fd_path(target),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&data),
    )
    .map_err(step("mount the private tmpfs on", &bind.dst))?;
    *tmp_mount = Some(
        open_beneath(None, dst, libc::O_DIRECTORY)
            .map_err(step("open the private tmpfs", &bind.dst))?,
    );
    Ok(())
}

/// Cover the [`plan::MASKED`] files present in the view with /dev/null.
fn mask_secrets() -> Result<(), MountError> {
    let null = Path::new(NEW).join("dev/null");
    let null = if null.exists() {
        null
    } else {
        Path::new(OLD).join("dev/null")
    };
    for pattern in plan::MASKED {
        for file in expand(&under(NEW, Path::new(pattern))) {
            // Writable like any /dev/null: writes vanish, reads are empty.
            mount(Some(&null), &file, None, libc::MS_BIND, None).map_err(step("mask", &file))?;
        }
    }
    Ok(())
}

/// Existing files matching `pattern` (a `*` in the last component only).
fn expand(pattern: &Path) -> Vec<PathBuf> {
    let name = pattern
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let Some((prefix, suffix)) = name.split_once('*') else {
        return if pattern.is_file() {
            vec![pattern.to_path_buf()]
        } else {
            Vec::new()
        };
    };
    let Some(dir) = pattern.parent() else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.len() >= prefix.len() + suffix.len() && n.starts_with(prefix) && n.ends_with(suffix)
        })
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect()
}

/// Read-only (unless writable), nosuid, nodev, for the bind and every mount below it.
fn set_attrs(dst: &Path, bind: &Bind) -> Result<(), MountError> {
    let mut attr = MountAttr {
        attr_set: MOUNT_ATTR_NOSUID
            | MOUNT_ATTR_NODEV
            | if bind.writable { 0 } else { MOUNT_ATTR_RDONLY },
        attr_clr: if bind.writable { MOUNT_ATTR_RDONLY } else { 0 },
        propagation: 0,
        userns_fd: 0,
    };
    let c = cstr(dst)?;
    // SAFETY: mount_setattr(2) with a valid path and a correctly sized struct we own.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_RECURSIVE as libc::c_uint,
            &mut attr as *mut MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::ENOSYS) {
        return Err(step("set mount attributes on", &bind.dst)(err));
    }
    // Kernels before 5.12: remount the top mount only (binds below keep their flags).
    let flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV;
    let flags = if bind.writable {
        flags
    } else {
        flags | libc::MS_RDONLY
    };
    mount(NO_SRC, dst, None, flags, None).map_err(step("remount", &bind.dst))
}

/// Size of a private `/dev/shm` when the policy sets no `tmp_size` to bound it by.
const SHM_SIZE: u64 = 256 << 20;

/// /dev with the usual character devices (mknod; bind from the host where mknod is refused);
/// a private `/dev/shm` of at most `shm_size` (else [`SHM_SIZE`]) bytes if the policy lists it.
fn build_dev(private_shm: bool, shm_size: Option<u64>) -> Result<(), MountError> {
    let dev = Path::new(NEW).join("dev");
    mkdir(&dev)?;
    if private_shm {
        // POSIX shared memory and semaphores (Python's multiprocessing locks) need it;
        // its pages are charged to the job's memory cgroup and vanish with the job.
        let shm = dev.join("shm");
        mkdir(&shm)?;
        let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        let options = format!("mode=1777,size={}", shm_size.unwrap_or(SHM_SIZE));
        mount(
            Some("tmpfs"),
            &shm,
            Some("tmpfs"),
            flags,
            Some(options.as_str()),
        )
        .map_err(step("mount a private tmpfs on", "/dev/shm"))?;
    }
    for (name, major, minor) in OWN_DEVICES {
        let path = dev.join(name);
        let c = cstr(&path)?;
        // SAFETY: mknod(2) on a path inside our private tmpfs.
        let made = unsafe {
            libc::mknod(
                c.as_ptr(),
                libc::S_IFCHR | 0o666,
                libc::makedev(*major, *minor),
            )
        } == 0;
        if made {
            // SAFETY: chmod(2) past the umask, on the node just made.
            unsafe { libc::chmod(c.as_ptr(), 0o666) };
        } else {
            drop(make_mount_point(&path, false)?);
            let src = Path::new(OLD).join("dev").join(name);
            mount(Some(&src), &path, None, libc::MS_BIND, None)
                .map_err(step("bind-mount", &src))?;
        }
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, dev.join(name))
            .map_err(step("create symlink", &dev.join(name)))?;
    }
    Ok(())
}

/// The view's procfs at `at`: read-only, showing only processes the job could ptrace
/// (its own), of the PID namespace of the process that mounts it.
fn mount_procfs(at: &Path) -> io::Result<()> {
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RDONLY;
    mount(
        Some("proc"),
        at,
        Some("proc"),
        flags,
        Some("hidepid=ptraceable"),
    )
}

/// A read-only procfs showing only processes the job could ptrace (its own); falls back
/// to a read-only bind of the host's /proc where a new procfs may not be mounted.
fn mount_proc() -> Result<(), MountError> {
    let proc = Path::new(NEW).join("proc");
    mkdir(&proc)?;
    if mount_procfs(&proc).is_ok() {
        return Ok(());
    }
    mount(
        Some(&Path::new(OLD).join("proc")),
        &proc,
        None,
        libc::MS_BIND | libc::MS_REC,
        None,
    )
    .map_err(step("bind-mount", Path::new("/proc")))?;
    let bind = Bind {
        src: "/proc".into(),
        dst: "/proc".into(),
        writable: false,
        is_dir: true,
        mask: false,
    };
    set_attrs(&proc, &bind)
}

/// For a view made ahead: the mount point of the job's own procfs, once a procfs was
/// seen to mount there (a view whose job would need the fallback bind is not made ahead).
fn procfs_point() -> Result<(), MountError> {
    let proc = Path::new(NEW).join("proc");
    mkdir(&proc)?;
    mount_procfs(&proc).map_err(step("mount a procfs on", &proc))?;
    // SAFETY: umount2(2) of the procfs just mounted, by a path we built.
    if unsafe { libc::umount2(cstr(&proc)?.as_ptr(), 0) } != 0 {
        return Err(step("unmount the trial procfs on", &proc)(
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

fn under(root: &str, path: &Path) -> PathBuf {
    Path::new(root).join(path.strip_prefix("/").unwrap_or(path))
}

/// Create the mount point `dst` (under /newroot) without following any symlink on the
/// way — part of the path may run through a writable bind (the private tmp under the
/// /tmp alias) where a job could have planted links — and return a descriptor of it.
fn make_mount_point(dst: &Path, is_dir: bool) -> Result<OwnedFd, MountError> {
    let fail = step("create mount point", dst);
    let rel = dst.strip_prefix("/").unwrap_or(dst);
    let mut comps: Vec<&std::ffi::OsStr> = rel.iter().collect();
    let Some(last) = comps.pop() else {
        return Err(fail(io::ErrorKind::InvalidInput.into()));
    };
    let made = (|| {
        let mut dir = open_beneath(None, Path::new("/"), libc::O_DIRECTORY)?;
        for comp in comps {
            dir = mkdir_open(&dir, comp)?;
        }
        if is_dir {
            return mkdir_open(&dir, last);
        }
        let name = CString::new(last.as_bytes()).map_err(io::Error::other)?;
        // SAFETY: openat(2) relative to a directory descriptor we own; closed at once.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::O_CREAT | libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o644,
            )
        };
        if fd >= 0 {
            // SAFETY: closing the descriptor just opened.
            unsafe { libc::close(fd) };
        }
        open_beneath(Some(&dir), Path::new(last), 0)
    })();
    made.map_err(fail)
}

/// The magic-link path of `fd`, usable as a mount source or target while /oldroot exists.
fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("{OLD}/proc/self/fd/{}", fd.as_raw_fd()))
}

fn mkdir(path: &Path) -> Result<(), MountError> {
    match std::fs::create_dir(path) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(step("create", path)(e)),
        _ => Ok(()),
    }
}

fn chdir(path: impl AsRef<Path>) -> Result<(), MountError> {
    std::env::set_current_dir(path.as_ref()).map_err(step("chdir to", path.as_ref()))
}

fn step<'a>(
    step: &'static str,
    path: impl AsRef<Path> + 'a,
) -> impl FnOnce(io::Error) -> MountError + 'a {
    move |source| MountError::Step {
        step,
        path: path.as_ref().to_path_buf(),
        source,
    }
}

fn cstr(path: &Path) -> Result<CString, MountError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        step("use", path)(io::Error::new(
            io::ErrorKind::InvalidInput,
            "path contains a NUL byte",
        ))
    })
}

#[cfg(test)]
mod tests;
