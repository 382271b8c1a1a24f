//! What the client tells the server about its own state, in the client's wire format:
//! Codex's sandbox state — today's `_meta["codex/sandbox-state-meta"]` on every
//! `tools/call` (sent once the server declares that experimental capability), and the
//! older `codex/sandbox-state/update` (a request answered with `{}`, or a notification) —
//! and MCP roots (`roots/list`, `notifications/roots/list_changed`). Parsed here and
//! handed to the app as a plain [`ClientSandbox`] and paths; per connection, the agent
//! is told once, in its next tool answer, what new sessions and jobs run under.
//!
//! The shapes follow openai/codex: `SandboxState` in `codex-rs/codex-mcp/src/runtime.rs`
//! (`permissionProfile?`, `sandboxPolicy`, `codexLinuxSandboxExe`, `sandboxCwd`,
//! `useLegacyLandlock`, camelCase) and `SandboxPolicy` in `codex-rs/protocol` (tagged by
//! `type`, kebab-case variants, snake_case fields).

// MCP roots are deprecated by SEP-2577 in rmcp, but they are what Claude Code, Cursor and
// VS Code still offer.
#![allow(deprecated)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rmcp::model::{ErrorCode, Root};
use rmcp::{ErrorData, Peer, RoleServer};
use serde::Deserialize;

use crate::app::{App, ClientSandbox, SandboxRequest};

/// The experimental capability older Codex looks for before it sends sandbox updates.
pub(crate) const SANDBOX_STATE_CAPABILITY: &str = "codex/sandbox-state";
/// The method of the older update (request or notification).
pub(crate) const SANDBOX_STATE_METHOD: &str = "codex/sandbox-state/update";
/// The experimental capability today's Codex looks for (any value: it checks the key),
/// and the `_meta` key under which it then sends its sandbox state on every tool call.
pub(crate) const SANDBOX_STATE_META: &str = "codex/sandbox-state-meta";

/// Codex's `SandboxState` (fields we do not use are ignored).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SandboxStateParams {
    sandbox_policy: CodexPolicy,
    /// Codex's working directory: a path (a `file://` URL is taken too). Writable under
    /// workspace-write, as in Codex itself; the workspace when the client may choose it.
    #[serde(default)]
    sandbox_cwd: Option<String>,
}

/// Codex's `SandboxPolicy`. `access`, `read_only_access`, `exclude_tmpdir_env_var` and
/// `exclude_slash_tmp` are ignored: reads are the policy's, `{tmp}` is always private.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
enum CodexPolicy {
    ReadOnly {
        #[serde(default)]
        network_access: bool,
    },
    WorkspaceWrite {
        #[serde(default)]
        writable_roots: Vec<PathBuf>,
        #[serde(default)]
        network_access: bool,
    },
    DangerFullAccess,
    /// Codex runs us inside a sandbox of its own.
    ExternalSandbox {
        #[serde(default)]
        network_access: CodexNetworkAccess,
    },
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum CodexNetworkAccess {
    #[default]
    Restricted,
    Enabled,
}

/// Where the state came from, for the words of an error.
#[derive(Debug, Clone, Copy)]
pub(crate) enum StateSource {
    /// `codex/sandbox-state/update`.
    Update,
    /// `_meta["codex/sandbox-state-meta"]` of a tool call.
    CallMeta,
}

impl std::fmt::Display for StateSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateSource::Update => write!(f, "{SANDBOX_STATE_METHOD} params"),
            StateSource::CallMeta => write!(f, "_meta[\"{SANDBOX_STATE_META}\"]"),
        }
    }
}

