use super::*;
use std::time::Duration;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn load(dir: &Path, e: &HashMap<String, String>) -> Result<Config, Error> {
    Config::load(Inputs {
        node_type: NodeType::Sidecar,
        flags: ProxyFlags::default(),
        env: e,
        base_dir: dir.to_path_buf(),
        interface_ips: vec!["198.18.0.9".parse().unwrap()],
        is_root: false,
        cgroup_memory_limit: None,
    })
}

#[test]
fn injected_env_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let e = env(&[
        ("POD_NAME", "app-1"),
        ("POD_NAMESPACE", "ns1"),
        ("INSTANCE_IP", "198.18.0.2"),
        ("PROXY_CONFIG", "{}"),
        ("ISTIO_CPU_LIMIT", "2"),
        ("XDS_HEADER_X-Foo", "bar"),
    ]);
    let c = load(dir.path(), &e).unwrap();
    assert_eq!(
        c.node_id(),
        "sidecar~198.18.0.2~app-1.ns1~ns1.svc.cluster.local"
    );
    assert_eq!(c.node.ips.len(), 2);
    assert_eq!(c.concurrency(), 2);
    assert!(c.bootstrap.delta_xds);
    assert_eq!(
        c.upstream.metadata,
        vec![("X-Foo".to_string(), "bar".to_string())]
    );
    assert_eq!(c.xds_socket(), dir.path().join("etc/istio/proxy/XDS"));
    assert_eq!(
        c.workload_socket.configured,
        dir.path()
            .join("var/run/secrets/workload-spiffe-uds/socket")
    );
    assert_eq!(c.proxy.status_port, 15020);
}

#[test]
fn layering_order_mesh_env_annotation() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("etc/istio/config")).unwrap();
    std::fs::create_dir_all(dir.path().join("etc/istio/pod")).unwrap();
    std::fs::write(
        dir.path().join("etc/istio/config/mesh"),
        "defaultConfig:\n  discoveryAddress: mesh:1\n  drainDuration: 7s\n  statusPort: 15100\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("etc/istio/pod/annotations"),
        "proxy.istio.io/config=\"statusPort: 15300\\nconcurrency: 3\\n\"\nother=\"x\"\n",
    )
    .unwrap();
    let e = env(&[(
        "PROXY_CONFIG",
        r#"{"discoveryAddress":"env:2","statusPort":15200}"#,
    )]);
    let c = load(dir.path(), &e).unwrap();
    assert_eq!(c.proxy.discovery_address, "env:2");
    assert_eq!(c.proxy.drain_duration, Duration::from_secs(7));
    assert_eq!(c.proxy.status_port, 15300);
    assert_eq!(c.concurrency(), 3);
    assert_eq!(c.node.pod_annotations["other"], "x");
}

#[test]
fn invalid_values_name_variable_and_value() {
    let dir = tempfile::tempdir().unwrap();
    for (k, v, needle) in [
        ("ISTIO_DELTA_XDS", "maybe", "ISTIO_DELTA_XDS"),
        ("PROXY_CONFIG", "statusPort: abc", "statusPort"),
        ("PROXY_CONFIG", "{", "PROXY_CONFIG"),
        ("ENVOY_STATUS_PORT", "99999", "ENVOY_STATUS_PORT"),
        (
            "MINIMUM_DRAIN_DURATION",
            "5 parsecs",
            "MINIMUM_DRAIN_DURATION",
        ),
        ("ISTIO_KUBE_APP_PROBERS", "{bad", "ISTIO_KUBE_APP_PROBERS"),
        ("XDS_PROXY_RECONNECT", "sometimes", "XDS_PROXY_RECONNECT"),
        (
            "PROXY_LIFECYCLE_LOCKDOWN",
            "yes",
            "PROXY_LIFECYCLE_LOCKDOWN",
        ),
        ("DRAIN_FOLLOWS_APP", "sometimes", "DRAIN_FOLLOWS_APP"),
        (
            "XDS_PROXY_KEEPALIVE_INTERVAL",
            "1ms",
            "XDS_PROXY_KEEPALIVE_INTERVAL",
        ),
        (
            "PROXY_CONFIG",
            "readinessProbe: {exec: {}}",
            "readinessProbe",
        ),
        ("WASM_MODULE_EXPIRY", "soon", "WASM_MODULE_EXPIRY"),
        (
            "WASM_HTTP_REQUEST_MAX_RETRIES",
            "-1",
            "WASM_HTTP_REQUEST_MAX_RETRIES",
        ),
        (
            "BLOCKED_CIDRS_IN_WASM_FETCH",
            "10.0.0.0/8,10.1.2.3",
            "BLOCKED_CIDRS_IN_WASM_FETCH",
        ),
        (
            "ISTIO_WASM_MAX_BINARY_SIZE_BYTES",
            "0",
            "ISTIO_WASM_MAX_BINARY_SIZE_BYTES",
        ),
        ("WASM_CACHE_MAX_BYTES", "1G", "WASM_CACHE_MAX_BYTES"),
        ("WASM_CACHE_MAX_ENTRIES", "0", "WASM_CACHE_MAX_ENTRIES"),
        (
            "PROXY_CONFIG",
            r#"{"discoveryAddress":"a:15012,b:port"}"#,
            "discoveryAddress",
        ),
    ] {
        let strict = env(&[(k, v), (STRICT_ENV, "true")]);
        let err = load(dir.path(), &strict).unwrap_err().to_string();
        assert!(err.contains(needle), "{k}={v}: {err}");
    }
}

/// As Istio's `pkg/env`: a typed value that does not parse is warned about and its default
/// used; the variable is recorded (for `istio_agent_env_parse_errors_total`). Values that are
/// not a typed setting's (JSON, addresses, CIDRs, ProxyConfig) stay errors.
#[test]
fn unparsable_typed_values_fall_back_to_the_default_as_istio() {
    let dir = tempfile::tempdir().unwrap();
    let defaults = load(dir.path(), &env(&[])).unwrap();
    assert!(defaults.env_fallbacks.is_empty());
    for (k, v) in [
        ("ISTIO_DELTA_XDS", "maybe"),
        ("ENVOY_STATUS_PORT", "99999"),
        ("MINIMUM_DRAIN_DURATION", "5 parsecs"),
        ("XDS_PROXY_RECONNECT", "sometimes"),
        ("PROXY_LIFECYCLE_LOCKDOWN", "yes"),
        ("DRAIN_FOLLOWS_APP", "sometimes"),
        ("XDS_PROXY_KEEPALIVE_INTERVAL", "1ms"),
        ("WASM_MODULE_EXPIRY", "soon"),
        ("WASM_HTTP_REQUEST_MAX_RETRIES", "-1"),
        ("ISTIO_WASM_MAX_BINARY_SIZE_BYTES", "0"),
        ("SECRET_TTL", "a day"),
        ("SECRET_GRACE_PERIOD_RATIO", "1.5"),
        ("WORKLOAD_RSA_KEY_SIZE", "big"),
        ("ISTIO_CPU_LIMIT", "two"),
        ("PROXY_CONFIG_XDS_AGENT", "maybe"),
    ] {
        let c = load(dir.path(), &env(&[(k, v)]))
            .unwrap_or_else(|e| panic!("{k}={v} stopped the agent: {e}"));
        assert_eq!(c.env_fallbacks, [k], "{k}={v}");
        assert_eq!(
            serde_json::to_value(&c.envoy).unwrap(),
            serde_json::to_value(&defaults.envoy).unwrap(),
            "{k}={v}"
        );
        assert_eq!(
            serde_json::to_value(&c.upstream).unwrap(),
            serde_json::to_value(&defaults.upstream).unwrap(),
            "{k}={v}"
        );
        assert_eq!(
            serde_json::to_value(&c.identity).unwrap(),
            serde_json::to_value(&defaults.identity).unwrap(),
            "{k}={v}"
        );
        assert_eq!(
            serde_json::to_value(&c.bootstrap).unwrap(),
            serde_json::to_value(&defaults.bootstrap).unwrap(),
            "{k}={v}"
        );
        assert_eq!(c.concurrency(), defaults.concurrency(), "{k}={v}");
    }
    // Refused in both modes: no default would be right.
    for (k, v) in [
        ("ISTIO_KUBE_APP_PROBERS", "{bad"),
        ("BLOCKED_CIDRS_IN_WASM_FETCH", "10.0.0.0/8,10.1.2.3"),
        ("WORKLOAD_RSA_KEY_SIZE", "1024"),
        ("PROXY_CONFIG", "statusPort: abc"),
    ] {
        assert!(load(dir.path(), &env(&[(k, v)])).is_err(), "{k}={v}");
    }
    // The switch itself: a value that does not parse leaves strict mode off.
    let c = load(
        dir.path(),
        &env(&[(STRICT_ENV, "very"), ("ISTIO_DELTA_XDS", "maybe")]),
    )
    .unwrap();
    assert_eq!(c.env_fallbacks, [STRICT_ENV, "ISTIO_DELTA_XDS"]);
    // Two bad values: both recorded, in the order read.
    let c = load(
        dir.path(),
        &env(&[("SECRET_TTL", "x"), ("DRAIN_FOLLOWS_APP", "y")]),
    )
    .unwrap();
    assert_eq!(c.env_fallbacks.len(), 2);
    assert!(c.env_fallbacks.contains(&"SECRET_TTL".to_string()));
}

