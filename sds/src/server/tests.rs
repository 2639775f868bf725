use std::collections::HashMap;
use std::sync::Arc;

use proto::envoy::config::core::v3::Node;
use proto::envoy::service::secret::v3::secret_discovery_service_client::SecretDiscoveryServiceClient;
use proto::google::rpc::Status as RpcStatus;
use tokio::net::UnixStream;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};

use super::*;
use crate::testing::{Answer, FakeCa};
use crate::{Config, KeyAlgorithm, Metrics};

const WAIT: Duration = Duration::from_secs(20);

struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    base: PathBuf,
    manager: SecretManager,
    shutdown: CancellationToken,
    server: JoinHandle<Result<(), Error>>,
}

/// A server for workload `ns1/sa1` (ECDSA P-256) signed by `ca`; `tweak` changes the config.
async fn start(ca: &FakeCa, tweak: impl FnOnce(&mut Config)) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join(crate::config::paths::ISTIO_ROOT);
    std::fs::create_dir_all(root.parent().expect("p")).expect("mkdir");
    std::fs::write(&root, &ca.tls_root_pem).expect("root");
    let mut cfg = Config {
        ca_addr: ca.ca_addr(),
        ca_server_name: "istiod.istio-system.svc".into(),
        namespace: "ns1".into(),
        service_account: "sa1".into(),
        key_algorithm: KeyAlgorithm::EcdsaP256,
        ..Config::defaults(dir.path())
    };
    tweak(&mut cfg);
    std::fs::create_dir_all(cfg.token_path.parent().expect("p")).expect("mkdir");
    std::fs::write(&cfg.token_path, "tok").expect("token");
    let path = cfg.socket_path.clone();
    // The socket's directory exists as a kubelet makes an emptyDir (0777), and a stale file
    // where the socket goes must be replaced.
    std::fs::create_dir_all(path.parent().expect("p")).expect("mkdir");
    std::fs::set_permissions(
        path.parent().expect("p"),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .expect("chmod");
    std::fs::write(&path, b"stale").expect("stale");
    let mut reg = prometheus_client::registry::Registry::default();
    let manager =
        SecretManager::new(Arc::new(cfg), Arc::new(Metrics::new(&mut reg))).expect("manager");
    let server = SdsServer::bind(&path, manager.clone()).await.expect("bind");
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(server.run(shutdown.clone()));
    Fixture {
        base: dir.path().to_path_buf(),
        _dir: dir,
        path,
        manager,
        shutdown,
        server,
    }
}

async fn client(path: &Path) -> SecretDiscoveryServiceClient<Channel> {
    let path = path.to_path_buf();
    let ch = Endpoint::try_from("http://sds.local")
        .expect("endpoint")
        .connect_with_connector(tower::service_fn(move |_| {
            let p = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(UnixStream::connect(p).await?))
            }
        }))
        .await
        .expect("connect over UDS");
    SecretDiscoveryServiceClient::new(ch)
}

struct Sotw {
    tx: mpsc::Sender<DiscoveryRequest>,
    rx: Streaming<DiscoveryResponse>,
}

