//! Denials in words. The kernel answers a blocked operation with a bare errno
//! (EACCES, EROFS, EPERM) that the program prints as it likes; this module finds those
//! messages in a job's output and says which rule of which policy stopped it, e.g.
//! "blocked by policy workspace-write: write to /etc/x (writable here: /ws, the private
//! temp dir)". Pure text in, text out: the caller decides where to show it — except
//! that a "No such file or directory" about a path the mount view leaves out is told
//! apart from an ordinary one by looking at the host (see [`hidden_by_view`]).

use std::path::{Path, PathBuf};

use super::resolve::{NetworkPolicy, ResolvedPolicy};

/// The errno texts a denial by the sandbox produces (glibc's strerror wording).
const READ_ONLY: &str = "Read-only file system";
const DENIED: &str = "Permission denied";
const NOT_PERMITTED: &str = "Operation not permitted";
/// ENOENT: a path the mount view does not show is simply absent in the sandbox.
const NOT_FOUND: &str = "No such file or directory";

/// At most this many explanations per text: a loop hitting the same wall says so once.
const MAX_EXPLANATIONS: usize = 5;

/// Explain every distinct denial found in `text` (one sentence each, in order of first
/// appearance). Lines that name a path the policy allows are left alone: the sandbox did
/// not cause those.
pub fn explain_denials(policy: &ResolvedPolicy, text: &str) -> Vec<String> {
    explain_denials_in(policy, &policy.workspace, text)
}

/// [`explain_denials`] for a job that ran in `cwd`: relative paths in its messages
/// (`cannot create out.txt`, `[Errno 30] …: 'out.csv'`) are resolved against it.
pub(crate) fn explain_denials_in(policy: &ResolvedPolicy, cwd: &Path, text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        // A traceback names the failing call a few lines above the error itself.
        let context = &lines[i.saturating_sub(3)..=i];
        let Some(sentence) = explain_line(policy, cwd, line, context) else {
            continue;
        };
        if !out.contains(&sentence) {
            out.push(sentence);
            if out.len() == MAX_EXPLANATIONS {
                break;
            }
        }
    }
    out
}

fn explain_line(
    policy: &ResolvedPolicy,
    cwd: &Path,
    line: &str,
    context: &[&str],
) -> Option<String> {
    let read_only = line.contains(READ_ONLY);
    let denied = line.contains(DENIED);
    let not_permitted = line.contains(NOT_PERMITTED);
    let prefix = format!("blocked by policy {}", policy.name);
    if policy.network != NetworkPolicy::Full && is_resolution_failure(line) {
        return Some(format!(
            "{prefix}: name resolution refused (network is {}: no DNS in the sandbox; use a \
             policy that allows the host)",
            network_words(&policy.network)
        ));
    }
    if !(read_only || denied || not_permitted) {
        let hidden = denied_path(line, NOT_FOUND, cwd).and_then(|p| hidden_by_view(policy, &p))?;
        return Some(format!(
            "{prefix}: {} is not visible in the sandbox (the policy does not mount it; to use \
             it, add it to the policy's read or write paths)",
            hidden.display()
        ));
    }
    let phrase = if read_only {
        READ_ONLY
    } else if denied {
        DENIED
    } else {
        NOT_PERMITTED
    };
    let Some(path) = denied_path(line, phrase, cwd) else {
        // No path: an operation on a socket or a process, not a file.
        if not_permitted
            && context.iter().any(|l| looks_like_network(l))
            && policy.network != NetworkPolicy::Full
        {
            return Some(format!(
                "{prefix}: network access (network is {}; use a policy that allows it)",
                network_words(&policy.network)
            ));
        }
        return None;
    };
    if is_under_any(&path, &policy.write) || path.starts_with(&policy.tmp) {
        return None;
    }
    let readable = is_under_any(&path, &policy.read);
    let what = if read_only || (!denied && readable) {
        "write to"
    } else if readable {
        "write or execute"
    } else {
        "access to"
    };
    Some(format!(
        "{prefix}: {what} {} ({}; writable here: {})",
        path.display(),
        if readable {
            "readable only"
        } else {
            "outside every path the policy allows"
        },
        writable_words(policy)
    ))
}

