use super::*;
use crate::config::{Inputs, ProxyFlags};
use crate::platform::Platform;
use serde_json::json;
use std::collections::HashMap;

mod platform;

/// What binding gave: the status port, no identity sockets found.
fn status_only(status: u16) -> Bound {
    Bound {
        status,
        ..Bound::default()
    }
}

fn config(dir: &Path, pairs: &[(&str, &str)]) -> Config {
    let env: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::load(Inputs {
        node_type: NodeType::Sidecar,
        flags: ProxyFlags {
            domain: "ns1.svc.cluster.local".into(),
            ..ProxyFlags::default()
        },
        env: &env,
        base_dir: dir.to_path_buf(),
        interface_ips: vec![],
        is_root: false,
        cgroup_memory_limit: None,
    })
    .unwrap()
}

/// Istio's CredentialSocketExists / ServeOnlyFiles keys, from who serves the workload sockets
/// as settled at bind (`identity::tests::a_live_workload_socket_is_an_external_server`).
#[test]
fn workload_socket_keys() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), &[]);
    let mut sockets = Sockets::default();
    let node = metadata::node(&c, sockets, &Platform::none()).unwrap();
    assert_eq!(node.metadata["WORKLOAD_IDENTITY_SOCKET_FILE"], "socket");
    assert!(!node.metadata.contains_key("credential"));
    assert!(!node.metadata.contains_key("file-credential"));

    c.workload_socket.file = "spire.sock".into();
    sockets.external = true;
    let node = metadata::node(&c, sockets, &Platform::none()).unwrap();
    assert_eq!(node.metadata["file-credential"], "true");
    assert_eq!(node.metadata["WORKLOAD_IDENTITY_SOCKET_FILE"], "spire.sock");
    assert!(!node.metadata.contains_key("credential"));

    sockets.credential = true;
    let node = metadata::node(&c, sockets, &Platform::none()).unwrap();
    assert_eq!(node.metadata["credential"], "true");
    assert_eq!(node.metadata["file-credential"], "true");
}

/// Writes one downward-API pod file (`labels`, `annotations`) under `<dir>/etc/istio/pod`.
fn write_pod_info(dir: &Path, name: &str, text: &str) {
    let pod = dir.join("etc/istio/pod");
    std::fs::create_dir_all(&pod).unwrap();
    std::fs::write(pod.join(name), text).unwrap();
}

fn patterns(c: &Config) -> Vec<String> {
    render(
        c,
        status_only(15020),
        &Platform::none(),
    )
    .unwrap()["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let (kind, v) = p.as_object().unwrap().iter().next().unwrap();
            let v = if kind == "safe_regex" { &v["regex"] } else { v };
            format!("{kind}:{}", v.as_str().unwrap())
        })
        .collect()
}

const REQUIRED_PREFIXES: [&str; 5] = [
    "prefix:cluster_manager",
    "prefix:listener_manager",
    "prefix:server",
    "prefix:cluster.xds-grpc",
    "prefix:wasm",
];
const REQUIRED_SUFFIXES: [&str; 4] = [
    "suffix:rbac.allowed",
    "suffix:rbac.denied",
    "suffix:shadow_allowed",
    "suffix:shadow_denied",
];

