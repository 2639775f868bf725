//! Listeners for xDS-enabled gRPC servers, as istiod's `grpcgen` builds them (gRPC A36).
//!
//! A gRPC server started with xDS asks LDS for
//! `xds.istio.io/grpc/lds/inbound/<listening address>` (the agent's gRPC bootstrap sets that
//! template), for example `.../inbound/0.0.0.0:17070`, and serves only once that listener
//! arrives. istiod answers for the ports the proxy is a workload of; so does this generator, for
//! the addresses a server binds in practice (`0.0.0.0`, `[::]` and each of the proxy's IPs),
//! since LDS is wildcard here and the server ignores names it did not ask for.
//!
//! Each listener has one filter chain (gRPC cannot match on transport protocol, so PERMISSIVE
//! is served as plain text, as istiod does; a workload labelled `security.istio.io/tlsMode:
//! istio` is STRICT, since auto-mTLS clients will use TLS): an `HttpConnectionManager` with an
//! inline route table whose one route, `/`, is a `NonForwardingAction`, and the router filter.
//! Under STRICT the chain carries a `DownstreamTlsContext` requiring client certificates, with
//! the bootstrap's `default` certificate provider for the certificate and `ROOTCA` for roots.
//! AuthorizationPolicy (RBAC filters) is not generated.

use std::collections::BTreeSet;

use proto::envoy::config::core::v3::{
    Address, SocketAddress, TransportSocket, address, socket_address, transport_socket,
};
use proto::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use proto::envoy::config::route::v3::{
    NonForwardingAction, Route, RouteConfiguration, RouteMatch, VirtualHost, route, route_match,
};
use proto::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier,
};
use proto::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext,
    common_tls_context::ValidationContextType,
};

use super::{provider, router_filter};
use crate::config::kinds::MtlsMode;
use crate::model::{ProxyView, Snapshot};
use crate::xds::{Resources, resource};

/// The prefix of a gRPC server's listener name (the bootstrap's
/// `server_listener_resource_name_template` without its `%s`).
pub const SERVER_LISTENER_PREFIX: &str = "xds.istio.io/grpc/lds/inbound/";

/// The server listeners for every port this proxy is a workload of.
pub(super) fn listeners(snap: &Snapshot, view: &ProxyView) -> Resources {
    let mut hosts: Vec<String> = vec!["0.0.0.0".into(), "[::]".into()];
    for ip in &view.ips {
        let host = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip.clone()
        };
        if !hosts.contains(&host) {
            hosts.push(host);
        }
    }
    let ports: BTreeSet<u32> = snap
        .inbound_ports(view)
        .into_iter()
        .map(|(target, _)| target)
        .collect();
    let mut out = Vec::new();
    for port in ports {
        let chain = filter_chain(mode(snap, view, port));
        for host in &hosts {
            let name = format!("{SERVER_LISTENER_PREFIX}{host}:{port}");
            let listener = Listener {
                name: name.clone(),
                address: Some(Address {
                    address: Some(address::Address::SocketAddress(SocketAddress {
                        address: host.trim_start_matches('[').trim_end_matches(']').into(),
                        port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
                        ..Default::default()
                    })),
                }),
                filter_chains: vec![chain.clone()],
                ..Default::default()
            };
            out.push(resource(name, &listener));
        }
    }
    out
}

/// The mode gRPC can serve: PERMISSIVE is plain text (no transport-protocol match in gRPC),
/// unless the workload is labelled for Istio mTLS, then STRICT.
fn mode(snap: &Snapshot, view: &ProxyView, port: u32) -> MtlsMode {
    let mode = snap.mtls_mode(view, port);
    let istio_tls = view
        .labels
        .get("security.istio.io/tlsMode")
        .is_some_and(|m| m == "istio");
    match mode {
        MtlsMode::Strict => MtlsMode::Strict,
        MtlsMode::Permissive if istio_tls => MtlsMode::Strict,
        _ => MtlsMode::Disable,
    }
}

fn filter_chain(mode: MtlsMode) -> FilterChain {
    let suffix = if mode == MtlsMode::Strict {
        "mtls"
    } else {
        "plaintext"
    };
    let hcm = HttpConnectionManager {
        route_specifier: Some(RouteSpecifier::RouteConfig(RouteConfiguration {
            name: "inbound".into(),
            virtual_hosts: vec![VirtualHost {
                domains: vec!["*".into()],
                routes: vec![Route {
                    r#match: Some(RouteMatch {
                        path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                        ..Default::default()
                    }),
                    action: Some(route::Action::NonForwardingAction(
                        NonForwardingAction::default(),
                    )),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        })),
        http_filters: vec![router_filter()],
        ..Default::default()
    };
    FilterChain {
        name: format!("inbound-{suffix}"),
        filters: vec![Filter {
            name: format!("inbound-hcm{suffix}"),
            config_type: Some(filter::ConfigType::TypedConfig(proto::pack(&hcm))),
        }],
        transport_socket: (mode == MtlsMode::Strict).then(downstream_mtls),
        ..Default::default()
    }
}

fn downstream_mtls() -> TransportSocket {
    let ctx = DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificate_provider_instance: Some(provider("default")),
            validation_context_type: Some(ValidationContextType::ValidationContext(
                CertificateValidationContext {
                    ca_certificate_provider_instance: Some(provider("ROOTCA")),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
        require_client_certificate: Some(proto::google::protobuf::BoolValue { value: true }),
        ..Default::default()
    };
    TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(proto::pack(&ctx))),
    }
}
