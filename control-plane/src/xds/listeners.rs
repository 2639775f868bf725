//! LDS: `virtualOutbound` (15001) and `virtualInbound` (15006), both with the `original_dst`
//! listener filter so that filter chains match on the pre-redirect destination.

use std::collections::BTreeSet;
use std::net::IpAddr;

use proto::envoy::config::core::v3::CidrRange;
use proto::envoy::config::core::v3::{TrafficDirection, TransportSocket, transport_socket};
use proto::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter, filter, listener_filter,
};
use proto::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route, route_action,
    route_match,
};
use proto::envoy::extensions::filters::http::router::v3::Router;
use proto::envoy::extensions::filters::listener::original_dst::v3::OriginalDst;
use proto::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use proto::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager::RouteSpecifier, http_filter,
};
use proto::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use proto::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, TlsParameters,
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
    tls_parameters::TlsProtocol,
};
use proto::google::protobuf::{BoolValue, UInt32Value};

use super::*;
use crate::config::kinds::MtlsMode;

pub const OUTBOUND_PORT: u32 = 15001;
pub const INBOUND_PORT: u32 = 15006;

pub(super) fn generate(snap: &Snapshot, view: &ProxyView) -> Resources {
    vec![
        resource(VIRTUAL_OUTBOUND, &virtual_outbound(snap, view)),
        resource(VIRTUAL_INBOUND, &virtual_inbound(snap, view)),
    ]
}

fn listener_filter<M: prost::Name>(name: &str, msg: &M) -> ListenerFilter {
    ListenerFilter {
        name: name.into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(proto::pack(msg))),
        ..Default::default()
    }
}

fn network_filter<M: prost::Name>(name: &str, msg: &M) -> Filter {
    Filter {
        name: name.into(),
        config_type: Some(filter::ConfigType::TypedConfig(proto::pack(msg))),
    }
}

fn tcp_proxy(stat_prefix: &str, cluster: &str) -> Filter {
    network_filter(
        "envoy.filters.network.tcp_proxy",
        &TcpProxy {
            stat_prefix: stat_prefix.into(),
            cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster(cluster.into())),
            ..Default::default()
        },
    )
}

fn router() -> HttpFilter {
    HttpFilter {
        name: "envoy.filters.http.router".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(proto::pack(
            &Router::default(),
        ))),
        ..Default::default()
    }
}

fn hcm(stat_prefix: &str, routes: RouteSpecifier) -> Filter {
    network_filter(
        "envoy.filters.network.http_connection_manager",
        &HttpConnectionManager {
            stat_prefix: stat_prefix.into(),
            route_specifier: Some(routes),
            http_filters: vec![router()],
            ..Default::default()
        },
    )
}

/// `(address, prefix length)` of a VIP written as an IP or CIDR.
fn cidr(vip: &str) -> Option<CidrRange> {
    let (ip, len) = match vip.split_once('/') {
        Some((ip, len)) => (ip, len.parse::<u32>().ok()?),
        None => {
            let ip: IpAddr = vip.parse().ok()?;
            (vip, if ip.is_ipv4() { 32 } else { 128 })
        }
    };
    let _: IpAddr = ip.parse().ok()?;
    Some(CidrRange {
        address_prefix: ip.to_string(),
        prefix_len: Some(UInt32Value { value: len }),
    })
}