/// Istio's `stats_matcher`: ProxyConfig's `proxyStatsMatcher` lists go before the required
/// entries of each kind, `{pod_ip}` is expanded per instance IP, and a pod annotation
/// replaces the matching ProxyConfig list.
#[test]
fn proxy_stats_matcher_extends_the_inclusion_list() {
    let dir = tempfile::tempdir().unwrap();
    let base = [
        ("POD_NAME", "p"),
        ("POD_NAMESPACE", "ns1"),
        ("INSTANCE_IP", "198.18.0.2"),
    ];
    let mut expected: Vec<String> = vec!["prefix:reporter=".into()];
    expected.extend(REQUIRED_PREFIXES.iter().map(|s| s.to_string()));
    expected.extend(REQUIRED_SUFFIXES.iter().map(|s| s.to_string()));
    expected.push(r"safe_regex:vhost\..*\.route\..*".into());
    expected.extend(["prefix:component".into(), "prefix:istio".into()]);
    assert_eq!(patterns(&config(dir.path(), &base)), expected, "defaults");

    let pc = r#"{"proxyStatsMatcher":{"inclusionPrefixes":["upstream_cx","http.{pod_ip}_"],"inclusionSuffixes":["upstream_rq_timeout"],"inclusionRegexps":[".*outlier_detection.*"]}}"#;
    let mut env = base.to_vec();
    env.push(("PROXY_CONFIG", pc));
    let mut expected: Vec<String> = [
        "prefix:reporter=",
        "prefix:upstream_cx",
        "prefix:http.198.18.0.2_",
    ]
    .map(String::from)
    .to_vec();
    expected.extend(REQUIRED_PREFIXES.iter().map(|s| s.to_string()));
    expected.push("suffix:upstream_rq_timeout".into());
    expected.extend(REQUIRED_SUFFIXES.iter().map(|s| s.to_string()));
    expected.push("safe_regex:.*outlier_detection.*".into());
    expected.push(r"safe_regex:vhost\..*\.route\..*".into());
    expected.extend(["prefix:component".into(), "prefix:istio".into()]);
    assert_eq!(patterns(&config(dir.path(), &env)), expected, "ProxyConfig");

    // The annotation replaces ProxyConfig's prefixes (a stray comma adds nothing); the
    // suffixes and regexps still come from ProxyConfig.
    write_pod_info(
        dir.path(),
        "annotations",
        "sidecar.istio.io/statsInclusionPrefixes=\"a.,,b.\"\n",
    );
    let got = patterns(&config(dir.path(), &env));
    assert_eq!(
        got[..4],
        [
            "prefix:reporter=",
            "prefix:a.",
            "prefix:b.",
            "prefix:cluster_manager"
        ]
    );
    assert!(
        got.contains(&"suffix:upstream_rq_timeout".to_string()),
        "{got:?}"
    );
    assert!(!got.iter().any(|p| p.contains("upstream_cx")), "{got:?}");
}

#[test]
fn bootstrap_has_istio_shape() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(
        dir.path(),
        &[
            ("POD_NAME", "p"),
            ("POD_NAMESPACE", "ns1"),
            ("INSTANCE_IP", "198.18.0.2"),
            ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
            ("ISTIO_METAJSON_LABELS", r#"{"app":"web"}"#),
            ("SERVICE_ACCOUNT", "sa"),
        ],
    );
    let b = render(&c, status_only(15020), &Platform::none()).unwrap();
    assert_eq!(
        b["node"]["id"],
        "sidecar~198.18.0.2~p.ns1~ns1.svc.cluster.local"
    );
    // ISTIO_METAJSON_LABELS are the node's labels, so `app` names the cluster (Istio's
    // `running` golden: `test.test`).
    assert_eq!(b["node"]["cluster"], "web.ns1");
    let meta = &b["node"]["metadata"];
    assert_eq!(meta["CLUSTER_ID"], "Kubernetes");
    assert_eq!(meta["LABELS"]["app"], "web");
    assert_eq!(meta["INSTANCE_IPS"], "198.18.0.2");
    assert_eq!(meta["ENVOY_STATUS_PORT"], 15021);
    assert_eq!(meta["PILOT_SAN"][0], "istiod.istio-system.svc");
    assert_eq!(
        b["dynamic_resources"]["ads_config"]["api_type"],
        "DELTA_GRPC"
    );
    let clusters = b["static_resources"]["clusters"].as_array().unwrap();
    let names: Vec<&str> = clusters
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["prometheus_stats", "agent", "sds-grpc", "xds-grpc"]);
    assert_eq!(
        clusters[3]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["pipe"]
            ["path"],
        "./etc/istio/proxy/XDS"
    );
    let listeners = b["static_resources"]["listeners"].as_array().unwrap();
    assert_eq!(listeners[0]["name"], "0.0.0.0_15090");
    assert_eq!(listeners[1]["name"], "0.0.0.0_15021");
    assert_eq!(b["admin"]["address"]["socket_address"]["port_value"], 15000);

    let sotw = config(dir.path(), &[("ISTIO_DELTA_XDS", "false")]);
    assert_eq!(
        render(&sotw, status_only(1), &Platform::none()).unwrap()["dynamic_resources"]["ads_config"]
            ["api_type"],
        "GRPC"
    );
}

