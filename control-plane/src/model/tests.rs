use std::sync::Arc;

use proto::envoy::config::core::v3::Node;
use proto::google::protobuf::{Struct, Value, value::Kind};

use super::*;
use crate::config::{Config, parse_file};

pub(crate) fn snapshot(yaml: &str) -> Snapshot {
    let config = Config::from_objects(parse_file("test.yaml", yaml).expect("valid yaml"));
    Snapshot::new(Arc::new(config), Arc::new(MeshSettings::default()), 1)
}

pub(crate) fn view(ns: &str, labels: &[(&str, &str)], ips: &[&str], dns: bool) -> ProxyView {
    ProxyView {
        namespace: ns.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ips: ips.iter().map(|s| s.to_string()).collect(),
        dns_capture: dns,
        dns_auto_allocate: dns,
        capture: true,
        grpc: false,
    }
}

const SERVICES: &str = r#"
kind: ServiceEntry
metadata: {name: api, namespace: web}
spec:
  hosts: [api.example.com]
  ports: [{number: 80, name: http, protocol: HTTP, targetPort: 8080}]
  resolution: STATIC
  workloadSelector: {labels: {app: api}}
---
kind: WorkloadEntry
metadata: {name: api-1, namespace: web}
spec: {address: 198.18.0.5, labels: {app: api, security.istio.io/tlsMode: istio}, ports: {http: 9090}}
---
kind: WorkloadEntry
metadata: {name: api-2, namespace: web, labels: {app: api}}
spec: {address: 198.18.0.6, serviceAccount: api}
---
kind: WorkloadEntry
metadata: {name: other, namespace: other}
spec: {address: 198.18.0.7, labels: {app: api}}
---
kind: ServiceEntry
metadata: {name: ext, namespace: other}
spec:
  hosts: [ext.example.com, ext2.example.com]
  ports: [{number: 443, name: tls, protocol: TLS}]
  resolution: DNS
"#;

#[test]
fn services_select_workload_entries_in_their_namespace() {
    let snap = snapshot(SERVICES);
    let hosts: Vec<&str> = snap.services.iter().map(|s| s.host.as_str()).collect();
    assert_eq!(
        hosts,
        vec!["api.example.com", "ext.example.com", "ext2.example.com"]
    );
    let api = &snap.services[0];
    let addrs: Vec<&str> = api.endpoints.iter().map(|e| e.address.as_str()).collect();
    assert_eq!(
        addrs,
        vec!["198.18.0.5", "198.18.0.6"],
        "metadata labels count; other namespaces do not"
    );
    assert!(api.endpoints[0].istio_tls && !api.endpoints[1].istio_tls);
    assert_eq!(
        api.endpoints[0].port_for(&api.ports[0]),
        9090,
        "named WorkloadEntry port"
    );
    assert_eq!(api.endpoints[1].port_for(&api.ports[0]), 8080, "targetPort");
    assert_eq!(api.endpoints[0].service_account, "default");
    assert_eq!(api.endpoints[1].service_account, "api");
}

#[test]
fn auto_vips_are_stable_and_in_240_240() {
    let a = snapshot(SERVICES);
    let b = snapshot(&format!(
        "{SERVICES}\n---\nkind: ServiceEntry\nmetadata: {{name: more, namespace: x}}\nspec: {{hosts: [zzz.example.com], ports: [{{number: 1, name: p}}], resolution: DNS}}\n"
    ));
    for s in &a.services {
        let vip = s.auto_vip.expect("allocated");
        assert_eq!(&vip.octets()[..2], &[240, 240]);
        let same = b
            .services
            .iter()
            .find(|x| x.host == s.host)
            .and_then(|x| x.auto_vip);
        assert_eq!(same, Some(vip), "adding a service keeps other VIPs");
    }
    let vips: BTreeSet<_> = b.services.iter().filter_map(|s| s.auto_vip).collect();
    assert_eq!(vips.len(), b.services.len(), "unique");
    let s = &a.services[0];
    assert!(
        a.vips_for(&view("web", &[], &[], false), s).is_empty(),
        "no DNS capture: no auto VIP"
    );
    assert_eq!(
        a.vips_for(&view("web", &[], &[], true), s),
        vec![s.auto_vip.expect("vip").to_string()]
    );
}

