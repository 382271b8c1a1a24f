//! Excerpts: the text of a byte range of a spool, shortened to a head and a tail with
//! exact byte offsets when it is over budget. Text is decoded as UTF-8 with invalid
//! bytes replaced; cuts never split a multibyte character and prefer line ends.

use std::io;
use std::path::Path;

use super::Excerpt;
use super::spool::read_range;

/// How many trailing bytes of `buf` are the start of a UTF-8 character whose
/// remaining bytes are not there yet (0 if the buffer ends on a character boundary,
/// or ends in bytes that are invalid anyway).
pub(crate) fn incomplete_suffix_len(buf: &[u8]) -> usize {
    for back in 1..=buf.len().min(3) {
        let b = buf[buf.len() - back];
        if b & 0xC0 == 0x80 {
            continue; // continuation byte: keep looking for the lead byte
        }
        let need = match b {
            0x00..=0x7F => 1,
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return 0,
        };
        return if need > back { back } else { 0 };
    }
    0
}

/// Number of leading continuation bytes (a character cut at its start), at most 3.
fn leading_continuations(buf: &[u8]) -> usize {
    buf.iter().take(3).take_while(|b| *b & 0xC0 == 0x80).count()
}

/// Where to end a head taken from `bytes`: not inside a character, and just after a
/// newline if there is one in the last quarter.
fn head_cut(bytes: &[u8]) -> usize {
    let cut = bytes.len() - incomplete_suffix_len(bytes);
    let window_start = cut - cut / 4;
    match bytes[window_start..cut].iter().rposition(|&b| b == b'\n') {
        Some(pos) => window_start + pos + 1,
        None => cut,
    }
}

/// Where to start a tail taken from `bytes`: not inside a character, and just after
/// a newline if there is one in the first quarter.
fn tail_start(bytes: &[u8]) -> usize {
    let skip = leading_continuations(bytes);
    let window_end = (skip + bytes.len() / 4).min(bytes.len());
    match bytes[skip..window_end].iter().position(|&b| b == b'\n') {
        Some(pos) if skip + pos + 1 < bytes.len() => skip + pos + 1,
        _ => skip,
    }
}

/// How `budget` bytes are shared between two streams that want `a` and `b` bytes:
/// each gets up to half, and what one does not need goes to the other.
pub(crate) fn split_budget(budget: usize, a: u64, b: u64) -> (usize, usize) {
    let (a_us, b_us) = (a.min(budget as u64) as usize, b.min(budget as u64) as usize);
    if a_us + b_us <= budget {
        return (a_us, b_us);
    }
    let half = budget / 2;
    if a_us < half {
        (a_us, budget - a_us)
    } else if b_us < half {
        (budget - b_us, b_us)
    } else {
        (half, budget - half)
    }
}

/// Excerpt of bytes `[offset, end)` of the spool at `path`, at most about `budget`
/// bytes of text: all of it if it fits, else a head and a tail of about half each.
pub(crate) fn make_excerpt(
    path: &Path,
    offset: u64,
    end: u64,
    budget: usize,
) -> io::Result<Excerpt> {
    let size = end.saturating_sub(offset);
    if size == 0 {
        return Ok(Excerpt {
            offset,
            end: offset,
            ..Excerpt::default()
        });
    }
    if size <= budget as u64 {
        let bytes = read_range(path, offset, size)?;
        let end = offset + bytes.len() as u64;
        return Ok(Excerpt {
            offset,
            end,
            head: lossy(bytes),
            tail: None,
            omitted: None,
        });
    }
    let head_budget = (budget / 2) as u64;
    let tail_budget = budget as u64 - head_budget;
    let head_bytes = read_range(path, offset, head_budget)?;
    let cut = head_cut(&head_bytes);
    let tail_from = end - tail_budget;
    let tail_bytes = read_range(path, tail_from, tail_budget)?;
    let start = tail_start(&tail_bytes);
    let omitted_from = offset + cut as u64;
    let omitted_to = tail_from + start as u64;
    Ok(Excerpt {
        offset,
        end: tail_from + tail_bytes.len() as u64,
        head: lossy(head_bytes[..cut].to_vec()),
        tail: Some(lossy(tail_bytes[start..].to_vec())),
        omitted: Some([omitted_from, omitted_to]),
    })
}

/// Bytes `[offset, offset + len)` of a spool holding `total` bytes, for a read: the
/// end is moved back so it does not split a character (unless that leaves nothing).
/// Returns the text and the end offset actually covered, and whether the text is the
/// base64 of the bytes: bytes that are not UTF-8 (binary output) are returned exactly,
/// `len * 3 / 4` of them so that the encoding fits the same budget.
pub(crate) fn read_text(
    path: &Path,
    offset: u64,
    len: u64,
    total: u64,
) -> io::Result<(String, u64, bool)> {
    let budget = len;
    let len = len.min(total.saturating_sub(offset));
    let mut bytes = read_range(path, offset, len)?;
    let mut end = offset + bytes.len() as u64;
    if end < total {
        let back = incomplete_suffix_len(&bytes);
        if back < bytes.len() {
            bytes.truncate(bytes.len() - back);
            end -= back as u64;
        }
    }
    match String::from_utf8(bytes) {
        Ok(text) => Ok((text, end, false)),
        Err(e) => {
            let mut bytes = e.into_bytes();
            bytes.truncate((budget as usize * 3 / 4).max(1));
            let end = offset + bytes.len() as u64;
            Ok((
                base64::engine::Engine::encode(&base64::engine::general_purpose::STANDARD, &bytes),
                end,
                true,
            ))
        }
    }
}