/// Parse Codex's sandbox state into what the app takes; the error names what is wrong.
pub(crate) fn parse_client_sandbox(
    params: Option<&serde_json::Value>,
    source: StateSource,
) -> Result<ClientSandbox, String> {
    let params = params.ok_or_else(|| format!("{source} missing"))?;
    let p: SandboxStateParams = serde_json::from_value(params.clone()).map_err(|e| {
        format!(
            "invalid {source}: {e} (expected sandboxPolicy.type read-only, workspace-write, \
             danger-full-access or external-sandbox)"
        )
    })?;
    let cwd = match p.sandbox_cwd.as_deref() {
        None | Some("") => None,
        Some(c) if c.starts_with("file:") || c.starts_with("FILE:") => Some(
            file_uri_path(c)
                .ok_or_else(|| format!("invalid {source}: sandboxCwd {c:?} is not a file URL"))?,
        ),
        Some(c) if c.starts_with('/') && !c.contains('\0') => Some(PathBuf::from(c)),
        Some(c) => {
            return Err(format!(
                "invalid {source}: sandboxCwd {c:?} is not an absolute path"
            ));
        }
    };
    let request = match p.sandbox_policy {
        CodexPolicy::ReadOnly { network_access } => SandboxRequest::ReadOnly {
            network: network_access,
        },
        CodexPolicy::DangerFullAccess => SandboxRequest::FullAccess,
        CodexPolicy::ExternalSandbox { network_access } => SandboxRequest::External {
            network: matches!(network_access, CodexNetworkAccess::Enabled),
        },
        CodexPolicy::WorkspaceWrite {
            mut writable_roots,
            network_access,
        } => {
            if let Some(cwd) = &cwd
                && !writable_roots.contains(cwd)
            {
                writable_roots.insert(0, cwd.clone());
            }
            SandboxRequest::WorkspaceWrite {
                writable_roots,
                network: network_access,
            }
        }
    };
    Ok(ClientSandbox { request, cwd })
}

/// Parse the older update's params into a request for the app.
pub(crate) fn parse_sandbox_state(
    params: Option<&serde_json::Value>,
) -> Result<SandboxRequest, String> {
    parse_client_sandbox(params, StateSource::Update).map(|s| s.request)
}

/// Apply an update from the client; a protocol error when it cannot be applied.
pub(crate) fn apply_sandbox_state(
    app: &App,
    params: Option<&serde_json::Value>,
) -> Result<(), ErrorData> {
    let request = parse_sandbox_state(params)
        .map_err(|m| ErrorData::new(ErrorCode::INVALID_PARAMS, m, None))?;
    let settings = app
        .apply_sandbox_request(request)
        .map_err(|e| ErrorData::new(ErrorCode::INVALID_REQUEST, e.to_string(), None))?;
    tracing::info!(policy = %settings.policy.name, "sandbox state from the client applied");
    Ok(())
}

/// Today's Codex: the sandbox state in a tool call's `_meta` (`None`: the call has none).
/// Applied before the call runs, to the settings and to the session the call uses; a
/// state that does not parse refuses the call (-32602), since running it under another
/// sandbox than the client's could allow what the client forbids.
pub(crate) fn apply_call_meta(
    app: &App,
    state: Option<&serde_json::Value>,
) -> Result<(), ErrorData> {
    let Some(state) = state else {
        return Ok(());
    };
    if !app.sources().inherit_sandbox {
        // The capability is declared only under inherit; a client sending it anyway is
        // told nothing: the server's own sandbox applies, as it said at initialize.
        tracing::debug!(
            "{SANDBOX_STATE_META} ignored: the server was not started with --sandbox-state inherit"
        );
        return Ok(());
    }
    let parsed = parse_client_sandbox(Some(state), StateSource::CallMeta)
        .map_err(|m| ErrorData::new(ErrorCode::INVALID_PARAMS, m, None))?;
    let applied = app
        .apply_client_sandbox(parsed)
        .map_err(|e| ErrorData::new(ErrorCode::INVALID_REQUEST, e.to_string(), None))?;
    if let Some(settings) = applied {
        tracing::info!(policy = %settings.policy.name, "sandbox state from the client's tool call applied");
    }
    Ok(())
}

/// The `file://` roots as paths, in the client's order (other schemes are skipped).
pub(crate) fn root_paths(roots: &[Root]) -> Vec<PathBuf> {
    roots.iter().filter_map(|r| file_uri_path(&r.uri)).collect()
}

/// `file:///a%20b` (or `file://localhost/a%20b`) → `/a b`, parsed by the `url` crate
/// (dot segments resolved, the scheme and `localhost` in any case); `None` for anything
/// else: another scheme or host, a query or fragment, an escape that is not `%` and two
/// hex digits, an escaped `/`, a NUL byte.
fn file_uri_path(uri: &str) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let u = url::Url::parse(uri).ok()?;
    if u.scheme() != "file" || u.query().is_some() || u.fragment().is_some() {
        return None;
    }
    // The url crate keeps a malformed escape as it is, and decodes `%2F` into a `/` that
    // no file name can hold: a client that sends either meant something else.
    let raw = u.path().as_bytes();
    let malformed = raw.iter().enumerate().any(|(i, &b)| {
        b == b'%'
            && !raw.get(i + 1..i + 3).is_some_and(|h| {
                h.iter().all(u8::is_ascii_hexdigit) && !h.eq_ignore_ascii_case(b"2f")
            })
    });
    let path = u.to_file_path().ok()?;
    if malformed || path.as_os_str().as_bytes().contains(&0) {
        return None;
    }
    Some(path)
}

