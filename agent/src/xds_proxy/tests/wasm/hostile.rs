//! Hostile module servers and registries: a fetch that never answers (the relay goes on),
//! decompression bombs and oversized layers (capped as they stream, off the runtime thread),
//! a huge manifest, addresses spelled to slip past the SSRF filter, a redirect, a registry
//! that answers TLS in plain HTTP, and a cache that must stay within its bounds.

use std::time::Instant;

use proto::envoy::service::discovery::v3::DiscoveryResponse;

use super::*;

/// A TCP server that accepts connections and never answers; how many it accepted.
async fn silent_server() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            held.push(s);
        }
    });
    (addr, accepted)
}

/// `resource` with its remote fetch bounded by `timeout` (istiod writes 30 s).
fn with_timeout(resource: Any, timeout: Duration) -> Any {
    let mut ec = TypedExtensionConfig::decode(&resource.value[..]).unwrap();
    let typed = ec.typed_config.as_mut().unwrap();
    let mut w = HttpWasm::decode(&typed.value[..]).unwrap();
    let Some(plugin_config::Vm::VmConfig(vm)) = w.config.as_mut().and_then(|c| c.vm.as_mut())
    else {
        panic!("no vm")
    };
    let Some(async_data_source::Specifier::Remote(r)) =
        vm.code.as_mut().and_then(|c| c.specifier.as_mut())
    else {
        panic!("not remote")
    };
    r.http_uri.as_mut().unwrap().timeout = Some(proto::google::protobuf::Duration {
        seconds: i64::try_from(timeout.as_secs()).unwrap(),
        nanos: 0,
    });
    typed.value = w.encode_to_vec();
    Any {
        type_url: resource.type_url,
        value: ec.encode_to_vec(),
    }
}

/// The next response Envoy gets, within `within`.
async fn within(
    from_proxy: &mut tonic::Streaming<DiscoveryResponse>,
    within: Duration,
) -> Option<DiscoveryResponse> {
    tokio::time::timeout(within, from_proxy.message())
        .await
        .ok()
        .map(|m| m.unwrap().unwrap())
}

