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
        Some(kinds::TlsMode::IstioMutual)
    );
    assert_eq!(
        config.peer_authentications[0]
            .spec
            .mtls
            .as_ref()
            .map(|m| m.mode),
        Some(kinds::MtlsMode::Strict)
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

#[test]
fn durations_parse_like_istio() {
    assert_eq!(
        parse_duration("1.5s"),
        Ok(std::time::Duration::from_millis(1500))
    );
    assert_eq!(
        parse_duration("250ms"),
        Ok(std::time::Duration::from_millis(250))
    );
    assert_eq!(
        parse_duration("1m30s"),
        Ok(std::time::Duration::from_secs(90))
    );
    assert_eq!(
        parse_duration("2h"),
        Ok(std::time::Duration::from_secs(7200))
    );
    assert!(parse_duration("10").is_err());
    assert!(parse_duration("5 parsecs").is_err());
    assert!(parse_duration("").is_err());
    // The one table every crate's duration settings follow.
    for (text, want) in proto::go::DURATION_CASES {
        let got = parse_duration(text).ok().map(|d| d.as_nanos() as u64);
        assert_eq!(got, *want, "{text:?}");
    }
    let e = parse_duration("10").unwrap_err();
    assert!(e.contains("missing unit"), "{e}");
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
