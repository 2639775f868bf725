//! The data a bootstrap template (`ISTIO_BOOTSTRAP`, `--templateFile`, Istio's own
//! `envoy_bootstrap_tmpl.json`) is rendered with: Istio's template parameters, each in the form
//! Istio gives it. `meta_json_str`, `runtime_flags`, the telemetry addresses and TLS sockets are
//! JSON text to embed as is; optional keys are absent unless set; `config` is ProxyConfig with
//! Go field names (`StatusPort` is the bound status port).

use serde_json::{Map, Value, json};

use super::options::Options;
use super::stats::proto_duration;
use super::telemetry::{Address, Tracer};
use crate::config::{AuthPolicy, Config, split_host_port};

/// The pod annotation Istio 1.28 reads for Envoy's stats compression.
const STATS_COMPRESSION_ANNOTATION: &str = "sidecar.istio.io/statsCompression";

fn text(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// `config`: the ProxyConfig fields templates read, under their Go names.
fn proxy_config(config: &Config, o: &Options) -> Value {
    let proxy = &config.proxy;
    let mut pc = json!({
        "ConfigPath": proxy.config_path,
        "BinaryPath": proxy.binary_path,
        "ServiceCluster": proxy.service_cluster,
        "DrainDuration": format!("{}s", proxy.drain_duration.as_secs_f64()),
        "TerminationDrainDuration": format!("{}s", proxy.termination_drain_duration.as_secs_f64()),
        "DiscoveryAddress": proxy.discovery_address,
        "ProxyAdminPort": proxy.proxy_admin_port,
        "StatusPort": o.status_port,
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
    pc
}

/// Builds the template data.
pub fn template_data(config: &Config, o: &Options) -> Value {
    let mut d = Map::new();
    for section in [node, discovery, family, ports, files, stats, telemetry] {
        section(&mut d, config, o);
    }
    Value::Object(d)
}

/// The node: its type, id, cluster, locality, metadata (as an object and as JSON text), the
/// runtime flags and `config`.
fn node(d: &mut Map<String, Value>, config: &Config, o: &Options) {
    let mut put = |k: &str, v: Value| {
        d.insert(k.to_string(), v);
    };
    put(
        "nodeType",
        json!(o.node_id.split('~').next().unwrap_or_default()),
    );
    put("nodeID", json!(o.node_id));
    put("cluster", json!(o.cluster));
    for (k, v) in o.locality.to_json() {
        put(&k, v);
    }
    put(
        "meta_json_str",
        json!(text(&Value::Object(o.metadata.clone()))),
    );
    put("metadata", Value::Object(o.metadata.clone()));
    put(
        "runtime_flags",
        json!(text(&Value::Object(o.runtime_flags.clone()))),
    );
    put("config", proxy_config(config, o));
}

/// Where istiod is and how it is trusted.
fn discovery(d: &mut Map<String, Value>, config: &Config, o: &Options) {
    let proxy = &config.proxy;
    let mut put = |k: &str, v: Value| {
        d.insert(k.to_string(), v);
    };
    if !proxy.discovery_address.is_empty() {
        put("discovery_address", json!(proxy.discovery_address));
    }
    if let Some((host, port)) = split_host_port(&proxy.discovery_address) {
        put("discovery_host", json!(host));
        put(
            "pilot_grpc_address",
            json!(Address { host, port }.template_text()),
        );
    }
    if let Some(san) = o.metadata.get("PILOT_SAN") {
        put("pilot_SAN", san.clone());
    }
    put("xds_type", json!(o.xds_type));
    if !config.bootstrap.xds_root_ca.is_empty() {
        put("xds_root_cert", json!(config.bootstrap.xds_root_ca));
    }
}

/// The address family's loopback and wildcard addresses, and metadata discovery.
fn family(d: &mut Map<String, Value>, _: &Config, o: &Options) {
    let mut put = |k: &str, v: Value| {
        d.insert(k.to_string(), v);
    };
    put("metadata_discovery", json!(o.metadata_discovery));
    put("localhost", json!(o.family.localhost));
    put("wildcard", json!(o.family.wildcard));
    put("dns_lookup_family", json!(o.family.lookup));
    if let Some((l, w)) = o.family.additional {
        put("additional_localhost", json!(l));
        put("additional_wildcard", json!(w));
        put("dual_stack", json!(true));
    }
}

/// The ports Envoy serves and their switches.
fn ports(d: &mut Map<String, Value>, config: &Config, o: &Options) {
    let mut put = |k: &str, v: Value| {
        d.insert(k.to_string(), v);
    };
    put("envoy_status_port", json!(o.envoy_status_port));
    put("envoy_prometheus_port", json!(o.envoy_prometheus_port));
    if o.secure_metrics_port > 0 {
        put("secure_metrics_port", json!(o.secure_metrics_port));
    }
    if o.secure_merged_metrics_port > 0 {
        put(
            "secure_merged_metrics_port",
            json!(o.secure_merged_metrics_port),
        );
    }
    put(
        "global_downstream_max_connections",
        json!(o.global_downstream_max_connections),
    );
    if o.status_proxy_protocol {
        put("envoy_status_port_enable_proxy_protocol", json!(true));
    }
    if o.metrics_localhost_only {
        put("metrics_localhost_access_only", json!(true));
    }
    put(
        "envoy_metrics_stats_compression",
        json!(o.stats_compression),
    );
    // Istio 1.28's template reads the pod's `sidecar.istio.io/statsCompression` annotation as
    // `stats_compression` (1.28's agent passes gzip, zstd or brotli, and drops anything else);
    // master's reads `envoy_metrics_stats_compression` above instead.
    if let Some(c) = config
        .node
        .pod_annotations
        .get(STATS_COMPRESSION_ANNOTATION)
        .filter(|c| ["gzip", "zstd", "brotli"].contains(&c.as_str()))
    {
        put("stats_compression", json!(c));
    }
}

/// The workload socket, the files Envoy writes, load reporting, self-discovery, STS and the
/// GCP project.
fn files(d: &mut Map<String, Value>, config: &Config, o: &Options) {
    let mut put = |k: &str, v: Value| {
        d.insert(k.to_string(), v);
    };
    put(
        "workload_identity_socket_file",
        json!(o.workload_identity_socket_file),
    );
    if let Some(path) = &o.custom_file_path {
        put("custom_file_path", json!(path));
    }
    if o.log_json {
        put("log_json", json!(true));
    }
    if !o.outlier_log_path.is_empty() {
        put("outlier_log_path", json!(o.outlier_log_path));
    }
    if let Some(lrs) = &o.load_stats_config {
        put("load_stats_config_json_str", json!(lrs));
    }
    if o.enable_self_discovery {
        put("enable_self_discovery", json!(true));
    }
    if config.flags.sts_port > 0 {
        put("sts", json!(true));
        put("sts_port", json!(config.flags.sts_port));
        if let Some(project) = super::telemetry::gcp_project(&o.metadata) {
            put("gcp_project_id", json!(project));
        }
    }
    // The GCP platform's project number, for the template (as Istio's).
    if let Some(number) = super::telemetry::platform_value(&o.metadata, "gcp_project_number") {
        put("gcp_project_number", json!(number));
    }
}

/// The stats inclusions, tags, buckets and intervals.
fn stats(d: &mut Map<String, Value>, _: &Config, o: &Options) {
    let mut put = |k: &str, v: Value| {
        d.insert(k.to_string(), v);
    };
    let s = &o.stats;
    for (key, list) in [
        ("inclusionPrefix", &s.inclusion_prefixes),
        ("inclusionSuffix", &s.inclusion_suffixes),
        ("inclusionRegexps", &s.inclusion_regexps),
        ("extraStatTags", &s.extra_tags),
    ] {
        if !list.is_empty() {
            put(key, json!(list));
        }
    }
    if !s.histogram_buckets.is_empty() {
        put("histogram_buckets", super::stats::histogram_buckets(s));
    }
    // Protobuf JSON durations (`60s`, `0.5s`), which the template puts in the bootstrap as they
    // are: Go's `1m0s` or `500ms` (what Istio's agent writes, release-1.31 included) are not
    // valid there.
    if let Some(f) = s.flush_interval {
        put("stats_flush_interval", json!(proto_duration(f)));
    }
    if let Some(e) = s.eviction_interval {
        put("stats_eviction_interval", json!(proto_duration(e)));
    }
}

/// The tracer, statsd and the metrics and access-log services.
fn telemetry(d: &mut Map<String, Value>, _: &Config, o: &Options) {
    let mut put = |k: &str, v: Value| {
        d.insert(k.to_string(), v);
    };
    let t = &o.telemetry;
    match &t.tracer {
        Some(Tracer::Zipkin(a)) => put("zipkin", json!(a.template_text())),
        Some(Tracer::Datadog(a)) => put("datadog", json!(a.template_text())),
        Some(Tracer::Lightstep { address, .. }) => {
            put("lightstep", json!(address.template_text()));
            put(
                "lightstepToken",
                json!(o.lightstep_token_path.clone().unwrap_or_default()),
            );
        }
        Some(Tracer::Stackdriver {
            project_id,
            debug,
            max_annotations,
            max_attributes,
            max_events,
        }) => {
            put("stackdriver", json!(true));
            put("stackdriverProjectID", json!(project_id));
            put("gcp_project_id", json!(project_id));
            put("stackdriverDebug", json!(debug));
            put("stackdriverMaxAnnotations", json!(max_annotations));
            put("stackdriverMaxAttributes", json!(max_attributes));
            put("stackdriverMaxEvents", json!(max_events));
        }
        None => {}
    }
    if let Some(tls) = &t.tracing_tls {
        put(
            "tracing_tls",
            json!(tls.as_ref().map(text).unwrap_or_default()),
        );
    }
    if let Some(a) = &t.statsd {
        put("statsd", json!(a.template_text()));
    }
    for (prefix, service) in [
        ("envoy_metrics_service", &t.metrics_service),
        ("envoy_accesslog_service", &t.access_log_service),
    ] {
        let Some(s) = service else { continue };
        put(
            &format!("{prefix}_address"),
            json!(s.address.template_text()),
        );
        if let Some(tls) = &s.tls {
            put(&format!("{prefix}_tls"), json!(text(tls)));
        }
        if let Some(k) = &s.keepalive {
            put(&format!("{prefix}_tcp_keepalive"), json!(text(k)));
        }
    }
}