/// Ask the client for its roots and hand them to the app.
pub(crate) async fn refresh_roots(app: &App, peer: &Peer<RoleServer>) {
    #[expect(
        deprecated,
        reason = "roots are still what Claude Code, Cursor and VS Code offer"
    )]
    let listed = peer.list_roots().await;
    match listed {
        Ok(list) => {
            let paths = root_paths(&list.roots);
            if paths.is_empty() {
                tracing::info!("the client lists no file roots; the workspace stays");
                return;
            }
            match app.apply_roots(paths) {
                Ok(s) => {
                    tracing::info!(workspace = %s.workspace.root().display(), "workspace from the client's roots")
                }
                Err(e) => tracing::warn!("cannot apply the client's roots: {e}"),
            }
        }
        Err(e) => tracing::warn!("roots/list failed: {e}; the workspace stays"),
    }
}

/// The key of our `roots/list` in an `InputRequiredResult` (2026-07-28).
pub(crate) const ROOTS_INPUT: &str = "roots";

/// Roots from a client on protocol 2026-07-28, where the server may no longer send
/// `roots/list` itself: it answers the client's first tool call with an
/// `InputRequiredResult` asking for `roots/list` (the multi round-trip pattern, SEP-2322),
/// and the client's retry carries the list in `inputResponses`. Asked once per app, of
/// a client that declares the roots capability in its request `_meta`, when no
/// `--workspace` was given. Returns the result to answer with, or `None`: go on with the
/// call (the roots, if this is the retry, applied).
pub(crate) fn modern_roots(
    app: &App,
    meta: &rmcp::model::RequestMetaObject,
    legacy_peer: bool,
    responses: Option<&rmcp::model::InputResponses>,
) -> Option<rmcp::model::InputRequiredResult> {
    use rmcp::model::{InputRequest, InputRequiredResult, ListRootsRequest, ListRootsResult};
    if legacy_peer || !app.sources().workspace_from_roots {
        return None; // a client that did `initialize` is asked with roots/list as before
    }
    if let Some(answer) = responses.and_then(|r| r.get(ROOTS_INPUT)) {
        let paths = match serde_json::from_value::<ListRootsResult>(answer.clone()) {
            Ok(list) => root_paths(&list.roots),
            Err(e) => {
                tracing::warn!("the client's roots/list answer does not parse: {e}");
                Vec::new()
            }
        };
        // Applied even when empty: the first answer then says the workspace is not the
        // client's, and the client is not asked again.
        match app.apply_roots(paths) {
            Ok(s) => {
                tracing::info!(workspace = %s.workspace.root().display(), "workspace from the client's roots (2026-07-28)")
            }
            Err(e) => tracing::warn!("cannot apply the client's roots: {e}"),
        }
        return None;
    }
    let declares = meta
        .client_capabilities()
        .is_some_and(|c| c.roots.is_some());
    if !declares || app.roots_answered() {
        return None;
    }
    let ask = [(
        ROOTS_INPUT.to_string(),
        InputRequest::ListRoots(ListRootsRequest::default()),
    )];
    Some(InputRequiredResult::from_input_requests(
        ask.into_iter().collect(),
    ))
}

/// Per connection: what the agent was told, and the first fetch of the client's roots
/// (tool calls wait for it, so the first session starts in the right workspace).
#[derive(Debug, Default)]
pub(crate) struct ClientLink {
    pub told: Told,
    first_roots: tokio::sync::OnceCell<()>,
}

impl ClientLink {
    /// After `initialized`: fetch the client's roots (if they may set the workspace),
    /// then start the default session in the workspace they chose.
    pub(crate) fn on_initialized(self: &Arc<Self>, app: Arc<App>, peer: Peer<RoleServer>) {
        let link = self.clone();
        tokio::spawn(async move {
            link.roots_settled(&app, &peer).await;
            app.prewarm().await;
        });
    }

