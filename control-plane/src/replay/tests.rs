use super::*;
use prost::Message;
use proto::envoy::config::cluster::v3::Cluster;
use proto::envoy::config::listener::v3::Listener;

mod conformance {
    include!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/src/conformance.rs"
    ));
}

/// A recorded dump of `../shared/conformance/istio-configdumps` (these tests need them: the
/// loader has said where they were looked for).
fn corpus(file: &str) -> PathBuf {
    conformance::dir(env!("CARGO_MANIFEST_DIR"), "istio-configdumps")
        .expect("Istio's recorded config dumps")
        .join(file)
}

fn view(capture: bool) -> ProxyView {
    ProxyView {
        namespace: "demo".into(),
        labels: Default::default(),
        ips: vec!["127.0.0.1".into()],
        dns_capture: false,
        dns_auto_allocate: false,
        capture,
        grpc: false,
    }
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, text).expect("write");
    p
}

/// Every type URL anywhere in a JSON value (`@type`s and TypedStructs' `type_url`s).
fn type_urls(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                if (k == "@type" || k == "type_url")
                    && let Some(s) = x.as_str()
                {
                    out.push(s.to_string());
                }
                type_urls(x, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| type_urls(x, out)),
        _ => {}
    }
}

#[test]
fn every_recorded_dump_with_dynamic_resources_loads_as_recorded_and_stripped() {
    // (file, counts per type, removals with --strip-istio-extensions); counts as in the
    // corpus README.
    type Counts = &'static [(&'static str, usize)];
    let cases: [(&str, Counts, usize); 9] = [
        ("authz.yaml", &[("LDS", 27)], 94),
        ("proxyconfig.json", &[("CDS", 1), ("EDS", 1), ("LDS", 1)], 8),
        ("compare.json", &[("CDS", 1), ("LDS", 3), ("RDS", 1)], 3),
        (
            "compare-diff.json",
            &[("CDS", 1), ("LDS", 3), ("RDS", 1)],
            3,
        ),
        ("describe-http.json", &[("CDS", 1), ("RDS", 1)], 1),
        ("describe-tls.json", &[("RDS", 1)], 0),
        ("writer-endpoints.json", &[("EDS", 32)], 0),
        (
            "writer-routes-istio-gateway-http-route-prefix.json",
            &[("RDS", 1)],
            0,
        ),
        (
            "writer-routes-k8s-gateway-http-route-path-prefix.json",
            &[("RDS", 1)],
            0,
        ),
    ];
    for (file, counts, removed) in cases {
        let want: BTreeMap<&str, usize> = counts.iter().copied().collect();
        let recorded = Replay::load(&corpus(file), false).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(recorded.counts(), want, "{file}");
        assert!(recorded.removals.is_empty(), "{file}: nothing removed");
        let stripped = Replay::load(&corpus(file), true).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            stripped.counts(),
            want,
            "{file}: stripping removes no resource"
        );
        assert_eq!(stripped.removals.len(), removed, "{file}");
    }
}

