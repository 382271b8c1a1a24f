//! The session-name rule, in one place: a leaf module (it imports nothing from the
//! crate) that repl, envs, app and the server's argument checks all use.

/// The session a tool uses when the caller names none.
pub const DEFAULT_SESSION: &str = "default";

/// Whether `name` can name a session: it becomes a directory name under the state dir
/// (and a venv directory), so 1–64 of `[A-Za-z0-9._-]`, and not `.` or `..`.
pub fn is_valid_session_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_names_are_checked() {
        for good in ["default", "a-b_c.1", "...", ".x", &"n".repeat(64)] {
            assert!(is_valid_session_name(good), "{good:?} refused");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "../x",
            "x y",
            "é",
            "a\0b",
            &"n".repeat(65),
        ] {
            assert!(!is_valid_session_name(bad), "{bad:?} accepted");
        }
    }
}
