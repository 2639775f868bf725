//! The recorded answers of Istio's own binaries (`tests/data/istio-diff/<suite>/`), for the
//! differential tests that compare ours with them without Go.
//!
//! Each suite's `oracle.json` says which build of Istio's `pilot-agent` answered (written by
//! `tests/data/istio-diff/oracle.py`; `scripts/istio-diff-record.sh` records every suite with the
//! pinned build). [`recorded_dir`] requires it to be the module this project targets
//! ([`crate::istio_release::MODULE`]) and, when `ISTIO_GO_BIN` is set (always under `CI=true`),
//! that build's `pilot-agent` to be a build of the same module with the same Go release (its
//! embedded build information, as `go version -m` reads it); a different SHA-256 then only means
//! other build flags, and is noted. Go builds with `-trimpath` are reproducible: the pinned
//! module, Go release and `scripts/cluster/build.sh`'s flags give the recorded bytes, the same
//! bytes the same answers, and the recording is the comparison.

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
    let bytes = std::fs::read(&agent).unwrap_or_else(|e| panic!("read {}: {e}", agent.display()));
    let (go, module) = build_info(&bytes)
        .unwrap_or_else(|| panic!("{} carries no Go build information", agent.display()));
    let wanted = format!("mod\t{}\t{}\t", field("module"), field("version"));
    assert!(
        module.lines().any(|l| l.starts_with(&wanted)) && go == field("go"),
        "{} ({go}, {:?}) is not the build the {suite} suite recorded ({recorded}, {}): {rerecord}",
        agent.display(),
        module
            .lines()
            .find(|l| l.starts_with("mod\t"))
            .unwrap_or("no module"),
        field("go")
    );
    let out = Command::new("sha256sum")
        .arg(&agent)
        .output()
        .unwrap_or_else(|e| panic!("sha256sum {}: {e}", agent.display()));
    let sum = String::from_utf8_lossy(&out.stdout);
    let sum = sum.split_whitespace().next().unwrap_or_default();
    if sum != field("sha256") {
        eprintln!(
            "{suite}: {} is the recorded module and Go release built with other flags (sha256 {sum}, recorded {})",
            agent.display(),
            field("sha256")
        );
    }
}

/// The Go release and module information a Go binary embeds (what `go version -m` prints):
/// after the 32-byte header that starts with `\xff Go buildinf:`, two varint-prefixed strings
/// (Go 1.18 and later write them inline, flag bit 2).
fn build_info(bin: &[u8]) -> Option<(String, String)> {
    const MAGIC: &[u8] = b"\xff Go buildinf:";
    let at = bin.windows(MAGIC.len()).position(|w| w == MAGIC)?;
    let header = bin.get(at..at + 32)?;
    if header[15] & 2 == 0 {
        return None;
    }
    let mut rest = &bin[at + 32..];
    let mut string = || {
        let (mut len, mut shift, mut used) = (0usize, 0, 0);
        for b in rest.iter() {
            used += 1;
            len |= usize::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        let s = String::from_utf8_lossy(rest.get(used..used + len)?).into_owned();
        rest = &rest[used + len..];
        Some(s)
    };
    let go = string()?;
    let module = string()?;
    Some((go, module))
}

#[cfg(test)]
mod tests {
    use super::build_info;

    /// The release the recordings must come from is the module `scripts/cluster/build.sh`
    /// builds the oracle from (`versions.env`), so `scripts/istio-diff-record.sh` records
    /// what the tests accept.
    #[test]
    fn the_targeted_module_is_the_one_the_build_pins() {
        let value = crate::pinned;
        assert_eq!(
            format!("{}@{}", value("ISTIO_MODULE"), value("ISTIO_VERSION")),
            crate::istio_release::MODULE
        );
    }

    #[test]
    fn reads_go_build_information() {
        let module =
            "path\tistio.io/istio/pilot/cmd/pilot-agent\nmod\tistio.io/istio\tv0.0.0-x\th1:y\n";
        let mut bin = b"\x7fELF padding".to_vec();
        bin.extend_from_slice(b"\xff Go buildinf:");
        bin.extend_from_slice(&[8, 2]);
        bin.resize(bin.len() + 16, 0);
        bin.push(8);
        bin.extend_from_slice(b"go1.26.8");
        // A length past 127 takes two varint bytes.
        let long = format!("{module}{}", "x".repeat(200));
        bin.extend_from_slice(&[(long.len() as u8 & 0x7f) | 0x80, (long.len() >> 7) as u8]);
        bin.extend_from_slice(long.as_bytes());
        let (go, info) = build_info(&bin).expect("build information");
        assert_eq!(go, "go1.26.8");
        assert!(info.starts_with(module), "{info:?}");
        assert_eq!(info.len(), long.len());
        assert!(build_info(b"no Go here").is_none());
    }
}