#[test]
fn sidecar_egress_scopes_visible_services() {
    let snap = snapshot(&format!(
        "{SERVICES}\n---\nkind: Sidecar\nmetadata: {{name: default, namespace: web}}\nspec: {{egress: [{{hosts: [\"./*\", \"other/ext.example.com\"]}}]}}\n"
    ));
    let visible = |ns: &str| -> Vec<String> {
        snap.visible_services(&view(ns, &[], &[], false))
            .iter()
            .map(|s| s.host.clone())
            .collect()
    };
    assert_eq!(visible("web"), vec!["api.example.com", "ext.example.com"]);
    assert_eq!(visible("other").len(), 3, "no Sidecar in that namespace");
}

#[test]
fn peer_authentication_precedence() {
    let pa = |name: &str, ns: &str, spec: &str| {
        format!(
            "---\nkind: PeerAuthentication\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n"
        )
    };
    let yaml = format!(
        "{}{}{}",
        pa("mesh", "istio-system", "{mtls: {mode: STRICT}}"),
        pa("ns", "web", "{mtls: {mode: UNSET}}"),
        pa(
            "wl",
            "web",
            "{selector: {matchLabels: {}}, mtls: {mode: DISABLE}}"
        )
        .replace("matchLabels: {}", "labels: {app: api}"),
    );
    let with_port = format!(
        "{yaml}{}",
        pa(
            "port",
            "web",
            "{selector: {labels: {app: db}}, portLevelMtls: {5432: {mode: PERMISSIVE}}}"
        )
    );
    let snap = snapshot(&with_port);
    assert_eq!(
        snap.mtls_mode(&view("web", &[("app", "api")], &[], false), 80),
        MtlsMode::Disable
    );
    assert_eq!(
        snap.mtls_mode(&view("web", &[("app", "web")], &[], false), 80),
        MtlsMode::Strict,
        "UNSET inherits the mesh"
    );
    assert_eq!(
        snap.mtls_mode(&view("web", &[("app", "db")], &[], false), 5432),
        MtlsMode::Permissive
    );
    assert_eq!(
        snap.mtls_mode(&view("web", &[("app", "db")], &[], false), 80),
        MtlsMode::Strict
    );
    assert_eq!(
        snapshot("").mtls_mode(&view("x", &[], &[], false), 80),
        MtlsMode::Permissive,
        "default"
    );
}

#[test]
fn inbound_services_match_selector_or_endpoint_ip() {
    let snap = snapshot(SERVICES);
    let inbound = |v: ProxyView| -> Vec<String> {
        snap.inbound_services(&v)
            .iter()
            .map(|s| s.host.clone())
            .collect()
    };
    assert_eq!(
        inbound(view("web", &[("app", "api")], &[], false)),
        vec!["api.example.com"]
    );
    assert!(inbound(view("other", &[("app", "api")], &[], false)).is_empty());
    assert!(
        inbound(view("web", &[("app", "nope")], &["198.18.0.5"], false)).is_empty(),
        "selector services match by labels"
    );
}

#[test]
fn host_wildcards() {
    assert!(host_matches("*", "a.b"));
    assert!(host_matches("*.example.com", "a.example.com"));
    assert!(!host_matches("*.example.com", "example.com"));
    assert!(!host_matches("*.example.com", "aexample.com"));
    assert!(host_matches("a.b", "a.b"));
}

fn sv(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.into())),
    }
}

