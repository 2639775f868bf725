//! YAML → snapshot → Envoy resources, checked on the decoded protos.

use std::sync::Arc;

use proto::envoy::config::cluster::v3::{
    Cluster,
    cluster::{ClusterDiscoveryType, DiscoveryType},
};
use proto::envoy::config::core::v3::transport_socket;
use proto::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};
use proto::envoy::config::listener::v3::{Listener, filter};
use proto::envoy::config::route::v3::{RouteConfiguration, route, route_action, route_match};
use proto::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier,
};
use proto::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use proto::envoy::extensions::transport_sockets::tls::v3::{
    UpstreamTlsContext, common_tls_context::ValidationContextType,
};
use proto::istio::nds::NameTable;

use super::*;
use crate::config::{Config, parse_file};
use crate::model::{MeshSettings, ProxyView};

fn snapshot(yaml: &str) -> Snapshot {
    let config = Config::from_objects(parse_file("test.yaml", yaml).expect("valid yaml"));
    Snapshot::new(Arc::new(config), Arc::new(MeshSettings::default()), 1)
}

fn client(ns: &str, dns: bool) -> ProxyView {
    ProxyView {
        namespace: ns.into(),
        labels: Default::default(),
        ips: vec!["198.18.0.100".into()],
        dns_capture: dns,
        dns_auto_allocate: dns,
        capture: true,
        grpc: false,
    }
}

fn get<'a>(rs: &'a Resources, name: &str) -> &'a Resource {
    rs.iter().find(|r| r.name == name).unwrap_or_else(|| {
        panic!(
            "no {name}; have {:?}",
            rs.iter().map(|r| &r.name).collect::<Vec<_>>()
        )
    })
}

fn decode<M: prost::Name + Default>(r: &Resource) -> M {
    proto::unpack(&r.any).expect("decode")
}

const BASE: &str = r#"
kind: ServiceEntry
metadata: {name: api, namespace: web}
spec:
  hosts: [api.example.com]
  addresses: [198.18.10.1]
  ports: [{number: 80, name: http, protocol: HTTP, targetPort: 8080}]
  resolution: STATIC
  workloadSelector: {labels: {app: api}}
---
kind: WorkloadEntry
metadata: {name: api-1, namespace: web}
spec: {address: 198.18.0.5, labels: {app: api, version: v1}, serviceAccount: api, locality: r1/z1}
---
kind: WorkloadEntry
metadata: {name: api-2, namespace: web}
spec: {address: 198.18.0.6, labels: {app: api, version: v2}, serviceAccount: api}
---
kind: ServiceEntry
metadata: {name: db, namespace: web}
spec:
  hosts: [db.example.com]
  ports: [{number: 5432, name: tcp}]
  resolution: STATIC
  endpoints: [{address: 198.18.0.7, labels: {security.istio.io/tlsMode: istio}}]
---
kind: DestinationRule
metadata: {name: api, namespace: web}
spec:
  host: api.example.com
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}, connectionPool: {tcp: {maxConnections: 7}}}
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}, trafficPolicy: {tls: {mode: DISABLE}}}]
---
kind: VirtualService
metadata: {name: api, namespace: web}
spec:
  hosts: [api.example.com]
  http:
  - match: [{uri: {prefix: /canary}, headers: {X-User: {exact: bob}}}]
    route:
    - {destination: {host: api.example.com, subset: v1}, weight: 90}
    - {destination: {host: api.example.com, subset: v2}, weight: 10}
    timeout: 1.5s
  - route: [{destination: {host: api.example.com, subset: v1}}]
    retries: {attempts: 0}
"#;