/// The path the error is about, made absolute against `cwd`: Python puts it right after
/// the errno text (`[Errno 30] Read-only file system: 'out.csv'`), shells and coreutils
/// right before it (`/bin/sh: 1: cannot create out.txt: Read-only file system`, `touch:
/// cannot touch 'foo': …` — the token next to the text, not the program's own path).
fn denied_path(line: &str, phrase: &str, cwd: &Path) -> Option<PathBuf> {
    let at = line.find(phrase)?;
    let (before, after) = line.split_at(at);
    let after = &after[phrase.len()..];
    let next = after.strip_prefix(':').and_then(|rest| {
        quoted_at_start(rest).or_else(|| tokens(rest).next().filter(|t| looks_like_path(t)))
    });
    let prev = before.trim_end().strip_suffix(':').and_then(|rest| {
        quoted_at_end(rest).or_else(|| tokens(rest).last().filter(|t| looks_like_path(t)))
    });
    let token = next.or(prev).or_else(|| {
        absolute_paths(after)
            .next()
            .or_else(|| absolute_paths(before).last())
    })?;
    let path = Path::new(token);
    Some(if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    })
}

const QUOTES: [char; 5] = ['\'', '"', '`', '‘', '’'];

/// A quoted string at the start of `text` (after spaces): `'out.csv'`.
fn quoted_at_start(text: &str) -> Option<&str> {
    let rest = text.trim_start();
    let open = rest.chars().next().filter(|c| QUOTES.contains(c))?;
    let inner = &rest[open.len_utf8()..];
    let end = inner.find(QUOTES)?;
    Some(&inner[..end]).filter(|s| !s.is_empty())
}

/// A quoted string at the end of `text` (before spaces): `cannot touch 'foo'`.
fn quoted_at_end(text: &str) -> Option<&str> {
    let rest = text.trim_end();
    let close = rest.chars().last().filter(|c| QUOTES.contains(c))?;
    let inner = &rest[..rest.len() - close.len_utf8()];
    let start = inner.rfind(QUOTES)?;
    let q = inner[start..].chars().next()?;
    Some(&inner[start + q.len_utf8()..]).filter(|s| !s.is_empty())
}

/// Whitespace- or quote-separated tokens, stripped of trailing punctuation.
fn tokens(text: &str) -> impl DoubleEndedIterator<Item = &str> {
    text.split(|c: char| c.is_whitespace() || QUOTES.contains(&c))
        .map(|t| t.trim_end_matches([':', ',', ')', ';']))
        .filter(|t| !t.is_empty())
}

/// A token that can be a file name (not a line number, an errno or a word of the text).
fn looks_like_path(t: &str) -> bool {
    !t.starts_with('[')
        && !t.bytes().all(|b| b.is_ascii_digit())
        && (t.contains('/') || t.contains('.') || !t.chars().all(|c| c.is_ascii_lowercase()))
}

/// The resolver's words for a name it could not look up (glibc's gai_strerror, curl,
/// Python's socket.gaierror) — in a sandbox without network, DNS is refused.
fn is_resolution_failure(line: &str) -> bool {
    [
        "Temporary failure in name resolution",
        "Name or service not known",
        "No address associated with hostname",
        "Could not resolve host",
        "nodename nor servname provided",
        "getaddrinfo failed",
    ]
    .iter()
    .any(|w| line.contains(w))
}

/// Tokens that look like absolute paths, stripped of quotes and punctuation.
fn absolute_paths(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | '`' | '‘' | '’'))
        .map(|t| t.trim_end_matches([':', ',', ')', ';', '.']))
        .filter(|t| t.starts_with('/') && t.len() > 1)
}

