//! Placeholder resolution: a [`Policy`] plus the [`Placeholders`] of one job or session
//! becomes a [`ResolvedPolicy`] with every path absolute — what the launcher enforces —
//! and the copies installers need (`with_write`, `with_read`, `with_network`).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::PolicyError;
use super::{KernelSupportMode, NetworkMode, Policy, Scoping};

/// Values for the placeholders a policy may use in paths.
#[derive(Debug, Clone, Default)]
pub struct Placeholders {
    /// `{workspace}`: the directory the agent works in.
    pub workspace: PathBuf,
    /// `{tmp}`: a private temp directory for this job or session (the caller creates it).
    pub tmp: PathBuf,
    /// `{python}`: installation prefixes of the interpreter in use (sys.prefix, sys.base_prefix, ...).
    pub python: Vec<PathBuf>,
    /// `{venv}`: the session's virtual environment, if any.
    pub venv: Option<PathBuf>,
    /// `{uv_cache}`: uv's cache directory, if known.
    pub uv_cache: Option<PathBuf>,
}

/// The network a process gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum NetworkPolicy {
    /// No sockets but AF_UNIX.
    None,
    /// A private network namespace with only loopback up.
    Loopback,
    /// TCP only, to / on these ports (Landlock ABI 4+); no UDP, no raw sockets.
    Ports { connect: Vec<u16>, bind: Vec<u16> },
    /// An empty network namespace whose only listener is the server's broker, an
    /// HTTP(S) proxy that connects to these hosts only (entries of `sandbox::allow`).
    /// TCP connect to the broker's port only; no UDP, no raw sockets.
    Proxy { allow: Vec<String> },
    /// The host's network.
    Full,
}

impl NetworkPolicy {
    /// What a process under this network policy may reach, in words.
    pub fn describe(&self) -> String {
        match self {
            NetworkPolicy::None => "off".to_string(),
            NetworkPolicy::Loopback => "a private loopback only".to_string(),
            NetworkPolicy::Ports { connect, bind } => {
                format!("TCP only, connect ports {connect:?}, bind ports {bind:?}")
            }
            NetworkPolicy::Proxy { allow } if allow.is_empty() => {
                "only through the server's proxy, to no host".to_string()
            }
            NetworkPolicy::Proxy { allow } => {
                format!("only through the server's proxy, to {}", allow.join(", "))
            }
            NetworkPolicy::Full => "on".to_string(),
        }
    }
}

/// Resource limits; `None` is no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub memory_bytes: Option<u64>,
    pub cpu_seconds: Option<u64>,
    pub wall_seconds: Option<u64>,
    pub file_size_bytes: Option<u64>,
    /// Size of the `{tmp}` tmpfs (the kernel's default, half of RAM, when `None`; its
    /// pages count against the job's memory either way).
    #[serde(default)]
    pub tmp_size_bytes: Option<u64>,
    pub processes: Option<u64>,
    pub open_files: Option<u64>,
}

/// A policy with every path absolute, ready for the launcher.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolvedPolicy {
    pub name: String,
    pub kernel_support: KernelSupportMode,
    pub workspace: PathBuf,
    pub tmp: PathBuf,
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
    pub execute: Vec<PathBuf>,
    /// Covered by an empty read-only directory in the mount view.
    #[serde(default)]
    pub hide: Vec<PathBuf>,
    pub network: NetworkPolicy,
    pub abstract_unix_sockets: Scoping,
    pub signals: Scoping,
    /// Names of the server's variables passed through (`*` = all).
    pub env_pass: Vec<String>,
    /// Variables set in the child, placeholders resolved.
    pub env_set: BTreeMap<String, String>,
    pub limits: Limits,
    pub drop_capabilities: bool,
    pub syscall_filter: bool,
    /// The network of installs, resolution and build hooks (`[installer.network]`);
    /// `Proxy` with an empty allow list means "uv's configured indexes" (filled in by
    /// the installer, which knows uv's settings).
    pub installer_network: NetworkPolicy,
    /// `[installer] wheels_only`: pass `--no-build` to every install.
    pub wheels_only: bool,
    /// Refuse `fallocate` (`EOPNOTSUPP`): disk is then taken only by writing it, at a
    /// pace a measure of the disk can follow (glibc's `posix_fallocate` writes the blocks
    /// itself). Set by the installer for processes that write a bounded store.
    #[serde(default)]
    pub no_preallocation: bool,
}