#[test]
fn clusters_per_port_and_subset_with_tls_modes() {
    let snap = snapshot(BASE);
    let cds = generate(&snap, &client("web", false), XdsType::Cds);
    let names: Vec<&str> = cds.iter().map(|r| r.name.as_str()).collect();
    for want in [
        "outbound|80||api.example.com",
        "outbound|80|v1|api.example.com",
        "outbound|80|v2|api.example.com",
        "outbound|5432||db.example.com",
        PASSTHROUGH_CLUSTER,
        BLACKHOLE_CLUSTER,
        INBOUND_PASSTHROUGH_CLUSTER,
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    let base: Cluster = decode(get(&cds, "outbound|80||api.example.com"));
    assert_eq!(
        base.cluster_discovery_type,
        Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32))
    );
    assert_eq!(
        base.eds_cluster_config
            .as_ref()
            .map(|e| e.service_name.as_str()),
        Some("outbound|80||api.example.com")
    );
    assert_eq!(
        base.circuit_breakers
            .as_ref()
            .map(|c| c.thresholds[0].max_connections.as_ref().map(|m| m.value)),
        Some(Some(7))
    );
    let ts = base.transport_socket.expect("ISTIO_MUTUAL socket");
    let Some(transport_socket::ConfigType::TypedConfig(any)) = ts.config_type else {
        panic!("typed")
    };
    let tls: UpstreamTlsContext = proto::unpack(&any).expect("tls ctx");
    assert_eq!(tls.sni, "outbound_.80_._.api.example.com");
    let common = tls.common_tls_context.expect("common");
    assert_eq!(common.tls_certificate_sds_secret_configs[0].name, "default");
    assert_eq!(common.alpn_protocols, vec!["istio-peer-exchange", "istio"]);
    let Some(ValidationContextType::CombinedValidationContext(v)) = common.validation_context_type
    else {
        panic!("combined")
    };
    assert_eq!(
        v.validation_context_sds_secret_config.map(|s| s.name),
        Some("ROOTCA".into())
    );
    let sans: Vec<String> = v
        .default_validation_context
        .expect("ctx")
        .match_typed_subject_alt_names
        .iter()
        .filter_map(|m| {
            m.matcher.as_ref().and_then(|m| match &m.match_pattern {
                Some(proto::envoy::r#type::matcher::v3::string_matcher::MatchPattern::Exact(s)) => {
                    Some(s.clone())
                }
                _ => None,
            })
        })
        .collect();
    assert_eq!(sans, vec!["spiffe://cluster.local/ns/web/sa/api"]);

    let v2: Cluster = decode(get(&cds, "outbound|80|v2|api.example.com"));
    assert!(v2.transport_socket.is_none(), "subset DISABLE overrides");
    let v1: Cluster = decode(get(&cds, "outbound|80|v1|api.example.com"));
    assert!(v1.transport_socket.is_some());

    // Auto mTLS: db's endpoint carries tlsMode=istio, so the cluster has socket matches.
    let db: Cluster = decode(get(&cds, "outbound|5432||db.example.com"));
    assert!(db.transport_socket.is_none());
    let match_names: Vec<&str> = db
        .transport_socket_matches
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(match_names, vec!["tlsMode-istio", "tlsMode-disabled"]);
}

