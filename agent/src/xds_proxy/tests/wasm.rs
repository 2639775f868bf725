//! Wasm remote load through the proxy: ECDS pushes with a remote module from a local HTTP
//! server and from a tiny OCI registry (the distribution API served from a directory), with
//! the sha256 matching, mismatching, the fetch failing under each failure policy, the cache
//! hit on the second push, and the NACK of a resource that cannot be converted.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use prost::Message;
use proto::envoy::config::core::v3::{
    AsyncDataSource, HttpUri, RemoteDataSource, TypedExtensionConfig, async_data_source,
    data_source,
};
use proto::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use proto::envoy::extensions::filters::http::wasm::v3::Wasm as HttpWasm;
use proto::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use proto::envoy::extensions::filters::network::wasm::v3::Wasm as NetworkWasm;
use proto::envoy::extensions::wasm::v3::{
    EnvironmentVariables, FailurePolicy, PluginConfig, VmConfig, plugin_config,
};
use proto::google::protobuf::Any;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::xds_proxy::wasm;

/// A module: the Wasm magic number and version, then a custom section's worth of bytes.
fn module(tag: &str) -> Vec<u8> {
    let mut m = b"\0asm\x01\0\0\0".to_vec();
    m.extend_from_slice(tag.as_bytes());
    m
}

fn sha256(b: &[u8]) -> String {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, b)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A static HTTP server: path → (content type, body); counts requests per path.
struct Files {
    addr: std::net::SocketAddr,
    hits: Arc<Mutex<HashMap<String, usize>>>,
}

impl Files {
    fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

async fn serve_files(files: HashMap<String, (String, Vec<u8>)>) -> Files {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(Mutex::new(HashMap::new()));
    let files = Arc::new(files);
    let hits_w = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (files, hits) = (files.clone(), hits_w.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                *hits.lock().unwrap().entry(path.clone()).or_default() += 1;
                // Served from the shared map, never copied (the figures measure the agent's
                // memory, not this server's).
                let (status, ct, body): (u16, &str, &[u8]) = match files.get(&path) {
                    Some((ct, b)) => (200, ct, b),
                    None => (404, "text/plain", b"not found"),
                };
                let h = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: {ct}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(h.as_bytes()).await;
                let _ = s.write_all(body).await;
            });
        }
    });
    Files { addr, hits }
}

/// A registry serving `dir` as the distribution API: `<dir>/<repo>/manifests/<tag>` and
/// `<dir>/<repo>/blobs/sha256:<hex>`.
async fn serve_registry(dir: &Path) -> Files {
    let mut files = HashMap::new();
    for entry in walk(dir) {
        let rel = entry.strip_prefix(dir).unwrap().display().to_string();
        let ct = if rel.contains("/manifests/") {
            "application/vnd.oci.image.manifest.v1+json"
        } else {
            "application/octet-stream"
        };
        files.insert(
            format!("/v2/{rel}"),
            (ct.to_string(), std::fs::read(&entry).unwrap()),
        );
    }
    serve_files(files).await
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Writes an image into a registry directory; returns the manifest's sha256.
fn push_image(dir: &Path, repo: &str, tag: &str, layers: &[(&str, Vec<u8>)]) -> String {
    let blobs = dir.join(repo).join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let mut descs = Vec::new();
    for (media, data) in layers {
        let d = format!("sha256:{}", sha256(data));
        std::fs::write(blobs.join(&d), data).unwrap();
        descs.push(serde_json::json!({"mediaType": media, "digest": d, "size": data.len()}));
    }
    let config = b"{}".to_vec();
    let cd = format!("sha256:{}", sha256(&config));
    std::fs::write(blobs.join(&cd), &config).unwrap();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": config.len()},
        "layers": descs,
    }))
    .unwrap();
    let manifests = dir.join(repo).join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(manifests.join(tag), &manifest).unwrap();
    sha256(&manifest)
}

