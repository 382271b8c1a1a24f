//! The dependency picture of docs/architecture.md, checked: every `crate::` path in src/
//! points down the layers (front end → server → app → {repl, jobs, envs, broker} → sandbox →
//! names), rmcp appears only in server/, landlock and seccompiler only in sandbox/, `cli`
//! only in the front end, and the top-level modules form no cycle.
//!
//! The front end is `main.rs`, `cli.rs` and `commands/` taken as one unit: `cli` parses and
//! dispatches to `commands`, whose functions take `cli`'s argument types.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layer of each unit; an import may only point to a lower one.
const LAYERS: &[(&str, u8)] = &[
    ("front", 5),
    ("server", 4),
    ("app", 3),
    ("repl", 2),
    ("jobs", 2),
    ("envs", 2),
    ("broker", 2),
    ("sandbox", 1),
    ("names", 0),
    // close_range / memfd_create for glibc 2.17: a leaf nothing imports.
    ("libc_compat", 0),
    // Unit-test helpers (`#[cfg(test)]` only): a leaf any layer's tests may use.
    ("test_support", 0),
];

/// Edges between units of the same layer that are allowed (they must stay acyclic and be
/// listed in docs/architecture.md). None today: repl, jobs and envs do not import each other.
const SIDEWAYS: &[(&str, &str)] = &[];

/// External crates confined to one unit.
const CONFINED: &[(&str, &str)] = &[
    ("rmcp", "server"),
    ("landlock", "sandbox"),
    ("seccompiler", "sandbox"),
];

/// The unit a file under src/ belongs to (`None` for lib.rs, which only declares them).
fn unit_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    match name {
        "lib" => None,
        "main" | "cli" | "commands" => Some("front".into()),
        other => Some(other.into()),
    }
}

/// The unit a top-level module name belongs to.
fn unit_of_module(module: &str) -> String {
    match module {
        "main" | "cli" | "commands" => "front".into(),
        other => other.into(),
    }
}

/// Source without `//` comments (doc links may name any module).
fn strip_comments(src: &str) -> String {
    src.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The top-level modules named by `crate::` paths, including grouped ones
/// (`use crate::{a::X, b}`).
fn crate_modules(src: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = src;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| is_ident(c) || c == ':') {
            continue; // `$crate::` or `other_crate::`
        }
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level items of the group: split on commas at brace depth 0.
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(first_ident(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    item.push(c);
                }
            }
            out.insert(first_ident(&item));
        } else {
            out.insert(first_ident(rest));
        }
    }
    out.remove("");
    out
}

fn first_ident(s: &str) -> String {
    s.trim_start()
        .chars()
        .take_while(|c| is_ident(*c))
        .collect()
}

/// Whether `src` uses the external crate `name`: `name::` or `::name::` at the start of a
/// path, not as a later segment (`crate::sandbox::launcher::landlock::x` does not count).
fn uses_crate(src: &str, name: &str) -> bool {
    let pat = format!("{name}::");
    src.match_indices(&pat).any(|(i, _)| {
        let before = &src[..i];
        match before.strip_suffix("::") {
            // `::name::` is a global path unless a path segment precedes it.
            Some(b) => !b
                .chars()
                .next_back()
                .is_some_and(|c| is_ident(c) || c == '>'),
            None => !before.chars().next_back().is_some_and(is_ident),
        }
    })
}

/// Everything wrong with one file of `unit`, in words; `edges` collects its unit edges.
fn check_file(
    unit: &str,
    file: &str,
    src: &str,
    edges: &mut BTreeSet<(String, String)>,
) -> Vec<String> {
    let layer = |u: &str| LAYERS.iter().find(|(n, _)| *n == u).map(|(_, l)| *l);
    let src = strip_comments(src);
    let mut problems = Vec::new();
    for module in crate_modules(&src) {
        let target = unit_of_module(&module);
        if target == unit {
            continue;
        }
        if module == "cli" {
            problems.push(format!(
                "{file}: imports crate::cli; only main.rs and commands/ may (give the layer below a plain config)"
            ));
        }
        edges.insert((unit.to_string(), target.clone()));
        match (layer(unit), layer(&target)) {
            (Some(a), Some(b)) if b < a => {}
            (Some(a), Some(b))
                if a == b && SIDEWAYS.contains(&(unit, target.as_str())) => {}
            (Some(_), Some(_)) => problems.push(format!(
                "{file}: {unit} imports crate::{module}, which is not below it (layers: {LAYERS:?})"
            )),
            _ => problems.push(format!(
                "{file}: unit {unit} or crate::{module} has no layer; add it to LAYERS and docs/architecture.md"
            )),
        }
    }
    for (krate, home) in CONFINED {
        if unit != *home && uses_crate(&src, krate) {
            problems.push(format!("{file}: uses {krate}, which only {home}/ may use"));
        }
    }
    problems
}