#[test]
fn endpoints_follow_subsets_and_localities() {
    let snap = snapshot(BASE);
    let eds = generate(&snap, &client("web", false), XdsType::Eds);
    let addrs = |name: &str| -> Vec<(String, u32)> {
        let cla: ClusterLoadAssignment = decode(get(&eds, name));
        cla.endpoints.iter().flat_map(|l| l.lb_endpoints.iter()).filter_map(|e| match &e.host_identifier {
            Some(lb_endpoint::HostIdentifier::Endpoint(ep)) => match ep.address.as_ref()?.address.as_ref()? {
                proto::envoy::config::core::v3::address::Address::SocketAddress(sa) => Some((sa.address.clone(), match sa.port_specifier { Some(proto::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(p)) => p, _ => 0 })),
                _ => None,
            },
            _ => None,
        }).collect()
    };
    let mut all = addrs("outbound|80||api.example.com");
    all.sort();
    assert_eq!(
        all,
        vec![
            ("198.18.0.5".to_string(), 8080),
            ("198.18.0.6".to_string(), 8080)
        ]
    );
    assert_eq!(
        addrs("outbound|80|v2|api.example.com"),
        vec![("198.18.0.6".to_string(), 8080)]
    );
    let cla: ClusterLoadAssignment = decode(get(&eds, "outbound|80||api.example.com"));
    let regions: Vec<String> = cla
        .endpoints
        .iter()
        .map(|l| {
            l.locality
                .as_ref()
                .map(|x| x.region.clone())
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(regions, vec!["", "r1"]);
    let db: ClusterLoadAssignment = decode(get(&eds, "outbound|5432||db.example.com"));
    let md = db.endpoints[0].lb_endpoints[0]
        .metadata
        .as_ref()
        .expect("tls metadata");
    assert!(
        md.filter_metadata
            .contains_key("envoy.transport_socket_match")
    );
}

fn hcm_of(f: &proto::envoy::config::listener::v3::Filter) -> Option<HttpConnectionManager> {
    match &f.config_type {
        Some(filter::ConfigType::TypedConfig(any)) => proto::unpack(any).ok(),
        _ => None,
    }
}

#[test]
fn virtual_outbound_has_vip_chains_and_passthrough() {
    let snap = snapshot(BASE);
    let lds = generate(&snap, &client("web", false), XdsType::Lds);
    let out: Listener = decode(get(&lds, VIRTUAL_OUTBOUND));
    assert_eq!(
        out.listener_filters[0].name,
        "envoy.filters.listener.original_dst"
    );
    let chain = out
        .filter_chains
        .iter()
        .find(|c| c.name == "198.18.10.1_80")
        .expect("VIP chain");
    let m = chain.filter_chain_match.as_ref().expect("match");
    assert_eq!(m.destination_port.as_ref().map(|p| p.value), Some(80));
    assert_eq!(m.prefix_ranges[0].address_prefix, "198.18.10.1");
    let hcm = hcm_of(&chain.filters[0]).expect("HTTP port → HCM");
    let Some(RouteSpecifier::Rds(rds)) = hcm.route_specifier else {
        panic!("rds")
    };
    assert_eq!(rds.route_config_name, "80");
    // db has no VIP and is TCP: no chain of its own (traffic passes through).
    assert!(!out.filter_chains.iter().any(|c| c.name.ends_with("_5432")));
    let default = out.default_filter_chain.expect("passthrough");
    let Some(filter::ConfigType::TypedConfig(any)) = &default.filters[0].config_type else {
        panic!()
    };
    let tcp: TcpProxy = proto::unpack(any).expect("tcp proxy");
    assert_eq!(
        tcp.cluster_specifier,
        Some(tcp_proxy::ClusterSpecifier::Cluster(
            PASSTHROUGH_CLUSTER.into()
        ))
    );
}

#[test]
fn tcp_service_with_vip_gets_tcp_proxy_chain_and_auto_vip_with_dns_capture() {
    let snap = snapshot(BASE);
    // With DNS capture, db gets an auto-allocated VIP and therefore a chain.
    let lds = generate(&snap, &client("web", true), XdsType::Lds);
    let out: Listener = decode(get(&lds, VIRTUAL_OUTBOUND));
    let vip = snap
        .services
        .iter()
        .find(|s| s.host == "db.example.com")
        .and_then(|s| s.auto_vip)
        .expect("auto vip");
    let chain = out
        .filter_chains
        .iter()
        .find(|c| c.name == format!("{vip}_5432"))
        .expect("auto VIP chain");
    let Some(filter::ConfigType::TypedConfig(any)) = &chain.filters[0].config_type else {
        panic!()
    };
    let tcp: TcpProxy = proto::unpack(any).expect("tcp proxy");
    assert_eq!(
        tcp.cluster_specifier,
        Some(tcp_proxy::ClusterSpecifier::Cluster(
            "outbound|5432||db.example.com".into()
        ))
    );
}

#[test]
fn virtual_inbound_follows_peer_authentication() {
    let strict = format!(
        "{BASE}\n---\nkind: PeerAuthentication\nmetadata: {{name: default, namespace: web}}\nspec: {{mtls: {{mode: STRICT}}}}\n"
    );
    let api = ProxyView {
        namespace: "web".into(),
        labels: [("app".to_string(), "api".to_string())]
            .into_iter()
            .collect(),
        ips: vec!["198.18.0.5".into()],
        dns_capture: false,
        dns_auto_allocate: false,
        capture: true,
        grpc: false,
    };
    let inbound = |yaml: &str| -> Listener {
        let lds = generate(&snapshot(yaml), &api, XdsType::Lds);
        decode(get(&lds, VIRTUAL_INBOUND))
    };
    // Without capture (INTERCEPTION_MODE NONE) the virtual listeners are sent but not bound.
    let lds = generate(
        &snapshot(&strict),
        &ProxyView {
            capture: false,
            ..api.clone()
        },
        XdsType::Lds,
    );
    for name in [VIRTUAL_INBOUND, VIRTUAL_OUTBOUND] {
        let l: Listener = decode(get(&lds, name));
        assert_eq!(l.bind_to_port.map(|b| b.value), Some(false), "{name}");
    }
    let l: Listener = decode(get(
        &generate(&snapshot(&strict), &api, XdsType::Lds),
        VIRTUAL_INBOUND,
    ));
    assert_eq!(l.bind_to_port.map(|b| b.value), Some(true));
    let l = inbound(&strict);
    let names: Vec<&str> = l.filter_chains.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, vec!["inbound|8080||-mtls"]);
    assert!(l.filter_chains[0].transport_socket.is_some());
    assert!(
        l.default_filter_chain
            .as_ref()
            .and_then(|c| c.transport_socket.as_ref())
            .is_some(),
        "STRICT passthrough needs mTLS too"
    );

    let l = inbound(BASE);
    let names: Vec<&str> = l.filter_chains.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "inbound|8080||-mtls",
            "inbound|8080||-plaintext",
            "InboundPassthroughFilterChain-mtls"
        ],
        "PERMISSIVE by default"
    );
    let mtls = &l.filter_chains[0]
        .filter_chain_match
        .as_ref()
        .expect("match");
    assert_eq!(mtls.transport_protocol, "tls");
    assert!(
        l.default_filter_chain
            .as_ref()
            .and_then(|c| c.transport_socket.as_ref())
            .is_none()
    );

    let disabled = BASE.to_string()
        + "\n---\nkind: PeerAuthentication\nmetadata: {name: default, namespace: istio-system}\nspec: {mtls: {mode: DISABLE}}\n";
    let l = inbound(&disabled);
    assert!(l.filter_chains.iter().all(|c| c.transport_socket.is_none()));
    let cds = generate(&snapshot(&disabled), &api, XdsType::Cds);
    assert!(cds.iter().any(|r| r.name == "inbound|8080||"));
}