/// The ECDS rewrite runs beside the relay: with the module's server silent (a fetch that
/// only its 3 s timeout ends), an LDS and a CDS pushed 0.2 s after the ECDS reach Envoy at
/// once, and the ECDS follows when its fetch gives up, as the plugin's fail-closed RBAC.
#[tokio::test]
async fn responses_after_an_ecds_are_not_held_behind_its_module_fetch() {
    let (addr, accepted) = silent_server().await;
    let mut w = world().await;
    let mut client = envoy_client(&w.h.path).await;
    let resource = with_timeout(
        wasm_resource(
            "hangs",
            &format!("http://{addr}/m.wasm"),
            "",
            FailurePolicy::FailClosed,
            false,
        ),
        Duration::from_secs(3),
    );
    let (_tx, mut from_proxy, up) =
        open_sotw(&mut client, &mut w.ads, req(type_url::ECDS, "")).await;
    let start = Instant::now();
    up.responses
        .send(Ok(ecds("e1", vec![resource])))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    up.responses
        .send(Ok(resp(type_url::LISTENER, "l1")))
        .await
        .unwrap();
    up.responses
        .send(Ok(resp(type_url::CLUSTER, "c1")))
        .await
        .unwrap();
    let first = within(&mut from_proxy, Duration::from_secs(2))
        .await
        .expect("the LDS pushed after the ECDS was held back behind the module fetch");
    assert_eq!(first.type_url, type_url::LISTENER);
    let lds_after = start.elapsed();
    let second = within(&mut from_proxy, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(second.type_url, type_url::CLUSTER);
    assert!(
        accepted.load(Ordering::SeqCst) >= 1,
        "the fetch was started"
    );
    let third = within(&mut from_proxy, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(third.type_url, type_url::ECDS);
    assert!(
        matches!(got(&third.resources[0]), Got::Rbac { .. }),
        "fail closed"
    );
    assert!(
        lds_after < Duration::from_secs(1),
        "LDS reached Envoy after {lds_after:?}"
    );
    assert!(start.elapsed() >= Duration::from_secs(3));
}

/// Two ECDS pushes reach Envoy in istiod's order even when the first one's module is slow and
/// the second needs no fetch (Istio's goroutines can swap them).
#[tokio::test]
async fn ecds_responses_reach_envoy_in_istiods_order() {
    let (addr, _) = silent_server().await;
    let mut w = world().await;
    let mut client = envoy_client(&w.h.path).await;
    let slow = with_timeout(
        wasm_resource(
            "slow",
            &format!("http://{addr}/m.wasm"),
            "",
            FailurePolicy::FailOpen,
            false,
        ),
        Duration::from_secs(1),
    );
    let plain = Any {
        type_url: type_url::ECDS.into(),
        value: TypedExtensionConfig {
            name: "not-wasm".into(),
            typed_config: Some(Any {
                type_url: "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                    .into(),
                value: vec![],
            }),
        }
        .encode_to_vec(),
    };
    let (_tx, mut from_proxy, up) =
        open_sotw(&mut client, &mut w.ads, req(type_url::ECDS, "")).await;
    up.responses.send(Ok(ecds("e1", vec![slow]))).await.unwrap();
    up.responses
        .send(Ok(ecds("e2", vec![plain])))
        .await
        .unwrap();
    let a = within(&mut from_proxy, Duration::from_secs(10))
        .await
        .unwrap();
    let b = within(&mut from_proxy, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!((a.nonce.as_str(), b.nonce.as_str()), ("e1", "e2"));
}

/// A module body `layers` times gzipped around a Wasm binary of `size` bytes (mostly zeros).
fn nested_gzip(size: usize, layers: usize) -> Vec<u8> {
    let mut b = b"\0asm\x01\0\0\0".to_vec();
    b.resize(size, 0);
    for _ in 0..layers {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&b).unwrap();
        b = gz.finish().unwrap();
    }
    b
}

fn options(dir: &Path) -> wasm::Options {
    let mut o = wasm::Options::new(dir.to_path_buf());
    o.http_max_retries = 1;
    o
}

fn request() -> wasm::Request {
    wasm::Request {
        timeout: Duration::from_secs(60),
        ..Default::default()
    }
}

/// A nested-gzip body that unpacks past `ISTIO_WASM_MAX_BINARY_SIZE_BYTES` is refused as it
/// streams, never cut short and accepted, for an HTTP module and an OCI layer.
#[tokio::test]
async fn layers_unpacking_past_the_cap_are_refused() {
    let bomb = nested_gzip(3 << 20, 2);
    let files = serve_files(HashMap::from([(
        "/bomb.wasm".to_string(),
        ("application/wasm".to_string(), bomb),
    )]))
    .await;
    let data = tempfile::tempdir().unwrap();
    let mut opts = options(data.path());
    opts.max_binary_size = 1 << 20;
    opts.plain_http_registries = vec!["*".into()];
    let cache = wasm::Cache::new(opts, wasm::Metrics::default());
    let err = cache
        .get(&format!("http://{}/bomb.wasm", files.addr), &request())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("unpacks to more than 1048576 bytes"), "{err}");

    let reg_dir = tempfile::tempdir().unwrap();
    let mut big = module("big");
    big.resize(2 << 20, 0);
    push_image(
        reg_dir.path(),
        "p/big",
        "v1",
        &[(
            "application/vnd.oci.image.layer.v1.tar+gzip",
            tar_gz("plugin.wasm", &big),
        )],
    );
    let reg = serve_registry(reg_dir.path()).await;
    let err = cache
        .get(&format!("oci://{}/p/big:v1", reg.addr), &request())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("unpacks to more than 1048576 bytes"), "{err}");
    assert!(cache.is_empty());
    let leftovers: Vec<_> = walk(data.path());
    assert!(leftovers.is_empty(), "staging files left: {leftovers:?}");
}

