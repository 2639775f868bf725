//! ProxyConfig's telemetry settings as the bootstrap uses them: the tracer (`tracing`), the
//! statsd and metrics-service sinks, the access-log service, and the upstream TLS transport
//! sockets these may use (their secrets come from our SDS server over `sds-grpc`).

use serde_json::{Map, Value, json};

use super::Error;
use crate::config::{Config, split_host_port};

/// `host:port` of a telemetry backend; a host of `$(HOST_IP)` is the `HOST_IP` variable.
#[derive(Debug, Clone, PartialEq)]
pub struct Address {
    pub host: String,
    pub port: u16,
}

impl Address {
    /// Envoy's `socket_address` object.
    pub fn socket_address(&self) -> Value {
        json!({ "address": self.host, "port_value": self.port })
    }

    /// Istio's template value: JSON text `{"address": "<host>", "port_value": <port>}`.
    pub fn template_text(&self) -> String {
        format!(
            "{{\"address\": \"{}\", \"port_value\": {}}}",
            self.host, self.port
        )
    }
}

/// The tracer of ProxyConfig `tracing`.
#[derive(Debug, Clone, PartialEq)]
pub enum Tracer {
    Zipkin(Address),
    Lightstep {
        address: Address,
        access_token: String,
    },
    Datadog(Address),
    /// Stackdriver: no tracer in the bootstrap (istiod configures it); the template gets its keys.
    Stackdriver {
        project_id: String,
        debug: bool,
        max_annotations: i64,
        max_attributes: i64,
        max_events: i64,
    },
}

/// A gRPC telemetry service (metrics service, access-log service).
#[derive(Debug, Clone, PartialEq)]
pub struct Service {
    pub address: Address,
    /// The transport socket (`None`: plain text).
    pub tls: Option<Value>,
    /// `upstream_connection_options` with the TCP keepalive.
    pub keepalive: Option<Value>,
}

/// Everything telemetry-related the bootstrap renders.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Telemetry {
    pub tracer: Option<Tracer>,
    /// The tracer's transport socket; `Some(None)` when `tlsSettings` is set without TLS.
    pub tracing_tls: Option<Option<Value>>,
    pub statsd: Option<Address>,
    pub metrics_service: Option<Service>,
    pub access_log_service: Option<Service>,
}

fn bad(field: &str, value: &Value, expected: &str) -> Error {
    Error::ProxyConfig {
        field: field.to_string(),
        value: value.to_string(),
        expected: expected.to_string(),
    }
}

fn object<'a>(
    obj: &'a Map<String, Value>,
    parent: &str,
    key: &str,
) -> Result<Option<&'a Map<String, Value>>, Error> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(v) => Err(bad(&join(parent, key), v, "a mapping")),
    }
}

fn string(obj: &Map<String, Value>, parent: &str, key: &str) -> Result<String, Error> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(bad(&join(parent, key), v, "a string")),
    }
}

/// A proto integer (number or decimal string), `None` when absent.
fn integer(obj: &Map<String, Value>, parent: &str, key: &str) -> Result<Option<i64>, Error> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v @ Value::Number(n)) => n
            .as_i64()
            .map(Some)
            .ok_or_else(|| bad(&join(parent, key), v, "an integer")),
        Some(v @ Value::String(s)) => s
            .parse()
            .map(Some)
            .map_err(|_| bad(&join(parent, key), v, "an integer")),
        Some(v) => Err(bad(&join(parent, key), v, "an integer")),
    }
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

fn address(config: &Config, field: &str, value: &str) -> Result<Address, Error> {
    let (host, port) = split_host_port(value)
        .ok_or_else(|| bad(field, &Value::String(value.to_string()), "host:port"))?;
    let host = if host == "$(HOST_IP)" && !config.node.host_ip.is_empty() {
        config.node.host_ip.clone()
    } else {
        host
    };
    Ok(Address { host, port })
}

