//! Envoy bootstrap (`<configPath>/envoy-rev.json`) and node metadata, equivalent to Istio's
//! `envoy_bootstrap.json` template for the features the agent supports, and the gRPC xDS
//! bootstrap for proxyless clients.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::config::{AuthPolicy, Config, NodeType, parse_bool, split_host_port};

pub mod template;

/// Bootstrap errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid {var}: value {value:?} is not a JSON object")]
    MetaJson { var: String, value: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read bootstrap template {path}: {source}")]
    Template {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot render bootstrap template {path}")]
    Render {
        path: PathBuf,
        source: template::Error,
    },
}

/// Ports only known after binding (the status server may use port 0 in tests).
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub status: u16,
}

/// The agent's version, reported as `ISTIO_VERSION` when the environment does not set one.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

struct Family {
    localhost: &'static str,
    wildcard: &'static str,
    lookup: &'static str,
}

fn family(config: &Config) -> Family {
    let all_v6 = config.ips.iter().all(IpAddr::is_ipv6);
    let all_v4 = config.ips.iter().all(IpAddr::is_ipv4);
    if all_v6 && !all_v4 {
        Family {
            localhost: "::1",
            wildcard: "::",
            lookup: "V6_ONLY",
        }
    } else if !all_v4 && config.dual_stack {
        let first_v6 = config.ips.first().is_some_and(IpAddr::is_ipv6);
        if first_v6 {
            Family {
                localhost: "::1",
                wildcard: "::",
                lookup: "ALL",
            }
        } else {
            Family {
                localhost: "127.0.0.1",
                wildcard: "0.0.0.0",
                lookup: "ALL",
            }
        }
    } else {
        Family {
            localhost: "127.0.0.1",
            wildcard: "0.0.0.0",
            lookup: "V4_ONLY",
        }
    }
}

/// Envoy's `--local-address-ip-version`: v6 only if every node IP is v6.
pub fn local_address_ip_version(config: &Config) -> &'static str {
    if !config.ips.is_empty() && config.ips.iter().all(IpAddr::is_ipv6) {
        "v6"
    } else {
        "v4"
    }
}

/// `node.cluster`: the service cluster (`istio-proxy` becomes `<app>.<ns>`).
pub fn service_cluster(config: &Config) -> String {
    let sc = &config.proxy.service_cluster;
    if sc != "istio-proxy" && !sc.is_empty() {
        return sc.clone();
    }
    let ns = &config.pod_namespace;
    if let Some(app) = config
        .pod_labels
        .get("app")
        .or_else(|| config.pod_labels.get("app.kubernetes.io/name"))
    {
        return format!("{app}.{ns}");
    }
    if let Some(w) = config
        .env
        .get("ISTIO_META_WORKLOAD_NAME")
        .filter(|w| !w.is_empty())
    {
        return format!("{w}.{ns}");
    }
    format!("istio-proxy.{ns}")
}

/// Node metadata: ProxyConfig `ISTIO_META_*`, env `ISTIO_META_*`, `ISTIO_METAJSON_*`, then the
/// typed fields the agent owns.
pub fn node_metadata(config: &Config) -> Result<Map<String, Value>, Error> {
    let mut meta = Map::new();
    for (k, v) in &config.proxy.proxy_metadata {
        if let Some(key) = k.strip_prefix("ISTIO_META_").filter(|k| !k.is_empty()) {
            meta.insert(key.to_string(), Value::String(v.clone()));
        }
    }
    let mut env: Vec<(&String, &String)> = config.env.iter().collect();
    env.sort();
    for (k, v) in &env {
        if let Some(key) = k.strip_prefix("ISTIO_META_").filter(|k| !k.is_empty()) {
            meta.insert(key.to_string(), Value::String((*v).clone()));
        }
    }
    let mut labels: BTreeMap<String, Value> = BTreeMap::new();
    for (k, v) in &env {
        let Some(key) = k.strip_prefix("ISTIO_METAJSON_").filter(|k| !k.is_empty()) else {
            continue;
        };
        let parsed: Value = serde_json::from_str(v).map_err(|_| Error::MetaJson {
            var: (*k).clone(),
            value: (*v).clone(),
        })?;
        let Value::Object(obj) = parsed else {
            return Err(Error::MetaJson {
                var: (*k).clone(),
                value: (*v).clone(),
            });
        };
        if key == "LABELS" {
            labels.extend(obj.clone());
            meta.insert("STATIC_LABELS".into(), Value::Object(obj));
        } else {
            meta.insert(key.to_string(), Value::Object(obj));
        }
    }
    if let Some(addr) = config.env.get("DNS_PROXY_ADDR") {
        meta.insert("DNS_PROXY_ADDR".into(), Value::String(addr.clone()));
    }
    for (k, v) in &config.pod_labels {
        if k == "pod-template-hash" {
            continue;
        }
        let v = if k == "istio-locality" {
            v.replace('.', "/")
        } else {
            v.clone()
        };
        labels.insert(k.clone(), Value::String(v));
    }

    // Typed fields win.
    if !meta.contains_key("ISTIO_VERSION") {
        meta.insert("ISTIO_VERSION".into(), Value::String(VERSION.into()));
    }
    let ips: Vec<String> = config.ips.iter().map(IpAddr::to_string).collect();
    meta.insert("INSTANCE_IPS".into(), Value::String(ips.join(",")));
    if config.flags.sts_port > 0 {
        meta.insert(
            "STS_PORT".into(),
            Value::String(config.flags.sts_port.to_string()),
        );
    }
    meta.insert("ENVOY_STATUS_PORT".into(), json!(config.envoy_status_port));
    meta.insert(
        "ENVOY_PROMETHEUS_PORT".into(),
        json!(config.envoy_prometheus_port),
    );
    if config.exit_on_zero_active_connections {
        meta.insert("EXIT_ON_ZERO_ACTIVE_CONNECTIONS".into(), json!("true"));
    }
    meta.insert(
        "ENVOY_SKIP_DEPRECATED_LOGS".into(),
        json!(config.skip_deprecated_logs.to_string()),
    );
    meta.insert(
        "WORKLOAD_IDENTITY_SOCKET_FILE".into(),
        json!(config.workload_identity_socket_file),
    );
    meta.insert("PROXY_CONFIG".into(), config.proxy.raw.clone());
    meta.insert("NAME".into(), json!(config.pod_name));
    meta.insert("NAMESPACE".into(), json!(config.pod_namespace));
    if !config.service_account.is_empty() {
        meta.insert("SERVICE_ACCOUNT".into(), json!(config.service_account));
    }
    if !labels.is_empty() {
        meta.insert("LABELS".into(), json!(labels));
    }
    if !config.pod_annotations.is_empty() {
        meta.insert("ANNOTATIONS".into(), json!(config.pod_annotations));
    }
    if config.proxy.control_plane_auth_policy == AuthPolicy::MutualTls
        && let Some((host, _)) = split_host_port(&config.proxy.discovery_address)
    {
        let san = if host.contains("localhost") {
            "istiod.istio-system.svc".to_string()
        } else {
            host
        };
        meta.insert("PILOT_SAN".into(), json!([san]));
    }
    if !config.flags.outlier_log_path.is_empty() {
        meta.insert(
            "OUTLIER_LOG_PATH".into(),
            json!(config.flags.outlier_log_path),
        );
    }
    Ok(meta)
}

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