/// Istio warns about an `ISTIO_METAJSON_*` that is not a JSON object and renders without it;
/// the agent must not refuse to start.
#[test]
fn bad_metajson_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(
        dir.path(),
        &[
            ("ISTIO_METAJSON_FOO", "[1]"),
            ("ISTIO_METAJSON_BAR", "{not json"),
            ("ISTIO_METAJSON_GOOD", r#"{"k":"v"}"#),
        ],
    );
    let b = render(&c, status_only(1), &Platform::none()).expect("renders");
    let meta = &b["node"]["metadata"];
    assert_eq!(meta["k"], "v");
    assert!(
        meta.get("FOO").is_none() && meta.get("BAR").is_none(),
        "{meta}"
    );
}

#[test]
fn template_and_custom_config() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("t.json"),
        r#"{"id":"{{ .nodeID }}","p":{{ .config.StatusPort }},"x":"{{ .unknown }}"}"#,
    )
    .unwrap();
    let c = config(
        dir.path(),
        &[("ISTIO_BOOTSTRAP", "t.json"), ("POD_NAMESPACE", "n")],
    );
    let w = write(&c, status_only(123), &Platform::none(), None).unwrap();
    assert!(w.generated);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&w.path).unwrap()).unwrap();
    assert_eq!(v["p"], 123);
    // Go's default for a missing key (Istio sets no `missingkey` option).
    assert_eq!(v["x"], "<no value>");
    assert!(v["id"].as_str().unwrap().starts_with("sidecar~"));

    let c = config(
        dir.path(),
        &[("PROXY_CONFIG", "customConfigFile: /x/custom.json")],
    );
    let w = write(&c, status_only(1), &Platform::none(), None).unwrap();
    assert_eq!(w.path, PathBuf::from("/x/custom.json"));
    assert!(!w.generated);
}

