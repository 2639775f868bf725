//! The built-in bootstrap's static clusters: `prometheus_stats`, `agent`, `sds-grpc`,
//! `xds-grpc`, then the tracer's, the metrics service's, the access-log service's and
//! `local_cluster` (self discovery), as Istio's template lays them out.

use serde_json::{Value, json};

use super::options::Options;
use super::telemetry::{Address, Service, Tracer};

fn h2_options() -> Value {
    json!({
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": { "http2_protocol_options": {} }
        }
    })
}

fn load_assignment(name: &str, address: Value) -> Value {
    json!({
        "cluster_name": name,
        "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": address } }] }]
    })
}

fn static_cluster(name: &str, address: Value, timeout: &str) -> Value {
    json!({
        "name": name,
        "alt_stat_name": format!("{name};"),
        "type": "STATIC",
        "connect_timeout": timeout,
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": load_assignment(name, address)
    })
}

/// `{"socket_address": {TCP, addr, port}}`.
pub fn tcp(addr: &str, port: u16) -> Value {
    json!({ "socket_address": { "protocol": "TCP", "address": addr, "port_value": port } })
}

/// A `STRICT_DNS` cluster to a telemetry backend.
fn dns_cluster(o: &Options, name: &str, address: &Address) -> Value {
    json!({
        "name": name,
        "alt_stat_name": format!("{name};"),
        "type": "STRICT_DNS",
        "respect_dns_ttl": true,
        "dns_lookup_family": o.family.lookup,
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": load_assignment(name, json!({ "socket_address": address.socket_address() }))
    })
}

fn tracer_cluster(o: &Options) -> Option<Value> {
    let tls = o.telemetry.tracing_tls.clone().flatten();
    let mut c = match o.telemetry.tracer.as_ref()? {
        Tracer::Zipkin(a) => {
            let mut c = dns_cluster(o, "zipkin", a);
            c["dns_refresh_rate"] = json!("30s");
            c
        }
        Tracer::Lightstep { address, .. } => {
            let mut c = dns_cluster(o, "lightstep", address);
            c["typed_extension_protocol_options"] = h2_options();
            c
        }
        Tracer::Datadog(a) => dns_cluster(o, "datadog_agent", a),
        Tracer::Stackdriver { .. } => return None,
    };
    if let Some(tls) = tls {
        c["transport_socket"] = tls;
    }
    Some(c)
}

fn service_cluster(o: &Options, name: &str, s: &Service) -> Value {
    let mut c = dns_cluster(o, name, &s.address);
    c["typed_extension_protocol_options"] = h2_options();
    if let Some(tls) = &s.tls {
        c["transport_socket"] = tls.clone();
    }
    if let Some(k) = &s.keepalive {
        c["upstream_connection_options"] = k.clone();
    }
    c
}

/// Every static cluster, in Istio's order.
pub fn clusters(o: &Options) -> Vec<Value> {
    let localhost = o.family.localhost;
    let mut sds = static_cluster(
        "sds-grpc",
        json!({ "pipe": { "path": format!("./var/run/secrets/workload-spiffe-uds/{}", o.workload_identity_socket_file) } }),
        "1s",
    );
    sds["typed_extension_protocol_options"] = h2_options();
    let mut xds = static_cluster(
        "xds-grpc",
        json!({ "pipe": { "path": format!("{}/XDS", o.config_path) } }),
        "1s",
    );
    let thresholds = |p: &str| json!({ "priority": p, "max_connections": 100000, "max_pending_requests": 100000, "max_requests": 100000 });
    xds["circuit_breakers"] = json!({ "thresholds": [thresholds("DEFAULT"), thresholds("HIGH")] });
    xds["upstream_connection_options"] = json!({ "tcp_keepalive": { "keepalive_time": 300 } });
    xds["max_requests_per_connection"] = json!(1);
    xds["typed_extension_protocol_options"] = h2_options();
    let mut out = vec![
        static_cluster("prometheus_stats", tcp(localhost, o.admin_port), "0.250s"),
        static_cluster("agent", tcp(localhost, o.status_port), "0.250s"),
        sds,
    ];
    if let Some(path) = &o.custom_file_path {
        let mut files = static_cluster("sds-files-grpc", json!({ "pipe": { "path": path } }), "1s");
        files["typed_extension_protocol_options"] = h2_options();
        out.push(files);
    }
    out.push(xds);
    out.extend(tracer_cluster(o));
    if let Some(s) = &o.telemetry.metrics_service {
        out.push(service_cluster(o, "envoy_metrics_service", s));
    }
    if let Some(s) = &o.telemetry.access_log_service {
        out.push(service_cluster(o, "envoy_accesslog_service", s));
    }
    if o.enable_self_discovery {
        out.push(json!({
            "name": "local_cluster",
            "alt_stat_name": "local_cluster;",
            "type": "EDS",
            "connect_timeout": "1s",
            "load_balancing_policy": {
                "policies": [{
                    "typed_extension_config": {
                        "name": "envoy.load_balancing_policies.least_request",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest",
                            "locality_lb_config": { "zone_aware_lb_config": { "min_cluster_size": "1" } }
                        }
                    }
                }]
            },
            "eds_cluster_config": {
                "eds_config": { "ads": {}, "resource_api_version": "V3" },
                "service_name": "local_cluster"
            }
        }));
    }
    out
}
