//! Istio agent's secret-cache metrics (security/pkg/nodeagent/cache/monitoring.go names).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// `request_type` label (`csr`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub(crate) request_type: String,
}

/// `reason` label of `csr_failures_total` (see [`crate::Error::reason`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub(crate) reason: String,
}

/// `resource_name` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub(crate) resource_name: String,
}

/// Metrics of the identity crate.
#[derive(Debug)]
pub struct Metrics {
    pub(crate) outgoing_requests: Family<RequestLabels, Counter>,
    pub(crate) failed_outgoing_requests: Family<RequestLabels, Counter>,
    pub(crate) outgoing_retries: Family<RequestLabels, Counter>,
    pub(crate) outgoing_latency: Family<RequestLabels, Histogram>,
    pub(crate) file_secret_failures: Counter,
    pub(crate) file_watcher_failures: Counter,
    /// Not an Istio metric: failed signing calls (after the per-call retries), by reason, so an
    /// expired token and an unreachable CA can be told apart.
    pub(crate) csr_failures: Family<ReasonLabels, Counter>,
    expiry: Arc<ExpiryCollector>,
}

/// `cert_expiry_seconds{resource_name}`: seconds until expiry, computed at scrape time.
#[derive(Debug, Default)]
struct ExpiryCollector {
    expiry: Mutex<HashMap<String, SystemTime>>,
}

impl Collector for ExpiryCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot: Vec<(String, SystemTime)> = match self.expiry.lock() {
            Ok(m) => m.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            Err(_) => return Ok(()),
        };
        let mut metric = encoder.encode_descriptor(
            "cert_expiry_seconds",
            "The time remaining, in seconds, before the certificate expires.",
            None,
            MetricType::Gauge,
        )?;
        let now = SystemTime::now();
        for (name, at) in snapshot {
            let secs = match at.duration_since(now) {
                Ok(d) => d.as_secs_f64(),
                Err(e) => -e.duration().as_secs_f64(),
            };
            let labels = ResourceLabels {
                resource_name: name,
            };
            let gauge = prometheus_client::metrics::gauge::ConstGauge::new(secs);
            gauge.encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[allow(dead_code)]
pub(crate) fn csr_labels() -> RequestLabels {
    RequestLabels {
        request_type: "csr".to_string(),
    }
}

impl Metrics {
    /// Registers the crate's metrics in `registry`.
    pub fn new(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            outgoing_requests: Family::default(),
            failed_outgoing_requests: Family::default(),
            outgoing_retries: Family::default(),
            outgoing_latency: Family::new_with_constructor(|| {
                Histogram::new([
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ])
            }),
            file_secret_failures: Counter::default(),
            file_watcher_failures: Counter::default(),
            csr_failures: Family::default(),
            expiry: Arc::new(ExpiryCollector::default()),
        };
        registry.register(
            "num_outgoing_requests",
            "Number of total outgoing requests (e.g. to a token exchange server, CA, etc.)",
            m.outgoing_requests.clone(),
        );
        registry.register(
            "num_failed_outgoing_requests",
            "Number of failed outgoing requests (e.g. to a token exchange server, CA, etc.)",
            m.failed_outgoing_requests.clone(),
        );
        registry.register(
            "num_outgoing_retries",
            "Number of outgoing retry requests (e.g. to a token exchange server, CA, etc.)",
            m.outgoing_retries.clone(),
        );
        registry.register_with_unit(
            "outgoing_latency",
            "The latency of outgoing requests (e.g. to a token exchange server, CA, etc.)",
            prometheus_client::registry::Unit::Seconds,
            m.outgoing_latency.clone(),
        );
        registry.register(
            "num_file_secret_failures",
            "Number of times secret generation failed for files",
            m.file_secret_failures.clone(),
        );
        registry.register(
            "num_file_watcher_failures",
            "Number of times file watcher failed to add watchers",
            m.file_watcher_failures.clone(),
        );
        registry.register(
            "csr_failures",
            "Number of certificate signing calls that failed after their retries, by reason (token_expired, unavailable, unauthenticated, ...)",
            m.csr_failures.clone(),
        );
        registry.register_collector(Box::new(m.expiry.clone()));
        m
    }

    /// Counts a failed signing call under `reason`.
    pub(crate) fn csr_failed(&self, reason: &str) {
        self.csr_failures
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Records the expiry of the certificate served as `resource_name`.
    pub(crate) fn set_expiry(&self, resource_name: &str, expire: SystemTime) {
        if let Ok(mut m) = self.expiry.expiry.lock() {
            m.insert(resource_name.to_string(), expire);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_istio_names() {
        let mut reg = Registry::default();
        let m = Metrics::new(&mut reg);
        m.outgoing_requests.get_or_create(&csr_labels()).inc();
        m.csr_failed("token_expired");
        m.set_expiry(
            "default",
            SystemTime::now() + std::time::Duration::from_secs(3600),
        );
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).expect("encode");
        assert!(
            out.contains("num_outgoing_requests_total{request_type=\"csr\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("csr_failures_total{reason=\"token_expired\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("cert_expiry_seconds{resource_name=\"default\"} 3599")
                || out.contains("cert_expiry_seconds{resource_name=\"default\"} 3600"),
            "{out}"
        );
    }
}