fn service_address(
    config: &Config,
    obj: &Map<String, Value>,
    parent: &str,
) -> Result<Option<Address>, Error> {
    let a = string(obj, parent, "address")?;
    if a.is_empty() {
        return Ok(None);
    }
    address(config, &join(parent, "address"), &a).map(Some)
}

/// Reads the telemetry settings from the merged ProxyConfig; `meta` is the node metadata (its
/// `TLS_CLIENT_*` keys override the TLS file paths).
pub fn telemetry(config: &Config, meta: &Map<String, Value>) -> Result<Telemetry, Error> {
    let Value::Object(pc) = &config.proxy.raw else {
        return Ok(Telemetry::default());
    };
    let mut t = Telemetry::default();
    if let Some(tracing) = object(pc, "", "tracing")? {
        tracing_settings(config, tracing, meta, &mut t)?;
    }
    let statsd = string(pc, "", "statsdUdpAddress")?;
    if !statsd.is_empty() {
        t.statsd = Some(address(config, "statsdUdpAddress", &statsd)?);
    }
    t.metrics_service = service(
        config,
        pc,
        "envoyMetricsService",
        "envoy_metrics_service",
        meta,
    )?;
    if t.metrics_service.is_none() {
        let legacy = string(pc, "", "envoyMetricsServiceAddress")?;
        if !legacy.is_empty() {
            t.metrics_service = Some(Service {
                address: address(config, "envoyMetricsServiceAddress", &legacy)?,
                tls: None,
                keepalive: None,
            });
        }
    }
    t.access_log_service = service(
        config,
        pc,
        "envoyAccessLogService",
        "envoy_accesslog_service",
        meta,
    )?;
    Ok(t)
}

/// ProxyConfig's `tracing`: the tracer and its TLS settings.
fn tracing_settings(
    config: &Config,
    tracing: &Map<String, Value>,
    meta: &Map<String, Value>,
    t: &mut Telemetry,
) -> Result<(), Error> {
    let mut h2 = false;
    if let Some(z) = object(tracing, "tracing", "zipkin")? {
        t.tracer = service_address(config, z, "tracing.zipkin")?.map(Tracer::Zipkin);
    } else if let Some(l) = object(tracing, "tracing", "lightstep")? {
        h2 = true;
        t.tracer =
            service_address(config, l, "tracing.lightstep")?.map(|address| Tracer::Lightstep {
                address,
                access_token: string(l, "tracing.lightstep", "accessToken").unwrap_or_default(),
            });
    } else if let Some(d) = object(tracing, "tracing", "datadog")? {
        t.tracer = service_address(config, d, "tracing.datadog")?.map(Tracer::Datadog);
    } else if let Some(s) = object(tracing, "tracing", "stackdriver")? {
        t.tracer = Some(stackdriver(s, meta)?);
    }
    if let Some(tls) = object(tracing, "tracing", "tlsSettings")? {
        t.tracing_tls = Some(transport_socket(
            tls,
            "tracing.tlsSettings",
            "tracer",
            meta,
            h2,
        )?);
    }
    Ok(())
}

/// `tracing.stackdriver`: the tracer of the platform's GCP project, with its limits.
fn stackdriver(s: &Map<String, Value>, meta: &Map<String, Value>) -> Result<Tracer, Error> {
    let project_id = gcp_project(meta).ok_or_else(|| {
        bad(
            "tracing.stackdriver",
            &Value::Object(s.clone()),
            "a GCP project: the GCP platform's gcp_project (on GCP, or GCP_METADATA=<project>|<number>|<cluster>|<location>)",
        )
    })?;
    let max = |k: &str| -> Result<i64, Error> {
        // Wrappers: a bare number or `{"value": n}`.
        match s.get(k) {
            Some(Value::Object(w)) => {
                Ok(integer(w, "tracing.stackdriver", "value")?.unwrap_or(200))
            }
            _ => Ok(integer(s, "tracing.stackdriver", k)?.unwrap_or(200)),
        }
    };
    Ok(Tracer::Stackdriver {
        project_id,
        debug: s.get("debug").and_then(Value::as_bool).unwrap_or(false),
        max_annotations: max("maxNumberOfAnnotations")?,
        max_attributes: max("maxNumberOfAttributes")?,
        max_events: max("maxNumberOfMessageEvents")?,
    })
}