#[test]
fn routes_from_virtual_service() {
    let snap = snapshot(BASE);
    let rds = generate(&snap, &client("web", false), XdsType::Rds);
    assert_eq!(rds.len(), 1);
    let rc: RouteConfiguration = decode(get(&rds, "80"));
    let vh = rc
        .virtual_hosts
        .iter()
        .find(|v| v.name == "api.example.com:80")
        .expect("vhost");
    assert_eq!(
        vh.domains,
        vec![
            "api.example.com",
            "api.example.com:80",
            "198.18.10.1",
            "198.18.10.1:80"
        ]
    );
    assert_eq!(vh.routes.len(), 2);
    let r0 = &vh.routes[0];
    let m = r0.r#match.as_ref().expect("match");
    assert_eq!(
        m.path_specifier,
        Some(route_match::PathSpecifier::Prefix("/canary".into()))
    );
    assert_eq!(m.headers[0].name, "x-user");
    let Some(route::Action::Route(a)) = &r0.action else {
        panic!("route")
    };
    assert_eq!(
        a.timeout.as_ref().map(|d| (d.seconds, d.nanos)),
        Some((1, 500_000_000))
    );
    let Some(route_action::ClusterSpecifier::WeightedClusters(w)) = &a.cluster_specifier else {
        panic!("weighted")
    };
    let split: Vec<(String, u32)> = w
        .clusters
        .iter()
        .map(|c| (c.name.clone(), c.weight.as_ref().map_or(0, |w| w.value)))
        .collect();
    assert_eq!(
        split,
        vec![
            ("outbound|80|v1|api.example.com".to_string(), 90),
            ("outbound|80|v2|api.example.com".to_string(), 10)
        ]
    );
    let Some(route::Action::Route(a1)) = &vh.routes[1].action else {
        panic!("route")
    };
    assert_eq!(
        a1.cluster_specifier,
        Some(route_action::ClusterSpecifier::Cluster(
            "outbound|80|v1|api.example.com".into()
        ))
    );
    assert!(a1.retry_policy.is_none(), "attempts: 0 disables retries");
    assert!(
        rc.virtual_hosts
            .iter()
            .any(|v| v.name == "allow_any" && v.domains == vec!["*"])
    );
}

