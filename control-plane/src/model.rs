//! The mesh as the proxies see it: the immutable snapshot built from a config revision, the
//! derived service index, and the proxies' identity as parsed from their xDS node.
//!
//! It knows the typed config (below it) and nothing of xDS (above it): the xDS side generates
//! Envoy resources from a snapshot and owns the cache of what it generated.

mod follow;
mod kube;
mod proxy;

pub use follow::Follower;
pub use proxy::{Proxy, ProxyView};

#[cfg(test)]
use proxy::ProxyError;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Instant;

use crate::config::kinds::{
    DestinationRule, Labels, Location, MtlsMode, PeerAuthentication, Resolution, ServiceEntry,
    Sidecar, VirtualService,
};
use crate::config::{Config, Object, Revision, export_to};

/// Mesh-wide settings (from `--trust-domain`, `--mesh` and the environment).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
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
    /// Ready (an EndpointSlice's `conditions.ready`); others are sent as unhealthy.
    pub healthy: bool,
    /// A Kubernetes Pod's `hostname` and `subdomain` when it has a subdomain: under a headless
    /// service the pod answers to `<hostname>.<subdomain>.<ns>.svc.<domain>`.
    pub hostname: String,
    pub subdomain: String,
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

/// Where a service comes from (NDS `registry`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Registry {
    /// A ServiceEntry host.
    External,
    /// A Kubernetes Service.
    Kubernetes,
}

impl Registry {
    /// The name istiod uses (`provider.ID`).
    pub fn as_str(self) -> &'static str {
        match self {
            Registry::External => "External",
            Registry::Kubernetes => "Kubernetes",
        }
    }
}

/// One host of a ServiceEntry, or a Kubernetes Service, with its derived data.
#[derive(Clone, Debug)]
pub struct Service {
    pub host: String,
    pub namespace: String,
    /// The object's name (a Kubernetes Service's short name).
    pub name: String,
    pub registry: Registry,
    /// Explicit `addresses` (IPs; CIDRs kept as written), or a Service's cluster IPs.
    pub vips: Vec<String>,
    /// Auto-allocated VIPs (240.240.0.0/16, 2001:2::/48) when the ServiceEntry has no addresses.
    pub auto_vip: Option<Ipv4Addr>,
    pub auto_vip6: Option<Ipv6Addr>,
    pub ports: Vec<Port>,
    pub location: Location,
    pub resolution: Resolution,
    pub endpoints: Vec<Endpoint>,
    pub subject_alt_names: Vec<String>,
    pub selector: Option<Labels>,
    /// A Service's `publishNotReadyAddresses`: not-ready endpoints are in its DNS answers.
    pub publish_not_ready: bool,
    /// Namespaces that see it (`exportTo`; empty: all).
    pub export_to: Vec<String>,
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

/// FNV-1a, 32 bits (Go's `hash/fnv` New32a), for istiod's VIP allocation.
fn fnv32a(s: &str) -> u32 {
    let mut h = 0x811c9dc5u32;
    for b in s.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x01000193);
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
        let services = build_services(&config, &mesh);
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