/// The metric counts each fallback under the agent's prefix.
#[test]
fn env_parse_errors_are_counted() {
    let mut root = prometheus_client::registry::Registry::default();
    let metrics = EnvMetrics::new(root.sub_registry_with_prefix("istio_agent"));
    metrics.record(&[
        "SECRET_TTL".into(),
        "SECRET_TTL".into(),
        "ISTIO_DELTA_XDS".into(),
    ]);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &root).unwrap();
    assert!(
        text.contains("istio_agent_env_parse_errors_total{variable=\"SECRET_TTL\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("istio_agent_env_parse_errors_total{variable=\"ISTIO_DELTA_XDS\"} 1"),
        "{text}"
    );
}

#[test]
fn xds_upstream_reconnect_and_keepalive() {
    let dir = tempfile::tempdir().unwrap();
    let c = load(dir.path(), &env(&[])).unwrap();
    assert!(c.upstream.reconnect);
    assert_eq!(c.upstream.keepalive, sds::DEFAULT_KEEPALIVE);
    let e = env(&[
        ("XDS_PROXY_RECONNECT", "false"),
        ("XDS_PROXY_KEEPALIVE_INTERVAL", "1s"),
    ]);
    let c = load(dir.path(), &e).unwrap();
    assert!(!c.upstream.reconnect);
    assert_eq!(
        c.upstream.keepalive,
        (Duration::from_secs(1), Duration::from_millis(500))
    );
}

/// Several xDS streams at once by default for proxyless gRPC (either marker of the grpc-agent
/// template), Istio's one stream at a time with Envoy; `XDS_PROXY_MULTI_STREAM` overrides both.
/// Wasm remote load: on by default with Istio's cache directory and `WASM_*` defaults; each
/// variable read; the switch turns it off.
#[test]
fn wasm_remote_load_settings() {
    let dir = tempfile::tempdir().unwrap();
    let c = load(dir.path(), &env(&[])).unwrap();
    let w = c.upstream.wasm.expect("on by default");
    assert_eq!(w.dir, dir.path().join("var/lib/istio/data"));
    assert_eq!(
        (
            w.module_expiry,
            w.purge_interval,
            w.http_timeout,
            w.http_max_retries
        ),
        (
            Duration::from_secs(86400),
            Duration::from_secs(3600),
            Duration::from_secs(15),
            5
        )
    );
    assert_eq!(w.max_binary_size, 256 << 20);
    assert!(
        w.plain_http_registries.is_empty(),
        "no plain HTTP unless asked"
    );
    assert_eq!((w.max_cache_bytes, w.max_cache_entries), (1 << 30, 64));
    let c = load(
        dir.path(),
        &env(&[
            ("WASM_MODULE_EXPIRY", "2h"),
            ("WASM_PURGE_INTERVAL", "10m"),
            ("WASM_HTTP_REQUEST_TIMEOUT", "3s"),
            ("WASM_HTTP_REQUEST_MAX_RETRIES", "2"),
            ("WASM_INSECURE_REGISTRIES", "a.io, b.io"),
            ("ISTIO_WASM_MAX_BINARY_SIZE_BYTES", "1024"),
            ("BLOCKED_CIDRS_IN_WASM_FETCH", "10.0.0.0/8, fd00::/8"),
            ("WASM_PLAIN_HTTP_REGISTRIES", "reg.local:5000"),
            ("WASM_CACHE_MAX_BYTES", "4096"),
            ("WASM_CACHE_MAX_ENTRIES", "3"),
        ]),
    )
    .unwrap();
    let w = c.upstream.wasm.unwrap();
    assert_eq!(w.module_expiry, Duration::from_secs(7200));
    assert_eq!(w.purge_interval, Duration::from_secs(600));
    assert_eq!(w.http_timeout, Duration::from_secs(3));
    assert_eq!(w.http_max_retries, 2);
    assert_eq!(w.insecure_registries, ["a.io", "b.io"]);
    assert_eq!(w.max_binary_size, 1024);
    assert_eq!(w.plain_http_registries, ["reg.local:5000"]);
    assert_eq!((w.max_cache_bytes, w.max_cache_entries), (4096, 3));
    assert_eq!(
        w.blocked_cidrs,
        [
            ("10.0.0.0".parse().unwrap(), 8),
            ("fd00::".parse().unwrap(), 8)
        ]
    );
    let off = env(&[("ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION", "false")]);
    assert!(load(dir.path(), &off).unwrap().upstream.wasm.is_none());
}

#[test]
fn multi_stream_defaults_to_proxyless_and_the_switch_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let multi =
        |pairs: &[(&str, &str)]| load(dir.path(), &env(pairs)).unwrap().upstream.multi_stream;
    assert!(!multi(&[]), "Envoy: Istio's one stream");
    assert!(multi(&[("DISABLE_ENVOY", "true")]));
    assert!(multi(&[("ISTIO_META_GENERATOR", "grpc")]));
    assert!(!multi(&[
        ("DISABLE_ENVOY", "true"),
        ("ISTIO_META_GENERATOR", "grpc"),
        ("XDS_PROXY_MULTI_STREAM", "false"),
    ]));
    assert!(multi(&[("XDS_PROXY_MULTI_STREAM", "true")]));
    let strict = env(&[("XDS_PROXY_MULTI_STREAM", "both"), (STRICT_ENV, "true")]);
    let err = load(dir.path(), &strict).unwrap_err().to_string();
    assert!(err.contains("XDS_PROXY_MULTI_STREAM"), "{err}");
}

