//! Harness for the end-to-end tests: real Envoy, real iptables, network namespaces.
//!
//! - [`prereq`]: what a test needs (root, a binary, Envoy). Outside CI a missing prerequisite
//!   skips the test with a message saying what to install; under `CI=true` it fails the test.
//! - [`netns`]: named network namespaces removed on drop, veth pairs, running a command or a
//!   closure inside a namespace, as a given uid/gid.
//! - [`process`]: child processes killed on drop, workspace binaries.
//! - [`envoy`]: a real Envoy started from a YAML config, with its admin address read back.
//! - [`http`]: a tiny HTTP/1.0 client for admin and status endpoints.
//! - [`kubelet`]: pods run from Istio's injected specs the way a kubelet and containerd run them.
//! - [`cluster`]: the real one-node cluster of `scripts/cluster.sh` (kubelet, containerd,
//!   Istio's istiod), driven with kubectl and istioctl.
//! - [`assert_eventually`]: bounded polling; tests never sleep a fixed time to wait for a state.

// unsafe only where a module allows it: the container runtime (kubelet/container.rs).
#![deny(unsafe_code)]

pub mod app;
pub mod cluster;
/// The one loader of Istio's conformance data, shared by every crate's tests.
pub mod conformance;
pub mod envoy;
/// The floors check every crate's module-order test runs.
pub mod floors;
pub mod http;
pub mod istio_diff;
/// Istio's source at the targeted release, from Go's module cache.
pub mod istio_release;
pub mod kube_api;
pub mod kubelet;
pub mod local;
pub mod mesh;
pub mod netns;
pub mod prereq;
pub mod process;
pub mod vm;

pub use envoy::Envoy;
pub use http::http_get;
pub use netns::{Netns, veth};
pub use prereq::{envoy_bin, in_ci, istio_go_bin, kube_bins, require_bin, require_root};
pub use process::{Child, repo_root, workspace_bin};

use std::time::{Duration, Instant};

/// Polls `f` until it returns `Ok`, for at most `timeout`; panics with the last error otherwise.
pub fn assert_eventually<T>(timeout: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if Instant::now() >= deadline => {
                panic!("condition not met within {timeout:?}; last error: {e}")
            }
            Err(_) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
        }
    }
}

/// [`assert_eventually`] that returns the last error instead of panicking.
pub fn assert_eventually_result<T>(
    timeout: Duration,
    mut f: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
        }
    }
}

/// Async twin of [`assert_eventually`] for tests running on tokio.
pub async fn eventually<T, F, Fut>(timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if Instant::now() >= deadline => {
                panic!("condition not met within {timeout:?}; last error: {e}")
            }
            Err(_) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
        }
    }
}

/// A value of `scripts/cluster/versions.env` (the pinned versions the scripts build), the first
/// word after `KEY=`.
pub fn pinned(key: &str) -> String {
    let path = repo_root().join("scripts/cluster/versions.env");
    let versions = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    versions
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.split_whitespace().next())
        .unwrap_or_else(|| panic!("versions.env has no {key}"))
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eventually_returns_the_first_success() {
        let mut n = 0;
        let v = assert_eventually(Duration::from_secs(5), || {
            n += 1;
            if n < 3 { Err(format!("n={n}")) } else { Ok(n) }
        });
        assert_eq!(v, 3);
    }

    #[test]
    #[should_panic(expected = "last error: still 1")]
    fn eventually_panics_with_the_last_error() {
        assert_eventually(Duration::from_millis(30), || -> Result<(), String> {
            Err("still 1".into())
        });
    }
}