fn global_downstream_max_connections(config: &Config) -> u64 {
    let parse = |v: Option<&String>| v.and_then(|v| v.parse::<u64>().ok());
    parse(
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
    .unwrap_or(i32::MAX as u64)
}

fn h2_options() -> Value {
    json!({
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": { "http2_protocol_options": {} }
        }
    })
}

fn static_cluster(name: &str, address: Value, timeout: &str) -> Value {
    json!({
        "name": name,
        "alt_stat_name": format!("{name};"),
        "type": "STATIC",
        "connect_timeout": timeout,
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": address } }] }]
        }
    })
}

fn tcp(addr: &str, port: u16) -> Value {
    json!({ "socket_address": { "protocol": "TCP", "address": addr, "port_value": port } })
}

fn route_listener(
    name: String,
    address: Value,
    stat_prefix: &str,
    prefix: &str,
    cluster: &str,
) -> Value {
    json!({
        "name": name,
        "address": address,
        "ignore_global_conn_limit": true,
        "bypass_overload_manager": true,
        "filter_chains": [{
            "filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "codec_type": "AUTO",
                    "stat_prefix": stat_prefix,
                    "route_config": {
                        "virtual_hosts": [{
                            "name": "backend",
                            "domains": ["*"],
                            "routes": [{ "match": { "prefix": prefix }, "route": { "cluster": cluster } }]
                        }]
                    },
                    "http_filters": [{
                        "name": "envoy.filters.http.router",
                        "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" }
                    }]
                }
            }]
        }]
    })
}

fn stats_tags() -> Value {
    let tags: [(&str, &str); 19] = [
        ("cluster_name", r"^cluster(\.(.+);)"),
        (
            "http_conn_manager_prefix",
            r"^http\.(((?:[_.[:digit:]\w]*|[_\[\]aAbBcCdDeEfF[:digit:]\w\:]*));\.)",
        ),
        ("thread_name", r"^server(\.(.+))\.watchdog"),
        ("tcp_prefix", r"^tcp\.((.*?)\.)\w+?$"),
        ("response_code", r"_rq(_(\d{3}))$"),
        ("response_code_class", r"_rq(_(\dxx))$"),
        (
            "http_conn_manager_listener_prefix",
            r"^listener(?=\.).*?\.http\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)",
        ),
        (
            "listener_address",
            r"^listener\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)",
        ),
        (
            "mongo_prefix",
            r"^mongo\.(.+?)\.(collection|cmd|cx_|op_|delays_|decoding_)(.*?)$",
        ),
        ("reporter", r"(reporter=\.=(.*?);\.;)"),
        ("source_namespace", r"(source_namespace=\.=(.*?);\.;)"),
        ("cache", r"(cache\.(.+?)\.)"),
        ("component", r"(component\.(.+?)\.)"),
        ("tag", r"(tag\.(.+?);\.)"),
        ("wasm_filter", r"(wasm_filter\.(.+?)\.)"),
        ("authz_enforce_result", r"rbac(\.(allowed|denied))"),
        ("authz_dry_run_action", r"(\.istio_dry_run_(allow|deny)_)"),
        ("authz_dry_run_result", r"(\.shadow_(allowed|denied))"),
        ("destination_service", r"(destination_service=\.=(.*?);\.;)"),
    ];
    Value::Array(
        tags.iter()
            .map(|(name, re)| json!({ "tag_name": name, "regex": re }))
            .collect(),
    )
}