#[test]
fn dns_capture_only_for_sidecars() {
    let dir = tempfile::tempdir().unwrap();
    let e = env(&[("ISTIO_META_DNS_CAPTURE", "true")]);
    assert!(load(dir.path(), &e).unwrap().dns.is_some());
    let c = Config::load(Inputs {
        node_type: NodeType::Router,
        flags: ProxyFlags::default(),
        env: &e,
        base_dir: dir.path().to_path_buf(),
        interface_ips: vec![],
        is_root: false,
        cgroup_memory_limit: None,
    })
    .unwrap();
    assert!(c.dns.is_none());
    // No INSTANCE_IP and no host address: the IP part is empty, as in Istio's node ID.
    assert_eq!(c.node_id(), "router~~.~.svc.cluster.local");
}

/// Proxyless gRPC pods (Istio's grpc-agent template) carry the mesh's proxyMetadata in
/// PROXY_CONFIG with ISTIO_META_DNS_CAPTURE=true and the env set to false: no DNS proxy, which
/// would hold readiness until an NDS table that only an Envoy's listener request brings.
#[test]
fn dns_capture_reads_the_environment_not_proxy_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let proxy_config = r#"{"proxyMetadata":{"ISTIO_META_DNS_CAPTURE":"true"}}"#;
    let e = env(&[
        ("PROXY_CONFIG", proxy_config),
        ("ISTIO_META_DNS_CAPTURE", "false"),
    ]);
    assert!(load(dir.path(), &e).unwrap().dns.is_none());
    let e = env(&[("PROXY_CONFIG", proxy_config)]);
    assert!(load(dir.path(), &e).unwrap().dns.is_none());
}

/// A host with no address outside loopback: Istio's agent puts 127.0.0.1 and ::1 after
/// INSTANCE_IP (found by the bootstrap differential suite).
#[test]
fn a_host_without_addresses_gives_the_loopbacks() {
    let dir = tempfile::tempdir().unwrap();
    let ips = private_ips(dir.path(), vec![]).unwrap();
    assert_eq!(
        ips,
        [
            "127.0.0.1".parse::<IpAddr>().unwrap(),
            "::1".parse().unwrap()
        ]
    );
}