#[test]
fn proxy_from_node_reads_id_and_metadata() {
    let mut fields = std::collections::HashMap::new();
    fields.insert("NAMESPACE".to_string(), sv("web"));
    fields.insert("SERVICE_ACCOUNT".to_string(), sv("api"));
    fields.insert("INSTANCE_IPS".to_string(), sv("198.18.0.5,fd00::5"));
    fields.insert("CLUSTER_ID".to_string(), sv("Kubernetes"));
    fields.insert("DNS_CAPTURE".to_string(), sv("true"));
    let mut labels = std::collections::HashMap::new();
    labels.insert("app".to_string(), sv("api"));
    fields.insert(
        "LABELS".to_string(),
        Value {
            kind: Some(Kind::StructValue(Struct { fields: labels })),
        },
    );
    let node = Node {
        id: "sidecar~198.18.0.5~api-1.web~web.svc.cluster.local".into(),
        metadata: Some(Struct { fields }),
        ..Default::default()
    };
    let p = Proxy::from_node(Some(&node)).expect("valid");
    assert_eq!(p.kind, "sidecar");
    assert_eq!(p.pod_name, "api-1");
    assert_eq!(p.service_account, "api");
    assert_eq!(p.cluster_id, "Kubernetes");
    assert_eq!(p.view.namespace, "web");
    assert_eq!(p.view.ips, vec!["198.18.0.5", "fd00::5"]);
    assert!(p.view.dns_capture && !p.view.dns_auto_allocate);
    assert!(p.view.capture, "capture unless INTERCEPTION_MODE is NONE");
    assert_eq!(p.view.labels.get("app").map(String::as_str), Some("api"));

    // Namespace from the id when metadata has none; IP from the id when INSTANCE_IPS is absent.
    let bare = Node {
        id: "sidecar~198.18.0.9~pod.ns1~ns1.svc.cluster.local".into(),
        ..Default::default()
    };
    let p = Proxy::from_node(Some(&bare)).expect("valid");
    assert_eq!(
        (p.view.namespace.as_str(), p.view.ips.clone()),
        ("ns1", vec!["198.18.0.9".to_string()])
    );

    assert_eq!(Proxy::from_node(None), Err(ProxyError::NoNode));
    assert!(matches!(
        Proxy::from_node(Some(&Node {
            id: "envoy".into(),
            ..Default::default()
        })),
        Err(ProxyError::BadId(_))
    ));
    let mut bad = node.clone();
    if let Some(md) = bad.metadata.as_mut() {
        md.fields.insert("INSTANCE_IPS".into(), sv("nope"));
    }
    assert!(matches!(
        Proxy::from_node(Some(&bad)),
        Err(ProxyError::BadMetadata {
            field: "INSTANCE_IPS",
            ..
        })
    ));
}

fn kube_snapshot() -> Snapshot {
    let mut objs = parse_file(
        "list.yaml",
        include_str!("../../tests/data/kube/services-list.yaml"),
    )
    .expect("valid");
    objs.extend(
        parse_file(
            "multi.yaml",
            include_str!("../../tests/data/kube/services-multi.yaml"),
        )
        .expect("valid"),
    );
    Snapshot::new(
        Arc::new(Config::from_objects(objs)),
        Arc::new(MeshSettings::default()),
        1,
    )
}

