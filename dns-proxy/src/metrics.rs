//! Istio's DNS metrics (pkg/dns/client/monitoring.go); the agent registers them under the
//! `istio_agent` prefix.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Counters and histograms of the DNS proxy.
#[derive(Debug)]
pub struct Metrics {
    /// `dns_requests_total`: every query received.
    pub requests: Counter,
    /// `dns_upstream_requests_total`: queries forwarded upstream.
    pub upstream_requests: Counter,
    /// `dns_upstream_failures_total`: forwarded queries answered SERVFAIL because every
    /// upstream failed (or the forward limit was hit).
    pub upstream_failures: Counter,
    /// `dns_upstream_request_duration_seconds`.
    pub upstream_duration: Histogram,
    /// `dns_cache_hits_total` (not in Istio, which has no cache).
    pub cache_hits: Counter,
    /// `dns_stale_answers_total` (not in Istio): answers given past their TTL because every
    /// upstream failed (RFC 8767).
    pub stale_answers: Counter,
    /// `dns_prefetches_total` (not in Istio): cached names refreshed before they expired.
    pub prefetches: Counter,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn new(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            requests: Counter::default(),
            upstream_requests: Counter::default(),
            upstream_failures: Counter::default(),
            upstream_duration: Histogram::new([0.001, 0.005, 0.01, 0.1, 1.0, 5.0]),
            cache_hits: Counter::default(),
            stale_answers: Counter::default(),
            prefetches: Counter::default(),
        };
        // prometheus-client appends `_total` to counters.
        registry.register(
            "dns_requests",
            "Total number of DNS requests.",
            m.requests.clone(),
        );
        registry.register(
            "dns_upstream_requests",
            "Total number of DNS requests forwarded to upstream server.",
            m.upstream_requests.clone(),
        );
        registry.register(
            "dns_upstream_failures",
            "Total number of DNS failures.",
            m.upstream_failures.clone(),
        );
        registry.register(
            "dns_upstream_request_duration_seconds",
            "Total time in seconds Istio takes to get DNS response from upstream.",
            m.upstream_duration.clone(),
        );
        registry.register(
            "dns_cache_hits",
            "Total number of DNS requests answered from the upstream answer cache.",
            m.cache_hits.clone(),
        );
        registry.register(
            "dns_stale_answers",
            "Total number of DNS answers given past their TTL because every upstream failed.",
            m.stale_answers.clone(),
        );
        registry.register(
            "dns_prefetches",
            "Total number of cached DNS names refreshed before they expired.",
            m.prefetches.clone(),
        );
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_istio() {
        let mut registry = Registry::with_prefix("istio_agent");
        let m = Metrics::new(&mut registry);
        m.requests.inc();
        m.upstream_duration.observe(0.002);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("encode");
        for name in [
            "istio_agent_dns_requests_total 1",
            "istio_agent_dns_upstream_requests_total 0",
            "istio_agent_dns_upstream_failures_total 0",
            "istio_agent_dns_upstream_request_duration_seconds_bucket{le=\"0.005\"} 1",
        ] {
            assert!(out.contains(name), "missing {name} in\n{out}");
        }
    }
}
