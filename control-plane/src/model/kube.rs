//! Kubernetes Services as mesh services, the way istiod's Kubernetes registry converts them:
//! host `<name>.<ns>.svc.<domain>`, the cluster IPs as VIPs (none for a headless service,
//! whose resolution is passthrough), port protocols from `appProtocol` or the port name's
//! prefix, and endpoints from the Service's EndpointSlices (else its `v1 Endpoints`, else the
//! ready Pods its selector picks, as the EndpointSlice controller would), each with its Pod's
//! labels and service account.

use std::collections::BTreeMap;

use super::{Endpoint, Port, Registry, Service};
use crate::config::kinds::{Labels, Location, Resolution};
use crate::config::kube::{self, TargetPort};
use crate::config::{Config, Object};

/// Istio's protocol for a Service port (`ConvertProtocol`): UDP stays UDP; else
/// `appProtocol` (with Kubernetes' `kubernetes.io/h2c`, `ws`, `wss`) or the port name, up to
/// its first `-`. A name that says nothing is TCP here (istiod would sniff the protocol).
pub fn protocol(port: &kube::ServicePort) -> String {
    if port.protocol == "UDP" {
        return "UDP".into();
    }
    let name = match port.app_protocol.as_deref() {
        Some("kubernetes.io/h2c") => return "HTTP2".into(),
        Some("kubernetes.io/ws") => return "HTTP".into(),
        Some("kubernetes.io/wss") => return "HTTPS".into(),
        Some(a) => a,
        None => port.name.as_str(),
    };
    if name.len() >= 8 && name[..8].eq_ignore_ascii_case("grpc-web") {
        return "HTTP".into(); // gRPC-Web is HTTP/1.1 on the wire
    }
    let prefix = name.split('-').next().unwrap_or_default();
    match prefix.to_ascii_lowercase().as_str() {
        "http" | "http_proxy" => "HTTP",
        "http2" => "HTTP2",
        "grpc" => "GRPC",
        "https" => "HTTPS",
        "tls" => "TLS",
        "mongo" => "MONGO",
        "mysql" => "MYSQL",
        "redis" => "REDIS",
        "udp" => "UDP",
        _ => "TCP",
    }
    .into()
}

fn selector_matches(selector: &Labels, labels: &Labels) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn is_istio_tls(labels: &Labels) -> bool {
    labels.get("security.istio.io/tlsMode").map(String::as_str) == Some("istio")
}

/// An endpoint at `address`, with its Pod's metadata when there is one.
fn endpoint(address: &str, ns: &str, pod: Option<&Object<kube::Pod>>, healthy: bool) -> Endpoint {
    let (labels, sa, pod_ns, hostname, subdomain) = match pod {
        Some(p) => (
            p.meta.labels.clone(),
            p.spec.service_account.clone(),
            p.meta.namespace.clone(),
            // The pod's own DNS name exists only under a subdomain (Istio's endpoint builder).
            if p.spec.subdomain.is_empty() {
                String::new()
            } else {
                p.spec.hostname.clone()
            },
            p.spec.subdomain.clone(),
        ),
        None => (
            Labels::new(),
            "default".into(),
            ns.to_string(),
            String::new(),
            String::new(),
        ),
    };
    Endpoint {
        address: address.to_string(),
        ports: BTreeMap::new(),
        istio_tls: is_istio_tls(&labels),
        labels,
        locality: String::new(),
        weight: 1,
        namespace: pod_ns,
        service_account: sa,
        healthy,
        hostname,
        subdomain,
    }
}

/// Endpoints of `svc` from endpoint lists (slices, or the subsets of a `v1 Endpoints`).
fn from_lists<'a>(
    config: &'a Config,
    ns: &str,
    lists: impl Iterator<Item = &'a kube::EndpointSlice>,
) -> Vec<Endpoint> {
    let mut by_addr: BTreeMap<String, Endpoint> = BTreeMap::new();
    for list in lists.filter(|l| l.address_type != "FQDN") {
        for e in &list.endpoints {
            for a in &e.addresses {
                let pod = match &e.pod {
                    // An endpoint naming a Pod that is not in the config is skipped, as istiod
                    // does: its identity is unknown.
                    Some((pns, pname)) => match config
                        .pods
                        .iter()
                        .find(|p| &p.meta.namespace == pns && &p.meta.name == pname)
                    {
                        Some(p) => Some(p),
                        None => continue,
                    },
                    None => config
                        .pods
                        .iter()
                        .find(|p| p.meta.namespace == ns && p.spec.ips.contains(a)),
                };
                let ep = by_addr
                    .entry(a.clone())
                    .or_insert_with(|| endpoint(a, ns, pod, e.ready));
                for p in &list.ports {
                    ep.ports.insert(p.name.clone(), p.port);
                }
            }
        }
    }
    by_addr.into_values().collect()
}

