use super::*;

const GOOD: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: httpbin, namespace: web}
spec:
  hosts: [httpbin.example.com]
  addresses: [198.18.10.1]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  workloadSelector: {labels: {app: httpbin}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: httpbin-1, namespace: web}
spec: {address: 198.18.0.5, labels: {app: httpbin}, serviceAccount: httpbin}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: httpbin, namespace: web}
spec:
  hosts: [httpbin.example.com]
  http:
  - match: [{uri: {prefix: /a}, headers: {x-user: {exact: bob}}}]
    route:
    - {destination: {host: httpbin.example.com, subset: v1}, weight: 90}
    - {destination: {host: httpbin.example.com, subset: v2}, weight: 10}
    timeout: 1.5s
    retries: {attempts: 3, perTryTimeout: 500ms}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: httpbin, namespace: web}
spec:
  host: httpbin.example.com
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}, connectionPool: {tcp: {maxConnections: 7}}}
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: web}
spec: {mtls: {mode: STRICT}}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: web}
spec: {egress: [{hosts: ["./*", "istio-system/*"]}]}
---
"#;

#[test]
fn every_kind_parses_from_one_multi_document_file() {
    let objs = parse_file("all.yaml", GOOD).expect("valid");
    let config = Config::from_objects(objs);
    assert_eq!(config.len(), 6);
    let se = &config.service_entries[0];
    assert_eq!(
        (se.meta.namespace.as_str(), se.meta.name.as_str()),
        ("web", "httpbin")
    );
    assert_eq!(se.spec.ports[0].protocol.as_deref(), Some("HTTP"));
    let vs = &config.virtual_services[0].spec;
    assert_eq!(vs.http[0].route[1].weight, Some(10));
    assert_eq!(
        vs.http[0].matches[0].headers["x-user"].exact.as_deref(),
        Some("bob")
    );
    let dr = &config.destination_rules[0].spec;
    assert_eq!(
        dr.traffic_policy
            .as_ref()
            .and_then(|t| t.tls.as_ref())
            .map(|t| t.mode),
        Some(TlsMode::IstioMutual)
    );
    assert_eq!(
        config.peer_authentications[0]
            .spec
            .mtls
            .as_ref()
            .map(|m| m.mode),
        Some(MtlsMode::Strict)
    );
    assert_eq!(
        config.sidecars[0].spec.egress[0].hosts,
        vec!["./*", "istio-system/*"]
    );
    assert_eq!(config.workload_entries[0].spec.service_account, "httpbin");
}

fn one_error(text: &str) -> ConfigError {
    let errs = parse_file("f.yaml", text).expect_err("must be rejected");
    assert_eq!(errs.len(), 1, "{errs:?}");
    errs[0].clone()
}

#[test]
fn bad_documents_name_file_document_field_and_reason() {
    let se = |ports: &str| {
        format!(
            "kind: WorkloadEntry\nmetadata: {{name: ok}}\nspec: {{address: 198.18.0.1}}\n---\nkind: ServiceEntry\nmetadata: {{name: x}}\nspec:\n  hosts: [a.example]\n  ports: {ports}\n"
        )
    };
    let e = one_error(&se("[{number: 99999, name: http}]"));
    assert_eq!(
        (e.file.as_str(), e.doc, e.field.as_str()),
        ("f.yaml", 1, "spec.ports[0].number")
    );
    assert!(e.reason.contains("99999"), "{e}");

    let e = one_error(&se("[{number: 80, nmae: http}]"));
    assert_eq!(e.doc, 1);
    assert!(e.field.starts_with("spec.ports[0]"), "{e}");
    assert!(e.reason.contains("nmae"), "{e}");

    let e = one_error(&se("[{number: 80, protocol: SMTP}]"));
    assert_eq!(e.field, "spec.ports[0].protocol");

    let e = one_error("kind: Gateway\nmetadata: {name: g}\nspec: {}\n");
    assert_eq!((e.doc, e.field.as_str()), (0, "kind"));

    let e =
        one_error("kind: WorkloadEntry\nmetadata: {name: Bad_Name}\nspec: {address: 198.18.0.1}\n");
    assert_eq!(e.field, "metadata.name");

    let e = one_error("kind: WorkloadEntry\nmetadata: {name: w}\nspec: {address: not-an-ip}\n");
    assert_eq!(e.field, "spec.address");

    let e = one_error(
        "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], timeout: soon}]}\n",
    );
    assert_eq!(e.field, "spec.http[0].timeout");

    let e =
        one_error("kind: PeerAuthentication\nmetadata: {name: p}\nspec: {mtls: {mode: MAYBE}}\n");
    assert!(e.field.starts_with("spec.mtls"), "{e}");

    let e = one_error("kind: [unclosed\n");
    assert_eq!(e.doc, 0);
    assert!(e.reason.contains("not YAML"), "{e}");
}