/// Unpacking and hashing run off the runtime thread: while a 64 MiB module in three gzip
/// layers is unpacked, a 10 ms ticker on the same (single-threaded) runtime never waits long.
#[tokio::test]
async fn unpacking_does_not_stall_the_runtime() {
    let body = nested_gzip(64 << 20, 3);
    let files = serve_files(HashMap::from([(
        "/big.wasm".to_string(),
        ("application/wasm".to_string(), body),
    )]))
    .await;
    let url = format!("http://{}/big.wasm", files.addr);
    let data = tempfile::tempdir().unwrap();
    let cache = wasm::Cache::new(options(data.path()), wasm::Metrics::default());
    let worst = Arc::new(Mutex::new(Duration::ZERO));
    let w = worst.clone();
    let ticker = tokio::spawn(async move {
        let mut last = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let mut g = w.lock().unwrap();
            *g = (*g).max(last.elapsed());
            drop(g);
            last = Instant::now();
        }
    });
    let started = Instant::now();
    let path = cache.get(&url, &request()).await.unwrap();
    let took = started.elapsed();
    assert_eq!(std::fs::metadata(path).unwrap().len(), 64 << 20);
    ticker.abort();
    let worst = *worst.lock().unwrap();
    assert!(
        worst < Duration::from_millis(400),
        "the runtime thread stalled {worst:?} during a {took:?} unpack"
    );
}

/// A manifest past 4 MiB is refused without being parsed; a valid one
/// of a million layers is parsed in constant space, its last layer picked.
#[tokio::test]
async fn huge_manifests_are_refused_and_many_layers_cost_nothing() {
    let reg_dir = tempfile::tempdir().unwrap();
    let standard = module("many-layers");
    push_image(
        reg_dir.path(),
        "p/many",
        "v1",
        &[(
            "application/vnd.oci.image.layer.v1.tar+gzip",
            tar_gz("plugin.wasm", &standard),
        )],
    );
    // The same image with a million empty layers before its module layer (3 MiB).
    let path = reg_dir.path().join("p/many/manifests/v1");
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let last = serde_json::to_string(&m["layers"][0]).unwrap();
    let mut many = String::from(
        r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":["#,
    );
    many.push_str(&"{},".repeat(1_000_000));
    many.push_str(&last);
    many.push_str("]}");
    std::fs::write(&path, &many).unwrap();
    // And one of 5 MiB.
    let huge_dir = reg_dir.path().join("p/huge/manifests");
    std::fs::create_dir_all(&huge_dir).unwrap();
    let mut huge = many.clone();
    huge.insert_str(1, &format!(r#""pad":"{}","#, "x".repeat(2 << 20)));
    std::fs::write(huge_dir.join("v1"), &huge).unwrap();
    let reg = serve_registry(reg_dir.path()).await;
    let data = tempfile::tempdir().unwrap();
    let mut opts = options(data.path());
    opts.plain_http_registries = vec!["127.0.0.1".into()];
    let cache = wasm::Cache::new(opts, wasm::Metrics::default());
    let p = cache
        .get(&format!("oci://{}/p/many:v1", reg.addr), &request())
        .await
        .unwrap();
    assert_eq!(std::fs::read(p).unwrap(), standard);
    let err = cache
        .get(&format!("oci://{}/p/huge:v1", reg.addr), &request())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("larger than 4194304 bytes"), "{err}");
}

/// An address is judged as the IPv4 address it spells: `[::ffff:169.254.169.254]` and
/// `[::169.254.169.254]` are the metadata service; a configured IPv4 range blocks the mapped
/// spelling of loopback too, and nothing is fetched.
#[tokio::test]
async fn ipv4_in_ipv6_spellings_are_blocked() {
    let files = serve_files(HashMap::from([(
        "/m.wasm".to_string(),
        ("application/wasm".to_string(), module("x")),
    )]))
    .await;
    let data = tempfile::tempdir().unwrap();
    let cache = wasm::Cache::new(options(data.path()), wasm::Metrics::default());
    for url in [
        "http://[::ffff:169.254.169.254]/m.wasm",
        "http://[::169.254.169.254]/m.wasm",
        "http://[fd00:ec2::254]/m.wasm",
        "http://[ff02::1]/m.wasm",
        "http://224.0.0.251/m.wasm",
    ] {
        let err = cache.get(url, &request()).await.unwrap_err().to_string();
        assert!(err.contains("connection blocked"), "{url}: {err}");
    }
    let mut opts = options(data.path());
    opts.blocked_cidrs = vec![("127.0.0.0".parse().unwrap(), 8)];
    let cache = wasm::Cache::new(opts, wasm::Metrics::default());
    let mapped = format!("http://[::ffff:127.0.0.1]:{}/m.wasm", files.addr.port());
    let err = cache
        .get(&mapped, &request())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("blocked CIDR range 127.0.0.0/8"), "{err}");
    // A mapped IPv6 range blocks the IPv4 address.
    let mut opts = options(data.path());
    opts.blocked_cidrs = vec![("::ffff:127.0.0.0".parse().unwrap(), 104)];
    let cache = wasm::Cache::new(opts, wasm::Metrics::default());
    let err = cache
        .get(&format!("http://{}/m.wasm", files.addr), &request())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("blocked CIDR range ::ffff:127.0.0.0/104"),
        "{err}"
    );
    assert_eq!(files.hits("/m.wasm"), 0);
}