fn virtual_outbound(snap: &Snapshot, view: &ProxyView) -> Listener {
    let mut chains = Vec::new();
    let mut seen_vip_port = BTreeSet::new();
    let mut http_ports_without_vip = BTreeSet::new();
    for svc in snap.visible_services(view) {
        let vips = snap.vips_for(view, svc);
        for port in &svc.ports {
            if vips.is_empty() {
                if port.is_http() {
                    http_ports_without_vip.insert(port.number);
                }
                continue;
            }
            for vip in &vips {
                let Some(range) = cidr(vip) else { continue };
                if !seen_vip_port.insert((vip.clone(), port.number)) {
                    continue; // another service already claimed this VIP:port
                }
                chains.push(vip_chain(&svc.host, port, range));
            }
        }
    }
    // HTTP services without a VIP are routed by Host header on their port.
    chains.extend(http_ports_without_vip.into_iter().map(host_routed_chain));
    let fallback = if snap.mesh.allow_any {
        PASSTHROUGH_CLUSTER
    } else {
        BLACKHOLE_CLUSTER
    };
    Listener {
        name: VIRTUAL_OUTBOUND.into(),
        address: Some(socket_address("0.0.0.0", OUTBOUND_PORT)),
        bind_to_port: Some(BoolValue {
            value: view.capture,
        }),
        traffic_direction: TrafficDirection::Outbound as i32,
        listener_filters: vec![listener_filter(
            "envoy.filters.listener.original_dst",
            &OriginalDst {},
        )],
        filter_chains: chains,
        default_filter_chain: Some(FilterChain {
            name: "PassthroughFilterChain".into(),
            filters: vec![tcp_proxy(fallback, fallback)],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The chain for a service port on one of its VIPs: HTTP routed by RDS of the port, anything
/// else to the service's outbound cluster.
fn vip_chain(host: &str, port: &crate::model::Port, range: CidrRange) -> FilterChain {
    let name = format!("{}_{}", range.address_prefix, port.number);
    let filter = if port.is_http() {
        hcm(
            &format!("outbound_{name}"),
            RouteSpecifier::Rds(Rds {
                config_source: Some(ads_config_source()),
                route_config_name: port.number.to_string(),
            }),
        )
    } else {
        tcp_proxy(
            &format!("outbound|{}||{host}", port.number),
            &outbound_cluster_name(port.number, "", host),
        )
    };
    FilterChain {
        name,
        filter_chain_match: Some(FilterChainMatch {
            prefix_ranges: vec![range],
            destination_port: Some(UInt32Value { value: port.number }),
            ..Default::default()
        }),
        filters: vec![filter],
        ..Default::default()
    }
}

/// The chain for an HTTP port of services without a VIP: routed by Host header.
fn host_routed_chain(port: u32) -> FilterChain {
    FilterChain {
        name: format!("0.0.0.0_{port}"),
        filter_chain_match: Some(FilterChainMatch {
            destination_port: Some(UInt32Value { value: port }),
            ..Default::default()
        }),
        filters: vec![hcm(
            &format!("outbound_0.0.0.0_{port}"),
            RouteSpecifier::Rds(Rds {
                config_source: Some(ads_config_source()),
                route_config_name: port.to_string(),
            }),
        )],
        ..Default::default()
    }
}

/// Server side of Istio mTLS: certificate `default`, client certificates checked against `ROOTCA`.
fn downstream_mtls(alpn: &[&str]) -> TransportSocket {
    let ctx = DownstreamTlsContext {
        require_client_certificate: Some(BoolValue { value: true }),
        common_tls_context: Some(CommonTlsContext {
            tls_params: Some(TlsParameters {
                tls_minimum_protocol_version: TlsProtocol::TlSv12 as i32,
                ..Default::default()
            }),
            tls_certificate_sds_secret_configs: vec![sds_secret("default")],
            alpn_protocols: alpn.iter().map(|s| s.to_string()).collect(),
            validation_context_type: Some(ValidationContextType::CombinedValidationContext(
                CombinedCertificateValidationContext {
                    default_validation_context: Some(CertificateValidationContext::default()),
                    validation_context_sds_secret_config: Some(sds_secret("ROOTCA")),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    };
    TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(proto::pack(&ctx))),
    }
}

fn inbound_filter(port: u32, http: bool) -> Filter {
    let cluster = inbound_cluster_name(port);
    if http {
        hcm(
            &format!("inbound_0.0.0.0_{port}"),
            RouteSpecifier::RouteConfig(RouteConfiguration {
                name: format!("inbound|{port}||"),
                virtual_hosts: vec![VirtualHost {
                    name: format!("inbound|http|{port}"),
                    domains: vec!["*".into()],
                    routes: vec![Route {
                        name: "default".into(),
                        r#match: Some(RouteMatch {
                            path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                            ..Default::default()
                        }),
                        action: Some(route::Action::Route(RouteAction {
                            cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(
                                cluster,
                            )),
                            timeout: Some(duration(std::time::Duration::ZERO)),
                            ..Default::default()
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                validate_clusters: Some(BoolValue { value: false }),
                ..Default::default()
            }),
        )
    } else {
        tcp_proxy(&cluster, &cluster)
    }
}

/// Filter chains for one destination port (or all ports when `port` is None) under `mode`.
fn mode_chains(
    name: &str,
    port: Option<u32>,
    mode: MtlsMode,
    filters: Vec<Filter>,
    http: bool,
) -> Vec<FilterChain> {
    let alpn: &[&str] = if http { &["h2", "http/1.1"] } else { &[] };
    let base = FilterChainMatch {
        destination_port: port.map(|value| UInt32Value { value }),
        ..Default::default()
    };
    match mode {
        MtlsMode::Strict => vec![FilterChain {
            name: format!("{name}-mtls"),
            filter_chain_match: Some(base),
            transport_socket: Some(downstream_mtls(alpn)),
            filters,
            ..Default::default()
        }],
        MtlsMode::Permissive | MtlsMode::Unset => vec![
            FilterChain {
                name: format!("{name}-mtls"),
                filter_chain_match: Some(FilterChainMatch {
                    transport_protocol: "tls".into(),
                    application_protocols: ISTIO_ALPN.iter().map(|s| s.to_string()).collect(),
                    ..base.clone()
                }),
                transport_socket: Some(downstream_mtls(alpn)),
                filters: filters.clone(),
                ..Default::default()
            },
            FilterChain {
                name: format!("{name}-plaintext"),
                filter_chain_match: Some(base),
                filters,
                ..Default::default()
            },
        ],
        MtlsMode::Disable => vec![FilterChain {
            name: format!("{name}-plaintext"),
            filter_chain_match: Some(base),
            filters,
            ..Default::default()
        }],
    }
}

fn virtual_inbound(snap: &Snapshot, view: &ProxyView) -> Listener {
    let mut chains = Vec::new();
    let mut seen = BTreeSet::new();
    for (target, port) in snap.inbound_ports(view) {
        if !seen.insert(target) {
            continue;
        }
        let mode = snap.mtls_mode(view, target);
        chains.extend(mode_chains(
            &format!("inbound|{target}||"),
            Some(target),
            mode,
            vec![inbound_filter(target, port.is_http())],
            port.is_http(),
        ));
    }
    // Ports no service declares: pass through to the original destination, under the
    // workload-wide mode.
    let mode = snap.mtls_mode(view, 0);
    let passthrough = vec![tcp_proxy(
        INBOUND_PASSTHROUGH_CLUSTER,
        INBOUND_PASSTHROUGH_CLUSTER,
    )];
    let mut pass_chains = mode_chains(
        "InboundPassthroughFilterChain",
        None,
        mode,
        passthrough,
        false,
    );
    // The last chain has no transport match: it becomes the default chain.
    let default_chain = pass_chains.pop();
    chains.extend(pass_chains);
    Listener {
        name: VIRTUAL_INBOUND.into(),
        address: Some(socket_address("0.0.0.0", INBOUND_PORT)),
        bind_to_port: Some(BoolValue {
            value: view.capture,
        }),
        traffic_direction: TrafficDirection::Inbound as i32,
        listener_filters: vec![
            listener_filter("envoy.filters.listener.original_dst", &OriginalDst {}),
            listener_filter(
                "envoy.filters.listener.tls_inspector",
                &TlsInspector::default(),
            ),
        ],
        filter_chains: chains,
        default_filter_chain: default_chain,
        ..Default::default()
    }
}