#[test]
fn name_table_only_with_dns_capture() {
    let snap = snapshot(BASE);
    let nds = generate(&snap, &client("web", true), XdsType::Nds);
    assert_eq!(nds.len(), 1);
    assert_eq!(nds[0].name, "");
    let t: NameTable = decode(&nds[0]);
    assert_eq!(t.table["api.example.com"].ips, vec!["198.18.10.1"]);
    let db_vip = snap
        .services
        .iter()
        .find(|s| s.host == "db.example.com")
        .and_then(|s| s.auto_vip)
        .expect("vip");
    assert_eq!(t.table["db.example.com"].ips, vec![db_vip.to_string()]);
    let plain: NameTable = decode(&generate(&snap, &client("web", false), XdsType::Nds)[0]);
    assert!(plain.table.is_empty());
}

#[test]
fn a_workload_entry_change_changes_only_endpoints() {
    let before = CachedSnapshot::new(Arc::new(snapshot(BASE)));
    let after = CachedSnapshot::new(Arc::new(snapshot(
        &BASE.replace("198.18.0.6", "198.18.0.16"),
    )));
    let v = client("web", false);
    for ty in XdsType::ALL {
        let a = before.resources(&v, ty);
        let b = after.resources(&v, ty);
        let same = a.iter().map(|r| r.hash).eq(b.iter().map(|r| r.hash));
        assert_eq!(same, ty != XdsType::Eds, "{ty:?}");
    }
    // Equal views share one generation per snapshot.
    assert!(Arc::ptr_eq(
        &before.resources(&v, XdsType::Cds),
        &before.resources(&client("web", false), XdsType::Cds)
    ));
}

#[test]
fn registry_only_blackholes_unknown_traffic() {
    let config = Config::from_objects(parse_file("t", BASE).expect("valid"));
    let mesh = MeshSettings {
        allow_any: false,
        ..Default::default()
    };
    let snap = Snapshot::new(Arc::new(config), Arc::new(mesh), 1);
    let lds = generate(&snap, &client("web", false), XdsType::Lds);
    let out: Listener = decode(get(&lds, VIRTUAL_OUTBOUND));
    let default = out.default_filter_chain.expect("default");
    let Some(filter::ConfigType::TypedConfig(any)) = &default.filters[0].config_type else {
        panic!()
    };
    let tcp: TcpProxy = proto::unpack(any).expect("tcp");
    assert_eq!(
        tcp.cluster_specifier,
        Some(tcp_proxy::ClusterSpecifier::Cluster(
            BLACKHOLE_CLUSTER.into()
        ))
    );
}

const KUBE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: bookinfo}
spec:
  clusterIP: 198.19.0.40
  selector: {app: reviews}
  ports: [{name: http, port: 9080, targetPort: http-app}]
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-1, namespace: bookinfo, labels: {app: reviews, security.istio.io/tlsMode: istio}}
spec:
  serviceAccountName: bookinfo-reviews
  containers: [{name: app, ports: [{name: http-app, containerPort: 9081}]}]
status: {podIP: 198.18.0.100}
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-2, namespace: bookinfo, labels: {app: reviews}}
spec:
  containers: [{name: app, ports: [{name: http-app, containerPort: 9082}]}]
status:
  podIP: 198.18.0.101
  conditions: [{type: Ready, status: "False"}]
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-3, namespace: bookinfo, labels: {app: reviews}}
status: {podIP: 198.18.0.102}
"#;