impl Sotw {
    async fn open(path: &Path) -> Sotw {
        let (tx, rx) = mpsc::channel(8);
        let rx = client(path)
            .await
            .stream_secrets(ReceiverStream::new(rx))
            .await
            .expect("stream")
            .into_inner();
        Sotw { tx, rx }
    }
    async fn send(&self, names: &[&str], nonce: &str, version: &str, nack: bool) {
        let req = DiscoveryRequest {
            node: Some(Node {
                id: "sidecar~1.2.3.4~x.ns~ns.svc.cluster.local".into(),
                ..Default::default()
            }),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            type_url: proto::type_url::SECRET.to_string(),
            response_nonce: nonce.to_string(),
            version_info: version.to_string(),
            error_detail: nack.then(|| RpcStatus {
                code: 3,
                message: "bad secret".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.tx.send(req).await.expect("send");
    }
    async fn next(&mut self) -> DiscoveryResponse {
        tokio::time::timeout(WAIT, self.rx.message())
            .await
            .expect("a response in time")
            .expect("stream ok")
            .expect("stream open")
    }
}

fn secrets(resp: &DiscoveryResponse) -> Vec<Secret> {
    assert_eq!(resp.type_url, proto::type_url::SECRET);
    resp.resources
        .iter()
        .map(|a| proto::unpack::<Secret>(a).expect("a Secret"))
        .collect()
}

fn names(resp: &DiscoveryResponse) -> Vec<String> {
    secrets(resp).into_iter().map(|s| s.name).collect()
}

fn cert_chain(s: &Secret) -> Vec<u8> {
    match &s.r#type {
        Some(secret::Type::TlsCertificate(t)) => match t
            .certificate_chain
            .as_ref()
            .and_then(|d| d.specifier.clone())
        {
            Some(Specifier::InlineBytes(b)) => b,
            other => panic!("not inline bytes: {other:?}"),
        },
        other => panic!("not a tls_certificate: {other:?}"),
    }
}

#[tokio::test]
async fn socket_permissions_and_stale_file() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let ca = FakeCa::start();
    let f = start(&ca, |_| {}).await;
    let meta = std::fs::metadata(&f.path).expect("socket");
    assert!(
        meta.file_type().is_socket(),
        "stale regular file replaced by the socket"
    );
    assert_eq!(meta.permissions().mode() & 0o007, 0, "no access for others");
    let dir = std::fs::metadata(f.path.parent().expect("p")).expect("dir");
    assert_eq!(
        dir.permissions().mode() & 0o777,
        0o777,
        "an existing directory (the kubelet's emptyDir) is left as it is"
    );
    f.shutdown.cancel();
    f.server.await.expect("join").expect("clean shutdown");
    assert!(!f.path.exists(), "socket removed at shutdown");
}

#[tokio::test]
async fn missing_socket_directory_is_created_0750() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = Config::defaults(dir.path());
    let path = dir.path().join("a/b/socket");
    let mut reg = prometheus_client::registry::Registry::default();
    let manager =
        SecretManager::new(Arc::new(cfg), Arc::new(Metrics::new(&mut reg))).expect("manager");
    let server = SdsServer::bind(&path, manager).await.expect("bind");
    let mode = std::fs::metadata(dir.path().join("a/b"))
        .expect("dir")
        .permissions()
        .mode();
    assert_eq!(mode & 0o700, 0o700, "the owner has the directory");
    assert_eq!(
        mode & 0o027,
        0,
        "0750: not writable by the group, nothing for others"
    );
    drop(server);
}

#[tokio::test]
async fn sotw_ack_nack_and_added_names() {
    let ca = FakeCa::start();
    let f = start(&ca, |_| {}).await;
    let mut s = Sotw::open(&f.path).await;
    s.send(&["default"], "", "", false).await;
    let r1 = s.next().await;
    assert_eq!(names(&r1), vec!["default"]);
    let sec = &secrets(&r1)[0];
    let item = f.manager.fetch("default").await.expect("cached");
    assert_eq!(cert_chain(sec), item.cert_chain_pem);
    assert!(
        r1.version_info.contains('/') && r1.version_info.contains('T'),
        "{}",
        r1.version_info
    );
    assert!(!r1.nonce.is_empty());

    // ACK: no response. NACK: no response. Then an ACK adding ROOTCA answers ROOTCA only,
    // so the next message proves nothing was sent for the ACK or the NACK.
    s.send(&["default"], &r1.nonce, &r1.version_info, false)
        .await;
    s.send(&["default"], &r1.nonce, &r1.version_info, true)
        .await;
    s.send(&["default", "ROOTCA"], &r1.nonce, &r1.version_info, false)
        .await;
    let r2 = s.next().await;
    assert_eq!(names(&r2), vec!["ROOTCA"]);
    match &secrets(&r2)[0].r#type {
        Some(secret::Type::ValidationContext(v)) => {
            assert_eq!(
                v.trusted_ca.as_ref().and_then(|d| d.specifier.clone()),
                Some(Specifier::InlineBytes(ca.signing_root_pem().into_bytes()))
            );
        }
        other => panic!("ROOTCA must be a validation context: {other:?}"),
    }
    assert_ne!(r2.nonce, r1.nonce);
    assert_ne!(r2.version_info, r1.version_info);

    // A request carrying a stale nonce is ignored.
    s.send(
        &["default", "ROOTCA", "file-root:nope"],
        &r1.nonce,
        "",
        false,
    )
    .await;
    // Unsubscribe everything, then subscribe default again: answered with default.
    s.send(&[], &r2.nonce, &r2.version_info, false).await;
    s.send(&["default"], &r2.nonce, &r2.version_info, false)
        .await;
    let r3 = s.next().await;
    assert_eq!(names(&r3), vec!["default"]);
    assert_eq!(ca.received().len(), 1, "one CSR served all of it");
}

