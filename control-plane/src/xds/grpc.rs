//! The gRPC generator: what a proxyless gRPC client gets (node metadata `GENERATOR=grpc`, as
//! written by the agent's gRPC bootstrap), as istiod's `grpcgen`.
//!
//! - LDS: one API listener per visible service port, named `<host>:<port>` (the name an
//!   `xds:///<host>:<port>` target asks for), an `HttpConnectionManager` whose routes come over
//!   RDS under the same name, with the router filter.
//! - RDS: `<host>:<port>` with one virtual host for that service (domains `<host>` and
//!   `<host>:<port>`) and the same routes a sidecar gets (VirtualService, else the default
//!   route to `outbound|<port>||<host>`).
//! - CDS: the EDS outbound clusters `outbound|<port>|<subset>|<host>`, round robin, endpoints over
//!   ADS. With a DestinationRule `ISTIO_MUTUAL`, mTLS through the bootstrap's `default`
//!   certificate provider (the agent's `OUTPUT_CERTS` files, `file_watcher`): certificate
//!   `default`, roots `ROOTCA`, the service's SPIFFE ids as SANs. Clusters Envoy resolves itself (DNS, original destination) have no gRPC equivalent
//!   and are left out, as istiod does.
//! - EDS: the sidecar's `ClusterLoadAssignment`s, every locality present (gRPC rejects a
//!   `LocalityLbEndpoints` without one; the empty locality stands for none) and weighted (gRPC
//!   drops localities without a weight).
//!
//! - LDS, for xDS-enabled gRPC servers: `xds.istio.io/grpc/lds/inbound/<addr>:<port>` listeners
//!   for the ports the proxy is a workload of (see [`inbound`]).
//!
//! LDS and CDS are wildcard here as for Envoy: the client receives every listener and cluster and
//! ignores those it did not subscribe to.

use proto::envoy::config::cluster::v3::{
    Cluster,
    cluster::{ClusterDiscoveryType, DiscoveryType, EdsClusterConfig, LbPolicy},
};
use proto::envoy::config::core::v3::{Locality, TransportSocket, transport_socket};
use proto::envoy::config::endpoint::v3::ClusterLoadAssignment;
use proto::envoy::config::listener::v3::{ApiListener, Listener};
use proto::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use proto::envoy::extensions::filters::http::router::v3::Router;
use proto::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager::RouteSpecifier, http_filter,
};

use proto::envoy::extensions::transport_sockets::tls::v3::{
    CertificateProviderPluginInstance, CertificateValidationContext, CommonTlsContext,
    UpstreamTlsContext, common_tls_context::ValidationContextType,
};
use proto::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};

use super::clusters::{Discovery, OutboundSpec, expected_sans, outbound_specs};
use super::*;
use crate::config::kinds::TlsMode;

/// Listener and route configuration name for a service port.
pub fn listener_name(host: &str, port: u32) -> String {
    format!("{host}:{port}")
}

mod inbound;

pub(super) fn generate(snap: &Snapshot, view: &ProxyView, ty: XdsType) -> Resources {
    match ty {
        XdsType::Lds => {
            let mut out = listeners(snap, view);
            out.extend(inbound::listeners(snap, view));
            out
        }
        XdsType::Rds => routes(snap, view),
        XdsType::Cds => clusters(snap, view),
        XdsType::Eds => endpoints(snap, view),
        XdsType::Nds => Vec::new(),
    }
}

fn listeners(snap: &Snapshot, view: &ProxyView) -> Resources {
    let mut out = Vec::new();
    for svc in snap.visible_services(view) {
        for port in &svc.ports {
            let name = listener_name(&svc.host, port.number);
            let hcm = HttpConnectionManager {
                route_specifier: Some(RouteSpecifier::Rds(Rds {
                    config_source: Some(ads_config_source()),
                    route_config_name: name.clone(),
                })),
                http_filters: vec![router_filter()],
                ..Default::default()
            };
            let listener = Listener {
                name: name.clone(),
                api_listener: Some(ApiListener {
                    api_listener: Some(proto::pack(&hcm)),
                }),
                ..Default::default()
            };
            out.push(resource(name, &listener));
        }
    }
    out
}

/// The router filter gRPC requires last in every filter list.
fn router_filter() -> HttpFilter {
    HttpFilter {
        name: "envoy.filters.http.router".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(proto::pack(
            &Router::default(),
        ))),
        ..Default::default()
    }
}

fn routes(snap: &Snapshot, view: &ProxyView) -> Resources {
    let mut out = Vec::new();
    for svc in snap.visible_services(view) {
        for port in &svc.ports {
            let name = listener_name(&svc.host, port.number);
            let rc = RouteConfiguration {
                name: name.clone(),
                virtual_hosts: vec![VirtualHost {
                    name: name.clone(),
                    domains: vec![svc.host.clone(), name.clone()],
                    routes: routes::routes_for(snap, &view.namespace, svc, port),
                    ..Default::default()
                }],
                ..Default::default()
            };
            out.push(resource(name, &rc));
        }
    }
    out
}

fn clusters(snap: &Snapshot, view: &ProxyView) -> Resources {
    outbound_specs(snap, view)
        .into_iter()
        .filter(|spec| spec.discovery == Discovery::Eds)
        .map(|spec| {
            let c = Cluster {
                name: spec.name.clone(),
                cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
                eds_cluster_config: Some(EdsClusterConfig {
                    eds_config: Some(ads_config_source()),
                    service_name: spec.name.clone(),
                }),
                lb_policy: LbPolicy::RoundRobin as i32,
                transport_socket: mtls(snap, &spec),
                ..Default::default()
            };
            resource(spec.name, &c)
        })
        .collect()
}

/// The bootstrap's certificate provider instance (the agent writes it as `default`).
fn provider(certificate_name: &str) -> CertificateProviderPluginInstance {
    CertificateProviderPluginInstance {
        instance_name: "default".into(),
        certificate_name: certificate_name.into(),
    }
}

/// Istio mTLS for gRPC when the DestinationRule asks for `ISTIO_MUTUAL`. SANs go in
/// `match_subject_alt_names`, deprecated for Envoy but the field gRPC reads (as istiod's grpcgen).
#[allow(deprecated)]
fn mtls(snap: &Snapshot, spec: &OutboundSpec<'_>) -> Option<TransportSocket> {
    let tls = spec.policy.tls.as_ref()?;
    if tls.mode != TlsMode::IstioMutual {
        return None;
    }
    let sans = expected_sans(snap, spec.service, &tls.subject_alt_names);
    let ctx = UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificate_provider_instance: Some(provider("default")),
            validation_context_type: Some(ValidationContextType::ValidationContext(
                CertificateValidationContext {
                    ca_certificate_provider_instance: Some(provider("ROOTCA")),
                    match_subject_alt_names: sans
                        .into_iter()
                        .map(|s| StringMatcher {
                            match_pattern: Some(MatchPattern::Exact(s)),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    };
    Some(TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(proto::pack(&ctx))),
    })
}

fn endpoints(snap: &Snapshot, view: &ProxyView) -> Resources {
    endpoints::generate(snap, view)
        .into_iter()
        .map(|r| match proto::unpack::<ClusterLoadAssignment>(&r.any) {
            Ok(mut cla) => {
                for loc in &mut cla.endpoints {
                    loc.locality.get_or_insert_with(Locality::default);
                }
                resource(r.name, &cla)
            }
            Err(_) => r,
        })
        .collect()
}

#[cfg(test)]
mod tests;