/// A document's duration fields read Go's syntax (the one table of cases lives in go_syntax);
/// a bad one is refused naming the value and what was expected.
#[test]
fn document_durations_follow_go() {
    assert!(validate::check_duration("timeout", &Some("1m30s".into())).is_ok());
    assert!(validate::check_duration("timeout", &None).is_ok());
    for bad in ["10", "5 parsecs", "", "1d", "-1s"] {
        let (field, reason) = validate::check_duration("timeout", &Some(bad.into())).unwrap_err();
        assert_eq!(field, "timeout");
        assert!(reason.contains(go_syntax::DURATION_EXPECTED), "{reason}");
    }
    let (_, reason) = validate::check_duration("timeout", &Some("10".into())).unwrap_err();
    assert!(
        reason.contains("\"10\"") && reason.contains("missing unit"),
        "{reason}"
    );
}

#[test]
fn store_keeps_a_files_last_good_config_and_drops_deleted_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("a.yaml");
    let b = dir.path().join("sub/b.yml");
    std::fs::create_dir_all(b.parent().expect("parent")).expect("mkdir");
    std::fs::write(&a, GOOD).expect("write");
    std::fs::write(
        &b,
        "kind: WorkloadEntry\nmetadata: {name: w2, namespace: web}\nspec: {address: 198.18.0.6}\n",
    )
    .expect("write");
    std::fs::write(dir.path().join("ignored.txt"), "not config").expect("write");
    let mut store = Store::default();
    let first = store.reload(dir.path());
    assert_eq!(first.len(), 7);
    assert!(store.errors().is_empty());

    // Break a.yaml: its last good objects stay, the error is recorded.
    std::fs::write(&a, GOOD.replace("number: 80", "number: 0")).expect("write");
    let second = store.reload(dir.path());
    assert_eq!(second, first);
    assert_eq!(store.errors().len(), 1);
    assert!(store.errors()[0].file.ends_with("a.yaml"));
    assert_eq!(store.errors()[0].field, "spec.ports[0].number");

    // Delete b.yml: its objects go.
    std::fs::remove_file(&b).expect("rm");
    let third = store.reload(dir.path());
    assert_eq!(third.len(), 6);
}

#[test]
fn later_duplicates_replace_earlier_ones() {
    let text = "kind: WorkloadEntry\nmetadata: {name: w}\nspec: {address: 198.18.0.1}\n---\nkind: WorkloadEntry\nmetadata: {name: w}\nspec: {address: 198.18.0.2}\n";
    let c = Config::from_objects(parse_file("f", text).expect("valid"));
    assert_eq!(c.workload_entries.len(), 1);
    assert_eq!(c.workload_entries[0].spec.address, "198.18.0.2");
    assert_eq!(c.workload_entries[0].meta.namespace, "default");
}

const KUBE_LIST: &str = include_str!("../../tests/data/kube/services-list.yaml");
const KUBE_MULTI: &str = include_str!("../../tests/data/kube/services-multi.yaml");