/// `PROXY_LIFECYCLE_LOCKDOWN`: the built-in bootstrap and a rendered template alike put Envoy's
/// admin, and the `prometheus_stats` cluster behind 15090, on the 0600 socket in the proxy's
/// directory; no TCP admin is left.
#[test]
fn lockdown_moves_admin_to_the_proxys_socket() {
    let dir = tempfile::tempdir().unwrap();
    let pipe = json!({ "pipe": { "path": "./etc/istio/proxy/admin.sock", "mode": 0o600 } });
    let check = |v: &Value| {
        assert_eq!(v["admin"]["address"], pipe);
        let prom = v["static_resources"]["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "prometheus_stats")
            .unwrap();
        assert_eq!(
            prom["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"],
            pipe
        );
        assert!(
            !v.to_string().contains(r#""port_value":15000"#),
            "TCP admin left: {v}"
        );
    };
    let c = config(dir.path(), &[("PROXY_LIFECYCLE_LOCKDOWN", "true")]);
    let w = write(&c, status_only(15020), &Platform::none(), None).unwrap();
    check(&serde_json::from_str(&std::fs::read_to_string(&w.path).unwrap()).unwrap());

    // A YAML template with Istio's admin and cluster shape.
    std::fs::write(
        dir.path().join("t.yaml"),
        "admin:\n  address: {socket_address: {address: 127.0.0.1, port_value: {{ .config.ProxyAdminPort }}}}\n\
         static_resources:\n  clusters:\n  - name: prometheus_stats\n    load_assignment:\n      \
         endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 15000}}}}]}]\n",
    )
    .unwrap();
    let c = config(
        dir.path(),
        &[
            ("ISTIO_BOOTSTRAP", "t.yaml"),
            ("PROXY_LIFECYCLE_LOCKDOWN", "true"),
        ],
    );
    let w = write(&c, status_only(15020), &Platform::none(), None).unwrap();
    assert!(w.path.ends_with("envoy-rev.json"), "{}", w.path.display());
    check(&serde_json::from_str(&std::fs::read_to_string(&w.path).unwrap()).unwrap());

    // A template without an admin section cannot be locked down: an error, not an open admin.
    std::fs::write(dir.path().join("t.json"), r#"{"node":{}}"#).unwrap();
    let c = config(
        dir.path(),
        &[
            ("ISTIO_BOOTSTRAP", "t.json"),
            ("PROXY_LIFECYCLE_LOCKDOWN", "true"),
        ],
    );
    let e = write(&c, status_only(15020), &Platform::none(), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("PROXY_LIFECYCLE_LOCKDOWN") && e.contains("admin"),
        "{e}"
    );
}

/// The structured data model: nested `config`, Istio's JSON-text keys, lists and the
/// keys that are absent unless set.
#[test]
fn template_data_has_istio_keys() {
    let dir = tempfile::tempdir().unwrap();
    write_pod_info(
        dir.path(),
        "labels",
        "topology.istio.io/locality=\"us-east1.us-east1-b.rack1\"\n",
    );
    let c = config(
        dir.path(),
        &[
            ("POD_NAME", "p"),
            ("POD_NAMESPACE", "ns1"),
            ("INSTANCE_IP", "198.18.0.2"),
            ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
        ],
    );
    let d = template_data(&c, status_only(15020), &Platform::none()).unwrap();
    assert_eq!(d["nodeType"], "sidecar");
    assert_eq!(
        d["nodeID"],
        "sidecar~198.18.0.2~p.ns1~ns1.svc.cluster.local"
    );
    assert_eq!(d["cluster"], "istio-proxy.ns1");
    assert_eq!(
        (&d["region"], &d["zone"], &d["sub_zone"]),
        (&json!("us-east1"), &json!("us-east1-b"), &json!("rack1"))
    );
    let meta: Value = serde_json::from_str(d["meta_json_str"].as_str().unwrap()).unwrap();
    assert_eq!(meta["CLUSTER_ID"], "Kubernetes");
    let flags: Value = serde_json::from_str(d["runtime_flags"].as_str().unwrap()).unwrap();
    assert_eq!(flags["re2.max_program_size.error_level"], "32768");
    assert_eq!(d["config"]["ProxyAdminPort"], 15000);
    assert_eq!(d["config"]["StatusPort"], 15020);
    assert_eq!(d["config"]["ConfigPath"], "./etc/istio/proxy");
    assert_eq!(
        d["config"]["DiscoveryAddress"],
        "istiod.istio-system.svc:15012"
    );
    assert_eq!(d["discovery_host"], "istiod.istio-system.svc");
    let grpc: Value = serde_json::from_str(d["pilot_grpc_address"].as_str().unwrap()).unwrap();
    assert_eq!(
        grpc,
        json!({"address": "istiod.istio-system.svc", "port_value": 15012})
    );
    assert_eq!(d["pilot_SAN"], json!(["istiod.istio-system.svc"]));
    assert_eq!(d["xds_type"], "DELTA_GRPC");
    assert_eq!(
        (&d["localhost"], &d["wildcard"], &d["dns_lookup_family"]),
        (&json!("127.0.0.1"), &json!("0.0.0.0"), &json!("V4_ONLY"))
    );
    assert_eq!(d["envoy_status_port"], 15021);
    assert_eq!(d["envoy_prometheus_port"], 15090);
    assert_eq!(d["global_downstream_max_connections"], i32::MAX);
    assert_eq!(d["workload_identity_socket_file"], "socket");
    assert_eq!(d["inclusionPrefix"][0], "cluster_manager");
    assert_eq!(d["inclusionSuffix"][0], "rbac.allowed");
    assert_eq!(d["inclusionRegexps"], json!([r"vhost\..*\.route\..*"]));
    for absent in [
        "outlier_log_path",
        "sts",
        "log_json",
        "additional_localhost",
    ] {
        assert!(d.get(absent).is_none(), "{absent}");
    }
}

/// A realistic Istio-style template (if/else, range, toJSON, nested `.config`) renders to
/// JSON that carries the data model (real Envoy validates it in tests/tests/agent.rs).
#[test]
fn istio_style_template_renders_json() {
    let text = include_str!("../../testdata/istio_style_bootstrap_tmpl.json");
    let dir = tempfile::tempdir().unwrap();
    let pc = r#"{"proxyStatsMatcher":{"inclusionPrefixes":["upstream_cx"]}}"#;
    let c = config(
        dir.path(),
        &[
            ("POD_NAME", "p"),
            ("POD_NAMESPACE", "ns1"),
            ("INSTANCE_IP", "198.18.0.2"),
            ("PROXY_CONFIG", pc),
        ],
    );
    let data = template_data(&c, status_only(15020), &Platform::none()).unwrap();
    let out = template::render(text, &data).unwrap();
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}:\n{out}"));
    assert_eq!(v["node"]["id"], data["nodeID"]);
    assert_eq!(v["node"]["locality"], json!({}));
    assert_eq!(v["admin"]["address"]["socket_address"]["port_value"], 15000);
    assert_eq!(
        v["layered_runtime"]["layers"][0]["static_layer"]["re2.max_program_size.error_level"],
        "32768"
    );
    let patterns = v["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"]
        .as_array()
        .unwrap();
    assert_eq!(patterns[1], json!({"prefix": "upstream_cx"}));
    assert!(patterns.contains(&json!({"safe_regex": {"regex": r"vhost\..*\.route\..*"}})));
    let clusters = v["static_resources"]["clusters"].as_array().unwrap();
    assert_eq!(
        clusters[4]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
            ["port_value"],
        15012
    );
    assert_eq!(
        v["static_resources"]["listeners"][1]["name"],
        "0.0.0.0_15021"
    );
    assert!(v.get("cluster_manager").is_none());
    assert!(v["application_log_config"]["log_format"]["text_format"].is_string());
}

#[test]
fn grpc_bootstrap_written() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), &[("OUTPUT_CERTS", "./out")]);
    let p = write_grpc_bootstrap(&c, Sockets::default(), &Platform::none()).unwrap();
    let v: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    assert_eq!(v["node"]["metadata"]["GENERATOR"], "grpc");
    assert!(v["certificate_providers"]["default"].is_object());
}