/// A tar.gz holding one file.
fn tar_gz(name: &str, content: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..107].copy_from_slice(b"0000644");
    h[124..135].copy_from_slice(format!("{:011o}", content.len()).as_bytes());
    h[136..147].copy_from_slice(b"00000000000");
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    let mut tar = h.to_vec();
    tar.extend_from_slice(content);
    tar.resize(tar.len().div_ceil(512) * 512 + 1024, 0);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    gz.finish().unwrap()
}

/// An ECDS resource: an HTTP (or network) Wasm filter loading `uri` with `sha`.
fn wasm_resource(name: &str, uri: &str, sha: &str, policy: FailurePolicy, network: bool) -> Any {
    let mut env = EnvironmentVariables::default();
    env.key_values
        .insert("ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION".into(), "1".into());
    env.key_values.insert("KEEP".into(), "me".into());
    let config = PluginConfig {
        name: name.into(),
        failure_policy: policy as i32,
        vm: Some(plugin_config::Vm::VmConfig(VmConfig {
            runtime: "envoy.wasm.runtime.v8".into(),
            environment_variables: Some(env),
            code: Some(AsyncDataSource {
                specifier: Some(async_data_source::Specifier::Remote(RemoteDataSource {
                    http_uri: Some(HttpUri {
                        uri: uri.into(),
                        ..Default::default()
                    }),
                    sha256: sha.into(),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        })),
        ..Default::default()
    };
    let typed = if network {
        Any {
            type_url: "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm".into(),
            value: NetworkWasm {
                config: Some(config),
            }
            .encode_to_vec(),
        }
    } else {
        Any {
            type_url: "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm".into(),
            value: HttpWasm {
                config: Some(config),
            }
            .encode_to_vec(),
        }
    };
    Any {
        type_url: type_url::ECDS.into(),
        value: TypedExtensionConfig {
            name: name.into(),
            typed_config: Some(typed),
        }
        .encode_to_vec(),
    }
}

fn ecds(nonce: &str, resources: Vec<Any>) -> DiscoveryResponse {
    DiscoveryResponse {
        resources,
        ..resp(type_url::ECDS, nonce)
    }
}

/// What Envoy got for one resource.
enum Got {
    Local {
        path: String,
        env: Option<EnvironmentVariables>,
    },
    Rbac {
        typed: Any,
    },
}

fn got(r: &Any) -> Got {
    let ec = TypedExtensionConfig::decode(&r.value[..]).unwrap();
    let typed = ec.typed_config.unwrap();
    let config = match typed.type_url.as_str() {
        "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm" => {
            HttpWasm::decode(&typed.value[..]).unwrap().config
        }
        "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm" => {
            NetworkWasm::decode(&typed.value[..]).unwrap().config
        }
        _ => return Got::Rbac { typed },
    };
    let Some(plugin_config::Vm::VmConfig(vm)) = config.unwrap().vm else {
        panic!("no vm")
    };
    match vm.code.unwrap().specifier.unwrap() {
        async_data_source::Specifier::Local(d) => match d.specifier.unwrap() {
            data_source::Specifier::Filename(f) => Got::Local {
                path: f,
                env: vm.environment_variables,
            },
            other => panic!("local code not a file: {other:?}"),
        },
        async_data_source::Specifier::Remote(r) => panic!("still remote: {r:?}"),
    }
}

struct World {
    _data: tempfile::TempDir,
    cache: Arc<wasm::Cache>,
    registry: Registry,
    h: Harness,
    ads: FakeAds,
}

async fn world() -> World {
    world_with(|opts| {
        opts.http_max_retries = 2;
        opts.http_timeout = Duration::from_secs(2);
    })
    .await
}

/// [`world`] with the cache's options as `tune` leaves Istio's defaults.
async fn world_with(tune: impl FnOnce(&mut wasm::Options)) -> World {
    let data = tempfile::tempdir().unwrap();
    let mut opts = wasm::Options::new(data.path().join("var/lib/istio/data"));
    // The test registry serves plain HTTP.
    opts.plain_http_registries = vec!["127.0.0.1".into()];
    tune(&mut opts);
    let mut registry = Registry::default();
    let cache = wasm::Cache::new(opts, wasm::Metrics::new(&mut registry));
    let ads = FakeAds::start().await.unwrap();
    let h = proxy_full(
        ads.connect(),
        false,
        None,
        true,
        Streams::One,
        None,
        Some(cache.clone()),
        XdsServer::default(),
    )
    .await;
    World {
        _data: data,
        cache,
        registry,
        h,
        ads,
    }
}

/// Pushes `resources` as one ECDS response and returns what Envoy received.
async fn push(
    w: &mut World,
    client: &mut EnvoyClient,
    resources: Vec<Any>,
) -> (
    DiscoveryResponse,
    UpStream<DiscoveryRequest, DiscoveryResponse>,
    mpsc::Sender<DiscoveryRequest>,
    tonic::Streaming<DiscoveryResponse>,
) {
    let (tx, mut from_proxy, up) = open_sotw(client, &mut w.ads, req(type_url::ECDS, "")).await;
    up.responses.send(Ok(ecds("n1", resources))).await.unwrap();
    let r = from_proxy.message().await.unwrap().unwrap();
    (r, up, tx, from_proxy)
}

#[tokio::test]
async fn http_module_with_matching_sha_is_fetched_cached_and_made_local() {
    let m = module("http-plugin");
    let files = serve_files(HashMap::from([(
        "/plugin.wasm".to_string(),
        ("application/wasm".to_string(), m.clone()),
    )]))
    .await;
    let mut w = world().await;
    let mut client = envoy_client(&w.h.path).await;
    let uri = format!("http://{}/plugin.wasm", files.addr);
    let res = wasm_resource("ext-a", &uri, &sha256(&m), FailurePolicy::FailClosed, false);
    let (r, mut up, tx, mut from_proxy) = push(&mut w, &mut client, vec![res.clone()]).await;
    let Got::Local { path, env } = got(&r.resources[0]) else {
        panic!("not converted")
    };
    assert_eq!(
        std::fs::read(&path).unwrap(),
        m,
        "the local file is the module"
    );
    assert!(path.ends_with(&format!("{}.wasm", sha256(&m))), "{path}");
    // The agent's own VM variables are dropped, the plugin's kept.
    let env = env.expect("the plugin's variables");
    assert_eq!(env.key_values.len(), 1);
    assert_eq!(env.key_values["KEEP"], "me");
    assert_eq!((files.hits("/plugin.wasm"), w.cache.len()), (1, 1));

    // Envoy's ACK passes; the second push of the same module is a cache hit.
    tx.send(DiscoveryRequest {
        version_info: "v-n1".into(),
        ..req(type_url::ECDS, "n1")
    })
    .await
    .unwrap();
    let ack = next(&mut up.requests).await;
    assert!(ack.error_detail.is_none());
    up.responses.send(Ok(ecds("n2", vec![res]))).await.unwrap();
    let r = from_proxy.message().await.unwrap().unwrap();
    let Got::Local { path: again, .. } = got(&r.resources[0]) else {
        panic!("not converted")
    };
    assert_eq!(again, path);
    assert_eq!(files.hits("/plugin.wasm"), 1, "served from the cache");
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &w.registry).unwrap();
    for line in [
        "wasm_cache_entries 1",
        "wasm_cache_lookup_count_total{hit=\"false\"} 1",
        "wasm_cache_lookup_count_total{hit=\"true\"} 1",
        "wasm_remote_fetch_count_total{result=\"success\"} 1",
        "wasm_config_conversion_count_total{result=\"success\"} 2",
        "wasm_config_conversion_duration_count 2",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}:\n{text}");
    }
}

#[tokio::test]
async fn sha_mismatch_and_fetch_failure_follow_the_failure_policy() {
    let m = module("other");
    let files = serve_files(HashMap::from([(
        "/plugin.wasm".to_string(),
        ("application/wasm".to_string(), m.clone()),
    )]))
    .await;
    let mut w = world().await;
    let mut client = envoy_client(&w.h.path).await;
    let good = format!("http://{}/plugin.wasm", files.addr);
    let missing = format!("http://{}/missing.wasm", files.addr);
    let wrong = "0".repeat(64);
    let resources = vec![
        // Mismatch, fail closed: deny all.
        wasm_resource(
            "mismatch-closed",
            &good,
            &wrong,
            FailurePolicy::FailClosed,
            false,
        ),
        // Mismatch, fail open: allow all.
        wasm_resource(
            "mismatch-open",
            &good,
            &wrong,
            FailurePolicy::FailOpen,
            false,
        ),
        // Not found (404), fail closed and open, HTTP and network filters.
        wasm_resource(
            "missing-closed",
            &missing,
            "",
            FailurePolicy::FailClosed,
            false,
        ),
        wasm_resource("missing-open", &missing, "", FailurePolicy::FailOpen, false),
        wasm_resource(
            "missing-net-closed",
            &missing,
            "",
            FailurePolicy::FailClosed,
            true,
        ),
        wasm_resource(
            "missing-net-open",
            &missing,
            "",
            FailurePolicy::FailOpen,
            true,
        ),
    ];
    let (r, ..) = push(&mut w, &mut client, resources).await;
    let want = [
        ("http", false),
        ("http", true),
        ("http", false),
        ("http", true),
        ("network", false),
        ("network", true),
    ];
    for (res, (kind, open)) in r.resources.iter().zip(want) {
        let Got::Rbac { typed } = got(res) else {
            panic!("expected an RBAC fallback")
        };
        let prefix = if open {
            wasm::ALLOW_PREFIX
        } else {
            wasm::DENY_PREFIX
        };
        if kind == "http" {
            assert_eq!(
                typed.type_url,
                "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
            );
            let rbac = HttpRbac::decode(&typed.value[..]).unwrap();
            assert_eq!(rbac.rules.is_some(), !open, "empty rules deny all");
            assert_eq!(rbac.rules_stat_prefix, prefix);
        } else {
            assert_eq!(
                typed.type_url,
                "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC"
            );
            let rbac = NetworkRbac::decode(&typed.value[..]).unwrap();
            assert_eq!(rbac.rules.is_some(), !open);
            assert_eq!(rbac.stat_prefix, prefix);
        }
    }
    assert_eq!(w.cache.len(), 0, "nothing mismatching is cached");
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &w.registry).unwrap();
    for line in [
        "wasm_remote_fetch_count_total{result=\"checksum_mismatched\"} 2",
        "wasm_remote_fetch_count_total{result=\"download_failure\"} 4",
        "wasm_config_conversion_count_total{result=\"fetch_failure\"} 6",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}:\n{text}");
    }
}

#[tokio::test]
async fn oci_images_artifact_and_standard_with_digest_checks_and_cache() {
    let reg_dir = tempfile::tempdir().unwrap();
    let artifact = module("oci-artifact");
    let a_digest = push_image(
        reg_dir.path(),
        "plugins/artifact",
        "v1",
        &[
            (
                "application/vnd.module.wasm.content.layer.v1+wasm",
                artifact.clone(),
            ),
            ("application/vnd.oci.image.config.v1+json", b"{}".to_vec()),
        ],
    );
    let standard = module("oci-standard");
    let s_digest = push_image(
        reg_dir.path(),
        "plugins/standard",
        "v1",
        &[(
            "application/vnd.oci.image.layer.v1.tar+gzip",
            tar_gz("plugin.wasm", &standard),
        )],
    );
    let reg = serve_registry(reg_dir.path()).await;
    let mut w = world().await;
    let mut client = envoy_client(&w.h.path).await;
    let a_uri = format!("oci://{}/plugins/artifact:v1", reg.addr);
    let s_uri = format!("oci://{}/plugins/standard:v1", reg.addr);
    let resources = vec![
        wasm_resource(
            "artifact",
            &a_uri,
            &a_digest,
            FailurePolicy::FailClosed,
            false,
        ),
        // No sha: the manifest's digest becomes the module's checksum.
        wasm_resource("standard", &s_uri, "", FailurePolicy::FailClosed, false),
        // The manifest does not match the sha256 asked for: fail closed.
        wasm_resource(
            "wrong",
            &a_uri,
            &"1".repeat(64),
            FailurePolicy::FailClosed,
            false,
        ),
        // No such tag: fail open.
        wasm_resource(
            "absent",
            &format!("oci://{}/plugins/artifact:v9", reg.addr),
            "",
            FailurePolicy::FailOpen,
            false,
        ),
    ];
    let (r, mut up, tx, mut from_proxy) = push(&mut w, &mut client, resources.clone()).await;
    let local = |i: usize| match got(&r.resources[i]) {
        Got::Local { path, .. } => path,
        Got::Rbac { typed } => panic!("resource {i}: fallback {}", typed.type_url),
    };
    assert_eq!(std::fs::read(local(0)).unwrap(), artifact);
    assert!(local(0).ends_with(&format!("{a_digest}.wasm")));
    assert_eq!(std::fs::read(local(1)).unwrap(), standard);
    assert!(local(1).ends_with(&format!("{s_digest}.wasm")));
    let rbac = |i: usize| match got(&r.resources[i]) {
        Got::Rbac { typed } => HttpRbac::decode(&typed.value[..]).unwrap(),
        Got::Local { path, .. } => panic!("resource {i} converted to {path}"),
    };
    assert_eq!(rbac(2).rules_stat_prefix, wasm::DENY_PREFIX);
    assert_eq!(rbac(3).rules_stat_prefix, wasm::ALLOW_PREFIX);
    let manifest = "/v2/plugins/artifact/manifests/v1";
    let blob = format!("/v2/plugins/artifact/blobs/sha256:{}", sha256(&artifact));
    let (m_hits, b_hits) = (reg.hits(manifest), reg.hits(&blob));
    assert_eq!(b_hits, 1, "the layer is fetched once");

    // Second push: both cached; nothing more from the registry for them.
    tx.send(DiscoveryRequest {
        version_info: "v-n1".into(),
        ..req(type_url::ECDS, "n1")
    })
    .await
    .unwrap();
    let _ack = next(&mut up.requests).await;
    up.responses
        .send(Ok(ecds("n2", resources[..2].to_vec())))
        .await
        .unwrap();
    let r2 = from_proxy.message().await.unwrap().unwrap();
    for (i, res) in r2.resources.iter().enumerate() {
        let Got::Local { path, .. } = got(res) else {
            panic!("resource {i} not converted")
        };
        assert_eq!(Some(path), Some(local(i)));
    }
    assert_eq!(reg.hits(manifest), m_hits, "cache hit: no manifest fetch");
    assert_eq!(reg.hits(&blob), b_hits);
    assert_eq!(w.cache.len(), 2);
}

/// A Wasm filter with neither remote nor local code cannot be converted: the proxy NACKs the
/// response upstream with the last version Envoy acknowledged, and Envoy never sees it.
#[tokio::test]
async fn an_unconvertible_resource_nacks_the_response() {
    let mut w = world().await;
    let mut client = envoy_client(&w.h.path).await;
    let (tx, mut from_proxy, mut up) =
        open_sotw(&mut client, &mut w.ads, req(type_url::ECDS, "")).await;
    // A resource without Wasm passes as it is, and Envoy ACKs it.
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
    up.responses
        .send(Ok(ecds("n1", vec![plain.clone()])))
        .await
        .unwrap();
    let r = from_proxy.message().await.unwrap().unwrap();
    assert_eq!(r.resources, vec![plain]);
    tx.send(DiscoveryRequest {
        version_info: "v-n1".into(),
        ..req(type_url::ECDS, "n1")
    })
    .await
    .unwrap();
    let _ack = next(&mut up.requests).await;

    let no_code = Any {
        type_url: type_url::ECDS.into(),
        value: TypedExtensionConfig {
            name: "broken".into(),
            typed_config: Some(Any {
                type_url: "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm".into(),
                value: HttpWasm {
                    config: Some(PluginConfig {
                        vm: Some(plugin_config::Vm::VmConfig(VmConfig::default())),
                        ..Default::default()
                    }),
                }
                .encode_to_vec(),
            }),
        }
        .encode_to_vec(),
    };
    up.responses
        .send(Ok(ecds("n2", vec![no_code])))
        .await
        .unwrap();
    let nack = next(&mut up.requests).await;
    assert_eq!(nack.type_url, type_url::ECDS);
    assert_eq!(nack.response_nonce, "n2");
    assert_eq!(nack.version_info, "v-n1", "the last version Envoy accepted");
    let detail = nack.error_detail.expect("a NACK");
    assert!(
        detail.message.contains("no remote and local load"),
        "{}",
        detail.message
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), from_proxy.message())
            .await
            .is_err(),
        "Envoy gets nothing"
    );
}

