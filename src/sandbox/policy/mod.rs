//! Policy files: the TOML format (every table `deny_unknown_fields`), the shipped
//! policies embedded in the binary, and strict loading with errors that name the file,
//! the key and what is allowed. Placeholder resolution lives in `resolve.rs`.
//!
//! This directory is the sandbox's pure data: what a policy says (`mod.rs`), the paths
//! and numbers it resolves to for one job (`resolve`), the network allow-list (`allow`),
//! and a failed job's denials in words (`explain`). It changes no process state (no
//! namespace, mount, limit or filter) and imports nothing of `launcher/` or `parent/`.

pub(crate) mod allow;
pub(crate) mod error;
pub(crate) mod explain;
pub(crate) mod resolve;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use allow::AllowEntry;
pub(crate) use error::PolicyError;
// Where the interface stub had them, for callers that name these paths.

/// The shipped policies, embedded so that a spawn never touches the disk for them.
pub(crate) const SHIPPED: &[(&str, &str)] = &[
    (
        "read-only",
        include_str!("../../../policies/read-only.toml"),
    ),
    (
        "workspace-write",
        include_str!("../../../policies/workspace-write.toml"),
    ),
    (
        "danger-full-access",
        include_str!("../../../policies/danger-full-access.toml"),
    ),
    ("ci", include_str!("../../../policies/ci.toml")),
];

/// The shipped policies as JSON, made from the TOML above by `build.rs` (read faster:
/// `run` loads one before every command). Same order and names as [`SHIPPED`].
const SHIPPED_JSON: &[(&str, &str)] = &[
    (
        "read-only",
        include_str!(concat!(env!("OUT_DIR"), "/read-only.json")),
    ),
    (
        "workspace-write",
        include_str!(concat!(env!("OUT_DIR"), "/workspace-write.json")),
    ),
    (
        "danger-full-access",
        include_str!(concat!(env!("OUT_DIR"), "/danger-full-access.json")),
    ),
    ("ci", include_str!(concat!(env!("OUT_DIR"), "/ci.json"))),
];

/// The policy used when none is named.
pub const DEFAULT_POLICY: &str = "workspace-write";

/// The placeholders a path may start with.
pub(crate) const PLACEHOLDERS: &[&str] = &[
    "{workspace}",
    "{tmp}",
    "{python}",
    "{venv}",
    "{uv_cache}",
    "{home}",
];

/// A policy as written in a file (placeholders unresolved).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Filled from the shipped name or the file stem; not a key of the file.
    #[serde(skip)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// What to do where the kernel lacks a feature this policy needs.
    #[serde(default)]
    pub kernel_support: KernelSupportMode,
    #[serde(default)]
    pub filesystem: FilesystemSection,
    #[serde(default)]
    pub network: NetworkSection,
    #[serde(default)]
    pub ipc: IpcSection,
    #[serde(default)]
    pub environment: EnvironmentSection,
    #[serde(default)]
    pub limits: LimitsSection,
    #[serde(default)]
    pub process: ProcessSection,
    /// How package installs and dependency resolution reach the network.
    #[serde(default)]
    pub installer: InstallerSection,
}

/// Fail closed (`required`, the default) or apply what the kernel supports (`best_effort`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelSupportMode {
    #[default]
    Required,
    BestEffort,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilesystemSection {
    /// Paths (and everything beneath) that may be read.
    #[serde(default)]
    pub read: Vec<String>,
    /// Paths that may be written, created, removed (implies read).
    #[serde(default)]
    pub write: Vec<String>,
    /// Paths whose files may be executed (implies read).
    #[serde(default)]
    pub execute: Vec<String>,
    /// Paths covered in the job's mount view by an empty read-only directory, even
    /// beneath a listed path (the server adds its own state dir). Paths listed above that
    /// lie beneath a hidden one stay visible.
    #[serde(default)]
    pub hide: Vec<String>,
}

/// `none`: no sockets but AF_UNIX. `loopback`: a private network namespace with only
/// `lo`. `ports`: TCP connect/bind to the listed ports only (Landlock ABI 4+). `proxy`:
/// an empty network namespace whose only listener is the server's HTTP(S) proxy, which
/// connects to the `allow`ed hosts only. `full`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    #[default]
    None,
    Loopback,
    Ports,
    Proxy,
    Full,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSection {
    #[serde(default)]
    pub mode: NetworkMode,
    /// TCP ports that may be connected to (mode = "ports" only).
    #[serde(default)]
    pub connect: Vec<u16>,
    /// TCP ports that may be bound (mode = "ports" only).
    #[serde(default)]
    pub bind: Vec<u16>,
    /// Hosts (`host`, `host:port`, `*.domain`) the proxy connects to (mode = "proxy" only).
    #[serde(default)]
    pub allow: Vec<String>,
}