    /// Services visible to a proxy: exported to its namespace, and within its Sidecar's egress.
    pub fn visible_services<'a>(&'a self, view: &ProxyView) -> Vec<&'a Service> {
        let sidecar = self.sidecar_for(view);
        self.services
            .iter()
            .filter(|s| export_to::visible(&s.export_to, &s.namespace, &view.namespace))
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

    /// The DestinationRule for a host, as seen from `proxy_ns` (only those exported to it).
    pub fn destination_rule(&self, proxy_ns: &str, svc: &Service) -> Option<&DestinationRule> {
        let matching = |o: &&Object<DestinationRule>| host_matches(&o.spec.host, &svc.host);
        let in_ns = |ns: &str| {
            let ns = ns.to_string();
            self.config.destination_rules.iter().filter(move |o| {
                o.meta.namespace == ns
                    && export_to::visible(&o.spec.export_to, &o.meta.namespace, proxy_ns)
            })
        };
        let by_ns = |ns: &str| {
            let exact = in_ns(ns).find(|o| o.spec.host == svc.host);
            exact.or_else(|| in_ns(ns).find(matching))
        };
        by_ns(proxy_ns)
            .or_else(|| by_ns(&svc.namespace))
            .or_else(|| by_ns(&self.mesh.root_namespace))
            .map(|o| &o.spec)
    }

    /// VirtualServices bound to the mesh, exported to `proxy_ns`, that route `host`, in
    /// (namespace, name) order.
    pub fn virtual_services_for(&self, proxy_ns: &str, host: &str) -> Vec<&VirtualService> {
        self.config
            .virtual_services
            .iter()
            .filter(|o| o.spec.gateways.is_empty() || o.spec.gateways.iter().any(|g| g == "mesh"))
            .filter(|o| export_to::visible(&o.spec.export_to, &o.meta.namespace, proxy_ns))
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

    /// The VIPs a proxy should use for a service, as istiod's `GetAllAddressesForProxy`: a
    /// Service's cluster IPs of the proxy's IP families; a ServiceEntry's addresses as
    /// written; else the auto-allocated ones of the proxy's families, for a proxy that
    /// captures DNS with auto-allocation on.
    pub fn vips_for(&self, view: &ProxyView, svc: &Service) -> Vec<String> {
        let (v4, v6) = ip_families(view);
        let family = |ip: &IpAddr| (ip.is_ipv4() && v4) || (ip.is_ipv6() && v6);
        if !svc.vips.is_empty() {
            if svc.registry == Registry::External {
                return svc.vips.clone();
            }
            return svc
                .vips
                .iter()
                .filter(|v| v.parse::<IpAddr>().is_ok_and(|ip| family(&ip)))
                .cloned()
                .collect();
        }
        if !(view.dns_capture && (view.dns_auto_allocate || self.mesh.ip_autoallocate)) {
            return Vec::new();
        }
        let auto = [svc.auto_vip.map(IpAddr::V4), svc.auto_vip6.map(IpAddr::V6)];
        auto.into_iter()
            .flatten()
            .filter(family)
            .map(|ip| ip.to_string())
            .collect()
    }

    /// The proxy's own ports of its inbound services: (the port the workload listens on, the
    /// service port). The workload's port is its endpoint's (`port_for`) when the service has
    /// an endpoint at the proxy's IP, else the port's `targetPort` (or the port itself).
    pub fn inbound_ports<'a>(&'a self, view: &ProxyView) -> Vec<(u32, &'a Port)> {
        let mut out = Vec::new();
        for svc in self.inbound_services(view) {
            let own = svc.endpoints.iter().find(|e| view.ips.contains(&e.address));
            for port in &svc.ports {
                let target = match own {
                    Some(e) => e.port_for(port),
                    None => port.target_port.unwrap_or(port.number),
                };
                out.push((target, port));
            }
        }
        out
    }
}

fn short_host_matches(pattern: &str, ns: &str, host: &str) -> bool {
    // A VirtualService host "reviews" in namespace "default" means reviews.default.svc.<domain>.
    !pattern.contains('.') && host.starts_with(&format!("{pattern}.{ns}.svc."))
}

/// The IP families a proxy uses (IPv4 when it reports no IP), as istiod's IP mode.
fn ip_families(view: &ProxyView) -> (bool, bool) {
    let ips: Vec<IpAddr> = view.ips.iter().filter_map(|s| s.parse().ok()).collect();
    let v6 = ips.iter().any(|ip| ip.is_ipv6());
    let v4 = ips.iter().any(|ip| ip.is_ipv4()) || !v6;
    (v4, v6)
}

