//! The recorded answers of Istio's own binaries (`tests/data/istio-diff/<suite>/`), for the
//! differential tests that compare ours with them without Go.

use std::path::PathBuf;

/// The folder of `suite`, checked to hold `files`; a missing file fails the test with where the
/// recording comes from (its README).
pub fn data_dir(suite: &str, files: &[&str]) -> PathBuf {
    let dir = crate::repo_root().join("tests/data/istio-diff").join(suite);
    for f in files {
        assert!(
            dir.join(f).is_file(),
            "{} is missing: the recorded Istio answers belong in the repository (see {}/README.md)",
            dir.join(f).display(),
            dir.display()
        );
    }
    dir
}