/// `ISTIO_VERSION` is the targeted Istio release unless `ISTIO_META_ISTIO_VERSION` sets one;
/// without a namespace the cluster is plain `istio-proxy`.
#[test]
fn istio_version_and_cluster_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let b = render(&config(dir.path(), &[]), status_only(1), &Platform::none()).unwrap();
    assert_eq!(b["node"]["metadata"]["ISTIO_VERSION"], ISTIO_RELEASE);
    assert_eq!(b["node"]["cluster"], "istio-proxy");
    let c = config(dir.path(), &[("ISTIO_META_ISTIO_VERSION", "1.29.2")]);
    let b = render(&c, status_only(1), &Platform::none()).unwrap();
    assert_eq!(b["node"]["metadata"]["ISTIO_VERSION"], "1.29.2");
    // Istio's proxyv2 image sets ISTIO_META_ISTIO_PROXY_SHA; istioctl reads it back from the
    // node (`proxy-config`'s version line). Absent unless set, as in Istio.
    assert!(b["node"]["metadata"].get("ISTIO_PROXY_SHA").is_none());
    let sha = "istio-proxy:436f365a8007cd8a13a9f1321e7cce94bcc8883e";
    let c = config(dir.path(), &[("ISTIO_META_ISTIO_PROXY_SHA", sha)]);
    let b = render(&c, status_only(1), &Platform::none()).unwrap();
    assert_eq!(b["node"]["metadata"]["ISTIO_PROXY_SHA"], sha);
}

/// `METADATA_DISCOVERY` follows `ENABLE_HBONE` unless `PEER_METADATA_DISCOVERY` decides; the
/// extension and the `workload_discovery` prefix come with it, and never with SotW xDS.
#[test]
fn metadata_discovery_resolution() {
    let dir = tempfile::tempdir().unwrap();
    let on = |pairs: &[(&str, &str)]| {
        let b = render(
            &config(dir.path(), pairs),
            status_only(1),
            &Platform::none(),
        )
        .unwrap();
        let ext = b["bootstrap_extensions"][0]["name"] == "metadata_discovery";
        let prefix = b["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"][1]
            == json!({"prefix": "workload_discovery"});
        assert_eq!(ext, prefix, "{pairs:?}");
        (b["node"]["metadata"]["METADATA_DISCOVERY"].clone(), ext)
    };
    assert_eq!(on(&[]), (json!("false"), false));
    assert_eq!(
        on(&[("ISTIO_META_ENABLE_HBONE", "true")]),
        (json!("true"), true)
    );
    assert_eq!(
        on(&[
            ("ISTIO_META_ENABLE_HBONE", "true"),
            ("PEER_METADATA_DISCOVERY", "false")
        ]),
        (json!("false"), false)
    );
    assert_eq!(
        on(&[("PEER_METADATA_DISCOVERY", "true")]),
        (json!("true"), true)
    );
    assert_eq!(
        on(&[
            ("PEER_METADATA_DISCOVERY", "true"),
            ("ISTIO_DELTA_XDS", "false")
        ]),
        (json!("true"), false)
    );
}