#[test]
fn kubectl_list_and_multi_document_kubernetes_kinds_parse_beside_istio_kinds() {
    let mut objs = parse_file("list.yaml", KUBE_LIST).expect("the List is valid");
    objs.extend(parse_file("multi.yaml", KUBE_MULTI).expect("the documents are valid"));
    let c = Config::from_objects(objs);
    let names: Vec<(&str, &str)> = c
        .services
        .iter()
        .map(|s| (s.meta.namespace.as_str(), s.meta.name.as_str()))
        .collect();
    assert_eq!(
        names,
        vec![
            ("ns1", "db"),
            ("ns1", "legacy"),
            ("ns1", "productpage"),
            ("ns2", "example")
        ]
    );
    let pp = &c.services[2].spec;
    assert_eq!(pp.cluster_ips, vec!["9.9.9.9"]);
    assert!(!pp.headless);
    assert_eq!(pp.ports[0].name, "http");
    assert_eq!(
        pp.ports[0].target_port,
        Some(kube::TargetPort::Number(9080))
    );
    assert_eq!(pp.selector.as_ref().unwrap()["app"], "productpage");
    assert!(c.services[0].spec.headless, "clusterIP: None");
    assert!(c.services[0].spec.cluster_ips.is_empty());
    let ex = &c.services[3].spec;
    assert_eq!(ex.service_type, "ClusterIP", "the default type");
    assert_eq!(ex.ports[0].app_protocol.as_deref(), Some("http"));
    assert_eq!(
        ex.ports[0].target_port,
        Some(kube::TargetPort::Name("http-web".into()))
    );

    let slice = &c.endpoint_slices[0];
    assert_eq!(slice.spec.service_name, "productpage");
    assert_eq!(slice.spec.address_type, "IPv4");
    assert_eq!(slice.spec.endpoints[0].addresses, vec!["10.1.0.5"]);
    assert!(slice.spec.endpoints[0].ready);
    assert_eq!(
        slice.spec.endpoints[0].pod,
        Some(("ns1".into(), "productpage-v1-abc12".into()))
    );
    assert_eq!(
        slice.spec.ports,
        vec![kube::SlicePort {
            name: "http".into(),
            port: 9080
        }]
    );

    let legacy = &c.endpoints[0].spec;
    assert_eq!(legacy.len(), 1, "one list per subset");
    assert_eq!(legacy[0].service_name, "legacy");
    let ready: Vec<(&str, bool)> = legacy[0]
        .endpoints
        .iter()
        .map(|e| (e.addresses[0].as_str(), e.ready))
        .collect();
    assert_eq!(ready, vec![("10.1.0.30", true), ("10.1.0.31", false)]);

    fn pod<'a>(c: &'a Config, name: &str) -> &'a kube::Pod {
        &c.pods.iter().find(|p| p.meta.name == name).unwrap().spec
    }
    let pod = |name: &str| pod(&c, name).clone();
    let ex1 = pod("example-1");
    assert_eq!(ex1.ips, vec!["10.2.0.7"]);
    assert_eq!(ex1.service_account, "example");
    assert_eq!(ex1.container_ports, vec![("http-web".to_string(), 8080)]);
    assert!(ex1.ready);
    assert_eq!(
        pod("productpage-v1-abc12").ips,
        vec!["10.1.0.5"],
        "podIP alone"
    );
    assert!(pod("db-0").ready, "no conditions: written by hand, ready");
    assert!(!pod("db-1").ready, "Ready False");
    assert_eq!(
        (
            pod("db-0").hostname.as_str(),
            pod("db-0").subdomain.as_str()
        ),
        ("db-0", "db")
    );
    assert_eq!(
        pod("example-1").hostname,
        "example-1",
        "the pod name by default"
    );
    assert_eq!(c.namespaces[0].meta.name, "ns2");
    assert_eq!(c.namespaces[0].meta.labels["istio-injection"], "enabled");
    assert_eq!(c.service_entries.len(), 1, "Istio kinds in the same file");
}

