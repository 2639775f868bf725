//! The mesh as the proxies see it: the immutable snapshot built from a config revision, the
//! derived service index, and the proxies' identity as parsed from their xDS node.
//!
//! It knows the typed config (below it) and nothing of xDS (above it): the xDS side generates
//! Envoy resources from a snapshot and owns the cache of what it generated.

mod follow;
mod proxy;

pub use follow::follow;
pub use proxy::{Proxy, ProxyError, ProxyView};

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Instant;

use crate::config::kinds::{
    DestinationRule, Labels, Location, MtlsMode, PeerAuthentication, Resolution, ServiceEntry,
    Sidecar, VirtualService,
};
use crate::config::{Config, Object, Revision};

/// Mesh-wide settings (from `--trust-domain`, `--mesh` and the environment).
#[derive(Clone, Debug, PartialEq)]
pub struct MeshSettings {
    pub trust_domain: String,
    /// Namespace whose namespace-wide policies apply mesh-wide.
    pub root_namespace: String,
    /// `outboundTrafficPolicy.mode: ALLOW_ANY` (default) vs `REGISTRY_ONLY`.
    pub allow_any: bool,
    /// `PILOT_ENABLE_IP_AUTOALLOCATE`: allocate VIPs for address-less ServiceEntries.
    pub ip_autoallocate: bool,
    /// Kubernetes-style DNS domain suffix, `cluster.local`.
    pub dns_domain: String,
}

impl Default for MeshSettings {
    fn default() -> Self {
        MeshSettings {
            trust_domain: "cluster.local".into(),
            root_namespace: "istio-system".into(),
            allow_any: true,
            ip_autoallocate: true,
            dns_domain: "cluster.local".into(),
        }
    }
}

/// A service port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    pub number: u32,
    pub name: String,
    /// Upper-case protocol; `TCP` when unset.
    pub protocol: String,
    pub target_port: Option<u32>,
}

impl Port {
    pub fn is_http(&self) -> bool {
        matches!(self.protocol.as_str(), "HTTP" | "HTTP2" | "GRPC")
    }
}

/// An endpoint of a service (a WorkloadEntry, selected or inline).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub address: String,
    pub ports: BTreeMap<String, u32>,
    pub labels: Labels,
    pub locality: String,
    pub weight: u32,
    pub namespace: String,
    pub service_account: String,
    /// Has a sidecar that terminates Istio mTLS (`security.istio.io/tlsMode: istio`).
    pub istio_tls: bool,
}

impl Endpoint {
    /// The port this endpoint serves `port` on.
    pub fn port_for(&self, port: &Port) -> u32 {
        self.ports
            .get(&port.name)
            .copied()
            .or(port.target_port)
            .unwrap_or(port.number)
    }
}

/// One host of a ServiceEntry, with its derived data.
#[derive(Clone, Debug)]
pub struct Service {
    pub host: String,
    pub namespace: String,
    /// Explicit `addresses` (IPs; CIDRs kept as written).
    pub vips: Vec<String>,
    /// Auto-allocated VIP (240.240.0.0/16) when the ServiceEntry has no addresses.
    pub auto_vip: Option<Ipv4Addr>,
    pub ports: Vec<Port>,
    pub location: Location,
    pub resolution: Resolution,
    pub endpoints: Vec<Endpoint>,
    pub subject_alt_names: Vec<String>,
    pub selector: Option<Labels>,
}

/// An immutable view of the configuration with a version; pushes are generated from it.
pub struct Snapshot {
    pub version: String,
    pub created: Instant,
    pub config: Arc<Config>,
    pub mesh: Arc<MeshSettings>,
    pub services: Vec<Service>,
    /// Endpoint IPs of services without a workload selector: the only proxy IPs generation
    /// depends on (inbound matching); see [`Snapshot::distinguishing_view`].
    endpoint_ips: BTreeSet<String>,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("version", &self.version)
            .field("services", &self.services.len())
            .finish_non_exhaustive()
    }
}

