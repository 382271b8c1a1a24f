//! Pattern search over a spool with lines of context, streaming: memory holds only
//! the current line (at most [`MAX_LINE`] bytes), the context window and the hits.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use regex::bytes::Regex;

use super::SearchHit;
use super::excerpt::lossy;

/// Lines longer than this are searched in pieces of this size (one line all the same:
/// counted, shown and used as context once; a match across two pieces is not found).
pub(crate) const MAX_LINE: usize = 64 * 1024;
/// Displayed lines are shortened to about this many bytes around the match.
pub(crate) const SHOWN_LINE: usize = 400;
/// Upper bounds on what a caller may ask for.
pub(crate) const MAX_CONTEXT: usize = 20;
pub(crate) const MAX_HITS: usize = 1000;

/// Compile `pattern` (regex syntax, as `grep -E`; `(?i)` for case-insensitive).
pub(crate) fn compile(pattern: &str) -> Result<Regex, String> {
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

/// What a search may return.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Byte offset to start at (a line start: a cursor from [`Found::next_offset`]).
    pub start: u64,
    /// Lines of context before and after each hit (at most [`MAX_CONTEXT`]).
    pub context: usize,
    /// Most hits returned (1..=[`MAX_HITS`]).
    pub max_hits: usize,
    /// About how many bytes of text the hits and their context may hold.
    pub text_budget: usize,
    /// Stop counting matches here (the count is then a lower bound).
    pub count_cap: u64,
}

/// What a search found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    pub hits: Vec<SearchHit>,
    /// Matching lines from `start` on (or at least this many, if `at_least`).
    pub matches: u64,
    pub at_least: bool,
    /// Where the first match not shown starts: pass it as `start` to continue.
    pub next_offset: Option<u64>,
}

/// Search bytes `[limits.start, len)` of the spool at `path`, counting every match and
/// returning the first ones with context, within the limits.
pub(crate) fn scan(path: &Path, len: u64, re: &Regex, limits: &Limits) -> io::Result<Found> {
    let context = limits.context.min(MAX_CONTEXT);
    let max_hits = limits.max_hits.clamp(1, MAX_HITS);
    let file = match File::open(path) {
        Ok(f) => f,
        // Never written: the job printed nothing on this stream.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Found::default()),
        Err(e) => return Err(e),
    };
    let start = limits.start.min(len);
    let mut reader = BufReader::with_capacity(64 * 1024, file.take(len));
    // Line numbers count from the start of the stream, also when starting later.
    let mut line_no: u64 = 1 + count_newlines(&mut reader, start)?;
    let mut found = Found::default();
    // Indices into `hits` still collecting `after` lines.
    let mut open: Vec<usize> = Vec::new();
    let mut before: VecDeque<String> = VecDeque::with_capacity(context + 1);
    let mut line = Vec::with_capacity(1024);
    let mut offset: u64 = start;
    let mut used = 0usize;
    // A line longer than MAX_LINE is read in pieces: it is counted, shown and used as
    // context once (its first piece stands for it), and searched piece by piece.
    let mut first_piece = true;
    let mut line_matched = false;
    let mut line_shown = String::new();
    loop {
        line.clear();
        let ended_line = read_piece(&mut reader, &mut line)?;
        if line.is_empty() && !ended_line {
            break; // end of file
        }
        let piece_offset = offset;
        offset += line.len() as u64;
        let content = trim_newline(&line);
        if first_piece {
            line_shown = shorten(content, None);
            if !ended_line && !line_shown.ends_with('…') {
                line_shown.push('…');
            }
            let hits = &mut found.hits;
            open.retain(|&i| {
                used += line_shown.len();
                let hit = &mut hits[i];
                hit.after.push(line_shown.clone());
                hit.after.len() < context
            });
        }
        let m = if line_matched { None } else { re.find(content) };
        if let Some(m) = m {
            line_matched = true;
            found.matches += 1;
            let collecting = found.next_offset.is_none() && found.hits.len() < max_hits;
            let hit = collecting.then(|| {
                let mut text = shorten(content, Some(m.start()));
                if !first_piece && !text.starts_with('…') {
                    text.insert(0, '…');
                }
                SearchHit {
                    line: line_no,
                    offset: piece_offset,
                    text,
                    before: before.iter().cloned().collect(),
                    after: Vec::new(),
                }
            });
            let size = hit.as_ref().map_or(0, |h| {
                h.text.len() + h.before.iter().map(String::len).sum::<usize>()
            });
            // Room for the hit and about as much again for its lines after.
            match hit {
                Some(h) if found.hits.is_empty() || used + 2 * size <= limits.text_budget => {
                    used += size;
                    found.hits.push(h);
                    if context > 0 {
                        open.push(found.hits.len() - 1);
                    }
                }
                _ => {
                    if found.next_offset.is_none() {
                        found.next_offset = Some(piece_offset);
                    }
                }
            }
        }
        if found.next_offset.is_some() && open.is_empty() && found.matches >= limits.count_cap {
            found.at_least = offset < len;
            break;
        }
        first_piece = false;
        if ended_line {
            if context > 0 {
                if before.len() == context {
                    before.pop_front();
                }
                before.push_back(std::mem::take(&mut line_shown));
            }
            line_no += 1;
            first_piece = true;
            line_matched = false;
        }
    }
    Ok(found)
}