fn build_services(config: &Config, mesh: &MeshSettings) -> Vec<Service> {
    // Kubernetes Services first: for a host both define, the Service wins (as in istiod's
    // name table, where the Kubernetes registry takes precedence over a ServiceEntry).
    let mut out = kube::services(config, &mesh.dns_domain);
    for o in &config.service_entries {
        let se: &ServiceEntry = &o.spec;
        let ns = &o.meta.namespace;
        let selector = se.workload_selector.as_ref().map(|s| s.labels.clone());
        let endpoints = entry_endpoints(config, se, ns, selector.as_ref());
        let ports = entry_ports(se);
        for host in &se.hosts {
            out.push(Service {
                host: host.clone(),
                namespace: ns.clone(),
                name: o.meta.name.clone(),
                registry: Registry::External,
                vips: se.addresses.clone(),
                auto_vip: None,
                auto_vip6: None,
                ports: ports.clone(),
                location: se.location,
                resolution: se.resolution,
                endpoints: endpoints.clone(),
                subject_alt_names: se.subject_alt_names.clone(),
                selector: selector.clone(),
                publish_not_ready: false,
                export_to: se.export_to.clone(),
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

/// A ServiceEntry's endpoints: its own, then the WorkloadEntries of its namespace that its
/// selector matches, ordered by address.
fn entry_endpoints(
    config: &Config,
    se: &ServiceEntry,
    ns: &str,
    selector: Option<&Labels>,
) -> Vec<Endpoint> {
    let mut endpoints: Vec<Endpoint> = se
        .endpoints
        .iter()
        .map(|we| workload_endpoint(we, ns))
        .collect();
    if let Some(sel) = selector {
        for w in config
            .workload_entries
            .iter()
            .filter(|w| w.meta.namespace == ns)
        {
            // A WorkloadEntry's labels are its spec labels plus its metadata labels.
            let mut labels = w.meta.labels.clone();
            labels.extend(w.spec.labels.clone());
            if selector_matches(sel, &labels) {
                let mut ep = workload_endpoint(&w.spec, ns);
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
    endpoints
}

/// The endpoint of a WorkloadEntry (inline in a ServiceEntry or its own object) in `ns`.
fn workload_endpoint(we: &crate::config::kinds::WorkloadEntry, ns: &str) -> Endpoint {
    Endpoint {
        address: we.address.clone(),
        ports: we.ports.clone(),
        labels: we.labels.clone(),
        locality: we.locality.clone(),
        weight: we.weight.unwrap_or(1),
        namespace: ns.to_string(),
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
        healthy: true,
        hostname: String::new(),
        subdomain: String::new(),
    }
}

/// A ServiceEntry's ports: unnamed ones named `port-<n>`, protocols upper case (TCP when unset).
fn entry_ports(se: &ServiceEntry) -> Vec<Port> {
    se.ports
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
        .collect()
}

/// istiod's deterministic auto-allocation (`autoAllocateIPs`, the allocation a proxy sees
/// without the allocator controller's status): for each ServiceEntry host without addresses,
/// not a wildcard and not resolution NONE, hash `<namespace>/<host>` (FNV-1a 32) into one of
/// 256 × 254 slots, double hashing on collision; the n-th slot (1-based, skipping multiples of
/// 255) is `240.240.<n / 255>.<n % 255>` and `2001:2::f0f0:<hex>`.
fn allocate_vips(services: &mut [Service]) {
    const MAX: u32 = 256 * 254;
    const PRIME: u32 = 65011;
    let mut slots: Vec<Option<usize>> = vec![None; MAX as usize];
    let mut order: Vec<usize> = (0..services.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&services[a], &services[b]);
        (&a.namespace, &a.host).cmp(&(&b.namespace, &b.host))
    });
    for i in order {
        let s = &services[i];
        if s.registry != Registry::External
            || !s.vips.is_empty()
            || s.host.starts_with('*')
            || s.resolution == Resolution::None
        {
            continue;
        }
        let h = fnv32a(&format!("{}/{}", s.namespace, s.host));
        let mut slot = h % MAX;
        if slots[slot as usize].is_some() {
            let step = PRIME - (h % PRIME);
            let mut k = 1u32;
            loop {
                slot = h.wrapping_add(k.wrapping_mul(step)) % (MAX - 1);
                if slots[slot as usize].is_none() {
                    break;
                }
                k += 1;
            }
        }
        slots[slot as usize] = Some(i);
    }
    let mut x = 0u32;
    for slot in slots {
        x += 1;
        let Some(i) = slot else { continue };
        if x.is_multiple_of(255) {
            x += 1;
        }
        let (a, b) = (x / 255, x % 255);
        let s = &mut services[i];
        s.auto_vip = Some(Ipv4Addr::new(240, 240, a as u8, b as u8));
        let last = if a == 0 {
            format!("{b:x}")
        } else {
            format!("{a:x}{b:x}")
        };
        s.auto_vip6 = u16::from_str_radix(&last, 16)
            .ok()
            .map(|l| Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0xf0f0, l));
    }
}

#[cfg(test)]
mod tests;