/// With the conversion off (`ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION=false`), ECDS
/// passes as istiod sent it.
#[tokio::test]
async fn conversion_off_relays_remote_wasm_as_is() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy(ads.connect(), false).await;
    let mut client = envoy_client(&h.path).await;
    let (_tx, mut from_proxy, up) = open_sotw(&mut client, &mut ads, req(type_url::ECDS, "")).await;
    let res = wasm_resource(
        "x",
        "http://127.0.0.1:9/p.wasm",
        "",
        FailurePolicy::FailClosed,
        false,
    );
    up.responses
        .send(Ok(ecds("n1", vec![res.clone()])))
        .await
        .unwrap();
    let r = from_proxy.message().await.unwrap().unwrap();
    assert_eq!(r.resources, vec![res]);
}

/// The cache's keys and eviction, directly: a URL without a sha remembers the checksum it had
/// per resource version (a new version with `Always` fetches again, `IfNotPresent` does not),
/// and a module unused past `WASM_MODULE_EXPIRY` is purged with its file.
#[tokio::test]
async fn cache_remembers_checksums_per_resource_version_and_purges_expired_modules() {
    let m = module("cached");
    let files = serve_files(HashMap::from([(
        "/m.wasm".to_string(),
        ("application/wasm".to_string(), m.clone()),
    )]))
    .await;
    let data = tempfile::tempdir().unwrap();
    let mut opts = wasm::Options::new(data.path().to_path_buf());
    opts.module_expiry = Duration::from_secs(60);
    let cache = wasm::Cache::new(opts, wasm::Metrics::default());
    let url = format!("http://{}/m.wasm", files.addr);
    let request = |version: &str, policy| wasm::Request {
        resource_name: "ext".into(),
        resource_version: version.into(),
        timeout: Duration::from_secs(5),
        pull_policy: policy,
        ..Default::default()
    };
    let first = cache
        .get(&url, &request("1", wasm::PullPolicy::Unspecified))
        .await
        .unwrap();
    assert_eq!(std::fs::read(&first).unwrap(), m);
    let same = cache
        .get(&url, &request("1", wasm::PullPolicy::Always))
        .await
        .unwrap();
    assert_eq!((same.clone(), files.hits("/m.wasm")), (first.clone(), 1));
    // A new resource version: `IfNotPresent` keeps the module, `Always` fetches again.
    cache
        .get(&url, &request("2", wasm::PullPolicy::IfNotPresent))
        .await
        .unwrap();
    assert_eq!(files.hits("/m.wasm"), 1);
    cache
        .get(&url, &request("3", wasm::PullPolicy::Always))
        .await
        .unwrap();
    assert_eq!(files.hits("/m.wasm"), 2);
    // A bad URL is an error naming it.
    let err = cache
        .get(
            "ftp://x/m.wasm",
            &request("1", wasm::PullPolicy::Unspecified),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("ftp://x/m.wasm"), "{err}");

    // Unused for less than the expiry: kept; for longer: purged with its file.
    cache.purge(std::time::Instant::now() + Duration::from_secs(30));
    assert_eq!(cache.len(), 1);
    cache.purge(std::time::Instant::now() + Duration::from_secs(61));
    assert!(cache.is_empty());
    assert!(!first.exists(), "the module's file is removed");
    cache
        .get(&url, &request("3", wasm::PullPolicy::Unspecified))
        .await
        .unwrap();
    assert_eq!(files.hits("/m.wasm"), 3, "fetched again after the purge");
}