#[test]
fn kubernetes_services_become_services_with_endpoints_from_slices_endpoints_or_pods() {
    let snap = kube_snapshot();
    let svc = |host: &str| {
        snap.services
            .iter()
            .find(|s| s.host == host)
            .unwrap_or_else(|| panic!("no {host}"))
    };
    let pp = svc("productpage.ns1.svc.cluster.local");
    assert_eq!(pp.registry, Registry::Kubernetes);
    assert_eq!(
        (pp.name.as_str(), pp.namespace.as_str()),
        ("productpage", "ns1")
    );
    assert_eq!(pp.vips, vec!["9.9.9.9"]);
    assert_eq!(pp.resolution, Resolution::Static);
    assert_eq!(pp.ports[0].protocol, "HTTP", "from the port name");
    assert_eq!(pp.endpoints.len(), 1, "from the EndpointSlice");
    let ep = &pp.endpoints[0];
    assert_eq!(ep.address, "10.1.0.5");
    assert_eq!(ep.service_account, "bookinfo-productpage", "the Pod's");
    assert_eq!(ep.labels["version"], "v1");
    assert_eq!(ep.port_for(&pp.ports[0]), 9080);

    let ex = svc("example.ns2.svc.cluster.local");
    assert_eq!(ex.ports[0].protocol, "HTTP", "from appProtocol");
    assert_eq!(ex.ports[0].name, "");
    let ep = &ex.endpoints[0];
    assert_eq!(ep.address, "10.2.0.7", "no slice: the selected Pod");
    assert_eq!(ep.port_for(&ex.ports[0]), 8080, "named targetPort");
    assert!(ep.istio_tls);

    let legacy = svc("legacy.ns1.svc.cluster.local");
    assert_eq!(legacy.ports[0].protocol, "GRPC");
    let eps: Vec<(&str, bool, u32)> = legacy
        .endpoints
        .iter()
        .map(|e| (e.address.as_str(), e.healthy, e.port_for(&legacy.ports[0])))
        .collect();
    assert_eq!(
        eps,
        vec![("10.1.0.30", true, 17070), ("10.1.0.31", false, 17070)]
    );

    let db = svc("db.ns1.svc.cluster.local");
    assert_eq!(db.resolution, Resolution::None, "headless: passthrough");
    assert!(db.vips.is_empty());
    let pods: Vec<(&str, &str, &str, bool)> = db
        .endpoints
        .iter()
        .map(|e| {
            (
                e.address.as_str(),
                e.hostname.as_str(),
                e.subdomain.as_str(),
                e.healthy,
            )
        })
        .collect();
    assert_eq!(
        pods,
        vec![
            ("10.1.0.20", "db-0", "db", true),
            ("10.1.0.21", "db-1", "db", false)
        ]
    );
    assert!(db.auto_vip.is_none(), "Services get no auto-allocated VIP");
    assert_eq!(
        snap.vips_for(&view("ns1", &[], &["fd00::9"], true), pp),
        Vec::<String>::new(),
        "an IPv6 proxy does not get the IPv4 cluster IP"
    );
}

#[test]
fn pods_selected_by_a_service_get_its_inbound_ports() {
    let snap = kube_snapshot();
    let at = |ns: &str, ip: &str| -> Vec<(u32, String)> {
        snap.inbound_ports(&view(ns, &[], &[ip], true))
            .into_iter()
            .map(|(t, p)| (t, p.protocol.clone()))
            .collect()
    };
    assert_eq!(at("ns2", "10.2.0.7"), vec![(8080, "HTTP".to_string())]);
    assert_eq!(at("ns1", "10.1.0.5"), vec![(9080, "HTTP".to_string())]);
    assert_eq!(at("ns1", "10.1.0.20"), vec![(5432, "TCP".to_string())]);
    assert!(at("ns1", "10.9.9.9").is_empty(), "no service has that pod");
}

#[test]
fn auto_allocation_is_istiods() {
    // istiod's own expectations (pilot/pkg/xds/nds_test.go, "auto allocate").
    let snap = snapshot(include_str!("../../tests/data/kube/nds-se.yaml"));
    let auto = |host: &str| {
        let s = snap.services.iter().find(|s| s.host == host).unwrap();
        (
            s.auto_vip.map(|v| v.to_string()),
            s.auto_vip6.map(|v| v.to_string()),
        )
    };
    assert_eq!(
        auto("random-1.host.example").0.as_deref(),
        Some("240.240.116.21")
    );
    assert_eq!(
        auto("random-3.host.example").0.as_deref(),
        Some("240.240.81.100")
    );
    assert_eq!(
        auto("random-1.host.example").1.as_deref(),
        Some("2001:2::f0f0:7415"),
        "the IPv6 twin: 2001:2::f0f0:<third octet><fourth octet> in hex"
    );
    assert_eq!(
        auto("random-2.host.example"),
        (None, None),
        "has an address"
    );
    assert_eq!(auto("*.random-4.host.example"), (None, None), "wildcard");
    assert_eq!(
        auto("random-5.host.example"),
        (None, None),
        "resolution NONE"
    );
}