#[test]
fn kubernetes_service_generates_istios_cluster_endpoints_routes_and_inbound() {
    let snap = snapshot(KUBE);
    let host = "reviews.bookinfo.svc.cluster.local";
    let cluster = format!("outbound|9080||{host}");
    let mut view = client("bookinfo", true);
    // CDS: the EDS cluster, auto mTLS towards the Pod's identity.
    let c: Cluster = decode(get(&generate(&snap, &view, XdsType::Cds), &cluster));
    assert_eq!(
        c.cluster_discovery_type,
        Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32))
    );
    assert_eq!(c.transport_socket_matches[0].name, "tlsMode-istio");
    // EDS: the pods on the container port the named targetPort points at; the not-ready one
    // UNHEALTHY.
    let cla: ClusterLoadAssignment = decode(get(&generate(&snap, &view, XdsType::Eds), &cluster));
    let eps: Vec<(String, i32)> = cla.endpoints[0]
        .lb_endpoints
        .iter()
        .map(|e| {
            let Some(lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                panic!("endpoint")
            };
            let Some(proto::envoy::config::core::v3::address::Address::SocketAddress(sa)) =
                ep.address.as_ref().and_then(|a| a.address.as_ref())
            else {
                panic!("socket address")
            };
            let Some(proto::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(p)) =
                sa.port_specifier
            else {
                panic!("port")
            };
            (format!("{}:{p}", sa.address), e.health_status)
        })
        .collect();
    use proto::envoy::config::core::v3::HealthStatus;
    assert_eq!(
        eps,
        vec![
            (
                "198.18.0.100:9081".to_string(),
                HealthStatus::Unknown as i32
            ),
            (
                "198.18.0.101:9082".to_string(),
                HealthStatus::Unhealthy as i32
            ),
        ],
        "reviews-3 has no port named http-app: not an endpoint"
    );
    // RDS: the Host headers of a Service called from its own namespace.
    let rc: RouteConfiguration = decode(get(&generate(&snap, &view, XdsType::Rds), "9080"));
    let domains = &rc.virtual_hosts[0].domains;
    for d in [
        host,
        "reviews",
        "reviews:9080",
        "reviews.bookinfo",
        "reviews.bookinfo.svc",
        "198.19.0.40",
    ] {
        assert!(domains.iter().any(|x| x == d), "{d} not in {domains:?}");
    }
    view.namespace = "other".into();
    let rc: RouteConfiguration = decode(get(&generate(&snap, &view, XdsType::Rds), "9080"));
    let domains = &rc.virtual_hosts[0].domains;
    assert!(!domains.iter().any(|x| x == "reviews"), "{domains:?}");
    assert!(
        domains.iter().any(|x| x == "reviews.bookinfo"),
        "{domains:?}"
    );
    // The pod at 198.18.0.100 gets the inbound side on its container port.
    let view = client("bookinfo", true);
    let cds = generate(&snap, &view, XdsType::Cds);
    get(&cds, "inbound|9081||");
    // NDS: registry Kubernetes with the short name and namespace.
    let nt: NameTable = decode(&generate(&snap, &view, XdsType::Nds)[0]);
    let info = &nt.table[host];
    assert_eq!(info.ips, vec!["198.19.0.40"]);
    assert_eq!(
        (
            info.registry.as_str(),
            info.namespace.as_str(),
            info.shortname.as_str()
        ),
        ("Kubernetes", "bookinfo", "reviews")
    );
}

/// A ServiceEntry exported only to its own namespace: its cluster, its listener chain and its
/// DNS entry are generated for proxies there and for nobody else.
#[test]
fn export_to_keeps_a_service_out_of_other_namespaces_config() {
    let snap = snapshot(
        "kind: ServiceEntry\nmetadata: {name: local, namespace: web}\nspec: {hosts: [local.example.com], addresses: [198.18.20.1], ports: [{number: 80, name: http, protocol: HTTP}], resolution: DNS, exportTo: [\".\"]}\n",
    );
    let cluster = "outbound|80||local.example.com";
    let has_cluster = |ns: &str| {
        generate(&snap, &client(ns, true), XdsType::Cds)
            .iter()
            .any(|r| r.name == cluster)
    };
    assert!(has_cluster("web"));
    assert!(!has_cluster("other"));
    let names = |ns: &str| -> Vec<String> {
        let t: NameTable = decode(&generate(&snap, &client(ns, true), XdsType::Nds)[0]);
        t.table.keys().cloned().collect()
    };
    assert_eq!(names("web"), vec!["local.example.com"]);
    assert!(names("other").is_empty());
}