/// The GCP project of the platform's metadata (`PLATFORM_METADATA.gcp_project`), as Istio
/// takes it: present, even empty.
pub(super) fn gcp_project(meta: &Map<String, Value>) -> Option<String> {
    platform_value(meta, "gcp_project")
}

/// A key of the node's `PLATFORM_METADATA`.
pub(super) fn platform_value(meta: &Map<String, Value>, key: &str) -> Option<String> {
    meta.get("PLATFORM_METADATA")?
        .get(key)?
        .as_str()
        .map(str::to_string)
}

fn service(
    config: &Config,
    pc: &Map<String, Value>,
    field: &str,
    sni: &str,
    meta: &Map<String, Value>,
) -> Result<Option<Service>, Error> {
    let Some(s) = object(pc, "", field)? else {
        return Ok(None);
    };
    let Some(address) = service_address(config, s, field)? else {
        return Ok(None);
    };
    let tls = match object(s, field, "tlsSettings")? {
        Some(tls) => transport_socket(tls, &join(field, "tlsSettings"), sni, meta, true)?,
        None => None,
    };
    let keepalive = match object(s, field, "tcpKeepalive")? {
        Some(k) => Some(tcp_keepalive(k, &join(field, "tcpKeepalive"))?),
        None => None,
    };
    Ok(Some(Service {
        address,
        tls,
        keepalive,
    }))
}

/// `{"tcp_keepalive": {...}}` from Istio's `TcpKeepalive` (probes, time, interval; each only when
/// above zero).
fn tcp_keepalive(k: &Map<String, Value>, field: &str) -> Result<Value, Error> {
    let mut out = Map::new();
    if let Some(p) = integer(k, field, "probes")?.filter(|p| *p > 0) {
        out.insert("keepalive_probes".into(), json!(p));
    }
    for (key, name) in [
        ("time", "keepalive_time"),
        ("interval", "keepalive_interval"),
    ] {
        let v = string(k, field, key)?;
        if v.is_empty() {
            continue;
        }
        let d = go_syntax::parse_duration(&v).ok().ok_or_else(|| {
            bad(
                &join(field, key),
                &Value::String(v.clone()),
                "a duration such as \"10s\"",
            )
        })?;
        if d.as_secs() > 0 {
            out.insert(name.into(), json!(d.as_secs()));
        }
    }
    Ok(json!({ "tcp_keepalive": out }))
}

/// An `SdsSecretConfig` fetching `name` from our SDS server (`sds-grpc`).
pub fn sds_secret(name: &str) -> Value {
    json!({
        "name": name,
        "sds_config": {
            "api_config_source": {
                "api_type": "GRPC",
                "grpc_services": [{ "envoy_grpc": { "cluster_name": "sds-grpc" } }],
                "set_node_on_first_message_only": true,
                "transport_api_version": "V3"
            },
            "resource_api_version": "V3"
        }
    })
}

fn meta_or(meta: &Map<String, Value>, key: &str, fallback: String) -> String {
    match meta.get(key).and_then(Value::as_str) {
        Some(v) if !v.is_empty() => v.to_string(),
        _ => fallback,
    }
}

