//! The interpreter a session runs: the one seam between Python and R sessions.
//!
//! A session's language is chosen when it is created (the server's default, or the
//! `language` of the call that first uses its name) and kept until it is closed. It
//! decides the worker's program, argv, environment and driver ([`super::r`] for R; the
//! Python worker's are in `worker.rs`), what fills the policy's `{python}` placeholder
//! (the interpreter's installation: Python's prefixes, or R_HOME and R's libraries),
//! whether the worker can snapshot cells (Python only: R sessions branch by replay), and
//! how an interrupt reaches the cell.

use serde::{Deserialize, Serialize};

// A session's interpreter (no doc comment: it would be schema text in tools/list, whose
// size is bounded; python_exec's description names it).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    #[default]
    Python,
    R,
}

impl Language {
    /// The worker as messages name it ("the R worker was killed by SIGSEGV ...").
    pub fn worker_words(self) -> &'static str {
        match self {
            Language::Python => "the Python worker",
            Language::R => "the R worker",
        }
    }

    /// `message` (written for a Python worker) about this language's worker.
    pub fn reword(self, message: &str) -> String {
        match self {
            Language::Python => message.to_string(),
            Language::R => message
                .replace("the Python worker", "the R worker")
                .replace("KeyboardInterrupt", "R's interrupt"),
        }
    }

    /// The worker forks a snapshot after each cell (R sessions branch by replay: see
    /// docs/branching.md).
    pub fn snapshots(self) -> bool {
        self == Language::Python
    }

    /// An interrupt is a signal to the worker process ahead of the `interrupt` request:
    /// R's single thread reads no request while a cell runs.
    pub fn interrupt_by_signal(self) -> bool {
        self == Language::R
    }
}

impl std::fmt::Display for Language {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            Language::Python => "python",
            Language::R => "r",
        })
    }
}

impl std::str::FromStr for Language {
    type Err = String;
    fn from_str(s: &str) -> Result<Language, String> {
        match s.to_ascii_lowercase().as_str() {
            "python" | "py" => Ok(Language::Python),
            "r" => Ok(Language::R),
            other => Err(format!("unknown interpreter {other:?}: use python or r")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print() {
        assert_eq!("R".parse::<Language>(), Ok(Language::R));
        assert_eq!("python".parse::<Language>(), Ok(Language::Python));
        assert!(
            "julia"
                .parse::<Language>()
                .unwrap_err()
                .contains("python or r")
        );
        assert_eq!(Language::R.to_string(), "r");
        assert_eq!(
            Language::R.reword("the Python worker was killed by SIGSEGV"),
            "the R worker was killed by SIGSEGV"
        );
        assert_eq!(
            Language::Python.reword("the Python worker"),
            "the Python worker"
        );
    }
}
