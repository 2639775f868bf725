//! The gRPC generator's resources, decoded, as a proxyless gRPC client reads them.

use std::sync::Arc;

use proto::envoy::config::cluster::v3::{
    Cluster,
    cluster::{ClusterDiscoveryType, DiscoveryType, LbPolicy},
};
use proto::envoy::config::core::v3::{Node, config_source::ConfigSourceSpecifier};
use proto::envoy::config::endpoint::v3::ClusterLoadAssignment;
use proto::envoy::config::listener::v3::Listener;
use proto::envoy::config::route::v3::{RouteConfiguration, route, route_action};
use proto::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier,
};
use proto::google::protobuf::{Struct, Value, value::Kind};

use super::super::*;
use crate::config::{Config, parse_file};
use crate::model::{MeshSettings, Proxy};

const HOST: &str = "echo.demo.svc.cluster.local";
const YAML: &str = r#"
kind: ServiceEntry
metadata: {name: echo, namespace: demo}
spec:
  hosts: [echo.demo.svc.cluster.local]
  addresses: [198.19.0.20]
  ports: [{number: 7070, name: grpc, protocol: GRPC, targetPort: 17070}]
  location: MESH_INTERNAL
  resolution: STATIC
  endpoints: [{address: 198.18.0.7}, {address: 198.18.0.8, locality: r1/z1}]
---
kind: ServiceEntry
metadata: {name: dns, namespace: demo}
spec:
  hosts: [ext.example.com]
  ports: [{number: 443, name: tls, protocol: TLS}]
  resolution: DNS
"#;

fn grpc_proxy() -> Proxy {
    let mut fields = std::collections::HashMap::new();
    for (k, v) in [("GENERATOR", "grpc"), ("NAMESPACE", "demo")] {
        fields.insert(
            k.to_string(),
            Value {
                kind: Some(Kind::StringValue(v.into())),
            },
        );
    }
    let node = Node {
        id: "sidecar~198.18.0.9~app.demo~demo.svc.cluster.local".into(),
        metadata: Some(Struct { fields }),
        ..Default::default()
    };
    Proxy::from_node(Some(&node)).expect("node")
}

fn resources(ty: XdsType) -> Resources {
    let config = Config::from_objects(parse_file("test.yaml", YAML).expect("valid yaml"));
    let snap = Snapshot::new(Arc::new(config), Arc::new(MeshSettings::default()), 1);
    generate(&snap, &grpc_proxy().view, ty)
}

fn decode<M: prost::Name + Default>(rs: &Resources, name: &str) -> M {
    let r = rs.iter().find(|r| r.name == name).unwrap_or_else(|| {
        panic!(
            "no {name}: {:?}",
            rs.iter().map(|r| &r.name).collect::<Vec<_>>()
        )
    });
    proto::unpack(&r.any).expect("decode")
}

fn is_ads(source: Option<&ConfigSource>) -> bool {
    matches!(
        source.and_then(|s| s.config_source_specifier.as_ref()),
        Some(ConfigSourceSpecifier::Ads(_))
    )
}

#[test]
fn generator_metadata_selects_the_grpc_view() {
    assert!(grpc_proxy().view.grpc);
    let node = Node {
        id: "sidecar~198.18.0.9~app.demo~demo.svc.cluster.local".into(),
        ..Default::default()
    };
    assert!(!Proxy::from_node(Some(&node)).expect("node").view.grpc);
}

#[test]
fn lds_has_one_api_listener_per_service_port_with_rds_of_the_same_name() {
    let lds = resources(XdsType::Lds);
    let name = format!("{HOST}:7070");
    let l: Listener = decode(&lds, &name);
    assert!(
        l.address.is_none() && l.filter_chains.is_empty(),
        "API listener only"
    );
    let hcm: HttpConnectionManager = proto::unpack(
        l.api_listener
            .and_then(|a| a.api_listener)
            .as_ref()
            .expect("api_listener"),
    )
    .expect("HttpConnectionManager");
    let Some(RouteSpecifier::Rds(rds)) = hcm.route_specifier else {
        panic!("routes over RDS: {:?}", hcm.route_specifier);
    };
    assert_eq!(rds.route_config_name, name);
    assert!(is_ads(rds.config_source.as_ref()));
    let filters: Vec<_> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        filters,
        ["envoy.filters.http.router"],
        "router last (gRPC requires it)"
    );
    assert!(
        !lds.iter().any(|r| r.name.starts_with("virtual")),
        "no Envoy listeners for gRPC"
    );
}