/// A cycle among the unit edges, if any (as a path a → b → ... → a).
fn find_cycle(edges: &BTreeSet<(String, String)>) -> Option<Vec<String>> {
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        graph.entry(a).or_default().push(b);
    }
    fn visit<'a>(
        n: &'a str,
        graph: &BTreeMap<&'a str, Vec<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| *p == n) {
            let mut cycle: Vec<String> = path[i..].iter().map(|s| s.to_string()).collect();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n);
        for next in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n);
        None
    }
    let mut done = BTreeSet::new();
    for n in graph.keys() {
        if let Some(c) = visit(n, &graph, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn imports_point_down_the_layers_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 50, "src/ not found at {}", src.display());
    let mut edges = BTreeSet::new();
    let mut problems = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(&src).unwrap();
        let Some(unit) = unit_of(rel) else { continue };
        let text = std::fs::read_to_string(path).unwrap();
        problems.extend(check_file(
            &unit,
            &rel.display().to_string(),
            &text,
            &mut edges,
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert_eq!(find_cycle(&edges), None);
    // The scan sees the real edges (a scanner that finds nothing passes vacuously).
    for (a, b) in [
        ("server", "app"),
        ("app", "repl"),
        ("app", "jobs"),
        ("app", "envs"),
        ("jobs", "sandbox"),
    ] {
        assert!(
            edges.contains(&(a.into(), b.into())),
            "edge {a} → {b} not seen: {edges:?}"
        );
    }
}

/// The checker itself catches what it is for (hostile input: each line is one violation).
#[test]
fn the_checker_catches_upward_imports_foreign_crates_and_cycles() {
    let mut edges = BTreeSet::new();
    let bad = [
        ("app", "use crate::server::report::JobReport;"),
        ("app", "use crate::{jobs::JobStore, server};"),
        ("app", "let x = crate::server::tools::DEFAULT_SESSION;"),
        ("app", "use crate::cli::ServeArgs;"),
        ("server", "use crate::commands::serve;"),
        ("repl", "use crate::app::App;"),
        ("envs", "use crate::repl::Session;"),
        ("sandbox", "use crate::jobs::JobStore;"),
        ("names", "use crate::sandbox::Policy;"),
        ("app", "use rmcp::model::CallToolResult;"),
        ("jobs", "fn f() -> ::rmcp::ErrorData { todo!() }"),
        ("repl", "use landlock::Ruleset;"),
        ("server", "let f = seccompiler::SeccompFilter::new;"),
        ("newmod", "use crate::jobs::JobStore;"),
    ];
    for (unit, line) in bad {
        let problems = check_file(unit, "x.rs", line, &mut edges);
        assert!(!problems.is_empty(), "{unit}: {line:?} passed");
    }
    let fine = [
        ("server", "use crate::app::{App, AppError};"),
        ("server", "use crate::jobs::{JobKind, JobStatus};"),
        ("app", "use crate::sandbox::{Placeholders, ResolvedPolicy};"),
        (
            "sandbox",
            "use crate::sandbox::launcher::landlock::FsGrant; mod landlock;",
        ),
        ("sandbox", "use landlock::Ruleset;"),
        (
            "front",
            "use crate::cli::ServeArgs; use crate::server::serve;",
        ),
        ("app", "// see crate::server::tools for the schemas"),
    ];
    for (unit, line) in fine {
        let problems = check_file(unit, "x.rs", line, &mut BTreeSet::new());
        assert!(problems.is_empty(), "{unit}: {line:?}: {problems:?}");
    }
    let cyclic: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert!(find_cycle(&cyclic).is_some());
    let acyclic: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("a", "c")]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(find_cycle(&acyclic), None);
}

// ---- Inside one directory: the files of src/sandbox/ and src/repl/ ----

/// A file's source without its unit tests: from a `#[cfg(test)]` that opens a module to
/// the end (the tests come last), and nothing of a `tests.rs`. Tests may cross the lines
/// the code may not (a launcher test may make a cgroup the parent's way).
fn non_test_code(rel: &Path, src: &str) -> String {
    if rel.file_name().is_some_and(|n| n == "tests.rs") {
        return String::new();
    }
    let lines: Vec<&str> = src.lines().collect();
    let cut = (0..lines.len())
        .find(|&i| {
            lines[i].trim() == "#[cfg(test)]"
                && lines.get(i + 1).is_some_and(|next| {
                    let next = next.trim_start();
                    let next = next.strip_prefix("pub(crate) ").unwrap_or(next);
                    next.starts_with("mod ")
                })
        })
        .unwrap_or(lines.len());
    strip_comments(&lines[..cut].join("\n"))
}

/// The module path of a file under src/ (`sandbox/parent/spawn.rs` → `sandbox::parent::spawn`,
/// `sandbox/launcher/mod.rs` → `sandbox::launcher`).
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.strip_suffix(".rs").unwrap_or(&last).to_string();
    if stem != "mod" && stem != "lib" {
        parts.push(stem);
    }
    parts
}

