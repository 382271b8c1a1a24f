//! What sessions and jobs started from now on run under — the policy and the workspace —
//! and how the client may change it while the server runs: a sandbox request (Codex's
//! sandbox state under `--sandbox-state inherit`: per tool call today, or the older
//! update) and the client's roots (when no `--workspace` was given). Running workers keep
//! what they started with — except that a client that sends its state with every call
//! gets each call's session started again under it ([`State::per_call`]); every change
//! bumps a generation so the server can tell the agent once, in its next answer.
//!
//! Decisions (docs/policies.md): the first root is the workspace, further roots are
//! readable (not writable) paths; a per-call state's working directory is the workspace
//! (when the client may choose it); a sandbox request's writable roots are extra
//! writable paths on top of the workspace; `/` and the home directory are never taken
//! from a client (refused, and the agent is told why).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::sandbox::{NetworkMode, Policy};

use super::error::AppError;
use super::workspace::Workspace;

/// A sandbox the client asks for (already parsed from its wire format by the server).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxRequest {
    /// Read the workspace and the system, write only a private temp dir; the host network
    /// when `network`.
    ReadOnly { network: bool },
    /// Write the workspace and `writable_roots`; the host network when `network`.
    WorkspaceWrite {
        writable_roots: Vec<PathBuf>,
        network: bool,
    },
    /// No sandbox.
    FullAccess,
    /// The client runs this server inside a sandbox of its own (Codex's
    /// `external-sandbox`): no file-system confinement of ours; the network only when
    /// `network`, and the limits and job cgroups of every policy (see [`external_policy`]).
    External { network: bool },
}

impl SandboxRequest {
    /// The name the client gives this sandbox (Codex's `sandboxPolicy.type`).
    pub fn client_name(&self) -> &'static str {
        match self {
            SandboxRequest::ReadOnly { .. } => "read-only",
            SandboxRequest::WorkspaceWrite { .. } => "workspace-write",
            SandboxRequest::FullAccess => "danger-full-access",
            SandboxRequest::External { .. } => "external-sandbox",
        }
    }

    fn network(&self) -> bool {
        match self {
            SandboxRequest::ReadOnly { network }
            | SandboxRequest::WorkspaceWrite { network, .. }
            | SandboxRequest::External { network } => *network,
            SandboxRequest::FullAccess => true,
        }
    }
}

/// The whole sandbox state a client sends (Codex's `SandboxState`, parsed): the request
/// and its working directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSandbox {
    pub request: SandboxRequest,
    /// Codex's `sandboxCwd`: the workspace when the client may choose it.
    pub cwd: Option<PathBuf>,
}

/// What we still enforce under Codex's `external-sandbox`, in words (the agent notice and
/// docs/policies.md say the same).
pub(crate) const EXTERNAL_ENFORCED: &str = "the client sandboxes this server itself, so file \
     access is not confined here (anything the outer sandbox allows); still enforced here: \
     no network unless the client enables it (a private network namespace, capabilities \
     dropped so it cannot be left), the process limit (4096), and each job in a cgroup of \
     its own whose processes end with it";

/// Codex's `external-sandbox`: `danger-full-access` (no Landlock, no mount view, no
/// syscall filter: the outer sandbox confines files, and ours may not even be possible in
/// it), but without the network unless `network`, with capabilities dropped so that the
/// private network namespace cannot be left.
fn external_policy(network: bool) -> Result<Policy, AppError> {
    let mut p = Policy::load("danger-full-access")?;
    p.description = format!("Codex's external sandbox: {EXTERNAL_ENFORCED}.");
    if !network {
        p.network.mode = NetworkMode::None;
        p.network.connect.clear();
        p.network.bind.clear();
        p.network.allow.clear();
        p.process.drop_capabilities = true;
        // Installs reach the package indexes through the broker, as under workspace-write.
        p.installer = Policy::load("workspace-write")?.installer;
    }
    Ok(p)
}

