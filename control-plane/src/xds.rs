//! xDS: resource generation for upstream Envoy 1.40 from a model snapshot, the cache of what was
//! generated ([`CachedSnapshot`], owned here, not by the model), and the ADS server (SotW and
//! Delta) with its push machinery.
//!
//! Names follow Istio: listeners `virtualOutbound` (15001) and `virtualInbound` (15006);
//! clusters `outbound|<port>|<subset>|<host>`, `inbound|<port>||`, `PassthroughCluster`,
//! `BlackHoleCluster`, `InboundPassthroughCluster`; one route configuration per outbound HTTP
//! port named after the port (`"80"`); the NDS `NameTable` has the empty name.

mod ads;
mod cache;
mod clusters;
mod encoded;
mod endpoints;
mod grpc;
mod listeners;
mod nds;
mod routes;
mod status;

#[cfg(feature = "fuzzing")]
pub use ads::fuzz_ads_requests;
pub use ads::{AdsInputs, AdsServer, XdsMetrics};
pub use status::SyncTable;

#[cfg(test)]
use cache::CachedSnapshot;

use proto::envoy::config::core::v3::{
    AggregatedConfigSource, ApiConfigSource, ApiVersion, ConfigSource, GrpcService,
    api_config_source::ApiType,
    config_source::ConfigSourceSpecifier,
    grpc_service::{EnvoyGrpc, TargetSpecifier},
};
use proto::envoy::extensions::transport_sockets::tls::v3::SdsSecretConfig;
use proto::google::protobuf::Any;

use crate::model::{ProxyView, Snapshot};

/// The resource types istiod-lite serves, in push order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum XdsType {
    Cds,
    Eds,
    Lds,
    Rds,
    Nds,
}

impl XdsType {
    /// Push order: CDS, EDS, LDS, RDS, NDS.
    pub const ALL: [XdsType; 5] = [
        XdsType::Cds,
        XdsType::Eds,
        XdsType::Lds,
        XdsType::Rds,
        XdsType::Nds,
    ];

    /// The type's position in [`XdsType::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    pub fn from_type_url(url: &str) -> Option<XdsType> {
        match url {
            proto::type_url::CLUSTER => Some(XdsType::Cds),
            proto::type_url::ENDPOINT => Some(XdsType::Eds),
            proto::type_url::LISTENER => Some(XdsType::Lds),
            proto::type_url::ROUTE => Some(XdsType::Rds),
            proto::type_url::NAME_TABLE => Some(XdsType::Nds),
            _ => None,
        }
    }

    pub fn type_url(self) -> &'static str {
        match self {
            XdsType::Cds => proto::type_url::CLUSTER,
            XdsType::Eds => proto::type_url::ENDPOINT,
            XdsType::Lds => proto::type_url::LISTENER,
            XdsType::Rds => proto::type_url::ROUTE,
            XdsType::Nds => proto::type_url::NAME_TABLE,
        }
    }

    /// Short name used in logs, metrics and `/debug/syncz`.
    pub fn short(self) -> &'static str {
        match self {
            XdsType::Cds => "CDS",
            XdsType::Eds => "EDS",
            XdsType::Lds => "LDS",
            XdsType::Rds => "RDS",
            XdsType::Nds => "NDS",
        }
    }

    /// Wildcard types send every resource; the others send only what was asked for.
    pub fn is_wildcard(self) -> bool {
        matches!(self, XdsType::Cds | XdsType::Lds | XdsType::Nds)
    }
}

/// One generated resource.
#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    pub name: String,
    pub any: Any,
    /// Content hash (hex in Delta `version`); equal hashes mean equal resources.
    pub hash: u64,
}

/// Resources of one type, sorted by name.
pub type Resources = Vec<Resource>;

/// Resources that are not generated but served as they are to every proxy (`istiod-lite
/// replay`); a [`CachedSnapshot`] given one (through [`AdsInputs::fixed`]) asks it instead of
/// generating from its snapshot.
pub trait FixedResources: Send + Sync {
    /// Every resource of `ty` for a proxy, sorted by name.
    fn resources(&self, view: &ProxyView, ty: XdsType) -> std::sync::Arc<Resources>;
}

fn fnv64(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf29ce484222325u64;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

pub(crate) fn resource<M: prost::Name>(name: impl Into<String>, msg: &M) -> Resource {
    let any = proto::pack(msg);
    let hash = fnv64(&any.value);
    Resource {
        name: name.into(),
        any,
        hash,
    }
}

/// Generates every resource of `ty` for a proxy view (no caching: `CachedSnapshot` caches what
/// the ADS server sends).
pub fn generate(snap: &Snapshot, view: &ProxyView, ty: XdsType) -> Resources {
    let mut out = match ty {
        _ if view.grpc => grpc::generate(snap, view, ty),
        XdsType::Cds => clusters::generate(snap, view),
        XdsType::Eds => endpoints::generate(snap, view),
        XdsType::Lds => listeners::generate(snap, view),
        XdsType::Rds => routes::generate(snap, view),
        XdsType::Nds => nds::generate(snap, view),
    };
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.dedup_by(|a, b| a.name == b.name);
    out
}

/// `ads: {}` config source, resource API v3.
pub(crate) fn ads_config_source() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        ..Default::default()
    }
}

/// SDS secret `name` fetched from the agent through the bootstrap's `sds-grpc` cluster.
pub(crate) fn sds_secret(name: &str) -> SdsSecretConfig {
    SdsSecretConfig {
        name: name.to_string(),
        sds_config: Some(ConfigSource {
            resource_api_version: ApiVersion::V3 as i32,
            initial_fetch_timeout: Some(duration(std::time::Duration::ZERO)),
            config_source_specifier: Some(ConfigSourceSpecifier::ApiConfigSource(
                ApiConfigSource {
                    api_type: ApiType::Grpc as i32,
                    transport_api_version: ApiVersion::V3 as i32,
                    set_node_on_first_message_only: true,
                    grpc_services: vec![GrpcService {
                        target_specifier: Some(TargetSpecifier::EnvoyGrpc(EnvoyGrpc {
                            cluster_name: "sds-grpc".into(),
                            ..Default::default()
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
    }
}

pub(crate) fn duration(d: std::time::Duration) -> proto::google::protobuf::Duration {
    proto::google::protobuf::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

pub(crate) fn socket_address(ip: &str, port: u32) -> proto::envoy::config::core::v3::Address {
    use proto::envoy::config::core::v3::{Address, SocketAddress, address, socket_address};
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ip.to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

/// Cluster name `outbound|<port>|<subset>|<host>`.
pub fn outbound_cluster_name(port: u32, subset: &str, host: &str) -> String {
    format!("outbound|{port}|{subset}|{host}")
}

/// Cluster name `inbound|<port>||`.
pub fn inbound_cluster_name(port: u32) -> String {
    format!("inbound|{port}||")
}

pub const PASSTHROUGH_CLUSTER: &str = "PassthroughCluster";
pub const BLACKHOLE_CLUSTER: &str = "BlackHoleCluster";
pub const INBOUND_PASSTHROUGH_CLUSTER: &str = "InboundPassthroughCluster";
pub const VIRTUAL_OUTBOUND: &str = "virtualOutbound";
pub const VIRTUAL_INBOUND: &str = "virtualInbound";
/// ALPN Istio's sidecars offer on mTLS connections (matched by inbound filter chains).
pub const ISTIO_ALPN: [&str; 2] = ["istio-peer-exchange", "istio"];

#[cfg(test)]
mod tests;
