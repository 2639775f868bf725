//! The bootstrap's `node`: its metadata as Istio's agent builds it (`ISTIO_META_*`, the members
//! of `ISTIO_METAJSON_*` objects, the pod's labels and annotations, then the typed fields the
//! agent owns, the cloud platform's among them), its service cluster and its locality (a pod
//! label's, else the platform's).

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde_json::{Map, Value, json};

use super::{Error, ISTIO_RELEASE};
use crate::config::{AuthPolicy, Config, split_host_port};
use crate::identity::Sockets;
use crate::platform::Platform;

/// The label Istio keeps the sanitised locality under.
const LOCALITY_LABEL: &str = "istio-locality";
/// The label that takes precedence for the locality.
const TOPOLOGY_LOCALITY_LABEL: &str = "topology.istio.io/locality";

/// `node.locality`: each part only when set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Locality {
    pub region: String,
    pub zone: String,
    pub sub_zone: String,
}

impl Locality {
    /// The JSON object (empty parts left out).
    pub fn to_json(&self) -> Map<String, Value> {
        let mut m = Map::new();
        for (k, v) in [
            ("region", &self.region),
            ("zone", &self.zone),
            ("sub_zone", &self.sub_zone),
        ] {
            if !v.is_empty() {
                m.insert(k.into(), json!(v));
            }
        }
        m
    }
}

/// The node as the bootstrap describes it.
#[derive(Debug, Clone)]
pub struct Node {
    pub metadata: Map<String, Value>,
    pub cluster: String,
    pub locality: Locality,
    /// `METADATA_DISCOVERY`: `PEER_METADATA_DISCOVERY` when set, else `ENABLE_HBONE`.
    pub metadata_discovery: bool,
}

/// Builds the node metadata, cluster and locality on `platform`, with who serves the workload
/// identity sockets (settled at bind).
pub fn node(config: &Config, sockets: Sockets, platform: &Platform) -> Result<Node, Error> {
    let (mut meta, static_labels) = env_metadata(config);
    let (labels, static_labels, locality) = labels_and_locality(config, static_labels, platform);
    let metadata_discovery = insert_agent_fields(config, &mut meta);
    insert_workload_fields(config, sockets, &mut meta);
    for (key, v) in [
        ("NAME", &config.node.pod_name),
        ("NAMESPACE", &config.node.pod_namespace),
        ("SERVICE_ACCOUNT", &config.node.service_account),
    ] {
        if !v.is_empty() {
            meta.insert(key.into(), json!(v));
        }
    }
    if !platform.metadata.is_empty() {
        meta.insert("PLATFORM_METADATA".into(), json!(platform.metadata));
    }
    if !labels.is_empty() {
        meta.insert("LABELS".into(), json!(labels));
    }
    if !static_labels.is_empty() {
        meta.insert("STATIC_LABELS".into(), json!(static_labels));
    }
    if !config.node.pod_annotations.is_empty() {
        meta.insert("ANNOTATIONS".into(), json!(config.node.pod_annotations));
    }
    insert_pilot_san(config, &mut meta);
    if !config.flags.outlier_log_path.is_empty() {
        meta.insert(
            "OUTLIER_LOG_PATH".into(),
            json!(config.flags.outlier_log_path),
        );
    }
    let workload = meta
        .get("WORKLOAD_NAME")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    Ok(Node {
        cluster: service_cluster(config, &labels, &workload),
        metadata: meta,
        locality,
        metadata_discovery,
    })
}

