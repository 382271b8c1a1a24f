//! Kernel probing: what this machine actually offers the sandbox — Landlock ABI,
//! seccomp filter mode, namespaces (each tried for real in a forked child), cgroup
//! version and whether the pids / memory controllers are usable by this process
//! (tried by creating and removing a job cgroup). Feeds `doctor` and fail-closed checks.

use std::ffi::CStr;
use std::io;

use serde::Serialize;

use super::cgroup::ambient::AmbientLimits;
use super::cgroup::{CgroupError, CgroupHost, CgroupVersion, JobCgroup};

pub(crate) mod enforcement;
pub(crate) mod per_job;

/// Why a probed mechanism is not usable here.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    #[error("this kernel is built without Landlock (CONFIG_SECURITY_LANDLOCK)")]
    LandlockMissing,
    #[error("Landlock is built in but disabled: add `landlock` to the lsm= boot parameter")]
    LandlockDisabled,
    #[error("Landlock version query failed: {0}")]
    LandlockQuery(#[source] io::Error),
    #[error("seccomp filter mode unavailable: {0}")]
    Seccomp(#[source] io::Error),
    #[error("fork failed: {0}")]
    Fork(#[source] io::Error),
    #[error("waitpid failed: {0}")]
    Wait(#[source] io::Error),
    #[error("probe child died")]
    ChildDied,
    #[error("{0} (user namespaces disabled)")]
    UserNamespacesDisabled(#[source] io::Error),
    #[error(
        "{0} (the launcher needs CAP_SYS_ADMIN, or a user namespace to make its namespaces \
         in: run the server as root with CAP_SYS_ADMIN, or allow user namespaces)"
    )]
    NeedsRoot(#[source] io::Error),
    #[error(
        "{0} (refused even in a user namespace of the launcher's own: run the server as \
         root, or where the kernel and any container profile allow this)"
    )]
    RefusedInUserNamespace(#[source] io::Error),
    /// What the probe child's failing call returned.
    #[error(transparent)]
    Os(io::Error),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
}

/// Outcome of one probe: usable, or why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Probe {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Probe {
    fn from(result: Result<(), ProbeError>) -> Probe {
        match result {
            Ok(()) => Probe {
                ok: true,
                error: None,
            },
            Err(e) => Probe {
                ok: false,
                error: Some(e.to_string()),
            },
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Namespaces {
    pub user: Probe,
    pub pid: Probe,
    pub network: Probe,
    pub mount: Probe,
    /// A new procfs with `hidepid=ptraceable` can be mounted (else the view binds the
    /// host's /proc and other processes stay listed).
    pub procfs_hidepid: Probe,
    /// The four probes above were made inside a user namespace of the prober's own, as
    /// the launcher makes a job's namespaces when the server is not root and lacks
    /// CAP_SYS_ADMIN (`launcher::userns`). The server's own threads cannot make network
    /// namespaces then (the install broker's needs one): only the launcher can.
    pub in_user_namespace: bool,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct CgroupSupport {
    pub version: CgroupVersion,
    /// v1 controllers plus an (empty) cgroup2 mount.
    pub hybrid: bool,
    /// Where job cgroups go for the pids controller (v2: the one directory).
    pub pids_dir: Option<String>,
    pub memory_dir: Option<String>,
    /// A job cgroup with a process cap could be created and removed here.
    pub pids: Probe,
    /// A job cgroup with a memory cap could be created and removed here.
    pub memory: Probe,
    /// v2 only: controllers offered to this process's cgroup.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub v2_controllers: Vec<String>,
    /// The limits this process's own cgroup (and those above it) already set: what still
    /// holds the server and its jobs together where jobs get no cgroup each.
    pub ambient: AmbientLimits,
    /// Whether each job's memory and process limits are held by a cgroup of its own, in
    /// words (`per_job::words`): how, or why not, what instead, what holds them together.
    pub per_job: String,
}

impl CgroupSupport {
    /// Whether jobs get a cgroup each (the pids and the memory probe both made one).
    pub(crate) fn per_job_enforced(&self) -> bool {
        self.pids.ok && self.memory.ok
    }
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct KernelSupport {
    pub kernel: String,
    pub euid: u32,
    pub is_root: bool,
    /// Landlock ABI version, if Landlock is enabled.
    pub landlock_abi: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub landlock_error: Option<String>,
    /// What the ABI gives, in words.
    pub landlock_features: Vec<&'static str>,
    /// seccomp filter mode (SECCOMP_SET_MODE_FILTER) is available.
    pub seccomp_filter: Probe,
    pub namespaces: Namespaces,
    pub cgroup: CgroupSupport,
}

/// What each Landlock ABI version adds.
pub(crate) const LANDLOCK_FEATURES: &[(u32, &str)] = &[
    (1, "file-system access rules"),
    (2, "rename/link across directories (refer)"),
    (3, "truncate"),
    (4, "TCP bind/connect port rules"),
    (5, "ioctl on device files"),
    (6, "scoping of abstract unix sockets and signals"),
    (7, "audit logging control"),
];

impl KernelSupport {
    /// Probe everything (tens of milliseconds: a few forks and a cgroup create/remove).
    pub(crate) fn probe() -> KernelSupport {
        // SAFETY: geteuid(2) cannot fail.
        let euid = unsafe { libc::geteuid() };
        let (landlock_abi, landlock_error) = match landlock_abi() {
            Ok(v) => (Some(v), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let landlock_features = LANDLOCK_FEATURES
            .iter()
            .filter(|(v, _)| landlock_abi.is_some_and(|abi| abi >= *v))
            .map(|(_, f)| *f)
            .collect();
        KernelSupport {
            kernel: kernel_release(),
            euid,
            is_root: euid == 0,
            landlock_abi,
            landlock_error,
            landlock_features,
            seccomp_filter: Probe::from(seccomp_filter()),
            namespaces: probe_namespaces(),
            cgroup: {
                let mut cg = probe_cgroups();
                cg.per_job = per_job::words(&per_job::Inputs {
                    version: cg.version,
                    pids_dir: cg.pids_dir.as_deref(),
                    memory_dir: cg.memory_dir.as_deref(),
                    pids_error: cg.pids.error.as_deref().filter(|_| !cg.pids.ok),
                    memory_error: cg.memory.error.as_deref().filter(|_| !cg.memory.ok),
                    ambient: &cg.ambient,
                    is_root: euid == 0,
                });
                cg
            },
        }
    }
}

/// The namespaces a job gets, made as the launcher makes them: directly (root, or
/// CAP_SYS_ADMIN), else inside a user namespace of its own where the kernel allows one.
fn probe_namespaces() -> Namespaces {
    let user = Probe::from(in_child(libc::CLONE_NEWUSER, Mount::No, None));
    let userns = (user.ok && crate::sandbox::launcher::userns::wanted()).then(UserMaps::own);
    let u = userns.as_ref();
    Namespaces {
        pid: Probe::from(in_child(libc::CLONE_NEWPID, Mount::No, u)),
        network: Probe::from(in_child(libc::CLONE_NEWNET, Mount::No, u)),
        mount: Probe::from(in_child(libc::CLONE_NEWNS, Mount::Tmpfs, u)),
        procfs_hidepid: Probe::from(in_child(libc::CLONE_NEWNS, Mount::Proc, u)),
        in_user_namespace: userns.is_some(),
        user,
    }
}

/// The map files the launcher writes after its `unshare(CLONE_NEWUSER)`, prepared before
/// the fork so that the probe child only makes raw syscalls.
pub(crate) struct UserMaps {
    files: Vec<(std::ffi::CString, Vec<u8>)>,
}

impl UserMaps {
    pub(crate) fn own() -> UserMaps {
        // SAFETY: geteuid/getegid cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let files = crate::sandbox::launcher::userns::maps(uid, gid)
            .into_iter()
            .filter_map(|(f, line)| Some((std::ffi::CString::new(f).ok()?, line.into_bytes())))
            .collect();
        UserMaps { files }
    }

    /// In the probe child: unshare the user namespace and write the maps; the errno on failure.
    ///
    /// # Safety
    /// Only raw syscalls: callable in a forked child of a multi-threaded process.
    pub(crate) unsafe fn enter(&self) -> Result<(), i32> {
        // SAFETY: raw syscalls on buffers owned by `self`.
        unsafe {
            let errno = || *libc::__errno_location();
            if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                return Err(errno());
            }
            // As the launcher does (`userns::Dumpable`): a non-dumpable process (the
            // hardened server's fork) cannot write its own maps. This child ends soon.
            libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
            for (file, line) in &self.files {
                let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(errno());
                }
                let n = libc::write(fd, line.as_ptr().cast(), line.len());
                let e = errno();
                libc::close(fd);
                if n != line.len() as isize {
                    return Err(e.max(libc::EIO));
                }
            }
            Ok(())
        }
    }
}

/// `landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`.
pub(crate) fn landlock_abi() -> Result<u32, ProbeError> {
    // SAFETY: the documented version query: null attr, size 0, flag 1.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    if rc >= 0 {
        return Ok(rc as u32);
    }
    let err = io::Error::last_os_error();
    Err(match err.raw_os_error() {
        Some(libc::ENOSYS) => ProbeError::LandlockMissing,
        Some(libc::EOPNOTSUPP) => ProbeError::LandlockDisabled,
        _ => ProbeError::LandlockQuery(err),
    })
}

fn seccomp_filter() -> Result<(), ProbeError> {
    let action: u32 = libc::SECCOMP_RET_KILL_PROCESS;
    // SAFETY: seccomp(SECCOMP_GET_ACTION_AVAIL) only reads the u32 we pass.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_ACTION_AVAIL,
            0u32,
            &action as *const u32,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(ProbeError::Seccomp(io::Error::last_os_error()))
    }
}

/// Try `unshare(flag)` in a forked child (and for mount namespaces also make / private
/// and mount a tmpfs, which is what the mount view needs). The child only makes raw
/// syscalls and `_exit`s, so this is safe from a multi-threaded process.
/// `Mount::Proc` also mounts the procfs the view uses (read-only, `hidepid=ptraceable`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mount {
    No,
    Tmpfs,
    Proc,
}

/// With `userns`, a user namespace of the child's own first (as the launcher does); a
/// procfs is then mounted from a grandchild in the new PID namespace, as the kernel lets
/// only a PID namespace's own user namespace mount its procfs.
fn in_child(
    flag: libc::c_int,
    mount_test: Mount,
    userns: Option<&UserMaps>,
) -> Result<(), ProbeError> {
    // SAFETY: fork(2); the child runs only async-signal-safe syscalls, then _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(ProbeError::Fork(io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: child side; every call is a raw syscall on constant arguments.
        unsafe {
            let errno = || *libc::__errno_location();
            if let Some(maps) = userns {
                enter_user_namespace(maps, mount_test);
            }
            if libc::unshare(flag) != 0 {
                libc::_exit(errno());
            }
            if mount_test != Mount::No {
                let none = std::ptr::null();
                if libc::mount(
                    none,
                    c"/".as_ptr(),
                    none,
                    libc::MS_REC | libc::MS_PRIVATE,
                    none.cast(),
                ) != 0
                {
                    libc::_exit(errno());
                }
                if libc::mount(
                    c"tmpfs".as_ptr(),
                    c"/tmp".as_ptr(),
                    c"tmpfs".as_ptr(),
                    0,
                    none.cast(),
                ) != 0
                {
                    libc::_exit(errno());
                }
            }
            if mount_test == Mount::Proc {
                let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RDONLY;
                let data = c"hidepid=ptraceable";
                let (proc_, tmp) = (c"proc".as_ptr(), c"/tmp".as_ptr());
                if libc::mount(proc_, tmp, proc_, flags, data.as_ptr().cast()) != 0 {
                    libc::_exit(errno());
                }
            }
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for the child we just forked.
    if unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        return Err(ProbeError::Wait(io::Error::last_os_error()));
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        return Ok(());
    }
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        0
    };
    let why = io::Error::from_raw_os_error(code);
    Err(match code {
        0 => ProbeError::ChildDied,
        libc::EPERM if flag == libc::CLONE_NEWUSER => ProbeError::UserNamespacesDisabled(why),
        libc::EPERM if userns.is_some() => ProbeError::RefusedInUserNamespace(why),
        libc::EPERM => ProbeError::NeedsRoot(why),
        _ => ProbeError::Os(why),
    })
}

/// In the probe child: the launcher's user namespace, and for a procfs probe a PID
/// namespace whose grandchild goes on (this child waits and ends as it did). Ends the
/// child with the errno on failure.
///
/// # Safety
/// Only raw syscalls and `_exit`: callable in a forked child of a multi-threaded process.
unsafe fn enter_user_namespace(maps: &UserMaps, mount_test: Mount) {
    // SAFETY: raw syscalls in the forked probe child.
    unsafe {
        let errno = || *libc::__errno_location();
        if let Err(e) = maps.enter() {
            libc::_exit(e);
        }
        if mount_test != Mount::Proc {
            return;
        }
        if libc::unshare(libc::CLONE_NEWPID) != 0 {
            libc::_exit(errno());
        }
        match libc::fork() {
            -1 => libc::_exit(errno()),
            0 => {}
            grandchild => {
                let mut status = 0;
                libc::waitpid(grandchild, &mut status, 0);
                let code = if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else {
                    libc::EIO
                };
                libc::_exit(code);
            }
        }
    }
}

fn probe_cgroups() -> CgroupSupport {
    let host = CgroupHost::new();
    let layout = host.layout();
    let show = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
    let (pids_dir, memory_dir) = match layout.version {
        CgroupVersion::V2 => (show(&layout.v2_own), show(&layout.v2_own)),
        _ => (show(&layout.v1_pids), show(&layout.v1_memory)),
    };
    let name = format!("doctor-{}", std::process::id());
    let pids = Probe::from(
        JobCgroup::create(&host, &name, None, Some(8))
            .map(drop)
            .map_err(ProbeError::from),
    );
    let memory = Probe::from(
        JobCgroup::create(&host, &name, Some(64 << 20), Some(8))
            .map(drop)
            .map_err(ProbeError::from),
    );
    CgroupSupport {
        version: layout.version,
        hybrid: layout.hybrid,
        pids_dir,
        memory_dir,
        pids,
        memory,
        v2_controllers: layout.v2_controllers.clone(),
        ambient: AmbientLimits::read(layout),
        per_job: String::new(),
    }
}

fn kernel_release() -> String {
    // SAFETY: utsname is plain old data; uname(2) fills it.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: uname writes into the struct we own.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return "unknown".into();
    }
    // SAFETY: release is NUL-terminated by the kernel.
    unsafe { CStr::from_ptr(uts.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On this machine (root, Landlock enabled) the probe finds what the BRIEF promises;
    /// a missing feature fails loudly here rather than letting sandbox tests skip.
    #[test]
    fn probe_reports_this_machine() {
        let k = KernelSupport::probe();
        assert!(k.landlock_abi.is_some_and(|v| v >= 1), "{k:?}");
        assert_eq!(
            k.landlock_features.len() as u32,
            k.landlock_abi.unwrap().min(7)
        );
        assert!(k.seccomp_filter.ok, "{k:?}");
        assert!(k.namespaces.mount.ok && k.namespaces.network.ok, "{k:?}");
        if k.is_root {
            assert!(k.cgroup.pids.ok, "{k:?}");
        }
    }
}
