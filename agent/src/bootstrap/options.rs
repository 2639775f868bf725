//! The bootstrap's settings, computed once from the configuration: what both the built-in
//! bootstrap and the template data are made of (Istio's "template parameters").

use std::net::IpAddr;

use serde_json::{Map, Value, json};

use super::metadata::{self, Locality};
use super::stats::{self, Stats};
use super::telemetry::{self, Telemetry, Tracer};
use super::{Bound, Error};
use crate::config::Config;
use crate::platform::Platform;

/// The name of the Lightstep token file under `configPath`.
pub const LIGHTSTEP_TOKEN_FILE: &str = "lightstep_access_token.txt";

/// The IP family the proxy's addresses imply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    pub localhost: &'static str,
    pub wildcard: &'static str,
    pub lookup: &'static str,
    /// Dual stack: the other family's localhost and wildcard.
    pub additional: Option<(&'static str, &'static str)>,
}

const V4: Family = Family {
    localhost: "127.0.0.1",
    wildcard: "0.0.0.0",
    lookup: "V4_ONLY",
    additional: None,
};

fn family(config: &Config) -> Family {
    let all_v4 = config.node.ips.iter().all(IpAddr::is_ipv4);
    let all_v6 = config.node.ips.iter().all(IpAddr::is_ipv6);
    if all_v4 {
        V4
    } else if all_v6 {
        Family {
            localhost: "::1",
            wildcard: "::",
            lookup: "V6_ONLY",
            additional: None,
        }
    } else if config.bootstrap.dual_stack {
        if config.node.ips.first().is_some_and(IpAddr::is_ipv6) {
            Family {
                localhost: "::1",
                wildcard: "::",
                lookup: "ALL",
                additional: Some(("127.0.0.1", "0.0.0.0")),
            }
        } else {
            Family {
                lookup: "ALL",
                additional: Some(("::1", "::")),
                ..V4
            }
        }
    } else {
        V4
    }
}

/// Everything the bootstrap is rendered from.
#[derive(Debug, Clone)]
pub struct Options {
    pub node_id: String,
    pub cluster: String,
    pub locality: Locality,
    pub metadata: Map<String, Value>,
    pub runtime_flags: Map<String, Value>,
    pub family: Family,
    /// `GRPC` or `DELTA_GRPC`.
    pub xds_type: &'static str,
    pub metadata_discovery: bool,
    pub log_json: bool,
    pub stats: Stats,
    pub telemetry: Telemetry,
    /// `<configPath>/lightstep_access_token.txt` when the tracer is Lightstep.
    pub lightstep_token_path: Option<String>,
    pub config_path: String,
    pub admin_port: u16,
    /// The agent's (bound) status port.
    pub status_port: u16,
    pub envoy_status_port: u16,
    pub envoy_prometheus_port: u16,
    pub secure_metrics_port: u16,
    pub secure_merged_metrics_port: u16,
    pub metrics_localhost_only: bool,
    pub status_proxy_protocol: bool,
    pub stats_compression: bool,
    pub global_downstream_max_connections: i64,
    pub outlier_log_path: String,
    /// `ISTIO_META_LOAD_STATS_CONFIG_JSON`: the LRS config as JSON text.
    pub load_stats_config: Option<String>,
    pub enable_self_discovery: bool,
    pub workload_identity_socket_file: String,
    /// Socket of the agent's file-only SDS server when an external server owns the workload
    /// socket (Istio's `custom_file_path`; adds the `sds-files-grpc` cluster).
    pub custom_file_path: Option<String>,
}

/// Envoy runtime defaults, the FIPS and fragment flags, then ProxyConfig `runtimeValues` (`"true"`/`"false"`
/// become booleans, an empty value removes a default, anything else stays a string).
fn runtime_flags(config: &Config) -> Map<String, Value> {
    let mut flags = Map::new();
    flags.insert("re2.max_program_size.error_level".into(), json!("32768"));
    flags.insert(
        "envoy.deprecated_features:envoy.config.listener.v3.Listener.hidden_envoy_deprecated_use_original_dst".into(),
        json!(true),
    );
    flags.insert(
        "envoy.reloadable_features.http_reject_path_with_fragment".into(),
        json!(false),
    );
    flags.insert(
        "envoy.reloadable_features.fixed_heap_use_allocated".into(),
        json!(true),
    );
    flags.insert(
        "envoy.reloadable_features.coalesce_lb_rebuilds_on_batch_update".into(),
        json!(false),
    );
    if config.bootstrap.compliance_policy == "fips-140-2" {
        flags.insert(
            "envoy.reloadable_features.google_grpc_disable_tls_13".into(),
            json!(true),
        );
    }
    if !config.bootstrap.http_strip_fragment_from_path {
        // Istio's name for this setting reads backwards; the flag it sets is this one.
        flags.insert(
            "envoy.reloadable_features.http_strip_fragment_from_path_unsafe_if_disabled".into(),
            json!("false"),
        );
    }
    for (k, v) in &config.proxy.runtime_values {
        match v.as_str() {
            "" => {
                flags.remove(k);
            }
            "true" => {
                flags.insert(k.clone(), json!(true));
            }
            "false" => {
                flags.insert(k.clone(), json!(false));
            }
            other => {
                flags.insert(k.clone(), json!(other));
            }
        }
    }
    flags
}

