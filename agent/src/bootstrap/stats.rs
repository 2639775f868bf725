//! Envoy stats settings from the pod's `sidecar.istio.io/*` annotations and ProxyConfig: the
//! inclusion lists (with `{pod_ip}` expanded), extra stat tags, histogram buckets and the
//! flush/eviction intervals, plus Istio's fixed tag regexes.

use std::time::Duration;

use serde_json::{Value, json};

use crate::config::Config;

const EXTRA_STAT_TAGS: &str = "sidecar.istio.io/extraStatTags";
const INCLUSION_PREFIXES: &str = "sidecar.istio.io/statsInclusionPrefixes";
const INCLUSION_SUFFIXES: &str = "sidecar.istio.io/statsInclusionSuffixes";
const INCLUSION_REGEXPS: &str = "sidecar.istio.io/statsInclusionRegexps";
const HISTOGRAM_BUCKETS: &str = "sidecar.istio.io/statsHistogramBuckets";
const FLUSH_INTERVAL: &str = "sidecar.istio.io/statsFlushInterval";
const EVICTION_INTERVAL: &str = "sidecar.istio.io/statsEvictionInterval";

/// Envoy's stats flush interval when the annotation does not set one.
const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(5);

/// The computed stats settings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub inclusion_prefixes: Vec<String>,
    pub inclusion_suffixes: Vec<String>,
    pub inclusion_regexps: Vec<String>,
    pub extra_tags: Vec<String>,
    /// `(prefix, buckets)`, sorted by prefix.
    pub histogram_buckets: Vec<(String, Vec<f64>)>,
    /// Only when the annotation sets a valid one.
    pub flush_interval: Option<Duration>,
    /// Only when valid: a whole multiple of the flush interval.
    pub eviction_interval: Option<Duration>,
}

