//! Pattern search over a spool with lines of context, streaming: memory holds only
//! the current line (at most [`MAX_LINE`] bytes), the context window and the hits.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use regex::bytes::Regex;

use super::SearchHit;
use super::excerpt::lossy;

/// Lines longer than this are searched in pieces of this size (same line number).
pub const MAX_LINE: usize = 64 * 1024;
/// Displayed lines are shortened to about this many bytes around the match.
pub const SHOWN_LINE: usize = 400;
/// Upper bounds on what a caller may ask for.
pub const MAX_CONTEXT: usize = 20;
pub const MAX_HITS: usize = 1000;

/// Compile `pattern` (regex syntax, as `grep -E`; `(?i)` for case-insensitive).
pub fn compile(pattern: &str) -> Result<Regex, String> {
    if pattern.is_empty() {
        return Err("the pattern is empty".into());
    }
    regex::bytes::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| {
            format!("{e}; use regex syntax and escape special characters such as ( [ . * with \\")
        })
}

/// Search the first `len` bytes of the spool at `path`.
pub fn search_file(
    path: &Path,
    len: u64,
    re: &Regex,
    context_lines: usize,
    max_hits: usize,
) -> io::Result<Vec<SearchHit>> {
    let context = context_lines.min(MAX_CONTEXT);
    let max_hits = max_hits.clamp(1, MAX_HITS);
    let file = match File::open(path) {
        Ok(f) => f,
        // Never written: the job printed nothing on this stream.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut reader = BufReader::with_capacity(64 * 1024, file.take(len));
    let mut hits: Vec<SearchHit> = Vec::new();
    // Indices into `hits` still collecting `after` lines.
    let mut open: Vec<usize> = Vec::new();
    let mut before: VecDeque<String> = VecDeque::with_capacity(context + 1);
    let mut line = Vec::with_capacity(1024);
    let mut line_no: u64 = 1;
    let mut offset: u64 = 0;
    loop {
        line.clear();
        let ended_line = read_piece(&mut reader, &mut line)?;
        if line.is_empty() && !ended_line {
            break; // end of file
        }
        let piece_offset = offset;
        offset += line.len() as u64;
        let content = trim_newline(&line);
        open.retain(|&i| {
            let hit = &mut hits[i];
            hit.after.push(shorten(content, None));
            hit.after.len() < context
        });
        if hits.len() < max_hits
            && let Some(m) = re.find(content)
        {
            hits.push(SearchHit {
                line: line_no,
                offset: piece_offset,
                text: shorten(content, Some(m.start())),
                before: before.iter().cloned().collect(),
                after: Vec::new(),
            });
            if context > 0 {
                open.push(hits.len() - 1);
            }
        } else if hits.len() >= max_hits && open.is_empty() {
            break;
        }
        if context > 0 {
            if before.len() == context {
                before.pop_front();
            }
            before.push_back(shorten(content, None));
        }
        if ended_line {
            line_no += 1;
        }
    }
    Ok(hits)
}

/// Read up to the next newline (included) or [`MAX_LINE`] bytes. Returns whether a
/// newline ended the piece.
fn read_piece(reader: &mut impl BufRead, out: &mut Vec<u8>) -> io::Result<bool> {
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(false);
        }
        let room = MAX_LINE - out.len();
        let window = &buf[..buf.len().min(room)];
        if let Some(pos) = window.iter().position(|&b| b == b'\n') {
            out.extend_from_slice(&window[..=pos]);
            reader.consume(pos + 1);
            return Ok(true);
        }
        let n = window.len();
        out.extend_from_slice(window);
        reader.consume(n);
        if out.len() >= MAX_LINE {
            return Ok(false);
        }
    }
}

fn trim_newline(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The line as text, shortened to about [`SHOWN_LINE`] bytes (around `at` if given),
/// with `…` where text was cut.
fn shorten(line: &[u8], at: Option<usize>) -> String {
    if line.len() <= SHOWN_LINE {
        return lossy(line.to_vec());
    }
    let center = at.unwrap_or(0);
    let start = center
        .saturating_sub(SHOWN_LINE / 4)
        .min(line.len() - SHOWN_LINE);
    let mut start = start;
    while start > 0 && start < line.len() && line[start] & 0xC0 == 0x80 {
        start -= 1;
    }
    let mut end = (start + SHOWN_LINE).min(line.len());
    while end < line.len() && line[end] & 0xC0 == 0x80 {
        end += 1;
    }
    let mut text = String::new();
    if start > 0 {
        text.push('…');
    }
    text.push_str(&lossy(line[start..end].to_vec()));
    if end < line.len() {
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn file_with(name: &str, data: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("jobs-search-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, data).unwrap();
        path
    }

    #[test]
    fn finds_lines_with_context_and_offsets() {
        let data = b"alpha\nbeta\nERROR one\ngamma\ndelta\nERROR two\n";
        let p = file_with("ctx", data);
        let hits = search_file(&p, data.len() as u64, &compile("ERROR").unwrap(), 1, 10).unwrap();
        assert_eq!(
            hits,
            vec![
                SearchHit {
                    line: 3,
                    offset: 11,
                    text: "ERROR one".into(),
                    before: vec!["beta".into()],
                    after: vec!["gamma".into()]
                },
                SearchHit {
                    line: 6,
                    offset: 33,
                    text: "ERROR two".into(),
                    before: vec!["delta".into()],
                    after: vec![]
                },
            ]
        );
        assert_eq!(&data[11..20], b"ERROR one");
    }

    #[test]
    fn respects_max_hits_and_length() {
        let data = b"x1\nx2\nx3\nx4\n";
        let p = file_with("max", data);
        let hits = search_file(&p, data.len() as u64, &compile("x").unwrap(), 0, 2).unwrap();
        assert_eq!(hits.iter().map(|h| h.line).collect::<Vec<_>>(), vec![1, 2]);
        // Only the first 6 bytes are searched.
        let hits = search_file(&p, 6, &compile("x[34]").unwrap(), 0, 10).unwrap();
        assert!(hits.is_empty());
    }

    #[test]
    fn long_lines_are_searched_in_pieces_and_shortened() {
        let mut data = vec![b'a'; MAX_LINE + 1000];
        data.extend_from_slice(b"needle\nnext\n");
        let p = file_with("long", &data);
        let hits = search_file(&p, data.len() as u64, &compile("needle").unwrap(), 0, 10).unwrap();
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].line, 1);
        assert_eq!(hits[0].offset, MAX_LINE as u64);
        assert!(hits[0].text.starts_with('…') && hits[0].text.ends_with("needle"));
    }

    #[test]
    fn bad_pattern_is_a_clear_error() {
        let err = compile("(unclosed").unwrap_err();
        assert!(err.contains("escape"), "{err}");
        assert!(compile("").is_err());
    }
}