#[test]
fn rds_routes_the_service_authority_to_its_outbound_cluster() {
    let name = format!("{HOST}:7070");
    let rc: RouteConfiguration = decode(&resources(XdsType::Rds), &name);
    let [vh] = rc.virtual_hosts.as_slice() else {
        panic!("one virtual host: {:?}", rc.virtual_hosts);
    };
    assert_eq!(vh.domains, [HOST.to_string(), name.clone()]);
    let Some(route::Action::Route(action)) = vh.routes.last().and_then(|r| r.action.clone()) else {
        panic!("route action: {:?}", vh.routes);
    };
    assert_eq!(
        action.cluster_specifier,
        Some(route_action::ClusterSpecifier::Cluster(format!(
            "outbound|7070||{HOST}"
        )))
    );
}

#[test]
fn cds_and_eds_serve_eds_clusters_with_weighted_localities() {
    let cds = resources(XdsType::Cds);
    let cluster = format!("outbound|7070||{HOST}");
    let c: Cluster = decode(&cds, &cluster);
    assert_eq!(
        c.cluster_discovery_type,
        Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32))
    );
    assert_eq!(c.lb_policy, LbPolicy::RoundRobin as i32);
    let eds = c.eds_cluster_config.expect("eds_cluster_config");
    assert_eq!(eds.service_name, cluster);
    assert!(is_ads(eds.eds_config.as_ref()));
    let names: Vec<_> = cds.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [cluster.as_str()],
        "DNS services and Envoy's fixed clusters left out"
    );

    let cla: ClusterLoadAssignment = decode(&resources(XdsType::Eds), &cluster);
    assert_eq!(cla.endpoints.len(), 2, "two localities");
    for loc in &cla.endpoints {
        assert!(
            loc.load_balancing_weight
                .as_ref()
                .is_some_and(|w| w.value > 0),
            "gRPC drops localities without a weight: {loc:?}"
        );
        assert_eq!(loc.lb_endpoints.len(), 1);
        assert!(loc.locality.is_some(), "gRPC rejects a missing locality");
    }
}

#[test]
fn istio_mutual_uses_the_bootstrap_certificate_provider() {
    use proto::envoy::config::core::v3::transport_socket::ConfigType;
    use proto::envoy::extensions::transport_sockets::tls::v3::{
        UpstreamTlsContext, common_tls_context::ValidationContextType,
    };
    let yaml = format!(
        "{}---\nkind: DestinationRule\nmetadata: {{name: echo, namespace: demo}}\nspec:\n  host: {HOST}\n  trafficPolicy: {{tls: {{mode: ISTIO_MUTUAL}}}}\n",
        YAML.replace(
            "{address: 198.18.0.7}",
            "{address: 198.18.0.7, serviceAccount: echo}"
        )
    );
    let config = Config::from_objects(parse_file("test.yaml", &yaml).expect("valid yaml"));
    let snap = Snapshot::new(Arc::new(config), Arc::new(MeshSettings::default()), 1);
    let cds = generate(&snap, &grpc_proxy().view, XdsType::Cds);
    let c: Cluster = decode(&cds, &format!("outbound|7070||{HOST}"));
    let socket = c.transport_socket.expect("mTLS transport socket");
    let Some(ConfigType::TypedConfig(any)) = socket.config_type else {
        panic!("typed config");
    };
    let tls: UpstreamTlsContext = proto::unpack(&any).expect("UpstreamTlsContext");
    let common = tls.common_tls_context.expect("common_tls_context");
    let cert = common
        .tls_certificate_provider_instance
        .expect("certificate provider");
    assert_eq!(
        (cert.instance_name.as_str(), cert.certificate_name.as_str()),
        ("default", "default")
    );
    let Some(ValidationContextType::ValidationContext(v)) = common.validation_context_type else {
        panic!("validation context");
    };
    let roots = v.ca_certificate_provider_instance.expect("root provider");
    assert_eq!(
        (
            roots.instance_name.as_str(),
            roots.certificate_name.as_str()
        ),
        ("default", "ROOTCA")
    );
    #[allow(deprecated)]
    let sans: Vec<_> = v
        .match_subject_alt_names
        .iter()
        .map(|m| format!("{:?}", m.match_pattern))
        .collect();
    assert!(
        sans.iter()
            .any(|s| s.contains("spiffe://cluster.local/ns/demo/sa/echo")),
        "{sans:?}"
    );
    // Without the DestinationRule: plain text.
    let c: Cluster = decode(&resources(XdsType::Cds), &format!("outbound|7070||{HOST}"));
    assert!(c.transport_socket.is_none());
}

/// A gRPC proxy at `ip`, with `labels`.
fn grpc_proxy_at(ip: &str, labels: &[(&str, &str)]) -> Proxy {
    let mut p = grpc_proxy();
    p.view.ips = vec![ip.to_string()];
    p.view.labels = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    p
}

