//! ProxyConfig: Istio's `meshConfig.defaultConfig`, layered from defaults, the mesh config file,
//! `PROXY_CONFIG` and the pod annotation `proxy.istio.io/config`, then validated into typed fields.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value};

use super::Error;
use go_syntax::parse_duration;

/// Control plane authentication policy (`controlPlaneAuthPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthPolicy {
    /// Plain text to istiod.
    None,
    /// TLS to istiod (the name is Istio's; the agent authenticates with a token).
    MutualTls,
}

/// The ProxyConfig fields the agent honours, typed and validated.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub config_path: String,
    pub binary_path: String,
    pub service_cluster: String,
    pub drain_duration: Duration,
    pub termination_drain_duration: Duration,
    pub discovery_address: String,
    pub proxy_admin_port: u16,
    pub status_port: u16,
    pub control_plane_auth_policy: AuthPolicy,
    pub concurrency: Option<u32>,
    pub proxy_metadata: BTreeMap<String, String>,
    pub custom_config_file: String,
    pub proxy_bootstrap_template_path: String,
    pub readiness_probe: Option<Value>,
    pub file_flush_interval: Option<Duration>,
    pub file_flush_min_size_kb: u32,
    pub runtime_values: BTreeMap<String, String>,
    /// `proxyStatsMatcher`: extra Envoy stats to keep.
    pub stats_matcher: StatsMatcher,
    /// The merged layers as JSON (sent to istiod as node metadata `PROXY_CONFIG`).
    pub raw: Value,
}

/// `proxyStatsMatcher`: Envoy stats kept on top of Istio's required ones (the bootstrap's
/// `stats_matcher` inclusion list). The pod annotations `sidecar.istio.io/statsInclusion*`
/// replace the matching list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsMatcher {
    pub inclusion_prefixes: Vec<String>,
    pub inclusion_suffixes: Vec<String>,
    pub inclusion_regexps: Vec<String>,
}

/// Istio's `mesh.DefaultProxyConfig()` values for the fields we read.
pub fn defaults() -> Value {
    serde_json::json!({
        "configPath": "./etc/istio/proxy",
        "binaryPath": "/usr/local/bin/envoy",
        "serviceCluster": "istio-proxy",
        "drainDuration": "45s",
        "terminationDrainDuration": "5s",
        "discoveryAddress": "istiod.istio-system.svc:15012",
        "proxyAdminPort": 15000,
        "controlPlaneAuthPolicy": "MUTUAL_TLS",
        "statNameLength": 189,
        "statusPort": 15020,
    })
}

/// ProxyConfig's fields (istio.io/api `mesh/v1alpha1/proxy.proto`), in proto-JSON spelling.
const FIELDS: &[&str] = &[
    "configPath",
    "binaryPath",
    "serviceCluster",
    "tracingServiceName",
    "drainDuration",
    "discoveryAddress",
    "discoveryRefreshDelay",
    "zipkinAddress",
    "statsdUdpAddress",
    "envoyMetricsServiceAddress",
    "proxyAdminPort",
    "availabilityZone",
    "controlPlaneAuthPolicy",
    "customConfigFile",
    "statNameLength",
    "concurrency",
    "proxyBootstrapTemplatePath",
    "interceptionMode",
    "tracing",
    "sds",
    "envoyAccessLogService",
    "envoyMetricsService",
    "proxyMetadata",
    "runtimeValues",
    "statusPort",
    "extraStatTags",
    "gatewayTopology",
    "terminationDrainDuration",
    "meshId",
    "readinessProbe",
    "proxyStatsMatcher",
    "holdApplicationUntilProxyStarts",
    "caCertificatesPem",
    "image",
    "privateKeyProvider",
    "proxyHeaders",
    "fileFlushInterval",
    "fileFlushMinSizeKb",
    "statsCompression",
    "connectionSettings",
];

/// ProxyConfig's `google.protobuf.Duration` fields.
const DURATIONS: &[&str] = &[
    "drainDuration",
    "discoveryRefreshDelay",
    "terminationDrainDuration",
    "fileFlushInterval",
];