#[tokio::test]
async fn rotation_pushes_only_to_streams_watching_the_name() {
    let ca = FakeCa::start();
    let f = start(&ca, |c| {
        c.secret_ttl = Duration::from_secs(4);
        c.grace_ratio_jitter = 0.0;
    })
    .await;
    let mut a = Sotw::open(&f.path).await;
    let mut b = Sotw::open(&f.path).await;
    a.send(&["default"], "", "", false).await;
    b.send(&["ROOTCA"], "", "", false).await;
    let a1 = a.next().await;
    let b1 = b.next().await;
    assert_eq!(names(&b1), vec!["ROOTCA"]);
    a.send(&["default"], &a1.nonce, &a1.version_info, false)
        .await;
    b.send(&["ROOTCA"], &b1.nonce, &b1.version_info, false)
        .await;

    // ~2 s later the cert rotates: stream A gets the new cert without asking.
    let a2 = a.next().await;
    assert_eq!(names(&a2), vec!["default"]);
    assert_ne!(cert_chain(&secrets(&a2)[0]), cert_chain(&secrets(&a1)[0]));
    // Stream B watched ROOTCA only and the root did not change: its next message is the
    // answer to adding `default`, nothing else.
    b.send(&["ROOTCA", "default"], &b1.nonce, &b1.version_info, false)
        .await;
    let b2 = b.next().await;
    assert_eq!(names(&b2), vec!["default"]);
}

#[tokio::test]
async fn ca_failure_keeps_the_stream_open_and_answers_later() {
    let ca = FakeCa::start();
    ca.set_default_answer(Answer::Fail(tonic::Code::PermissionDenied));
    let f = start(&ca, |_| {}).await;
    let mut s = Sotw::open(&f.path).await;
    s.send(&["default"], "", "", false).await;
    // The SDS side keeps retrying (500 ms backoff) while the stream stays open.
    tokio::time::timeout(WAIT, ca.wait_received(2))
        .await
        .expect("retried");
    ca.set_default_answer(Answer::Sign);
    let r = s.next().await;
    assert_eq!(names(&r), vec!["default"]);
}

#[tokio::test]
async fn delta_subscribe_unsubscribe_and_initial_versions() {
    let ca = FakeCa::start();
    let f = start(&ca, |_| {}).await;
    let (tx, rx) = mpsc::channel(8);
    let mut resp = client(&f.path)
        .await
        .delta_secrets(ReceiverStream::new(rx))
        .await
        .expect("delta")
        .into_inner();
    let mut next = async || {
        tokio::time::timeout(WAIT, resp.message())
            .await
            .expect("in time")
            .expect("ok")
            .expect("open")
    };
    let sub = |names: &[&str], unsub: &[&str], nonce: &str| DeltaDiscoveryRequest {
        type_url: proto::type_url::SECRET.to_string(),
        resource_names_subscribe: names.iter().map(|s| s.to_string()).collect(),
        resource_names_unsubscribe: unsub.iter().map(|s| s.to_string()).collect(),
        response_nonce: nonce.to_string(),
        ..Default::default()
    };
    tx.send(sub(&["default", "ROOTCA"], &[], ""))
        .await
        .expect("send");
    let mut got: HashMap<String, String> = HashMap::new();
    while got.len() < 2 {
        let r = next().await;
        assert_eq!(r.type_url, proto::type_url::SECRET);
        for res in &r.resources {
            let s: Secret =
                proto::unpack(res.resource.as_ref().expect("resource")).expect("Secret");
            assert_eq!(s.name, res.name);
            got.insert(res.name.clone(), res.version.clone());
        }
        tx.send(sub(&[], &[], &r.nonce)).await.expect("ack");
    }
    assert!(got.contains_key("default") && got.contains_key("ROOTCA"));

    // A new stream that already has both (initial_resource_versions) gets nothing for them;
    // its first message answers the name it adds.
    std::fs::write(f.base.join("extra.pem"), ca.signing_root_pem()).expect("w");
    let (tx2, rx2) = mpsc::channel(8);
    let mut resp2 = client(&f.path)
        .await
        .delta_secrets(ReceiverStream::new(rx2))
        .await
        .expect("delta")
        .into_inner();
    tx2.send(DeltaDiscoveryRequest {
        type_url: proto::type_url::SECRET.to_string(),
        initial_resource_versions: got.clone(),
        ..Default::default()
    })
    .await
    .expect("send");
    tx2.send(sub(&["file-root:extra.pem"], &["ROOTCA"], ""))
        .await
        .expect("send");
    let r = tokio::time::timeout(WAIT, resp2.message())
        .await
        .expect("in time")
        .expect("ok")
        .expect("open");
    let names: Vec<_> = r.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, vec!["file-root:extra.pem"]);
}

