//! `.env` files for shell jobs: `KEY=VALUE` lines, `#` comments, an optional
//! `export ` prefix, single quotes (literal), double quotes (escapes `\n \t \r \" \\ \$`,
//! may span lines). `${VAR}` and `$VAR` in unquoted and double-quoted values name a key an
//! earlier line of the same file set; the server's own environment is never read (it may
//! hold secrets, such as the HTTP token), so any other name is an error. A line that does
//! not parse is an error naming the file and the line.

use std::path::Path;

use super::JobError;

/// Largest `.env` file accepted.
const MAX_BYTES: u64 = 1 << 20;

/// Read and parse the `.env` file at `path` (absolute), which must lie beneath `root`.
///
/// The server reads this file itself, outside the sandbox, so it is opened with
/// `openat2(RESOLVE_BENEATH)` from `root`: no `..`, absolute symlink or link chain can
/// lead out (and no check-then-open race), only a regular file of at most 1 MiB. A file
/// outside is refused as [`JobError::Denied`] without a word of its content.
pub(crate) fn load_beneath(
    root: &Path,
    path: &Path,
    policy: &str,
) -> Result<Vec<(String, String)>, JobError> {
    use std::io::Read;
    use std::os::fd::AsFd;

    use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
    use nix::sys::stat::Mode;

    let name = path.display().to_string();
    let denied = || JobError::Denied {
        what: "env file",
        // The path as given: resolving it would answer differently for host paths that
        // exist and those that don't.
        path: path.to_path_buf(),
        policy: policy.to_string(),
    };
    let rel = path.strip_prefix(root).map_err(|_| denied())?;
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let dir = std::fs::File::open(root).map_err(|e| {
        JobError::io(
            format!("could not open the workspace {}", root.display()),
            e,
        )
    })?;
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK | OFlag::O_NOCTTY)
        .mode(Mode::empty())
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let fd = match openat2(dir.as_fd(), rel, how) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::EXDEV) => return Err(denied()),
        Err(e) => {
            return Err(JobError::io(
                format!("could not read the env file {name}"),
                std::io::Error::from(e),
            ));
        }
    };
    let mut file = std::fs::File::from(fd);
    let meta = file
        .metadata()
        .map_err(|e| JobError::io(format!("could not read the env file {name}"), e))?;
    if !meta.is_file() {
        return Err(JobError::Request(format!(
            "env file {name} is not a regular file"
        )));
    }
    let mut bytes = Vec::new();
    (&mut file)
        .take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| JobError::io(format!("could not read the env file {name}"), e))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(JobError::Request(format!(
            "env file {name} is larger than 1 MiB"
        )));
    }
    let text = String::from_utf8(bytes).map_err(|e| JobError::DotEnv {
        file: name.clone(),
        line: 1 + e.as_bytes()[..e.utf8_error().valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count(),
        reason: "the file is not valid UTF-8".into(),
    })?;
    parse(&text, &name)
}

/// Parse `.env` text; `file` names the source in errors.
pub(crate) fn parse(text: &str, file: &str) -> Result<Vec<(String, String)>, JobError> {
    let lines: Vec<&str> = text.lines().collect();
    let mut vars = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let start_line = i + 1;
        let err = |reason: String| JobError::DotEnv {
            file: file.to_string(),
            line: start_line,
            reason,
        };
        let line = lines[i].trim_start();
        i += 1;
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line
            .strip_prefix("export ")
            .map(str::trim_start)
            .unwrap_or(line);
        let Some((key, rest)) = line.split_once('=') else {
            return Err(err(format!(
                "expected KEY=VALUE, found {:?}",
                shorten(line)
            )));
        };
        let key = key.trim_end();
        if !valid_key(key) {
            return Err(err(format!(
                "{:?} is not a valid variable name (letters, digits and _, not starting with a digit)",
                shorten(key)
            )));
        }
        let rest = rest.trim_start();
        let value = match rest.chars().next() {
            Some(q @ ('"' | '\'')) => {
                // A quoted value may continue on the following lines.
                let mut body = rest[1..].to_string();
                loop {
                    if let Some((value, after)) = close_quote(&body, q) {
                        let after = after.trim_start();
                        if !(after.is_empty() || after.starts_with('#')) {
                            return Err(err(format!(
                                "unexpected text after the closing quote: {:?}",
                                shorten(after)
                            )));
                        }
                        break if q == '"' {
                            expand(&value, &vars, true).map_err(&err)?
                        } else {
                            value
                        };
                    }
                    let Some(next) = lines.get(i) else {
                        return Err(err(format!("the {q} quote opened here is never closed")));
                    };
                    body.push('\n');
                    body.push_str(next);
                    i += 1;
                }
            }
            _ => expand(strip_comment(rest).trim_end(), &vars, false).map_err(&err)?,
        };
        vars.push((key.to_string(), value));
    }
    Ok(vars)
}

fn valid_key(key: &str) -> bool {
    let mut chars = key.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Split `body` (text after an opening quote) at the closing quote: (raw value, rest).
/// In double quotes a backslash escapes the next character.
fn close_quote(body: &str, q: char) -> Option<(String, &str)> {
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        if q == '"' && escaped {
            escaped = false;
            continue;
        }
        if q == '"' && c == '\\' {
            escaped = true;
            continue;
        }
        if c == q {
            return Some((body[..i].to_string(), &body[i + 1..]));
        }
    }
    None
}