/// A duration as proto JSON writes it: seconds, with 0, 3, 6 or 9 fractional digits.
fn proto_duration(d: Duration) -> String {
    let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
    if nanos == 0 {
        format!("{secs}s")
    } else if nanos % 1_000_000 == 0 {
        format!("{secs}.{:03}s", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!("{secs}.{:06}s", nanos / 1_000)
    } else {
        format!("{secs}.{nanos:09}s")
    }
}

/// The merged ProxyConfig as Istio's agent echoes it in the node metadata `PROXY_CONFIG`: the
/// proto read back as proto JSON. Unknown fields are dropped, durations written in seconds
/// (`1m30s` is `90s`; istiod parses this with proto-JSON rules), enums at their zero value
/// (`controlPlaneAuthPolicy: NONE`, `interceptionMode: REDIRECT`, `tracingServiceName:
/// APP_LABEL_AND_NAMESPACE`, `gatewayTopology.forwardClientCertDetails: UNDEFINED`) left out.
pub fn echo(raw: &Value) -> Value {
    let Value::Object(obj) = raw else {
        return raw.clone();
    };
    let mut out = Map::new();
    for (k, v) in obj {
        if !FIELDS.contains(&k.as_str()) {
            continue;
        }
        let zero_enum = matches!(
            (k.as_str(), v.as_str()),
            ("controlPlaneAuthPolicy", Some("NONE"))
                | ("interceptionMode", Some("REDIRECT"))
                | ("tracingServiceName", Some("APP_LABEL_AND_NAMESPACE"))
        );
        if zero_enum {
            continue;
        }
        let v = match (DURATIONS.contains(&k.as_str()), v) {
            (true, Value::String(text)) => parse_duration(text)
                .map(|d| Value::String(proto_duration(d)))
                .unwrap_or_else(|_| v.clone()),
            (_, Value::Object(topology)) if k == "gatewayTopology" => {
                let mut t = topology.clone();
                if t.get("forwardClientCertDetails").and_then(Value::as_str) == Some("UNDEFINED") {
                    t.remove("forwardClientCertDetails");
                }
                Value::Object(t)
            }
            _ => v.clone(),
        };
        out.insert(k.clone(), v);
    }
    Value::Object(out)
}

/// Parses one layer (YAML or JSON; JSON is YAML). An empty document is an empty layer.
pub fn parse_layer(source: &str, text: &str) -> Result<Value, Error> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    let value: Value = serde_yaml::from_str(text).map_err(|e| Error::Layer {
        source_name: source.to_string(),
        reason: e.to_string(),
    })?;
    match value {
        Value::Object(_) => Ok(value),
        Value::Null => Ok(Value::Object(Map::new())),
        other => Err(Error::Layer {
            source_name: source.to_string(),
            reason: format!("expected a mapping, found {other}"),
        }),
    }
}

/// Merges `over` into `base`: mappings merge key by key, everything else is replaced.
pub fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

fn bad(field: &str, value: &Value, expected: &str) -> Error {
    Error::ProxyConfigField {
        field: field.to_string(),
        value: value.to_string(),
        expected: expected.to_string(),
    }
}

fn string(obj: &Map<String, Value>, field: &str) -> Result<String, Error> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(bad(field, v, "a string")),
    }
}

fn integer(obj: &Map<String, Value>, field: &str) -> Result<Option<i64>, Error> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .map(Some)
            .ok_or_else(|| bad(field, &Value::Number(n.clone()), "an integer")),
        // proto-JSON allows integers as strings.
        Some(v @ Value::String(s)) => s
            .trim()
            .parse::<i64>()
            .map(Some)
            .map_err(|_| bad(field, v, "an integer")),
        Some(v) => Err(bad(field, v, "an integer")),
    }
}

fn port(obj: &Map<String, Value>, field: &str) -> Result<u16, Error> {
    let v = integer(obj, field)?.unwrap_or(0);
    u16::try_from(v)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| bad(field, &Value::from(v), "a port in 1-65535"))
}

fn duration(obj: &Map<String, Value>, field: &str) -> Result<Option<Duration>, Error> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v @ Value::String(s)) => parse_duration(s)
            .map(Some)
            .map_err(|_| bad(field, v, "a duration such as \"45s\" or \"1m30s\"")),
        Some(v) => Err(bad(field, v, "a duration string such as \"45s\"")),
    }
}

fn string_map(obj: &Map<String, Value>, field: &str) -> Result<BTreeMap<String, String>, Error> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                Value::Bool(b) => Ok((k.clone(), b.to_string())),
                Value::Number(n) => Ok((k.clone(), n.to_string())),
                other => Err(bad(&format!("{field}.{k}"), other, "a string")),
            })
            .collect(),
        Some(v) => Err(bad(field, v, "a map of strings")),
    }
}