/// Every path a source names from `crate::`, `super::` or `self::` (and, for the child
/// modules a file declares, a bare `use child::...`), grouped `use`s expanded, as
/// absolute module paths (identifiers only; the items at their ends included).
fn named_paths(module: &[String], src: &str) -> Vec<Vec<String>> {
    let children: BTreeSet<String> = src
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix("pub ")
                .or(l.strip_prefix("pub(crate) "))
                .unwrap_or(l);
            let name = l.strip_prefix("mod ")?.trim_end_matches(';').trim();
            (!name.contains('{') && !name.contains(' ')).then(|| name.to_string())
        })
        .collect();
    // `pub(in crate::x)` names a module for visibility, not an import.
    let mut src = src.to_string();
    while let Some(at) = src.find("(in ") {
        let end = src[at..].find(')').map_or(src.len(), |e| at + e + 1);
        src.replace_range(at..end, "");
    }
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let before = i.checked_sub(1).map(|j| chars[j]);
        let at_path_start = !before.is_some_and(|c| is_ident(c) || c == ':');
        if at_path_start && (chars[i].is_ascii_alphabetic() || chars[i] == '_') {
            let (word, end) = ident_at(&chars, i);
            let is_root = matches!(word.as_str(), "crate" | "super" | "self");
            let is_child_use = children.contains(&word);
            if (is_root || is_child_use) && chars[end..].starts_with(&[':', ':']) {
                let base: Vec<String> = match word.as_str() {
                    "crate" => Vec::new(),
                    "self" => module.to_vec(),
                    "super" => module[..module.len().saturating_sub(1)].to_vec(),
                    child => {
                        let mut m = module.to_vec();
                        m.push(child.to_string());
                        m
                    }
                };
                let (paths, next) = tree_at(&chars, end + 2, base);
                out.extend(paths);
                i = next;
                continue;
            }
            i = end;
            continue;
        }
        i += 1;
    }
    out
}

fn ident_at(chars: &[char], start: usize) -> (String, usize) {
    let mut end = start;
    while end < chars.len() && is_ident(chars[end]) {
        end += 1;
    }
    (chars[start..end].iter().collect(), end)
}

/// The paths of a use-tree (or a plain path) starting at `i` below `base`.
fn tree_at(chars: &[char], mut i: usize, base: Vec<String>) -> (Vec<Vec<String>>, usize) {
    let mut path = base;
    loop {
        // `super::super::`, nested.
        if chars[i..].starts_with(&['s', 'u', 'p', 'e', 'r', ':', ':']) {
            path.pop();
            i += 7;
            continue;
        }
        if chars.get(i) == Some(&'{') {
            let mut all = Vec::new();
            i += 1;
            loop {
                while chars.get(i).is_some_and(|c| c.is_whitespace() || *c == ',') {
                    i += 1;
                }
                match chars.get(i) {
                    None => return (all, i),
                    Some('}') => return (all, i + 1),
                    _ => {}
                }
                let (paths, next) = tree_at(chars, i, path.clone());
                all.extend(paths);
                i = next.max(i + 1);
            }
        }
        if !chars
            .get(i)
            .is_some_and(|c| c.is_ascii_alphabetic() || *c == '_')
        {
            return (vec![path], i);
        }
        let (word, end) = ident_at(chars, i);
        if word != "self" {
            path.push(word);
        }
        i = end;
        if chars[i..].starts_with(&[':', ':']) {
            i += 2;
            continue;
        }
        return (vec![path], i);
    }
}

