//! A connected proxy: parsed from the xDS `Node` (id `sidecar~IP~POD.NS~NS.svc.cluster.local`
//! and Istio's node metadata).

use std::collections::BTreeMap;

use proto::envoy::config::core::v3::Node;
use proto::google::protobuf::{Struct, Value, value::Kind};

use crate::config::kinds::Labels;

/// Why a node was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProxyError {
    #[error("the first request of a stream must carry a node")]
    NoNode,
    #[error("node id {0:?} is not <type>~<ip>~<pod>.<namespace>~<domain>")]
    BadId(String),
    #[error("node metadata {field}: {reason}")]
    BadMetadata { field: &'static str, reason: String },
}

/// What generation depends on: proxies with equal views get identical resources.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProxyView {
    pub namespace: String,
    pub labels: Labels,
    pub ips: Vec<String>,
    pub dns_capture: bool,
    pub dns_auto_allocate: bool,
    /// Traffic reaches Envoy through capture (metadata `INTERCEPTION_MODE` other than `NONE`):
    /// the virtual listeners bind 15001/15006. Without capture they are sent but not bound,
    /// so an Envoy run by hand on a host (`--external-envoy`) takes no ports it does not own.
    pub capture: bool,
    /// Node metadata `GENERATOR=grpc`: a proxyless gRPC client (see `xds::grpc`).
    pub grpc: bool,
}

/// A proxy's identity and metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct Proxy {
    pub id: String,
    /// `sidecar`, `router`, ...
    pub kind: String,
    pub pod_name: String,
    pub service_account: String,
    pub cluster_id: String,
    pub istio_version: String,
    pub view: ProxyView,
}

fn string_of(v: &Value) -> Option<String> {
    match &v.kind {
        Some(Kind::StringValue(s)) => Some(s.clone()),
        Some(Kind::BoolValue(b)) => Some(b.to_string()),
        Some(Kind::NumberValue(n)) => Some(n.to_string()),
        _ => None,
    }
}

fn truthy(s: Option<&String>) -> bool {
    s.is_some_and(|s| matches!(s.to_ascii_lowercase().as_str(), "true" | "1" | "yes"))
}

impl Proxy {
    /// Parses a node. The namespace comes from metadata `NAMESPACE`, else from the id.
    pub fn from_node(node: Option<&Node>) -> Result<Proxy, ProxyError> {
        let node = node.ok_or(ProxyError::NoNode)?;
        let parts: Vec<&str> = node.id.split('~').collect();
        let [kind, ip, pod, _domain] = parts.as_slice() else {
            return Err(ProxyError::BadId(node.id.clone()));
        };
        let (pod_name, id_ns) = pod.split_once('.').unwrap_or((pod, ""));
        let empty = Struct::default();
        let md = node.metadata.as_ref().unwrap_or(&empty);
        let mut raw = BTreeMap::new();
        for (k, v) in &md.fields {
            if let Some(s) = string_of(v) {
                raw.insert(k.clone(), s);
            }
        }
        let labels = labels(md)?;
        let namespace = raw
            .get("NAMESPACE")
            .cloned()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| id_ns.to_string());
        if namespace.is_empty() {
            return Err(ProxyError::BadMetadata {
                field: "NAMESPACE",
                reason: "missing, and the node id names no namespace".into(),
            });
        }
        let ips = instance_ips(&raw, ip)?;
        Ok(Proxy {
            id: node.id.clone(),
            kind: kind.to_string(),
            pod_name: pod_name.to_string(),
            service_account: raw.get("SERVICE_ACCOUNT").cloned().unwrap_or_default(),
            cluster_id: raw.get("CLUSTER_ID").cloned().unwrap_or_default(),
            istio_version: raw.get("ISTIO_VERSION").cloned().unwrap_or_default(),
            view: ProxyView {
                namespace,
                labels,
                ips,
                dns_capture: truthy(raw.get("DNS_CAPTURE")),
                dns_auto_allocate: truthy(raw.get("DNS_AUTO_ALLOCATE")),
                capture: raw.get("INTERCEPTION_MODE").is_none_or(|m| m != "NONE"),
                grpc: raw.get("GENERATOR").is_some_and(|g| g == "grpc"),
            },
        })
    }
}

/// Metadata `LABELS`: a struct of strings, or (as a string) a JSON object of strings.
fn labels(md: &Struct) -> Result<Labels, ProxyError> {
    Ok(
        match md.fields.get("LABELS").and_then(|v| v.kind.as_ref()) {
            None | Some(Kind::NullValue(_)) => Labels::new(),
            Some(Kind::StructValue(s)) => s
                .fields
                .iter()
                .filter_map(|(k, v)| string_of(v).map(|s| (k.clone(), s)))
                .collect(),
            Some(Kind::StringValue(s)) => {
                serde_json::from_str(s).map_err(|e| ProxyError::BadMetadata {
                    field: "LABELS",
                    reason: format!("not a JSON object of strings: {e}"),
                })?
            }
            Some(_) => {
                return Err(ProxyError::BadMetadata {
                    field: "LABELS",
                    reason: "expected a struct of strings".into(),
                });
            }
        },
    )
}

/// Metadata `INSTANCE_IPS` (comma-separated, each an IP address), else the node id's IP when it
/// is one.
fn instance_ips(raw: &BTreeMap<String, String>, id_ip: &str) -> Result<Vec<String>, ProxyError> {
    let mut ips: Vec<String> = raw
        .get("INSTANCE_IPS")
        .map(|s| {
            s.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    for ip in &ips {
        if ip.parse::<std::net::IpAddr>().is_err() {
            return Err(ProxyError::BadMetadata {
                field: "INSTANCE_IPS",
                reason: format!("{ip:?} is not an IP address"),
            });
        }
    }
    if ips.is_empty() && id_ip.parse::<std::net::IpAddr>().is_ok() {
        ips.push(id_ip.to_string());
    }
    Ok(ips)
}