/// `raw` with `${VAR}` / `$VAR` replaced by the value an earlier line gave `VAR` (the
/// last one wins); with `escapes` (double quotes) also `\n \t \r \" \\ \$ \'`. A `$`
/// not followed by a name is itself; an unknown name is an error in words.
fn expand(raw: &str, vars: &[(String, String)], escapes: bool) -> Result<String, String> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if escapes => unescape_one(&mut out, chars.next()),
            '$' => {
                let braced = chars.peek() == Some(&'{');
                if braced {
                    chars.next();
                }
                let mut name = String::new();
                while let Some(&n) = chars.peek() {
                    let ok = n == '_' || n.is_ascii_alphanumeric();
                    if !ok || (name.is_empty() && n.is_ascii_digit()) {
                        break;
                    }
                    name.push(n);
                    chars.next();
                }
                if braced && chars.next() != Some('}') {
                    return Err(format!(
                        "`${{{name}` is not closed: write ${{NAME}} with a valid name"
                    ));
                }
                if name.is_empty() {
                    out.push('$');
                    if braced {
                        out.push_str("{}");
                    }
                    continue;
                }
                let Some((_, value)) = vars.iter().rev().find(|(k, _)| *k == name) else {
                    return Err(format!(
                        "${name} names no variable an earlier line of this file sets (the \
                         server's own environment is not read: set {name} above, or write \\$ \
                         in double quotes for a literal $)"
                    ));
                };
                out.push_str(value);
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// The character after a backslash in double quotes.
fn unescape_one(out: &mut String, next: Option<char>) {
    match next {
        Some('n') => out.push('\n'),
        Some('t') => out.push('\t'),
        Some('r') => out.push('\r'),
        Some(c @ ('"' | '\\' | '$' | '\'')) => out.push(c),
        Some(c) => {
            out.push('\\');
            out.push(c);
        }
        None => out.push('\\'),
    }
}

/// An unquoted value ends at ` #` (a `#` preceded by whitespace).
fn strip_comment(value: &str) -> &str {
    let bytes = value.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'#' && (i == 0 || bytes[i - 1].is_ascii_whitespace()) {
            return &value[..i];
        }
    }
    value
}

fn shorten(s: &str) -> String {
    s.chars().take(60).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_the_common_forms() {
        let text = "# comment\n\nA=1\nexport B = two words  # note\nC='single # kept'\nD=\"x\\ny \\\"q\\\"\"\nE=\nF=a#b\n  G=\"multi\nline\"\n";
        assert_eq!(
            parse(text, ".env").unwrap(),
            kv(&[
                ("A", "1"),
                ("B", "two words"),
                ("C", "single # kept"),
                ("D", "x\ny \"q\""),
                ("E", ""),
                ("F", "a#b"),
                ("G", "multi\nline"),
            ])
        );
    }

    /// `${VAR}` and `$VAR` name earlier keys of the file (the last one wins) in unquoted
    /// and double-quoted values; single quotes and `\$` keep a `$`; an unknown name is an
    /// error — the server's own environment (its secrets) is never read.
    #[test]
    fn variables_expand_from_earlier_lines_only() {
        let text = "BASE=/srv\nURL=${BASE}/api\nQ=\"$BASE/x \\$HOME\"\nLIT='${BASE}'\nBASE=/opt\nLATE=$BASE-2\nCOST=5$\n";
        assert_eq!(
            parse(text, ".env").unwrap(),
            kv(&[
                ("BASE", "/srv"),
                ("URL", "/srv/api"),
                ("Q", "/srv/x $HOME"),
                ("LIT", "${BASE}"),
                ("BASE", "/opt"),
                ("LATE", "/opt-2"),
                ("COST", "5$"),
            ])
        );
        // HOME is set in the server's environment, and still unknown here.
        let err = parse("A=1\nB=${HOME}\n", ".env").unwrap_err().to_string();
        assert!(
            err.starts_with(".env:2: $HOME names no variable an earlier line"),
            "{err}"
        );
        let err = parse("A=${A\n", ".env").unwrap_err().to_string();
        assert!(err.contains("is not closed"), "{err}");
    }

    #[test]
    fn bad_lines_name_file_and_line() {
        let err = parse("A=1\nthis is not valid\n", "/w/.env").unwrap_err();
        assert_eq!(
            err.to_string(),
            "/w/.env:2: expected KEY=VALUE, found \"this is not valid\""
        );
        let err = parse("A=1\n\n1X=2\n", ".env").unwrap_err();
        assert!(
            err.to_string()
                .starts_with(".env:3: \"1X\" is not a valid variable name"),
            "{err}"
        );
        let err = parse("A=\"open\nstill open\n", ".env").unwrap_err();
        assert_eq!(
            err.to_string(),
            ".env:1: the \" quote opened here is never closed"
        );
        let err = parse("A='x' trailing\n", ".env").unwrap_err();
        assert!(err.to_string().contains("after the closing quote"), "{err}");
    }
}
