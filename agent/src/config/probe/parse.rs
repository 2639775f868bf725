//! Probe configuration: `ISTIO_KUBE_APP_PROBERS` (decoded as Istio's Go agent decodes it),
//! `ProxyConfig.readinessProbe` and `ISTIO_PROMETHEUS_ANNOTATIONS`. Every error says what was
//! expected; the caller names the variable.

use std::time::Duration;

use serde::Deserialize;

use super::gojson::{self, Value};
use super::{AppProbe, AppProbers, ProbeAction, PrometheusAnnotations, ReadinessProbe};

/// Ports the sidecar owns; an app target may not use them.
pub const RESERVED_PORTS: [u16; 9] = [
    15000, 15001, 15004, 15006, 15008, 15020, 15021, 15053, 15090,
];

/// The path pattern Istio accepts for a prober.
const PATH_PATTERN: &str =
    "/app-health|app-lifecycle/<container>/livez|readyz|startupz|prestopz|poststartz";

fn valid_path(path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    matches!(parts.as_slice(),
        ["", kind, container, probe]
            if matches!(*kind, "app-health" | "app-lifecycle")
                && !container.is_empty()
                && matches!(*probe, "livez" | "readyz" | "startupz" | "prestopz" | "poststartz"))
}

/// Parses `ISTIO_KUBE_APP_PROBERS`: a JSON map of status-server path to prober, as the
/// injector writes it. Empty (or `null`) means no probes. Field names match in any case
/// (`gRPC`, `httpget`), unknown fields (`initialDelaySeconds`, `exec`) are ignored.
pub fn parse_probers(json: &str) -> Result<AppProbers, String> {
    if json.is_empty() {
        return Ok(AppProbers::new());
    }
    let top = gojson::parse(json)
        .map_err(|e| format!("a JSON map of path to prober (failed to decode: {e})"))?;
    let entries = match top {
        Value::Null => return Ok(AppProbers::new()),
        Value::Object(entries) => entries,
        other => {
            return Err(format!(
                "a JSON map of path to prober, not {} (failed to decode)",
                other.kind()
            ));
        }
    };
    let mut out = AppProbers::new();
    for (path, value) in entries {
        if !valid_path(&path) {
            return Err(format!(
                "probe paths of the form {PATH_PATTERN} (invalid path {path:?})"
            ));
        }
        let probe = app_probe(&path, &value)?;
        out.insert(path, probe);
    }
    Ok(out)
}

/// A port as Kubernetes' `IntOrString`: a number, or a (named) string.
enum Port {
    Int(i32),
    Named(String),
}

fn int_or_string(o: &[(String, Value)], path: &str, field: &str) -> Result<Port, String> {
    match gojson::field(o, "port") {
        None => Ok(Port::Int(0)),
        Some(Value::String(s)) => Ok(Port::Named(s)),
        Some(v) => gojson::as_int32(&v)
            .map(Port::Int)
            .ok_or_else(|| format!("{path}: {field}.port a 32-bit integer or a string, not {v:?}")),
    }
}

/// Istio accepts any int32 and fails the probe when it runs; a port outside 1-65535 is refused
/// here instead (Kubernetes refuses such a pod spec, so the injector never writes one).
fn port_number(path: &str, field: &str, port: Port) -> Result<u16, String> {
    match port {
        Port::Named(name) => Err(format!(
            "{path}: {field}.port an integer, not the named port {name:?} (invalid prober config, the port must be int type)"
        )),
        Port::Int(p) => u16::try_from(p)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{path}: {field}.port in 1-65535, not {p}")),
    }
}

fn object<'a>(
    path: &str,
    field: &str,
    v: &'a Option<Value>,
) -> Result<Option<&'a [(String, Value)]>, String> {
    match v {
        None => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o)),
        Some(v) => Err(format!("{path}: {field} an object, not {}", v.kind())),
    }
}