#[tokio::test(start_paused = true)]
async fn a_connection_without_a_stream_is_closed_and_an_open_stream_is_kept() {
    use tokio::io::AsyncReadExt;
    let ca = FakeCa::start();
    let f = start(&ca, |_| {}).await;
    let limits = proto::listen::idle::UNIX_SOCKET_LIMITS;

    // A peer that connects and never sends the HTTP/2 preface is closed at the deadline
    // (whatever the server wrote first: its SETTINGS).
    let mut silent = UnixStream::connect(&f.path).await.expect("connect");
    let start = tokio::time::Instant::now();
    let mut seen = Vec::new();
    let _ = tokio::time::timeout(limits.first_stream * 3, silent.read_to_end(&mut seen))
        .await
        .expect("closed by the server");
    let took = start.elapsed();
    assert!(
        took >= limits.first_stream && took < limits.first_stream + Duration::from_secs(1),
        "closed after {took:?}"
    );

    // A well-behaved client: its stream stays open across ten times the idle limit, and is
    // still answered. (File-backed names: the fake CA runs on real time, this test on paused.)
    std::fs::write(f.base.join("a.pem"), ca.signing_root_pem()).expect("w");
    std::fs::write(f.base.join("b.pem"), ca.signing_root_pem()).expect("w");
    let mut s = Sotw::open(&f.path).await;
    s.send(&["file-root:a.pem"], "", "", false).await;
    let r = s.next().await;
    assert_eq!(names(&r), vec!["file-root:a.pem"]);
    let quiet = tokio::time::timeout(limits.idle * 10, s.rx.message()).await;
    assert!(quiet.is_err(), "stream still open: {quiet:?}");
    s.send(
        &["file-root:a.pem", "file-root:b.pem"],
        &r.nonce,
        &r.version_info,
        false,
    )
    .await;
    assert_eq!(names(&s.next().await), vec!["file-root:b.pem"]);
}

/// A socket path past the 108-byte `sun_path` limit (a deep working directory) is bound as
/// Istio binds it, and the SDS server answers on it.
#[tokio::test]
async fn socket_path_past_sun_path_is_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = Config::defaults(dir.path());
    let path = dir
        .path()
        .join("d".repeat(70))
        .join("var/run/secrets/workload-spiffe-uds/socket");
    assert!(path.as_os_str().len() > 108);
    let mut reg = prometheus_client::registry::Registry::default();
    let manager =
        SecretManager::new(Arc::new(cfg), Arc::new(Metrics::new(&mut reg))).expect("manager");
    let server = SdsServer::bind(&path, manager).await.expect("bind");
    assert!(path.exists());
    let token = CancellationToken::new();
    let served = tokio::spawn(server.run(token.clone()));
    // An HTTP/2 server answers the client preface with its SETTINGS.
    let probe = path.clone();
    let check = tokio::task::spawn_blocking(move || {
        crate::external::check_socket(&probe, Duration::from_secs(2))
    });
    assert_eq!(
        check.await.expect("join").expect("check"),
        crate::external::SocketCheck::Healthy
    );
    token.cancel();
    served.await.expect("join").expect("clean shutdown");
}

#[tokio::test]
async fn a_request_over_the_name_cap_is_refused_and_one_at_the_cap_is_served() {
    use super::stream::MAX_WATCHED_NAMES;
    let ca = FakeCa::start();
    let f = start(&ca, |_| {}).await;
    // The workload certificate first: every other name is then served from it at once.
    let mut first = Sotw::open(&f.path).await;
    first.send(&["default"], "", "", false).await;
    assert_eq!(names(&first.next().await), vec!["default"]);
    let credential = |i: usize| format!("gateway-credential-{i}");

    // cap + 1 names: RESOURCE_EXHAUSTED naming the cap, and the stream ends.
    let over: Vec<String> = (0..=MAX_WATCHED_NAMES).map(credential).collect();
    let over: Vec<&str> = over.iter().map(String::as_str).collect();
    let mut s = Sotw::open(&f.path).await;
    s.send(&over, "", "", false).await;
    let status = tokio::time::timeout(WAIT, s.rx.message())
        .await
        .expect("an answer in time")
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .contains(&format!("{}", MAX_WATCHED_NAMES + 1))
            && status
                .message()
                .contains(&format!("at most {MAX_WATCHED_NAMES}")),
        "{}",
        status.message()
    );

    // Exactly cap names on a new stream: every one answered (over several responses).
    let at: Vec<String> = (0..MAX_WATCHED_NAMES).map(credential).collect();
    let at_refs: Vec<&str> = at.iter().map(String::as_str).collect();
    let mut s = Sotw::open(&f.path).await;
    s.send(&at_refs, "", "", false).await;
    let mut got = std::collections::HashSet::new();
    while got.len() < MAX_WATCHED_NAMES {
        got.extend(names(&s.next().await));
    }
    assert_eq!(got, at.into_iter().collect());

    // FetchSecrets is bounded the same way.
    let req = |n: usize| DiscoveryRequest {
        resource_names: (0..n).map(credential).collect(),
        type_url: proto::type_url::SECRET.to_string(),
        ..Default::default()
    };
    let mut c = client(&f.path).await;
    let status = c
        .fetch_secrets(req(MAX_WATCHED_NAMES + 1))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let served = c.fetch_secrets(req(3)).await.expect("served").into_inner();
    assert_eq!(secrets(&served).len(), 3);
}