/// One inclusion list as Istio's bootstrap builds it: the pod annotation (comma-separated) or
/// else ProxyConfig's `proxyStatsMatcher` list, then the required entries; `{pod_ip}` becomes one
/// entry per instance IP. Empty entries (a stray comma) are dropped: an empty prefix would keep
/// every stat.
fn inclusion(
    config: &Config,
    annotation: &str,
    configured: &[String],
    required: &[&str],
) -> Vec<String> {
    let mut list: Vec<String> = match config.pod_annotations.get(annotation) {
        Some(a) if !a.is_empty() => a.split(',').map(str::to_string).collect(),
        _ => configured.to_vec(),
    };
    list.extend(required.iter().map(|s| s.to_string()));
    let mut out = Vec::new();
    for entry in list.into_iter().filter(|e| !e.is_empty()) {
        if entry.contains("{pod_ip}") {
            out.extend(
                config
                    .ips
                    .iter()
                    .map(|ip| entry.replace("{pod_ip}", &ip.to_string())),
            );
        } else {
            out.push(entry);
        }
    }
    out
}

/// The stats inclusion lists (prefixes, suffixes, regexps), each with Istio's required entries.
fn inclusion_lists(config: &Config) -> (Vec<String>, Vec<String>, Vec<String>) {
    let wanted = &config.proxy.stats_matcher;
    let prefixes = inclusion(
        config,
        "sidecar.istio.io/statsInclusionPrefixes",
        &wanted.inclusion_prefixes,
        &[
            "cluster_manager",
            "listener_manager",
            "server",
            "cluster.xds-grpc",
            "wasm",
        ],
    );
    let mut required_suffixes = vec![
        "rbac.allowed",
        "rbac.denied",
        "shadow_allowed",
        "shadow_denied",
    ];
    if config.exit_on_zero_active_connections {
        required_suffixes.push("downstream_cx_active");
    }
    let suffixes = inclusion(
        config,
        "sidecar.istio.io/statsInclusionSuffixes",
        &wanted.inclusion_suffixes,
        &required_suffixes,
    );
    let regexps = inclusion(
        config,
        "sidecar.istio.io/statsInclusionRegexps",
        &wanted.inclusion_regexps,
        &[r"vhost\..*\.route\..*"],
    );
    (prefixes, suffixes, regexps)
}

fn stats_matcher(config: &Config) -> Value {
    let (prefixes, suffixes, regexps) = inclusion_lists(config);
    let mut patterns = vec![json!({ "prefix": "reporter=" })];
    patterns.extend(prefixes.into_iter().map(|p| json!({ "prefix": p })));
    patterns.extend(suffixes.into_iter().map(|s| json!({ "suffix": s })));
    patterns.extend(
        regexps
            .into_iter()
            .map(|r| json!({ "safe_regex": { "regex": r } })),
    );
    patterns.push(json!({ "prefix": "component" }));
    patterns.push(json!({ "prefix": "istio" }));
    json!({ "inclusion_list": { "patterns": patterns } })
}

/// `node.locality` from the pod's `topology.istio.io/locality` (or `istio-locality`) label:
/// `region`, `zone` and `sub_zone`, each only when set.
fn locality(config: &Config) -> Map<String, Value> {
    let mut locality = Map::new();
    if let Some(loc) = config
        .pod_labels
        .get("topology.istio.io/locality")
        .or_else(|| config.pod_labels.get("istio-locality"))
    {
        let parts: Vec<&str> = loc.split(['.', '/']).collect();
        for (key, part) in ["region", "zone", "sub_zone"].iter().zip(parts) {
            if !part.is_empty() {
                locality.insert((*key).into(), json!(part));
            }
        }
    }
    locality
}

