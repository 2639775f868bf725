//! Probe configuration: `ISTIO_KUBE_APP_PROBERS` (decoded as Istio's Go agent decodes it),
//! `ProxyConfig.readinessProbe` and `ISTIO_PROMETHEUS_ANNOTATIONS`. Every error says what was
//! expected; the caller names the variable.

use std::time::Duration;

use serde::Deserialize;

use super::gojson::{self, FieldError, Value};
use super::{AppProbe, AppProbers, ProbeAction, PrometheusAnnotations, ReadinessProbe};

/// What a probe input should have been. The message says what was expected (and, for an app
/// prober, under which status-server path); the caller names the variable or field.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("a JSON map of path to prober (failed to decode: {0})")]
    Decode(#[source] serde_json::Error),
    #[error("a JSON map of path to prober, not {0} (failed to decode)")]
    NotAMap(&'static str),
    #[error("probe paths of the form {PATH_PATTERN} (invalid path {0:?})")]
    Path(String),
    #[error("{path}: a prober object, not {got}")]
    NotAProber { path: String, got: &'static str },
    #[error(
        "{path}: exactly one of httpGet, tcpSocket or grpc (invalid prober type, must be one of type httpGet, tcpSocket or gRPC)"
    )]
    ProberType { path: String },
    /// `field` of the prober at `path` is not `expected`.
    #[error("{path}: {field} {expected}, not {got}")]
    Field {
        path: String,
        field: String,
        expected: &'static str,
        got: String,
    },
    #[error(
        "{path}: {field}.port an integer, not the named port {name:?} (invalid prober config, the port must be int type)"
    )]
    NamedPort {
        path: String,
        field: &'static str,
        name: String,
    },
    /// A member of the object at `parent` (`httpGet.`, or empty for the prober itself).
    #[error("{path}: {parent}{source}")]
    Member {
        path: String,
        parent: &'static str,
        #[source]
        source: FieldError,
    },
    #[error("a probe with httpGet, tcpSocket, grpc or exec ({0})")]
    ReadinessDecode(#[source] serde_json::Error),
    #[error("integer probe timings ({0})")]
    ReadinessTimings(#[source] serde_json::Error),
    #[error("exactly one of httpGet, tcpSocket, grpc, exec for {READINESS}")]
    ReadinessActions,
    #[error("{READINESS}: port {0} must be an integer in 1-65535")]
    ReadinessPort(serde_json::Value),
    #[error("{READINESS}: exec.command with a program to run")]
    ReadinessCommand,
    #[error("JSON {{scrape,path,port,targets}} ({0})")]
    Annotations(#[source] serde_json::Error),
    #[error("target port {0:?} in 1-65535")]
    TargetPort(String),
    #[error("target port {0} not reserved by Istio")]
    ReservedTargetPort(u16),
}

/// The field a VM's health probe is read from.
const READINESS: &str = "readinessProbe";

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
pub fn parse_probers(json: &str) -> Result<AppProbers, Error> {
    if json.is_empty() {
        return Ok(AppProbers::new());
    }
    let top = gojson::parse(json).map_err(Error::Decode)?;
    let entries = match top {
        Value::Null => return Ok(AppProbers::new()),
        Value::Object(entries) => entries,
        other => return Err(Error::NotAMap(other.kind())),
    };
    let mut out = AppProbers::new();
    for (path, value) in entries {
        if !valid_path(&path) {
            return Err(Error::Path(path));
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

fn int_or_string(o: &[(String, Value)], path: &str, field: &str) -> Result<Port, Error> {
    match gojson::field(o, "port") {
        None => Ok(Port::Int(0)),
        Some(Value::String(s)) => Ok(Port::Named(s)),
        Some(v) => gojson::as_int32(&v)
            .map(Port::Int)
            .ok_or_else(|| Error::Field {
                path: path.to_string(),
                field: format!("{field}.port"),
                expected: "a 32-bit integer or a string",
                got: format!("{v:?}"),
            }),
    }
}

/// Istio accepts any int32 and fails the probe when it runs; a port outside 1-65535 is refused
/// here instead (Kubernetes refuses such a pod spec, so the injector never writes one).
fn port_number(path: &str, field: &'static str, port: Port) -> Result<u16, Error> {
    match port {
        Port::Named(name) => Err(Error::NamedPort {
            path: path.to_string(),
            field,
            name,
        }),
        Port::Int(p) => u16::try_from(p)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| Error::Field {
                path: path.to_string(),
                field: format!("{field}.port"),
                expected: "in 1-65535",
                got: p.to_string(),
            }),
    }
}

/// A member of the object at `parent` of the prober at `path`, as [`Error::Member`].
fn member(path: &str, parent: &'static str) -> impl Fn(FieldError) -> Error {
    move |source| Error::Member {
        path: path.to_string(),
        parent,
        source,
    }
}

fn object<'a>(
    path: &str,
    field: &str,
    v: &'a Option<Value>,
) -> Result<Option<&'a [(String, Value)]>, Error> {
    match v {
        None => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o)),
        Some(v) => Err(Error::Field {
            path: path.to_string(),
            field: field.to_string(),
            expected: "an object",
            got: v.kind().to_string(),
        }),
    }
}

