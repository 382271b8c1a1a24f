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