/// Skip `n` bytes of `reader`, returning how many newlines they hold.
fn count_newlines(reader: &mut impl BufRead, mut n: u64) -> io::Result<u64> {
    let mut lines = 0;
    while n > 0 {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        let take = buf.len().min(n as usize);
        lines += buf[..take].iter().filter(|&&b| b == b'\n').count() as u64;
        reader.consume(take);
        n -= take as u64;
    }
    Ok(lines)
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
    use crate::test_support::scratch_file;

    /// The first `len` bytes of `path`, at most `max_hits` hits, every match counted.
    fn search_file(
        path: &Path,
        len: u64,
        re: &Regex,
        context_lines: usize,
        max_hits: usize,
    ) -> io::Result<Vec<SearchHit>> {
        let limits = Limits {
            start: 0,
            context: context_lines,
            max_hits,
            text_budget: usize::MAX,
            count_cap: max_hits.clamp(1, MAX_HITS) as u64,
        };
        Ok(scan(path, len, re, &limits)?.hits)
    }

    #[test]
    fn finds_lines_with_context_and_offsets() {
        let data = b"alpha\nbeta\nERROR one\ngamma\ndelta\nERROR two\n";
        let (_dir, p) = scratch_file("jobs-search-ctx", data);
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
        let (_dir, p) = scratch_file("jobs-search-max", data);
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
        let (_dir, p) = scratch_file("jobs-search-long", &data);
        let hits = search_file(&p, data.len() as u64, &compile("needle").unwrap(), 0, 10).unwrap();
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].line, 1);
        assert_eq!(hits[0].offset, MAX_LINE as u64);
        assert!(hits[0].text.starts_with('…') && hits[0].text.ends_with("needle"));
    }

    #[test]
    fn a_line_of_many_pieces_is_one_line() {
        let mut data = b"before\n".to_vec();
        data.extend(b"ab".repeat(3 * MAX_LINE));
        data.extend_from_slice(b"\nafter ab\n");
        let (_dir, p) = scratch_file("jobs-search-one-long", &data);
        let limits = Limits {
            start: 0,
            context: 1,
            max_hits: 100,
            text_budget: 20_000,
            count_cap: 1_000_000,
        };
        let f = scan(&p, data.len() as u64, &compile("ab").unwrap(), &limits).unwrap();
        assert_eq!(f.matches, 2);
        assert_eq!(
            f.hits.iter().map(|h| h.line).collect::<Vec<_>>(),
            vec![2, 3]
        );
        assert_eq!(f.hits[0].before, vec!["before".to_string()]);
        assert_eq!(f.hits[0].after, vec!["after ab".to_string()]);
        assert!(f.hits[1].before[0].starts_with("abab") && f.hits[1].before[0].ends_with('…'));
        assert!(f.hits[0].text.len() < SHOWN_LINE + 10);
        // A match only in a later piece of the line.
        let mut data = vec![b'x'; 2 * MAX_LINE + 5];
        data.extend_from_slice(b"needle\n");
        let (_dir, p) = scratch_file("jobs-search-late", &data);
        let f = scan(&p, data.len() as u64, &compile("needle").unwrap(), &limits).unwrap();
        assert_eq!((f.matches, f.hits[0].line), (1, 1));
        assert!(f.hits[0].text.starts_with('…'));
    }

    #[test]
    fn counts_every_match_and_continues_from_the_cursor() {
        let data: Vec<u8> = (1..=1000)
            .flat_map(|i| format!("{i}\n").into_bytes())
            .collect();
        let (_dir, p) = scratch_file("jobs-search-cursor", &data);
        let re = compile("7").unwrap();
        let expected: Vec<u64> = (1..=1000u64)
            .filter(|i| i.to_string().contains('7'))
            .collect();
        let mut limits = Limits {
            start: 0,
            context: 1,
            max_hits: 50,
            text_budget: 20_000,
            count_cap: 1_000_000,
        };
        let mut seen = Vec::new();
        let mut first = true;
        loop {
            let f = scan(&p, data.len() as u64, &re, &limits).unwrap();
            if first {
                assert_eq!(f.matches, expected.len() as u64);
                assert!(!f.at_least);
                first = false;
            }
            for h in &f.hits {
                assert_eq!(
                    h.line.to_string().as_bytes(),
                    &data[h.offset as usize..][..h.line.to_string().len()]
                );
            }
            seen.extend(f.hits.iter().map(|h| h.line));
            match f.next_offset {
                Some(o) => limits.start = o,
                None => break,
            }
        }
        assert_eq!(seen, expected);
        // A small budget still shows one hit and says where to go on.
        limits.start = 0;
        limits.text_budget = 1;
        let f = scan(&p, data.len() as u64, &re, &limits).unwrap();
        assert_eq!(f.hits.len(), 1);
        assert!(f.next_offset.is_some());
        // A count cap makes the count a lower bound.
        limits.count_cap = 10;
        let f = scan(&p, data.len() as u64, &re, &limits).unwrap();
        assert!(f.at_least && f.matches == 10);
    }

    #[test]
    fn bad_pattern_is_a_clear_error() {
        let err = compile("(unclosed").unwrap_err();
        assert!(err.contains("escape"), "{err}");
        assert!(compile("").is_err());
    }
}