fn app_probe(path: &str, value: &Value) -> Result<AppProbe, String> {
    let Value::Object(p) = value else {
        return Err(format!("{path}: a prober object, not {}", value.kind()));
    };
    let (http, tcp, grpc) = (
        gojson::field(p, "httpGet"),
        gojson::field(p, "tcpSocket"),
        gojson::field(p, "grpc"),
    );
    let (http, tcp, grpc) = (
        object(path, "httpGet", &http)?,
        object(path, "tcpSocket", &tcp)?,
        object(path, "grpc", &grpc)?,
    );
    let timeout = gojson::int32(p, "timeoutSeconds").map_err(|e| format!("{path}: {e}"))?;
    let action = match (http, tcp, grpc) {
        (Some(h), None, None) => {
            let port = int_or_string(h, path, "httpGet")?;
            let raw_path = gojson::string(h, "path").map_err(|e| format!("{path}: httpGet.{e}"))?;
            let host = gojson::string(h, "host").map_err(|e| format!("{path}: httpGet.{e}"))?;
            let scheme = gojson::string(h, "scheme").map_err(|e| format!("{path}: httpGet.{e}"))?;
            let headers = headers(path, h)?;
            ProbeAction::Http {
                path: if raw_path.starts_with('/') {
                    raw_path
                } else {
                    format!("/{raw_path}")
                },
                port: port_number(path, "httpGet", port)?,
                host,
                // Exactly "HTTPS", as Istio compares it; anything else is plain HTTP.
                https: scheme == "HTTPS",
                headers,
            }
        }
        (None, Some(t), None) => {
            let port = int_or_string(t, path, "tcpSocket")?;
            let host = gojson::string(t, "host").map_err(|e| format!("{path}: tcpSocket.{e}"))?;
            ProbeAction::Tcp {
                port: port_number(path, "tcpSocket", port)?,
                host,
            }
        }
        (None, None, Some(g)) => {
            let port = gojson::int32(g, "port").map_err(|e| format!("{path}: grpc.{e}"))?;
            let service = gojson::string(g, "service").map_err(|e| format!("{path}: grpc.{e}"))?;
            ProbeAction::Grpc {
                port: port_number(path, "grpc", Port::Int(port))?,
                service,
            }
        }
        _ => {
            return Err(format!(
                "{path}: exactly one of httpGet, tcpSocket or grpc (invalid prober type, must be one of type httpGet, tcpSocket or gRPC)"
            ));
        }
    };
    let timeout = u64::try_from(timeout).map_err(|_| {
        format!("{path}: timeoutSeconds a non-negative number of seconds, not {timeout}")
    })?;
    Ok(AppProbe {
        action,
        timeout: Duration::from_secs(timeout),
    })
}

fn headers(path: &str, h: &[(String, Value)]) -> Result<Vec<(String, String)>, String> {
    match gojson::field(h, "httpHeaders") {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                // A null element decodes to an empty header, as in Go.
                Value::Null => Ok((String::new(), String::new())),
                Value::Object(o) => Ok((
                    gojson::string(o, "name").map_err(|e| format!("{path}: httpHeaders.{e}"))?,
                    gojson::string(o, "value").map_err(|e| format!("{path}: httpHeaders.{e}"))?,
                )),
                v => Err(format!(
                    "{path}: httpHeaders entries {{name, value}}, not {}",
                    v.kind()
                )),
            })
            .collect(),
        Some(v) => Err(format!("{path}: httpHeaders an array, not {}", v.kind())),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawProber {
    http_get: Option<RawHttpGet>,
    tcp_socket: Option<RawTcp>,
    grpc: Option<RawGrpc>,
    /// Only in `readinessProbe` (a VM's WorkloadGroup probe); Istio never rewrites exec probes
    /// of pods.
    exec: Option<RawExec>,
    #[serde(default)]
    timeout_seconds: i64,
}