fn app_probe(path: &str, value: &Value) -> Result<AppProbe, Error> {
    let Value::Object(p) = value else {
        return Err(Error::NotAProber {
            path: path.to_string(),
            got: value.kind(),
        });
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
    let timeout = gojson::int32(p, "timeoutSeconds").map_err(member(path, ""))?;
    let action = match (http, tcp, grpc) {
        (Some(h), None, None) => {
            let port = int_or_string(h, path, "httpGet")?;
            let raw_path = gojson::string(h, "path").map_err(member(path, "httpGet."))?;
            let host = gojson::string(h, "host").map_err(member(path, "httpGet."))?;
            let scheme = gojson::string(h, "scheme").map_err(member(path, "httpGet."))?;
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
            let host = gojson::string(t, "host").map_err(member(path, "tcpSocket."))?;
            ProbeAction::Tcp {
                port: port_number(path, "tcpSocket", port)?,
                host,
            }
        }
        (None, None, Some(g)) => {
            let port = gojson::int32(g, "port").map_err(member(path, "grpc."))?;
            let service = gojson::string(g, "service").map_err(member(path, "grpc."))?;
            ProbeAction::Grpc {
                port: port_number(path, "grpc", Port::Int(port))?,
                service,
            }
        }
        _ => {
            return Err(Error::ProberType {
                path: path.to_string(),
            });
        }
    };
    let timeout = u64::try_from(timeout).map_err(|_| Error::Field {
        path: path.to_string(),
        field: "timeoutSeconds".into(),
        expected: "a non-negative number of seconds",
        got: timeout.to_string(),
    })?;
    Ok(AppProbe {
        action,
        timeout: Duration::from_secs(timeout),
    })
}

fn headers(path: &str, h: &[(String, Value)]) -> Result<Vec<(String, String)>, Error> {
    match gojson::field(h, "httpHeaders") {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                // A null element decodes to an empty header, as in Go.
                Value::Null => Ok((String::new(), String::new())),
                Value::Object(o) => Ok((
                    gojson::string(o, "name").map_err(member(path, "httpHeaders."))?,
                    gojson::string(o, "value").map_err(member(path, "httpHeaders."))?,
                )),
                v => Err(Error::Field {
                    path: path.to_string(),
                    field: "httpHeaders entries".into(),
                    expected: "{name, value}",
                    got: v.kind().to_string(),
                }),
            })
            .collect(),
        Some(v) => Err(Error::Field {
            path: path.to_string(),
            field: "httpHeaders".into(),
            expected: "an array",
            got: v.kind().to_string(),
        }),
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

fn int_port(v: &serde_json::Value) -> Result<u16, Error> {
    v.as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| Error::ReadinessPort(v.clone()))
}

fn readiness_action(p: RawProber) -> Result<AppProbe, Error> {
    let count = p.http_get.is_some() as u8
        + p.tcp_socket.is_some() as u8
        + p.grpc.is_some() as u8
        + p.exec.is_some() as u8;
    if count != 1 {
        return Err(Error::ReadinessActions);
    }
    let timeout = Duration::from_secs(u64::try_from(p.timeout_seconds).unwrap_or(0));
    let action = if let Some(h) = p.http_get {
        ProbeAction::Http {
            path: if h.path.starts_with('/') {
                h.path
            } else {
                format!("/{}", h.path)
            },
            port: int_port(&h.port)?,
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
            port: int_port(&t.port)?,
            host: t.host,
        }
    } else if let Some(g) = p.grpc {
        ProbeAction::Grpc {
            port: int_port(&g.port)?,
            service: g.service.unwrap_or_default(),
        }
    } else if let Some(e) = p.exec {
        if e.command.first().is_none_or(|c| c.is_empty()) {
            return Err(Error::ReadinessCommand);
        }
        ProbeAction::Exec { command: e.command }
    } else {
        return Err(Error::ReadinessActions);
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
pub fn parse_readiness_probe(v: &serde_json::Value) -> Result<ReadinessProbe, Error> {
    let raw: RawProber = serde_json::from_value(v.clone()).map_err(Error::ReadinessDecode)?;
    let sched: RawSchedule = serde_json::from_value(v.clone()).map_err(Error::ReadinessTimings)?;
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
) -> Result<Option<PrometheusAnnotations>, Error> {
    let raw: RawScrape = serde_json::from_str(json).map_err(Error::Annotations)?;
    if raw.scrape == "false" {
        return Ok(None);
    }
    let port_of = |p: &str| -> Result<u16, Error> {
        let port: u16 = p
            .parse()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| Error::TargetPort(p.to_string()))?;
        if port == status_port || RESERVED_PORTS.contains(&port) {
            return Err(Error::ReservedTargetPort(port));
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
            .collect::<Result<_, Error>>()?
    };
    Ok(Some(PrometheusAnnotations { targets }))
}