/// A redirect is an answer, not an instruction: a 302 towards the metadata service fails the
/// fetch, and the metadata address is never asked.
#[tokio::test]
async fn redirects_are_not_followed() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let mut buf = vec![0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(
                    b"HTTP/1.1 302 Found\r\nlocation: http://169.254.169.254/latest/meta-data\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await;
        }
    });
    let data = tempfile::tempdir().unwrap();
    let cache = wasm::Cache::new(options(data.path()), wasm::Metrics::default());
    let err = cache
        .get(&format!("http://{addr}/m.wasm"), &request())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("status code 302"), "{err}");
    assert_eq!(served.load(Ordering::SeqCst), 1, "asked once, not retried");
}

/// A registry that answers the TLS handshake in plain HTTP is not fetched from over HTTP
/// unless `WASM_PLAIN_HTTP_REGISTRIES` names it (Istio falls back for every registry).
#[tokio::test]
async fn plain_http_registries_only_when_named() {
    let reg_dir = tempfile::tempdir().unwrap();
    let artifact = module("plain");
    push_image(
        reg_dir.path(),
        "p/plain",
        "v1",
        &[
            (
                "application/vnd.module.wasm.content.layer.v1+wasm",
                artifact.clone(),
            ),
            ("application/vnd.oci.image.config.v1+json", b"{}".to_vec()),
        ],
    );
    let reg = serve_registry(reg_dir.path()).await;
    let url = format!("oci://{}/p/plain:v1", reg.addr);
    let data = tempfile::tempdir().unwrap();
    let cache = wasm::Cache::new(options(data.path()), wasm::Metrics::default());
    let err = cache.get(&url, &request()).await.unwrap_err().to_string();
    assert!(err.contains("WASM_PLAIN_HTTP_REGISTRIES"), "{err}");
    assert_eq!(reg.hits("/v2/p/plain/manifests/v1"), 0);
    for named in [reg.addr.to_string(), "127.0.0.1".into(), "*".into()] {
        let mut opts = options(data.path());
        opts.plain_http_registries = vec![named.clone()];
        let cache = wasm::Cache::new(opts, wasm::Metrics::default());
        let p = cache.get(&url, &request()).await.unwrap();
        assert_eq!(std::fs::read(p).unwrap(), artifact, "{named}");
    }
}