/// For a path the sandbox said does not exist: the part of it that exists on the host
/// but not in the job's mount view, if that is why. `None` for an ordinary ENOENT: the
/// path is missing on the host too (below a directory the job sees, or at `/`), or it
/// lies inside a path the view shows. Costs a few `stat`s, only for failed jobs.
pub(crate) fn hidden_by_view(policy: &ResolvedPolicy, path: &Path) -> Option<PathBuf> {
    if !path.is_absolute() || path.components().any(|c| c.as_os_str() == "..") {
        return None;
    }
    // The nearest part of the path that exists on the host.
    let existing = path.ancestors().find(|a| a.symlink_metadata().is_ok())?;
    if existing == Path::new("/") || view_shows(policy, existing) {
        return None;
    }
    // A directory the view creates only to reach a listed path (`/usr` for `/usr/lib`)
    // is there but empty: a missing name below it is only hidden if it exists on the host.
    let on_the_way = view_roots(policy).any(|r| r.starts_with(existing) && r != existing);
    if on_the_way && existing != path {
        return None;
    }
    Some(existing.to_path_buf())
}

/// Every path the mount view binds (see `sandbox::mounts`).
fn view_roots(policy: &ResolvedPolicy) -> impl Iterator<Item = &Path> {
    const ALWAYS: [&str; 3] = ["/tmp", "/dev", "/proc"];
    policy
        .read
        .iter()
        .chain(&policy.write)
        .chain(&policy.execute)
        .chain([&policy.tmp, &policy.workspace])
        .map(PathBuf::as_path)
        .chain(ALWAYS.iter().map(Path::new))
}

/// Whether the view shows `path`: beneath a bound path, unless a hidden path lies
/// deeper between them (the nearest one decides).
fn view_shows(policy: &ResolvedPolicy, path: &Path) -> bool {
    let depth = |r: &Path| r.components().count();
    let shown = view_roots(policy)
        .filter(|r| path.starts_with(r))
        .map(depth)
        .max();
    let hidden = policy
        .hide
        .iter()
        .filter(|h| path.starts_with(h))
        .map(|h| depth(h))
        .max();
    match (shown, hidden) {
        (Some(s), Some(h)) => s > h,
        (s, _) => s.is_some(),
    }
}

fn looks_like_network(line: &str) -> bool {
    let l = line.to_ascii_lowercase();
    [
        "socket", "connect", "network", "bind", "ping", "urlopen", "resolve",
    ]
    .iter()
    .any(|w| l.contains(w))
}

fn is_under_any(path: &Path, roots: &[PathBuf]) -> bool {
    roots.iter().any(|r| path.starts_with(r))
}

fn network_words(n: &NetworkPolicy) -> String {
    n.describe()
}