/// Bad telemetry settings are errors naming the ProxyConfig field.
#[test]
fn bad_telemetry_settings_are_named() {
    let dir = tempfile::tempdir().unwrap();
    for (pc, field) in [
        (
            r#"{"tracing":{"zipkin":{"address":"nohost"}}}"#,
            "tracing.zipkin.address",
        ),
        (r#"{"statsdUdpAddress":"x:y"}"#, "statsdUdpAddress"),
        (
            r#"{"envoyMetricsService":{"address":"m:1","tlsSettings":{"mode":"SOMETIMES"}}}"#,
            "envoyMetricsService.tlsSettings.mode",
        ),
        (r#"{"tracing":{"stackdriver":{}}}"#, "tracing.stackdriver"),
        (r#"{"extraStatTags":"a"}"#, "extraStatTags"),
    ] {
        let c = config(dir.path(), &[("PROXY_CONFIG", pc)]);
        let err = render(&c, status_only(1), &Platform::none())
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{pc}: {err}");
    }
}

/// Runtime flags: the FIPS flag with `COMPLIANCE_POLICY=fips-140-2`, the fragment flag when
/// stripping is disabled, and ProxyConfig values converted (`"true"` a bool, `""` removes).
#[test]
fn runtime_flags_follow_policy_and_values() {
    let dir = tempfile::tempdir().unwrap();
    let pc = r#"{"runtimeValues":{"a":"true","b":"5000","re2.max_program_size.error_level":""}}"#;
    let c = config(
        dir.path(),
        &[
            ("COMPLIANCE_POLICY", "fips-140-2"),
            ("HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED", "false"),
            ("PROXY_CONFIG", pc),
        ],
    );
    let b = render(&c, status_only(1), &Platform::none()).unwrap();
    let layer = &b["layered_runtime"]["layers"][0]["static_layer"];
    assert_eq!(
        layer["envoy.reloadable_features.google_grpc_disable_tls_13"],
        true
    );
    assert_eq!(
        layer["envoy.reloadable_features.http_strip_fragment_from_path_unsafe_if_disabled"],
        "false"
    );
    assert_eq!((&layer["a"], &layer["b"]), (&json!(true), &json!("5000")));
    assert!(layer.get("re2.max_program_size.error_level").is_none());
}

/// Stats durations reach the bootstrap as protobuf JSON durations on both paths: a flush of
/// a minute or more, or under a second, is `60s` / `0.5s` (Istio's agent, release-1.31 included,
/// writes Go's `1m0s` / `500ms` into the template, which Envoy rejects), and the eviction interval keeps
/// its fraction (Istio cuts it to whole seconds, which can break "a multiple of the flush").
#[test]
fn stats_durations_are_protobuf_durations() {
    for (flush, eviction, want_flush, want_eviction) in [
        ("1m", "2m", "60s", "120s"),
        ("500ms", "1500ms", "0.5s", "1.5s"),
        ("10s", "20s", "10s", "20s"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        write_pod_info(
            dir.path(),
            "annotations",
            &format!(
                "sidecar.istio.io/statsFlushInterval=\"{flush}\"\nsidecar.istio.io/statsEvictionInterval=\"{eviction}\"\n"
            ),
        );
        let c = config(dir.path(), &[]);
        let d = template_data(&c, status_only(15020), &Platform::none()).unwrap();
        assert_eq!(d["stats_flush_interval"], want_flush, "{flush}");
        assert_eq!(d["stats_eviction_interval"], want_eviction, "{eviction}");
        let b = render(&c, status_only(15020), &Platform::none()).unwrap();
        assert_eq!(b["stats_flush_interval"], want_flush, "{flush}");
        assert_eq!(b["stats_eviction_interval"], want_eviction, "{eviction}");
    }
}