/// `[installer]`: the network of package installs, dependency resolution and build
/// hooks (always confined: they write only the venv, the uv cache and a temp dir).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstallerSection {
    /// `mode` is "proxy" (the default), "none" or "full"; `allow` left out (or empty) in
    /// proxy mode means the hosts of uv's configured indexes (default: pypi.org and
    /// files.pythonhosted.org).
    #[serde(default = "installer_default_network")]
    pub network: NetworkSection,
    /// Install wheels only (`uv --no-build`): no package's build code ever runs.
    #[serde(default)]
    pub wheels_only: bool,
}

impl Default for InstallerSection {
    fn default() -> Self {
        InstallerSection {
            network: installer_default_network(),
            wheels_only: false,
        }
    }
}

fn installer_default_network() -> NetworkSection {
    NetworkSection {
        mode: NetworkMode::Proxy,
        ..NetworkSection::default()
    }
}

/// Whether a kind of IPC may reach outside the sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scoping {
    /// Only within the sandbox (Landlock scopes, ABI 6+).
    #[default]
    Scoped,
    Allow,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpcSection {
    /// Connecting to abstract unix sockets created outside the sandbox.
    #[serde(default)]
    pub abstract_unix_sockets: Scoping,
    /// Sending signals to processes outside the sandbox.
    #[serde(default)]
    pub signals: Scoping,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentSection {
    /// Names of the server's environment variables the child receives.
    #[serde(default)]
    pub pass: Vec<String>,
    /// Variables set in the child (values may use placeholders).
    #[serde(default)]
    pub set: BTreeMap<String, String>,
}

/// A byte size: an integer, or a string like "512MiB", "2G", "100k".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ByteSize {
    Bytes(u64),
    Text(String),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    pub memory: Option<ByteSize>,
    pub cpu_seconds: Option<u64>,
    pub wall_seconds: Option<u64>,
    pub file_size: Option<ByteSize>,
    /// Size of the job's private `{tmp}`, a tmpfs in its mount view.
    pub tmp_size: Option<ByteSize>,
    pub processes: Option<u64>,
    pub open_files: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessSection {
    /// Drop every capability (effective, permitted, inheritable, ambient, bounding).
    #[serde(default = "yes")]
    pub drop_capabilities: bool,
    /// Deny escape primitives (ptrace, mount, unshare, bpf, ...) and, per the network
    /// mode, socket families, with a seccomp filter.
    #[serde(default = "yes")]
    pub syscall_filter: bool,
}

fn yes() -> bool {
    true
}

impl Default for ProcessSection {
    fn default() -> Self {
        ProcessSection {
            drop_capabilities: true,
            syscall_filter: true,
        }
    }
}

/// Names of the shipped policies, comma-separated (for messages).
pub(crate) fn shipped_names() -> String {
    SHIPPED
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Builds the error for a key of the policy file being validated.
type Invalid<'a> = dyn Fn(String, String) -> PolicyError + 'a;

impl Policy {
    /// Load a shipped policy by name, or a policy file by path (anything containing
    /// a `/` or ending in `.toml`).
    pub fn load(name_or_path: &str) -> Result<Policy, PolicyError> {
        if let Some((name, json)) = SHIPPED_JSON.iter().find(|(n, _)| *n == name_or_path) {
            return Policy::from_shipped_json(name, json);
        }
        if !name_or_path.contains('/') && !name_or_path.ends_with(".toml") {
            return Err(PolicyError::Unknown {
                name: name_or_path.to_string(),
                known: shipped_names(),
            });
        }
        let path = Path::new(name_or_path);
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Policy::parse(&name, &text, name_or_path)
    }

    /// A shipped policy from its JSON twin, checked as [`parse`](Self::parse) checks text.
    fn from_shipped_json(name: &str, json: &str) -> Result<Policy, PolicyError> {
        let file = format!("<shipped {name}>");
        Policy::checked(
            name,
            &file,
            serde_json::from_str(json).map_err(|e| e.to_string()),
        )
    }

    /// Parse and validate policy text; `file` names the source in errors.
    pub fn parse(name: &str, text: &str, file: &str) -> Result<Policy, PolicyError> {
        Policy::checked(name, file, toml::from_str(text).map_err(|e| one_line(&e)))
    }

    /// A parsed policy (or why it did not parse), named `name` and validated; `file`
    /// names the source in errors.
    fn checked(
        name: &str,
        file: &str,
        parsed: Result<Policy, String>,
    ) -> Result<Policy, PolicyError> {
        let mut policy = parsed.map_err(|message| PolicyError::Parse {
            file: file.to_string(),
            message,
        })?;
        policy.name = name.to_string();
        policy.validate(file)?;
        policy.check_kernel(file, network_namespaces_available)?;
        Ok(policy)
    }

    /// Whether any path of this policy uses the proxy (which needs network namespaces).
    pub fn uses_proxy(&self) -> bool {
        self.network.mode == NetworkMode::Proxy || self.installer.network.mode == NetworkMode::Proxy
    }

    /// Fail closed where the kernel cannot give what the policy asks for at all.
    /// `netns` tells whether this kernel has network namespaces (asked only for a policy
    /// that needs them).
    fn check_kernel(&self, file: &str, netns: impl FnOnce() -> bool) -> Result<(), PolicyError> {
        // The installer's default is proxy mode too; there the broker's own error says
        // why at the first install, and everything else keeps working.
        if self.network.mode != NetworkMode::Proxy || netns() {
            return Ok(());
        }
        Err(PolicyError::Invalid {
            file: file.to_string(),
            key: "network.mode".into(),
            message: "mode = \"proxy\" needs network namespaces, which this kernel lacks \
                      (no /proc/self/ns/net, CONFIG_NET_NS off); use mode = \"none\", or \
                      \"full\" knowing it is unconfined"
                .into(),
        })
    }

    fn validate(&self, file: &str) -> Result<(), PolicyError> {
        let invalid = |key: String, message: String| PolicyError::Invalid {
            file: file.to_string(),
            key,
            message,
        };
        self.validate_paths(&invalid)?;
        self.validate_network(&invalid)?;
        self.validate_installer_network(&invalid)?;
        self.validate_ports(&invalid)?;
        self.validate_environment(&invalid)?;
        self.validate_limits(&invalid)
    }

    /// Every file-system path is absolute, or a placeholder at its start.
    fn validate_paths(&self, invalid: &Invalid<'_>) -> Result<(), PolicyError> {
        let fs = &self.filesystem;
        for (set, paths) in [
            ("read", &fs.read),
            ("write", &fs.write),
            ("execute", &fs.execute),
            ("hide", &fs.hide),
        ] {
            for (i, p) in paths.iter().enumerate() {
                check_path(p)
                    .map_err(|m| invalid(format!("filesystem.{set}[{i}]"), m.to_string()))?;
            }
        }
        Ok(())
    }

    /// Port lists with mode "ports" only, an allow list of hosts with "proxy" only.
    fn validate_network(&self, invalid: &Invalid<'_>) -> Result<(), PolicyError> {
        let net = &self.network;
        if net.mode != NetworkMode::Ports && !(net.connect.is_empty() && net.bind.is_empty()) {
            return Err(invalid(
                "network.connect".into(),
                format!(
                    "port lists are only allowed with mode = \"ports\" (mode is {:?})",
                    net.mode
                ),
            ));
        }
        if net.mode != NetworkMode::Proxy && !net.allow.is_empty() {
            return Err(invalid(
                "network.allow".into(),
                format!(
                    "an allow list is only allowed with mode = \"proxy\" (mode is {:?})",
                    net.mode
                ),
            ));
        }
        for (i, entry) in net.allow.iter().enumerate() {
            AllowEntry::parse(entry)
                .map_err(|e| invalid(format!("network.allow[{i}]"), e.to_string()))?;
        }
        Ok(())
    }

    /// The installer's network: proxy (with an optional allow list), none or full.
    fn validate_installer_network(&self, invalid: &Invalid<'_>) -> Result<(), PolicyError> {
        let inst = &self.installer.network;
        let mode_ok = matches!(
            inst.mode,
            NetworkMode::None | NetworkMode::Proxy | NetworkMode::Full
        );
        let no_ports = inst.connect.is_empty() && inst.bind.is_empty();
        if !(mode_ok && no_ports) {
            return Err(invalid(
                "installer.network.mode".into(),
                format!(
                    "the installer's network mode may be \"proxy\" (with an optional allow list), \"none\" or \"full\" (got {:?} with ports {:?})",
                    inst.mode, inst.connect
                ),
            ));
        }
        if inst.mode != NetworkMode::Proxy && !inst.allow.is_empty() {
            return Err(invalid(
                "installer.network.allow".into(),
                "an allow list is only allowed with mode = \"proxy\"".into(),
            ));
        }
        for (i, entry) in inst.allow.iter().enumerate() {
            AllowEntry::parse(entry)
                .map_err(|e| invalid(format!("installer.network.allow[{i}]"), e.to_string()))?;
        }
        Ok(())
    }

    /// No port 0 in the port lists.
    fn validate_ports(&self, invalid: &Invalid<'_>) -> Result<(), PolicyError> {
        let net = &self.network;
        for (key, ports) in [
            ("network.connect", &net.connect),
            ("network.bind", &net.bind),
        ] {
            if ports.contains(&0) {
                return Err(invalid(
                    key.into(),
                    "port 0 is not allowed; use 1..=65535".into(),
                ));
            }
        }
        Ok(())
    }

    /// Variable names that can be names.
    fn validate_environment(&self, invalid: &Invalid<'_>) -> Result<(), PolicyError> {
        for (i, name) in self.environment.pass.iter().enumerate() {
            check_env_name(name)
                .map_err(|m| invalid(format!("environment.pass[{i}]"), m.to_string()))?;
        }
        for name in self.environment.set.keys() {
            check_env_name(name)
                .map_err(|m| invalid(format!("environment.set.{name}"), m.to_string()))?;
        }
        Ok(())
    }

    /// Sizes that parse, no zero limit, at least 16 open files.
    fn validate_limits(&self, invalid: &Invalid<'_>) -> Result<(), PolicyError> {
        let l = &self.limits;
        for (key, size) in [
            ("limits.memory", &l.memory),
            ("limits.file_size", &l.file_size),
            ("limits.tmp_size", &l.tmp_size),
        ] {
            if let Some(size) = size {
                parse_size(size).map_err(|m| invalid(key.into(), m.to_string()))?;
            }
        }
        for (key, v) in [
            ("limits.cpu_seconds", l.cpu_seconds),
            ("limits.wall_seconds", l.wall_seconds),
            ("limits.processes", l.processes),
            ("limits.open_files", l.open_files),
        ] {
            if v == Some(0) {
                return Err(invalid(
                    key.into(),
                    "0 makes no sense; give a positive number or leave the key out for no limit"
                        .into(),
                ));
            }
        }
        if l.open_files.is_some_and(|n| n < 16) {
            return Err(invalid(
                "limits.open_files".into(),
                "below 16 no program can start; give at least 16".into(),
            ));
        }
        Ok(())
    }

    /// Memory limit in bytes, if any (validated at load).
    pub fn memory_bytes(&self) -> Option<u64> {
        self.limits.memory.as_ref().and_then(|s| parse_size(s).ok())
    }

    /// Size of the private `{tmp}` tmpfs in bytes, if bounded (validated at load).
    pub fn tmp_size_bytes(&self) -> Option<u64> {
        self.limits
            .tmp_size
            .as_ref()
            .and_then(|s| parse_size(s).ok())
    }

    /// File-size limit in bytes, if any (validated at load).
    pub fn file_size_bytes(&self) -> Option<u64> {
        self.limits
            .file_size
            .as_ref()
            .and_then(|s| parse_size(s).ok())
    }
}

/// Whether this kernel has network namespaces (the broker's proxy mode needs them).
pub(crate) fn network_namespaces_available() -> bool {
    Path::new("/proc/self/ns/net").exists()
}

/// Toml errors span several lines (a source excerpt); keep the message compact.
fn one_line(e: &toml::de::Error) -> String {
    let msg = e.message().trim().to_string();
    match e.span() {
        Some(span) => format!("{msg} (at byte {})", span.start),
        None => msg,
    }
}

/// A value in a policy file that parses but makes no sense; becomes the message of a
/// [`PolicyError::Invalid`] naming the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InvalidValue {
    #[error("{path:?} starts with an unknown placeholder; allowed: {allowed}")]
    UnknownPlaceholder { path: String, allowed: String },
    #[error("{path:?} contains `..`; write the path without it")]
    DotDot { path: String },
    #[error(
        "relative path {path:?}; paths must be absolute or start with a placeholder ({allowed})"
    )]
    Relative { path: String, allowed: String },
    #[error("{name:?} is not a variable name (letters, digits, `_`; or `*` for all)")]
    VariableName { name: String },
    #[error("{text:?} is not a size; write bytes as a number or e.g. \"512MiB\", \"2G\"")]
    NotASize { text: String },
    #[error("unknown unit {unit:?} in {text:?}; use K, M, G or T")]
    UnknownUnit { unit: String, text: String },
    #[error("{text:?} is too large")]
    TooLarge { text: String },
    #[error("0 makes no sense; give a positive size or leave the key out for no limit")]
    ZeroSize,
}

