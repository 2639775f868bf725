//! Who the proxy is: its role, its pod, its addresses, and the node metadata's inputs from the
//! environment. The node id and the DNS domain are worked out here, once.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::{Error, NodeType, env::Env};

/// The node: what istiod and Envoy's bootstrap are told about this proxy.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Node {
    /// `proxy sidecar|router|waypoint`.
    pub kind: NodeType,
    /// `POD_NAME`.
    pub pod_name: String,
    /// `POD_NAMESPACE`.
    pub pod_namespace: String,
    /// `SERVICE_ACCOUNT`.
    pub service_account: String,
    /// `HOST_IP`.
    pub host_ip: String,
    /// `INSTANCE_IP`, when it is an IP.
    pub instance_ip: Option<IpAddr>,
    /// `INSTANCE_IP` first, then the host's private IPs (duplicates dropped).
    pub ips: Vec<IpAddr>,
    /// `--domain`, or Istio's `<namespace>.svc.cluster.local` (`.svc.cluster.local` with no
    /// namespace): the node id's domain and the DNS proxy's.
    pub dns_domain: String,
    /// `ISTIO_META_CLUSTER_ID`.
    pub cluster_id: String,
    /// The downward-API `labels` file.
    pub pod_labels: BTreeMap<String, String>,
    /// The downward-API `annotations` file (the dump redacts `proxy.istio.io/config`).
    pub pod_annotations: BTreeMap<String, String>,
    /// `ISTIO_META_*` and `ISTIO_METAJSON_*` variables, sorted by name (the dump shows names
    /// only: values may carry anything).
    pub meta_env: Vec<(String, String)>,
}

/// What the node depends on besides the environment.
pub struct Inputs<'a> {
    pub env: Env<'a>,
    pub kind: NodeType,
    /// `--domain`.
    pub domain: &'a str,
    pub interface_ips: Vec<IpAddr>,
    pub pod_labels: BTreeMap<String, String>,
    pub pod_annotations: BTreeMap<String, String>,
}

impl Node {
    /// The service node id `<type>~<ip>~<pod>.<ns>~<domain>`.
    pub fn id(&self) -> String {
        let ip = self.ips.first().map(|i| i.to_string()).unwrap_or_default();
        format!(
            "{}~{}~{}.{}~{}",
            self.kind.as_str(),
            ip,
            self.pod_name,
            self.pod_namespace,
            self.dns_domain
        )
    }
}

/// Istio's DNS domain: `--domain`, else `<namespace>.svc.cluster.local` (the namespace may be
/// empty, which leaves a leading dot, as Istio's agent).
pub fn dns_domain(domain_flag: &str, namespace: &str) -> String {
    if domain_flag.is_empty() {
        format!("{namespace}.svc.cluster.local")
    } else {
        domain_flag.to_string()
    }
}

pub fn load(i: Inputs<'_>) -> Result<Node, Error> {
    let env = i.env;
    let pod_namespace = env.str("POD_NAMESPACE", "");
    // Proxy IPs: INSTANCE_IP first, then the host's. None at all (no INSTANCE_IP, every
    // interface excluded) leaves the node id's IP empty, as Istio's.
    let instance_ip = env
        .get("INSTANCE_IP")
        .and_then(|i| i.parse::<IpAddr>().ok());
    let mut ips: Vec<IpAddr> = instance_ip.into_iter().collect();
    for ip in i.interface_ips {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    let mut meta_env: Vec<(String, String)> = env
        .vars()
        .iter()
        .filter(|(k, _)| k.starts_with("ISTIO_META_") || k.starts_with("ISTIO_METAJSON_"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    meta_env.sort();
    Ok(Node {
        kind: i.kind,
        pod_name: env.str("POD_NAME", ""),
        dns_domain: dns_domain(i.domain, &pod_namespace),
        pod_namespace,
        service_account: env.str("SERVICE_ACCOUNT", ""),
        host_ip: env.str("HOST_IP", ""),
        instance_ip,
        ips,
        cluster_id: env.str("ISTIO_META_CLUSTER_ID", ""),
        pod_labels: i.pod_labels,
        pod_annotations: i.pod_annotations,
        meta_env,
    })
}