fn selector_matches(selector: &Labels, labels: &Labels) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// FNV-1a, for stable VIP allocation.
fn fnv(s: &str) -> u64 {
    let mut h = 0xcbf29ce484222325u64;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Host matching with Istio wildcards (`*`, `*.example.com`).
pub fn host_matches(pattern: &str, host: &str) -> bool {
    if pattern == "*" || pattern == host {
        return true;
    }
    match pattern.strip_prefix("*.") {
        Some(suffix) => {
            host.len() > suffix.len() + 1
                && host.ends_with(suffix)
                && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
        }
        None => false,
    }
}

impl Snapshot {
    /// Builds a snapshot of `config` as revision `version` (shown as `<unix secs>/<n>`).
    pub fn new(config: Arc<Config>, mesh: Arc<MeshSettings>, version: u64) -> Snapshot {
        Snapshot::from_revision(&Revision::new(config, version), mesh)
    }

    /// Builds the snapshot of a config revision; it carries the revision's version and load time.
    pub fn from_revision(revision: &Revision, mesh: Arc<MeshSettings>) -> Snapshot {
        let config = revision.config.clone();
        let services = build_services(&config);
        let endpoint_ips = services
            .iter()
            .filter(|s| s.selector.is_none())
            .flat_map(|s| s.endpoints.iter().map(|e| e.address.clone()))
            .collect();
        Snapshot {
            version: revision.version.clone(),
            created: revision.loaded,
            config,
            mesh,
            services,
            endpoint_ips,
        }
    }

    /// `view` without what this snapshot cannot tell apart: IPs no service refers to are
    /// dropped, so proxies that differ only in those get equal resources (one generation).
    pub fn distinguishing_view(&self, view: &ProxyView) -> ProxyView {
        let mut key = view.clone();
        key.ips.retain(|ip| self.endpoint_ips.contains(ip));
        key
    }

    /// Services visible to a proxy (Sidecar egress scoping).
    pub fn visible_services<'a>(&'a self, view: &ProxyView) -> Vec<&'a Service> {
        let sidecar = self.sidecar_for(view);
        self.services
            .iter()
            .filter(|s| match sidecar {
                None => true,
                Some(sc) => sc.egress.iter().any(|e| {
                    e.hosts.iter().any(|h| {
                        let Some((ns, host)) = h.split_once('/') else {
                            return false;
                        };
                        let ns_ok = ns == "*"
                            || (ns == "." && s.namespace == view.namespace)
                            || ns == s.namespace;
                        ns_ok && host_matches(host, &s.host)
                    })
                }),
            })
            .collect()
    }

    fn sidecar_for(&self, view: &ProxyView) -> Option<&Sidecar> {
        let sidecars = &self.config.sidecars;
        let in_ns = |ns: &str| {
            let ns = ns.to_string();
            sidecars.iter().filter(move |s| s.meta.namespace == ns)
        };
        in_ns(&view.namespace)
            .find(|s| {
                s.spec
                    .workload_selector
                    .as_ref()
                    .is_some_and(|sel| selector_matches(&sel.labels, &view.labels))
            })
            .or_else(|| in_ns(&view.namespace).find(|s| s.spec.workload_selector.is_none()))
            .or_else(|| {
                in_ns(&self.mesh.root_namespace).find(|s| s.spec.workload_selector.is_none())
            })
            .map(|o| &o.spec)
    }

    /// The DestinationRule for a host, as seen from `proxy_ns`.
    pub fn destination_rule(&self, proxy_ns: &str, svc: &Service) -> Option<&DestinationRule> {
        let matching = |o: &&Object<DestinationRule>| host_matches(&o.spec.host, &svc.host);
        let by_ns = |ns: &str| {
            let exact = self
                .config
                .destination_rules
                .iter()
                .find(|o| o.meta.namespace == ns && o.spec.host == svc.host);
            exact.or_else(|| {
                self.config
                    .destination_rules
                    .iter()
                    .filter(|o| o.meta.namespace == ns)
                    .find(matching)
            })
        };
        by_ns(proxy_ns)
            .or_else(|| by_ns(&svc.namespace))
            .or_else(|| by_ns(&self.mesh.root_namespace))
            .map(|o| &o.spec)
    }

    /// VirtualServices bound to the mesh that route `host`, in (namespace, name) order.
    pub fn virtual_services_for(&self, host: &str) -> Vec<&VirtualService> {
        self.config
            .virtual_services
            .iter()
            .filter(|o| o.spec.gateways.is_empty() || o.spec.gateways.iter().any(|g| g == "mesh"))
            .filter(|o| {
                o.spec.hosts.iter().any(|h| {
                    host_matches(h, host) || short_host_matches(h, &o.meta.namespace, host)
                })
            })
            .map(|o| &o.spec)
            .collect()
    }

    /// Effective inbound mTLS mode for a workload and port (PERMISSIVE when nothing says otherwise).
    pub fn mtls_mode(&self, view: &ProxyView, port: u32) -> MtlsMode {
        let pas = &self.config.peer_authentications;
        let workload: Vec<&PeerAuthentication> = pas
            .iter()
            .filter(|o| o.meta.namespace == view.namespace)
            .filter(|o| {
                o.spec
                    .selector
                    .as_ref()
                    .is_some_and(|s| selector_matches(&s.labels, &view.labels))
            })
            .map(|o| &o.spec)
            .collect();
        let ns_wide = |ns: &str| {
            pas.iter()
                .find(|o| o.meta.namespace == ns && o.spec.selector.is_none())
                .map(|o| &o.spec)
        };
        let mut candidates: Vec<MtlsMode> = Vec::new();
        for pa in &workload {
            if let Some(m) = pa.port_level_mtls.get(&port) {
                candidates.push(m.mode);
            }
        }
        for pa in &workload {
            candidates.push(pa.mtls.as_ref().map(|m| m.mode).unwrap_or_default());
        }
        for pa in [ns_wide(&view.namespace), ns_wide(&self.mesh.root_namespace)]
            .into_iter()
            .flatten()
        {
            candidates.push(pa.mtls.as_ref().map(|m| m.mode).unwrap_or_default());
        }
        candidates
            .into_iter()
            .find(|m| *m != MtlsMode::Unset)
            .unwrap_or(MtlsMode::Permissive)
    }

    /// Services whose workloads include this proxy (its inbound side): ServiceEntries with a
    /// workloadSelector matching the proxy in its namespace, or with an endpoint at its IP.
    pub fn inbound_services<'a>(&'a self, view: &ProxyView) -> Vec<&'a Service> {
        self.services
            .iter()
            .filter(|s| {
                s.namespace == view.namespace
                    && match &s.selector {
                        Some(sel) => selector_matches(sel, &view.labels),
                        None => s.endpoints.iter().any(|e| view.ips.contains(&e.address)),
                    }
            })
            .collect()
    }

    /// The VIP a proxy should use for a service (explicit, else auto-allocated when enabled).
    pub fn vips_for(&self, view: &ProxyView, svc: &Service) -> Vec<String> {
        if !svc.vips.is_empty() {
            return svc.vips.clone();
        }
        match svc.auto_vip {
            Some(ip)
                if view.dns_capture && (view.dns_auto_allocate || self.mesh.ip_autoallocate) =>
            {
                vec![ip.to_string()]
            }
            _ => Vec::new(),
        }
    }
}

