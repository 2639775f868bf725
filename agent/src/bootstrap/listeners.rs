//! The built-in bootstrap's static listeners: Prometheus stats on 15090 (with the stats
//! compressors), the optional mTLS metrics ports (15091: Envoy's stats, 15092: the merged
//! metrics) and the health port 15021.

use serde_json::{Value, json};

use super::clusters::tcp;
use super::options::Options;
use super::telemetry::sds_secret;

fn router() -> Value {
    json!({
        "name": "envoy.filters.http.router",
        "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" }
    })
}

/// One HTTP connection manager routing each `(prefix, cluster)`.
fn http_manager(stat_prefix: &str, routes: &[(&str, &str)], http_filters: Vec<Value>) -> Value {
    let routes: Vec<Value> = routes
        .iter()
        .map(|(p, c)| json!({ "match": { "prefix": p }, "route": { "cluster": c } }))
        .collect();
    json!({
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "codec_type": "AUTO",
            "stat_prefix": stat_prefix,
            "route_config": {
                "virtual_hosts": [{ "name": "backend", "domains": ["*"], "routes": routes }]
            },
            "http_filters": http_filters
        }
    })
}

fn listener(o: &Options, addr: &str, extra: Option<&str>, port: u16) -> Value {
    let mut l = json!({
        "name": format!("{addr}_{port}"),
        "address": tcp(addr, port),
        "ignore_global_conn_limit": true,
        "bypass_overload_manager": true,
    });
    if o.family.additional.is_some()
        && let Some(extra) = extra
    {
        l["additional_addresses"] = json!([{ "address": tcp(extra, port) }]);
    }
    l
}

/// The stats compressors Istio puts in front of the router on 15090.
fn compressors() -> Vec<Value> {
    ["brotli", "zstd", "gzip"]
        .iter()
        .map(|name| {
            let library = match *name {
                "brotli" => "type.googleapis.com/envoy.extensions.compression.brotli.compressor.v3.Brotli",
                "zstd" => "type.googleapis.com/envoy.extensions.compression.zstd.compressor.v3.Zstd",
                _ => "type.googleapis.com/envoy.extensions.compression.gzip.compressor.v3.Gzip",
            };
            json!({
                "name": format!("envoy.filters.http.compressor.{name}"),
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor",
                    "compressor_library": { "name": format!("stats_{name}"), "typed_config": { "@type": library } },
                    "response_direction_config": {
                        "common_config": {
                            "content_type": [
                                "text/plain",
                                "application/vnd.google.protobuf",
                                "application/openmetrics-text",
                                "application/openmetrics-protobuf"
                            ]
                        }
                    }
                }
            })
        })
        .collect()
}

/// An mTLS metrics listener on the wildcard address: client certificates required, the
/// workload's `default` certificate and `ROOTCA` from our SDS server.
fn secure_metrics(o: &Options, port: u16, stat_prefix: &str, routes: &[(&str, &str)]) -> Value {
    let mut l = listener(o, o.family.wildcard, None, port);
    l["listener_filters"] = json!([{
        "name": "envoy.filters.listener.tls_inspector",
        "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector" }
    }]);
    l["filter_chains"] = json!([{
        "filter_chain_match": { "transport_protocol": "tls" },
        "transport_socket": {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                "require_client_certificate": true,
                "common_tls_context": {
                    "tls_certificate_sds_secret_configs": [sds_secret(sds::WORKLOAD_KEY_CERT)],
                    "combined_validation_context": {
                        "default_validation_context": {},
                        "validation_context_sds_secret_config": sds_secret(sds::ROOT_CA)
                    }
                }
            }
        },
        "filters": [http_manager(stat_prefix, routes, vec![router()])]
    }]);
    l
}

/// Every static listener, in Istio's order.
pub fn listeners(o: &Options) -> Vec<Value> {
    let fam = o.family;
    let (prom, prom_extra) = if o.metrics_localhost_only {
        (fam.localhost, fam.additional.map(|a| a.0))
    } else {
        (fam.wildcard, fam.additional.map(|a| a.1))
    };
    let mut filters = if o.stats_compression {
        compressors()
    } else {
        Vec::new()
    };
    filters.push(router());
    let mut stats = listener(o, prom, prom_extra, o.envoy_prometheus_port);
    stats["filter_chains"] = json!([{
        "filters": [http_manager("stats", &[("/stats/prometheus", "prometheus_stats")], filters)]
    }]);
    let mut out = vec![stats];
    if o.secure_metrics_port > 0 {
        out.push(secure_metrics(
            o,
            o.secure_metrics_port,
            "secure_stats",
            &[("/stats/prometheus", "prometheus_stats")],
        ));
    }
    if o.secure_merged_metrics_port > 0 {
        out.push(secure_metrics(
            o,
            o.secure_merged_metrics_port,
            "secure_merged_stats",
            &[("/stats/prometheus", "agent"), ("/metrics", "agent")],
        ));
    }
    let mut status = listener(
        o,
        fam.wildcard,
        fam.additional.map(|a| a.1),
        o.envoy_status_port,
    );
    if o.status_proxy_protocol {
        status["listener_filters"] = json!([{
            "name": "envoy.listener.proxy_protocol",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.listener.proxy_protocol.v3.ProxyProtocol",
                "allow_requests_without_proxy_protocol": true
            }
        }]);
    }
    status["filter_chains"] = json!([{
        "filters": [http_manager("agent", &[("/healthz/ready", "agent")], vec![router()])]
    }]);
    out.push(status);
    out
}