/// UTF-8 with invalid bytes replaced by U+FFFD, reusing the buffer when it is valid.
pub(crate) fn lossy(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::scratch_file;

    #[test]
    fn incomplete_suffixes() {
        let e = "€".as_bytes();
        assert_eq!(incomplete_suffix_len(b"abc"), 0);
        assert_eq!(incomplete_suffix_len(&e[..1]), 1);
        assert_eq!(incomplete_suffix_len(&e[..2]), 2);
        assert_eq!(incomplete_suffix_len(e), 0);
        assert_eq!(incomplete_suffix_len(&[b'a', 0xF0, 0x9F, 0x98]), 3);
        assert_eq!(incomplete_suffix_len(&[0xFF]), 0);
        assert_eq!(incomplete_suffix_len(b""), 0);
    }

    #[test]
    fn small_range_is_whole() {
        let (_dir, p) = scratch_file("jobs-excerpt-small", b"hello\nworld\n");
        let ex = make_excerpt(&p, 6, 12, 100).unwrap();
        assert_eq!(
            ex,
            Excerpt {
                offset: 6,
                end: 12,
                head: "world\n".into(),
                tail: None,
                omitted: None
            }
        );
    }

    #[test]
    fn large_range_has_head_tail_and_exact_omitted_range() {
        let data: Vec<u8> = (0..1000)
            .flat_map(|i| format!("line {i:04}\n").into_bytes())
            .collect();
        let (_dir, p) = scratch_file("jobs-excerpt-large", &data);
        let ex = make_excerpt(&p, 0, data.len() as u64, 200).unwrap();
        let [a, b] = ex.omitted.unwrap();
        // Head and tail are exactly the bytes outside the omitted range.
        assert_eq!(ex.head.as_bytes(), &data[..a as usize]);
        assert_eq!(ex.tail.as_deref().unwrap().as_bytes(), &data[b as usize..]);
        assert_eq!(ex.end, data.len() as u64);
        // Cuts fall on line ends.
        assert!(ex.head.ends_with('\n'));
        assert!(ex.tail.as_deref().unwrap().starts_with("line "));
        assert!(ex.head.len() + ex.tail.as_deref().unwrap().len() <= 200);
    }

    #[test]
    fn cuts_never_split_a_character() {
        let data = "é".repeat(500); // 1000 bytes, no newlines
        let (_dir, p) = scratch_file("jobs-excerpt-utf8", data.as_bytes());
        for budget in [7, 8, 9, 50, 101] {
            let ex = make_excerpt(&p, 1, 1000, budget).unwrap();
            let [a, b] = ex.omitted.unwrap();
            // offset 1 is mid-character: that one byte shows as a replacement char.
            assert!(ex.head.starts_with('\u{FFFD}'), "{budget}: {:?}", ex.head);
            assert!(!ex.head[3..].contains('\u{FFFD}'));
            assert!(!ex.tail.as_deref().unwrap().contains('\u{FFFD}'));
            assert_eq!(a % 2, 0, "head ends on a boundary");
            assert_eq!(b % 2, 0, "tail starts on a boundary");
        }
    }

    #[test]
    fn invalid_bytes_are_replaced() {
        let (_dir, p) = scratch_file("jobs-excerpt-bad", b"ok\xff\xfeok");
        let ex = make_excerpt(&p, 0, 6, 100).unwrap();
        assert_eq!(ex.head, "ok\u{FFFD}\u{FFFD}ok");
    }

    #[test]
    fn budget_split_gives_unused_share_to_other_stream() {
        assert_eq!(split_budget(100, 10, 20), (10, 20));
        assert_eq!(split_budget(100, 10, 500), (10, 90));
        assert_eq!(split_budget(100, 500, 10), (90, 10));
        assert_eq!(split_budget(100, 500, 500), (50, 50));
        assert_eq!(split_budget(100, 0, 0), (0, 0));
    }

    #[test]
    fn read_text_does_not_split_characters() {
        let (_dir, p) = scratch_file("jobs-excerpt-read", "a€b".as_bytes());
        assert_eq!(read_text(&p, 0, 2, 5).unwrap(), ("a".to_string(), 1, false));
        assert_eq!(read_text(&p, 1, 3, 5).unwrap(), ("€".to_string(), 4, false));
        assert_eq!(
            read_text(&p, 0, 100, 5).unwrap(),
            ("a€b".to_string(), 5, false)
        );
        assert_eq!(read_text(&p, 5, 10, 5).unwrap(), (String::new(), 5, false));
    }

    #[test]
    fn bytes_that_are_not_text_are_read_exactly_in_base64() {
        let (_dir, p) = scratch_file("jobs-excerpt-bin", &[0x61, 0xff, 0x00, 0x80, 0x62, 0x63]);
        // 8 bytes of budget: 6 raw bytes fit (8 * 3 / 4), all of them here.
        assert_eq!(
            read_text(&p, 0, 8, 6).unwrap(),
            ("Yf8AgGJj".to_string(), 6, true)
        );
        // 4 bytes of budget: 3 raw bytes, exactly, even if they split nothing.
        assert_eq!(
            read_text(&p, 1, 4, 6).unwrap(),
            ("/wCA".to_string(), 4, true)
        );
    }
}