#[test]
fn go_unquote_reads_downward_api_values() {
    assert_eq!(
        go_syntax::unquote(r#""a\"b\nc\u00e9""#).as_deref(),
        Some("a\"b\ncé")
    );
    assert_eq!(go_syntax::unquote("noquotes"), None);
    assert_eq!(go_syntax::unquote(r#""bad\q""#), None);
}

fn load_with(dir: &Path, e: &HashMap<String, String>, flags: ProxyFlags) -> Result<Config, Error> {
    Config::load(Inputs {
        node_type: NodeType::Sidecar,
        flags,
        env: e,
        base_dir: dir.to_path_buf(),
        interface_ips: vec![],
        is_root: false,
        cgroup_memory_limit: None,
    })
}

/// The seam the old code lost: `--domain` reaches the DNS proxy's config.
#[test]
fn domain_flag_reaches_dns_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let e = env(&[("ISTIO_META_DNS_CAPTURE", "true"), ("POD_NAMESPACE", "ns1")]);
    let c = load_with(dir.path(), &e, ProxyFlags::default()).unwrap();
    assert_eq!(c.dns.as_ref().unwrap().domain, "ns1.svc.cluster.local");
    let flags = ProxyFlags {
        domain: "ns1.svc.corp.example".into(),
        ..ProxyFlags::default()
    };
    let c = load_with(dir.path(), &e, flags).unwrap();
    let dns = c.dns.as_ref().unwrap();
    assert_eq!(dns.domain, "ns1.svc.corp.example");
    assert_eq!(dns.proxy_domain(), "svc.corp.example");
    assert_eq!(c.node.dns_domain, "ns1.svc.corp.example");
}

/// The CA address follows the discovery address when `CA_ADDR` is unset, keeping `ISTIOD_SAN`
/// (an explicit `CA_ADDR` is named by its host); the xDS upstream uses the same ServerName rule
/// (`localhost` is istiod's name).
#[test]
fn ca_and_xds_share_address_and_server_name_rules() {
    let dir = tempfile::tempdir().unwrap();
    let e = env(&[("PROXY_CONFIG", r#"{"discoveryAddress":"localhost:15012"}"#)]);
    let c = load(dir.path(), &e).unwrap();
    assert_eq!(c.identity.ca_addr, "localhost:15012");
    assert_eq!(c.identity.ca_server_name, "istiod.istio-system.svc");
    assert_eq!(c.upstream.server_name, "istiod.istio-system.svc");
    let e = env(&[
        (
            "PROXY_CONFIG",
            r#"{"discoveryAddress":"istiod.x.svc:15012"}"#,
        ),
        ("ISTIOD_SAN", "istiod.custom"),
        ("CA_ADDR", "ca.y.svc:15012"),
    ]);
    let c = load(dir.path(), &e).unwrap();
    assert_eq!(c.identity.ca_addr, "ca.y.svc:15012");
    // As Istio: ISTIOD_SAN is not the name of an explicit CA_ADDR.
    assert_eq!(c.identity.ca_server_name, "ca.y.svc");
    assert_eq!(c.upstream.address, "istiod.x.svc:15012");
    assert_eq!(c.upstream.server_name, "istiod.custom");
    // Without CA_ADDR the CA is the discovery address, named by ISTIOD_SAN.
    let e = env(&[
        (
            "PROXY_CONFIG",
            r#"{"discoveryAddress":"istiod.x.svc:15012"}"#,
        ),
        ("ISTIOD_SAN", "istiod.custom"),
    ]);
    let c = load(dir.path(), &e).unwrap();
    assert_eq!(c.identity.ca_addr, "istiod.x.svc:15012");
    assert_eq!(c.identity.ca_server_name, "istiod.custom");
    assert_eq!(c.upstream.server_name, "istiod.custom");
    let e = env(&[("PROXY_CONFIG", r#"{"discoveryAddress":"istiod:15010"}"#)]);
    let c = load(dir.path(), &e).unwrap();
    assert!(c.identity.ca_plaintext && c.upstream.plaintext);
}

fn write_cert_dir(dir: &Path, not_after: time::OffsetDateTime) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["vm.example".into()]).unwrap();
    params.not_before = not_after - time::Duration::days(2);
    params.not_after = not_after;
    let cert = params.self_signed(&key).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("cert-chain.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    std::fs::write(dir.join("root-cert.pem"), cert.pem()).unwrap();
}

/// One `PROV_CERT` policy: the CA client and the xDS upstream get the same directory and offer
/// it through the same check, so an expired certificate is refused by both.
#[test]
fn prov_cert_policy_is_one() {
    let dir = tempfile::tempdir().unwrap();
    let prov = dir.path().join("etc/prov");
    let e = env(&[("PROV_CERT", "./etc/prov")]);
    let now = time::OffsetDateTime::now_utc();

    write_cert_dir(&prov, now - time::Duration::days(1));
    let c = load(dir.path(), &e).unwrap();
    let identity_dir = c.identity.prov_cert.clone().expect("CA client PROV_CERT");
    let upstream_dir = c.upstream.prov_cert.clone().expect("xDS PROV_CERT");
    assert_eq!(identity_dir, upstream_dir);
    assert_eq!(identity_dir.cert_chain, prov.join("cert-chain.pem"));
    assert!(sds::prov_cert_identity(&upstream_dir).is_none(), "expired");
    // Both trust the PROV_CERT root when no other root is configured.
    assert_eq!(
        c.identity.ca_root,
        sds::RootSource::File(prov.join("root-cert.pem"))
    );
    assert_eq!(
        c.upstream.root,
        sds::RootSource::File(prov.join("root-cert.pem"))
    );

    write_cert_dir(&prov, now + time::Duration::days(1));
    assert!(sds::prov_cert_identity(&upstream_dir).is_some(), "valid");
}

/// Every duration setting of the agent reads Go's syntax the same way: one table
/// ([`go_syntax::DURATION_CASES`]), each setting's own lower bound on top (strict mode: a value
/// refused is an error naming the variable).
#[test]
fn every_duration_setting_parses_the_one_table() {
    let dir = tempfile::tempdir().unwrap();
    type Setting = (&'static str, u64, fn(&Config) -> Duration);
    let settings: &[Setting] = &[
        ("SECRET_TTL", 1_000_000_000, |c| c.identity.secret_ttl),
        ("FILE_DEBOUNCE_DURATION", 0, |c| c.identity.file_debounce),
        ("MINIMUM_DRAIN_DURATION", 0, |c| {
            c.envoy.minimum_drain_duration
        }),
        ("DNS_FORWARD_TIMEOUT", 1, |c| {
            c.dns.as_ref().unwrap().forward_timeout
        }),
    ];
    for (text, want) in go_syntax::DURATION_CASES {
        for (var, min, get) in settings {
            let e = env(&[
                (var, text),
                ("ISTIO_META_DNS_CAPTURE", "true"),
                (STRICT_ENV, "true"),
            ]);
            let got = load(dir.path(), &e);
            // An empty value is the default, as for every variable.
            if text.is_empty() {
                assert!(got.is_ok(), "{var}={text:?}");
                continue;
            }
            match want.filter(|w| w >= min) {
                Some(w) => {
                    let c = got.unwrap_or_else(|e| panic!("{var}={text:?}: {e}"));
                    assert_eq!(get(&c).as_nanos() as u64, w, "{var}={text:?}");
                }
                None => {
                    let err = got
                        .err()
                        .unwrap_or_else(|| panic!("{var}={text:?} accepted"));
                    assert!(err.to_string().contains(var), "{var}={text:?}: {err}");
                }
            }
        }
        // ProxyConfig durations: drainDuration must be at least 1ms.
        let pc = format!(r#"{{"drainDuration":"{text}"}}"#);
        let got = load(dir.path(), &env(&[("PROXY_CONFIG", &pc)]));
        match want.filter(|w| *w >= 1_000_000) {
            Some(w) if !text.is_empty() => {
                let c = got.unwrap_or_else(|e| panic!("drainDuration={text:?}: {e}"));
                assert_eq!(c.proxy.drain_duration.as_nanos() as u64, w, "{text:?}");
            }
            _ => assert!(got.is_err(), "drainDuration={text:?} accepted"),
        }
    }
}

/// The effective config is served without the raw environment and with header values redacted.
#[test]
fn config_dump_redacts_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let e = env(&[
        ("XDS_HEADER_authorization", "Bearer xds-secret"),
        ("CA_HEADER_X-Api-Key", "ca-secret"),
        ("ISTIO_META_CLUSTER_ID", "c1"),
        ("SOME_PASSWORD", "env-secret"),
    ]);
    let c = load(dir.path(), &e).unwrap();
    let dump = c.dump().to_string();
    for secret in ["xds-secret", "ca-secret", "env-secret"] {
        assert!(!dump.contains(secret), "{secret} leaked: {dump}");
    }
    let v = c.dump();
    assert_eq!(v["upstream"]["metadata"][0][1], "c1");
    assert_eq!(v["upstream"]["metadata"][1][1], dump::REDACTED);
    assert_eq!(v["identity"]["ca_headers"][0][1], dump::REDACTED);
    assert_eq!(v["node"]["id"], c.node_id());
    assert_eq!(v["identity"]["secret_ttl"]["secs"], 86400);
}

/// The ProxyConfig's credentials (proxyMetadata values, tracer tokens) stay out of the dump.
#[test]
fn config_dump_redacts_the_proxy_config() {
    let dir = tempfile::tempdir().unwrap();
    let e = env(&[(
        "PROXY_CONFIG",
        r#"{"proxyMetadata":{"GCP_TOKEN":"metadata-secret"},
            "tracing":{"lightstep":{"address":"ls:443","accessToken":"tracer-secret"}},
            "concurrency":2}"#,
    )]);
    let c = load(dir.path(), &e).unwrap();
    let dump = c.dump().to_string();
    for secret in ["metadata-secret", "tracer-secret"] {
        assert!(!dump.contains(secret), "{secret} leaked: {dump}");
    }
    let v = c.dump();
    assert_eq!(v["proxy"]["proxyMetadata"]["GCP_TOKEN"], dump::REDACTED);
    assert_eq!(v["proxy"]["tracing"]["lightstep"]["address"], "ls:443");
    assert_eq!(v["proxy"]["concurrency"], 2);
    // What istiod is sent is the ProxyConfig itself.
    assert_eq!(c.proxy.raw["proxyMetadata"]["GCP_TOKEN"], "metadata-secret");
}

/// A probe's header token (a workload health `readinessProbe` in the ProxyConfig, an app probe
/// in `ISTIO_KUBE_APP_PROBERS`) is in neither the dump, the logged ProxyConfig nor the error of
/// an invalid value.
#[test]
fn probe_header_values_are_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let e = env(&[
        (
            "PROXY_CONFIG",
            r#"{"readinessProbe":{"httpGet":{"path":"/ready","port":8080,
                "httpHeaders":[{"name":"Authorization","value":"Bearer health-secret"}]}}}"#,
        ),
        (
            "ISTIO_KUBE_APP_PROBERS",
            r#"{"/app-health/app/readyz":{"httpGet":{"path":"/ready","port":8080,
                "HTTPHeaders":[{"Name":"Authorization","Value":"Bearer app-secret"}]}}}"#,
        ),
    ]);
    let c = load(dir.path(), &e).unwrap();
    let dump = c.dump().to_string();
    let logged = dump::redact_proxy_config(&c.proxy.raw).to_string();
    for secret in ["health-secret", "app-secret"] {
        assert!(!dump.contains(secret), "{secret} leaked: {dump}");
        assert!(!logged.contains(secret), "{secret} leaked: {logged}");
    }
    let v = c.dump();
    let headers = &v["status"]["health_probe"]["probe"]["action"]["Http"]["headers"];
    assert_eq!(headers[0][0], "Authorization", "{v}");
    assert_eq!(headers[0][1], dump::REDACTED);
    let raw = &v["proxy"]["readinessProbe"]["httpGet"]["httpHeaders"][0];
    assert_eq!(raw["name"], "Authorization", "{v}");
    assert_eq!(raw["value"], dump::REDACTED);
    // What is probed still carries the header.
    let Some(probe) = &c.status.health_probe else {
        panic!("a health probe")
    };
    let probe::ProbeAction::Http { headers, .. } = &probe.probe.action else {
        panic!("an HTTP probe")
    };
    assert_eq!(headers[0].1, "Bearer health-secret");

    let bad = env(&[(
        "ISTIO_KUBE_APP_PROBERS",
        r#"{"/app-health/app/readyz":{"httpGet":{"port":"http",
            "httpHeaders":[{"name":"Authorization","value":"Bearer bad-secret"}]}}}"#,
    )]);
    let e = load(dir.path(), &bad).unwrap_err().to_string();
    assert!(!e.contains("bad-secret"), "{e}");
    assert!(e.contains("ISTIO_KUBE_APP_PROBERS"), "{e}");
    let e = load(
        dir.path(),
        &env(&[("ISTIO_KUBE_APP_PROBERS", "{\"x\": Bearer t0k3n")]),
    )
    .unwrap_err()
    .to_string();
    assert!(!e.contains("t0k3n"), "{e}");
}