fn string_list(obj: &Map<String, Value>, parent: &str, field: &str) -> Result<Vec<String>, Error> {
    let name = || format!("{parent}.{field}");
    match obj.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(bad(&format!("{}[{i}]", name()), other, "a string")),
            })
            .collect(),
        Some(v) => Err(bad(&name(), v, "a list of strings")),
    }
}

fn stats_matcher(obj: &Map<String, Value>) -> Result<StatsMatcher, Error> {
    const FIELD: &str = "proxyStatsMatcher";
    match obj.get(FIELD) {
        None | Some(Value::Null) => Ok(StatsMatcher::default()),
        Some(Value::Object(m)) => Ok(StatsMatcher {
            inclusion_prefixes: string_list(m, FIELD, "inclusionPrefixes")?,
            inclusion_suffixes: string_list(m, FIELD, "inclusionSuffixes")?,
            inclusion_regexps: string_list(m, FIELD, "inclusionRegexps")?,
        }),
        Some(v) => Err(bad(FIELD, v, "a mapping")),
    }
}

impl ProxyConfig {
    /// Validates merged layers into typed fields; errors name the field and the value.
    pub fn from_value(raw: Value) -> Result<Self, Error> {
        let Value::Object(obj) = &raw else {
            return Err(bad("defaultConfig", &raw, "a mapping"));
        };
        let non_empty = |field: &str| -> Result<String, Error> {
            let s = string(obj, field)?;
            if s.is_empty() {
                Err(bad(field, &Value::String(s), "a non-empty string"))
            } else {
                Ok(s)
            }
        };
        let discovery_address = non_empty("discoveryAddress")?;
        if split_host_port(&discovery_address).is_none() {
            return Err(bad(
                "discoveryAddress",
                &Value::String(discovery_address),
                "host:port",
            ));
        }
        let control_plane_auth_policy = match string(obj, "controlPlaneAuthPolicy")?.as_str() {
            "" | "MUTUAL_TLS" => AuthPolicy::MutualTls,
            "NONE" => AuthPolicy::None,
            _ => {
                return Err(bad(
                    "controlPlaneAuthPolicy",
                    &obj["controlPlaneAuthPolicy"],
                    "NONE or MUTUAL_TLS",
                ));
            }
        };
        let concurrency = match integer(obj, "concurrency")? {
            None => None,
            Some(c) => Some(
                u32::try_from(c)
                    .map_err(|_| bad("concurrency", &Value::from(c), "a non-negative integer"))?,
            ),
        };
        let file_flush_min_size_kb = match integer(obj, "fileFlushMinSizeKb")? {
            None => 0,
            Some(c) => u32::try_from(c).map_err(|_| {
                bad(
                    "fileFlushMinSizeKb",
                    &Value::from(c),
                    "a non-negative integer",
                )
            })?,
        };
        let drain_duration = duration(obj, "drainDuration")?.unwrap_or(Duration::from_secs(45));
        if drain_duration < Duration::from_millis(1) {
            return Err(bad(
                "drainDuration",
                &obj["drainDuration"],
                "a duration of at least 1ms",
            ));
        }
        let readiness_probe = obj.get("readinessProbe").filter(|v| !v.is_null()).cloned();
        Ok(ProxyConfig {
            config_path: non_empty("configPath")?,
            binary_path: non_empty("binaryPath")?,
            service_cluster: string(obj, "serviceCluster")?,
            drain_duration,
            termination_drain_duration: duration(obj, "terminationDrainDuration")?
                .unwrap_or(Duration::from_secs(5)),
            discovery_address,
            proxy_admin_port: port(obj, "proxyAdminPort")?,
            status_port: port(obj, "statusPort")?,
            control_plane_auth_policy,
            concurrency,
            proxy_metadata: string_map(obj, "proxyMetadata")?,
            custom_config_file: string(obj, "customConfigFile")?,
            proxy_bootstrap_template_path: string(obj, "proxyBootstrapTemplatePath")?,
            readiness_probe,
            file_flush_interval: duration(obj, "fileFlushInterval")?,
            file_flush_min_size_kb,
            runtime_values: string_map(obj, "runtimeValues")?,
            stats_matcher: stats_matcher(obj)?,
            raw,
        })
    }
}