/// The upstream TLS transport socket for Istio's `ClientTLSSettings`, `None` without TLS:
/// `SIMPLE` validates with `file-root:<ca>`, `MUTUAL` adds `file-cert:<cert>~<key>`,
/// `ISTIO_MUTUAL` uses the workload's `default` and `ROOTCA` (SNI defaulting to `default_sni`).
/// ALPN `h2` (`istio,h2` in mesh) is kept only for HTTP/2 services.
pub fn transport_socket(
    tls: &Map<String, Value>,
    field: &str,
    default_sni: &str,
    meta: &Map<String, Value>,
    h2: bool,
) -> Result<Option<Value>, Error> {
    let mode = string(tls, field, "mode")?;
    let sans = subject_alt_names(tls, field)?;
    let mut default_validation = Map::new();
    if !sans.is_empty() {
        default_validation.insert("match_subject_alt_names".into(), Value::Array(sans));
    }
    let root_path = || -> Result<String, Error> {
        Ok(meta_or(
            meta,
            "TLS_CLIENT_ROOT_CERT",
            string(tls, field, "caCertificates")?,
        ))
    };
    let mut sni = string(tls, field, "sni")?;
    let (certs, root, alpn): (Vec<String>, String, &[&str]) = match mode.as_str() {
        "SIMPLE" => (Vec::new(), file_root(&root_path()?), &["h2"]),
        "MUTUAL" => {
            let cert = meta_or(
                meta,
                "TLS_CLIENT_CERT_CHAIN",
                string(tls, field, "clientCertificate")?,
            );
            let key = meta_or(meta, "TLS_CLIENT_KEY", string(tls, field, "privateKey")?);
            let certs = if cert.is_empty() || key.is_empty() {
                Vec::new()
            } else {
                vec![format!("{}{cert}~{key}", sds::FILE_CERT_PREFIX)]
            };
            (certs, file_root(&root_path()?), &["h2"])
        }
        "ISTIO_MUTUAL" => {
            if sni.is_empty() {
                sni = default_sni.to_string();
            }
            (
                vec![sds::WORKLOAD_KEY_CERT.to_string()],
                sds::ROOT_CA.to_string(),
                &["istio", "h2"],
            )
        }
        "" | "DISABLE" => return Ok(None),
        other => {
            return Err(bad(
                &join(field, "mode"),
                &Value::String(other.to_string()),
                "DISABLE, SIMPLE, MUTUAL or ISTIO_MUTUAL",
            ));
        }
    };
    Ok(Some(upstream_tls(
        default_validation,
        &root,
        &certs,
        alpn,
        h2,
        &sni,
    )))
}

/// `subjectAltNames` as Envoy's exact matchers.
fn subject_alt_names(tls: &Map<String, Value>, field: &str) -> Result<Vec<Value>, Error> {
    match tls.get("subjectAltNames") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| match s {
                Value::String(s) => Ok(json!({ "exact": s })),
                other => Err(bad(
                    &join(field, "subjectAltNames"),
                    other,
                    "a list of strings",
                )),
            })
            .collect(),
        Some(v) => Err(bad(&join(field, "subjectAltNames"), v, "a list of strings")),
    }
}

/// The `envoy.transport_sockets.tls` socket: its validation (root over SDS when there is one),
/// certificates over SDS, ALPN for HTTP/2 services and SNI.
fn upstream_tls(
    default_validation: Map<String, Value>,
    root: &str,
    certs: &[String],
    alpn: &[&str],
    h2: bool,
    sni: &str,
) -> Value {
    let mut combined = Map::new();
    combined.insert(
        "default_validation_context".into(),
        Value::Object(default_validation),
    );
    if !root.is_empty() {
        combined.insert(
            "validation_context_sds_secret_config".into(),
            sds_secret(root),
        );
    }
    let mut common = Map::new();
    if h2 {
        common.insert("alpn_protocols".into(), json!(alpn));
    }
    if !certs.is_empty() {
        common.insert(
            "tls_certificate_sds_secret_configs".into(),
            Value::Array(certs.iter().map(|c| sds_secret(c)).collect()),
        );
    }
    common.insert(
        "combined_validation_context".into(),
        Value::Object(combined),
    );
    let mut ctx = Map::new();
    ctx.insert(
        "@type".into(),
        json!("type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"),
    );
    ctx.insert("common_tls_context".into(), Value::Object(common));
    if !sni.is_empty() {
        ctx.insert("sni".into(), json!(sni));
    }
    json!({
        "name": "envoy.transport_sockets.tls",
        "typed_config": ctx
    })
}

fn file_root(ca: &str) -> String {
    if ca.is_empty() {
        String::new()
    } else {
        format!("{}{ca}", sds::FILE_ROOT_PREFIX)
    }
}
