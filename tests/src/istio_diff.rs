//! The recorded answers of Istio's own binaries (`tests/data/istio-diff/<suite>/`), for the
//! differential tests that compare ours with them without Go.
//!
//! Each suite's `oracle.json` says which build of Istio's `pilot-agent` answered (written by
//! `tests/data/istio-diff/oracle.py`; `scripts/istio-diff-record.sh` records every suite with the
//! pinned build). [`recorded_dir`] requires it to be the module this project targets
//! ([`crate::istio_release::MODULE`]) and, when `ISTIO_GO_BIN` is set (always under `CI=true`),
//! that build's `pilot-agent` to be the very binary recorded: Go builds with `-trimpath` are
//! reproducible, so the same bytes mean the same answers, and the recording is the comparison.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

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

/// [`data_dir`] for a comparison: also checks the suite's `oracle.json` (the module doc above).
pub fn recorded_dir(suite: &str, files: &[&str]) -> PathBuf {
    let dir = data_dir(suite, &[files, &["oracle.json"]].concat());
    check_oracle(suite, &dir);
    dir
}

/// `oracle.json` names the pinned module; the binary in `ISTIO_GO_BIN`, when set, is the one
/// recorded.
fn check_oracle(suite: &str, dir: &Path) {
    let path = dir.join("oracle.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let oracle: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let field = |k: &str| oracle[k].as_str().unwrap_or_default().to_string();
    let recorded = format!("{}@{}", field("module"), field("version"));
    let rerecord = "re-record with scripts/istio-diff-record.sh";
    assert_eq!(
        recorded,
        crate::istio_release::MODULE,
        "the {suite} suite was recorded from {recorded}, not the release this project targets: {rerecord}"
    );
    eprintln!(
        "{suite}: Istio's answers recorded {} from {recorded} ({}, {})",
        field("recorded"),
        field("reports"),
        field("go")
    );
    let Some(go_bin) = crate::istio_go_bin() else {
        return;
    };
    let agent = go_bin.join("pilot-agent");
    let out = Command::new("sha256sum")
        .arg(&agent)
        .output()
        .unwrap_or_else(|e| panic!("sha256sum {}: {e}", agent.display()));
    let sum = String::from_utf8_lossy(&out.stdout);
    let sum = sum.split_whitespace().next().unwrap_or_default();
    assert_eq!(
        sum,
        field("sha256"),
        "{} is not the binary the {suite} suite recorded (sha256 {}): {rerecord}",
        agent.display(),
        field("sha256")
    );
}