/// Endpoints of a selector-only Service: the Pods it selects, on each port's target.
fn from_pods(
    config: &Config,
    ns: &str,
    selector: &Labels,
    ports: &[kube::ServicePort],
) -> Vec<Endpoint> {
    let mut out = Vec::new();
    for p in config.pods.iter().filter(|p| p.meta.namespace == ns) {
        if !selector_matches(selector, &p.meta.labels) {
            continue;
        }
        // Each port's target on this pod; a pod without a named target port is not an
        // endpoint (the EndpointSlice controller would not list it for that port).
        let targets: Option<BTreeMap<String, u32>> = ports
            .iter()
            .map(|sp| {
                let target = match &sp.target_port {
                    None => Some(sp.port),
                    Some(TargetPort::Number(n)) => Some(*n),
                    Some(TargetPort::Name(name)) => p
                        .spec
                        .container_ports
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, v)| *v),
                };
                target.map(|t| (sp.name.clone(), t))
            })
            .collect();
        let Some(targets) = targets else { continue };
        for ip in &p.spec.ips {
            let mut ep = endpoint(ip, ns, Some(p), p.spec.ready);
            ep.ports = targets.clone();
            out.push(ep);
        }
    }
    out.sort_by(|a, b| a.address.cmp(&b.address));
    out
}

/// Every Kubernetes Service in `config` as a mesh service under `domain` (`cluster.local`).
pub(super) fn services(config: &Config, domain: &str) -> Vec<Service> {
    let mut out = Vec::new();
    for o in &config.services {
        let (name, ns, spec) = (&o.meta.name, &o.meta.namespace, &o.spec);
        let ports: Vec<Port> = spec
            .ports
            .iter()
            .map(|p| Port {
                number: p.port,
                name: p.name.clone(),
                protocol: protocol(p),
                target_port: match p.target_port {
                    Some(TargetPort::Number(n)) => Some(n),
                    _ => None,
                },
            })
            .collect();
        let external = spec.service_type == "ExternalName";
        let endpoints = if external {
            // An ExternalName service resolves its name by DNS (no VIP, no NDS entry).
            let mut ep = endpoint(&spec.external_name, ns, None, true);
            ep.ports.clear();
            vec![ep]
        } else {
            let slices: Vec<&kube::EndpointSlice> = config
                .endpoint_slices
                .iter()
                .filter(|s| &s.meta.namespace == ns && &s.spec.service_name == name)
                .map(|s| &s.spec)
                .collect();
            let legacy = config
                .endpoints
                .iter()
                .find(|e| &e.meta.namespace == ns && &e.meta.name == name);
            match (slices.is_empty(), legacy, &spec.selector) {
                (false, _, _) => from_lists(config, ns, slices.into_iter()),
                (true, Some(l), _) => from_lists(config, ns, l.spec.iter()),
                (true, None, Some(sel)) => from_pods(config, ns, sel, &spec.ports),
                (true, None, None) => Vec::new(),
            }
        };
        out.push(Service {
            host: format!("{name}.{ns}.svc.{domain}"),
            namespace: ns.clone(),
            name: name.clone(),
            registry: Registry::Kubernetes,
            vips: spec.cluster_ips.clone(),
            auto_vip: None,
            auto_vip6: None,
            ports,
            location: if external {
                Location::MeshExternal
            } else {
                Location::MeshInternal
            },
            resolution: if external {
                Resolution::Dns
            } else if spec.headless {
                Resolution::None
            } else {
                Resolution::Static
            },
            endpoints,
            subject_alt_names: Vec::new(),
            // The selector is resolved into endpoints above; inbound matches by endpoint IP.
            selector: None,
            publish_not_ready: spec.publish_not_ready_addresses,
            export_to: spec.export_to.clone(),
        });
    }
    out
}