#[test]
fn the_sidecar_dump_loses_exactly_its_istio_only_extensions() {
    let r = Replay::load(&corpus("authz.yaml"), true).expect("load");
    let mut by_type: BTreeMap<String, usize> = BTreeMap::new();
    for x in &r.removals {
        *by_type.entry(x.type_url.clone()).or_default() += 1;
    }
    let t = |s: &str| format!("type.googleapis.com/{s}");
    let null_vm = t(
        "envoy.extensions.filters.http.wasm.v3.Wasm (null-VM plugin envoy.wasm.metadata_exchange)",
    );
    let want: BTreeMap<String, usize> = [
        (t("stats.PluginConfig"), 45),
        (null_vm, 16),
        (
            t("istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig"),
            12,
        ),
        // 24 in the README: 8 direct, 16 as the configuration of the null-VM Wasm filters.
        (t("envoy.tcp.metadataexchange.config.MetadataExchange"), 8),
        (t("io.istio.network.authn.Config"), 8),
        (t("io.istio.http.connect_authority.Config"), 2),
        (t("istio.set_internal_dst_address.v1.Config"), 2),
        (t("io.istio.http.connect_baggage.Config"), 1),
    ]
    .into_iter()
    .collect();
    assert_eq!(by_type, want);
    let per_route = r
        .removals
        .iter()
        .find(|x| x.path.contains("typed_per_filter_config"))
        .expect("a per-route config removed");
    assert_eq!(per_route.resource, "listener connect_terminate");
    assert_eq!(per_route.name.as_deref(), Some("connect_authority"));
    assert!(
        per_route
            .path
            .ends_with("typed_per_filter_config.connect_authority"),
        "{per_route}"
    );
    let listener_filter = r
        .removals
        .iter()
        .find(|x| x.path.starts_with("listener_filters["))
        .expect("a listener filter removed");
    assert_eq!(listener_filter.name.as_deref(), Some("set_dst_address"));
}

#[test]
fn nothing_but_upstream_types_survives_stripping() {
    for file in [
        "authz.yaml",
        "proxyconfig.json",
        "compare.json",
        "describe-http.json",
    ] {
        let doc = dump::read(&corpus(file)).expect("read");
        let parsed = dump::parse(&corpus(file), &doc).expect("parse");
        for mut item in parsed.items {
            strip::strip(&mut item.json, &item.name);
            let mut urls = Vec::new();
            type_urls(&item.json, &mut urls);
            for u in urls {
                assert!(strip::is_upstream(&u), "{file} {}: {u} left", item.name);
            }
            assert!(
                !item.json.to_string().contains("envoy.wasm.runtime.null"),
                "{file} {}: a null-VM Wasm filter left",
                item.name
            );
        }
    }
}

#[test]
fn a_cluster_filter_is_stripped_and_the_cluster_still_decodes() {
    let r = Replay::load(&corpus("describe-http.json"), true).expect("load");
    assert_eq!(r.removals.len(), 1);
    let x = &r.removals[0];
    assert!(x.resource.starts_with("cluster "), "{x}");
    assert!(x.path.starts_with("filters["), "{x}");
    assert_eq!(
        x.type_url,
        "type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange"
    );
    let served = r.resources(&view(true), XdsType::Cds);
    let cluster = Cluster::decode(served[0].any.value.as_slice()).expect("a Cluster");
    assert!(cluster.filters.is_empty(), "{cluster:?}");
    assert_eq!(served[0].name, cluster.name);
}

#[test]
fn recorded_istio_types_are_encoded_so_istio_envoy_reads_them() {
    // As recorded, `istio.stats` is sent with Istio's own message, field 6 set.
    let r = Replay::load(&corpus("authz.yaml"), false).expect("load");
    let served = r.resources(&view(true), XdsType::Lds);
    let found = served.iter().any(|res| {
        let l = Listener::decode(res.any.value.as_slice()).expect("a Listener");
        l.filter_chains.iter().flat_map(|c| &c.filters).any(|f| {
            use proto::envoy::config::listener::v3::filter::ConfigType;
            matches!(&f.config_type, Some(ConfigType::TypedConfig(a))
                if a.type_url == "type.googleapis.com/stats.PluginConfig" && a.value == [0x30, 0x01])
        })
    });
    assert!(
        found,
        "no istio.stats filter with disable_host_header_fallback"
    );
}

#[test]
fn proxies_without_capture_get_unbound_listeners() {
    let r = Replay::load(&corpus("authz.yaml"), true).expect("load");
    let decode = |capture: bool| -> Vec<Listener> {
        r.resources(&view(capture), XdsType::Lds)
            .iter()
            .map(|x| Listener::decode(x.any.value.as_slice()).expect("a Listener"))
            .collect()
    };
    let inbound = |ls: &[Listener]| {
        ls.iter()
            .find(|l| l.name == "virtualInbound")
            .expect("virtualInbound")
            .bind_to_port
    };
    assert_eq!(inbound(&decode(true)), None, "as recorded");
    assert_eq!(inbound(&decode(false)).map(|b| b.value), Some(false));
    // Internal listeners have no socket address and no bind_to_port.
    let unbound = decode(false);
    let internal = unbound
        .iter()
        .find(|l| l.name == "main_internal")
        .expect("main_internal");
    assert_eq!(internal.bind_to_port, None);
    // Sorted by name, as every resource list.
    let names = r.names(XdsType::Lds);
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
}