/// The [`NetworkPolicy`] a `[network]`-shaped section asks for.
fn network_policy(section: &super::NetworkSection) -> NetworkPolicy {
    match section.mode {
        NetworkMode::None => NetworkPolicy::None,
        NetworkMode::Loopback => NetworkPolicy::Loopback,
        NetworkMode::Ports => NetworkPolicy::Ports {
            connect: section.connect.clone(),
            bind: section.bind.clone(),
        },
        NetworkMode::Proxy => NetworkPolicy::Proxy {
            allow: section.allow.clone(),
        },
        NetworkMode::Full => NetworkPolicy::Full,
    }
}

impl Policy {
    /// Resolve placeholders into absolute paths; the result is what the launcher enforces.
    /// A path whose placeholder has no value (`{venv}` without a venv) is left out.
    pub fn resolve(&self, ph: &Placeholders) -> Result<ResolvedPolicy, PolicyError> {
        let err = |message: String| PolicyError::Resolve {
            policy: self.name.clone(),
            message,
        };
        for (what, p) in [("workspace", &ph.workspace), ("tmp", &ph.tmp)] {
            if !p.is_absolute() {
                return Err(err(format!(
                    "the {what} path {} is not absolute",
                    p.display()
                )));
            }
        }
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let expand = |paths: &[String]| -> Vec<PathBuf> {
            let mut out: Vec<PathBuf> = Vec::new();
            for p in paths {
                for path in expand_path(p, ph, home.as_deref()) {
                    if !out.contains(&path) {
                        out.push(path);
                    }
                }
            }
            out
        };
        let fs = &self.filesystem;
        let network = network_policy(&self.network);
        let env_set = self
            .environment
            .set
            .iter()
            .map(|(k, v)| (k.clone(), expand_text(v, ph, home.as_deref())))
            .collect();
        Ok(ResolvedPolicy {
            name: self.name.clone(),
            kernel_support: self.kernel_support,
            workspace: ph.workspace.clone(),
            tmp: ph.tmp.clone(),
            read: expand(&fs.read),
            write: expand(&fs.write),
            execute: expand(&fs.execute),
            hide: expand(&fs.hide),
            network,
            abstract_unix_sockets: self.ipc.abstract_unix_sockets,
            signals: self.ipc.signals,
            env_pass: self.environment.pass.clone(),
            env_set,
            limits: Limits {
                memory_bytes: self.memory_bytes(),
                cpu_seconds: self.limits.cpu_seconds,
                wall_seconds: self.limits.wall_seconds,
                file_size_bytes: self.file_size_bytes(),
                tmp_size_bytes: self.tmp_size_bytes(),
                processes: self.limits.processes,
                open_files: self.limits.open_files,
            },
            drop_capabilities: self.process.drop_capabilities,
            syscall_filter: self.process.syscall_filter,
            installer_network: network_policy(&self.installer.network),
            wheels_only: self.installer.wheels_only,
            no_preallocation: false,
        })
    }
}

impl Policy {
    /// Whether resolving this policy needs a value for `placeholder` (`"{python}"`): a
    /// path starts with it or a variable's value holds it. A caller whose value costs
    /// something to find (a PATH search for `{python}`) finds it only then.
    pub fn uses_placeholder(&self, placeholder: &str) -> bool {
        let fs = &self.filesystem;
        [&fs.read, &fs.write, &fs.execute, &fs.hide]
            .into_iter()
            .flatten()
            .any(|p| {
                p.strip_prefix(placeholder)
                    .is_some_and(|tail| tail.is_empty() || tail.starts_with('/'))
            })
            || self
                .environment
                .set
                .values()
                .any(|v| v.contains(placeholder))
    }
}