fn writable_words(policy: &ResolvedPolicy) -> String {
    let mut parts: Vec<String> = policy
        .write
        .iter()
        .filter(|p| **p != policy.tmp && !p.starts_with("/dev"))
        .map(|p| p.display().to_string())
        .collect();
    parts.push("the private temp dir ($TMPDIR)".to_string());
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::{Placeholders, Policy};

    fn policy(name: &str) -> ResolvedPolicy {
        let ph = Placeholders {
            workspace: PathBuf::from("/ws"),
            tmp: PathBuf::from("/state/tmp/j1"),
            ..Default::default()
        };
        Policy::load(name)
            .and_then(|p| p.resolve(&ph))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn shell_and_python_write_denials_name_the_path_and_the_policy() {
        let p = policy("workspace-write");
        let text = "/bin/sh: 1: cannot create /etc/zz: Read-only file system\n\
                    OSError: [Errno 30] Read-only file system: '/usr/x'\n\
                    touch: cannot touch '/etc/zz': Read-only file system\n";
        let got = explain_denials(&p, text);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].starts_with("blocked by policy workspace-write: write to /etc/zz ("));
        assert!(got[0].contains("writable here: /ws"), "{}", got[0]);
        assert!(got[1].contains("write to /usr/x"), "{}", got[1]);
    }

    /// The refused file is the one next to the errno text, relative ones resolved against
    /// the job's directory — never the shell's own path; DNS failures are named.
    #[test]
    fn relative_files_and_name_resolution_are_named() {
        let p = policy("read-only");
        let cases = [
            (
                "/bin/sh: 1: cannot create out.txt: Read-only file system",
                "write to /ws/out.txt (",
            ),
            (
                "touch: cannot touch 'foo': Read-only file system",
                "write to /ws/foo (",
            ),
            (
                "OSError: [Errno 30] Read-only file system: 'out.csv'",
                "write to /ws/out.csv (",
            ),
            (
                "cp: cannot create regular file 'sub/a': Read-only file system",
                "write to /ws/sub/a (",
            ),
        ];
        for (line, want) in cases {
            let got = explain_denials(&p, line);
            assert_eq!(got.len(), 1, "{line}: {got:?}");
            assert!(got[0].contains(want), "{line}: {}", got[0]);
            assert!(!got[0].contains("/bin/sh"), "{line}: {}", got[0]);
        }
        let elsewhere = explain_denials_in(
            &p,
            Path::new("/ws/sub"),
            "touch: cannot touch 'x': Read-only file system",
        );
        assert!(
            elsewhere[0].contains("write to /ws/sub/x ("),
            "{elsewhere:?}"
        );
        for line in [
            "urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>",
            "socket.gaierror: [Errno -2] Name or service not known",
            "curl: (6) Could not resolve host: pypi.org",
        ] {
            let got = explain_denials(&p, line);
            assert_eq!(got.len(), 1, "{line}: {got:?}");
            assert!(
                got[0].starts_with(
                    "blocked by policy read-only: name resolution refused (network is"
                ),
                "{}",
                got[0]
            );
        }
        assert!(
            explain_denials(
                &policy("danger-full-access"),
                "Temporary failure in name resolution"
            )
            .is_empty()
        );
    }

    #[test]
    fn unreadable_paths_are_outside_the_policy() {
        let p = policy("workspace-write");
        let got = explain_denials(&p, "cat: /root/.ssh/id_rsa: Permission denied");
        assert_eq!(got.len(), 1);
        assert!(
            got[0].contains("access to /root/.ssh/id_rsa (outside every path"),
            "{}",
            got[0]
        );
    }

    #[test]
    fn allowed_paths_and_unrelated_lines_are_left_alone() {
        let p = policy("workspace-write");
        let text = "rm: cannot remove '/ws/locked': Permission denied\n\
                    all good\n\
                    PermissionError: [Errno 13] Permission denied: '/state/tmp/j1/x'";
        assert_eq!(explain_denials(&p, text), Vec::<String>::new());
    }

    #[test]
    fn paths_the_view_leaves_out_are_named() {
        // Real host paths: /proc/self exists everywhere; the view binds /proc, so a
        // missing name there is ordinary. `/` and a name missing on the host are ordinary.
        let mut p = policy("workspace-write");
        // Not under /tmp (the view always shows a /tmp, the private one), nor under the
        // checkout, which may itself be under /tmp.
        let scratch = crate::test_support::scratch_dir_in(Path::new("/var/tmp"), "msr-explain");
        let host = scratch.path().to_path_buf();
        std::fs::create_dir_all(host.join("inner")).unwrap();
        let text = format!(
            "mkdir: cannot create directory '{0}/inner/x': No such file or directory\n\
             cat: /proc/self/nothing-here: No such file or directory\n\
             ls: cannot access '/no-such-top-dir-xyz/a': No such file or directory\n\
             FileNotFoundError: [Errno 2] No such file or directory: 'relative'\n",
            host.display()
        );
        p.read.retain(|r| !host.starts_with(r));
        p.write.retain(|r| !host.starts_with(r));
        p.execute.retain(|r| !host.starts_with(r));
        p.tmp = PathBuf::from("/state/tmp/j1");
        let got = explain_denials(&p, &text);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].contains(&format!(
                "{}/inner is not visible in the sandbox",
                host.display()
            )),
            "{}",
            got[0]
        );
        // Once the view shows it, the same ENOENT is ordinary.
        p.read.push(host.clone());
        assert!(explain_denials(&p, &text).is_empty());
        // A hidden path beneath a shown one is not visible again.
        p.hide.push(host.join("inner"));
        assert_eq!(explain_denials(&p, &text).len(), 1);
    }

    #[test]
    fn socket_denials_explain_the_network_rule() {
        let p = policy("workspace-write");
        let got = explain_denials(
            &p,
            "    s = socket.socket(socket.AF_INET)\nPermissionError: [Errno 1] Operation not permitted",
        );
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].contains("network access (network is off"),
            "{}",
            got[0]
        );
        let full = policy("danger-full-access");
        assert!(explain_denials(&full, "connect: Operation not permitted").is_empty());
    }
}