/// The file (relative to src/) a module path points into: its longest prefix that is a
/// file (`a/b.rs`) or a directory module (`a/b/mod.rs`).
fn file_of(src_dir: &Path, path: &[String]) -> Option<PathBuf> {
    (1..=path.len()).rev().find_map(|n| {
        let rel: PathBuf = path[..n].iter().collect();
        let file = rel.with_extension("rs");
        let dir = rel.join("mod.rs");
        [file, dir].into_iter().find(|c| src_dir.join(c).is_file())
    })
}

/// The import edges between the files of `dir` (relative to src/), non-test code only.
fn file_edges(dir: &str) -> BTreeSet<(String, String)> {
    let src_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src_dir.join(dir), &mut files);
    assert!(!files.is_empty(), "no files under src/{dir}");
    let mut edges = BTreeSet::new();
    for path in files {
        let rel = path.strip_prefix(&src_dir).unwrap().to_path_buf();
        let code = non_test_code(&rel, &std::fs::read_to_string(&path).unwrap());
        for named in named_paths(&module_of(&rel), &code) {
            let Some(target) = file_of(&src_dir, &named) else {
                continue;
            };
            if target != rel && target.starts_with(dir) {
                edges.insert((rel.display().to_string(), target.display().to_string()));
            }
        }
    }
    edges
}

/// The part of src/sandbox/ a file belongs to (`None`: `sandbox/mod.rs`, the facade).
fn sandbox_part(file: &str) -> Option<&'static str> {
    let rest = file.strip_prefix("sandbox/")?;
    ["policy", "launcher", "parent"]
        .into_iter()
        .find(|p| rest.starts_with(&format!("{p}/")))
}

/// What each part may import: `parent → launcher → policy`, never back.
const SANDBOX_MAY_IMPORT: &[(&str, &[&str])] = &[
    ("policy", &["policy"]),
    ("launcher", &["launcher", "policy"]),
    ("parent", &["parent", "launcher", "policy"]),
];

fn sandbox_direction_problems(edges: &BTreeSet<(String, String)>) -> Vec<String> {
    let mut problems = Vec::new();
    for (from, to) in edges {
        let Some(part) = sandbox_part(from) else {
            continue;
        };
        let allowed = SANDBOX_MAY_IMPORT
            .iter()
            .find(|(p, _)| *p == part)
            .map_or(&[][..], |(_, a)| *a);
        match sandbox_part(to) {
            Some(target) if allowed.contains(&target) => {}
            Some(target) => problems.push(format!(
                "{from} ({part}/) imports {to} ({target}/): the sandbox's parts import parent → launcher → policy only"
            )),
            None => problems.push(format!(
                "{from} imports {to}, the facade; name the item in its own part instead"
            )),
        }
    }
    problems
}

