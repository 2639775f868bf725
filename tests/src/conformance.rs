// The one loader of Istio's conformance data (`../shared/conformance/<folder>` beside the
// checkout). Every crate's tests use this file: the harness as its module `conformance`, the
// other crates (which the harness depends on, so they cannot depend on it) through
// `include!(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/src/conformance.rs"))`; hence plain
// comments here, no inner doc.
//
// Absent data skips the test with a message saying where it was looked for; under `CI=true`
// it fails the test instead.

use std::path::{Path, PathBuf};

/// `../shared/conformance/<folder>` (`folder` may name a subfolder, `istio-iptables/builder`),
/// found from the crate whose tests ask (`manifest_dir`: its `CARGO_MANIFEST_DIR`), when it
/// exists; else `None` after saying so (a failure under `CI=true`).
pub fn dir(manifest_dir: &str, folder: &str) -> Option<PathBuf> {
    let dir = Path::new(manifest_dir)
        .join("../../shared/conformance")
        .join(folder);
    if dir.is_dir() {
        return Some(dir);
    }
    let msg = format!(
        "Istio's conformance data {folder} is missing at {} (it comes with the shared data beside the checkout)",
        dir.display()
    );
    assert!(
        !in_ci(),
        "{msg}; CI=true, so this test fails instead of skipping"
    );
    eprintln!("SKIP: {msg}");
    None
}

#[allow(clippy::disallowed_methods)] // CI=true turns missing data into a failure
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}