/// The dump is the tree itself: every group and the settings the hand-written dump used to
/// miss are there, and `ISTIO_META_*` values are not (names only).
#[test]
fn config_dump_is_the_whole_tree() {
    let dir = tempfile::tempdir().unwrap();
    let e = env(&[
        ("ENVOY_SECURE_METRICS_PORT", "15091"),
        ("COMPLIANCE_POLICY", "fips-140-2"),
        ("GCP_METADATA", "p|1|c|z"),
        ("ISTIO_META_DNS_CAPTURE", "true"),
        ("ISTIO_META_SOMETHING", "meta-secret"),
        ("XDS_ROOT_CA", "/etc/root.pem"),
    ]);
    let c = load(dir.path(), &e).unwrap();
    let v = c.dump();
    let tree = serde_json::to_value(&c).unwrap();
    for group in tree.as_object().unwrap().keys() {
        assert!(v.get(group).is_some(), "{group} missing from the dump");
    }
    for group in [
        "base_dir",
        "flags",
        "proxy",
        "node",
        "envoy",
        "bootstrap",
        "workload_socket",
        "identity",
        "dns",
        "upstream",
        "status",
        "platform",
        "xds_socket",
    ] {
        assert!(v.get(group).is_some(), "{group} missing from the dump");
    }
    assert_eq!(v["bootstrap"]["secure_metrics_port"], 15091);
    assert_eq!(v["bootstrap"]["compliance_policy"], "fips-140-2");
    assert_eq!(v["platform"]["gcp_static"]["gcp_project"], "p");
    assert_eq!(v["platform"]["cloud"], "discover");
    assert_eq!(v["bootstrap"]["xds_root_ca"], "/etc/root.pem");
    assert_eq!(v["envoy"]["launched"], true);
    assert_eq!(v["envoy"]["status_port"], 15021);
    assert_eq!(v["envoy"]["lifecycle_lockdown"], false);
    let locked = load(dir.path(), &env(&[("PROXY_LIFECYCLE_LOCKDOWN", "true")])).unwrap();
    assert_eq!(locked.dump()["envoy"]["lifecycle_lockdown"], true);
    // Termination that follows the app: on by default, Istio's fixed wait one setting away.
    assert_eq!(v["envoy"]["drain_follows_app"], true);
    let istio = load(dir.path(), &env(&[("DRAIN_FOLLOWS_APP", "false")])).unwrap();
    assert_eq!(istio.dump()["envoy"]["drain_follows_app"], false);
    assert!(
        v["envoy"].get("env").is_none(),
        "the raw environment is never dumped"
    );
    assert_eq!(v["workload_socket"]["file"], "socket");
    assert!(v["dns"].is_object());
    let meta = v["node"]["meta_env"].to_string();
    assert!(meta.contains("ISTIO_META_SOMETHING"), "{meta}");
    assert!(!v.to_string().contains("meta-secret"));
}

/// One DNS domain for the node id and the DNS proxy, also with no `POD_NAMESPACE`
/// (`.svc.cluster.local`, as Istio's agent).
#[test]
fn one_dns_domain_for_node_and_dns_proxy() {
    let dir = tempfile::tempdir().unwrap();
    for (ns, want) in [("ns1", "ns1.svc.cluster.local"), ("", ".svc.cluster.local")] {
        let e = env(&[("POD_NAMESPACE", ns), ("ISTIO_META_DNS_CAPTURE", "true")]);
        let c = load(dir.path(), &e).unwrap();
        assert_eq!(c.node.dns_domain, want);
        let dns = c.dns.as_ref().expect("DNS capture on");
        assert_eq!(dns.domain, want);
        assert_eq!(dns.proxy_domain(), "svc.cluster.local");
        assert!(
            c.node_id().ends_with(&format!("~{want}")),
            "{}",
            c.node_id()
        );
    }
}

/// `traffic.sidecar.istio.io/excludeInterfaces`: those interfaces' IPs leave `INSTANCE_IPS`.
#[test]
fn excluded_interfaces_leave_instance_ips() {
    let dir = tempfile::tempdir().unwrap();
    let ifs = || {
        vec![
            ("eth0".to_string(), "198.18.0.2".parse().unwrap()),
            ("net1".to_string(), "198.18.1.2".parse().unwrap()),
            ("eth0".to_string(), "fd00::2".parse().unwrap()),
            ("net2".to_string(), "198.18.2.2".parse().unwrap()),
            ("eth1".to_string(), "198.18.0.2".parse().unwrap()),
        ]
    };
    let all: Vec<IpAddr> = private_ips(dir.path(), ifs()).unwrap();
    assert_eq!(all.len(), 4, "duplicates dropped: {all:?}");
    std::fs::create_dir_all(dir.path().join("etc/istio/pod")).unwrap();
    std::fs::write(
        dir.path().join("etc/istio/pod/annotations"),
        "traffic.sidecar.istio.io/excludeInterfaces=\"net1, net2\"\n",
    )
    .unwrap();
    let kept = private_ips(dir.path(), ifs()).unwrap();
    let want: Vec<IpAddr> = vec!["198.18.0.2".parse().unwrap(), "fd00::2".parse().unwrap()];
    assert_eq!(kept, want);
    let e = env(&[("INSTANCE_IP", "198.18.0.2")]);
    let c = Config::load(Inputs {
        node_type: NodeType::Sidecar,
        flags: ProxyFlags::default(),
        env: &e,
        base_dir: dir.path().to_path_buf(),
        interface_ips: kept,
        is_root: false,
        cgroup_memory_limit: None,
    })
    .unwrap();
    assert_eq!(c.node.ips, want);
}

/// `OUTPUT_CERTS` files are readable by the pod's other containers in Kubernetes (Istio's 0644
/// when `KUBERNETES_SERVICE_HOST` is set), owner-only elsewhere.
#[test]
fn output_certs_mode_follows_kubernetes() {
    let dir = tempfile::tempdir().unwrap();
    let c = load(dir.path(), &env(&[("OUTPUT_CERTS", "/var/lib/istio/data")])).unwrap();
    assert_eq!(c.identity.output_certs_mode, 0o600);
    let e = env(&[
        ("OUTPUT_CERTS", "/var/lib/istio/data"),
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
    ]);
    assert_eq!(
        load(dir.path(), &e).unwrap().identity.output_certs_mode,
        0o644
    );
}

/// With no variable set the identity config is [`sds::Config::defaults`]: the defaults live in
/// one place.
#[test]
fn identity_defaults_are_sds_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let c = load(dir.path(), &env(&[])).unwrap();
    assert_eq!(
        serde_json::to_value(&c.identity).unwrap(),
        serde_json::to_value(sds::Config::defaults(dir.path())).unwrap()
    );
}

/// `CA_ALLOW_PLAINTEXT_TOKEN` reaches the CA client's config (off unless set); a bad value is
/// an error naming the variable.
#[test]
fn allow_plaintext_token_reaches_the_identity_config() {
    assert_eq!(sds::ALLOW_PLAINTEXT_TOKEN_ENV, "CA_ALLOW_PLAINTEXT_TOKEN");
    let dir = tempfile::tempdir().unwrap();
    let off = load(dir.path(), &env(&[])).unwrap();
    assert!(!off.identity.allow_plaintext_token);
    assert!(!off.upstream.allow_plaintext_token, "xDS: the same rule");
    let on = load(dir.path(), &env(&[("CA_ALLOW_PLAINTEXT_TOKEN", "true")])).unwrap();
    assert!(on.identity.allow_plaintext_token);
    assert!(on.upstream.allow_plaintext_token);
    let no = load(dir.path(), &env(&[("CA_ALLOW_PLAINTEXT_TOKEN", "false")])).unwrap();
    assert!(!no.identity.allow_plaintext_token);
    for bad in ["sometimes", "yes"] {
        let strict = env(&[("CA_ALLOW_PLAINTEXT_TOKEN", bad), (STRICT_ENV, "true")]);
        let err = load(dir.path(), &strict).unwrap_err().to_string();
        assert!(
            err.contains("CA_ALLOW_PLAINTEXT_TOKEN") && err.contains(bad),
            "{err}"
        );
    }
}

