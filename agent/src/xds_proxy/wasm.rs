//! Wasm remote load (`ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION`, default on): an ECDS
//! response whose Wasm filter loads its module from a remote HTTP or OCI source is rewritten
//! before Envoy sees it. The agent fetches the module (`fetch.rs`, `oci.rs`), checks its
//! sha256, keeps it in its on-disk cache (`cache.rs`, Istio's `/var/lib/istio/data`, entries
//! unused for `WASM_MODULE_EXPIRY` purged every `WASM_PURGE_INTERVAL`) and points the filter
//! at the local file (`convert.rs`). Unpacking, hashing, manifest parsing and file writes run
//! on the blocking pool, [`WORKERS`] at a time (`unpack.rs`), never on the agent's one
//! runtime thread; the relay runs each ECDS rewrite on a task of its own (`relay.rs`). A module that cannot be had replaces the filter with an
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
mod unpack;

pub use cache::Cache;
#[cfg(test)]
pub use cache::{PullPolicy, Request};
#[cfg(test)]
pub use convert::{ALLOW_PREFIX, DENY_PREFIX};
pub use convert::{ConvertError, convert_delta, convert_sotw};
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
    /// `WASM_PLAIN_HTTP_REGISTRIES` (not in Istio; empty): registries (`host` or `host:port`,
    /// `*`: all) fetched over plain HTTP when they answer the TLS handshake in it. Istio
    /// falls back to plain HTTP for every registry.
    pub plain_http_registries: Vec<String>,
    /// `WASM_CACHE_MAX_BYTES` (not in Istio; 1 GiB): the most the module cache keeps on disk;
    /// past it the modules used longest ago are removed.
    pub max_cache_bytes: u64,
    /// `WASM_CACHE_MAX_ENTRIES` (not in Istio; 64): the most modules the cache keeps.
    pub max_cache_entries: usize,
}

/// Whether `host` (or `host:port`) is in a list of hosts where `*` means all.
fn listed(list: &[String], host: &str, port: Option<u16>) -> bool {
    let with_port = port.map(|p| format!("{host}:{p}"));
    list.iter()
        .any(|h| h == "*" || h == host || Some(h) == with_port.as_ref())
}

impl Options {
    fn insecure(&self, host: &str, port: Option<u16>) -> bool {
        listed(&self.insecure_registries, host, port)
    }

    fn plain_http(&self, host: &str, port: Option<u16>) -> bool {
        listed(&self.plain_http_registries, host, port)
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
            plain_http_registries: Vec::new(),
            max_cache_bytes: 1 << 30,
            max_cache_entries: 64,
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

/// Why a job on the blocking pool gave no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WorkError {
    #[error(transparent)]
    Closed(#[from] tokio::sync::AcquireError),
    #[error("Wasm work failed: {0}")]
    Failed(#[from] tokio::task::JoinError),
}

/// The Wasm binary's magic number (`\0asm`).
const WASM_MAGIC: &[u8] = b"\0asm";

/// Most Wasm jobs (hashing, parsing, unpacking, writing) running at once, agent-wide.
pub const WORKERS: usize = 2;

/// Runs the Wasm work that costs CPU or disk time on the blocking pool, at most [`WORKERS`]
/// jobs at once; a job keeps its place until it returns, even when the fetch that wanted it
/// timed out.
#[derive(Clone)]
pub(crate) struct Work(std::sync::Arc<tokio::sync::Semaphore>);

impl Work {
    fn new(workers: usize) -> Self {
        Work(std::sync::Arc::new(tokio::sync::Semaphore::new(
            workers.max(1),
        )))
    }

    async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, WorkError> {
        let place = self.0.clone().acquire_owned().await?;
        Ok(tokio::task::spawn_blocking(move || {
            let _place = place;
            job()
        })
        .await?)
    }
}

/// Entry points for the fuzz targets: the OCI manifest parser and the layer unpacking.
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    /// Parses `b` as an OCI manifest and, when it parses, picks the module's layer.
    pub fn manifest(b: &[u8]) -> Result<(String, bool), super::oci::OciError> {
        super::oci::Manifest::parse(b)?.module_layer()
    }

    /// Unpacks `b` as an HTTP module body (`layer: false`) or a packed OCI layer, each layer
    /// capped at `cap` bytes.
    pub fn unpack(b: &[u8], layer: bool, cap: u64) -> Result<Vec<u8>, super::unpack::UnpackError> {
        let blob = bytes::Bytes::copy_from_slice(b);
        let body = if layer {
            super::unpack::Body::Layer { blob, packed: true }
        } else {
            super::unpack::Body::Http(blob)
        };
        super::unpack::unpack_to_vec(body, cap)
    }
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
