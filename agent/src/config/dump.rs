//! The effective configuration as JSON: logged once at start and served on the status port's
//! `/debug/config_dump` (as ztunnel's config dump). The raw environment is never included, and
//! values that may carry credentials (extra CA/xDS gRPC headers, probe headers) are redacted.

use serde_json::{Value, json};

use super::Config;

/// What a redacted value reads as.
pub const REDACTED: &str = "<redacted>";

impl Config {
    /// The effective configuration tree, secrets redacted.
    pub fn dump(&self) -> Value {
        let mut identity = serde_json::to_value(&self.identity).unwrap_or(Value::Null);
        redact_pairs(&mut identity["ca_headers"], &[]);
        let mut upstream = serde_json::to_value(&self.upstream).unwrap_or(Value::Null);
        redact_pairs(&mut upstream["metadata"], &["ClusterID"]);
        let mut status = serde_json::to_value(&self.status).unwrap_or(Value::Null);
        if let Some(probers) = status["app_probers"].as_object_mut() {
            for probe in probers.values_mut() {
                redact_pairs(&mut probe["action"]["Http"]["headers"], &[]);
            }
        }
        json!({
            "node_type": self.node_type,
            "node_id": self.node_id(),
            "base_dir": self.base_dir,
            "flags": self.flags,
            "proxy_config": self.proxy.raw,
            "pod": {
                "name": self.pod_name,
                "namespace": self.pod_namespace,
                "service_account": self.service_account,
                "labels": self.pod_labels,
                "annotations": self.pod_annotations,
            },
            "host_ip": self.host_ip,
            "instance_ip": self.instance_ip,
            "ips": self.ips,
            "dns_domain": self.dns_domain,
            "cluster_id": self.cluster_id,
            "envoy": {
                "launched": self.launches_envoy(),
                "status_port": self.envoy_status_port,
                "prometheus_port": self.envoy_prometheus_port,
                "delta_xds": self.delta_xds,
                "concurrency": self.concurrency(),
                "exit_on_zero_active_connections": self.exit_on_zero_active_connections,
                "minimum_drain_duration": self.minimum_drain_duration,
                "istio_bootstrap": self.istio_bootstrap,
                "bootstrap_override": self.bootstrap_override,
                "skip_deprecated_logs": self.skip_deprecated_logs,
                "enable_core_dump": self.enable_core_dump,
                "dual_stack": self.dual_stack,
                "metrics_localhost_only": self.metrics_localhost_only,
            },
            "grpc_xds_bootstrap": self.grpc_xds_bootstrap,
            "output_certs": self.output_certs,
            "xds_socket": self.xds_socket(),
            "identity": identity,
            "dns": self.dns,
            "upstream": upstream,
            "status": status,
        })
    }
}

/// Replaces the value of every `[key, value]` pair in `list` whose key is not in `keep`.
fn redact_pairs(list: &mut Value, keep: &[&str]) {
    let Some(pairs) = list.as_array_mut() else {
        return;
    };
    for pair in pairs {
        let keep_it = pair[0].as_str().is_some_and(|k| keep.contains(&k));
        if !keep_it && pair.get(1).is_some() {
            pair[1] = Value::String(REDACTED.into());
        }
    }
}