/// A ServiceEntry `name` in namespace `web`, host `<name>.example.com`, exported to `export_to`.
fn exported_se(name: &str, export_to: &str) -> String {
    format!(
        "kind: ServiceEntry\nmetadata: {{name: {name}, namespace: web}}\nspec: {{hosts: [{name}.example.com], ports: [{{number: 80, name: http, protocol: HTTP}}], resolution: DNS, exportTo: {export_to}}}\n---\n"
    )
}

const EXPORTED: &str = r#"
apiVersion: v1
kind: Service
metadata:
  name: db
  namespace: web
  annotations: {networking.istio.io/exportTo: ".,other"}
spec:
  clusterIP: 10.96.0.20
  ports: [{name: tcp, port: 5432}]
---
apiVersion: v1
kind: Service
metadata: {name: open, namespace: web}
spec:
  clusterIP: 10.96.0.21
  ports: [{name: http, port: 80}]
---
kind: DestinationRule
metadata: {name: open-web-only, namespace: web}
spec:
  host: open.web.svc.cluster.local
  exportTo: ["."]
  trafficPolicy: {tls: {mode: DISABLE}}
---
kind: VirtualService
metadata: {name: open-web-only, namespace: web}
spec:
  hosts: [open.web.svc.cluster.local]
  exportTo: ["."]
  http: [{route: [{destination: {host: open.web.svc.cluster.local}}]}]
"#;

/// `exportTo` (ServiceEntry and DestinationRule/VirtualService `spec.exportTo`, a Service's
/// `networking.istio.io/exportTo` annotation) decides which namespaces' proxies see each one.
#[test]
fn export_to_scopes_services_rules_and_routes() {
    let snap = snapshot(&format!(
        "{}{}{}{EXPORTED}",
        exported_se("local", r#"["."]"#),
        exported_se("to-other", "[other]"),
        exported_se("hidden", r#"["~"]"#),
    ));
    let visible = |ns: &str| -> Vec<String> {
        snap.visible_services(&view(ns, &[], &[], false))
            .iter()
            .map(|s| s.host.clone())
            .collect()
    };
    assert_eq!(
        visible("web"),
        vec![
            "db.web.svc.cluster.local",
            "local.example.com",
            "open.web.svc.cluster.local"
        ]
    );
    assert_eq!(
        visible("other"),
        vec![
            "db.web.svc.cluster.local",
            "open.web.svc.cluster.local",
            "to-other.example.com"
        ]
    );
    assert_eq!(visible("third"), vec!["open.web.svc.cluster.local"]);
    let open = snap
        .services
        .iter()
        .find(|s| s.host == "open.web.svc.cluster.local")
        .unwrap();
    assert!(snap.destination_rule("web", open).is_some());
    assert!(snap.destination_rule("third", open).is_none());
    assert_eq!(snap.virtual_services_for("web", &open.host).len(), 1);
    assert!(snap.virtual_services_for("third", &open.host).is_empty());
}

#[test]
fn bad_export_to_names_the_field() {
    let err = parse_file(
        "bad.yaml",
        "kind: ServiceEntry\nmetadata: {name: a, namespace: web}\nspec: {hosts: [a.example.com], ports: [{number: 80, name: http}], resolution: DNS, exportTo: [\"~\", \".\"]}\n",
    )
    .unwrap_err()
    .iter()
    .map(ToString::to_string)
    .collect::<Vec<_>>()
    .join("; ");
    assert!(err.contains("spec.exportTo[0]"), "{err}");
    let err = parse_file(
        "bad.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: web, annotations: {networking.istio.io/exportTo: \"Web\"}}\nspec: {ports: [{port: 80}]}\n",
    )
    .unwrap_err()
    .iter()
    .map(ToString::to_string)
    .collect::<Vec<_>>()
    .join("; ");
    assert!(
        err.contains("metadata.annotations[networking.istio.io/exportTo][0]"),
        "{err}"
    );
}
