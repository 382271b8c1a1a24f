//! The policies uv processes run under: the session's policy, plus network and write
//! access to exactly the paths the operation must change (the venv, the uv cache).
//!
//! Session code itself never gets these grants: the session policy sees the venv
//! only through its `{venv}` read rule, and keeps its own network setting.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::sandbox::{KernelSupportMode, NetworkPolicy, ResolvedPolicy};

/// What a uv process may do beyond the session's policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Grants {
    /// Paths the process may write (created before the policy is built: Landlock
    /// rules name existing paths).
    pub write: Vec<PathBuf>,
    /// Paths the process may read, e.g. a find-links directory, an inline script,
    /// TLS roots.
    pub read: Vec<PathBuf>,
    /// Programs the process may execute: the uv binary, the base interpreter.
    pub execute: Vec<PathBuf>,
    /// Whether the process gets the installer's network (package resolution and
    /// downloads): the policy's `[installer.network]`, by default the broker's proxy
    /// to uv's configured indexes only.
    pub network: bool,
    /// Take away the session's writes to the workspace (they become reads), so the
    /// process writes only to `write`, its private temp dir and devices. For installers:
    /// a package's build script then cannot touch the agent's files.
    pub confine_writes: bool,
}

/// The session policy extended by `grants`; `netns_usable`: whether this process can
/// make network namespaces (`sandbox::Runtime::namespaces_usable`).
pub(crate) fn extend(base: &ResolvedPolicy, grants: &Grants, netns_usable: bool) -> ResolvedPolicy {
    let mut p = base.clone();
    if grants.confine_writes && !base.filesystem_unrestricted() {
        let workspace = p.workspace.clone();
        let moved: Vec<PathBuf> = p
            .write
            .iter()
            .filter(|w| w.starts_with(&workspace))
            .cloned()
            .collect();
        p.write.retain(|w| !w.starts_with(&workspace));
        for m in moved {
            p = p.with_read(m);
        }
    }
    for w in &grants.write {
        p = p.with_write(w);
    }
    // What it writes is measured against a disk bound (envs::store): no instant
    // allocation of disk the measure could not follow.
    p.no_preallocation |= !grants.write.is_empty();
    for r in &grants.read {
        p = p.with_read(r);
    }
    for x in &grants.execute {
        p = p.with_execute(x);
    }
    if grants.network {
        p = p.with_network(installer_network(base, netns_usable));
    }
    p
}

/// The installer's network: `[installer.network]`, with an empty proxy allow list
/// filled from uv's configured indexes.
///
/// Under `kernel_support = "best_effort"` on a machine where this process cannot make
/// network namespaces (no CAP_SYS_ADMIN and no user namespace), proxy mode cannot be had: the installer then gets the
/// host's network, as the rest of a best-effort policy runs without what is missing. A
/// `required` policy keeps proxy mode and fails closed at spawn.
pub(crate) fn installer_network(base: &ResolvedPolicy, netns_usable: bool) -> NetworkPolicy {
    if matches!(base.installer_network, NetworkPolicy::Proxy { .. })
        && base.kernel_support == KernelSupportMode::BestEffort
        && !netns_usable
    {
        tracing::warn!(
            "policy {}: no network namespaces here, so installs use the host's network instead of the broker",
            base.name
        );
        return NetworkPolicy::Full;
    }
    match &base.installer_network {
        NetworkPolicy::Proxy { allow } if allow.is_empty() => NetworkPolicy::Proxy {
            allow: super::uv::default_index_allow(std::env::vars()),
        },
        other => other.clone(),
    }
}

/// What each path of the server may reach over the network under `policy`, in words:
/// (path, what). For `doctor` and `policy show`.
pub(crate) fn network_reach(
    policy: &ResolvedPolicy,
    netns_usable: bool,
) -> Vec<(&'static str, String)> {
    let session = policy.network.describe();
    let installer = installer_network(policy, netns_usable).describe();
    let build = if policy.wheels_only {
        "wheels only (--no-build): no package build code runs"
    } else {
        "sdists are built: their build hooks run under these same rules"
    };
    vec![
        ("session (python_exec)", session.clone()),
        ("shell (shell_run)", session.clone()),
        (
            "script (python_run_script)",
            format!("dependencies resolved {installer}; the script itself: {session}"),
        ),
        ("install (env_install)", format!("{installer}; {build}")),
    ]
}