/// Where the settings may come from, fixed at start.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// `--sandbox-state inherit` with no `--policy`: sandbox requests are honoured.
    pub inherit_sandbox: bool,
    /// No `--workspace`: the client's first root becomes the workspace.
    pub workspace_from_roots: bool,
}

/// One snapshot of what new sessions and jobs get.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The policy (session-venv rule applied), named after what it is.
    pub policy: Policy,
    pub workspace: Workspace,
    /// Further client roots, readable.
    pub extra_read: Vec<PathBuf>,
    /// Why nothing may run yet: the server was started in a broad directory (`/`, `$HOME`)
    /// with no `--workspace`, and the client has not named a workspace.
    /// (the directory, why it is broad).
    pub no_workspace: Option<(PathBuf, String)>,
    /// Bumped by every change (0 = as started).
    pub generation: u64,
    /// One paragraph for the agent: what new sessions and jobs run under, and why.
    pub notice: String,
}

impl Settings {
    /// The workspace, or why there is none yet (see [`Settings::no_workspace`]).
    pub fn workspace(&self) -> Result<&Workspace, AppError> {
        match &self.no_workspace {
            None => Ok(&self.workspace),
            Some((path, why)) => Err(AppError::WorkspaceUnknown {
                path: path.clone(),
                why: why.clone(),
            }),
        }
    }
}

/// The mutable state behind [`Settings`]: the start-up policy and workspace, plus what
/// the client asked for so far.
#[derive(Debug)]
pub(super) struct State {
    pub sources: Sources,
    /// The policy as configured (before any request; venv rule not yet applied).
    configured: Policy,
    configured_workspace: PathBuf,
    state_dir: PathBuf,
    request: Option<SandboxRequest>,
    /// Extra writable paths of the last request, checked (canonical).
    request_write: Vec<PathBuf>,
    roots: Option<(PathBuf, Vec<PathBuf>)>,
    /// The client has answered for its roots (maybe with none that can be used).
    pub roots_answered: bool,
    /// The client sends its sandbox state with every tool call (today's Codex): each
    /// call's session runs under it, started again if it was started under another.
    pub per_call: bool,
    /// The last per-call state applied, as sent (a call that repeats it changes nothing).
    last_call: Option<ClientSandbox>,
    /// The per-call state's working directory, checked: the workspace (when the client
    /// may choose it), before any root.
    cwd_workspace: Option<PathBuf>,
    /// Why the directory the server started in cannot be the workspace (it is broad):
    /// until the client names one, nothing runs.
    broad_start: Option<String>,
    /// Client paths refused at the last change, in words.
    refused: Vec<String>,
    pub current: Arc<Settings>,
}

impl State {
    /// `broad_start`: why `workspace` (the directory the server started in) may not be the
    /// workspace; the client must name one before anything runs.
    pub(super) fn new(
        sources: Sources,
        configured: Policy,
        workspace: PathBuf,
        state_dir: PathBuf,
        broad_start: Option<String>,
    ) -> Result<State, AppError> {
        let mut state = State {
            sources,
            configured: configured.clone(),
            configured_workspace: workspace.clone(),
            state_dir,
            request: None,
            request_write: Vec::new(),
            roots: None,
            roots_answered: false,
            per_call: false,
            last_call: None,
            cwd_workspace: None,
            broad_start,
            refused: Vec::new(),
            current: Arc::new(Settings {
                policy: configured,
                workspace: Workspace::new(workspace),
                extra_read: Vec::new(),
                no_workspace: None,
                generation: 0,
                notice: String::new(),
            }),
        };
        state.current = Arc::new(state.build(0)?);
        Ok(state)
    }

    /// Apply a sandbox request; refused paths are named in the notice.
    pub(super) fn apply_request(
        &mut self,
        request: SandboxRequest,
    ) -> Result<Arc<Settings>, AppError> {
        self.refused.clear();
        self.request_write = self.checked_writable(&request);
        self.request = Some(request);
        self.rebuild()
    }