/// Renders the bootstrap as JSON.
pub fn render(config: &Config, ports: Ports) -> Result<Value, Error> {
    let fam = family(config);
    let admin_port = config.proxy.proxy_admin_port;
    let meta = node_metadata(config)?;
    let locality = locality(config);
    let log_format = if config.flags.log_as_json {
        json!({ "json_format": {
            "time": "%Y-%m-%dT%T.%fZ", "level": "%l", "scope": "envoy %n",
            "msg": "%j", "caller": "%g:%#", "thread": "%t"
        }})
    } else {
        json!({ "text_format": "%Y-%m-%dT%T.%fZ\t%l\tenvoy %n %g:%#\t%v\tthread=%t" })
    };
    let xds_type = if config.delta_xds {
        "DELTA_GRPC"
    } else {
        "GRPC"
    };
    let config_path = &config.proxy.config_path;

    let mut sds = static_cluster(
        "sds-grpc",
        json!({ "pipe": { "path": format!("./var/run/secrets/workload-spiffe-uds/{}", config.workload_identity_socket_file) } }),
        "1s",
    );
    sds["typed_extension_protocol_options"] = h2_options();
    let mut xds = static_cluster(
        "xds-grpc",
        json!({ "pipe": { "path": format!("{config_path}/XDS") } }),
        "1s",
    );
    let thresholds = |p: &str| json!({ "priority": p, "max_connections": 100000, "max_pending_requests": 100000, "max_requests": 100000 });
    xds["circuit_breakers"] = json!({ "thresholds": [thresholds("DEFAULT"), thresholds("HIGH")] });
    xds["upstream_connection_options"] = json!({ "tcp_keepalive": { "keepalive_time": 300 } });
    xds["max_requests_per_connection"] = json!(1);
    xds["typed_extension_protocol_options"] = h2_options();

    let prom_addr = if config.metrics_localhost_only
        || config
            .proxy
            .proxy_metadata
            .get("METRICS_LOCALHOST_ACCESS_ONLY")
            .and_then(|v| parse_bool(v))
            .unwrap_or(false)
    {
        fam.localhost
    } else {
        fam.wildcard
    };
    let mut status_listener = route_listener(
        format!("{}_{}", fam.wildcard, config.envoy_status_port),
        tcp(fam.wildcard, config.envoy_status_port),
        "agent",
        "/healthz/ready",
        "agent",
    );
    if config
        .env
        .get("ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL")
        .and_then(|v| parse_bool(v))
        .unwrap_or(false)
    {
        status_listener["listener_filters"] = json!([{
            "name": "envoy.listener.proxy_protocol",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.listener.proxy_protocol.v3.ProxyProtocol",
                "allow_requests_without_proxy_protocol": true
            }
        }]);
    }

    let mut bootstrap = json!({
        "application_log_config": { "log_format": log_format },
        "node": {
            "id": config.node_id(),
            "cluster": service_cluster(config),
            "locality": locality,
            "metadata": meta,
        },
        "layered_runtime": {
            "layers": [
                { "name": "global config", "static_layer": runtime_flags(config) },
                { "name": "admin", "admin_layer": {} }
            ]
        },
        "bootstrap_extensions": [{
            "name": "envoy.bootstrap.internal_listener",
            "typed_config": {
                "@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
                "type_url": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener",
                "value": { "buffer_size_kb": 64 }
            }
        }],
        "stats_config": {
            "use_all_default_tags": false,
            "stats_tags": stats_tags(),
            "stats_matcher": stats_matcher(config),
        },
        "admin": {
            "access_log": [{
                "name": "envoy.access_loggers.file",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                    "path": "/dev/null"
                }
            }],
            "profile_path": "/var/lib/istio/data/envoy.prof",
            "address": { "socket_address": { "address": fam.localhost, "port_value": admin_port } }
        },
        "dynamic_resources": {
            "lds_config": { "ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3" },
            "cds_config": { "ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3" },
            "ads_config": {
                "api_type": xds_type,
                "set_node_on_first_message_only": true,
                "transport_api_version": "V3",
                "grpc_services": [{ "envoy_grpc": { "cluster_name": "xds-grpc" } }]
            }
        },
        "static_resources": {
            "clusters": [
                static_cluster("prometheus_stats", tcp(fam.localhost, admin_port), "0.250s"),
                static_cluster("agent", tcp(fam.localhost, ports.status), "0.250s"),
                sds,
                xds,
            ],
            "listeners": [
                route_listener(
                    format!("{prom_addr}_{}", config.envoy_prometheus_port),
                    tcp(prom_addr, config.envoy_prometheus_port),
                    "stats",
                    "/stats/prometheus",
                    "prometheus_stats",
                ),
                status_listener,
            ]
        },
        "overload_manager": {
            "resource_monitors": [{
                "name": "envoy.resource_monitors.global_downstream_max_connections",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig",
                    "max_active_downstream_connections": global_downstream_max_connections(config)
                }
            }]
        },
        "deferred_stat_options": { "enable_deferred_creation_stats": true }
    });
    if !config.flags.outlier_log_path.is_empty() {
        bootstrap["cluster_manager"] = json!({
            "outlier_detection": { "event_log_path": config.flags.outlier_log_path },
            "enable_deferred_cluster_creation": true
        });
    }
    Ok(bootstrap)
}