/// Link-local and cloud metadata addresses are never fetched from, nor `BLOCKED_CIDRS_IN_WASM_FETCH`.
#[tokio::test]
async fn blocked_addresses_are_not_fetched() {
    let files = serve_files(HashMap::from([(
        "/m.wasm".to_string(),
        ("application/wasm".to_string(), module("x")),
    )]))
    .await;
    let data = tempfile::tempdir().unwrap();
    let mut opts = wasm::Options::new(data.path().to_path_buf());
    opts.blocked_cidrs = vec![("127.0.0.0".parse().unwrap(), 8)];
    let cache = wasm::Cache::new(opts, wasm::Metrics::default());
    let req = wasm::Request {
        timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let err = cache
        .get(&format!("http://{}/m.wasm", files.addr), &req)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("blocked CIDR range 127.0.0.0/8"),
        "{err}"
    );
    let err = cache
        .get("http://169.254.169.254/latest/m.wasm", &req)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("link-local"), "{err}");
    assert_eq!(files.hits("/m.wasm"), 0);
}

/// An HTTPS server with a self-signed certificate answering every request with `body`.
async fn https_module(body: Vec<u8>) -> (std::net::SocketAddr, Arc<Mutex<usize>>) {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.cert.der().clone()],
            rustls_pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into()),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(Mutex::new(0));
    let (body, count) = (Arc::new(body), served.clone());
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let (acceptor, body, count) = (acceptor.clone(), body.clone(), count.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(s).await else {
                    return;
                };
                let mut buf = vec![0u8; 4096];
                let _ = tls.read(&mut buf).await;
                *count.lock().unwrap() += 1;
                let h = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = tls.write_all(h.as_bytes()).await;
                let _ = tls.write_all(&body).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (addr, served)
}