/// xDS-enabled gRPC servers ask for `xds.istio.io/grpc/lds/inbound/<addr>:<port>`: the workload
/// at 198.18.0.7 gets its target port's listener for the wildcard addresses and its own IP,
/// address from the name, one inline-route chain whose `/` route is a NonForwardingAction,
/// router last; plain text by default (PERMISSIVE), mTLS requiring client certificates from
/// the bootstrap's providers under STRICT or for an auto-mTLS workload. A proxy that is no
/// workload of the service gets none.
#[test]
fn xds_servers_get_inbound_listeners_for_their_ports() {
    use proto::envoy::config::core::v3::{address, socket_address, transport_socket};
    use proto::envoy::config::listener::v3::filter;
    use proto::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;

    let lds_for = |yaml: &str, proxy: &Proxy| {
        let config = Config::from_objects(parse_file("test.yaml", yaml).expect("valid yaml"));
        let snap = Snapshot::new(Arc::new(config), Arc::new(MeshSettings::default()), 1);
        generate(&snap, &proxy.view, XdsType::Lds)
    };
    let server = grpc_proxy_at("198.18.0.7", &[]);
    let lds = lds_for(YAML, &server);
    let names: std::collections::BTreeSet<_> = lds
        .iter()
        .filter(|r| r.name.starts_with(super::inbound::SERVER_LISTENER_PREFIX))
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "xds.istio.io/grpc/lds/inbound/0.0.0.0:17070",
            "xds.istio.io/grpc/lds/inbound/[::]:17070",
            "xds.istio.io/grpc/lds/inbound/198.18.0.7:17070",
        ]
        .into()
    );
    let chain_of = |lds: &Resources, name: &str| {
        let l: Listener = decode(lds, name);
        let Some(address::Address::SocketAddress(sa)) = l.address.and_then(|a| a.address) else {
            panic!("socket address");
        };
        assert_eq!(
            sa.port_specifier,
            Some(socket_address::PortSpecifier::PortValue(17070))
        );
        let [chain] = l.filter_chains.as_slice() else {
            panic!("one chain: {:?}", l.filter_chains);
        };
        (sa.address, chain.clone())
    };
    let (addr, chain) = chain_of(&lds, "xds.istio.io/grpc/lds/inbound/[::]:17070");
    assert_eq!(addr, "::");
    assert_eq!(chain.name, "inbound-plaintext");
    assert!(chain.transport_socket.is_none());
    let Some(filter::ConfigType::TypedConfig(any)) = chain.filters[0].config_type.clone() else {
        panic!("typed filter");
    };
    let hcm: HttpConnectionManager = proto::unpack(&any).expect("hcm");
    let Some(RouteSpecifier::RouteConfig(rc)) = hcm.route_specifier else {
        panic!("inline routes");
    };
    let route = &rc.virtual_hosts[0].routes[0];
    assert_eq!(rc.virtual_hosts[0].domains, ["*"]);
    assert!(matches!(
        route.action,
        Some(route::Action::NonForwardingAction(_))
    ));
    let filters: Vec<_> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(filters, ["envoy.filters.http.router"]);

    let strict = format!(
        "{YAML}---\nkind: PeerAuthentication\nmetadata: {{name: default, namespace: demo}}\nspec: {{mtls: {{mode: STRICT}}}}\n"
    );
    let auto = grpc_proxy_at("198.18.0.7", &[("security.istio.io/tlsMode", "istio")]);
    for (yaml, proxy) in [(strict.as_str(), &server), (YAML, &auto)] {
        let lds = lds_for(yaml, proxy);
        let (_, chain) = chain_of(&lds, "xds.istio.io/grpc/lds/inbound/0.0.0.0:17070");
        assert_eq!(chain.name, "inbound-mtls");
        let Some(transport_socket::ConfigType::TypedConfig(any)) =
            chain.transport_socket.expect("mTLS").config_type
        else {
            panic!("typed transport socket");
        };
        let tls: DownstreamTlsContext = proto::unpack(&any).expect("DownstreamTlsContext");
        assert_eq!(tls.require_client_certificate.map(|b| b.value), Some(true));
        let common = tls.common_tls_context.expect("common");
        assert_eq!(
            common
                .tls_certificate_provider_instance
                .expect("cert")
                .certificate_name,
            "default"
        );
    }
    let elsewhere = lds_for(YAML, &grpc_proxy_at("198.18.0.9", &[]));
    assert!(
        !elsewhere
            .iter()
            .any(|r| r.name.starts_with(super::inbound::SERVER_LISTENER_PREFIX)),
        "a proxy that is no workload of the service got a server listener"
    );
}
