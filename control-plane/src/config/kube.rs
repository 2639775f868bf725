//! The Kubernetes kinds istiod-lite reads beside Istio's: `v1 Service`,
//! `discovery.k8s.io/v1 EndpointSlice`, `v1 Endpoints`, `v1 Pod` and `v1 Namespace`, as
//! `kubectl get ... -o yaml` writes them.
//!
//! Unlike the Istio kinds, unknown fields are ignored: kubectl's output carries `status`,
//! `managedFields` and many spec fields that do not shape the mesh. The fields that do are
//! read into the typed structs below and checked; a bad one is named with its path.
//! `v1 Endpoints` is read into the same [`EndpointSlice`] shape (one per subset), so the model
//! handles one kind of endpoint list.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::kinds::Labels;

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// `v1 Service` (the parts that shape the mesh).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Service {
    /// `spec.type`: `ClusterIP` (default), `NodePort`, `LoadBalancer` or `ExternalName`.
    pub service_type: String,
    /// `spec.clusterIPs` (or `spec.clusterIP`); empty for a headless service.
    pub cluster_ips: Vec<String>,
    /// `spec.clusterIP: None`.
    pub headless: bool,
    pub ports: Vec<ServicePort>,
    /// `spec.selector`; `None` for a service whose endpoints are managed by hand.
    pub selector: Option<Labels>,
    pub publish_not_ready_addresses: bool,
    /// `spec.externalName` of an `ExternalName` service.
    pub external_name: String,
    /// The `networking.istio.io/exportTo` annotation's entries ([`super::export_to`]).
    pub export_to: Vec<String>,
}

/// A Service port.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    pub name: String,
    pub port: u32,
    /// `TCP` (default), `UDP` or `SCTP`.
    pub protocol: String,
    pub app_protocol: Option<String>,
    pub target_port: Option<TargetPort>,
}

/// A port by number or by the name of a container port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TargetPort {
    Number(u32),
    Name(String),
}

/// `discovery.k8s.io/v1 EndpointSlice`, or one subset of a `v1 Endpoints`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSlice {
    /// The Service this list belongs to (the `kubernetes.io/service-name` label, or the
    /// Endpoints object's own name).
    pub service_name: String,
    /// `IPv4`, `IPv6` or `FQDN` (FQDN slices are skipped, as Istio does).
    pub address_type: String,
    pub endpoints: Vec<SliceEndpoint>,
    pub ports: Vec<SlicePort>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SliceEndpoint {
    pub addresses: Vec<String>,
    /// `conditions.ready` (unset means ready).
    pub ready: bool,
    /// The Pod behind the endpoint (`targetRef` of kind Pod), as (namespace, name).
    pub pod: Option<(String, String)>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlicePort {
    pub name: String,
    pub port: u32,
}

/// `v1 Pod` (the parts that shape the mesh; labels are in its metadata).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pod {
    /// `status.podIPs` (or `status.podIP`).
    pub ips: Vec<String>,
    /// `spec.serviceAccountName` (`default` when unset).
    pub service_account: String,
    /// `spec.hostname` (the pod name when unset) and `spec.subdomain`: the pod's own DNS name
    /// `<hostname>.<subdomain>.<ns>.svc.<domain>` under a headless service.
    pub hostname: String,
    pub subdomain: String,
    /// Named container ports, for Services whose `targetPort` is a name.
    pub container_ports: Vec<(String, u32)>,
    /// The `Ready` condition (a pod without conditions, as written by hand, is ready).
    pub ready: bool,
}

/// `v1 Namespace` (its labels are in its metadata).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Namespace {}