fn expand_path(p: &str, ph: &Placeholders, home: Option<&Path>) -> Vec<PathBuf> {
    let Some(rest) = p.strip_prefix('{') else {
        return vec![PathBuf::from(p)];
    };
    let Some((name, tail)) = rest.split_once('}') else {
        return vec![PathBuf::from(p)];
    };
    let bases: Vec<PathBuf> = match name {
        "workspace" => vec![ph.workspace.clone()],
        "tmp" => vec![ph.tmp.clone()],
        "python" => ph.python.clone(),
        "venv" => ph.venv.iter().cloned().collect(),
        "uv_cache" => ph.uv_cache.iter().cloned().collect(),
        "home" => home.iter().map(|h| h.to_path_buf()).collect(),
        _ => Vec::new(),
    };
    let tail = tail.trim_start_matches('/');
    bases
        .into_iter()
        .map(|b| if tail.is_empty() { b } else { b.join(tail) })
        .collect()
}

fn expand_text(v: &str, ph: &Placeholders, home: Option<&Path>) -> String {
    let mut out = v.replace("{workspace}", &ph.workspace.to_string_lossy());
    out = out.replace("{tmp}", &ph.tmp.to_string_lossy());
    if let Some(venv) = &ph.venv {
        out = out.replace("{venv}", &venv.to_string_lossy());
    }
    if let Some(cache) = &ph.uv_cache {
        out = out.replace("{uv_cache}", &cache.to_string_lossy());
    }
    if let Some(home) = home {
        out = out.replace("{home}", &home.to_string_lossy());
    }
    out
}

impl ResolvedPolicy {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A copy that may also write (and read) `path` — e.g. a venv for an installer.
    pub fn with_write(&self, path: impl Into<PathBuf>) -> ResolvedPolicy {
        let mut p = self.clone();
        let path = path.into();
        if !p.write.contains(&path) {
            p.write.push(path);
        }
        p
    }

    /// A copy that may also read `path`.
    pub fn with_read(&self, path: impl Into<PathBuf>) -> ResolvedPolicy {
        let mut p = self.clone();
        let path = path.into();
        if !p.read.contains(&path) {
            p.read.push(path);
        }
        p
    }

    /// A copy that may also execute (and read) files under `path`.
    pub fn with_execute(&self, path: impl Into<PathBuf>) -> ResolvedPolicy {
        let mut p = self.clone();
        let path = path.into();
        if !p.execute.contains(&path) {
            p.execute.push(path);
        }
        p
    }

    /// A copy with another network policy (e.g. `Full` for a package installer).
    pub fn with_network(&self, network: NetworkPolicy) -> ResolvedPolicy {
        let mut p = self.clone();
        p.network = network;
        p
    }

    /// Whether the file system is left unrestricted (`/` writable and executable).
    pub fn filesystem_unrestricted(&self) -> bool {
        let root = Path::new("/");
        self.write.iter().any(|p| p == root) && self.execute.iter().any(|p| p == root)
    }

    /// The environment the child starts with: the allow-listed variables of `parent`,
    /// then the policy's `set`. The caller's own `.env()` values go on top.
    pub fn child_env(
        &self,
        parent: impl Iterator<Item = (OsString, OsString)>,
    ) -> Vec<(OsString, OsString)> {
        let all = self.env_pass.iter().any(|n| n == "*");
        let mut env: Vec<(OsString, OsString)> = parent
            .filter(|(k, _)| {
                all || k
                    .to_str()
                    .is_some_and(|k| self.env_pass.iter().any(|n| n == k))
            })
            .collect();
        for (k, v) in &self.env_set {
            env.retain(|(ek, _)| ek.to_str() != Some(k.as_str()));
            env.push((k.into(), v.into()));
        }
        env
    }
}

/// The one fixture the sandbox's unit tests share: a shipped policy resolved for the
/// workspace `/w` and temp dir `/t`.
#[cfg(test)]
pub(crate) mod test_fixture {
    use super::{Placeholders, ResolvedPolicy};
    use crate::sandbox::Policy;

