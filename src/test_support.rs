//! Unit tests' shared helpers. Owns each test's scratch folder; must never be built outside tests.

use std::path::PathBuf;

/// This test's own scratch folder: made on its first use in the test's thread (libtest runs each
/// test on a thread of its own), removed when that thread ends. No other test writes or removes
/// it, so tests running at once cannot race on a folder.
pub fn test_dir() -> PathBuf {
    thread_local! {
        static DIR: tempfile::TempDir = tempfile::Builder::new()
            .prefix("kvbust-unit-")
            .tempdir()
            .unwrap();
    }
    DIR.with(|d| d.path().to_path_buf())
}