#[test]
fn bad_kubernetes_documents_name_the_document_and_the_field() {
    let cases: &[(&str, usize, &str, &str)] = &[
        (
            "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: 0}]}\n",
            0,
            "spec.ports[0].port",
            "is not a port",
        ),
        (
            "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: x}]}\n",
            0,
            "spec.ports[0].port",
            "invalid type",
        ),
        (
            "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.0.0.300}\n",
            0,
            "spec.clusterIP",
            "is not an IP address",
        ),
        (
            "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: 1}, {port: 2}]}\n",
            0,
            "spec.ports[1].name",
            "distinct names",
        ),
        (
            "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {type: Weird}\n",
            0,
            "spec.type",
            "is not ClusterIP",
        ),
        (
            "apiVersion: v2\nkind: Service\nmetadata: {name: a}\nspec: {}\n",
            0,
            "apiVersion",
            "is not \"v1\"",
        ),
        (
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: a}\naddressType: IPv4\n",
            0,
            "metadata.labels.kubernetes.io/service-name",
            "missing",
        ),
        (
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: a, labels: {kubernetes.io/service-name: a}}\naddressType: IPv4\nendpoints: [{addresses: [fd00::1]}]\n",
            0,
            "endpoints[0].addresses[0]",
            "is not of addressType IPv4",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nstatus: {podIP: nope}\n",
            0,
            "status.podIPs[0].ip",
            "is not an IP address",
        ),
        (
            "apiVersion: v1\nkind: Endpoints\nmetadata: {name: e}\nsubsets: [{addresses: [{ip: x}]}]\n",
            0,
            "subsets[0].addresses[0].ip",
            "is not an IP address",
        ),
        (
            "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Namespace\n  metadata: {name: ok}\n- apiVersion: v1\n  kind: Service\n  metadata: {name: bad}\n  spec: {ports: [{port: 70000}]}\n",
            0,
            "items[1].spec.ports[0].port",
            "70000 is not a port",
        ),
        (
            "apiVersion: v1\nkind: List\nitems: {}\n",
            0,
            "items",
            "not a list",
        ),
        (
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: ok}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: Bad_Name}\nspec: {}\n",
            1,
            "metadata.name",
            "DNS-1123",
        ),
    ];
    for (yaml, doc, field, reason) in cases {
        let errs = parse_file("k.yaml", yaml).expect_err(yaml);
        assert_eq!(errs.len(), 1, "{yaml}: {errs:?}");
        let e = &errs[0];
        assert_eq!((e.doc, e.field.as_str()), (*doc, *field), "{yaml}: {e}");
        assert!(e.reason.contains(reason), "{yaml}: {e}");
        assert!(
            e.to_string()
                .starts_with(&format!("k.yaml: document {doc}: {field}: "))
        );
    }
}

#[test]
fn a_bad_kubernetes_file_keeps_its_last_good_contents_and_other_files_load() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("list.yaml"), KUBE_LIST).unwrap();
    std::fs::write(dir.path().join("multi.yaml"), KUBE_MULTI).unwrap();
    let mut store = Store::default();
    let c = store.reload(dir.path());
    assert!(store.errors().is_empty(), "{:?}", store.errors());
    assert_eq!(c.services.len(), 4);
    std::fs::write(
        dir.path().join("list.yaml"),
        KUBE_LIST.replace(
            "port: 9080, protocol: TCP, targetPort",
            "port: -1, protocol: TCP, targetPort",
        ),
    )
    .unwrap();
    let c = store.reload(dir.path());
    assert_eq!(store.errors().len(), 1);
    assert!(
        store.errors()[0]
            .field
            .starts_with("items[0].spec.ports[0].port"),
        "{}",
        store.errors()[0]
    );
    assert_eq!(c.services.len(), 4, "the file's last good objects stay");
    assert_eq!(c.pods.len(), 4, "the other file loads");
}

/// A 1 MB YAML alias bomb beside a good file: the bomb is refused with an error naming it,
/// nothing of it is built, and the good file's config is served.
#[test]
fn an_alias_bomb_is_refused_per_file_and_the_rest_is_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("good.yaml"), GOOD).expect("write");
    // One anchor of 1,000 items referenced 5,000 times: within the YAML parser's own limit on
    // alias jumps (100 per event), 5 million nodes once expanded.
    let mut bomb = format!("a: &a [{}]\n", vec!["x"; 1000].join(","));
    bomb.push_str(&format!("b: [{}]\n", vec!["*a"; 5000].join(",")));
    // Padded to 1 MB, so the budget (the file's own size) is at its largest.
    while bomb.len() < 1 << 20 {
        bomb.push_str("# padding padding padding padding padding padding padding padding\n");
    }
    std::fs::write(dir.path().join("bomb.yaml"), &bomb).expect("write");
    let mut store = Store::default();
    let config = store.reload(dir.path());
    let good = Config::from_objects(parse_file("good.yaml", GOOD).expect("valid"));
    assert_eq!(config, good, "the good file is served");
    assert_eq!(store.errors().len(), 1, "{:?}", store.errors());
    let e = &store.errors()[0];
    assert!(
        e.file.ends_with("bomb.yaml") && e.reason.contains("aliases"),
        "{e:?}"
    );
}
