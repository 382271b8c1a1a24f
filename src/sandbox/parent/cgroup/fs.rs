//! Where job cgroups go and the file-system steps every cgroup operation shares.

use std::io::ErrorKind;
use std::path::Path;

use crate::sandbox::launcher::cgroup::CgroupError;

/// Directory created under the server's own cgroup to hold job cgroups.
pub(crate) const PARENT_DIR: &str = "mcp-sandbox-repl";
/// v2 only: the leaf the server moves itself into.
pub(crate) const SERVER_LEAF: &str = "mcp-sandbox-repl.server";

pub(super) fn io<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

pub(super) fn mkdir_ok_exists(dir: &Path) -> Result<(), CgroupError> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(CgroupError::Io {
            action: "create",
            path: dir.to_path_buf(),
            source: e,
        }),
    }
}
