//! Helpers shared by the integration tests: fixture paths, copies of fixture
//! folders in a temporary directory, and byte snapshots of a folder.

// Each test binary uses a subset of these helpers.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

/// The committed fixture at `relative` (under `tests/fixtures`).
pub(crate) fn fixture(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(relative)
}

/// Copies a directory tree.
pub(crate) fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A fixture folder copied to `<tempdir>/registry`, so that tests may write
/// into it; keep the `TempDir` alive as long as the copy is used.
pub(crate) fn copy_fixture(relative: &str) -> (TempDir, PathBuf) {
    let source = fixture(relative);
    assert!(source.is_dir(), "no fixture folder {}", source.display());
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("registry");
    copy_dir(&source, &dir);
    (temp, dir)
}

/// Relative path → bytes of every file under `dir`.
pub(crate) fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let relative = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                out.insert(relative, fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// The text of `<dir>/<relative>`.
pub(crate) fn read(dir: &Path, relative: &str) -> String {
    fs::read_to_string(dir.join(relative)).unwrap()
}

/// A copy of any folder at `<tempdir>/registry`.
pub(crate) fn copy_fixture_dir(source: &Path) -> (TempDir, PathBuf) {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("registry");
    copy_dir(source, &dir);
    (temp, dir)
}