/// One inclusion list as Istio builds it: the pod annotation (comma-separated) or else
/// ProxyConfig's `proxyStatsMatcher` list, then the required entries; `{pod_ip}` becomes one
/// entry per instance IP. Empty entries (a stray comma) are dropped: an empty prefix would keep
/// every stat.
fn inclusion(
    config: &Config,
    annotation: &str,
    configured: &[String],
    required: &[&str],
) -> Vec<String> {
    let mut list: Vec<String> = match config.node.pod_annotations.get(annotation) {
        Some(a) if !a.is_empty() => a.split(',').map(str::to_string).collect(),
        _ => configured.to_vec(),
    };
    list.extend(required.iter().map(|s| s.to_string()));
    let mut out = Vec::new();
    for entry in list.into_iter().filter(|e| !e.is_empty()) {
        if entry.contains("{pod_ip}") {
            out.extend(
                config
                    .node
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

/// The stats settings for `config`; `extra_tags` are ProxyConfig's `extraStatTags`.
pub fn stats(config: &Config, extra_tags: &[String]) -> Stats {
    let wanted = &config.proxy.stats_matcher;
    let inclusion_prefixes = inclusion(
        config,
        INCLUSION_PREFIXES,
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
    if config.envoy.exit_on_zero_active_connections {
        required_suffixes.push("downstream_cx_active");
    }
    let inclusion_suffixes = inclusion(
        config,
        INCLUSION_SUFFIXES,
        &wanted.inclusion_suffixes,
        &required_suffixes,
    );
    let inclusion_regexps = inclusion(
        config,
        INCLUSION_REGEXPS,
        &wanted.inclusion_regexps,
        &[r"vhost\..*\.route\..*"],
    );

    let extra_tags = extra_stat_tags(config, extra_tags);
    let histogram_buckets = bucket_annotation(config);
    let (flush_interval, eviction_interval) = intervals(config);
    Stats {
        inclusion_prefixes,
        inclusion_suffixes,
        inclusion_regexps,
        extra_tags,
        histogram_buckets,
        flush_interval,
        eviction_interval,
    }
}

/// ProxyConfig's `extraStatTags`, then the pod's extra stat tags annotation, each once.
fn extra_stat_tags(config: &Config, extra_tags: &[String]) -> Vec<String> {
    let mut tags: Vec<String> = Vec::new();
    let annotated = config
        .node
        .pod_annotations
        .get(EXTRA_STAT_TAGS)
        .map(String::as_str)
        .unwrap_or("");
    for tag in extra_tags
        .iter()
        .map(String::as_str)
        .chain(annotated.split(','))
    {
        if !tag.is_empty() && !tags.iter().any(|t| t == tag) {
            tags.push(tag.to_string());
        }
    }
    tags
}

/// The pod's histogram buckets annotation (a JSON object of prefix to bounds); ignored, with a
/// warning, when it does not parse.
fn bucket_annotation(config: &Config) -> Vec<(String, Vec<f64>)> {
    let mut histogram_buckets = Vec::new();
    if let Some(text) = config.node.pod_annotations.get(HISTOGRAM_BUCKETS) {
        match serde_json::from_str::<std::collections::BTreeMap<String, Vec<f64>>>(text) {
            Ok(map) => histogram_buckets = map.into_iter().collect(),
            Err(e) => tracing::warn!(annotation = HISTOGRAM_BUCKETS, value = %text, error = %e,
                "ignoring histogram buckets: expected a JSON object of prefix to list of numbers"),
        }
    }
    histogram_buckets
}

/// The pod's stats flush and eviction intervals, each ignored (with a warning) when it does not
/// parse; the eviction interval must be a multiple of the flush interval.
fn intervals(config: &Config) -> (Option<Duration>, Option<Duration>) {
    let mut flush = DEFAULT_FLUSH_INTERVAL;
    let mut flush_interval = None;
    if let Some(v) = config.node.pod_annotations.get(FLUSH_INTERVAL) {
        match go_syntax::parse_duration(v) {
            Ok(d) => {
                flush = d;
                flush_interval = Some(d);
            }
            Err(_) => tracing::warn!(annotation = FLUSH_INTERVAL, value = %v,
                "ignoring stats flush interval: expected a duration such as 10s"),
        }
    }
    let mut eviction_interval = None;
    if let Some(v) = config.node.pod_annotations.get(EVICTION_INTERVAL) {
        match go_syntax::parse_duration(v).ok() {
            None => tracing::warn!(annotation = EVICTION_INTERVAL, value = %v,
                "ignoring stats eviction interval: expected a duration such as 60s"),
            Some(d) if flush.is_zero() || d.as_nanos() % flush.as_nanos() != 0 => {
                tracing::warn!(annotation = EVICTION_INTERVAL, value = %v, flush = ?flush,
                    "ignoring stats eviction interval: it must be a multiple of the flush interval")
            }
            // Not cut to whole seconds (Istio's is): `1.5s` with a `0.5s` flush stays a
            // multiple of it, as Envoy requires.
            Some(d) => eviction_interval = Some(d),
        }
    }
    (flush_interval, eviction_interval)
}

/// `stats_config.stats_tags`: Istio's tag regexes, the extra tags after `mongo_prefix`.
pub fn stats_tags(extra: &[String]) -> Value {
    let fixed: [(&str, &str); 9] = [
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
    ];
    let rest: [(&str, &str); 7] = [
        ("cache", r"(cache\.(.+?)\.)"),
        ("component", r"(component\.(.+?)\.)"),
        ("tag", r"(tag\.(.+?);\.)"),
        ("wasm_filter", r"(wasm_filter\.(.+?)\.)"),
        ("authz_enforce_result", r"rbac(\.(allowed|denied))"),
        ("authz_dry_run_action", r"(\.istio_dry_run_(allow|deny)_)"),
        ("authz_dry_run_result", r"(\.shadow_(allowed|denied))"),
    ];
    let tag = |name: &str, re: &str| json!({ "tag_name": name, "regex": re });
    let mut tags: Vec<Value> = fixed.iter().map(|(n, r)| tag(n, r)).collect();
    tags.extend(
        extra
            .iter()
            .map(|t| tag(t, &format!(r"({t}=\.=(.*?);\.;)"))),
    );
    tags.extend(rest.iter().map(|(n, r)| tag(n, r)));
    Value::Array(tags)
}

/// `stats_config.stats_matcher`: `reporter=` (and `workload_discovery` with metadata discovery),
/// the prefixes, suffixes and regexes, then `component` and `istio`.
pub fn stats_matcher(stats: &Stats, metadata_discovery: bool) -> Value {
    let mut patterns = vec![json!({ "prefix": "reporter=" })];
    if metadata_discovery {
        patterns.push(json!({ "prefix": "workload_discovery" }));
    }
    patterns.extend(
        stats
            .inclusion_prefixes
            .iter()
            .map(|p| json!({ "prefix": p })),
    );
    patterns.extend(
        stats
            .inclusion_suffixes
            .iter()
            .map(|s| json!({ "suffix": s })),
    );
    patterns.extend(
        stats
            .inclusion_regexps
            .iter()
            .map(|r| json!({ "safe_regex": { "regex": r } })),
    );
    patterns.push(json!({ "prefix": "component" }));
    patterns.push(json!({ "prefix": "istio" }));
    json!({ "inclusion_list": { "patterns": patterns } })
}

/// `histogram_bucket_settings`: one entry per prefix.
pub fn histogram_buckets(stats: &Stats) -> Value {
    Value::Array(
        stats
            .histogram_buckets
            .iter()
            .map(|(prefix, buckets)| json!({ "match": { "prefix": prefix }, "buckets": buckets }))
            .collect(),
    )
}

/// A duration as protobuf JSON writes it (`10s`, `0.250s`).
pub fn proto_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        let s = format!("{}.{:09}", d.as_secs(), d.subsec_nanos());
        format!("{}s", s.trim_end_matches('0'))
    }
}