/// Istio's CA and key variables map onto the identity config.
#[test]
fn identity_parses_ca_and_key_settings() {
    let dir = tempfile::tempdir().unwrap();
    let e = env(&[
        ("CA_ADDR", "localhost:15010"),
        ("CA_HEADER_X-Tenant", "t1"),
        ("ECC_SIGNATURE_ALGORITHM", "ECDSA"),
        ("ECC_CURVE", "P384"),
        ("SECRET_TTL", "1h30m"),
        ("TRUST_DOMAIN", "td"),
        ("POD_NAMESPACE", "ns1"),
        ("SERVICE_ACCOUNT", "sa1"),
        ("CA_ROOT_CA", "SYSTEM"),
    ]);
    let c = load(dir.path(), &e).unwrap().identity;
    assert!(c.ca_plaintext);
    assert_eq!(c.ca_server_name, "istiod.istio-system.svc");
    assert_eq!(
        c.ca_headers,
        vec![("X-Tenant".to_string(), "t1".to_string())]
    );
    assert_eq!(c.key_algorithm, sds::KeyAlgorithm::EcdsaP384);
    assert_eq!(c.secret_ttl, Duration::from_secs(5400));
    assert_eq!(c.ca_root, sds::RootSource::System);
    assert_eq!(c.spiffe_id(), "spiffe://td/ns/ns1/sa/sa1");
}

#[test]
fn identity_rejects_bad_values_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    for (k, v) in [
        ("WORKLOAD_RSA_KEY_SIZE", "1024"),
        ("ECC_SIGNATURE_ALGORITHM", "ED25519"),
        ("SECRET_TTL", "soon"),
        ("SECRET_GRACE_PERIOD_RATIO", "2"),
        ("PKCS8_KEY", "maybe"),
    ] {
        let strict = env(&[(k, v), (STRICT_ENV, "true")]);
        let msg = load(dir.path(), &strict).expect_err(k).to_string();
        assert!(msg.contains(k) && msg.contains(v), "{msg}");
    }
    // Without strict mode only the values no default stands in for stop the agent.
    for (k, v, refused) in [
        ("WORKLOAD_RSA_KEY_SIZE", "1024", true),
        ("ECC_SIGNATURE_ALGORITHM", "ED25519", true),
        ("SECRET_TTL", "soon", false),
        ("SECRET_GRACE_PERIOD_RATIO", "2", false),
        ("PKCS8_KEY", "maybe", false),
    ] {
        assert_eq!(
            load(dir.path(), &env(&[(k, v)])).is_err(),
            refused,
            "{k}={v}"
        );
    }
}

#[test]
fn istiod_server_names() {
    use identity::istiod_server_name;
    assert_eq!(
        istiod_server_name("istiod.foo.svc:15012", None),
        "istiod.foo.svc"
    );
    assert_eq!(istiod_server_name("[::1]:15012", None), "::1");
    assert_eq!(
        istiod_server_name("https://ca.example:443", None),
        "ca.example"
    );
    assert_eq!(
        istiod_server_name("localhost:15012", None),
        "istiod.istio-system.svc"
    );
    assert_eq!(istiod_server_name("x:1", Some("san")), "san");
    // A list of istiods (not Istio): the first one's name and port decide for all.
    assert_eq!(
        istiod_server_name("istiod-a.svc:15012, istiod-b.svc:15012", None),
        "istiod-a.svc"
    );
    assert!(identity::is_plaintext_addr("a:15010,b:15010"));
    assert!(!identity::is_plaintext_addr("a:15012,b:15010"));
}

#[test]
fn a_list_of_discovery_addresses_is_kept_for_the_upstream_and_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let list = "istiod-a.istio-system.svc:15012,istiod-b.istio-system.svc:15012";
    let e = env(&[(
        "PROXY_CONFIG",
        &format!(r#"{{"discoveryAddress":"{list}"}}"#),
    )]);
    let c = load(dir.path(), &e).unwrap();
    assert_eq!(c.upstream.address, list);
    assert!(!c.upstream.plaintext);
    assert_eq!(c.upstream.server_name, "istiod-a.istio-system.svc");
    assert_eq!(c.identity.ca_addr, list);
    assert_eq!(c.identity.ca_server_name, "istiod-a.istio-system.svc");
}

/// Loading is parse and validate only: the workload socket is recorded as configured, and a
/// leftover socket file (an earlier agent's) is not touched, nor is a non-default
/// `WORKLOAD_IDENTITY_SOCKET_FILE` with nobody there refused yet. Who serves the sockets is
/// settled at bind (`identity::tests`).
#[test]
fn loading_leaves_the_workload_socket_alone() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("var/run/secrets/workload-spiffe-uds");
    let socket = uds.join("socket");
    std::fs::create_dir_all(&uds).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let c = load(dir.path(), &env(&[])).unwrap();
    assert!(socket.exists(), "loading removed the leftover socket file");
    assert_eq!(c.workload_socket.configured, socket);
    assert_eq!(c.workload_socket.file, "socket");
    assert_eq!(c.identity.socket_path, socket);
    assert!(!c.identity.serve_only_files);

    let c = load(
        dir.path(),
        &env(&[("WORKLOAD_IDENTITY_SOCKET_FILE", "spire.sock")]),
    )
    .unwrap();
    assert_eq!(c.workload_socket.configured, uds.join("spire.sock"));
    assert_eq!(c.workload_socket.file, "spire.sock");
    assert_eq!(
        c.workload_socket.files,
        dir.path()
            .join("var/run/secrets/credential-uds/files-socket")
    );
    assert_eq!(
        c.workload_socket.credential,
        dir.path().join("var/run/secrets/credential-uds/socket")
    );
    assert!(!uds.join("spire.sock").exists());

    let err = load(
        dir.path(),
        &env(&[("WORKLOAD_IDENTITY_SOCKET_FILE", "a/b")]),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("WORKLOAD_IDENTITY_SOCKET_FILE"), "{err}");
}

/// Probes go to `INSTANCE_IP`, or to the name `localhost` with
/// `REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION=true` (Istio dials the name, not an address).
#[test]
fn legacy_localhost_probe_destination_is_the_name() {
    use crate::config::probe::Destination;
    let dir = tempfile::tempdir().unwrap();
    let loopback: IpAddr = "127.0.0.1".parse().unwrap();
    let pod: IpAddr = "198.18.0.7".parse().unwrap();
    let c = load(dir.path(), &env(&[])).unwrap();
    assert_eq!(
        c.status.probe_destination(Some(pod), loopback),
        Destination::Ip(pod)
    );
    assert_eq!(
        c.status.probe_destination(None, loopback),
        Destination::Ip(loopback)
    );
    let legacy = load(
        dir.path(),
        &env(&[("REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION", "true")]),
    )
    .unwrap();
    assert_eq!(
        legacy.status.probe_destination(Some(pod), loopback),
        Destination::Localhost
    );
    assert!(
        load(
            dir.path(),
            &env(&[
                ("REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION", "maybe"),
                (STRICT_ENV, "true")
            ])
        )
        .unwrap_err()
        .to_string()
        .contains("REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION")
    );
}