    /// Apply the sandbox state a client sends with a tool call: the request, and its
    /// working directory as the workspace (when no `--workspace` was given; `/`, `$HOME`
    /// and the like are refused and the workspace stays). `None` when it repeats the
    /// last one (nothing changes, no generation is used up).
    pub(super) fn apply_client_sandbox(
        &mut self,
        state: ClientSandbox,
    ) -> Result<Option<Arc<Settings>>, AppError> {
        if self.per_call && self.last_call.as_ref() == Some(&state) {
            return Ok(None);
        }
        self.per_call = true;
        self.refused.clear();
        self.cwd_workspace = match (&state.cwd, self.sources.workspace_from_roots) {
            (Some(cwd), true) => self.check_client_path(cwd, "working directory (sandboxCwd)"),
            _ => None,
        };
        self.request_write = self.checked_writable(&state.request);
        self.request = Some(state.request.clone());
        self.last_call = Some(state);
        self.rebuild().map(Some)
    }

    fn checked_writable(&mut self, request: &SandboxRequest) -> Vec<PathBuf> {
        match request {
            SandboxRequest::WorkspaceWrite { writable_roots, .. } => writable_roots
                .iter()
                .filter_map(|p| self.check_client_path(p, "writable root"))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Apply the client's roots (file paths, in its order); the first becomes the
    /// workspace. A refused first root leaves the workspace as it was.
    pub(super) fn apply_roots(&mut self, roots: Vec<PathBuf>) -> Result<Arc<Settings>, AppError> {
        self.roots_answered = true;
        self.refused.clear();
        let mut ok: Vec<PathBuf> = roots
            .iter()
            .filter_map(|p| self.check_client_path(p, "root"))
            .collect();
        ok.dedup();
        self.roots = if ok.is_empty() {
            None
        } else {
            let first = ok.remove(0);
            Some((first, ok))
        };
        self.rebuild()
    }

    fn rebuild(&mut self) -> Result<Arc<Settings>, AppError> {
        let next = self.build(self.current.generation + 1)?;
        self.current = Arc::new(next);
        Ok(self.current.clone())
    }

    /// `p` as a canonical directory a client may hand us, or `None` with the reason kept.
    fn check_client_path(&mut self, p: &Path, what: &str) -> Option<PathBuf> {
        let checked = client_path(p).and_then(|real| {
            // The same breadth rule as a --workspace: never the state dir or a parent.
            let home = std::env::var_os("HOME").and_then(|h| PathBuf::from(h).canonicalize().ok());
            match super::workspace::check_breadth(&real, &self.state_dir, home.as_deref(), false) {
                Ok(()) => Ok(real),
                Err(AppError::BroadWorkspace { why, .. }) => Err(format!("it is {why}")),
                Err(e) => Err(e.to_string()),
            }
        });
        match checked {
            Ok(real) => Some(real),
            Err(why) => {
                self.refused
                    .push(format!("{what} {} refused: {why}", p.display()));
                None
            }
        }
    }

    fn build(&self, generation: u64) -> Result<Settings, AppError> {
        let (mut workspace, extra_read) = match &self.roots {
            Some((first, rest)) => (first.clone(), rest.clone()),
            None => (self.configured_workspace.clone(), Vec::new()),
        };
        if let Some(cwd) = &self.cwd_workspace {
            workspace = cwd.clone();
        }
        let mut policy = match &self.request {
            Some(r) => {
                let mut p = match r {
                    SandboxRequest::External { network } => external_policy(*network)?,
                    _ => Policy::load(r.client_name())?,
                };
                p.name = format!("{} (from the client)", r.client_name());
                if let SandboxRequest::WorkspaceWrite { .. } = r {
                    // The workspace is writable already ({workspace}).
                    p.filesystem.write.extend(
                        self.request_write
                            .iter()
                            .filter(|w| **w != workspace)
                            .map(|w| w.display().to_string()),
                    );
                }
                if matches!(
                    r,
                    SandboxRequest::ReadOnly { network: true }
                        | SandboxRequest::WorkspaceWrite { network: true, .. }
                ) {
                    p.network.mode = NetworkMode::Full;
                    p.network.connect.clear();
                    p.network.bind.clear();
                    p.network.allow.clear();
                }
                p
            }
            None => self.configured.clone(),
        };
        policy
            .filesystem
            .read
            .extend(extra_read.iter().map(|r| r.display().to_string()));
        crate::envs::allow_session_venvs(&mut policy, &self.state_dir)?;
        // Whatever the workspace, sandboxed code never sees the state dir (job records,
        // spooled output, the HTTP token): the mount view covers it, re-exposing only what
        // the policy lists inside (venvs, private tmp).
        policy
            .filesystem
            .hide
            .push(self.state_dir.to_string_lossy().into_owned());
        let no_workspace = match (&self.broad_start, &self.roots, &self.cwd_workspace) {
            (Some(why), None, None) => Some((self.configured_workspace.clone(), why.clone())),
            _ => None,
        };
        let mut notice = self.notice(&policy, &workspace, &extra_read);
        if let Some((path, why)) = &no_workspace {
            let e = AppError::WorkspaceUnknown {
                path: path.clone(),
                why: why.clone(),
            };
            notice = format!("{e}.");
            for r in &self.refused {
                notice.push_str(&format!(" {r}."));
            }
        }
        Ok(Settings {
            policy,
            workspace: Workspace::new(workspace),
            extra_read,
            no_workspace,
            generation,
            notice,
        })
    }

    fn notice(&self, policy: &Policy, workspace: &Path, extra_read: &[PathBuf]) -> String {
        let by = if self.per_call {
            "Sandbox from the client (sent with each tool call)"
        } else {
            "Sandbox changed by the client"
        };
        let mut s = match (&self.request, self.sources.inherit_sandbox) {
            (None, true) => format!(
                "Sandbox: --sandbox-state inherit, but the client has not sent its sandbox \
                 state (codex/sandbox-state-meta or codex/sandbox-state/update) yet, so new \
                 sessions and jobs run under {}. Workspace: {}.",
                policy.name,
                workspace.display()
            ),
            (Some(r @ SandboxRequest::WorkspaceWrite { .. }), _) => {
                let extra: Vec<String> = self
                    .request_write
                    .iter()
                    .filter(|p| *p != workspace)
                    .map(|p| p.display().to_string())
                    .collect();
                let extra = match extra.is_empty() {
                    true => String::new(),
                    false => format!(", also writable: {}", extra.join(", ")),
                };
                format!(
                    "{by}: new sessions and jobs run under {} (workspace {} writable{extra}; \
                     network {}).",
                    policy.name,
                    workspace.display(),
                    on_off(r.network())
                )
            }
            (Some(r @ SandboxRequest::ReadOnly { .. }), _) => format!(
                "{by}: new sessions and jobs run under {} (workspace {} readable, not \
                 writable; network {}).",
                policy.name,
                workspace.display(),
                on_off(r.network())
            ),
            (Some(SandboxRequest::External { .. }), _) => format!(
                "{by}: new sessions and jobs run under {}: {EXTERNAL_ENFORCED}. Workspace: {}.",
                policy.name,
                workspace.display()
            ),
            (Some(SandboxRequest::FullAccess), _) => format!(
                "{by}: new sessions and jobs run under {} (no sandbox). Workspace: {}.",
                policy.name,
                workspace.display()
            ),
            (None, false) if self.roots.is_some() => format!(
                "Workspace: {} (from the client's roots); new sessions and jobs run there \
                 under {}.",
                workspace.display(),
                policy.name
            ),
            (None, false) => format!(
                "Workspace: {}, the directory the server was started in: the client named \
                 no workspace (no MCP roots) and the server was given no --workspace; new \
                 sessions and jobs run there under {}.",
                workspace.display(),
                policy.name
            ),
        };
        if !extra_read.is_empty() {
            s.push_str(&format!(
                " Also readable (the client's other roots): {}.",
                extra_read
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if self.per_call {
            s.push_str(
                " A session started under another sandbox is started again when a call next \
                 uses it (its variables are lost; the cell says so); session_list shows each \
                 session's policy.",
            );
        } else if self.request.is_some() || self.roots.is_some() {
            s.push_str(
                " Sessions already running keep their sandbox until session_restart or \
                 session_close; session_list shows each session's policy.",
            );
        }
        for r in &self.refused {
            s.push(' ');
            s.push_str(r);
            s.push('.');
        }
        s
    }
}

fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

/// A path a client hands us: absolute, an existing directory, never `/` or the home
/// directory (either would open the whole machine or the user's credentials).
pub(crate) fn client_path(p: &Path) -> Result<PathBuf, String> {
    if !p.is_absolute() {
        return Err("not an absolute path".into());
    }
    let real = p
        .canonicalize()
        .map_err(|e| format!("cannot resolve it ({e})"))?;
    if !real.is_dir() {
        return Err("not a directory".into());
    }
    if real == Path::new("/") {
        return Err("the root directory is never taken from a client".into());
    }
    if let Some(home) = std::env::var_os("HOME").map(PathBuf::from)
        && home.canonicalize().is_ok_and(|h| h == real)
    {
        return Err("the home directory is never taken from a client".into());
    }
    Ok(real)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::scratch_dir;

    /// A fresh scratch directory (removed on drop) and its path.
    fn scratch(name: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = scratch_dir(&format!("app-settings-{name}"));
        let path = dir.path().to_path_buf();
        (dir, path)
    }

    /// The state over fresh workspace and state directories: their guards, the state and
    /// the workspace.
    fn state(inherit: bool, name: &str) -> ([tempfile::TempDir; 2], State, PathBuf) {
        let (ws_dir, ws) = scratch(&format!("{name}-ws"));
        let (st_dir, st) = scratch(&format!("{name}-state"));
        let s = State::new(
            Sources {
                inherit_sandbox: inherit,
                workspace_from_roots: true,
            },
            Policy::load("workspace-write").unwrap(),
            ws.clone(),
            st,
            None,
        )
        .unwrap();
        ([ws_dir, st_dir], s, ws)
    }

    #[test]
    fn inherit_says_workspace_write_until_a_request() {
        let (_dirs, s, _) = state(true, "inherit");
        assert_eq!(s.current.generation, 0);
        assert_eq!(s.current.policy.name, "workspace-write");
        assert!(
            s.current.notice.contains("has not sent"),
            "{}",
            s.current.notice
        );
    }

    #[test]
    fn requests_map_onto_policies() {
        let (_dirs, mut s, _) = state(true, "map");
        let ro = s
            .apply_request(SandboxRequest::ReadOnly { network: false })
            .unwrap();
        assert_eq!(ro.generation, 1);
        assert!(ro.policy.name.starts_with("read-only"));
        assert!(
            !ro.policy
                .filesystem
                .write
                .iter()
                .any(|w| w == "{workspace}")
        );
        let (_extra_dir, extra) = scratch("map-extra");
        let ww = s
            .apply_request(SandboxRequest::WorkspaceWrite {
                writable_roots: vec![extra.clone(), "/".into(), "relative".into()],
                network: true,
            })
            .unwrap();
        assert!(ww.policy.name.starts_with("workspace-write"));
        let extra_s = extra.display().to_string();
        assert!(ww.policy.filesystem.write.contains(&extra_s));
        assert!(!ww.policy.filesystem.write.iter().any(|w| w == "/"));
        assert_eq!(ww.policy.network.mode, NetworkMode::Full);
        assert!(
            ww.notice.contains("writable root / refused"),
            "{}",
            ww.notice
        );
        assert!(ww.notice.contains("relative refused"), "{}", ww.notice);
        let full = s.apply_request(SandboxRequest::FullAccess).unwrap();
        assert!(full.policy.name.starts_with("danger-full-access"));
        assert_eq!(full.generation, 3);
    }

    #[test]
    fn a_per_call_state_sets_the_workspace_and_a_repeat_changes_nothing() {
        let (_dirs, mut s, ws) = state(true, "per-call");
        let (_cwd_dir, cwd) = scratch("per-call-cwd");
        let call = ClientSandbox {
            request: SandboxRequest::WorkspaceWrite {
                writable_roots: vec![cwd.clone()],
                network: false,
            },
            cwd: Some(cwd.clone()),
        };
        let first = s.apply_client_sandbox(call.clone()).unwrap().unwrap();
        assert_eq!(first.workspace.root(), cwd.as_path());
        // The working directory is the workspace: not listed again as an extra root.
        assert!(
            !first
                .policy
                .filesystem
                .write
                .contains(&cwd.display().to_string())
        );
        assert!(
            first.notice.contains("sent with each tool call"),
            "{}",
            first.notice
        );
        assert!(s.apply_client_sandbox(call).unwrap().is_none());
        assert_eq!(s.current.generation, first.generation);
        // `/` is never the workspace: refused in words, the workspace as started stays.
        let slash = s
            .apply_client_sandbox(ClientSandbox {
                request: SandboxRequest::ReadOnly { network: false },
                cwd: Some("/".into()),
            })
            .unwrap()
            .unwrap();
        assert_eq!(slash.workspace.root(), ws.as_path());
        assert!(
            slash
                .notice
                .contains("working directory (sandboxCwd) / refused"),
            "{}",
            slash.notice
        );
    }

    #[test]
    fn external_sandbox_keeps_the_network_off_unless_enabled() {
        let (_dirs, mut s, _) = state(true, "external");
        let call = |network| ClientSandbox {
            request: SandboxRequest::External { network },
            cwd: None,
        };
        let off = s.apply_client_sandbox(call(false)).unwrap().unwrap();
        assert_eq!(off.policy.name, "external-sandbox (from the client)");
        assert!(off.policy.filesystem.write.iter().any(|w| w == "/"));
        assert_eq!(off.policy.network.mode, NetworkMode::None);
        // Without capabilities the private network namespace cannot be left.
        assert!(off.policy.process.drop_capabilities);
        assert!(off.notice.contains("still enforced"), "{}", off.notice);
        let on = s.apply_client_sandbox(call(true)).unwrap().unwrap();
        assert_eq!(on.policy.network.mode, NetworkMode::Full);
    }

    #[test]
    fn roots_set_the_workspace_and_readable_paths() {
        let (_dirs, mut s, ws) = state(false, "roots");
        let (_a_dir, a) = scratch("roots-a");
        let (_b_dir, b) = scratch("roots-b");
        let r = s.apply_roots(vec![a.clone(), b.clone()]).unwrap();
        assert_eq!(r.workspace.root(), a.as_path());
        assert_eq!(r.extra_read, vec![b.clone()]);
        assert!(r.policy.filesystem.read.contains(&b.display().to_string()));
        assert!(!r.policy.filesystem.write.contains(&b.display().to_string()));
        // `/` and a file are refused; with no usable root the configured workspace stays.
        let file = a.join("f");
        std::fs::write(&file, "").unwrap();
        let r = s.apply_roots(vec!["/".into(), file]).unwrap();
        assert_eq!(r.workspace.root(), ws.as_path());
        assert!(r.notice.contains("root / refused"), "{}", r.notice);
        assert!(r.notice.contains("not a directory"), "{}", r.notice);
    }

    #[test]
    fn home_is_never_taken_from_a_client() {
        if let Some(home) = std::env::var_os("HOME").map(PathBuf::from)
            && home.is_dir()
        {
            let e = client_path(&home).unwrap_err();
            assert!(e.contains("home directory"), "{e}");
        }
        assert!(client_path(Path::new("/")).is_err());
        assert!(client_path(Path::new("/nonexistent-xyz")).is_err());
    }
}
