//! The status server's sub-config: app probes to rewrite, app metrics to merge, the workload
//! health probe, and where probes are sent.

use std::net::IpAddr;

use super::probe::{
    AppProbers, Destination, PrometheusAnnotations, ReadinessProbe, parse_probers,
    parse_prometheus_annotations, parse_readiness_probe,
};

use super::{Error, ProxyConfig, env::Env};

/// What the status server serves besides readiness.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StatusConfig {
    /// `ISTIO_KUBE_APP_PROBERS`: the app's probes, rewritten to the status port.
    pub app_probers: AppProbers,
    /// ProxyConfig `readinessProbe`: workload health reported to istiod.
    pub health_probe: Option<ReadinessProbe>,
    /// `ISTIO_PROMETHEUS_ANNOTATIONS`: the app's metrics merged into `/stats/prometheus`.
    pub prometheus_annotations: Option<PrometheusAnnotations>,
    /// `PILOT_AGENT_MERGE_ENVOY_STATS` (true): Envoy's stats in the merged metrics.
    pub merge_envoy_stats: bool,
    /// `REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION` (false): probes go to localhost instead of
    /// the pod IP.
    pub rewrite_probe_legacy_localhost: bool,
    /// `ISTIO_ENABLE_HTTP2_PROBING` (true): HTTPS app probes offer HTTP/2 over ALPN.
    pub http2_probing: bool,
    /// `ENABLE_PROBE_KEEPALIVE_CONNECTIONS` (false): HTTP app probes reuse an idle connection to
    /// the app instead of a new one per probe.
    pub probe_keepalive: bool,
    /// `METRICS_LOCALHOST_ACCESS_ONLY`: the merged metrics (and Envoy's prometheus listener)
    /// answer loopback peers only.
    pub metrics_localhost_only: bool,
    /// `--profiling` (true): `/debug/pprof/` (the agent's CPU profile) is served.
    pub profiling: bool,
}

impl StatusConfig {
    /// Where rewritten app probes connect: `ip` (`localhost` when unknown), or the name
    /// `localhost` with the legacy setting.
    pub fn probe_destination(&self, ip: Option<IpAddr>, localhost: IpAddr) -> Destination {
        if self.rewrite_probe_legacy_localhost {
            Destination::Localhost
        } else {
            Destination::Ip(ip.unwrap_or(localhost))
        }
    }
}

pub fn load(env: Env<'_>, proxy: &ProxyConfig, profiling: bool) -> Result<StatusConfig, Error> {
    let probers_text = env.raw("ISTIO_KUBE_APP_PROBERS").unwrap_or("");
    let app_probers = parse_probers(probers_text).map_err(|source| Error::Probe {
        var: "ISTIO_KUBE_APP_PROBERS",
        // Shown without its header values: a probe's headers may carry a token.
        value: super::dump::redact_probe_text(probers_text),
        source: Box::new(source),
    })?;
    let prometheus_annotations = match env.raw("ISTIO_PROMETHEUS_ANNOTATIONS") {
        None => None,
        Some(v) => {
            parse_prometheus_annotations(v, proxy.status_port).map_err(|source| Error::Probe {
                var: "ISTIO_PROMETHEUS_ANNOTATIONS",
                value: v.to_string(),
                source: Box::new(source),
            })?
        }
    };
    let health_probe = match &proxy.readiness_probe {
        None => None,
        Some(v) => Some(
            parse_readiness_probe(v).map_err(|source| Error::ReadinessProbe {
                value: super::dump::redact_probe_text(&v.to_string()),
                source: Box::new(source),
            })?,
        ),
    };
    Ok(StatusConfig {
        metrics_localhost_only: env.bool("METRICS_LOCALHOST_ACCESS_ONLY", false)?,
        http2_probing: env.bool("ISTIO_ENABLE_HTTP2_PROBING", true)?,
        probe_keepalive: env.bool("ENABLE_PROBE_KEEPALIVE_CONNECTIONS", false)?,
        app_probers,
        health_probe,
        prometheus_annotations,
        merge_envoy_stats: env.bool("PILOT_AGENT_MERGE_ENVOY_STATS", true)?,
        rewrite_probe_legacy_localhost: env
            .bool("REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION", false)?,
        profiling,
    })
}
