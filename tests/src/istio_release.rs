// Istio's source at the release this project targets (`release-1.31`), read from Go's module
// cache. Tests read Istio's own data files there (the bootstrap template, `TestGolden`'s inputs
// and goldens); nothing of it is copied into the repository. The harness uses this file as its
// module `istio_release`, the agent crate's tests through
// `include!(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/src/istio_release.rs"))`; hence plain
// comments here, no inner doc.
//
// A missing module skips the test with a message naming the command that fetches it (the one
// `scripts/setup.sh --test-tools` runs); under `CI=true` it fails the test instead.

use std::path::PathBuf;
use std::process::Command;

/// The release whose files the module holds (its `VERSION` file).
pub const RELEASE: &str = "1.31";

/// `istio.io/istio` at the head of its `release-1.31` branch, as Go names the commit.
pub const MODULE: &str = "istio.io/istio@v0.0.0-20260827124520-eed52ebb66ad";

/// The module's directory in the module cache, when it is there and is the release named
/// above; else `None` after saying so (a failure under `CI=true`).
pub fn dir() -> Option<PathBuf> {
    let fetch = format!("go mod download {MODULE}");
    let Some(cache) = module_cache() else {
        missing(&format!(
            "Go is needed to find Istio {RELEASE}'s module ({MODULE}): install Go 1.26 or later, then `{fetch}`"
        ));
        return None;
    };
    let dir = cache.join(MODULE);
    if !dir.is_dir() {
        missing(&format!(
            "Istio {RELEASE}'s module is missing at {} (`{fetch}`, or scripts/setup.sh --test-tools)",
            dir.display()
        ));
        return None;
    }
    let version = std::fs::read_to_string(dir.join("VERSION")).unwrap_or_default();
    assert_eq!(
        version.trim(),
        RELEASE,
        "{}/VERSION is not Istio {RELEASE}'s",
        dir.display()
    );
    Some(dir)
}

/// The release's Envoy bootstrap template (`tools/packaging/common/envoy_bootstrap.json`, which
/// the proxyv2 image ships as `/var/lib/istio/envoy/envoy_bootstrap_tmpl.json`), when the module
/// is there (as [`dir`]).
#[allow(dead_code)] // not every includer renders Istio's template
pub fn bootstrap_template() -> Option<PathBuf> {
    dir().map(|d| d.join("tools/packaging/common/envoy_bootstrap.json"))
}

/// `go env GOMODCACHE`, with `go` from the PATH or Go's default install.
fn module_cache() -> Option<PathBuf> {
    ["go", "/usr/local/go/bin/go"].iter().find_map(|go| {
        let out = Command::new(go).args(["env", "GOMODCACHE"]).output().ok()?;
        let path = String::from_utf8(out.stdout).ok()?;
        let path = path.trim();
        (out.status.success() && !path.is_empty()).then(|| PathBuf::from(path))
    })
}

fn missing(msg: &str) {
    assert!(
        !in_ci(),
        "{msg}; CI=true, so this test fails instead of skipping"
    );
    eprintln!("SKIP: {msg}");
}

#[allow(clippy::disallowed_methods)] // CI=true turns a missing module into a failure
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}