/// What the environment passes: `ISTIO_META_*` (ProxyConfig's `proxyMetadata`, then the
/// process's), the members of each `ISTIO_METAJSON_*` object, and `DNS_PROXY_ADDR`; with the
/// static labels `ISTIO_METAJSON_LABELS` gives.
fn env_metadata(config: &Config) -> (Map<String, Value>, BTreeMap<String, String>) {
    let mut meta = Map::new();
    let env = &config.node.meta_env;
    let proxy_metadata = config.proxy.proxy_metadata.iter();
    for (k, v) in proxy_metadata.chain(env.iter().map(|(k, v)| (k, v))) {
        if let Some(key) = k.strip_prefix("ISTIO_META_").filter(|k| !k.is_empty()) {
            meta.insert(key.to_string(), Value::String(v.clone()));
        }
    }
    // Each ISTIO_METAJSON_* object is merged into the metadata member by member (as Istio's
    // json.Unmarshal into the map does); ISTIO_METAJSON_LABELS also gives the static labels.
    let mut static_labels: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in env {
        let Some(key) = k.strip_prefix("ISTIO_METAJSON_").filter(|k| !k.is_empty()) else {
            continue;
        };
        let Some(obj) = json_object(k, v) else {
            continue;
        };
        if key == "LABELS" {
            // Istio reads the labels as strings: one non-string value drops them all.
            static_labels = obj
                .iter()
                .map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect::<Option<_>>()
                .unwrap_or_default();
        }
        meta.extend(obj);
    }
    if !config.bootstrap.dns_proxy_addr.is_empty() {
        meta.insert(
            "DNS_PROXY_ADDR".into(),
            json!(config.bootstrap.dns_proxy_addr),
        );
    }
    (meta, static_labels)
}

/// An `ISTIO_METAJSON_*` value as an object. Not a JSON object: Istio warns (its json.Unmarshal
/// into the map fails) and goes on without it.
fn json_object(var: &str, value: &str) -> Option<Map<String, Value>> {
    match serde_json::from_str::<Value>(value) {
        Ok(Value::Object(obj)) => Some(obj),
        Ok(Value::Null) => None,
        other => {
            tracing::warn!(
                var = %var,
                value = %value,
                error = %other.err().map_or("not a JSON object".to_string(), |e| e.to_string()),
                "ISTIO_METAJSON_ variable is not a JSON object; ignored"
            );
            None
        }
    }
}

/// Labels: the static ones (`ISTIO_METAJSON_LABELS`, then the platform's instance labels),
/// then the pod's labels file. Without a labels file the labels are the static ones only when
/// `ISTIO_METAJSON_LABELS` gave some, and then they are one map (as upstream): the sanitised
/// locality shows in STATIC_LABELS too. Returns the labels, the static labels and the locality
/// they name, else the platform's.
fn labels_and_locality(
    config: &Config,
    mut static_labels: BTreeMap<String, String>,
    platform: &Platform,
) -> (BTreeMap<String, String>, BTreeMap<String, String>, Locality) {
    let same_map = !static_labels.is_empty();
    static_labels.extend(platform.labels.clone());
    let has_labels_file = !config.node.pod_labels.is_empty();
    let mut labels = if has_labels_file || same_map {
        static_labels.clone()
    } else {
        BTreeMap::new()
    };
    for (k, v) in &config.node.pod_labels {
        if k != "pod-template-hash" {
            labels.insert(k.clone(), v.clone());
        }
    }
    let locality_label = labels
        .get(TOPOLOGY_LOCALITY_LABEL)
        .or_else(|| labels.get(LOCALITY_LABEL))
        .cloned()
        .unwrap_or_default();
    if locality_label.is_empty() {
        let locality = Locality {
            region: platform.locality.region.clone(),
            zone: platform.locality.zone.clone(),
            sub_zone: String::new(),
        };
        return (labels, static_labels, locality);
    }
    let sanitised = locality_label.replace('.', "/");
    labels.insert(LOCALITY_LABEL.into(), sanitised.clone());
    if !has_labels_file {
        static_labels = labels.clone();
    }
    let mut parts = sanitised.splitn(3, '/').map(str::to_string);
    let locality = Locality {
        region: parts.next().unwrap_or_default(),
        zone: parts.next().unwrap_or_default(),
        sub_zone: parts.next().unwrap_or_default(),
    };
    (labels, static_labels, locality)
}

