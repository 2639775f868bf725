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
    let vips: std::collections::BTreeSet<_> =
        b.services.iter().filter_map(|s| s.auto_vip).collect();
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