    /// `notifications/roots/list_changed`: fetch again; sessions started afterwards use it.
    pub(crate) fn on_roots_changed(&self, app: Arc<App>, peer: Peer<RoleServer>) {
        if !app.sources().workspace_from_roots {
            return;
        }
        tokio::spawn(async move { refresh_roots(&app, &peer).await });
    }

    /// The first roots answer has been applied (fetched once per connection, by whoever
    /// comes first: `initialized` or a tool call), or there is none to wait for.
    pub(crate) async fn roots_settled(&self, app: &App, peer: &Peer<RoleServer>) {
        let has_roots = peer
            .peer_info()
            .is_some_and(|info| info.capabilities.roots.is_some());
        if !has_roots || !app.sources().workspace_from_roots {
            return;
        }
        self.first_roots
            .get_or_init(|| async {
                let limit = std::time::Duration::from_secs(10);
                if tokio::time::timeout(limit, refresh_roots(app, peer))
                    .await
                    .is_err()
                {
                    tracing::warn!(
                        "the client did not answer roots/list within 10s; the workspace stays"
                    );
                }
            })
            .await;
    }
}

/// Per connection: which settings generation the agent was last told about.
#[derive(Debug)]
pub(crate) struct Told {
    generation: AtomicU64,
}

const NOTHING_TOLD: u64 = u64::MAX;

impl Default for Told {
    fn default() -> Self {
        Told {
            generation: AtomicU64::new(NOTHING_TOLD),
        }
    }
}