/// The disk cache keeps at most `WASM_CACHE_MAX_ENTRIES` modules and `WASM_CACHE_MAX_BYTES`
/// bytes; the module used longest ago goes first, with its file.
#[tokio::test]
async fn the_disk_cache_is_bounded_oldest_first() {
    let mods: Vec<Vec<u8>> = (0..4)
        .map(|i| {
            let mut m = module(&format!("m{i}"));
            m.resize(1000, b'x');
            m
        })
        .collect();
    let files = serve_files(
        mods.iter()
            .enumerate()
            .map(|(i, m)| {
                (
                    format!("/m{i}.wasm"),
                    ("application/wasm".to_string(), m.clone()),
                )
            })
            .collect(),
    )
    .await;
    let url = |i: usize| format!("http://{}/m{i}.wasm", files.addr);
    let data = tempfile::tempdir().unwrap();
    let mut opts = options(data.path());
    opts.max_cache_entries = 2;
    let cache = wasm::Cache::new(opts, wasm::Metrics::default());
    let p0 = cache.get(&url(0), &request()).await.unwrap();
    let p1 = cache.get(&url(1), &request()).await.unwrap();
    // m0 used again: m1 is now the oldest.
    cache.get(&url(0), &request()).await.unwrap();
    let p2 = cache.get(&url(2), &request()).await.unwrap();
    assert_eq!(cache.len(), 2);
    assert!(p0.exists() && p2.exists());
    assert!(!p1.exists(), "the module used longest ago is removed");

    let data = tempfile::tempdir().unwrap();
    let mut opts = options(data.path());
    opts.max_cache_bytes = 2500;
    let cache = wasm::Cache::new(opts, wasm::Metrics::default());
    let paths: Vec<PathBuf> = {
        let mut v = Vec::new();
        for i in 0..4 {
            v.push(cache.get(&url(i), &request()).await.unwrap());
        }
        v
    };
    assert_eq!(cache.len(), 2, "2 × 1000 bytes fit in 2500");
    assert!(!paths[0].exists() && !paths[1].exists());
    assert!(paths[2].exists() && paths[3].exists());
}

/// This process's peak RSS in KiB (`VmHWM`), and a reset of it (`clear_refs` 5).
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn reset_peak_rss() {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

/// A body of `layers` gzip layers around a Wasm module of `size` bytes, built as a stream
/// (the module is never whole in this process).
fn nested_gzip_streamed(size: usize, layers: usize) -> Vec<u8> {
    let mut inner = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    inner.write_all(b"\0asm\x01\0\0\0").unwrap();
    let zeros = vec![0u8; 1 << 20];
    let mut left = size - 8;
    while left > 0 {
        let n = left.min(zeros.len());
        inner.write_all(&zeros[..n]).unwrap();
        left -= n;
    }
    let mut b = inner.finish().unwrap();
    for _ in 1..layers {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&b).unwrap();
        b = gz.finish().unwrap();
    }
    b
}