/// The downstream connection limit: ProxyConfig `connectionSettings.globalDownstreamConnectionLimit`
/// above 0, else `proxyMetadata` `ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS`, else the runtime
/// value `overload.global_downstream_max_connections`, else 2147483647.
fn global_downstream_max_connections(config: &Config) -> Result<i64, Error> {
    let limit = config
        .proxy
        .raw
        .get("connectionSettings")
        .and_then(|c| c.get("globalDownstreamConnectionLimit"));
    let limit = match limit {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => n.as_i64(),
        Some(Value::String(s)) => s.parse::<i64>().ok(),
        Some(Value::Object(w)) => w.get("value").and_then(Value::as_i64),
        Some(other) => {
            return Err(Error::ProxyConfig {
                field: "connectionSettings.globalDownstreamConnectionLimit".into(),
                value: other.to_string(),
                expected: "an integer".into(),
            });
        }
    };
    if let Some(l) = limit.filter(|l| *l > 0) {
        return Ok(l);
    }
    let parse = |v: Option<&String>| v.and_then(|v| v.parse::<i64>().ok());
    Ok(parse(
        config
            .proxy
            .proxy_metadata
            .get("ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS"),
    )
    .or_else(|| {
        parse(
            config
                .proxy
                .runtime_values
                .get("overload.global_downstream_max_connections"),
        )
    })
    .unwrap_or(i64::from(i32::MAX)))
}

fn string_list(raw: &Value, field: &str) -> Result<Vec<String>, Error> {
    match raw.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| Error::ProxyConfig {
                        field: field.into(),
                        value: v.to_string(),
                        expected: "a list of strings".into(),
                    })
            })
            .collect(),
        Some(v) => Err(Error::ProxyConfig {
            field: field.into(),
            value: v.to_string(),
            expected: "a list of strings".into(),
        }),
    }
}

impl Options {
    /// Computes the options; errors name the ProxyConfig field or variable at fault.
    pub fn new(config: &Config, bound: Bound, platform: &Platform) -> Result<Options, Error> {
        let node = metadata::node(config, bound.sockets, platform)?;
        let raw = &config.proxy.raw;
        let node_id = config.node_id();
        let waypoint = node_id.starts_with("waypoint~");
        let xds_type = if config.bootstrap.delta_xds || waypoint {
            "DELTA_GRPC"
        } else {
            "GRPC"
        };
        let mut metadata_discovery = node.metadata_discovery || waypoint;
        if metadata_discovery && xds_type == "GRPC" {
            tracing::warn!(
                "disabling metadata discovery: not supported with state-of-the-world xDS"
            );
            metadata_discovery = false;
        }
        let telemetry = telemetry::telemetry(config, &node.metadata)?;
        let lightstep_token_path = matches!(telemetry.tracer, Some(Tracer::Lightstep { .. }))
            .then(|| format!("{}/{LIGHTSTEP_TOKEN_FILE}", config.proxy.config_path));
        let stats_compression = match raw.get("statsCompression") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(Value::Object(w)) => w.get("value").and_then(Value::as_bool).unwrap_or(false),
            Some(other) => {
                return Err(Error::ProxyConfig {
                    field: "statsCompression".into(),
                    value: other.to_string(),
                    expected: "true or false".into(),
                });
            }
        };
        let meta_str = |k: &str| node.metadata.get(k).and_then(Value::as_str);
        let metrics_localhost_only = config.status.metrics_localhost_only
            || config
                .proxy
                .proxy_metadata
                .get("METRICS_LOCALHOST_ACCESS_ONLY")
                .is_some_and(|v| v == "true");
        Ok(Options {
            stats: stats::stats(config, &string_list(raw, "extraStatTags")?),
            runtime_flags: runtime_flags(config),
            family: family(config),
            xds_type,
            metadata_discovery,
            log_json: config.flags.log_as_json,
            lightstep_token_path,
            telemetry,
            config_path: config.proxy.config_path.clone(),
            admin_port: config.proxy.proxy_admin_port,
            status_port: bound.status,
            envoy_status_port: config.envoy.status_port,
            envoy_prometheus_port: config.envoy.prometheus_port,
            secure_metrics_port: config.bootstrap.secure_metrics_port,
            secure_merged_metrics_port: config.bootstrap.secure_merged_metrics_port,
            metrics_localhost_only,
            status_proxy_protocol: config.bootstrap.status_port_proxy_protocol,
            stats_compression,
            global_downstream_max_connections: global_downstream_max_connections(config)?,
            outlier_log_path: config.flags.outlier_log_path.clone(),
            load_stats_config: meta_str("LOAD_STATS_CONFIG_JSON").map(str::to_string),
            enable_self_discovery: meta_str("ENABLE_SELF_DISCOVERY")
                .and_then(|v| go_syntax::parse_bool(v).ok())
                .unwrap_or(false),
            workload_identity_socket_file: config.workload_socket.file.clone(),
            custom_file_path: bound
                .sockets
                .external
                .then(|| format!("./{}", sds::paths::FILE_CREDENTIAL_SOCKET)),
            node_id,
            cluster: node.cluster,
            locality: node.locality,
            metadata: node.metadata,
        })
    }
}