    pub(crate) fn resolved(name: &str) -> ResolvedPolicy {
        let ph = Placeholders {
            workspace: "/w".into(),
            tmp: "/t".into(),
            ..Default::default()
        };
        Policy::load(name).unwrap().resolve(&ph).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ph() -> Placeholders {
        Placeholders {
            workspace: "/w".into(),
            tmp: "/t".into(),
            python: vec!["/py/a".into(), "/py/b".into()],
            venv: None,
            uv_cache: Some("/cache".into()),
        }
    }

    #[test]
    fn workspace_write_resolves() {
        let r = Policy::load("workspace-write")
            .unwrap()
            .resolve(&ph())
            .unwrap();
        assert_eq!(r.name(), "workspace-write");
        assert!(r.write.contains(&"/w".into()) && r.write.contains(&"/t".into()));
        assert!(r.read.contains(&"/py/a".into()) && r.read.contains(&"/py/b".into()));
        assert!(r.read.contains(&"/cache".into()));
        assert!(
            !r.read
                .iter()
                .any(|p| p.starts_with("/root") || p == Path::new("/tmp"))
        );
        assert_eq!(r.env_set.get("TMPDIR").map(String::as_str), Some("/t"));
        assert_eq!(r.network, NetworkPolicy::None);
        assert!(!r.filesystem_unrestricted());
    }

    #[test]
    fn missing_placeholder_value_drops_path() {
        let p = Policy::parse(
            "t",
            "[filesystem]\nread = [\"{venv}/lib\", \"/usr\"]\n",
            "t",
        )
        .unwrap();
        let r = p.resolve(&ph()).unwrap();
        assert_eq!(r.read, vec![PathBuf::from("/usr")]);
    }

    #[test]
    fn placeholder_with_tail() {
        let p = Policy::parse("t", "[filesystem]\nread = [\"{python}/lib\"]\n", "t").unwrap();
        let r = p.resolve(&ph()).unwrap();
        assert_eq!(
            r.read,
            vec![PathBuf::from("/py/a/lib"), PathBuf::from("/py/b/lib")]
        );
    }

    /// Only a policy that names `{python}` (in a path, or a variable's value) needs it.
    #[test]
    fn python_placeholder_needed_only_where_named() {
        assert!(
            Policy::load("workspace-write")
                .unwrap()
                .uses_placeholder("{python}")
        );
        let uses = |text: &str| {
            Policy::parse("t", text, "t")
                .unwrap()
                .uses_placeholder("{python}")
        };
        assert!(!uses("[filesystem]\nread = [\"/usr\", \"{workspace}\"]\n"));
        assert!(!uses("[environment]\nset = { A = \"{workspace}/x\" }\n"));
        assert!(uses("[filesystem]\nhide = [\"{python}/secret\"]\n"));
        assert!(uses("[filesystem]\nexecute = [\"{python}\"]\n"));
        assert!(uses("[environment]\nset = { PY = \"{python}/bin\" }\n"));
    }

    #[test]
    fn relative_workspace_rejected() {
        let mut bad = ph();
        bad.workspace = "w".into();
        let e = Policy::load("ci")
            .unwrap()
            .resolve(&bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not absolute"), "{e}");
    }

    #[test]
    fn env_allow_list() {
        let r = Policy::load("workspace-write")
            .unwrap()
            .resolve(&ph())
            .unwrap();
        let parent = [("PATH", "/bin"), ("SECRET", "x"), ("HOME", "/root")]
            .into_iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let env = r.child_env(parent);
        assert!(env.contains(&("PATH".into(), "/bin".into())));
        assert!(env.contains(&("HOME".into(), "/t".into())));
        assert!(!env.iter().any(|(k, _)| k == "SECRET"));
    }

    #[test]
    fn with_copies() {
        let r = Policy::load("read-only").unwrap().resolve(&ph()).unwrap();
        let w = r.with_write("/venv").with_network(NetworkPolicy::Full);
        assert!(w.write.contains(&"/venv".into()) && w.network == NetworkPolicy::Full);
        assert!(!r.write.contains(&"/venv".into()));
        assert!(
            Policy::load("danger-full-access")
                .unwrap()
                .resolve(&ph())
                .unwrap()
                .filesystem_unrestricted()
        );
    }
}
