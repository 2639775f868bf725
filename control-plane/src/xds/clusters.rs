//! CDS: outbound clusters per visible service port (and DestinationRule subset), inbound
//! clusters for the proxy's own service ports, and the fixed passthrough/blackhole clusters.

use std::collections::BTreeMap;
use std::time::Duration;

use proto::envoy::config::cluster::v3::{
    CircuitBreakers, Cluster,
    circuit_breakers::Thresholds,
    cluster::{
        ClusterDiscoveryType, DiscoveryType, EdsClusterConfig, LbPolicy, TransportSocketMatch,
    },
};
use proto::envoy::config::core::v3::{
    BindConfig, SocketAddress, TransportSocket, socket_address, transport_socket,
};
use proto::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use proto::envoy::extensions::transport_sockets::raw_buffer::v3::RawBuffer;
use proto::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, SubjectAltNameMatcher, TlsParameters,
    UpstreamTlsContext,
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
    subject_alt_name_matcher::SanType,
    tls_parameters::TlsProtocol,
};
use proto::envoy::extensions::upstreams::http::v3::{HttpProtocolOptions, http_protocol_options};
use proto::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};
use proto::google::protobuf::{Struct, UInt32Value, Value, value::Kind};

use super::*;
use crate::config::kinds::{Labels, Location, Resolution, TlsMode, TrafficPolicy};
use crate::model::{Port, Service, Snapshot};

/// How an outbound cluster finds its endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Discovery {
    Eds,
    OriginalDst,
    StrictDns,
    LogicalDns,
}

/// One outbound cluster, before it becomes a `Cluster` (CDS) or a `ClusterLoadAssignment` (EDS).
pub(crate) struct OutboundSpec<'a> {
    pub name: String,
    pub service: &'a Service,
    pub port: Port,
    pub subset_labels: Option<Labels>,
    pub discovery: Discovery,
    pub policy: TrafficPolicy,
}

fn merged_policy(base: Option<&TrafficPolicy>, over: Option<&TrafficPolicy>) -> TrafficPolicy {
    let mut p = base.cloned().unwrap_or_default();
    if let Some(o) = over {
        if o.tls.is_some() {
            p.tls = o.tls.clone();
        }
        if o.connection_pool.is_some() {
            p.connection_pool = o.connection_pool.clone();
        }
    }
    p
}

/// Outbound clusters for every visible service port, plus one per DestinationRule subset.
pub(crate) fn outbound_specs<'a>(snap: &'a Snapshot, view: &ProxyView) -> Vec<OutboundSpec<'a>> {
    let mut out = Vec::new();
    for svc in snap.visible_services(view) {
        let dr = snap.destination_rule(&view.namespace, svc);
        let discovery = match svc.resolution {
            Resolution::Dns => Discovery::StrictDns,
            Resolution::DnsRoundRobin => Discovery::LogicalDns,
            Resolution::None if svc.endpoints.is_empty() && svc.selector.is_none() => {
                Discovery::OriginalDst
            }
            _ => Discovery::Eds,
        };
        for port in &svc.ports {
            let base = merged_policy(dr.and_then(|d| d.traffic_policy.as_ref()), None);
            out.push(OutboundSpec {
                name: outbound_cluster_name(port.number, "", &svc.host),
                service: svc,
                port: port.clone(),
                subset_labels: None,
                discovery,
                policy: base.clone(),
            });
            for subset in dr.map(|d| d.subsets.as_slice()).unwrap_or_default() {
                out.push(OutboundSpec {
                    name: outbound_cluster_name(port.number, &subset.name, &svc.host),
                    service: svc,
                    port: port.clone(),
                    subset_labels: Some(subset.labels.clone()),
                    discovery,
                    policy: merged_policy(Some(&base), subset.traffic_policy.as_ref()),
                });
            }
        }
    }
    out
}

pub(super) fn generate(snap: &Snapshot, view: &ProxyView) -> Resources {
    let mut out = Vec::new();
    for spec in outbound_specs(snap, view) {
        let c = outbound_cluster(snap, &spec);
        out.push(resource(spec.name.clone(), &c));
    }
    for (target, _) in snap.inbound_ports(view) {
        let name = inbound_cluster_name(target);
        out.push(resource(name.clone(), &original_dst(&name, true)));
    }
    out.push(resource(
        PASSTHROUGH_CLUSTER,
        &original_dst(PASSTHROUGH_CLUSTER, false),
    ));
    out.push(resource(
        INBOUND_PASSTHROUGH_CLUSTER,
        &original_dst(INBOUND_PASSTHROUGH_CLUSTER, true),
    ));
    out.push(resource(
        BLACKHOLE_CLUSTER,
        &Cluster {
            name: BLACKHOLE_CLUSTER.into(),
            connect_timeout: Some(duration(Duration::from_secs(10))),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
            ..Default::default()
        },
    ));
    out
}