/// A VM's mesh.yaml from `istioctl x workload entry configure` carries the WorkloadGroup's
/// probe, which may be `exec`: the agent must start with it (it did not: the VM never joined).
#[test]
fn vm_exec_readiness_probe_loads() {
    let dir = tempfile::tempdir().unwrap();
    let e = env(&[(
        "PROXY_CONFIG",
        r#"{"readinessProbe":{"exec":{"command":["/usr/bin/check","--quick"]},"timeoutSeconds":3,"periodSeconds":5}}"#,
    )]);
    let c = load(dir.path(), &e).unwrap();
    let probe = c.status.health_probe.expect("the VM health probe");
    assert_eq!(probe.probe.timeout, Duration::from_secs(3));
    assert!(matches!(
        &probe.probe.action,
        probe::ProbeAction::Exec { command } if command == &["/usr/bin/check", "--quick"]
    ));
}

/// The two pod annotations are used as Istio's agent uses them: a status port that is not a
/// number is read as 0 (no status server), a discovery address as written; a number out of
/// port range stays an error naming the annotation.
#[test]
fn annotations_are_used_as_istio_uses_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("etc/istio/pod")).unwrap();
    let with = |annotations: &str| {
        std::fs::write(dir.path().join("etc/istio/pod/annotations"), annotations).unwrap();
        load(dir.path(), &env(&[]))
    };
    let c = with("status.sidecar.istio.io/port=\"15021x\"\n").unwrap();
    assert_eq!(c.proxy.status_port, 0);
    let c = with("status.sidecar.istio.io/port=\"+15030\"\n").unwrap();
    assert_eq!(c.proxy.status_port, 15030);
    let c = with("sidecar.istio.io/discoveryAddress=\"istiod-no-port\"\n").unwrap();
    assert_eq!(c.proxy.discovery_address, "istiod-no-port");
    let e = with("status.sidecar.istio.io/port=\"70000\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("status.sidecar.istio.io/port") && e.contains("70000"),
        "{e}"
    );
}

/// `FILE_MOUNTED_CERTS`: the xDS connection's root and client certificate are the files the
/// ProxyConfig metadata names (Istio's `ISTIO_META_TLS_CLIENT_*`); a missing root is an error
/// naming the key.
#[test]
fn file_mounted_certs_name_the_xds_files() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("mounted");
    std::fs::create_dir_all(&certs).unwrap();
    for f in ["root.pem", "chain.pem", "key.pem"] {
        std::fs::write(certs.join(f), "x").unwrap();
    }
    let pc = format!(
        r#"{{"discoveryAddress":"istiod.istio-system.svc:15012","proxyMetadata":{{"ISTIO_META_TLS_CLIENT_ROOT_CERT":"{r}","ISTIO_META_TLS_CLIENT_CERT_CHAIN":"{c}","ISTIO_META_TLS_CLIENT_KEY":"{k}"}}}}"#,
        r = certs.join("root.pem").display(),
        c = certs.join("chain.pem").display(),
        k = certs.join("key.pem").display(),
    );
    let e = env(&[("FILE_MOUNTED_CERTS", "true"), ("PROXY_CONFIG", &pc)]);
    let c = load(dir.path(), &e).unwrap();
    assert_eq!(
        c.upstream.root,
        sds::RootSource::File(certs.join("root.pem"))
    );
    let client = c.upstream.prov_cert.expect("client certificate");
    assert_eq!(client.cert_chain, certs.join("chain.pem"));
    assert_eq!(client.key, certs.join("key.pem"));
    // Without FILE_MOUNTED_CERTS the metadata is not read (Istio's mounted root).
    let e = env(&[("PROXY_CONFIG", &pc)]);
    let c = load(dir.path(), &e).unwrap();
    assert!(c.upstream.prov_cert.is_none());
    // A root that does not exist: an error naming the metadata key.
    let missing = pc.replace("root.pem", "gone.pem");
    let e = env(&[("FILE_MOUNTED_CERTS", "true"), ("PROXY_CONFIG", &missing)]);
    let err = load(dir.path(), &e).unwrap_err().to_string();
    assert!(
        err.contains("ISTIO_META_TLS_CLIENT_ROOT_CERT") && err.contains("gone.pem"),
        "{err}"
    );
}

/// `COMPLIANCE_POLICY` is parsed once and reaches both connections to istiod and Envoy's
/// environment; a value Istio does not know restricts nothing (Istio warns and goes on).
#[test]
fn compliance_policy_reaches_every_istiod_client_and_envoy() {
    let dir = tempfile::tempdir().unwrap();
    for (value, policy, grpc_suites) in [
        ("fips-140-2", sds::Compliance::Fips1402, true),
        ("fips-140-3", sds::Compliance::Fips1403, true),
        ("pqc", sds::Compliance::Pqc, false),
        ("", sds::Compliance::None, false),
        ("fips-140-4", sds::Compliance::None, false),
    ] {
        let c = load(dir.path(), &env(&[("COMPLIANCE_POLICY", value)])).unwrap();
        assert_eq!(c.identity.compliance, policy, "{value}: CA client");
        assert_eq!(c.upstream.compliance, policy, "{value}: xDS upstream");
        assert_eq!(
            c.envoy
                .env
                .get("GRPC_SSL_CIPHER_SUITES")
                .map(String::as_str),
            grpc_suites.then_some(
                "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:\
                 ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384"
            ),
            "{value}: Envoy's environment"
        );
    }
}

#[test]
fn probe_keepalive_connections_is_off_by_default() {
    let dir = tempfile::tempdir().unwrap();
    assert!(!load(dir.path(), &env(&[])).unwrap().status.probe_keepalive);
    let on = env(&[("ENABLE_PROBE_KEEPALIVE_CONNECTIONS", "true")]);
    assert!(load(dir.path(), &on).unwrap().status.probe_keepalive);
}

#[test]
fn proxy_config_xds_agent_is_off_by_default() {
    let dir = tempfile::tempdir().unwrap();
    assert!(
        !load(dir.path(), &env(&[]))
            .unwrap()
            .upstream
            .proxy_config_xds
    );
    let on = env(&[("PROXY_CONFIG_XDS_AGENT", "true")]);
    assert!(load(dir.path(), &on).unwrap().upstream.proxy_config_xds);
    let strict = env(&[("PROXY_CONFIG_XDS_AGENT", "maybe"), (STRICT_ENV, "true")]);
    assert!(load(dir.path(), &strict).is_err());
}

