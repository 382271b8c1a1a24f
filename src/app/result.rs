//! A job's third stream, `result`: its structured result (a cell's value, traceback and
//! display items; an install's or script's report) laid out as text with stable byte
//! offsets. An answer that cuts one of these parts says which byte range of this stream
//! holds the whole of it, so nothing an answer leaves out is lost. Images are not text:
//! they are numbered (1-based, in display order) and fetched one at a time.

use serde_json::Value;

use crate::jobs::JobKind;

/// A result as text, and where each part starts in it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ResultLayout {
    /// The whole `result` stream.
    pub text: String,
    /// Byte offset of the value's repr, if the cell had a value.
    pub value: Option<u64>,
    /// Byte offset of the traceback, if the cell raised.
    pub traceback: Option<u64>,
    /// Byte offset of the data of each display item, in display order (images
    /// included: their line names the index to fetch them by).
    pub display: Vec<u64>,
    /// Byte offset of each display item's section (its `--- display N mime ---` line).
    pub display_start: Vec<u64>,
}

/// An image of a cell's result, by its 1-based index among the cell's images.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultImage {
    pub index: usize,
    /// How many images the cell produced.
    pub of: usize,
    pub mime: String,
    /// Base64 data.
    pub data: String,
    /// Pixel size of `data`, when known.
    pub size: Option<(u32, u32)>,
    /// Set when `data` is a scaled-down copy of the cell's image (see [`super::images`]).
    pub original: Option<super::images::Original>,
}

/// Whether a display item travels as MCP image content (SVG is text).
pub(crate) fn is_image(mime: &str) -> bool {
    mime.starts_with("image/") && mime != "image/svg+xml"
}

fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// The display items of a cell result as (mime, data).
pub(crate) fn display_items(result: &Value) -> impl Iterator<Item = (&str, &str)> {
    result
        .get("display")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|item| Some((str_field(item, "mime")?, str_field(item, "data")?)))
}

/// Lay out a job's result. Python (and shell) results get one section per part; install
/// and script reports are pretty-printed JSON.
pub(crate) fn layout(kind: JobKind, result: &Value) -> ResultLayout {
    let mut out = ResultLayout::default();
    if matches!(kind, JobKind::Install | JobKind::Script) {
        out.text = serde_json::to_string_pretty(result).unwrap_or_default();
        out.text.push('\n');
        return out;
    }
    let section = |out: &mut ResultLayout, header: String, body: &str| -> u64 {
        out.text.push_str(&header);
        out.text.push('\n');
        let at = out.text.len() as u64;
        out.text.push_str(body);
        if !body.is_empty() && !body.ends_with('\n') {
            out.text.push('\n');
        }
        at
    };
    if let Some(v) = str_field(result, "value") {
        out.value = Some(section(&mut out, "--- value ---".into(), v));
    }
    if let Some(tb) = result
        .get("error")
        .filter(|e| !e.is_null())
        .and_then(|e| str_field(e, "traceback"))
    {
        out.traceback = Some(section(&mut out, "--- traceback ---".into(), tb));
    }
    let mut image = 0;
    let items: Vec<(String, String)> = display_items(result)
        .map(|(m, d)| (m.to_string(), d.to_string()))
        .collect();
    for (n, (mime, data)) in items.iter().enumerate() {
        out.display_start.push(out.text.len() as u64);
        let at = if is_image(mime) {
            image += 1;
            section(
                &mut out,
                format!(
                    "--- display {} {mime}: image {image}, fetch it with job_output image={image} ---",
                    n + 1
                ),
                "",
            )
        } else {
            section(&mut out, format!("--- display {} {mime} ---", n + 1), data)
        };
        out.display.push(at);
    }
    out
}

/// Image `index` (1-based) of a cell result.
pub(crate) fn image(result: &Value, index: usize) -> Result<ResultImage, usize> {
    let images: Vec<(&str, &str)> = display_items(result).filter(|(m, _)| is_image(m)).collect();
    let of = images.len();
    match index.checked_sub(1).and_then(|i| images.get(i)) {
        Some((mime, data)) => Ok(ResultImage {
            index,
            of,
            mime: mime.to_string(),
            data: data.to_string(),
            size: None,
            original: None,
        }),
        None => Err(of),
    }
}

/// Bytes `[offset, offset + len)` of `text`, moved to character boundaries (the start
/// back, the end back unless that leaves nothing). Returns the text and the range covered.
pub(crate) fn slice(text: &str, offset: u64, len: u64) -> (String, u64, u64) {
    let total = text.len();
    let mut start = (offset as usize).min(total);
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = start.saturating_add(len as usize).min(total);
    let mut back = end;
    while !text.is_char_boundary(back) {
        back -= 1;
    }
    if back > start {
        end = back;
    } else {
        while !text.is_char_boundary(end) {
            end += 1;
        }
    }
    (text[start..end].to_string(), start as u64, end as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parts_are_found_at_their_offsets() {
        let r = json!({
            "value": "42",
            "error": {"ename": "E", "evalue": "v", "traceback": "Traceback\nE: v"},
            "display": [
                {"mime": "text/html", "data": "<b>x</b>"},
                {"mime": "image/png", "data": "AAAA"},
                {"mime": "image/png", "data": "BBBB"},
            ],
        });
        let l = layout(JobKind::Python, &r);
        let at = |o: Option<u64>| &l.text[o.unwrap() as usize..];
        assert!(at(l.value).starts_with("42\n--- traceback"));
        assert!(at(l.traceback).starts_with("Traceback\nE: v\n"));
        assert!(at(Some(l.display[0])).starts_with("<b>x</b>\n"));
        assert!(at(Some(l.display_start[1])).starts_with("--- display 2 image/png: image 1"));
        assert!(l.text.contains("image 2, fetch it with job_output image=2"));
        assert!(!l.text.contains("BBBB"), "image data is not text");
        assert_eq!(image(&r, 2).unwrap().data, "BBBB");
        assert_eq!(image(&r, 2).unwrap().of, 2);
        assert_eq!(image(&r, 3), Err(2));
        assert_eq!(image(&r, 0), Err(2));
    }

    #[test]
    fn reports_are_pretty_json() {
        let l = layout(JobKind::Install, &json!({"ok": true}));
        assert_eq!(l.text, "{\n  \"ok\": true\n}\n");
    }

    #[test]
    fn slices_keep_characters_whole() {
        let t = "a€b";
        assert_eq!(slice(t, 0, 2), ("a".into(), 0, 1));
        assert_eq!(slice(t, 2, 1), ("€".into(), 1, 4));
        assert_eq!(slice(t, 0, 100), ("a€b".into(), 0, 5));
        assert_eq!(slice(t, 99, 10), (String::new(), 5, 5));
    }
}