/// `PATH` for a uv process: the directory of `python` first, then the entries of
/// `path` the policy lets it execute from. uv searches PATH for interpreters and stops
/// at the first one it cannot run (a pyenv shim outside the sandbox's execute set), so
/// the entries it could never use are left out.
pub(crate) fn sandbox_path(
    policy: &ResolvedPolicy,
    python: &Path,
    path: Option<&OsStr>,
) -> OsString {
    let mut dirs: Vec<PathBuf> = python.parent().map(Path::to_path_buf).into_iter().collect();
    for dir in path.map(std::env::split_paths).into_iter().flatten() {
        let allowed = policy.filesystem_unrestricted()
            || policy.execute.iter().any(|root| dir.starts_with(root));
        if allowed && !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    std::env::join_paths(dirs).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::{Placeholders, Policy};

    fn session_policy(name: &str) -> ResolvedPolicy {
        let ph = Placeholders {
            workspace: "/ws".into(),
            tmp: "/state/tmp".into(),
            python: vec!["/py".into()],
            venv: None,
            uv_cache: Some("/state/uv-cache".into()),
        };
        Policy::load(name).unwrap().resolve(&ph).unwrap()
    }

    /// The installer writes only the venv, the uv cache, its temp dir and devices, and
    /// gets the network; the session policy it derives from is unchanged.
    #[test]
    fn installer_policy_writes_only_venv_and_cache() {
        let base = session_policy("workspace-write");
        assert!(base.write.contains(&PathBuf::from("/ws")));
        let grants = Grants {
            write: vec!["/state/venvs/s".into(), "/state/uv-cache".into()],
            read: vec!["/wheels".into()],
            execute: vec!["/bin/uv".into()],
            network: true,
            confine_writes: true,
        };
        let p = extend(&base, &grants, true);
        let unexpected: Vec<&PathBuf> = p
            .write
            .iter()
            .filter(|w| !w.starts_with("/dev") && w.as_path() != Path::new("/state/tmp"))
            .filter(|w| !grants.write.contains(w))
            .collect();
        assert!(unexpected.is_empty(), "{unexpected:?}");
        assert!(
            p.read.contains(&PathBuf::from("/ws")) && p.read.contains(&PathBuf::from("/wheels"))
        );
        assert!(p.execute.contains(&PathBuf::from("/bin/uv")));
        assert!(
            matches!(&p.network, NetworkPolicy::Proxy { allow } if allow.iter().any(|a| a == "files.pythonhosted.org") || std::env::var_os("UV_INDEX_URL").is_some()),
            "{:?}",
            p.network
        );
        assert_eq!(base.network, NetworkPolicy::None);
        assert!(!base.write.contains(&PathBuf::from("/state/venvs/s")));
    }

    /// A one-off script keeps the session's writes and gets the cache on top.
    #[test]
    fn script_policy_keeps_session_writes() {
        let base = session_policy("workspace-write");
        let grants = Grants {
            write: vec!["/state/uv-cache".into()],
            network: true,
            ..Grants::default()
        };
        let p = extend(&base, &grants, true);
        assert!(
            p.write.contains(&PathBuf::from("/ws"))
                && p.write.contains(&PathBuf::from("/state/uv-cache"))
        );
    }

    #[test]
    fn reach_names_every_path() {
        let base = session_policy("workspace-write");
        let reach = network_reach(&base, true);
        let paths: Vec<&str> = reach.iter().map(|(p, _)| *p).collect();
        assert_eq!(
            paths,
            [
                "session (python_exec)",
                "shell (shell_run)",
                "script (python_run_script)",
                "install (env_install)"
            ]
        );
        assert_eq!(reach[0].1, "off");
        assert!(
            reach[3].1.contains("through the server's proxy"),
            "{reach:?}"
        );
        assert!(reach[2].1.ends_with("the script itself: off"), "{reach:?}");
    }

    #[test]
    fn path_keeps_only_executable_dirs() {
        let base = session_policy("workspace-write");
        let path = OsString::from("/root/.pyenv/shims:/usr/bin:/ws/bin:/opt/x");
        let got = sandbox_path(&base, Path::new("/py/bin/python3"), Some(&path));
        assert_eq!(got, OsString::from("/py/bin:/usr/bin:/ws/bin"));
    }
}
