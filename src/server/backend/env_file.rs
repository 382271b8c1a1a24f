//! `shell_run`'s `env_file`, read by the server itself (outside the sandbox), so confined
//! to the workspace: opened beneath it with `openat2(RESOLVE_BENEATH)` (no `..` or symlink
//! out, no magic links), regular files only, size-capped. Anything else is refused without
//! a word of the file's content.

use std::io::Read;
use std::os::fd::AsFd;
use std::path::Path;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::Mode;

use crate::jobs::dotenv;
use crate::server::tools::ToolError;

/// Largest env file accepted.
const MAX_BYTES: u64 = 1 << 20;

/// The `KEY=VALUE` pairs of `file` (absolute inside `workspace`, or relative to it).
pub fn load(workspace: &Path, file: &str) -> Result<Vec<(String, String)>, ToolError> {
    let refuse = |why: &str| {
        ToolError(format!(
            "env_file {file} {why}; give a regular file inside the workspace {}",
            workspace.display()
        ))
    };
    let path = Path::new(file);
    let rel = if path.is_absolute() {
        path.strip_prefix(workspace)
            .map_err(|_| refuse("is outside the workspace"))?
    } else {
        path
    };
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let dir =
        std::fs::File::open(workspace).map_err(|e| refuse(&format!("cannot be opened ({e})")))?;
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK | OFlag::O_NOCTTY)
        .mode(Mode::empty())
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let fd = openat2(dir.as_fd(), rel, how).map_err(|e| {
        refuse(&format!(
            "cannot be opened beneath the workspace ({})",
            std::io::Error::from(e)
        ))
    })?;
    let mut f = std::fs::File::from(fd);
    let meta = f
        .metadata()
        .map_err(|e| refuse(&format!("cannot be examined ({e})")))?;
    if !meta.is_file() {
        return Err(refuse("is not a regular file"));
    }
    let mut bytes = Vec::new();
    (&mut f)
        .take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| refuse(&format!("cannot be read ({e})")))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(refuse("is larger than 1 MiB"));
    }
    let text = String::from_utf8(bytes).map_err(|_| refuse("is not valid UTF-8"))?;
    dotenv::parse(&text, file).map_err(|e| ToolError(e.to_string()))
}
