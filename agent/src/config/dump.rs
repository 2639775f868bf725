//! The effective configuration as JSON: logged once at start and served on the status port's
//! `/debug/config_dump` (as ztunnel's config dump). The raw environment is never included, and
//! values that may carry credentials are redacted: extra CA/xDS gRPC headers, probe headers
//! (the app's and the workload health probe's), and in the ProxyConfig (and the
//! `proxy.istio.io/config` annotation it may come from) every `proxyMetadata` value
//! (environment variables for the proxy, tokens among them), every `httpHeaders` value
//! (`readinessProbe`) and every string under a key that names a credential (`accessToken`,
//! `password`, `secret`, ...).

use serde_json::{Value, json};

use super::{Config, ProxyConfig};

/// What a redacted value reads as.
pub const REDACTED: &str = "<redacted>";

impl Config {
    /// The effective configuration tree, secrets redacted: the [`Config`] tree itself,
    /// serialized (a field added to the tree is dumped without a line here), plus what is
    /// derived from it (the node id, Envoy's concurrency, the xDS socket).
    pub fn dump(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        redact_pairs(&mut v["identity"]["ca_headers"], &[]);
        redact_pairs(&mut v["upstream"]["metadata"], &["ClusterID"]);
        if let Some(probers) = v["status"]["app_probers"].as_object_mut() {
            for probe in probers.values_mut() {
                redact_pairs(&mut probe["action"]["Http"]["headers"], &[]);
            }
        }
        if let Some(probe) = v["status"].get_mut("health_probe").filter(|p| !p.is_null()) {
            redact_pairs(&mut probe["probe"]["action"]["Http"]["headers"], &[]);
        }
        if let Some(a) = v["node"]["pod_annotations"].get_mut(PROXY_CONFIG_ANNOTATION) {
            *a = Value::String(REDACTED.into());
        }
        // Names only: `ISTIO_META_*` values may carry anything.
        if let Some(meta) = v["node"]["meta_env"].as_array_mut() {
            for pair in meta.iter_mut() {
                *pair = pair[0].clone();
            }
        }
        v["node"]["id"] = json!(self.node_id());
        v["envoy"]["launched"] = json!(self.envoy.launched());
        v["envoy"]["concurrency"] = json!(self.concurrency());
        v["xds_socket"] = json!(self.xds_socket());
        v
    }
}

/// Serializes the ProxyConfig as its merged layers, redacted ([`redact_proxy_config`]).
pub fn proxy_config<S: serde::Serializer>(p: &ProxyConfig, s: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&redact_proxy_config(&p.raw), s)
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

/// Probe text (`ISTIO_KUBE_APP_PROBERS`, a `readinessProbe`) as it may be shown in an error:
/// its `httpHeaders` values and credential-named strings redacted; text that is not JSON is
/// not shown at all.
pub fn redact_probe_text(text: &str) -> String {
    match serde_json::from_str::<Value>(text) {
        Ok(mut v) => {
            redact_credentials(&mut v);
            v.to_string()
        }
        Err(_) => format!("{REDACTED} ({} bytes, not JSON)", text.len()),
    }
}

fn redact_credentials(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, value) in map.iter_mut() {
                let k = k.to_ascii_lowercase();
                if value.is_string() && CREDENTIAL_KEYS.iter().any(|c| k.contains(c)) {
                    *value = Value::String(REDACTED.into());
                } else if k == "httpheaders" {
                    // A probe's headers (`readinessProbe.httpGet.httpHeaders`): `{name, value}`
                    // objects whose values are often tokens (keys in any case, as Go decodes).
                    redact_header_values(value);
                } else {
                    redact_credentials(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_credentials),
        _ => {}
    }
}

/// Replaces the `value` of every `{name, value}` header object in `list`.
fn redact_header_values(list: &mut Value) {
    let Some(items) = list.as_array_mut() else {
        return;
    };
    for item in items.iter_mut().filter_map(Value::as_object_mut) {
        for (k, value) in item.iter_mut() {
            if k.eq_ignore_ascii_case("value") {
                *value = Value::String(REDACTED.into());
            }
        }
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