fn check_path(p: &str) -> Result<(), InvalidValue> {
    if p.starts_with('{') {
        let known = PLACEHOLDERS.iter().find(|ph| p.starts_with(**ph));
        match known {
            Some(ph) if p.len() == ph.len() || p[ph.len()..].starts_with('/') => Ok(()),
            _ => Err(InvalidValue::UnknownPlaceholder {
                path: p.to_string(),
                allowed: PLACEHOLDERS.join(", "),
            }),
        }
    } else if p.starts_with('/') {
        if p.split('/').any(|c| c == "..") {
            Err(InvalidValue::DotDot {
                path: p.to_string(),
            })
        } else {
            Ok(())
        }
    } else {
        Err(InvalidValue::Relative {
            path: p.to_string(),
            allowed: PLACEHOLDERS.join(", "),
        })
    }
}

fn check_env_name(name: &str) -> Result<(), InvalidValue> {
    // `*` in `pass` means the whole environment (danger-full-access).
    let ok = name == "*"
        || !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(InvalidValue::VariableName {
            name: name.to_string(),
        })
    }
}

/// Parse a byte size; 0 is rejected.
pub(crate) fn parse_size(size: &ByteSize) -> Result<u64, InvalidValue> {
    let n = match size {
        ByteSize::Bytes(n) => *n,
        ByteSize::Text(t) => {
            let t = t.trim();
            let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
            let (digits, unit) = t.split_at(split);
            let base: u64 = digits.parse().map_err(|_| InvalidValue::NotASize {
                text: t.to_string(),
            })?;
            let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
                "" | "b" => 1,
                "k" | "kb" | "kib" => 1 << 10,
                "m" | "mb" | "mib" => 1 << 20,
                "g" | "gb" | "gib" => 1 << 30,
                "t" | "tb" | "tib" => 1 << 40,
                other => {
                    return Err(InvalidValue::UnknownUnit {
                        unit: other.to_string(),
                        text: t.to_string(),
                    });
                }
            };
            base.checked_mul(mult)
                .ok_or_else(|| InvalidValue::TooLarge {
                    text: t.to_string(),
                })?
        }
    };
    if n == 0 {
        return Err(InvalidValue::ZeroSize);
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Policy::parse("t", text, "/p/t.toml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn shipped_policies_load() {
        for (name, _) in SHIPPED {
            let p = Policy::load(name).unwrap();
            assert_eq!(p.name, *name);
        }
    }

    /// What `load` reads for a shipped policy (the JSON build.rs makes) is the policy its
    /// TOML file says, every one of them, and nothing else is shipped.
    #[test]
    fn shipped_json_is_the_toml() {
        let names = |list: &[(&'static str, &'static str)]| {
            list.iter().map(|(n, _)| *n).collect::<Vec<_>>()
        };
        assert_eq!(names(SHIPPED), names(SHIPPED_JSON));
        let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/policies"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "toml")
            })
            .count();
        assert_eq!(files, SHIPPED.len(), "a policies/*.toml not shipped");
        for (name, text) in SHIPPED {
            let from_toml = Policy::parse(name, text, "t").unwrap();
            assert_eq!(Policy::load(name).unwrap(), from_toml, "{name}");
        }
    }

    #[test]
    fn unknown_name_lists_known() {
        let e = Policy::load("nope").unwrap_err().to_string();
        assert!(
            e.contains("read-only, workspace-write, danger-full-access, ci"),
            "{e}"
        );
    }

    #[test]
    fn unknown_key_names_file_and_key() {
        let e = err("[filesystem]\nreed = [\"/usr\"]\n");
        assert!(
            e.contains("/p/t.toml") && e.contains("reed") && e.contains("read"),
            "{e}"
        );
        let e = err("colour = 1\n");
        assert!(e.contains("colour"), "{e}");
    }

    #[test]
    fn relative_path_rejected() {
        let e = err("[filesystem]\nread = [\"usr/lib\"]\n");
        assert!(
            e.contains("filesystem.read[0]") && e.contains("relative path"),
            "{e}"
        );
        let e = err("[filesystem]\nwrite = [\"{nowhere}/x\"]\n");
        assert!(e.contains("unknown placeholder"), "{e}");
    }

    #[test]
    fn zero_limits_rejected() {
        assert!(err("[limits]\nmemory = 0\n").contains("limits.memory"));
        assert!(err("[limits]\nmemory = \"0M\"\n").contains("0 makes no sense"));
        assert!(err("[limits]\nprocesses = 0\n").contains("limits.processes"));
        assert!(err("[limits]\nmemory = \"12 parsecs\"\n").contains("unknown unit"));
    }

    #[test]
    fn bad_enum_value_names_allowed() {
        let e = err("[network]\nmode = \"internet\"\n");
        assert!(
            e.contains("none") && e.contains("loopback") && e.contains("ports"),
            "{e}"
        );
        let e = err("[network]\nconnect = [443]\n");
        assert!(e.contains("mode = \"ports\""), "{e}");
    }

    #[test]
    fn proxy_mode_and_allow_lists() {
        let p = Policy::parse(
            "t",
            "network = { mode = \"proxy\", allow = [\"pypi.org\", \"*.example.com:443\"] }\n",
            "t",
        )
        .unwrap();
        assert_eq!(p.network.mode, NetworkMode::Proxy);
        assert_eq!(p.installer.network.mode, NetworkMode::Proxy);
        assert!(!p.installer.wheels_only);
        let e = err("network = { mode = \"proxy\", allow = [\"https://pypi.org\"] }\n");
        assert!(
            e.contains("/p/t.toml") && e.contains("network.allow[0]") && e.contains("host:port"),
            "{e}"
        );
        let e = err("network = { mode = \"proxy\", allow = [\"ok.org\", \"py*.org\"] }\n");
        assert!(
            e.contains("network.allow[1]") && e.contains("wildcard in the wrong place"),
            "{e}"
        );
        let e = err("network = { mode = \"none\", allow = [\"pypi.org\"] }\n");
        assert!(
            e.contains("network.allow") && e.contains("mode = \"proxy\""),
            "{e}"
        );
        let e = err("[installer]\nnetwork = { mode = \"ports\" }\n");
        assert!(e.contains("installer.network.mode"), "{e}");
        let e = err("[installer.network]\nmode = \"proxy\"\nallow = [\"*\"]\n");
        assert!(e.contains("installer.network.allow[0]"), "{e}");
        let e = err("[installer]\nwheels = true\n");
        assert!(e.contains("wheels") && e.contains("wheels_only"), "{e}");
        let ok = Policy::parse(
            "t",
            "[installer]\nwheels_only = true\nnetwork = { mode = \"none\" }\n",
            "t",
        )
        .unwrap();
        assert!(ok.installer.wheels_only && !ok.uses_proxy());
        // Without an [installer] table, installs go through the broker.
        let none = Policy::parse("t", "", "t").unwrap();
        assert_eq!(none.installer.network.mode, NetworkMode::Proxy);
    }

    #[test]
    fn proxy_mode_without_network_namespaces_fails_closed() {
        let p = Policy::parse("t", "network = { mode = \"proxy\" }\n", "t").unwrap();
        let e = p
            .check_kernel("/p/t.toml", || false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/p/t.toml") && e.contains("network.mode") && e.contains("namespaces"),
            "{e}"
        );
        assert!(p.check_kernel("/p/t.toml", || true).is_ok());
        let q = Policy::parse("t", "[installer.network]\nmode = \"none\"\n", "t").unwrap();
        assert!(
            q.check_kernel("f", || panic!("asked without a proxy"))
                .is_ok()
        );
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size(&ByteSize::Text("512MiB".into())), Ok(512 << 20));
        assert_eq!(parse_size(&ByteSize::Text("2G".into())), Ok(2 << 30));
        assert_eq!(parse_size(&ByteSize::Bytes(4096)), Ok(4096));
    }
}
