//! Wasm remote load (`ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION`, default on): an ECDS
//! response whose Wasm filter loads its module from a remote HTTP or OCI source is rewritten
//! before Envoy sees it. The agent fetches the module (`fetch.rs`, `oci.rs`), checks its
//! sha256, keeps it in its on-disk cache (`cache.rs`, Istio's `/var/lib/istio/data`, entries
//! unused for `WASM_MODULE_EXPIRY` purged every `WASM_PURGE_INTERVAL`) and points the filter
//! at the local file (`convert.rs`). A module that cannot be had replaces the filter with an
//! allow-all (fail open) or deny-all (fail closed) RBAC filter; a resource that is not a valid
//! extension config NACKs the response upstream, as Istio's agent does.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

mod cache;
mod convert;
mod fetch;
mod metrics;
mod oci;

pub use cache::{Cache, PullPolicy, Request};
pub use convert::{ALLOW_PREFIX, DENY_PREFIX, convert_delta, convert_sotw};
pub use metrics::Metrics;

/// The cache and fetch settings (Istio's `WASM_*` variables).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Options {
    /// Where modules are written (Istio's data directory, `./var/lib/istio/data`).
    pub dir: PathBuf,
    /// `WASM_INSECURE_REGISTRIES`: hosts (`host` or `host:port`) fetched over HTTPS without
    /// verifying their certificate (`*`: all).
    pub insecure_registries: Vec<String>,
    /// `WASM_MODULE_EXPIRY` (24h): a module unused this long is removed.
    pub module_expiry: Duration,
    /// `WASM_PURGE_INTERVAL` (1h): how often expired modules are looked for.
    pub purge_interval: Duration,
    /// `WASM_HTTP_REQUEST_TIMEOUT` (15s): one HTTP request's timeout.
    pub http_timeout: Duration,
    /// `WASM_HTTP_REQUEST_MAX_RETRIES` (5): attempts of an HTTP fetch.
    pub http_max_retries: u32,
    /// `ISTIO_WASM_MAX_BINARY_SIZE_BYTES` (256 MiB): the largest module or blob read.
    pub max_binary_size: u64,
    /// `BLOCKED_CIDRS_IN_WASM_FETCH`: addresses never fetched from, beside link-local and
    /// cloud metadata addresses, which always are.
    pub blocked_cidrs: Vec<(IpAddr, u8)>,
}

impl Options {
    fn insecure(&self, host: &str, port: Option<u16>) -> bool {
        let with_port = port.map(|p| format!("{host}:{p}"));
        self.insecure_registries
            .iter()
            .any(|h| h == "*" || h == host || Some(h) == with_port.as_ref())
    }

    /// Istio's defaults, with modules under `dir`.
    pub fn new(dir: PathBuf) -> Self {
        Options {
            dir,
            insecure_registries: Vec::new(),
            module_expiry: Duration::from_secs(24 * 3600),
            purge_interval: Duration::from_secs(3600),
            http_timeout: Duration::from_secs(15),
            http_max_retries: 5,
            max_binary_size: 256 << 20,
            blocked_cidrs: Vec::new(),
        }
    }
}

/// Why a module could not be had.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Wasm module URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("fetching Wasm module {url}: {reason}")]
    Fetch { url: String, reason: String },
    #[error("module downloaded from {url} has checksum {got}, which does not match: {want}")]
    Checksum {
        url: String,
        got: String,
        want: String,
    },
    #[error("fetched Wasm binary from {url} is invalid (no Wasm magic number)")]
    Invalid { url: String },
    #[error("writing Wasm module to {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The Wasm binary's magic number (`\0asm`).
const WASM_MAGIC: &[u8] = b"\0asm";

fn is_wasm(b: &[u8]) -> bool {
    b.len() >= 8 && b.starts_with(WASM_MAGIC)
}

fn sha256_hex(b: &[u8]) -> String {
    use std::fmt::Write;
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, b);
    digest
        .as_ref()
        .iter()
        .fold(String::with_capacity(64), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}