fn short_host_matches(pattern: &str, ns: &str, host: &str) -> bool {
    // A VirtualService host "reviews" in namespace "default" means reviews.default.svc.<domain>.
    !pattern.contains('.') && host.starts_with(&format!("{pattern}.{ns}.svc."))
}

fn build_services(config: &Config) -> Vec<Service> {
    let mut out = Vec::new();
    for o in &config.service_entries {
        let se: &ServiceEntry = &o.spec;
        let ns = &o.meta.namespace;
        let selector = se.workload_selector.as_ref().map(|s| s.labels.clone());
        let mut endpoints: Vec<Endpoint> = Vec::new();
        let to_ep = |we: &crate::config::kinds::WorkloadEntry, we_ns: &str| Endpoint {
            address: we.address.clone(),
            ports: we.ports.clone(),
            labels: we.labels.clone(),
            locality: we.locality.clone(),
            weight: we.weight.unwrap_or(1),
            namespace: we_ns.to_string(),
            service_account: if we.service_account.is_empty() {
                "default".to_string()
            } else {
                we.service_account.clone()
            },
            istio_tls: we
                .labels
                .get("security.istio.io/tlsMode")
                .map(String::as_str)
                == Some("istio"),
        };
        for we in &se.endpoints {
            endpoints.push(to_ep(we, ns));
        }
        if let Some(sel) = &selector {
            for w in config
                .workload_entries
                .iter()
                .filter(|w| &w.meta.namespace == ns)
            {
                // A WorkloadEntry's labels are its spec labels plus its metadata labels.
                let mut labels = w.meta.labels.clone();
                labels.extend(w.spec.labels.clone());
                if selector_matches(sel, &labels) {
                    let mut ep = to_ep(&w.spec, ns);
                    ep.labels = labels;
                    ep.istio_tls = ep
                        .labels
                        .get("security.istio.io/tlsMode")
                        .map(String::as_str)
                        == Some("istio");
                    endpoints.push(ep);
                }
            }
        }
        endpoints.sort_by(|a, b| a.address.cmp(&b.address));
        let ports: Vec<Port> = se
            .ports
            .iter()
            .map(|p| Port {
                number: p.number,
                name: if p.name.is_empty() {
                    format!("port-{}", p.number)
                } else {
                    p.name.clone()
                },
                protocol: p
                    .protocol
                    .clone()
                    .unwrap_or_else(|| "TCP".into())
                    .to_ascii_uppercase(),
                target_port: p.target_port,
            })
            .collect();
        for host in &se.hosts {
            out.push(Service {
                host: host.clone(),
                namespace: ns.clone(),
                vips: se.addresses.clone(),
                auto_vip: None,
                ports: ports.clone(),
                location: se.location,
                resolution: se.resolution,
                endpoints: endpoints.clone(),
                subject_alt_names: se.subject_alt_names.clone(),
                selector: selector.clone(),
            });
        }
    }
    // Later duplicates of a host (another namespace) are dropped: first (namespace, name) wins.
    let mut seen = BTreeSet::new();
    out.retain(|s| seen.insert(s.host.clone()));
    out.sort_by(|a, b| a.host.cmp(&b.host));
    allocate_vips(&mut out);
    out
}

/// Stable auto-allocation in 240.240.0.0/16: hash the host, probe linearly on collision.
fn allocate_vips(services: &mut [Service]) {
    const SLOTS: u64 = 65534;
    let mut used = BTreeSet::new();
    for s in services.iter_mut() {
        if !s.vips.is_empty() || s.host.starts_with('*') {
            continue;
        }
        let mut slot = fnv(&s.host) % SLOTS;
        while used.contains(&slot) {
            slot = (slot + 1) % SLOTS;
        }
        used.insert(slot);
        let n = slot as u32 + 1; // skip .0.0
        s.auto_vip = Some(Ipv4Addr::new(240, 240, (n >> 8) as u8, (n & 0xff) as u8));
    }
}

#[cfg(test)]
mod tests;