/// The data a user template (`ISTIO_BOOTSTRAP`, `--templateFile`) is rendered with: Istio's
/// bootstrap option keys (§8.2 of the reference) that the agent can compute. As in Istio,
/// `meta_json_str`, `runtime_flags` and `pilot_grpc_address` are JSON text to embed as is,
/// optional keys are absent when unset, and `config` is ProxyConfig with Go field names
/// (durations as strings such as `"45s"`; `StatusPort` is the bound status port).
pub fn template_data(config: &Config, ports: Ports) -> Result<Value, Error> {
    let fam = family(config);
    let meta = node_metadata(config)?;
    let pilot_san = meta.get("PILOT_SAN").cloned();
    let node_id = config.node_id();
    let proxy = &config.proxy;
    let mut d = Map::new();
    let mut put = |k: &str, v: Value| {
        d.insert(k.to_string(), v);
    };
    put(
        "nodeType",
        json!(node_id.split('~').next().unwrap_or_default()),
    );
    put("nodeID", json!(node_id));
    put("cluster", json!(service_cluster(config)));
    for (k, v) in locality(config) {
        put(&k, v);
    }
    put("meta_json_str", json!(Value::Object(meta).to_string()));
    put(
        "runtime_flags",
        json!(Value::Object(runtime_flags(config)).to_string()),
    );
    let mut pc = json!({
        "ConfigPath": proxy.config_path,
        "BinaryPath": proxy.binary_path,
        "ServiceCluster": proxy.service_cluster,
        "DrainDuration": format!("{}s", proxy.drain_duration.as_secs_f64()),
        "TerminationDrainDuration": format!("{}s", proxy.termination_drain_duration.as_secs_f64()),
        "DiscoveryAddress": proxy.discovery_address,
        "ProxyAdminPort": proxy.proxy_admin_port,
        "StatusPort": ports.status,
        "ControlPlaneAuthPolicy": match proxy.control_plane_auth_policy {
            AuthPolicy::None => "NONE",
            AuthPolicy::MutualTls => "MUTUAL_TLS",
        },
        "ProxyMetadata": proxy.proxy_metadata,
        "RuntimeValues": proxy.runtime_values,
        "CustomConfigFile": proxy.custom_config_file,
        "ProxyBootstrapTemplatePath": proxy.proxy_bootstrap_template_path,
    });
    if let Some(c) = proxy.concurrency {
        pc["Concurrency"] = json!(c);
    }
    put("config", pc);
    if !proxy.discovery_address.is_empty() {
        put("discovery_address", json!(proxy.discovery_address));
    }
    if let Some((host, port)) = split_host_port(&proxy.discovery_address) {
        put("discovery_host", json!(host));
        // Istio's address option: JSON text `{"address": "<host>", "port_value": <port>}`.
        put(
            "pilot_grpc_address",
            json!(format!(
                "{{\"address\": \"{host}\", \"port_value\": {port}}}"
            )),
        );
    }
    if let Some(san) = pilot_san {
        put("pilot_SAN", san);
    }
    put(
        "xds_type",
        json!(if config.delta_xds {
            "DELTA_GRPC"
        } else {
            "GRPC"
        }),
    );
    if !config.xds_root_ca.is_empty() {
        put("xds_root_cert", json!(config.xds_root_ca));
    }
    put("localhost", json!(fam.localhost));
    put("wildcard", json!(fam.wildcard));
    put("dns_lookup_family", json!(fam.lookup));
    if fam.lookup == "ALL" {
        let (l, w) = if fam.localhost == "::1" {
            ("127.0.0.1", "0.0.0.0")
        } else {
            ("::1", "::")
        };
        put("additional_localhost", json!(l));
        put("additional_wildcard", json!(w));
        put("dual_stack", json!(true));
    }
    put("envoy_status_port", json!(config.envoy_status_port));
    put("envoy_prometheus_port", json!(config.envoy_prometheus_port));
    put(
        "global_downstream_max_connections",
        json!(global_downstream_max_connections(config)),
    );
    if config
        .env
        .get("ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL")
        .and_then(|v| parse_bool(v))
        .unwrap_or(false)
    {
        put("envoy_status_port_enable_proxy_protocol", json!(true));
    }
    let metrics_local = config.metrics_localhost_only
        || proxy
            .proxy_metadata
            .get("METRICS_LOCALHOST_ACCESS_ONLY")
            .and_then(|v| parse_bool(v))
            .unwrap_or(false);
    if metrics_local {
        put("metrics_localhost_access_only", json!(true));
    }
    put(
        "workload_identity_socket_file",
        json!(config.workload_identity_socket_file),
    );
    if config.flags.log_as_json {
        put("log_json", json!(true));
    }
    if !config.flags.outlier_log_path.is_empty() {
        put("outlier_log_path", json!(config.flags.outlier_log_path));
    }
    if config.flags.sts_port > 0 {
        put("sts", json!(true));
        put("sts_port", json!(config.flags.sts_port));
    }
    let (prefixes, suffixes, regexps) = inclusion_lists(config);
    put("inclusionPrefix", json!(prefixes));
    put("inclusionSuffix", json!(suffixes));
    put("inclusionRegexps", json!(regexps));
    Ok(Value::Object(d))
}

/// What Envoy is started with.
#[derive(Debug, Clone)]
pub struct Written {
    pub path: PathBuf,
    /// Whether the agent created the file (and so deletes it when Envoy exits).
    pub generated: bool,
}