/// Splits `host:port` (IPv6 hosts in brackets). Returns `None` without a valid port.
pub fn split_host_port(addr: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = addr.strip_prefix('[') {
        let (h, p) = rest.split_once("]:")?;
        (h, p)
    } else {
        addr.rsplit_once(':')?
    };
    let port = port.parse::<u16>().ok()?;
    if host.is_empty() {
        return None;
    }
    Some((host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the bootstrap differential suite: Istio echoes the proto, not the input text.
    #[test]
    fn echo_is_proto_json() {
        let raw = serde_json::json!({
            "drainDuration": "1m30s",
            "terminationDrainDuration": "1.5s",
            "controlPlaneAuthPolicy": "NONE",
            "interceptionMode": "TPROXY",
            "noSuchField": 1,
            "gatewayTopology": {"numTrustedProxies": 2, "forwardClientCertDetails": "UNDEFINED"},
            "concurrency": 0,
        });
        assert_eq!(
            echo(&raw),
            serde_json::json!({
                "drainDuration": "90s",
                "terminationDrainDuration": "1.500s",
                "interceptionMode": "TPROXY",
                "gatewayTopology": {"numTrustedProxies": 2},
                "concurrency": 0,
            })
        );
    }

    #[test]
    fn layers_replace_scalars_and_merge_maps() {
        let mut v = defaults();
        merge(
            &mut v,
            parse_layer("mesh", "proxyMetadata: {A: a, B: b}\ndrainDuration: 10s").unwrap(),
        );
        merge(
            &mut v,
            parse_layer(
                "PROXY_CONFIG",
                r#"{"proxyMetadata":{"B":"b2"},"statusPort":15999}"#,
            )
            .unwrap(),
        );
        let pc = ProxyConfig::from_value(v).unwrap();
        assert_eq!(pc.drain_duration, Duration::from_secs(10));
        assert_eq!(pc.status_port, 15999);
        assert_eq!(pc.proxy_metadata["A"], "a");
        assert_eq!(pc.proxy_metadata["B"], "b2");
        assert_eq!(pc.discovery_address, "istiod.istio-system.svc:15012");
        assert_eq!(pc.control_plane_auth_policy, AuthPolicy::MutualTls);
    }

    #[test]
    fn invalid_fields_are_named() {
        for (layer, field) in [
            ("statusPort: 70000", "statusPort"),
            ("drainDuration: soon", "drainDuration"),
            ("discoveryAddress: nohost", "discoveryAddress"),
            ("controlPlaneAuthPolicy: MAYBE", "controlPlaneAuthPolicy"),
            ("concurrency: -1", "concurrency"),
            ("proxyMetadata: [1]", "proxyMetadata"),
            ("proxyStatsMatcher: [a]", "proxyStatsMatcher"),
            (
                "proxyStatsMatcher: {inclusionPrefixes: http}",
                "proxyStatsMatcher.inclusionPrefixes",
            ),
            (
                "proxyStatsMatcher: {inclusionRegexps: [a, {b: c}]}",
                "proxyStatsMatcher.inclusionRegexps[1]",
            ),
        ] {
            let mut v = defaults();
            merge(&mut v, parse_layer("t", layer).unwrap());
            let err = ProxyConfig::from_value(v).unwrap_err().to_string();
            assert!(err.contains(field), "{layer}: {err}");
        }
    }

    #[test]
    fn proxy_stats_matcher_lists() {
        let mut v = defaults();
        merge(
            &mut v,
            parse_layer(
                "t",
                "proxyStatsMatcher: {inclusionPrefixes: [upstream_cx, 'http.{pod_ip}_'], inclusionRegexps: ['.*outlier_detection.*']}",
            )
            .unwrap(),
        );
        let c = ProxyConfig::from_value(v).unwrap();
        assert_eq!(
            c.stats_matcher,
            StatsMatcher {
                inclusion_prefixes: vec!["upstream_cx".into(), "http.{pod_ip}_".into()],
                inclusion_suffixes: vec![],
                inclusion_regexps: vec![".*outlier_detection.*".into()],
            }
        );
        let c = ProxyConfig::from_value(defaults()).unwrap();
        assert_eq!(c.stats_matcher, StatsMatcher::default());
    }

    #[test]
    fn non_mapping_layer_is_rejected() {
        assert!(parse_layer("PROXY_CONFIG", "[1, 2]").is_err());
        assert!(parse_layer("PROXY_CONFIG", "{").is_err());
        assert!(parse_layer("PROXY_CONFIG", "{}").unwrap().is_object());
    }

    #[test]
    fn host_port() {
        assert_eq!(
            split_host_port("istiod.istio-system.svc:15012"),
            Some(("istiod.istio-system.svc".into(), 15012))
        );
        assert_eq!(split_host_port("[::1]:15010"), Some(("::1".into(), 15010)));
        assert_eq!(split_host_port("x:y"), None);
        assert_eq!(split_host_port(":1"), None);
    }
}
