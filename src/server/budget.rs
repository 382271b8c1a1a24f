//! The one answer budget: how the bytes of a single answer are shared between its parts
//! (output streams, value, traceback, display items), and how a part over its share is cut
//! to a head and a tail with a marker that says exactly what was left out and where the
//! whole of it is. Pure functions; [`super::report`] applies them at the edge.

/// Most images one answer carries; the rest are fetched by index with `job_output`.
pub(crate) const MAX_IMAGES: usize = 4;
/// Most base64 bytes of images one answer carries.
pub(crate) const IMAGE_BYTES: usize = 1_000_000;
/// Bytes kept free for the marker of a cut part.
const MARKER: usize = 160;

/// Share `avail` bytes between parts that want `needs` bytes: a part that wants less
/// than an equal share gets what it wants, and what it leaves goes to the others.
pub(crate) fn share(avail: usize, needs: &[usize]) -> Vec<usize> {
    let mut grant = vec![0; needs.len()];
    let mut order: Vec<usize> = (0..needs.len()).collect();
    order.sort_by_key(|&i| needs[i]);
    let mut left = avail;
    for (k, &i) in order.iter().enumerate() {
        let fair = left / (needs.len() - k);
        grant[i] = needs[i].min(fair);
        left -= grant[i];
    }
    grant
}

/// The largest index `<= i` on a character boundary.
fn floor_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The smallest index `>= i` on a character boundary.
fn ceil_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// Where the left-out part of a cut text can be read in full.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Whole {
    /// At this byte offset of the job's `result` stream.
    ResultAt(u64),
    /// In words (e.g. "the whole message ends the traceback").
    Elsewhere(&'static str),
}

/// `s` if it fits in `budget` bytes, else its head and tail around a marker naming the
/// bytes left out and where to read them. The result is at most `budget` bytes (or the
/// marker alone when the budget is smaller than a marker).
pub(crate) fn cut(s: &str, budget: usize, whole: Whole) -> String {
    if s.len() <= budget {
        return s.to_string();
    }
    let keep = budget.saturating_sub(MARKER);
    // Head: half, ending after a newline in its last quarter if there is one.
    let mut head = floor_boundary(s, keep / 2);
    let from = floor_boundary(s, head - head / 4);
    if let Some(nl) = s[from..head].rfind('\n') {
        head = from + nl + 1;
    }
    // Tail: the rest, starting after a newline in its first quarter if there is one.
    let mut tail = ceil_boundary(s, s.len() - (keep - head));
    let quarter = ceil_boundary(s, tail + (s.len() - tail) / 4);
    if let Some(nl) = s[tail..quarter].find('\n') {
        tail += nl + 1;
    }
    let gone = tail - head;
    let marker = match whole {
        Whole::ResultAt(base) => format!(
            "\n… {gone} bytes left out [{}..{}) of stream \"result\": read them with job_output stream=\"result\" offset={} …\n",
            base + head as u64,
            base + tail as u64,
            base + head as u64
        ),
        Whole::Elsewhere(words) => format!("\n… {gone} bytes left out; {words} …\n"),
    };
    let mut out = String::with_capacity(head + marker.len() + s.len() - tail);
    out.push_str(&s[..head]);
    out.push_str(&marker);
    out.push_str(&s[tail..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_parts_get_what_they_need_and_big_ones_share_the_rest() {
        assert_eq!(share(100, &[10, 500, 500]), vec![10, 45, 45]);
        assert_eq!(share(100, &[10, 20]), vec![10, 20]);
        assert_eq!(share(100, &[]), Vec::<usize>::new());
        assert_eq!(share(0, &[5, 5]), vec![0, 0]);
        let g = share(20_000, &[120_000, 30, 200_000, 7]);
        assert_eq!(g[1], 30);
        assert_eq!(g[3], 7);
        assert!(g.iter().sum::<usize>() <= 20_000);
    }

    #[test]
    fn a_cut_names_the_exact_range_left_out() {
        let s: String = (0..2000).map(|i| format!("line {i:04}\n")).collect();
        let c = cut(&s, 1000, Whole::ResultAt(50));
        assert!(c.len() <= 1000, "{}", c.len());
        let m = c.find('…').unwrap();
        let marker = &c[m..];
        let range = marker.split('[').nth(1).unwrap().split(')').next().unwrap();
        let (a, b) = range.split_once("..").unwrap();
        let (a, b): (usize, usize) = (a.parse().unwrap(), b.parse().unwrap());
        // Head and tail are exactly the text outside [a-50, b-50).
        let head = &c[..c.find("\n… ").unwrap()];
        assert_eq!(head, &s[..a - 50]);
        assert!(c.ends_with(&s[b - 50..]));
        assert!(c.contains(&format!("offset={a}")));
    }

    #[test]
    fn cuts_keep_characters_whole_and_fit() {
        let s = "é".repeat(5000) + "€".repeat(5000).as_str();
        for budget in [0, 10, 200, 201, 999, 4000] {
            let c = cut(&s, budget, Whole::Elsewhere("see the traceback"));
            assert!(c.len() <= budget.max(MARKER), "{budget}: {}", c.len());
        }
        assert_eq!(cut("short", 10, Whole::ResultAt(0)), "short");
    }
}