#[test]
fn dumps_without_dynamic_resources_are_refused_naming_their_sections() {
    for (file, sections) in [
        ("writer-bootstrap.json", "BootstrapConfigDump"),
        ("writer-secrets-istio.json", "SecretsConfigDump"),
        ("writer-secrets-spire.json", "SecretsConfigDump"),
        (
            "writer-ecds.json",
            "EcdsConfigDump, EcdsConfigDump, EcdsConfigDump",
        ),
        ("writer-routes-empty-gateway.json", "RoutesConfigDump"),
    ] {
        let err = Replay::load(&corpus(file), true).expect_err(file);
        let msg = err.to_string();
        assert!(matches!(err, Error::Empty { .. }), "{file}: {msg}");
        assert!(msg.contains(file), "{msg}");
        assert!(msg.contains(&format!("(sections: {sections})")), "{msg}");
    }
}

#[test]
fn bad_input_names_the_file_and_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("absent.json");
    let e = Replay::load(&missing, false).expect_err("absent");
    assert!(matches!(e, Error::Read { .. }), "{e}");
    assert!(e.to_string().contains("absent.json"), "{e}");

    let cases = [
        ("garbage.json", "{ not json: [", "not JSON"),
        ("list.json", "[1, 2]", "configs: missing"),
        (
            "configs.json",
            r#"{"configs": {}}"#,
            "configs: expected a list",
        ),
        (
            "notype.json",
            r#"{"configs": [{}]}"#,
            "configs[0].@type: missing",
        ),
        (
            "foreign.json",
            r#"{"configs": [{"@type": "type.googleapis.com/foo.Bar"}]}"#,
            "configs[0].@type: \"type.googleapis.com/foo.Bar\" is not a config dump section",
        ),
        (
            "noname.json",
            r#"{"configs": [{"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
                "dynamic_active_clusters": [{"cluster": {"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster"}}]}]}"#,
            "configs[0].dynamic_active_clusters[0].cluster.name: missing",
        ),
        (
            "wrongtype.json",
            r#"{"configs": [{"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
                "dynamic_active_clusters": [{"cluster": {"@type": "type.googleapis.com/envoy.config.listener.v3.Listener", "name": "a"}}]}]}"#,
            "configs[0].dynamic_active_clusters[0].cluster.@type",
        ),
        (
            "unknownfield.json",
            r#"{"configs": [{"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
                "dynamic_active_clusters": [{"cluster": {"name": "a", "connect_timeout": "1s", "bogus_field": 1}}]}]}"#,
            "bogus_field",
        ),
        (
            "unknowntype.json",
            r#"{"configs": [{"@type": "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
                "dynamic_listeners": [{"active_state": {"listener": {"name": "l",
                  "listener_filters": [{"name": "x", "typed_config": {"@type": "type.googleapis.com/acme.Filter"}}]}}}]}]}"#,
            "--strip-istio-extensions",
        ),
    ];
    for (name, text, want) in cases {
        let p = write(&dir, name, text);
        let e = Replay::load(&p, false).expect_err(name);
        let msg = e.to_string();
        assert!(msg.contains(name), "{name}: the file is named: {msg}");
        assert!(msg.contains(want), "{name}: {want:?} not in {msg}");
    }
    // The field path of a bad value inside a resource.
    let p = write(
        &dir,
        "badvalue.json",
        r#"{"configs": [{"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
            "dynamic_active_clusters": [{"cluster": {"name": "a", "connect_timeout": "soon"}}]}]}"#,
    );
    let msg = Replay::load(&p, false).expect_err("bad value").to_string();
    assert!(
        msg.contains("configs[0].dynamic_active_clusters[0].cluster")
            && msg.contains("connect_timeout"),
        "{msg}"
    );
    // Stripped, an unknown non-Envoy type is removed instead.
    let p = dir.path().join("unknowntype.json");
    let r = Replay::load(&p, true).expect("stripped");
    assert_eq!(r.removals.len(), 1);
    assert_eq!(r.removals[0].type_url, "type.googleapis.com/acme.Filter");
}