#[derive(Deserialize)]
struct RawExec {
    #[serde(default)]
    command: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawHttpGet {
    #[serde(default)]
    path: String,
    port: serde_json::Value,
    #[serde(default)]
    host: String,
    #[serde(default)]
    scheme: String,
    #[serde(default)]
    http_headers: Vec<RawHeader>,
}

#[derive(Deserialize)]
struct RawHeader {
    name: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
struct RawTcp {
    port: serde_json::Value,
    #[serde(default)]
    host: String,
}

#[derive(Deserialize)]
struct RawGrpc {
    port: serde_json::Value,
    #[serde(default)]
    service: Option<String>,
}

fn int_port(path: &str, v: &serde_json::Value) -> Result<u16, String> {
    v.as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("{path}: port {v} must be an integer in 1-65535"))
}

fn readiness_action(p: RawProber) -> Result<AppProbe, String> {
    let path = "readinessProbe";
    let count = p.http_get.is_some() as u8
        + p.tcp_socket.is_some() as u8
        + p.grpc.is_some() as u8
        + p.exec.is_some() as u8;
    if count != 1 {
        return Err(format!(
            "exactly one of httpGet, tcpSocket, grpc, exec for {path}"
        ));
    }
    let timeout = Duration::from_secs(u64::try_from(p.timeout_seconds).unwrap_or(0));
    let action = if let Some(h) = p.http_get {
        ProbeAction::Http {
            path: if h.path.starts_with('/') {
                h.path
            } else {
                format!("/{}", h.path)
            },
            port: int_port(path, &h.port)?,
            host: h.host,
            https: h.scheme.eq_ignore_ascii_case("https"),
            headers: h
                .http_headers
                .into_iter()
                .map(|h| (h.name, h.value))
                .collect(),
        }
    } else if let Some(t) = p.tcp_socket {
        ProbeAction::Tcp {
            port: int_port(path, &t.port)?,
            host: t.host,
        }
    } else if let Some(g) = p.grpc {
        ProbeAction::Grpc {
            port: int_port(path, &g.port)?,
            service: g.service.unwrap_or_default(),
        }
    } else if let Some(e) = p.exec {
        if e.command.first().is_none_or(|c| c.is_empty()) {
            return Err(format!("{path}: exec.command with a program to run"));
        }
        ProbeAction::Exec { command: e.command }
    } else {
        return Err(format!("a probe action for {path}"));
    };
    Ok(AppProbe { action, timeout })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSchedule {
    #[serde(default)]
    initial_delay_seconds: i64,
    #[serde(default)]
    period_seconds: i64,
    #[serde(default)]
    success_threshold: i64,
    #[serde(default)]
    failure_threshold: i64,
}

/// Parses `readinessProbe` with Istio's defaults (timeout 1 s, period 10 s, thresholds 1).
pub fn parse_readiness_probe(v: &serde_json::Value) -> Result<ReadinessProbe, String> {
    let raw: RawProber = serde_json::from_value(v.clone())
        .map_err(|e| format!("a probe with httpGet, tcpSocket, grpc or exec ({e})"))?;
    let sched: RawSchedule =
        serde_json::from_value(v.clone()).map_err(|e| format!("integer probe timings ({e})"))?;
    let mut probe = readiness_action(raw)?;
    if probe.timeout.is_zero() {
        probe.timeout = Duration::from_secs(1);
    }
    let secs = |n: i64, default: u64| {
        Duration::from_secs(u64::try_from(n).ok().filter(|n| *n > 0).unwrap_or(default))
    };
    let count = |n: i64| u32::try_from(n).ok().filter(|n| *n > 0).unwrap_or(1);
    Ok(ReadinessProbe {
        probe,
        initial_delay: Duration::from_secs(u64::try_from(sched.initial_delay_seconds).unwrap_or(0)),
        period: secs(sched.period_seconds, 10),
        success_threshold: count(sched.success_threshold),
        failure_threshold: count(sched.failure_threshold),
    })
}

#[derive(Deserialize)]
struct RawScrape {
    #[serde(default)]
    scrape: String,
    #[serde(default)]
    path: String,
    #[serde(default)]
    port: String,
    #[serde(default)]
    targets: Vec<RawTarget>,
}

#[derive(Deserialize)]
struct RawTarget {
    #[serde(default)]
    port: String,
    #[serde(default)]
    path: String,
}

/// Parses `ISTIO_PROMETHEUS_ANNOTATIONS`; `Ok(None)` when scraping is off.
pub fn parse_prometheus_annotations(
    json: &str,
    status_port: u16,
) -> Result<Option<PrometheusAnnotations>, String> {
    let raw: RawScrape = serde_json::from_str(json)
        .map_err(|e| format!("JSON {{scrape,path,port,targets}} ({e})"))?;
    if raw.scrape == "false" {
        return Ok(None);
    }
    let port_of = |p: &str| -> Result<u16, String> {
        let port: u16 = p
            .parse()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("target port {p:?} in 1-65535"))?;
        if port == status_port || RESERVED_PORTS.contains(&port) {
            return Err(format!("target port {port} not reserved by Istio"));
        }
        Ok(port)
    };
    let default_path = |p: String| {
        if p.is_empty() {
            "/metrics".to_string()
        } else {
            p
        }
    };
    let targets = if raw.targets.is_empty() {
        let port = if raw.port.is_empty() {
            "80".to_string()
        } else {
            raw.port
        };
        vec![(port_of(&port)?, default_path(raw.path))]
    } else {
        raw.targets
            .into_iter()
            .map(|t| Ok((port_of(&t.port)?, default_path(t.path))))
            .collect::<Result<_, String>>()?
    };
    Ok(Some(PrometheusAnnotations { targets }))
}
