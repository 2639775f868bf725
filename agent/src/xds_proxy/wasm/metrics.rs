//! Istio's Wasm metrics (`pkg/wasm/monitoring.go`), under the agent's `istio_agent_` prefix.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct HitLabels {
    pub(crate) hit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabels {
    pub(crate) result: &'static str,
}

/// Results of a remote fetch (`wasm_remote_fetch_count{result}`).
pub(crate) const FETCH_SUCCESS: &str = "success";
pub(crate) const DOWNLOAD_FAILURE: &str = "download_failure";
pub(crate) const MANIFEST_FAILURE: &str = "manifest_failure";
pub(crate) const CHECKSUM_MISMATCH: &str = "checksum_mismatched";
/// Results of a conversion (`wasm_config_conversion_count{result}`); `fetch_failure` is also
/// the fetch result of a binary that is not Wasm.
pub(crate) const CONVERSION_SUCCESS: &str = "success";
pub(crate) const NO_REMOTE_LOAD: &str = "no_remote_load";
pub(crate) const UNMARSHAL_FAILURE: &str = "unmarshal_failure";
pub(crate) const FETCH_FAILURE: &str = "fetch_failure";
pub(crate) const MISS_REMOTE_FETCH_HINT: &str = "miss_remote_fetch_hint";

/// The Wasm cache's and conversion's metrics.
#[derive(Clone)]
pub struct Metrics {
    pub(crate) cache_entries: Gauge,
    pub(crate) cache_lookups: Family<HitLabels, Counter>,
    pub(crate) remote_fetches: Family<ResultLabels, Counter>,
    pub(crate) conversions: Family<ResultLabels, Counter>,
    /// Milliseconds per ECDS response converted.
    pub(crate) conversion_duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            cache_entries: Gauge::default(),
            cache_lookups: Family::default(),
            remote_fetches: Family::default(),
            conversions: Family::default(),
            conversion_duration: Histogram::new([
                1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
                8192.0, 16384.0,
            ]),
        }
    }
}

impl Metrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Metrics::default();
        registry.register(
            "wasm_cache_entries",
            "number of Wasm remote fetch cache entries",
            m.cache_entries.clone(),
        );
        registry.register(
            "wasm_cache_lookup_count",
            "number of Wasm remote fetch cache lookups",
            m.cache_lookups.clone(),
        );
        registry.register(
            "wasm_remote_fetch_count",
            "number of Wasm remote fetches and results, including success, download failure, and checksum mismatch",
            m.remote_fetches.clone(),
        );
        registry.register(
            "wasm_config_conversion_count",
            "number of Wasm config conversions and results, including success, no remote load, marshal failure, remote fetch failure, miss remote fetch hint",
            m.conversions.clone(),
        );
        registry.register(
            "wasm_config_conversion_duration",
            "Total time in milliseconds istio-agent spends on converting remote load in Wasm config",
            m.conversion_duration.clone(),
        );
        m
    }

    pub(crate) fn lookup(&self, hit: bool) {
        self.cache_lookups
            .get_or_create(&HitLabels {
                hit: if hit { "true" } else { "false" },
            })
            .inc();
    }

    pub(crate) fn fetch(&self, result: &'static str) {
        self.remote_fetches
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    pub(crate) fn conversion(&self, result: &'static str) {
        self.conversions
            .get_or_create(&ResultLabels { result })
            .inc();
    }
}