#[test]
fn stripping_reaches_transport_sockets_per_filter_configs_and_typed_structs() {
    let mut cluster = serde_json::json!({
        "name": "c",
        "transport_socket": {"name": "istio.tls", "typed_config": {
            "@type": "type.googleapis.com/xds.type.v3.TypedStruct",
            "type_url": "type.googleapis.com/io.istio.tls.Config", "value": {}}},
        "filters": [
            {"name": "istio.metadata_exchange", "typed_config": {
                "@type": "type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange",
                "protocol": "istio-peer-exchange"}},
            {"name": "envoy.filters.network.upstream.ok", "typed_config": {
                "@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
                "type_url": "type.googleapis.com/envoy.extensions.filters.x.v3.Y", "value": {}}}
        ],
        "metadata": {"typed_per_filter_config": {
            "istio.x": {"@type": "type.googleapis.com/io.istio.x.Config"},
            "envoy.y": {"@type": "type.googleapis.com/envoy.extensions.y.v3.Y"}
        }}
    });
    let removed = strip::strip(&mut cluster, "cluster c");
    let paths: Vec<String> = removed.iter().map(|r| r.to_string()).collect();
    assert_eq!(
        paths,
        [
            "cluster c filters[0] (istio.metadata_exchange): type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange",
            "cluster c metadata.typed_per_filter_config.istio.x (istio.x): type.googleapis.com/io.istio.x.Config",
            "cluster c transport_socket (istio.tls): type.googleapis.com/io.istio.tls.Config",
        ]
    );
    assert_eq!(cluster["filters"].as_array().map(Vec::len), Some(1));
    assert!(cluster.get("transport_socket").is_none());
    assert!(cluster["metadata"]["typed_per_filter_config"]["envoy.y"].is_object());
}

#[test]
fn upstream_packages_are_allowed_and_istio_ones_are_not() {
    for t in [
        "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
        "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
        "type.googleapis.com/google.protobuf.StringValue",
        "type.googleapis.com/xds.type.matcher.v3.IPMatcher",
        "envoy.type.matcher.v3.StringMatcher",
    ] {
        assert!(strip::is_upstream(t), "{t}");
    }
    for t in [
        "type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange",
        "type.googleapis.com/stats.PluginConfig",
        "type.googleapis.com/istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig",
        "type.googleapis.com/io.istio.http.peer_metadata.Config",
    ] {
        assert!(!strip::is_upstream(t), "{t}");
    }
}

#[test]
fn descriptors_match_envoy_types() {
    // A message envoy-types encodes decodes field for field through the vendored descriptors.
    use proto::envoy::config::core::v3::{Address, SocketAddress, address, socket_address};
    let listener = Listener {
        name: "l".into(),
        address: Some(Address {
            address: Some(address::Address::SocketAddress(SocketAddress {
                address: "127.0.0.1".into(),
                port_specifier: Some(socket_address::PortSpecifier::PortValue(15006)),
                ..Default::default()
            })),
        }),
        bind_to_port: Some(proto::google::protobuf::BoolValue { value: false }),
        ..Default::default()
    };
    let any = proto::pack(&listener);
    let json = serde_json::json!({
        "name": "l",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 15006}},
        "bind_to_port": false,
    });
    let ours = encode::encode(&any.type_url, &json).expect("encode");
    assert_eq!(ours, any);
}