/// The figures of docs/reliability.md (Wasm rows): run alone, so the peak RSS is this
/// test's. `cargo test -p agent --lib -- --ignored --nocapture --test-threads 1 wasm_figures`
#[tokio::test]
#[ignore = "measurement; prints FIGURE lines"]
#[expect(
    clippy::too_many_lines,
    reason = "a measurement: the numbered figures of docs/reliability.md in turn, in one process so that the peak RSS is this test's"
)]
async fn wasm_figures() {
    // 1. LDS pushed 0.2 s after an ECDS whose module server never answers (istiod's 30 s
    // timeout, Istio's default request timeout and retries).
    let (addr, _) = silent_server().await;
    let mut w = world_with(|_| {}).await;
    let mut client = envoy_client(&w.h.path).await;
    let resource = with_timeout(
        wasm_resource(
            "hangs",
            &format!("http://{addr}/m.wasm"),
            "",
            FailurePolicy::FailClosed,
            false,
        ),
        Duration::from_secs(30),
    );
    let (_tx, mut from_proxy, up) =
        open_sotw(&mut client, &mut w.ads, req(type_url::ECDS, "")).await;
    up.responses
        .send(Ok(ecds("e1", vec![resource])))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pushed = Instant::now();
    up.responses
        .send(Ok(resp(type_url::LISTENER, "l1")))
        .await
        .unwrap();
    let lds = within(&mut from_proxy, Duration::from_secs(60))
        .await
        .unwrap();
    let lds_after = pushed.elapsed();
    assert_eq!(lds.type_url, type_url::LISTENER);
    let ecds_r = within(&mut from_proxy, Duration::from_secs(60))
        .await
        .unwrap();
    println!(
        "FIGURE wasm_lds_beside_hung_fetch lds_after_push={:.3}s ecds_after_push={:.2}s",
        lds_after.as_secs_f64(),
        pushed.elapsed().as_secs_f64() + 0.2
    );
    assert_eq!(ecds_r.type_url, type_url::ECDS);
    drop(w);

    // 2. Eight modules of ~260 MB in two gzip layers, fetched at once.
    let size = 260_000_000;
    let body = nested_gzip_streamed(size, 2);
    let files = serve_files(
        (0..8)
            .map(|i| {
                (
                    format!("/m{i}.wasm"),
                    ("application/wasm".to_string(), body.clone()),
                )
            })
            .collect(),
    )
    .await;
    let data = tempfile::tempdir().unwrap();
    let mut opts = options(data.path());
    opts.max_cache_bytes = u64::MAX;
    let cache = wasm::Cache::new(opts, wasm::Metrics::default());
    let worst = Arc::new(Mutex::new(Duration::ZERO));
    let wt = worst.clone();
    let ticker = tokio::spawn(async move {
        let mut last = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let mut g = wt.lock().unwrap();
            *g = (*g).max(last.elapsed());
            drop(g);
            last = Instant::now();
        }
    });
    let before = peak_rss_kib();
    reset_peak_rss();
    let base = peak_rss_kib();
    let started = Instant::now();
    let fetches = (0..8).map(|i| {
        let (cache, url) = (cache.clone(), format!("http://{}/m{i}.wasm", files.addr));
        async move { cache.get(&url, &request()).await.unwrap() }
    });
    let paths = futures::future::join_all(fetches).await;
    let took = started.elapsed();
    let peak = peak_rss_kib();
    ticker.abort();
    for p in &paths {
        assert_eq!(std::fs::metadata(p).unwrap().len(), size as u64);
    }
    println!(
        "FIGURE wasm_eight_nested_gzip body={} B each, {} modules of {size} B in {:.1}s; runtime thread's longest stall {:?}; peak RSS {} MiB (from {} MiB; {} MiB before the reset)",
        body.len(),
        paths.len(),
        took.as_secs_f64(),
        *worst.lock().unwrap(),
        peak / 1024,
        base / 1024,
        before / 1024
    );
    drop(paths);
    drop(data);

    // 3. A 64 MiB manifest.
    let mut manifest = String::from(r#"{"schemaVersion":2,"layers":["#);
    while manifest.len() < 64 << 20 {
        manifest.push_str(r#"{"mediaType":"a","digest":"b","annotations":{"k":[1,2,3]}},"#);
    }
    manifest.push_str("{}]}");
    let reg = serve_files(HashMap::from([(
        "/v2/p/m/manifests/v1".to_string(),
        (
            "application/vnd.oci.image.manifest.v1+json".to_string(),
            manifest.into_bytes(),
        ),
    )]))
    .await;
    let data = tempfile::tempdir().unwrap();
    let mut opts = options(data.path());
    opts.plain_http_registries = vec!["*".into()];
    let cache = wasm::Cache::new(opts, wasm::Metrics::default());
    reset_peak_rss();
    let base = peak_rss_kib();
    let started = Instant::now();
    let err = cache
        .get(&format!("oci://{}/p/m:v1", reg.addr), &request())
        .await
        .unwrap_err();
    println!(
        "FIGURE wasm_64mib_manifest refused in {:.3}s, peak RSS +{} KiB: {err}",
        started.elapsed().as_secs_f64(),
        peak_rss_kib().saturating_sub(base)
    );
}
