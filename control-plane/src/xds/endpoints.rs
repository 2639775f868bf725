//! EDS: one `ClusterLoadAssignment` per EDS outbound cluster, from WorkloadEntries, inline
//! ServiceEntry endpoints and a Kubernetes Service's endpoints (not-ready ones UNHEALTHY),
//! grouped by locality; subsets filter by labels.

use std::collections::BTreeMap;

use proto::envoy::config::core::v3::{HealthStatus, Locality, Metadata};
use proto::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use proto::google::protobuf::{Struct, UInt32Value, Value, value::Kind};

use super::clusters::{Discovery, outbound_specs};
use super::*;

fn locality(s: &str) -> Option<Locality> {
    if s.is_empty() {
        return None;
    }
    let mut parts = s.splitn(3, '/');
    Some(Locality {
        region: parts.next().unwrap_or_default().to_string(),
        zone: parts.next().unwrap_or_default().to_string(),
        sub_zone: parts.next().unwrap_or_default().to_string(),
    })
}

fn tls_metadata() -> Metadata {
    let mut fields = std::collections::HashMap::new();
    fields.insert(
        "tlsMode".to_string(),
        Value {
            kind: Some(Kind::StringValue("istio".into())),
        },
    );
    let mut md = Metadata::default();
    md.filter_metadata
        .insert("envoy.transport_socket_match".into(), Struct { fields });
    md
}

pub(super) fn generate(snap: &Snapshot, view: &ProxyView) -> Resources {
    let mut out = Vec::new();
    for spec in outbound_specs(snap, view) {
        if spec.discovery != Discovery::Eds {
            continue;
        }
        let mut by_locality: BTreeMap<String, Vec<LbEndpoint>> = BTreeMap::new();
        for ep in &spec.service.endpoints {
            if ep.address.parse::<std::net::IpAddr>().is_err() {
                continue;
            }
            if let Some(sel) = &spec.subset_labels
                && !sel.iter().all(|(k, v)| ep.labels.get(k) == Some(v))
            {
                continue;
            }
            by_locality
                .entry(ep.locality.clone())
                .or_default()
                .push(LbEndpoint {
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                        address: Some(socket_address(&ep.address, ep.port_for(&spec.port))),
                        ..Default::default()
                    })),
                    load_balancing_weight: Some(UInt32Value { value: ep.weight }),
                    health_status: if ep.healthy {
                        HealthStatus::Unknown
                    } else {
                        HealthStatus::Unhealthy
                    } as i32,
                    metadata: ep.istio_tls.then(tls_metadata),
                });
        }
        let cla = ClusterLoadAssignment {
            cluster_name: spec.name.clone(),
            endpoints: by_locality
                .into_iter()
                .map(|(loc, eps)| LocalityLbEndpoints {
                    locality: locality(&loc),
                    load_balancing_weight: Some(UInt32Value {
                        value: eps
                            .iter()
                            .map(|e| e.load_balancing_weight.as_ref().map_or(1, |w| w.value))
                            .sum::<u32>()
                            .max(1),
                    }),
                    lb_endpoints: eps,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        out.push(resource(spec.name.clone(), &cla));
    }
    out
}