/// The typed fields the agent owns, which win over what the environment passed: the release,
/// the IPs, the ports Envoy serves, the drain and log switches. Returns `METADATA_DISCOVERY`.
fn insert_agent_fields(config: &Config, meta: &mut Map<String, Value>) -> bool {
    if meta
        .get("ISTIO_VERSION")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        meta.insert("ISTIO_VERSION".into(), json!(ISTIO_RELEASE));
    }
    let ips: Vec<String> = config.node.ips.iter().map(IpAddr::to_string).collect();
    // Istio leaves the key out when the agent has no IP at all.
    if !ips.is_empty() {
        meta.insert("INSTANCE_IPS".into(), json!(ips.join(",")));
    }
    if config.flags.sts_port > 0 {
        meta.insert("STS_PORT".into(), json!(config.flags.sts_port.to_string()));
    }
    for (key, port) in [
        ("ENVOY_STATUS_PORT", config.envoy.status_port),
        ("ENVOY_PROMETHEUS_PORT", config.envoy.prometheus_port),
        (
            "ENVOY_SECURE_METRICS_PORT",
            config.bootstrap.secure_metrics_port,
        ),
        (
            "ENVOY_SECURE_MERGED_METRICS_PORT",
            config.bootstrap.secure_merged_metrics_port,
        ),
    ] {
        if port > 0 {
            meta.insert(key.into(), json!(port));
        }
    }
    if config.envoy.exit_on_zero_active_connections {
        meta.insert("EXIT_ON_ZERO_ACTIVE_CONNECTIONS".into(), json!("true"));
    }
    let hbone = meta
        .get("ENABLE_HBONE")
        .and_then(Value::as_str)
        .and_then(|v| go_syntax::parse_bool(v).ok())
        .unwrap_or(false);
    let metadata_discovery = config.bootstrap.peer_metadata_discovery.unwrap_or(hbone);
    meta.insert(
        "METADATA_DISCOVERY".into(),
        json!(metadata_discovery.to_string()),
    );
    if config.envoy.skip_deprecated_logs {
        meta.insert("ENVOY_SKIP_DEPRECATED_LOGS".into(), json!("true"));
    }
    metadata_discovery
}

/// The workload socket's keys (Istio's CredentialSocketExists / ServeOnlyFiles, as settled at
/// bind) and the ProxyConfig echo.
fn insert_workload_fields(config: &Config, sockets: Sockets, meta: &mut Map<String, Value>) {
    meta.insert(
        "WORKLOAD_IDENTITY_SOCKET_FILE".into(),
        json!(config.workload_socket.file),
    );
    if sockets.credential {
        meta.insert("credential".into(), json!("true"));
    }
    if sockets.external {
        meta.insert("file-credential".into(), json!("true"));
    }
    meta.insert(
        "PROXY_CONFIG".into(),
        crate::config::proxy_config::echo(&config.proxy.raw),
    );
}

/// `PILOT_SAN` under mutual TLS to the control plane: the discovery host
/// (`istiod.istio-system.svc` for a localhost one).
fn insert_pilot_san(config: &Config, meta: &mut Map<String, Value>) {
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
}

/// `node.cluster`: ProxyConfig's `serviceCluster`, or what `tracingServiceName` asks for, with
/// Istio's fallback for `istio-proxy`: `<app>.<namespace>`, `<workload>.<namespace>`,
/// `istio-proxy.<namespace>`, or `istio-proxy` without a namespace.
fn service_cluster(config: &Config, labels: &BTreeMap<String, String>, workload: &str) -> String {
    let ns = &config.node.pod_namespace;
    let or_default = |name: &str| -> String {
        if !name.is_empty() && name != "istio-proxy" {
            return name.to_string();
        }
        let app = [
            "app",
            "app.kubernetes.io/name",
            "service.istio.io/canonical-name",
        ]
        .iter()
        .find_map(|k| labels.get(*k));
        if let Some(app) = app {
            return format!("{app}.{ns}");
        }
        if !workload.is_empty() {
            return format!("{workload}.{ns}");
        }
        if !ns.is_empty() {
            return format!("istio-proxy.{ns}");
        }
        "istio-proxy".into()
    };
    let canonical = || -> String {
        [
            "service.istio.io/canonical-name",
            "app.kubernetes.io/name",
            "app",
        ]
        .iter()
        .find_map(|k| labels.get(*k).cloned())
        .unwrap_or_else(|| {
            if workload.is_empty() {
                "istio-proxy".into()
            } else {
                workload.to_string()
            }
        })
    };
    match config
        .proxy
        .raw
        .get("tracingServiceName")
        .and_then(Value::as_str)
    {
        Some("CANONICAL_NAME_ONLY") => or_default(&canonical()),
        Some("CANONICAL_NAME_AND_NAMESPACE") if !ns.is_empty() => format!("{}.{ns}", canonical()),
        Some("CANONICAL_NAME_AND_NAMESPACE") => or_default(&canonical()),
        Some(_) => or_default("istio-proxy"),
        None => or_default(&config.proxy.service_cluster),
    }
}