/// The launcher side imports nothing of the parent side, the policy data nothing of
/// either; no part goes through the `sandbox` facade.
#[test]
fn the_sandbox_parts_import_in_one_direction() {
    let edges = file_edges("sandbox");
    let problems = sandbox_direction_problems(&edges);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The scan sees the real edges.
    for (from, to) in [
        ("sandbox/parent/spawn.rs", "sandbox/launcher/mod.rs"),
        ("sandbox/parent/zygote.rs", "sandbox/launcher/seccomp.rs"),
        ("sandbox/launcher/mod.rs", "sandbox/launcher/pidns.rs"),
        ("sandbox/launcher/mod.rs", "sandbox/policy/resolve.rs"),
    ] {
        assert!(
            edges.contains(&(from.into(), to.into())),
            "edge {from} → {to} not seen"
        );
    }
    // ... and catches a violation of each kind.
    let bad: BTreeSet<(String, String)> = [
        ("sandbox/launcher/pidns.rs", "sandbox/parent/spawn.rs"),
        ("sandbox/policy/resolve.rs", "sandbox/launcher/landlock.rs"),
        ("sandbox/launcher/netns.rs", "sandbox/mod.rs"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(sandbox_direction_problems(&bad).len(), 3);
}

/// The policy data changes no process state: no syscall crate in `policy/`.
#[test]
fn the_policy_part_makes_no_syscalls() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/sandbox/policy");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    let mut problems = Vec::new();
    for path in files {
        let rel = path.strip_prefix(&dir).unwrap();
        let code = non_test_code(rel, &std::fs::read_to_string(&path).unwrap());
        for krate in ["libc", "nix", "landlock", "seccompiler", "caps", "rlimit"] {
            if uses_crate(&code, krate) {
                problems.push(format!("policy/{}: uses {krate}", rel.display()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The files of `dir` import each other without a cycle; the cycle in words otherwise.
fn assert_no_file_cycle(dir: &str) {
    let edges = file_edges(dir);
    assert!(!edges.is_empty(), "no edges seen under src/{dir}");
    if let Some(cycle) = find_cycle(&edges) {
        if std::env::var_os("DEPS_DUMP").is_some() {
            for (a, b) in &edges {
                eprintln!("EDGE {a} {b}");
            }
        }
        panic!(
            "the files of src/{dir} import each other in a cycle: {}",
            cycle.join(" → ")
        );
    }
}

#[test]
fn the_files_of_the_sandbox_import_without_cycles() {
    assert_no_file_cycle("sandbox");
}

#[test]
fn the_files_of_the_repl_import_without_cycles() {
    assert_no_file_cycle("repl");
}

/// The file cycle check finds what it is for: a cycle through a mod.rs (`super::` up,
/// a bare `use child::` down) and a `crate::` path.
#[test]
fn the_file_scan_reads_super_self_children_and_groups() {
    let module = vec!["sandbox".to_string(), "launcher".to_string()];
    let src = "pub mod pidns;\nuse pidns::{split, PGID_PREFIX};\nuse super::{policy::resolve::X, parent::spawn};\nfn f() { crate::sandbox::launcher::seccomp::y(); self::landlock::z(); }";
    let paths: Vec<String> = named_paths(&module, src)
        .iter()
        .map(|p| p.join("::"))
        .collect();
    for want in [
        "sandbox::launcher::pidns::split",
        "sandbox::launcher::pidns::PGID_PREFIX",
        "sandbox::policy::resolve::X",
        "sandbox::parent::spawn",
        "sandbox::launcher::seccomp::y",
        "sandbox::launcher::landlock::z",
    ] {
        assert!(paths.iter().any(|p| p == want), "{want} not in {paths:?}");
    }
    let child = vec![
        "sandbox".to_string(),
        "launcher".to_string(),
        "pidns".to_string(),
    ];
    let up: Vec<String> = named_paths(&child, "use super::SETUP_FAILED_EXIT;")
        .iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(up, ["sandbox::launcher::SETUP_FAILED_EXIT"]);
}

/// Statics in src/sandbox/ that may stay, each with why it is no launch state.
const STATIC_ALLOWED: &[(&str, &str, &str)] = &[
    (
        "sandbox/parent/child.rs",
        "FORWARD_PGID",
        "read by the signal handler `run` installs to forward SIGINT/SIGTERM: a handler can reach only a static",
    ),
    (
        "sandbox/parent/child.rs",
        "PENDING_SIGNAL",
        "written by that signal handler (a signal before the child exists is kept for it)",
    ),
];

/// `static`s (and `thread_local!`s) in the non-test code of src/sandbox/, as (file, name).
fn sandbox_statics() -> Vec<(String, String)> {
    let src_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src_dir.join("sandbox"), &mut files);
    let mut found = Vec::new();
    for path in files {
        let rel = path.strip_prefix(&src_dir).unwrap().to_path_buf();
        let code = non_test_code(&rel, &std::fs::read_to_string(&path).unwrap());
        for line in code.lines() {
            let line = line.trim_start();
            if line.starts_with("thread_local!") {
                found.push((rel.display().to_string(), "thread_local!".to_string()));
            }
            let rest = line
                .strip_prefix("pub(crate) ")
                .or(line.strip_prefix("pub(super) "))
                .or(line.strip_prefix("pub "))
                .unwrap_or(line);
            if let Some(decl) = rest.strip_prefix("static ") {
                let decl = decl.strip_prefix("mut ").unwrap_or(decl);
                let name: String = decl.chars().take_while(|c| is_ident(*c)).collect();
                found.push((rel.display().to_string(), name));
            }
        }
    }
    found
}

/// No process-global launch state in the sandbox: every `static` is on the list above
/// with its reason (the runtime object holds the rest).
#[test]
fn the_sandbox_holds_no_launch_state_in_statics() {
    let found = sandbox_statics();
    let unexpected: Vec<String> = found
        .iter()
        .filter(|(file, name)| {
            !STATIC_ALLOWED
                .iter()
                .any(|(f, n, _)| f == file && n == name)
        })
        .map(|(file, name)| format!("{file}: static {name}"))
        .collect();
    assert!(
        unexpected.is_empty(),
        "statics in src/sandbox/ (launch state belongs in sandbox::Runtime; an immutable table is a const): {}",
        unexpected.join(", ")
    );
    // The scan sees the statics it allows (a scan that finds nothing passes vacuously).
    for (file, name, _) in STATIC_ALLOWED {
        assert!(
            found.iter().any(|(f, n)| f == file && n == name),
            "{file}: {name} is allowed but gone; drop it from STATIC_ALLOWED"
        );
    }
}

/// The longest a function may be in the sandbox and the session code, signature and
/// closing brace included (issue 24: split into named steps a reader can follow).
const MAX_FN_LINES: usize = 80;

/// Functions of `src` (rustfmt-formatted) with their first line and length: a `fn` item
/// ends at the first line that is its own indentation followed by `}` (or on its own line
/// when it has no body or a one-line one).
fn function_lengths(src: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = src.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        let mut rest = body;
        for prefix in [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "const ",
            "async ",
            "unsafe ",
            "extern \"C\" ",
        ] {
            rest = rest.strip_prefix(prefix).unwrap_or(rest);
        }
        let Some(decl) = rest.strip_prefix("fn ") else {
            continue;
        };
        let name: String = decl.chars().take_while(|c| is_ident(*c)).collect();
        let close = format!("{indent}}}");
        let end = if body.ends_with(';') || body.ends_with('}') {
            i
        } else {
            (i..lines.len())
                .find(|&j| lines[j] == close)
                .unwrap_or(lines.len() - 1)
        };
        found.push((name, i + 1, end - i + 1));
    }
    found
}

#[test]
fn no_function_in_the_sandbox_or_the_session_is_over_80_lines() {
    let src_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src_dir.join("sandbox"), &mut files);
    rust_files(&src_dir.join("repl/session"), &mut files);
    files.push(src_dir.join("repl/session.rs"));
    let mut seen = 0;
    let mut long = Vec::new();
    for path in files {
        let rel = path.strip_prefix(&src_dir).unwrap().display().to_string();
        for (name, line, len) in function_lengths(&std::fs::read_to_string(&path).unwrap()) {
            seen += 1;
            if len > MAX_FN_LINES {
                long.push(format!("{rel}:{line} fn {name}: {len} lines"));
            }
        }
    }
    assert!(
        seen > 300,
        "the scan found only {seen} functions: it is broken"
    );
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them into named steps): {}",
        long.join(", ")
    );
}

/// The length scan measures what it should: a body to its closing brace at the item's
/// indentation, one-line and body-less items as one line.
#[test]
fn the_function_length_scan_measures_to_the_closing_brace() {
    let src = "fn a() {\n    if x {\n    }\n}\n    pub(crate) async fn b(\n        x: u8,\n    ) -> u8 {\n        x\n    }\nfn c();\nfn d() {}\n";
    let got = function_lengths(src);
    assert_eq!(
        got,
        vec![
            ("a".to_string(), 1, 4),
            ("b".to_string(), 5, 5),
            ("c".to_string(), 10, 1),
            ("d".to_string(), 11, 1),
        ]
    );
}