/// Istio's `GRPC_KEEPALIVE_INTERVAL`/`_TIMEOUT` on the CA, the xDS upstream and the XDS
/// socket's server (a client interval under 10s raised to 10s, as gRPC-Go), and
/// `ISTIO_GPRC_MAXSTREAMS`/`ISTIO_GPRC_MAXRECVMSGSIZE` on the XDS socket's server.
#[test]
fn grpc_keepalive_and_xds_server_limits_as_istio() {
    let dir = tempfile::tempdir().unwrap();
    let s = |secs| Duration::from_secs(secs);
    let c = load(dir.path(), &env(&[])).unwrap();
    assert_eq!(c.identity.grpc_keepalive, Some((s(30), s(10))));
    assert_eq!(c.upstream.keepalive, (s(30), s(10)));
    assert_eq!(c.xds_server, XdsServer::default());
    assert_eq!(c.xds_server.keepalive, (s(30), s(10)));
    assert_eq!(c.xds_server.max_streams, Some(100_000));
    assert_eq!(c.xds_server.max_recv_msg_size, 4 << 20);

    let c = load(
        dir.path(),
        &env(&[
            ("GRPC_KEEPALIVE_INTERVAL", "45s"),
            ("GRPC_KEEPALIVE_TIMEOUT", "5s"),
            ("ISTIO_GPRC_MAXSTREAMS", "64"),
            ("ISTIO_GPRC_MAXRECVMSGSIZE", "1048576"),
        ]),
    )
    .unwrap();
    assert_eq!(c.identity.grpc_keepalive, Some((s(45), s(5))));
    assert_eq!(c.upstream.keepalive, (s(45), s(5)));
    assert_eq!(c.xds_server.keepalive, (s(45), s(5)));
    assert_eq!(c.xds_server.max_streams, Some(64));
    assert_eq!(c.xds_server.max_recv_msg_size, 1 << 20);

    // gRPC-Go's floors: 10s for a client, 1s for a server; a stream cap of 0 is none.
    let c = load(
        dir.path(),
        &env(&[
            ("GRPC_KEEPALIVE_INTERVAL", "500ms"),
            ("ISTIO_GPRC_MAXSTREAMS", "0"),
        ]),
    )
    .unwrap();
    assert_eq!(c.identity.grpc_keepalive, Some((s(10), s(10))));
    assert_eq!(c.upstream.keepalive, (s(10), s(10)));
    assert_eq!(c.xds_server.keepalive, (s(1), s(10)));
    assert_eq!(c.xds_server.max_streams, None);

    // XDS_PROXY_KEEPALIVE_INTERVAL (ours) sets the upstream interval below the floor.
    let c = load(
        dir.path(),
        &env(&[
            ("XDS_PROXY_KEEPALIVE_INTERVAL", "2s"),
            ("GRPC_KEEPALIVE_TIMEOUT", "20s"),
        ]),
    )
    .unwrap();
    assert_eq!(c.upstream.keepalive, (s(2), s(1)));
    assert_eq!(c.identity.grpc_keepalive, Some((s(30), s(20))));

    // Values that do not parse: Istio's defaults, warned and counted.
    let c = load(
        dir.path(),
        &env(&[
            ("GRPC_KEEPALIVE_INTERVAL", "often"),
            ("ISTIO_GPRC_MAXSTREAMS", "-1"),
            ("ISTIO_GPRC_MAXRECVMSGSIZE", "4MiB"),
        ]),
    )
    .unwrap();
    assert_eq!(c.upstream.keepalive, (s(30), s(10)));
    assert_eq!(c.xds_server, XdsServer::default());
    assert_eq!(c.env_fallbacks.len(), 3, "{:?}", c.env_fallbacks);
}

/// `privateKeyProvider` (CryptoMB, QAT) is not served: a warning says so, the agent starts.
#[test]
fn private_key_provider_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let sink = crate::log_capture::Sink::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(sink.make_writer())
        .finish();
    let e = env(&[(
        "PROXY_CONFIG",
        r#"{"privateKeyProvider":{"cryptomb":{"pollDelay":"0.01s"}}}"#,
    )]);
    let c = tracing::subscriber::with_default(subscriber, || load(dir.path(), &e)).unwrap();
    assert!(c.proxy.raw.get("privateKeyProvider").is_some());
    let out = sink.text();
    assert!(
        out.contains("privateKeyProvider is not supported") && out.contains("cryptomb"),
        "{out}"
    );
}

#[test]
fn xds_prefetch_is_on_and_the_switch_turns_it_off() {
    let dir = tempfile::tempdir().unwrap();
    let prefetch =
        |pairs: &[(&str, &str)]| load(dir.path(), &env(pairs)).unwrap().upstream.prefetch;
    assert!(prefetch(&[]));
    assert!(!prefetch(&[("XDS_PROXY_PREFETCH", "false")]));
    let strict = env(&[("XDS_PROXY_PREFETCH", "sometimes"), (STRICT_ENV, "true")]);
    let err = load(dir.path(), &strict).unwrap_err().to_string();
    assert!(err.contains("XDS_PROXY_PREFETCH"), "{err}");
}

const PLAINTEXT_ISTIOD: &str = r#"{"discoveryAddress":"istiod.istio-system.svc:15010"}"#;

/// `CA_PROVIDER` as Istio's agent settles it: `Citadel` by default; another name, or a `CA_ADDR`
/// under googleapis.com (`GoogleCA`), has no CA client (whether one is needed is known at bind:
/// `identity::tests`); `PROV_CERT` and `FILE_MOUNTED_CERTS` exclude each other.
#[test]
fn ca_provider_is_settled_as_istio_settles_it() {
    use ca_provider::CaProvider;
    let dir = tempfile::tempdir().unwrap();
    let c = load(dir.path(), &env(&[("CA_PROVIDER", "Citadel")])).unwrap();
    assert_eq!(c.ca_provider, CaProvider::Citadel);
    for (k, v, name) in [
        ("CA_PROVIDER", "Vault", "Vault"),
        ("CA_PROVIDER", "citadel", "citadel"),
        ("CA_ADDR", "meshca.googleapis.com:443", "GoogleCA"),
    ] {
        let c = load(dir.path(), &env(&[(k, v)])).unwrap();
        assert_eq!(c.ca_provider.unregistered(), Some(name), "{k}={v}");
    }
    let e = env(&[("PROV_CERT", "./etc/prov"), ("FILE_MOUNTED_CERTS", "true")]);
    let err = load(dir.path(), &e).unwrap_err().to_string();
    assert!(
        err.contains("PROV_CERT and FILE_MOUNTED_CERTS are mutually exclusive"),
        "{err}"
    );
}

/// `CA_PROVIDER=GkeWorkloadCertificate`: GKE's three files in
/// `./var/run/secrets/workload-spiffe-credentials` are the workload certificate (no CA) and the
/// xDS connection is file-mounted; a missing file names the files; `PROV_CERT` is refused.
#[test]
fn gke_workload_certificate_provider_reads_the_mounted_files() {
    let dir = tempfile::tempdir().unwrap();
    let gke = [
        ("CA_PROVIDER", "GkeWorkloadCertificate"),
        ("PROXY_CONFIG", PLAINTEXT_ISTIOD),
    ];
    let err = load(dir.path(), &env(&gke)).unwrap_err().to_string();
    assert!(
        err.contains("GKE workload certificate files") && err.contains("certificates.pem"),
        "{err}"
    );
    let creds = dir
        .path()
        .join("var/run/secrets/workload-spiffe-credentials");
    std::fs::create_dir_all(&creds).unwrap();
    for f in ["certificates.pem", "private_key.pem", "ca_certificates.pem"] {
        std::fs::write(creds.join(f), "x").unwrap();
    }
    let c = load(dir.path(), &env(&gke)).unwrap();
    let files = c.identity.file_mounted_certs.expect("GKE's files");
    assert_eq!(files.cert_chain, creds.join("certificates.pem"));
    assert_eq!(files.key, creds.join("private_key.pem"));
    assert_eq!(files.root, creds.join("ca_certificates.pem"));
    // The xDS connection is file-mounted too: over TLS it wants the ProxyConfig's root.
    let tls = env(&[("CA_PROVIDER", "GkeWorkloadCertificate")]);
    let err = load(dir.path(), &tls).unwrap_err().to_string();
    assert!(err.contains("ISTIO_META_TLS_CLIENT_ROOT_CERT"), "{err}");
    let mut with_prov = gke.to_vec();
    with_prov.push(("PROV_CERT", "./etc/prov"));
    let err = load(dir.path(), &env(&with_prov)).unwrap_err().to_string();
    assert!(
        err.contains("PROV_CERT and FILE_MOUNTED_CERTS of GKE workload cert are mutually"),
        "{err}"
    );
}
