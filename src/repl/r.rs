//! R sessions: finding R (`Rscript` on PATH, probed once per server for R_HOME, its
//! libraries and jsonlite) and how an R worker is started. The worker itself is
//! `R/sandbox_repl_worker.R`, speaking the same protocol as the Python worker
//! (docs/worker-protocol.md, "The R worker").

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::ReplError;
use super::python::PythonInfo;
use crate::sandbox::SandboxCommand;

/// The R worker, embedded so the binary is self-contained.
pub(crate) const WORKER_SOURCE: &str = include_str!("../../R/sandbox_repl_worker.R");

/// The line that ends the worker's source on the request pipe.
const END_MARK: &str = "#<end of the sandbox-repl R worker>";

/// Reads the worker from the request pipe (fd 3, reopened through /proc) up to
/// [`END_MARK`], evaluates it to a function and calls it with that connection, its own
/// code under suspended interrupts (user code allows them).
const BOOTSTRAP: &str = "local({con <- file('/proc/self/fd/3', open = 'r', encoding = 'UTF-8', raw = TRUE); \
src <- character(); repeat { l <- readLines(con, 1L, warn = FALSE); \
if (!length(l)) { cat('sandbox-repl: the R worker did not arrive\\n', file = stderr()); quit('no', 70L) }; \
if (l == '#<end of the sandbox-repl R worker>') break; src[length(src) + 1L] <- l }; \
f <- eval(parse(text = src, keep.source = FALSE), baseenv()); suspendInterrupts(f(con))})";

/// The session library (`R_LIBS_USER`) of the R session whose private temp directory is
/// `tmp` (`<state>/repl/<session>/tmp-<id>`): `<state>/repl/<session>/R-library`, beside
/// it — not in it, since a session's `{tmp}` may be a tmpfs of its own view that an
/// install job cannot write. It is the session policy's `{venv}` (read, as a Python
/// session's venv), written only by the install job (`envs::r_install`), and outlives
/// restarts of the session.
pub fn session_library(tmp: &Path) -> PathBuf {
    tmp.parent().unwrap_or(tmp).join("R-library")
}

/// Set up `cmd` (whose program is `Rscript`) to run the R worker; returns the bytes to
/// send down the request pipe ahead of the first request.
pub(crate) fn prepare(cmd: &mut SandboxCommand, tmp: &Path) -> Vec<u8> {
    cmd.arg("--no-init-file")
        .arg("-e")
        .arg(BOOTSTRAP)
        .env("R_LIBS_USER", session_library(tmp))
        .env("R_HISTFILE", "/dev/null");
    let mut driver = WORKER_SOURCE.as_bytes().to_vec();
    if !WORKER_SOURCE.trim_end().ends_with(END_MARK) {
        driver.extend_from_slice(format!("\n{END_MARK}\n").as_bytes());
    }
    driver
}

/// Prints R_HOME, the version, whether jsonlite loads and the library paths, a line each.
const PROBE: &str = "cat(R.home(), paste(R.version$major, R.version$minor, sep = '.'), \
requireNamespace('jsonlite', quietly = TRUE), .libPaths(), sep = '\\n')";

/// Find `Rscript` on PATH and ask it for R_HOME, its version and library paths (once per
/// server). The answer is a [`PythonInfo`] whose prefixes are R's own paths: the policy's
/// `{python}` placeholder (the session interpreter's installation) for an R session.
pub(super) async fn discover_r() -> Result<PythonInfo, ReplError> {
    let rscript = which::which("Rscript").map_err(|e| ReplError::RNotFound {
        detail: format!("no Rscript on PATH ({e})"),
    })?;
    let fail = |detail: String| ReplError::RNotFound {
        detail: format!("{} does not work: {detail}", rscript.display()),
    };
    let run = tokio::process::Command::new(&rscript)
        .args(["--vanilla", "-e", PROBE])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .map_err(|_| fail("it did not answer within 60 s".into()))?
        .map_err(|e| fail(e.to_string()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(fail(format!("{} ({})", out.status, err.trim())));
    }
    parse_probe(&rscript, &String::from_utf8_lossy(&out.stdout)).map_err(fail)
}

/// [`discover_r`] for a caller without a runtime (`doctor`).
pub fn discover_r_blocking() -> Result<PythonInfo, ReplError> {
    let rscript = which::which("Rscript").map_err(|e| ReplError::RNotFound {
        detail: format!("no Rscript on PATH ({e})"),
    })?;
    let fail = |detail: String| ReplError::RNotFound {
        detail: format!("{} does not work: {detail}", rscript.display()),
    };
    let out = std::process::Command::new(&rscript)
        .args(["--vanilla", "-e", PROBE])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| fail(e.to_string()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(fail(format!("{} ({})", out.status, err.trim())));
    }
    parse_probe(&rscript, &String::from_utf8_lossy(&out.stdout)).map_err(fail)
}

fn parse_probe(rscript: &Path, text: &str) -> Result<PythonInfo, String> {
    let mut lines = text.lines();
    let (Some(home), Some(version), Some(jsonlite)) = (lines.next(), lines.next(), lines.next())
    else {
        return Err(format!("unexpected answer {text:?}"));
    };
    if jsonlite != "TRUE" {
        return Err(
            "its jsonlite package is missing (the R worker speaks JSON through it); install it \
             (Debian: apt-get install r-cran-jsonlite)"
                .into(),
        );
    }
    // Only directories that exist: each becomes a policy path.
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for p in std::iter::once(home).chain(lines) {
        let p = PathBuf::from(p);
        if p.is_dir() && !prefixes.contains(&p) {
            prefixes.push(p);
        }
    }
    Ok(PythonInfo {
        executable: rscript.to_path_buf(),
        version: format!("R {version}"),
        prefixes,
        venv: None,
        worker_code: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_answer_is_read() {
        let info = parse_probe(
            Path::new("/usr/bin/Rscript"),
            "/usr\n4.2.2\nTRUE\n/nonexistent-lib\n/usr\n",
        )
        .unwrap();
        assert_eq!(info.version, "R 4.2.2");
        assert_eq!(info.prefixes, vec![PathBuf::from("/usr")]);
        let no_json =
            parse_probe(Path::new("/usr/bin/Rscript"), "/usr\n4.2.2\nFALSE\n").unwrap_err();
        assert!(no_json.contains("r-cran-jsonlite"), "{no_json}");
        assert!(parse_probe(Path::new("x"), "").is_err());
    }

    #[test]
    fn the_worker_source_ends_with_the_mark() {
        assert!(WORKER_SOURCE.trim_end().ends_with(END_MARK));
        assert!(BOOTSTRAP.contains(END_MARK));
    }
}