impl Told {
    /// The notice to add to this answer, if the agent has not been told the current
    /// settings yet: after every change, and in the first answer under `inherit`, when
    /// the settings already differ from the start-up ones, or when the workspace is the
    /// directory the server started in although the client could have named one.
    pub(crate) fn pending(&self, app: &Arc<App>) -> Option<String> {
        let settings = app.settings();
        let before = self.generation.swap(settings.generation, Ordering::SeqCst);
        if before == settings.generation {
            return None;
        }
        let first = before == NOTHING_TOLD;
        let sources = app.sources();
        // Nothing to tell at first when the settings are the server's own — unless the
        // client could have named the workspace and did not: the agent learns the
        // workspace is the directory the server started in. (Started in a broad one, the
        // call itself says there is no workspace yet.)
        if first
            && settings.generation == 0
            && !sources.inherit_sandbox
            && (!sources.workspace_from_roots || settings.no_workspace.is_some())
        {
            return None;
        }
        Some(settings.notice.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn codex_updates_parse() {
        let r = parse_sandbox_state(Some(&json!({"sandboxPolicy": {"type": "read-only"}})));
        assert_eq!(r.unwrap(), SandboxRequest::ReadOnly { network: false });
        let r = parse_sandbox_state(Some(&json!({
            "sandboxPolicy": {"type": "workspace-write", "writable_roots": ["/a"],
                "network_access": true, "exclude_tmpdir_env_var": false, "exclude_slash_tmp": false},
            "sandboxCwd": "/cwd", "codexLinuxSandboxExe": "/x"
        })))
        .unwrap();
        assert_eq!(
            r,
            SandboxRequest::WorkspaceWrite {
                writable_roots: vec!["/cwd".into(), "/a".into()],
                network: true
            }
        );
        let r = parse_sandbox_state(Some(&json!({"sandboxPolicy": {"type": "workspace-write"}})));
        assert_eq!(
            r.unwrap(),
            SandboxRequest::WorkspaceWrite {
                writable_roots: vec![],
                network: false
            }
        );
        let r = parse_sandbox_state(Some(
            &json!({"sandboxPolicy": {"type": "danger-full-access"}}),
        ));
        assert_eq!(r.unwrap(), SandboxRequest::FullAccess);
    }

    /// What today's Codex sends in `_meta["codex/sandbox-state-meta"]` (codex-rs
    /// `SandboxState` serialized: camelCase, the policy tagged by kebab-case `type` with
    /// snake_case fields, `permissionProfile` alongside).
    #[test]
    fn codex_call_meta_parses() {
        let s = parse_client_sandbox(
            Some(&json!({
                "permissionProfile": {"type": "managed",
                    "file_system": {"type": "restricted", "entries": []}, "network": "restricted"},
                "sandboxPolicy": {"type": "workspace-write", "writable_roots": ["/extra"],
                    "network_access": false, "exclude_tmpdir_env_var": false,
                    "exclude_slash_tmp": false},
                "codexLinuxSandboxExe": null,
                "sandboxCwd": "/proj",
                "useLegacyLandlock": false
            })),
            StateSource::CallMeta,
        )
        .unwrap();
        assert_eq!(s.cwd, Some(PathBuf::from("/proj")));
        assert_eq!(
            s.request,
            SandboxRequest::WorkspaceWrite {
                writable_roots: vec!["/proj".into(), "/extra".into()],
                network: false
            }
        );
        let s = parse_client_sandbox(
            Some(
                &json!({"sandboxPolicy": {"type": "read-only", "network_access": true,
                "access": {"type": "full-access"}}, "sandboxCwd": "file:///a%20b",
                "codexLinuxSandboxExe": "/usr/bin/codex-linux-sandbox"}),
            ),
            StateSource::CallMeta,
        )
        .unwrap();
        assert_eq!(s.request, SandboxRequest::ReadOnly { network: true });
        assert_eq!(s.cwd, Some(PathBuf::from("/a b")));
        for (policy, network) in [
            (json!({"type": "external-sandbox"}), false),
            (
                json!({"type": "external-sandbox", "network_access": "restricted"}),
                false,
            ),
            (
                json!({"type": "external-sandbox", "network_access": "enabled"}),
                true,
            ),
        ] {
            let s = parse_client_sandbox(
                Some(&json!({"sandboxPolicy": policy, "sandboxCwd": "/p"})),
                StateSource::CallMeta,
            )
            .unwrap();
            assert_eq!(s.request, SandboxRequest::External { network });
        }
        for bad in [
            json!({"sandboxCwd": "/p"}),
            json!({"sandboxPolicy": {"type": "external-sandbox", "network_access": true}}),
            json!({"sandboxPolicy": {"type": "read-only"}, "sandboxCwd": "relative"}),
            json!({"sandboxPolicy": {"type": "read-only"}, "sandboxCwd": "file://host/x"}),
            json!("read-only"),
        ] {
            let e = parse_client_sandbox(Some(&bad), StateSource::CallMeta).unwrap_err();
            assert!(
                e.contains("_meta[\"codex/sandbox-state-meta\"]"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn hostile_updates_are_refused_in_words() {
        for bad in [
            json!({}),
            json!({"sandboxPolicy": {"type": "no-such-sandbox"}}),
            json!({"sandboxPolicy": "read-only"}),
            json!({"sandboxPolicy": {"type": "workspace-write", "writable_roots": "/"}}),
            json!([1, 2]),
        ] {
            let e = parse_sandbox_state(Some(&bad)).unwrap_err();
            assert!(
                e.contains("invalid codex/sandbox-state/update params"),
                "{e}"
            );
        }
        assert!(parse_sandbox_state(None).is_err());
    }

    #[test]
    fn only_file_roots_become_paths() {
        let roots = vec![
            Root::new("file:///home/u/proj%20a"),
            Root::new("https://example.com/x"),
            Root::new("not a uri"),
            Root::new("file:///srv/b"),
            Root::new("file://otherhost/srv/c"),
            Root::new("file:///x%zz"),
            Root::new("file:///x%00y"),
            Root::new("file:///x?q=1"),
            Root::new("file://localhost/srv/d"),
            // What the url crate handles beyond that: one slash, any case of the scheme
            // and of localhost, dot segments, UTF-8 escapes; an escaped slash (no file
            // name holds one) is refused, never taken as a separator.
            Root::new("file:/srv/e"),
            Root::new("FILE://LocalHost/srv/f"),
            Root::new("file:///srv/x/../g/./"),
            Root::new("file:///srv/caf%C3%A9"),
            Root::new("file:///srv/a%2Fb"),
            Root::new("file:///srv/h#frag"),
        ];
        assert_eq!(
            root_paths(&roots),
            vec![
                PathBuf::from("/home/u/proj a"),
                PathBuf::from("/srv/b"),
                PathBuf::from("/srv/d"),
                PathBuf::from("/srv/e"),
                PathBuf::from("/srv/f"),
                PathBuf::from("/srv/g/"),
                PathBuf::from("/srv/café"),
            ]
        );
    }
}
