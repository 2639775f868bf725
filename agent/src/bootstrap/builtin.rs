//! The built-in bootstrap (no template file): the same document Istio's `envoy_bootstrap.json`
//! renders, built from [`Options`] as JSON.

use serde_json::{Map, Value, json};

use super::Error;
use super::clusters::clusters;
use super::listeners::listeners;
use super::options::Options;
use super::stats::{histogram_buckets, proto_duration, stats_matcher, stats_tags};
use super::telemetry::Tracer;

fn log_format(o: &Options) -> Value {
    if o.log_json {
        json!({ "json_format": {
            "time": "%Y-%m-%dT%T.%fZ", "level": "%l", "scope": "envoy %n",
            "msg": "%j", "caller": "%g:%#", "thread": "%t"
        }})
    } else {
        json!({ "text_format": "%Y-%m-%dT%T.%fZ\t%l\tenvoy %n %g:%#\t%v\tthread=%t" })
    }
}

fn bootstrap_extensions(o: &Options) -> Value {
    let mut ext = Vec::new();
    if o.metadata_discovery {
        ext.push(json!({
            "name": "metadata_discovery",
            "typed_config": {
                "@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
                "type_url": "type.googleapis.com/istio.workload.BootstrapExtension",
                "value": { "config_source": { "ads": {} } }
            }
        }));
    }
    ext.push(json!({
        "name": "envoy.bootstrap.internal_listener",
        "typed_config": {
            "@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
            "type_url": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener",
            "value": { "buffer_size_kb": 64 }
        }
    }));
    Value::Array(ext)
}

fn tracing(o: &Options) -> Option<Value> {
    let (name, config) = match o.telemetry.tracer.as_ref()? {
        Tracer::Zipkin(_) => (
            "envoy.tracers.zipkin",
            json!({
                "@type": "type.googleapis.com/envoy.config.trace.v3.ZipkinConfig",
                "collector_cluster": "zipkin",
                "collector_endpoint": "/api/v2/spans",
                "collector_endpoint_version": "HTTP_JSON",
                "trace_id_128bit": true,
                "shared_span_context": false
            }),
        ),
        Tracer::Lightstep { .. } => (
            "envoy.tracers.lightstep",
            json!({
                "@type": "type.googleapis.com/envoy.config.trace.v3.LightstepConfig",
                "collector_cluster": "lightstep",
                "access_token_file": o.lightstep_token_path.clone().unwrap_or_default()
            }),
        ),
        Tracer::Datadog(_) => (
            "envoy.tracers.datadog",
            json!({
                "@type": "type.googleapis.com/envoy.config.trace.v3.DatadogConfig",
                "collector_cluster": "datadog_agent",
                "service_name": o.cluster
            }),
        ),
        Tracer::Stackdriver { .. } => return None,
    };
    Some(json!({ "http": { "name": name, "typed_config": config } }))
}

fn stats_sinks(o: &Options) -> Vec<Value> {
    let mut sinks = Vec::new();
    if o.telemetry.metrics_service.is_some() {
        sinks.push(json!({
            "name": "envoy.stat_sinks.metrics_service",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.config.metrics.v3.MetricsServiceConfig",
                "transport_api_version": "V3",
                "grpc_service": { "envoy_grpc": { "cluster_name": "envoy_metrics_service" } }
            }
        }));
    }
    if let Some(statsd) = &o.telemetry.statsd {
        sinks.push(json!({
            "name": "envoy.stat_sinks.statsd",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.config.metrics.v3.StatsdSink",
                "address": { "socket_address": statsd.socket_address() }
            }
        }));
    }
    sinks
}

fn cluster_manager(o: &Options) -> Result<Option<Value>, Error> {
    if o.outlier_log_path.is_empty() && o.load_stats_config.is_none() && !o.enable_self_discovery {
        return Ok(None);
    }
    let mut cm = Map::new();
    if o.enable_self_discovery {
        cm.insert("local_cluster_name".into(), json!("local_cluster"));
    }
    if !o.outlier_log_path.is_empty() {
        cm.insert(
            "outlier_detection".into(),
            json!({ "event_log_path": o.outlier_log_path }),
        );
    }
    if let Some(text) = &o.load_stats_config {
        let lrs: Value = serde_json::from_str(text).map_err(|e| Error::MetaValue {
            var: "ISTIO_META_LOAD_STATS_CONFIG_JSON".into(),
            value: text.clone(),
            expected: format!("an ApiConfigSource as JSON ({e})"),
        })?;
        cm.insert("load_stats_config".into(), lrs);
    }
    cm.insert("enable_deferred_cluster_creation".into(), json!(true));
    Ok(Some(Value::Object(cm)))
}

/// The built-in bootstrap.
pub fn render(o: &Options) -> Result<Value, Error> {
    let mut stats_config = json!({
        "use_all_default_tags": false,
        "stats_tags": stats_tags(&o.stats.extra_tags),
        "stats_matcher": stats_matcher(&o.stats, o.metadata_discovery),
    });
    if !o.stats.histogram_buckets.is_empty() {
        stats_config["histogram_bucket_settings"] = histogram_buckets(&o.stats);
    }
    let mut b = json!({
        "application_log_config": { "log_format": log_format(o) },
        "node": {
            "id": o.node_id,
            "cluster": o.cluster,
            "locality": o.locality.to_json(),
            "metadata": o.metadata,
        },
        "layered_runtime": {
            "layers": [
                { "name": "global config", "static_layer": o.runtime_flags },
                { "name": "admin", "admin_layer": {} }
            ]
        },
        "bootstrap_extensions": bootstrap_extensions(o),
        "stats_config": stats_config,
        "admin": {
            "access_log": [{
                "name": "envoy.access_loggers.file",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                    "path": "/dev/null"
                }
            }],
            "profile_path": "/var/lib/istio/data/envoy.prof",
            "address": { "socket_address": { "address": o.family.localhost, "port_value": o.admin_port } }
        },
        "dynamic_resources": {
            "lds_config": { "ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3" },
            "cds_config": { "ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3" },
            "ads_config": {
                "api_type": o.xds_type,
                "set_node_on_first_message_only": true,
                "transport_api_version": "V3",
                "grpc_services": [{ "envoy_grpc": { "cluster_name": "xds-grpc" } }]
            }
        },
        "static_resources": { "clusters": clusters(o), "listeners": listeners(o) },
        "overload_manager": {
            "resource_monitors": [{
                "name": "envoy.resource_monitors.global_downstream_max_connections",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig",
                    "max_active_downstream_connections": o.global_downstream_max_connections
                }
            }]
        },
        "deferred_stat_options": { "enable_deferred_creation_stats": true }
    });
    if let Some(d) = o.stats.flush_interval {
        b["stats_flush_interval"] = json!(proto_duration(d));
    }
    if let Some(d) = o.stats.eviction_interval {
        b["stats_eviction_interval"] = json!(proto_duration(d));
    }
    if let Some(t) = tracing(o) {
        b["tracing"] = t;
    }
    let sinks = stats_sinks(o);
    if !sinks.is_empty() {
        b["stats_sinks"] = Value::Array(sinks);
    }
    if let Some(cm) = cluster_manager(o)? {
        b["cluster_manager"] = cm;
    }
    Ok(b)
}
