//! What a CDS or LDS response names for Envoy to ask next: the EDS names of its EDS clusters
//! (`eds_cluster_config.service_name`, else the cluster's name) and the RDS names of its
//! listeners' HTTP connection managers (`rds.route_config_name`), as Envoy derives them.
//!
//! Only those fields are decoded (every other field is skipped), as [`super::super::codec`]
//! reads only a response's head.

use proto::envoy_types_crate::pb::google::protobuf::Any;
use proto::type_url;

/// `envoy.config.cluster.v3.Cluster`: name, discovery type, EDS config.
#[derive(Clone, PartialEq, prost::Message)]
struct Cluster {
    #[prost(string, tag = "1")]
    name: String,
    /// `type` (in the `cluster_discovery_type` oneof).
    #[prost(int32, optional, tag = "2")]
    discovery_type: Option<i32>,
    #[prost(message, optional, tag = "3")]
    eds_cluster_config: Option<EdsClusterConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct EdsClusterConfig {
    #[prost(string, tag = "2")]
    service_name: String,
}

/// `Cluster.DiscoveryType.EDS`.
const EDS: i32 = 3;

/// `envoy.config.listener.v3.Listener`: its filter chains.
#[derive(Clone, PartialEq, prost::Message)]
struct Listener {
    #[prost(message, repeated, tag = "3")]
    filter_chains: Vec<FilterChain>,
    #[prost(message, optional, tag = "25")]
    default_filter_chain: Option<FilterChain>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct FilterChain {
    #[prost(message, repeated, tag = "3")]
    filters: Vec<Filter>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Filter {
    #[prost(message, optional, tag = "4")]
    typed_config: Option<Any>,
}

/// `HttpConnectionManager`: its `rds`.
#[derive(Clone, PartialEq, prost::Message)]
struct HttpConnectionManager {
    #[prost(message, optional, tag = "3")]
    rds: Option<Rds>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Rds {
    #[prost(string, tag = "2")]
    route_config_name: String,
}

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";

/// A SotW response's resources.
#[derive(Clone, PartialEq, prost::Message)]
struct SotwResources {
    #[prost(message, repeated, tag = "2")]
    resources: Vec<Any>,
}

/// A Delta response's resources (name and body) and removals.
#[derive(Clone, PartialEq, prost::Message)]
struct DeltaResources {
    #[prost(message, repeated, tag = "2")]
    resources: Vec<DeltaResource>,
    #[prost(string, repeated, tag = "6")]
    removed_resources: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct DeltaResource {
    #[prost(message, optional, tag = "2")]
    resource: Option<Any>,
    #[prost(string, tag = "3")]
    name: String,
}

/// What a CDS or LDS response changes in the names Envoy will ask for next.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Update {
    /// SotW: every resource's names (the response is the whole state).
    Replace(Vec<String>),
    /// Delta: the names of each resource added or changed, and the resources removed.
    Change {
        upserts: Vec<(String, Vec<String>)>,
        removed: Vec<String>,
    },
}

/// A CDS or LDS response whose names could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading the names a response gives: {0}")]
pub(crate) struct NamesError(#[from] prost::DecodeError);

/// The [`Update`] a CDS or LDS response (`bytes`, encoded) makes.
pub(crate) fn update(type_url: &str, bytes: &[u8], delta: bool) -> Result<Update, NamesError> {
    use prost::Message;
    if delta {
        let r = DeltaResources::decode(bytes)?;
        let mut upserts = Vec::with_capacity(r.resources.len());
        for res in r.resources {
            let names = match &res.resource {
                Some(any) => named(type_url, &any.value)?,
                None => Vec::new(),
            };
            upserts.push((res.name, names));
        }
        return Ok(Update::Change {
            upserts,
            removed: r.removed_resources,
        });
    }
    let r = SotwResources::decode(bytes)?;
    let mut names = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for any in &r.resources {
        for n in named(type_url, &any.value)? {
            if seen.insert(n.clone()) {
                names.push(n);
            }
        }
    }
    Ok(Update::Replace(names))
}

/// The type Envoy asks for after `type_url` (EDS after CDS, RDS after LDS).
pub(crate) fn next_type(type_url: &str) -> Option<&'static str> {
    match type_url {
        type_url::CLUSTER => Some(type_url::ENDPOINT),
        type_url::LISTENER => Some(type_url::ROUTE),
        _ => None,
    }
}

/// The names one CDS or LDS resource (`value`, the encoded resource) makes Envoy ask for.
pub(crate) fn named(type_url: &str, value: &[u8]) -> Result<Vec<String>, prost::DecodeError> {
    use prost::Message;
    match type_url {
        type_url::CLUSTER => {
            let c = Cluster::decode(value)?;
            if c.discovery_type != Some(EDS) {
                return Ok(Vec::new());
            }
            let service = c
                .eds_cluster_config
                .map(|e| e.service_name)
                .filter(|s| !s.is_empty());
            Ok(vec![service.unwrap_or(c.name)])
        }
        type_url::LISTENER => {
            let l = Listener::decode(value)?;
            let mut out = Vec::new();
            for chain in l.filter_chains.iter().chain(l.default_filter_chain.iter()) {
                for any in chain.filters.iter().filter_map(|f| f.typed_config.as_ref()) {
                    if any.type_url != HCM {
                        continue;
                    }
                    if let Some(rds) = HttpConnectionManager::decode(&any.value[..])?.rds
                        && !out.contains(&rds.route_config_name)
                    {
                        out.push(rds.route_config_name);
                    }
                }
            }
            Ok(out)
        }
        _ => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use proto::envoy::config::cluster::v3 as c;
    use proto::envoy::config::listener::v3 as l;
    use proto::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;

    use super::*;

    fn cluster(name: &str, eds: Option<&str>) -> Vec<u8> {
        c::Cluster {
            name: name.into(),
            cluster_discovery_type: Some(c::cluster::ClusterDiscoveryType::Type(match eds {
                Some(_) => c::cluster::DiscoveryType::Eds as i32,
                None => c::cluster::DiscoveryType::Static as i32,
            })),
            eds_cluster_config: eds.map(|s| c::cluster::EdsClusterConfig {
                service_name: s.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec()
    }

    pub(crate) fn listener(routes: &[&str]) -> Vec<u8> {
        let filter = |route: &str| l::Filter {
            name: "envoy.filters.network.http_connection_manager".into(),
            config_type: Some(l::filter::ConfigType::TypedConfig(proto::pack(
                &hcm::HttpConnectionManager {
                    route_specifier: Some(hcm::http_connection_manager::RouteSpecifier::Rds(
                        hcm::Rds {
                            route_config_name: route.into(),
                            ..Default::default()
                        },
                    )),
                    ..Default::default()
                },
            ))),
        };
        l::Listener {
            name: "l".into(),
            filter_chains: routes
                .iter()
                .map(|r| l::FilterChain {
                    filters: vec![filter(r)],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn eds_clusters_name_their_service_or_themselves() {
        let eds = |v: Vec<u8>| named(type_url::CLUSTER, &v).unwrap();
        assert_eq!(
            eds(cluster("outbound|80||a", Some("outbound|80||a"))),
            ["outbound|80||a"]
        );
        assert_eq!(eds(cluster("b", Some(""))), ["b"]);
        assert!(eds(cluster("static", None)).is_empty());
    }

    #[test]
    fn listeners_name_their_rds_routes_once() {
        let rds = named(type_url::LISTENER, &listener(&["80", "http.8080", "80"])).unwrap();
        assert_eq!(rds, ["80", "http.8080"]);
        assert!(named(type_url::LISTENER, &[0xff]).is_err());
    }
}
