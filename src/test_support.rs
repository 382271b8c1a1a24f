//! Helpers shared by the unit tests (compiled for `cargo test` only): scratch
//! directories that are removed when dropped, also when the test fails.

use std::path::{Path, PathBuf};

/// A fresh, empty directory `<tag>-XXXXXX` under the system temp dir, by its canonical
/// path (so that it compares equal to what a canonicalizing callee returns); removed with
/// everything in it when the guard drops — at the end of the test, or while a failed
/// test unwinds.
pub(crate) fn scratch_dir(tag: &str) -> tempfile::TempDir {
    scratch_dir_in(&std::env::temp_dir(), tag)
}

/// [`scratch_dir`] under `base` (for a test whose directory must be in a given place,
/// e.g. outside /tmp, which a mount view replaces).
pub(crate) fn scratch_dir_in(base: &Path, tag: &str) -> tempfile::TempDir {
    let base = base.canonicalize().unwrap();
    tempfile::Builder::new()
        .prefix(&format!("{tag}-"))
        .tempdir_in(base)
        .unwrap()
}

/// A path `name` not made yet in a scratch directory (for code that must create it
/// itself): the guard, then the path.
pub(crate) fn scratch_path(tag: &str, name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = scratch_dir(tag);
    let path = dir.path().join(name);
    (dir, path)
}

/// A scratch directory holding one file, `data` in it: the guard, then the file's path.
pub(crate) fn scratch_file(tag: &str, data: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let (dir, path) = scratch_path(tag, "file");
    std::fs::write(&path, data).unwrap();
    (dir, path)
}

#[test]
fn a_scratch_dir_is_canonical_and_gone_after_drop() {
    let dir = scratch_dir("test-support");
    let path = dir.path().to_path_buf();
    std::fs::create_dir_all(path.join("a/b")).unwrap();
    std::fs::write(path.join("a/b/f"), "x").unwrap();
    assert_eq!(path.canonicalize().unwrap(), path);
    assert!(
        path.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("test-support-")
    );
    drop(dir);
    assert!(!path.exists());
}

#[test]
fn a_scratch_dir_is_removed_when_its_test_panics() {
    let (tx, rx) = std::sync::mpsc::channel();
    let joined = std::thread::spawn(move || {
        let dir = scratch_dir_in(Path::new("/var/tmp"), "test-support-panic");
        tx.send(dir.path().to_path_buf()).unwrap();
        panic!("a failing test");
    })
    .join();
    assert!(joined.is_err());
    let path = rx.recv().unwrap();
    assert!(path.starts_with("/var/tmp"));
    assert!(!path.exists(), "{} left behind", path.display());
}