/// An ORIGINAL_DST cluster; inbound ones bind their upstream side to 127.0.0.6 (excluded from
/// redirection by istio-iptables).
fn original_dst(name: &str, inbound: bool) -> Cluster {
    Cluster {
        name: name.into(),
        connect_timeout: Some(duration(Duration::from_secs(10))),
        lb_policy: LbPolicy::ClusterProvided as i32,
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(
            DiscoveryType::OriginalDst as i32,
        )),
        upstream_bind_config: inbound.then(|| BindConfig {
            source_address: Some(SocketAddress {
                address: "127.0.0.6".into(),
                port_specifier: Some(socket_address::PortSpecifier::PortValue(0)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// SPIFFE ids of the service's workloads plus its `subjectAltNames`.
pub(crate) fn expected_sans(snap: &Snapshot, svc: &Service, tls_sans: &[String]) -> Vec<String> {
    let mut sans: Vec<String> = tls_sans.to_vec();
    sans.extend(svc.subject_alt_names.iter().cloned());
    for ep in &svc.endpoints {
        sans.push(format!(
            "spiffe://{}/ns/{}/sa/{}",
            snap.mesh.trust_domain, ep.namespace, ep.service_account
        ));
    }
    sans.sort();
    sans.dedup();
    sans
}

/// Istio mTLS: certificate `default` and validation `ROOTCA` from SDS, SAN match on SPIFFE ids.
pub(crate) fn istio_mutual_socket(sni: &str, sans: &[String]) -> TransportSocket {
    let ctx = UpstreamTlsContext {
        sni: sni.to_string(),
        common_tls_context: Some(CommonTlsContext {
            tls_params: Some(TlsParameters {
                tls_minimum_protocol_version: TlsProtocol::TlSv12 as i32,
                ..Default::default()
            }),
            tls_certificate_sds_secret_configs: vec![sds_secret("default")],
            alpn_protocols: ISTIO_ALPN.iter().map(|s| s.to_string()).collect(),
            validation_context_type: Some(ValidationContextType::CombinedValidationContext(
                CombinedCertificateValidationContext {
                    default_validation_context: Some(CertificateValidationContext {
                        match_typed_subject_alt_names: sans
                            .iter()
                            .map(|s| SubjectAltNameMatcher {
                                san_type: SanType::Uri as i32,
                                matcher: Some(StringMatcher {
                                    match_pattern: Some(MatchPattern::Exact(s.clone())),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    }),
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

fn simple_tls_socket(sni: &str) -> TransportSocket {
    let ctx = UpstreamTlsContext {
        sni: sni.to_string(),
        common_tls_context: Some(CommonTlsContext::default()),
        ..Default::default()
    };
    TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(proto::pack(&ctx))),
    }
}

fn raw_buffer_socket() -> TransportSocket {
    TransportSocket {
        name: "envoy.transport_sockets.raw_buffer".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(proto::pack(
            &RawBuffer {},
        ))),
    }
}

fn outbound_cluster(snap: &Snapshot, spec: &OutboundSpec<'_>) -> Cluster {
    let tcp = spec
        .policy
        .connection_pool
        .as_ref()
        .and_then(|c| c.tcp.clone());
    let connect_timeout = tcp
        .as_ref()
        .and_then(|t| t.connect_timeout.as_deref())
        .and_then(|s| go_syntax::parse_duration(s).ok())
        .unwrap_or(Duration::from_secs(10));
    let mut c = Cluster {
        name: spec.name.clone(),
        connect_timeout: Some(duration(connect_timeout)),
        ..Default::default()
    };
    set_discovery(&mut c, spec);
    if let Some(max) = tcp.as_ref().and_then(|t| t.max_connections) {
        c.circuit_breakers = Some(CircuitBreakers {
            thresholds: vec![Thresholds {
                max_connections: Some(UInt32Value { value: max }),
                ..Default::default()
            }],
            ..Default::default()
        });
    }
    if matches!(spec.port.protocol.as_str(), "HTTP2" | "GRPC") {
        let opts = HttpProtocolOptions {
            upstream_protocol_options: Some(http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                http_protocol_options::ExplicitHttpConfig {
                    protocol_config: Some(
                        http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(Default::default()),
                    ),
                },
            )),
            ..Default::default()
        };
        c.typed_extension_protocol_options = BTreeMap::from([(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".to_string(),
            proto::pack(&opts),
        )])
        .into_iter()
        .collect();
    }
    set_transport_socket(&mut c, snap, spec);
    c
}

/// How the cluster finds its endpoints: EDS, the original destination, or DNS.
fn set_discovery(c: &mut Cluster, spec: &OutboundSpec<'_>) {
    match spec.discovery {
        Discovery::Eds => {
            c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32));
            c.eds_cluster_config = Some(EdsClusterConfig {
                eds_config: Some(ads_config_source()),
                service_name: spec.name.clone(),
            });
        }
        Discovery::OriginalDst => {
            c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(
                DiscoveryType::OriginalDst as i32,
            ));
            c.lb_policy = LbPolicy::ClusterProvided as i32;
        }
        Discovery::StrictDns | Discovery::LogicalDns => {
            let ty = if spec.discovery == Discovery::StrictDns {
                DiscoveryType::StrictDns
            } else {
                DiscoveryType::LogicalDns
            };
            c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(ty as i32));
            c.load_assignment = Some(dns_load_assignment(spec, ty));
        }
    }
}

/// A DNS cluster's targets: the endpoints' addresses, else the service's host (the first one
/// only for LOGICAL_DNS).
fn dns_load_assignment(spec: &OutboundSpec<'_>, ty: DiscoveryType) -> ClusterLoadAssignment {
    let svc = spec.service;
    let mut targets: Vec<(String, u32)> = svc
        .endpoints
        .iter()
        .filter(|e| !e.address.is_empty())
        .map(|e| (e.address.clone(), e.port_for(&spec.port)))
        .collect();
    if targets.is_empty() {
        targets.push((
            svc.host.clone(),
            spec.port.target_port.unwrap_or(spec.port.number),
        ));
    }
    if ty == DiscoveryType::LogicalDns {
        targets.truncate(1);
    }
    ClusterLoadAssignment {
        cluster_name: spec.name.clone(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints: targets
                .into_iter()
                .map(|(host, port)| LbEndpoint {
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                        address: Some(socket_address(&host, port)),
                        ..Default::default()
                    })),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// TLS to the upstream: the DestinationRule's mode, else auto mTLS.
fn set_transport_socket(c: &mut Cluster, snap: &Snapshot, spec: &OutboundSpec<'_>) {
    let svc = spec.service;
    let subset = spec.name.split('|').nth(2).unwrap_or_default().to_string();
    let sni = format!("outbound_.{}_.{}_.{}", spec.port.number, subset, svc.host);
    let tls = spec.policy.tls.clone();
    let mode = tls.as_ref().map(|t| t.mode);
    let tls_sans = tls
        .as_ref()
        .map(|t| t.subject_alt_names.clone())
        .unwrap_or_default();
    match mode {
        Some(TlsMode::IstioMutual) => {
            c.transport_socket = Some(istio_mutual_socket(
                &sni,
                &expected_sans(snap, svc, &tls_sans),
            ));
        }
        Some(TlsMode::Simple) | Some(TlsMode::Mutual) => {
            let sni = tls
                .as_ref()
                .map(|t| t.sni.clone())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| svc.host.clone());
            c.transport_socket = Some(simple_tls_socket(&sni));
        }
        Some(TlsMode::Disable) => {}
        None => {
            // Auto mTLS: endpoints labelled `security.istio.io/tlsMode: istio` get Istio mTLS.
            if svc.location == Location::MeshInternal
                && spec.discovery == Discovery::Eds
                && svc.endpoints.iter().any(|e| e.istio_tls)
            {
                c.transport_socket_matches = auto_mtls(&sni, &expected_sans(snap, svc, &tls_sans));
            }
        }
    }
}

/// Istio mTLS to endpoints labelled `tlsMode: istio`, plaintext to the others.
fn auto_mtls(sni: &str, sans: &[String]) -> Vec<TransportSocketMatch> {
    let mut fields = std::collections::HashMap::new();
    fields.insert(
        "tlsMode".to_string(),
        Value {
            kind: Some(Kind::StringValue("istio".into())),
        },
    );
    vec![
        TransportSocketMatch {
            name: "tlsMode-istio".into(),
            r#match: Some(Struct { fields }),
            transport_socket: Some(istio_mutual_socket(sni, sans)),
        },
        TransportSocketMatch {
            name: "tlsMode-disabled".into(),
            r#match: Some(Struct::default()),
            transport_socket: Some(raw_buffer_socket()),
        },
    ]
}