// --- the documents as kubectl writes them (unknown fields ignored) ---

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawService {
    metadata: RawMetadata,
    spec: RawServiceSpec,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawMetadata {
    annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawServiceSpec {
    #[serde(rename = "type")]
    service_type: Option<String>,
    #[serde(rename = "clusterIP")]
    cluster_ip: Option<String>,
    #[serde(rename = "clusterIPs")]
    cluster_ips: Vec<String>,
    ports: Vec<RawServicePort>,
    selector: Option<Labels>,
    publish_not_ready_addresses: bool,
    external_name: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawServicePort {
    #[serde(default)]
    name: String,
    port: u32,
    #[serde(default)]
    protocol: Option<String>,
    #[serde(default)]
    app_protocol: Option<String>,
    #[serde(default)]
    target_port: Option<TargetPort>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawSlice {
    address_type: Option<String>,
    endpoints: Option<Vec<RawSliceEndpoint>>,
    ports: Option<Vec<RawSlicePort>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawSliceEndpoint {
    addresses: Vec<String>,
    conditions: RawConditions,
    target_ref: Option<RawRef>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawConditions {
    ready: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawRef {
    kind: String,
    name: String,
    namespace: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawSlicePort {
    name: Option<String>,
    port: Option<u32>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawEndpoints {
    subsets: Vec<RawSubset>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawSubset {
    addresses: Vec<RawAddress>,
    not_ready_addresses: Vec<RawAddress>,
    ports: Vec<RawSlicePort>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawAddress {
    ip: String,
    target_ref: Option<RawRef>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawPod {
    spec: RawPodSpec,
    status: RawPodStatus,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawPodSpec {
    service_account_name: Option<String>,
    hostname: Option<String>,
    subdomain: Option<String>,
    containers: Vec<RawContainer>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawContainer {
    ports: Vec<RawContainerPort>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawContainerPort {
    #[serde(default)]
    name: String,
    container_port: u32,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawPodStatus {
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(rename = "podIPs")]
    pod_ips: Vec<RawPodIp>,
    conditions: Option<Vec<RawCondition>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawPodIp {
    ip: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawCondition {
    #[serde(rename = "type")]
    kind: String,
    status: String,
}

type DocError = (String, String);

fn check_port(field: String, n: u32) -> Result<(), DocError> {
    if (1..=65535).contains(&n) {
        Ok(())
    } else {
        Err((field, format!("{n} is not a port (1-65535)")))
    }
}

fn check_ip(field: String, s: &str) -> Result<(), DocError> {
    s.parse::<IpAddr>()
        .map(|_| ())
        .map_err(|_| (field, format!("{s:?} is not an IP address")))
}

/// The `apiVersion` each Kubernetes kind must carry.
pub fn api_version(kind: &str) -> Option<&'static str> {
    match kind {
        "Service" | "Endpoints" | "Pod" | "Namespace" => Some("v1"),
        "EndpointSlice" => Some("discovery.k8s.io/v1"),
        _ => None,
    }
}

/// Parses a `v1 Service` document.
pub(super) fn service(raw: RawServiceDoc) -> Result<Service, DocError> {
    let export_to = raw
        .0
        .metadata
        .annotations
        .get(super::export_to::ANNOTATION)
        .map(|v| super::export_to::parse_annotation(v))
        .unwrap_or_default();
    super::export_to::check(
        &format!("metadata.annotations[{}]", super::export_to::ANNOTATION),
        &export_to,
    )?;
    let spec = raw.0.spec;
    let service_type = spec.service_type.unwrap_or_else(|| "ClusterIP".into());
    if !["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"].contains(&service_type.as_str()) {
        return Err((
            "spec.type".into(),
            format!("{service_type:?} is not ClusterIP, NodePort, LoadBalancer or ExternalName"),
        ));
    }
    let cluster_ip = spec.cluster_ip.unwrap_or_default();
    let headless = cluster_ip == "None";
    let cluster_ips = if headless {
        Vec::new()
    } else {
        cluster_ips(cluster_ip, spec.cluster_ips)?
    };
    let external_name = spec.external_name.unwrap_or_default();
    if service_type == "ExternalName" && external_name.is_empty() {
        return Err((
            "spec.externalName".into(),
            "required for type ExternalName".into(),
        ));
    }
    let ports = service_ports(spec.ports)?;
    Ok(Service {
        service_type,
        cluster_ips,
        headless,
        ports,
        selector: spec.selector.filter(|s| !s.is_empty()),
        publish_not_ready_addresses: spec.publish_not_ready_addresses,
        external_name,
        export_to,
    })
}

/// `spec.clusterIPs`, else `spec.clusterIP` (of a Service that is not headless), each checked.
fn cluster_ips(cluster_ip: String, cluster_ips: Vec<String>) -> Result<Vec<String>, DocError> {
    if cluster_ips.is_empty() {
        if cluster_ip.is_empty() {
            return Ok(Vec::new());
        }
        check_ip("spec.clusterIP".into(), &cluster_ip)?;
        return Ok(vec![cluster_ip]);
    }
    for (i, ip) in cluster_ips.iter().enumerate() {
        check_ip(format!("spec.clusterIPs[{i}]"), ip)?;
    }
    Ok(cluster_ips)
}

/// `spec.ports`: each port, protocol and target port checked, names distinct.
fn service_ports(raw: Vec<RawServicePort>) -> Result<Vec<ServicePort>, DocError> {
    let mut ports = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for (i, p) in raw.into_iter().enumerate() {
        let f = |x: &str| format!("spec.ports[{i}].{x}");
        check_port(f("port"), p.port)?;
        let protocol = p.protocol.unwrap_or_else(|| "TCP".into());
        if !["TCP", "UDP", "SCTP"].contains(&protocol.as_str()) {
            return Err((
                f("protocol"),
                format!("{protocol:?} is not TCP, UDP or SCTP"),
            ));
        }
        match &p.target_port {
            Some(TargetPort::Number(n)) => check_port(f("targetPort"), *n)?,
            Some(TargetPort::Name(n)) if n.is_empty() => {
                return Err((f("targetPort"), "empty port name".into()));
            }
            _ => {}
        }
        if !names.insert(p.name.clone()) {
            return Err((
                f("name"),
                format!(
                    "{:?} is used by another port (ports of a multi-port service need distinct names)",
                    p.name
                ),
            ));
        }
        ports.push(ServicePort {
            name: p.name,
            port: p.port,
            protocol,
            app_protocol: p.app_protocol,
            // A numeric string ("8080") is a number, as the API server reads it.
            target_port: p.target_port.map(|t| match t {
                TargetPort::Name(s) => s
                    .parse::<u32>()
                    .map(TargetPort::Number)
                    .unwrap_or(TargetPort::Name(s)),
                n => n,
            }),
        });
    }
    Ok(ports)
}

/// The raw documents, deserialised by the caller's path-reporting reader.
#[derive(Deserialize)]
#[serde(transparent)]
pub(super) struct RawServiceDoc(RawService);
#[derive(Deserialize)]
#[serde(transparent)]
pub(super) struct RawSliceDoc(RawSlice);
#[derive(Deserialize)]
#[serde(transparent)]
pub(super) struct RawEndpointsDoc(RawEndpoints);
#[derive(Deserialize)]
#[serde(transparent)]
pub(super) struct RawPodDoc(RawPod);

fn pod_ref(r: Option<RawRef>, ns: &str) -> Option<(String, String)> {
    r.filter(|r| r.kind == "Pod" && !r.name.is_empty())
        .map(|r| (r.namespace.unwrap_or_else(|| ns.to_string()), r.name))
}

fn slice_ports(ports: Vec<RawSlicePort>, at: &str) -> Result<Vec<SlicePort>, DocError> {
    let mut out = Vec::new();
    for (i, p) in ports.into_iter().enumerate() {
        let Some(port) = p.port else {
            continue; // a port that is not set: "all ports" (no endpoint port to route to)
        };
        check_port(format!("{at}[{i}].port"), port)?;
        out.push(SlicePort {
            name: p.name.unwrap_or_default(),
            port,
        });
    }
    Ok(out)
}

/// Parses a `discovery.k8s.io/v1 EndpointSlice` of namespace `ns` with metadata `labels`.
pub(super) fn endpoint_slice(
    raw: RawSliceDoc,
    ns: &str,
    labels: &Labels,
) -> Result<EndpointSlice, DocError> {
    let raw = raw.0;
    let service_name = labels.get(SERVICE_NAME_LABEL).cloned().ok_or_else(|| {
        (
            format!("metadata.labels.{SERVICE_NAME_LABEL}"),
            "missing (it names the Service the slice belongs to)".to_string(),
        )
    })?;
    let address_type = raw
        .address_type
        .ok_or_else(|| ("addressType".to_string(), "missing".to_string()))?;
    if !["IPv4", "IPv6", "FQDN"].contains(&address_type.as_str()) {
        return Err((
            "addressType".into(),
            format!("{address_type:?} is not IPv4, IPv6 or FQDN"),
        ));
    }
    let mut endpoints = Vec::new();
    for (i, e) in raw.endpoints.unwrap_or_default().into_iter().enumerate() {
        if address_type != "FQDN" {
            for (j, a) in e.addresses.iter().enumerate() {
                check_ip(format!("endpoints[{i}].addresses[{j}]"), a)?;
                let v6 = a.contains(':');
                if v6 != (address_type == "IPv6") {
                    return Err((
                        format!("endpoints[{i}].addresses[{j}]"),
                        format!("{a:?} is not of addressType {address_type}"),
                    ));
                }
            }
        }
        endpoints.push(SliceEndpoint {
            addresses: e.addresses,
            ready: e.conditions.ready.unwrap_or(true),
            pod: pod_ref(e.target_ref, ns),
        });
    }
    Ok(EndpointSlice {
        service_name,
        address_type,
        endpoints,
        ports: slice_ports(raw.ports.unwrap_or_default(), "ports")?,
    })
}

/// Parses a `v1 Endpoints` named `name` in `ns` into one list per subset.
pub(super) fn endpoints(
    raw: RawEndpointsDoc,
    name: &str,
    ns: &str,
) -> Result<Vec<EndpointSlice>, DocError> {
    let mut out = Vec::new();
    for (i, s) in raw.0.subsets.into_iter().enumerate() {
        let mut endpoints = Vec::new();
        let ready = s.addresses.into_iter().map(|a| (a, true));
        let not_ready = s.not_ready_addresses.into_iter().map(|a| (a, false));
        for (j, (a, is_ready)) in ready.chain(not_ready).enumerate() {
            check_ip(format!("subsets[{i}].addresses[{j}].ip"), &a.ip)?;
            endpoints.push(SliceEndpoint {
                addresses: vec![a.ip],
                ready: is_ready,
                pod: pod_ref(a.target_ref, ns),
            });
        }
        out.push(EndpointSlice {
            service_name: name.to_string(),
            address_type: "IP".into(),
            endpoints,
            ports: slice_ports(s.ports, &format!("subsets[{i}].ports"))?,
        });
    }
    Ok(out)
}

/// Parses a `v1 Pod` named `name`.
pub(super) fn pod(raw: RawPodDoc, name: &str) -> Result<Pod, DocError> {
    let raw = raw.0;
    let mut ips: Vec<String> = raw.status.pod_ips.into_iter().map(|p| p.ip).collect();
    if ips.is_empty()
        && let Some(ip) = raw.status.pod_ip.filter(|s| !s.is_empty())
    {
        ips.push(ip);
    }
    for (i, ip) in ips.iter().enumerate() {
        check_ip(format!("status.podIPs[{i}].ip"), ip)?;
    }
    let mut container_ports = Vec::new();
    for (i, c) in raw.spec.containers.into_iter().enumerate() {
        for (j, p) in c.ports.into_iter().enumerate() {
            check_port(
                format!("spec.containers[{i}].ports[{j}].containerPort"),
                p.container_port,
            )?;
            if !p.name.is_empty() {
                container_ports.push((p.name, p.container_port));
            }
        }
    }
    let ready = match raw.status.conditions {
        None => true,
        Some(cs) => cs.iter().any(|c| c.kind == "Ready" && c.status == "True"),
    };
    Ok(Pod {
        ips,
        service_account: raw
            .spec
            .service_account_name
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".into()),
        hostname: raw
            .spec
            .hostname
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| name.to_string()),
        subdomain: raw.spec.subdomain.unwrap_or_default(),
        container_ports,
        ready,
    })
}