/// HTTPS: a server whose certificate the system's roots do not vouch for is refused (its
/// module never fetched); listed in `WASM_INSECURE_REGISTRIES` (as `host:port`, or `*`) it is
/// fetched without verification.
#[tokio::test]
async fn https_modules_are_verified_unless_the_host_is_insecure() {
    let m = module("https");
    let (addr, served) = https_module(m.clone()).await;
    let url = format!("https://{addr}/m.wasm");
    let req = wasm::Request {
        checksum: sha256(&m),
        timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let data = tempfile::tempdir().unwrap();
    let mut opts = wasm::Options::new(data.path().to_path_buf());
    opts.http_max_retries = 1;
    let strict = wasm::Cache::new(opts.clone(), wasm::Metrics::default());
    let err = strict.get(&url, &req).await.unwrap_err().to_string();
    assert!(
        err.contains("TLS handshake") || err.contains("no system root"),
        "{err}"
    );
    assert_eq!(
        *served.lock().unwrap(),
        0,
        "nothing served to an unverified peer"
    );
    for insecure in [addr.to_string(), "*".to_string()] {
        let mut o = opts.clone();
        o.insecure_registries = vec![insecure.clone()];
        let cache = wasm::Cache::new(o, wasm::Metrics::default());
        let path = cache.get(&url, &req).await.unwrap();
        assert_eq!(std::fs::read(path).unwrap(), m, "{insecure}");
    }
}

mod hostile;
