//! The Istio resource kinds istiod-lite understands, as serde types (`spec` only; unknown fields
//! are errors so that typos are reported with their path).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub type Labels = BTreeMap<String, String>;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadSelector {
    #[serde(default)]
    pub labels: Labels,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Location {
    MeshExternal,
    #[default]
    MeshInternal,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Resolution {
    #[default]
    None,
    Static,
    Dns,
    DnsRoundRobin,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServicePort {
    pub number: u32,
    #[serde(default)]
    pub protocol: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub target_port: Option<u32>,
}

/// `networking.istio.io/v1 ServiceEntry`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceEntry {
    pub hosts: Vec<String>,
    #[serde(default)]
    pub addresses: Vec<String>,
    #[serde(default)]
    pub ports: Vec<ServicePort>,
    #[serde(default)]
    pub location: Location,
    #[serde(default)]
    pub resolution: Resolution,
    #[serde(default)]
    pub endpoints: Vec<WorkloadEntry>,
    #[serde(default)]
    pub workload_selector: Option<WorkloadSelector>,
    #[serde(default)]
    pub subject_alt_names: Vec<String>,
    #[serde(default)]
    pub export_to: Vec<String>,
}

/// `networking.istio.io/v1 WorkloadEntry` (also a ServiceEntry's inline endpoint).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadEntry {
    #[serde(default)]
    pub address: String,
    #[serde(default)]
    pub ports: BTreeMap<String, u32>,
    #[serde(default)]
    pub labels: Labels,
    #[serde(default)]
    pub network: String,
    #[serde(default)]
    pub locality: String,
    #[serde(default)]
    pub weight: Option<u32>,
    #[serde(default)]
    pub service_account: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StringMatch {
    #[serde(default)]
    pub exact: Option<String>,
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default)]
    pub regex: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpMatchRequest {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub uri: Option<StringMatch>,
    #[serde(default)]
    pub headers: BTreeMap<String, StringMatch>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PortSelector {
    pub number: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Destination {
    pub host: String,
    #[serde(default)]
    pub subset: String,
    #[serde(default)]
    pub port: Option<PortSelector>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRouteDestination {
    pub destination: Destination,
    #[serde(default)]
    pub weight: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRetry {
    #[serde(default)]
    pub attempts: u32,
    #[serde(default)]
    pub per_try_timeout: Option<String>,
    #[serde(default)]
    pub retry_on: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRoute {
    #[serde(default)]
    pub name: String,
    #[serde(default, rename = "match")]
    pub matches: Vec<HttpMatchRequest>,
    #[serde(default)]
    pub route: Vec<HttpRouteDestination>,
    #[serde(default)]
    pub timeout: Option<String>,
    #[serde(default)]
    pub retries: Option<HttpRetry>,
}

/// `networking.istio.io/v1 VirtualService` (HTTP routes only).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VirtualService {
    pub hosts: Vec<String>,
    #[serde(default)]
    pub gateways: Vec<String>,
    #[serde(default)]
    pub http: Vec<HttpRoute>,
    #[serde(default)]
    pub export_to: Vec<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TlsMode {
    #[default]
    Disable,
    Simple,
    Mutual,
    IstioMutual,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientTlsSettings {
    #[serde(default)]
    pub mode: TlsMode,
    #[serde(default)]
    pub sni: String,
    #[serde(default)]
    pub subject_alt_names: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TcpSettings {
    #[serde(default)]
    pub max_connections: Option<u32>,
    #[serde(default)]
    pub connect_timeout: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConnectionPool {
    #[serde(default)]
    pub tcp: Option<TcpSettings>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrafficPolicy {
    #[serde(default)]
    pub tls: Option<ClientTlsSettings>,
    #[serde(default)]
    pub connection_pool: Option<ConnectionPool>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Subset {
    pub name: String,
    #[serde(default)]
    pub labels: Labels,
    #[serde(default)]
    pub traffic_policy: Option<TrafficPolicy>,
}

/// `networking.istio.io/v1 DestinationRule`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DestinationRule {
    pub host: String,
    #[serde(default)]
    pub traffic_policy: Option<TrafficPolicy>,
    #[serde(default)]
    pub subsets: Vec<Subset>,
    #[serde(default)]
    pub export_to: Vec<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MtlsMode {
    #[default]
    Unset,
    Disable,
    Permissive,
    Strict,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MutualTls {
    #[serde(default)]
    pub mode: MtlsMode,
}

/// `security.istio.io/v1 PeerAuthentication`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PeerAuthentication {
    #[serde(default)]
    pub selector: Option<WorkloadSelector>,
    #[serde(default)]
    pub mtls: Option<MutualTls>,
    #[serde(default)]
    pub port_level_mtls: BTreeMap<u32, MutualTls>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressListener {
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default)]
    pub port: Option<serde_yaml::Value>,
}

/// `networking.istio.io/v1 Sidecar` (egress host scoping only).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Sidecar {
    #[serde(default)]
    pub workload_selector: Option<WorkloadSelector>,
    #[serde(default)]
    pub egress: Vec<EgressListener>,
}
