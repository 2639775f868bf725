//! The effective configuration as JSON: logged once at start and served on the status port's
//! `/debug/config_dump` (as ztunnel's config dump). The raw environment is never included, and
//! values that may carry credentials are redacted: extra CA/xDS gRPC headers, probe headers,
//! and in the ProxyConfig (and the `proxy.istio.io/config` annotation it may come from) every
//! `proxyMetadata` value (environment variables for the proxy, tokens among them) and every
//! string under a key that names a credential (`accessToken`, `password`, `secret`, ...).

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
        let mut annotations = serde_json::to_value(&self.pod_annotations).unwrap_or(Value::Null);
        if let Some(a) = annotations.get_mut(PROXY_CONFIG_ANNOTATION) {
            *a = Value::String(REDACTED.into());
        }
        json!({
            "node_type": self.node_type,
            "node_id": self.node_id(),
            "base_dir": self.base_dir,
            "flags": self.flags,
            "proxy_config": redact_proxy_config(&self.proxy.raw),
            "pod": {
                "name": self.pod_name,
                "namespace": self.pod_namespace,
                "service_account": self.service_account,
                "labels": self.pod_labels,
                "annotations": annotations,
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

/// The pod annotation a ProxyConfig layer is read from.
const PROXY_CONFIG_ANNOTATION: &str = "proxy.istio.io/config";

/// Keys whose string values are credentials, wherever they are in a ProxyConfig (compared in
/// lowercase, as substrings): Lightstep's `accessToken`, Datadog's or a custom tracer's keys,
/// anything named a password or secret.
const CREDENTIAL_KEYS: [&str; 6] = [
    "token",
    "password",
    "secret",
    "credential",
    "apikey",
    "api_key",
];

/// The ProxyConfig with `proxyMetadata` values and credential-named strings redacted.
pub fn redact_proxy_config(raw: &Value) -> Value {
    let mut v = raw.clone();
    if let Some(md) = v.get_mut("proxyMetadata").and_then(Value::as_object_mut) {
        for value in md.values_mut() {
            *value = Value::String(REDACTED.into());
        }
    }
    redact_credentials(&mut v);
    v
}

fn redact_credentials(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, value) in map.iter_mut() {
                let k = k.to_ascii_lowercase();
                if value.is_string() && CREDENTIAL_KEYS.iter().any(|c| k.contains(c)) {
                    *value = Value::String(REDACTED.into());
                } else {
                    redact_credentials(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_credentials),
        _ => {}
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