/// Writes the bootstrap for Envoy: `customConfigFile` as is, or a template (`ISTIO_BOOTSTRAP` >
/// `--templateFile`), or the built-in bootstrap, into `<configPath>/envoy-rev.json`.
pub fn write(config: &Config, ports: Ports, out: Option<&Path>) -> Result<Written, Error> {
    if !config.proxy.custom_config_file.is_empty() && out.is_none() {
        return Ok(Written {
            path: config.path(&config.proxy.custom_config_file),
            generated: false,
        });
    }
    let template = if !config.istio_bootstrap.is_empty() {
        Some(config.path(&config.istio_bootstrap))
    } else if !config.flags.template_file.is_empty() {
        Some(config.path(&config.flags.template_file))
    } else if !config.proxy.proxy_bootstrap_template_path.is_empty() {
        Some(config.path(&config.proxy.proxy_bootstrap_template_path))
    } else {
        None
    };
    let (text, ext) = match template {
        Some(t) => {
            let text = std::fs::read_to_string(&t).map_err(|source| Error::Template {
                path: t.clone(),
                source,
            })?;
            let name = t.to_string_lossy();
            let ext = if name.ends_with(".yaml") || name.ends_with(".yaml.tmpl") {
                "yaml"
            } else {
                "json"
            };
            let data = template_data(config, ports)?;
            let rendered = template::render(&text, &data).map_err(|source| Error::Render {
                path: t.clone(),
                source,
            })?;
            (rendered, ext)
        }
        None => {
            let v = render(config, ports)?;
            (serde_json::to_string_pretty(&v).unwrap_or_default(), "json")
        }
    };
    let path = match out {
        Some(p) => p.to_path_buf(),
        None => config
            .path(&config.proxy.config_path)
            .join(format!("envoy-rev.{ext}")),
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| Error::Write {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    std::fs::write(&path, text).map_err(|source| Error::Write {
        path: path.clone(),
        source,
    })?;
    Ok(Written {
        path,
        generated: true,
    })
}

/// Writes the gRPC xDS bootstrap (`GRPC_XDS_BOOTSTRAP`) for proxyless clients.
pub fn write_grpc_bootstrap(config: &Config) -> Result<PathBuf, Error> {
    let mut meta = node_metadata(config)?;
    meta.insert("GENERATOR".into(), json!("grpc"));
    let xds = config.xds_socket();
    let mut doc = json!({
        "xds_servers": [{
            "server_uri": format!("unix:///{}", xds.display().to_string().trim_start_matches('/')),
            "channel_creds": [{ "type": "insecure" }],
            "server_features": ["xds_v3"]
        }],
        "node": { "id": config.node_id(), "metadata": meta, "locality": {} },
        "server_listener_resource_name_template": "xds.istio.io/grpc/lds/inbound/%s"
    });
    if !config.output_certs.is_empty() {
        let dir = config.path(&config.output_certs);
        doc["certificate_providers"] = json!({
            "default": {
                "plugin_name": "file_watcher",
                "config": {
                    "certificate_file": dir.join("cert-chain.pem"),
                    "private_key_file": dir.join("key.pem"),
                    "ca_certificate_file": dir.join("root-cert.pem"),
                    "refresh_interval": "900s"
                }
            }
        });
    }
    let path = config.path(&config.grpc_xds_bootstrap);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| Error::Write {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(&doc).unwrap_or_default())
        .and_then(|_| std::fs::rename(&tmp, &path))
        .map_err(|source| Error::Write {
            path: path.clone(),
            source,
        })?;
    Ok(path)
}

/// Whether this node type drains only inbound listeners.
pub fn inbound_only(node_type: NodeType) -> bool {
    node_type == NodeType::Sidecar
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Inputs, ProxyFlags};
    use std::collections::HashMap;

    fn config(dir: &Path, pairs: &[(&str, &str)]) -> Config {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::load(Inputs {
            node_type: NodeType::Sidecar,
            flags: ProxyFlags {
                domain: "ns1.svc.cluster.local".into(),
                ..ProxyFlags::default()
            },
            env: &env,
            base_dir: dir.to_path_buf(),
            interface_ips: vec![],
        })
        .unwrap()
    }

    /// Writes one downward-API pod file (`labels`, `annotations`) under `<dir>/etc/istio/pod`.
    fn write_pod_info(dir: &Path, name: &str, text: &str) {
        let pod = dir.join("etc/istio/pod");
        std::fs::create_dir_all(&pod).unwrap();
        std::fs::write(pod.join(name), text).unwrap();
    }

    fn patterns(c: &Config) -> Vec<String> {
        stats_matcher(c)["inclusion_list"]["patterns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let (kind, v) = p.as_object().unwrap().iter().next().unwrap();
                let v = if kind == "safe_regex" { &v["regex"] } else { v };
                format!("{kind}:{}", v.as_str().unwrap())
            })
            .collect()
    }

    const REQUIRED_PREFIXES: [&str; 5] = [
        "prefix:cluster_manager",
        "prefix:listener_manager",
        "prefix:server",
        "prefix:cluster.xds-grpc",
        "prefix:wasm",
    ];
    const REQUIRED_SUFFIXES: [&str; 4] = [
        "suffix:rbac.allowed",
        "suffix:rbac.denied",
        "suffix:shadow_allowed",
        "suffix:shadow_denied",
    ];

    /// Istio's `stats_matcher`: ProxyConfig's `proxyStatsMatcher` lists go before the required
    /// entries of each kind, `{pod_ip}` is expanded per instance IP, and a pod annotation
    /// replaces the matching ProxyConfig list.
    #[test]
    fn proxy_stats_matcher_extends_the_inclusion_list() {
        let dir = tempfile::tempdir().unwrap();
        let base = [
            ("POD_NAME", "p"),
            ("POD_NAMESPACE", "ns1"),
            ("INSTANCE_IP", "198.18.0.2"),
        ];
        let mut expected: Vec<String> = vec!["prefix:reporter=".into()];
        expected.extend(REQUIRED_PREFIXES.iter().map(|s| s.to_string()));
        expected.extend(REQUIRED_SUFFIXES.iter().map(|s| s.to_string()));
        expected.push(r"safe_regex:vhost\..*\.route\..*".into());
        expected.extend(["prefix:component".into(), "prefix:istio".into()]);
        assert_eq!(patterns(&config(dir.path(), &base)), expected, "defaults");

        let pc = r#"{"proxyStatsMatcher":{"inclusionPrefixes":["upstream_cx","http.{pod_ip}_"],"inclusionSuffixes":["upstream_rq_timeout"],"inclusionRegexps":[".*outlier_detection.*"]}}"#;
        let mut env = base.to_vec();
        env.push(("PROXY_CONFIG", pc));
        let mut expected: Vec<String> = [
            "prefix:reporter=",
            "prefix:upstream_cx",
            "prefix:http.198.18.0.2_",
        ]
        .map(String::from)
        .to_vec();
        expected.extend(REQUIRED_PREFIXES.iter().map(|s| s.to_string()));
        expected.push("suffix:upstream_rq_timeout".into());
        expected.extend(REQUIRED_SUFFIXES.iter().map(|s| s.to_string()));
        expected.push("safe_regex:.*outlier_detection.*".into());
        expected.push(r"safe_regex:vhost\..*\.route\..*".into());
        expected.extend(["prefix:component".into(), "prefix:istio".into()]);
        assert_eq!(patterns(&config(dir.path(), &env)), expected, "ProxyConfig");

        // The annotation replaces ProxyConfig's prefixes (a stray comma adds nothing); the
        // suffixes and regexps still come from ProxyConfig.
        write_pod_info(
            dir.path(),
            "annotations",
            "sidecar.istio.io/statsInclusionPrefixes=\"a.,,b.\"\n",
        );
        let got = patterns(&config(dir.path(), &env));
        assert_eq!(
            got[..4],
            [
                "prefix:reporter=",
                "prefix:a.",
                "prefix:b.",
                "prefix:cluster_manager"
            ]
        );
        assert!(
            got.contains(&"suffix:upstream_rq_timeout".to_string()),
            "{got:?}"
        );
        assert!(!got.iter().any(|p| p.contains("upstream_cx")), "{got:?}");
    }

    #[test]
    fn bootstrap_has_istio_shape() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(
            dir.path(),
            &[
                ("POD_NAME", "p"),
                ("POD_NAMESPACE", "ns1"),
                ("INSTANCE_IP", "198.18.0.2"),
                ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
                ("ISTIO_METAJSON_LABELS", r#"{"app":"web"}"#),
                ("SERVICE_ACCOUNT", "sa"),
            ],
        );
        let b = render(&c, Ports { status: 15020 }).unwrap();
        assert_eq!(
            b["node"]["id"],
            "sidecar~198.18.0.2~p.ns1~ns1.svc.cluster.local"
        );
        assert_eq!(b["node"]["cluster"], "istio-proxy.ns1");
        let meta = &b["node"]["metadata"];
        assert_eq!(meta["CLUSTER_ID"], "Kubernetes");
        assert_eq!(meta["LABELS"]["app"], "web");
        assert_eq!(meta["INSTANCE_IPS"], "198.18.0.2");
        assert_eq!(meta["ENVOY_STATUS_PORT"], 15021);
        assert_eq!(meta["PILOT_SAN"][0], "istiod.istio-system.svc");
        assert_eq!(
            b["dynamic_resources"]["ads_config"]["api_type"],
            "DELTA_GRPC"
        );
        let clusters = b["static_resources"]["clusters"].as_array().unwrap();
        let names: Vec<&str> = clusters
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["prometheus_stats", "agent", "sds-grpc", "xds-grpc"]);
        assert_eq!(
            clusters[3]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
                ["pipe"]["path"],
            "./etc/istio/proxy/XDS"
        );
        let listeners = b["static_resources"]["listeners"].as_array().unwrap();
        assert_eq!(listeners[0]["name"], "0.0.0.0_15090");
        assert_eq!(listeners[1]["name"], "0.0.0.0_15021");
        assert_eq!(b["admin"]["address"]["socket_address"]["port_value"], 15000);

        let sotw = config(dir.path(), &[("ISTIO_DELTA_XDS", "false")]);
        assert_eq!(
            render(&sotw, Ports { status: 1 }).unwrap()["dynamic_resources"]["ads_config"]["api_type"],
            "GRPC"
        );
    }

    #[test]
    fn bad_metajson_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path(), &[("ISTIO_METAJSON_FOO", "[1]")]);
        let err = render(&c, Ports { status: 1 }).unwrap_err().to_string();
        assert!(err.contains("ISTIO_METAJSON_FOO"), "{err}");
    }

    #[test]
    fn template_and_custom_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("t.json"),
            r#"{"id":"{{ .nodeID }}","p":{{ .config.StatusPort }},"x":"{{ .unknown }}"}"#,
        )
        .unwrap();
        let c = config(
            dir.path(),
            &[("ISTIO_BOOTSTRAP", "t.json"), ("POD_NAMESPACE", "n")],
        );
        let w = write(&c, Ports { status: 123 }, None).unwrap();
        assert!(w.generated);
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&w.path).unwrap()).unwrap();
        assert_eq!(v["p"], 123);
        // Go's default for a missing key (Istio sets no `missingkey` option).
        assert_eq!(v["x"], "<no value>");
        assert!(v["id"].as_str().unwrap().starts_with("sidecar~"));

        let c = config(
            dir.path(),
            &[("PROXY_CONFIG", "customConfigFile: /x/custom.json")],
        );
        let w = write(&c, Ports { status: 1 }, None).unwrap();
        assert_eq!(w.path, PathBuf::from("/x/custom.json"));
        assert!(!w.generated);
    }

    /// The structured data model: nested `config`, Istio's JSON-text keys, lists and the
    /// keys that are absent unless set.
    #[test]
    fn template_data_has_istio_keys() {
        let dir = tempfile::tempdir().unwrap();
        write_pod_info(
            dir.path(),
            "labels",
            "topology.istio.io/locality=\"us-east1.us-east1-b.rack1\"\n",
        );
        let c = config(
            dir.path(),
            &[
                ("POD_NAME", "p"),
                ("POD_NAMESPACE", "ns1"),
                ("INSTANCE_IP", "198.18.0.2"),
                ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
            ],
        );
        let d = template_data(&c, Ports { status: 15020 }).unwrap();
        assert_eq!(d["nodeType"], "sidecar");
        assert_eq!(
            d["nodeID"],
            "sidecar~198.18.0.2~p.ns1~ns1.svc.cluster.local"
        );
        assert_eq!(d["cluster"], "istio-proxy.ns1");
        assert_eq!(
            (&d["region"], &d["zone"], &d["sub_zone"]),
            (&json!("us-east1"), &json!("us-east1-b"), &json!("rack1"))
        );
        let meta: Value = serde_json::from_str(d["meta_json_str"].as_str().unwrap()).unwrap();
        assert_eq!(meta["CLUSTER_ID"], "Kubernetes");
        let flags: Value = serde_json::from_str(d["runtime_flags"].as_str().unwrap()).unwrap();
        assert_eq!(flags["re2.max_program_size.error_level"], "32768");
        assert_eq!(d["config"]["ProxyAdminPort"], 15000);
        assert_eq!(d["config"]["StatusPort"], 15020);
        assert_eq!(d["config"]["ConfigPath"], "./etc/istio/proxy");
        assert_eq!(
            d["config"]["DiscoveryAddress"],
            "istiod.istio-system.svc:15012"
        );
        assert_eq!(d["discovery_host"], "istiod.istio-system.svc");
        let grpc: Value = serde_json::from_str(d["pilot_grpc_address"].as_str().unwrap()).unwrap();
        assert_eq!(
            grpc,
            json!({"address": "istiod.istio-system.svc", "port_value": 15012})
        );
        assert_eq!(d["pilot_SAN"], json!(["istiod.istio-system.svc"]));
        assert_eq!(d["xds_type"], "DELTA_GRPC");
        assert_eq!(
            (&d["localhost"], &d["wildcard"], &d["dns_lookup_family"]),
            (&json!("127.0.0.1"), &json!("0.0.0.0"), &json!("V4_ONLY"))
        );
        assert_eq!(d["envoy_status_port"], 15021);
        assert_eq!(d["envoy_prometheus_port"], 15090);
        assert_eq!(d["global_downstream_max_connections"], i32::MAX);
        assert_eq!(d["workload_identity_socket_file"], "socket");
        assert_eq!(d["inclusionPrefix"][0], "cluster_manager");
        assert_eq!(d["inclusionSuffix"][0], "rbac.allowed");
        assert_eq!(d["inclusionRegexps"], json!([r"vhost\..*\.route\..*"]));
        for absent in [
            "outlier_log_path",
            "sts",
            "log_json",
            "additional_localhost",
        ] {
            assert!(d.get(absent).is_none(), "{absent}");
        }
    }

    /// A realistic Istio-style template (if/else, range, toJSON, nested `.config`) renders to
    /// JSON that carries the data model (real Envoy validates it in tests/tests/agent.rs).
    #[test]
    fn istio_style_template_renders_json() {
        let text = include_str!("../testdata/istio_style_bootstrap_tmpl.json");
        let dir = tempfile::tempdir().unwrap();
        let pc = r#"{"proxyStatsMatcher":{"inclusionPrefixes":["upstream_cx"]}}"#;
        let c = config(
            dir.path(),
            &[
                ("POD_NAME", "p"),
                ("POD_NAMESPACE", "ns1"),
                ("INSTANCE_IP", "198.18.0.2"),
                ("PROXY_CONFIG", pc),
            ],
        );
        let data = template_data(&c, Ports { status: 15020 }).unwrap();
        let out = template::render(text, &data).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}:\n{out}"));
        assert_eq!(v["node"]["id"], data["nodeID"]);
        assert_eq!(v["node"]["locality"], json!({}));
        assert_eq!(v["admin"]["address"]["socket_address"]["port_value"], 15000);
        assert_eq!(
            v["layered_runtime"]["layers"][0]["static_layer"]["re2.max_program_size.error_level"],
            "32768"
        );
        let patterns = v["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"]
            .as_array()
            .unwrap();
        assert_eq!(patterns[1], json!({"prefix": "upstream_cx"}));
        assert!(patterns.contains(&json!({"safe_regex": {"regex": r"vhost\..*\.route\..*"}})));
        let clusters = v["static_resources"]["clusters"].as_array().unwrap();
        assert_eq!(
            clusters[4]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
                ["socket_address"]["port_value"],
            15012
        );
        assert_eq!(
            v["static_resources"]["listeners"][1]["name"],
            "0.0.0.0_15021"
        );
        assert!(v.get("cluster_manager").is_none());
        assert!(v["application_log_config"]["log_format"]["text_format"].is_string());
    }

    #[test]
    fn grpc_bootstrap_written() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path(), &[("OUTPUT_CERTS", "./out")]);
        let p = write_grpc_bootstrap(&c).unwrap();
        let v: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        assert_eq!(v["node"]["metadata"]["GENERATOR"], "grpc");
        assert!(v["certificate_providers"]["default"].is_object());
    }
}
