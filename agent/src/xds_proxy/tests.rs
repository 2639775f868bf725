use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use prometheus_client::registry::Registry;
use proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use proto::istio::nds::NameTable;
use proto::istio::nds::name_table::NameInfo;
use proto::type_url;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::fake::FakeAds;
use super::*;
use crate::config::XdsServer;

struct Harness {
    _dir: tempfile::TempDir,
    path: PathBuf,
    proxy: XdsProxy,
    token: CancellationToken,
    metrics: Metrics,
    tables: Arc<std::sync::Mutex<Vec<NameTable>>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

async fn proxy(connect: Connect, nds: bool) -> Harness {
    proxy_with_health(connect, nds, None).await
}

async fn proxy_with_health(
    connect: Connect,
    nds: bool,
    health: Option<tokio::sync::watch::Receiver<Option<crate::health::Health>>>,
) -> Harness {
    proxy_with(connect, nds, health, true).await
}

/// `reconnect: false` is Istio's behaviour (`XDS_PROXY_RECONNECT=false`).
async fn proxy_with(
    connect: Connect,
    nds: bool,
    health: Option<tokio::sync::watch::Receiver<Option<crate::health::Health>>>,
    reconnect: bool,
) -> Harness {
    proxy_streams(connect, nds, health, reconnect, Streams::One).await
}

/// [`proxy_with`] serving `streams` downstream streams at once.
async fn proxy_streams(
    connect: Connect,
    nds: bool,
    health: Option<tokio::sync::watch::Receiver<Option<crate::health::Health>>>,
    reconnect: bool,
    streams: Streams,
) -> Harness {
    proxy_full(
        connect,
        nds,
        health,
        reconnect,
        streams,
        None,
        None,
        XdsServer::default(),
    )
    .await
}

/// [`proxy_streams`] with the optional parts: a PCDS sink (`PROXY_CONFIG_XDS_AGENT`), the Wasm
/// remote load conversion's cache, the XDS socket server's settings.
#[allow(clippy::too_many_arguments)]
async fn proxy_full(
    connect: Connect,
    nds: bool,
    health: Option<tokio::sync::watch::Receiver<Option<crate::health::Health>>>,
    reconnect: bool,
    streams: Streams,
    pcds: Option<PcdsSink>,
    wasm: Option<Arc<crate::xds_proxy::wasm::Cache>>,
    server: XdsServer,
) -> Harness {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("debug,h2=info,hyper=info,tower=info")
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("etc/istio/proxy/XDS");
    let listener = bind_uds(&path).unwrap();
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let tables = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink_tables = tables.clone();
    let sink: NdsSink = Arc::new(move |t: NameTable| {
        if t.table.contains_key("reject.me") {
            return Err("table rejected".into());
        }
        sink_tables.lock().unwrap().push(t);
        Ok(())
    });
    let proxy = XdsProxy::new(Inputs {
        upstream: Upstream {
            connect,
            metadata: vec![
                ("ClusterID".into(), "Kubernetes".into()),
                ("X-Extra".into(), "yes".into()),
            ],
            token: Arc::new(|| Some("tok123".into())),
            probe: None,
            knock: None,
        },
        nds: nds.then_some(sink),
        pcds,
        metrics: metrics.clone(),
        health,
        queue: 1,
        reconnect,
        open_timeout: Duration::from_secs(5),
        streams,
        wasm,
        server,
    });
    let token = CancellationToken::new();
    tokio::spawn(serve(proxy.clone(), listener, token.clone()));
    Harness {
        _dir: dir,
        path,
        proxy,
        token,
        metrics,
        tables,
    }
}

async fn envoy_client(path: &Path) -> EnvoyClient {
    AggregatedDiscoveryServiceClient::new(uds_channel(path).await)
        .max_decoding_message_size(usize::MAX)
}

async fn uds_channel(path: &Path) -> tonic::transport::Channel {
    let path = path.to_path_buf();
    tonic::transport::Endpoint::from_static("http://xds")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
        .unwrap()
}

type EnvoyClient = AggregatedDiscoveryServiceClient<tonic::transport::Channel>;
type UpStream<Req, Resp> = fake::FakeStream<Req, Resp>;

/// Envoy opens a SotW stream whose first request is `first`; returns Envoy's request sender and
/// response stream, and the upstream stream the proxy opened (`first` read from it).
async fn open_sotw(
    client: &mut EnvoyClient,
    ads: &mut FakeAds,
    first: DiscoveryRequest,
) -> (
    mpsc::Sender<DiscoveryRequest>,
    tonic::Streaming<DiscoveryResponse>,
    UpStream<DiscoveryRequest, DiscoveryResponse>,
) {
    let (tx, rx) = mpsc::channel(8);
    tx.send(first.clone()).await.unwrap();
    let from_proxy = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut up = next(&mut ads.sotw).await;
    assert_eq!(next(&mut up.requests).await, first);
    (tx, from_proxy, up)
}

/// [`open_sotw`] for Delta.
async fn open_delta(
    client: &mut EnvoyClient,
    ads: &mut FakeAds,
    first: DeltaDiscoveryRequest,
) -> (
    mpsc::Sender<DeltaDiscoveryRequest>,
    tonic::Streaming<DeltaDiscoveryResponse>,
    UpStream<DeltaDiscoveryRequest, DeltaDiscoveryResponse>,
) {
    let (tx, rx) = mpsc::channel(8);
    tx.send(first.clone()).await.unwrap();
    let from_proxy = client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut up = next(&mut ads.delta).await;
    assert_eq!(next(&mut up.requests).await, first);
    (tx, from_proxy, up)
}

fn req(t: &str, nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: t.into(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

fn resp(t: &str, nonce: &str) -> DiscoveryResponse {
    DiscoveryResponse {
        type_url: t.into(),
        nonce: nonce.into(),
        version_info: format!("v-{nonce}"),
        ..Default::default()
    }
}

fn table(host: &str) -> NameTable {
    let mut t = NameTable::default();
    t.table.insert(
        host.into(),
        NameInfo {
            ips: vec!["198.18.0.10".into()],
            registry: "Kubernetes".into(),
            shortname: "svc".into(),
            namespace: "ns".into(),
            ..Default::default()
        },
    );
    t
}

async fn next<T>(rx: &mut mpsc::Receiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("timed out")
        .expect("channel closed")
}

#[tokio::test]
async fn sotw_relays_verbatim_and_intercepts_nds() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy(ads.connect(), true).await;
    let mut client = envoy_client(&h.path).await;
    let (tx, rx) = mpsc::channel(8);
    tx.send(req(type_url::CLUSTER, "")).await.unwrap();
    let mut from_proxy = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut up = next(&mut ads.sotw).await;
    assert_eq!(up.metadata.get("clusterid").unwrap(), "Kubernetes");
    assert_eq!(up.metadata.get("x-extra").unwrap(), "yes");
    assert_eq!(up.metadata.get("authorization").unwrap(), "Bearer tok123");
    assert_eq!(next(&mut up.requests).await, req(type_url::CLUSTER, ""));

    // The first LDS request is followed by the proxy's own NDS subscription.
    tx.send(req(type_url::LISTENER, "")).await.unwrap();
    assert_eq!(next(&mut up.requests).await, req(type_url::LISTENER, ""));
    assert_eq!(next(&mut up.requests).await, req(type_url::NAME_TABLE, ""));

    // Responses reach Envoy verbatim; Envoy's ACK reaches istiod verbatim.
    let mut cds = resp(type_url::CLUSTER, "n1");
    cds.resources.push(proto::pack(&table("ignored")));
    up.responses.send(Ok(cds.clone())).await.unwrap();
    assert_eq!(from_proxy.message().await.unwrap().unwrap(), cds);
    let mut ack = req(type_url::CLUSTER, "n1");
    ack.version_info = "v-n1".into();
    tx.send(ack.clone()).await.unwrap();
    assert_eq!(next(&mut up.requests).await, ack);

    // NDS: consumed, fed to the sink, acked by the proxy, never shown to Envoy.
    let mut nds = resp(type_url::NAME_TABLE, "nds1");
    nds.resources
        .push(proto::pack(&table("svc.ns.svc.cluster.local")));
    up.responses.send(Ok(nds)).await.unwrap();
    let nds_ack = next(&mut up.requests).await;
    assert_eq!(nds_ack.type_url, type_url::NAME_TABLE);
    assert_eq!(nds_ack.response_nonce, "nds1");
    assert_eq!(nds_ack.version_info, "v-nds1");
    assert!(nds_ack.error_detail.is_none());
    assert_eq!(h.tables.lock().unwrap().len(), 1);

    // A rejected table is NACKed.
    let mut bad = resp(type_url::NAME_TABLE, "nds2");
    bad.resources.push(proto::pack(&table("reject.me")));
    up.responses.send(Ok(bad)).await.unwrap();
    let nack = next(&mut up.requests).await;
    assert_eq!(nack.response_nonce, "nds2");
    assert_eq!(
        nack.error_detail.unwrap().code,
        tonic::Code::Internal as i32
    );

    // Unknown types are dropped; the next known response still arrives, in order.
    up.responses
        .send(Ok(resp("type.googleapis.com/foo.Bar", "x")))
        .await
        .unwrap();
    let lds = resp(type_url::LISTENER, "n2");
    up.responses.send(Ok(lds.clone())).await.unwrap();
    assert_eq!(from_proxy.message().await.unwrap().unwrap(), lds);
    // A second LDS request does not subscribe NDS again.
    tx.send(req(type_url::LISTENER, "n2")).await.unwrap();
    assert_eq!(next(&mut up.requests).await, req(type_url::LISTENER, "n2"));
    assert_eq!(h.metrics.responses.get(), 5);
    assert_eq!(h.metrics.requests.get(), 4);

    // istiod ends the stream with an error: Envoy sees the same status.
    up.responses
        .send(Err(tonic::Status::permission_denied("no")))
        .await
        .unwrap();
    let status = from_proxy.message().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    assert_eq!(status.message(), "no");
}

#[tokio::test]
async fn envoy_disconnect_closes_upstream_and_reconnect_gets_a_fresh_one() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy(ads.connect(), false).await;
    let mut client = envoy_client(&h.path).await;
    let (tx, rx) = mpsc::channel(8);
    tx.send(req(type_url::LISTENER, "")).await.unwrap();
    let stream = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut up = next(&mut ads.sotw).await;
    // No NDS without DNS capture.
    assert_eq!(next(&mut up.requests).await, req(type_url::LISTENER, ""));
    drop(stream);
    drop(tx);
    // The upstream stream closes.
    assert!(
        tokio::time::timeout(Duration::from_secs(10), up.requests.recv())
            .await
            .unwrap()
            .is_none()
    );
    // A new Envoy stream opens a new upstream stream.
    let (tx2, rx2) = mpsc::channel(8);
    tx2.send(req(type_url::CLUSTER, "")).await.unwrap();
    let _s2 = client
        .stream_aggregated_resources(ReceiverStream::new(rx2))
        .await
        .unwrap();
    let mut up2 = next(&mut ads.sotw).await;
    assert_eq!(next(&mut up2.requests).await, req(type_url::CLUSTER, ""));
}

/// As Istio: one Envoy stream at a time. A new stream (here Delta after SotW) ends the previous
/// one with OK and closes its upstream; the new one relays.
#[tokio::test]
async fn a_new_envoy_stream_replaces_the_previous_one() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy(ads.connect(), false).await;
    let mut client = envoy_client(&h.path).await;
    let (tx1, rx1) = mpsc::channel(8);
    tx1.send(req(type_url::LISTENER, "")).await.unwrap();
    let mut first = client
        .stream_aggregated_resources(ReceiverStream::new(rx1))
        .await
        .unwrap()
        .into_inner();
    let mut up1 = next(&mut ads.sotw).await;
    assert_eq!(next(&mut up1.requests).await, req(type_url::LISTENER, ""));

    let (tx2, rx2) = mpsc::channel(8);
    let cds = DeltaDiscoveryRequest {
        type_url: type_url::CLUSTER.into(),
        ..Default::default()
    };
    tx2.send(cds.clone()).await.unwrap();
    let mut second = client
        .delta_aggregated_resources(ReceiverStream::new(rx2))
        .await
        .unwrap()
        .into_inner();
    let mut up2 = next(&mut ads.delta).await;
    assert_eq!(next(&mut up2.requests).await, cds);

    // The first stream ends cleanly and its upstream stream closes, though Envoy's side of it
    // (tx1) is still open.
    let end = tokio::time::timeout(Duration::from_secs(10), first.message())
        .await
        .expect("the first stream ends");
    assert!(matches!(end, Ok(None)), "{end:?}");
    assert!(
        tokio::time::timeout(Duration::from_secs(10), up1.requests.recv())
            .await
            .unwrap()
            .is_none()
    );
    drop(tx1);

    // The second stream still relays both ways.
    let pushed = DeltaDiscoveryResponse {
        type_url: type_url::CLUSTER.into(),
        nonce: "c1".into(),
        ..Default::default()
    };
    up2.responses.send(Ok(pushed.clone())).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), second.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(got, pushed);
    let ack = DeltaDiscoveryRequest {
        type_url: type_url::CLUSTER.into(),
        response_nonce: "c1".into(),
        ..Default::default()
    };
    tx2.send(ack.clone()).await.unwrap();
    assert_eq!(next(&mut up2.requests).await, ack);
}

#[tokio::test]
async fn upstream_unreachable_fails_envoy_stream() {
    let unreachable: Connect = Arc::new(|| {
        Box::pin(async {
            Err(ConnectError::Channel(sds::Error::Channel {
                addr: "istiod".into(),
                reason: "connection refused".into(),
            }))
        })
    });
    let h = proxy(unreachable, false).await;
    let mut client = envoy_client(&h.path).await;
    let (tx, rx) = mpsc::channel(8);
    tx.send(req(type_url::CLUSTER, "")).await.unwrap();
    let mut s = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let status = s.message().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(h.metrics.istiod_connection_failures.get(), 1);
}

#[tokio::test]
async fn delta_relays_and_intercepts_nds() {
    let mut ads = FakeAds::start().await.unwrap();
    // Istio's behaviour on upstream loss (asserted at the end); the default is in reconnect.rs.
    let h = proxy_with(ads.connect(), true, None, false).await;
    let mut client = envoy_client(&h.path).await;
    let (tx, rx) = mpsc::channel(8);
    let lds = DeltaDiscoveryRequest {
        type_url: type_url::LISTENER.into(),
        resource_names_subscribe: vec!["*".into()],
        ..Default::default()
    };
    tx.send(lds.clone()).await.unwrap();
    let mut from_proxy = client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut up = next(&mut ads.delta).await;
    assert_eq!(next(&mut up.requests).await, lds);
    let sub = next(&mut up.requests).await;
    assert_eq!(sub.type_url, type_url::NAME_TABLE);

    let nds = DeltaDiscoveryResponse {
        type_url: type_url::NAME_TABLE.into(),
        nonce: "d1".into(),
        resources: vec![Resource {
            resource: Some(proto::pack(&table("a.ns.svc.cluster.local"))),
            ..Default::default()
        }],
        ..Default::default()
    };
    up.responses.send(Ok(nds)).await.unwrap();
    let ack = next(&mut up.requests).await;
    assert_eq!(ack.response_nonce, "d1");
    assert!(ack.error_detail.is_none());
    assert_eq!(h.tables.lock().unwrap().len(), 1);

    let cds = DeltaDiscoveryResponse {
        type_url: type_url::CLUSTER.into(),
        nonce: "c1".into(),
        removed_resources: vec!["old".into()],
        ..Default::default()
    };
    up.responses.send(Ok(cds.clone())).await.unwrap();
    assert_eq!(from_proxy.message().await.unwrap().unwrap(), cds);
    // istiod closes gracefully: Envoy's stream ends without error.
    drop(up.responses);
    assert!(from_proxy.message().await.unwrap().is_none());
}

/// A slow reader on each side and a fast writer on the other: the writers are held back
/// (memory stays bounded), nothing deadlocks, and everything arrives in order once the readers
/// catch up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backpressure_bounds_memory_without_deadlock() {
    const RESPONSES: usize = 2000;
    const REQUESTS: usize = 1000;
    const SIZE: usize = 64 * 1024;
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy(ads.connect(), false).await;
    let mut client = envoy_client(&h.path).await;
    let (tx, rx) = mpsc::channel(1);
    tx.send(req(type_url::CLUSTER, "")).await.unwrap();
    let mut from_proxy = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut up = next(&mut ads.sotw).await;
    assert_eq!(next(&mut up.requests).await, req(type_url::CLUSTER, ""));

    // Fast writer upstream: istiod pushes 2000 × 64 KiB (125 MiB); Envoy is not reading.
    let sent = Arc::new(AtomicUsize::new(0));
    let sent_w = sent.clone();
    let responses = up.responses.clone();
    let pusher = tokio::spawn(async move {
        for i in 0..RESPONSES {
            let mut r = resp(type_url::CLUSTER, &i.to_string());
            r.resources
                .push(proto::envoy_types_crate::pb::google::protobuf::Any {
                    type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
                    value: vec![7u8; SIZE],
                });
            if responses.send(Ok(r)).await.is_err() {
                return;
            }
            sent_w.fetch_add(1, Ordering::SeqCst);
        }
    });
    // Fast writer downstream: Envoy sends 1000 × 16 KiB requests; istiod is not reading.
    let pushed_reqs = Arc::new(AtomicUsize::new(0));
    let pushed_w = pushed_reqs.clone();
    let writer = tokio::spawn(async move {
        for i in 0..REQUESTS {
            let mut r = req(type_url::LISTENER, &i.to_string());
            r.resource_names = vec!["n".repeat(SIZE / 4)];
            if tx.send(r).await.is_err() {
                return;
            }
            pushed_w.fetch_add(1, Ordering::SeqCst);
        }
    });

    // Wait until both writers are stalled (their counters stop moving), bounded.
    let mut last = (usize::MAX, usize::MAX);
    let mut stable = 0;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(25)).await;
        let now = (
            sent.load(Ordering::SeqCst),
            pushed_reqs.load(Ordering::SeqCst),
        );
        if now == last {
            stable += 1;
            if stable >= 8 {
                break;
            }
        } else {
            stable = 0;
            last = now;
        }
    }
    let in_flight = sent.load(Ordering::SeqCst);
    let reqs_in_flight = pushed_reqs.load(Ordering::SeqCst);
    eprintln!("stalled with {in_flight} responses and {reqs_in_flight} requests in flight");
    assert!(stable >= 8, "writers never stalled: {last:?}");
    // Bounded: at most ~16 MiB of responses between istiod and the paused Envoy (queues of one
    // message plus HTTP/2 windows), out of 125 MiB offered.
    assert!(
        in_flight * SIZE <= 16 << 20,
        "{in_flight} responses buffered"
    );
    assert!(in_flight < RESPONSES);
    assert!(
        reqs_in_flight * SIZE / 4 <= 16 << 20,
        "{reqs_in_flight} requests buffered"
    );
    assert!(reqs_in_flight < REQUESTS);

    // Both readers catch up: everything arrives, in order; nothing deadlocked.
    let reader = tokio::spawn(async move {
        for i in 0..REQUESTS {
            let r = next(&mut up.requests).await;
            assert_eq!(r.response_nonce, i.to_string());
        }
    });
    for i in 0..RESPONSES {
        let r = tokio::time::timeout(Duration::from_secs(20), from_proxy.message())
            .await
            .expect("deadlock: no response")
            .unwrap()
            .unwrap();
        assert_eq!(r.nonce, i.to_string());
    }
    tokio::time::timeout(Duration::from_secs(20), reader)
        .await
        .unwrap()
        .unwrap();
    pusher.await.unwrap();
    writer.await.unwrap();
}

#[tokio::test]
async fn health_goes_upstream_after_lds_and_on_change() {
    use crate::health::Health;
    let mut ads = FakeAds::start().await.unwrap();
    let (health_tx, health_rx) = tokio::sync::watch::channel(Some(Health::Healthy));
    let h = proxy_with_health(ads.connect(), false, Some(health_rx)).await;
    let mut client = envoy_client(&h.path).await;
    let (tx, rx) = mpsc::channel(8);
    tx.send(req(type_url::CLUSTER, "")).await.unwrap();
    let _s = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap();
    let mut up = next(&mut ads.sotw).await;
    assert_eq!(next(&mut up.requests).await, req(type_url::CLUSTER, ""));
    // Nothing before LDS; after it, the current health.
    tx.send(req(type_url::LISTENER, "")).await.unwrap();
    assert_eq!(next(&mut up.requests).await, req(type_url::LISTENER, ""));
    let healthy = next(&mut up.requests).await;
    assert_eq!(healthy.type_url, type_url::HEALTH_INFO);
    assert!(healthy.error_detail.is_none());
    health_tx.send_replace(Some(Health::Unhealthy("app down".into())));
    let unhealthy = next(&mut up.requests).await;
    assert_eq!(unhealthy.type_url, type_url::HEALTH_INFO);
    let detail = unhealthy.error_detail.unwrap();
    assert_eq!((detail.code, detail.message.as_str()), (13, "app down"));
}

/// Reads a proxy's ADS stream below tonic's decoder: each response as the bytes on the wire.
async fn raw_stream(
    path: &Path,
    method: &'static str,
    rx: mpsc::Receiver<DiscoveryRequest>,
) -> Result<upstream::Responses, tonic::Status> {
    upstream::call(
        uds_channel(path).await,
        method,
        http::HeaderMap::new(),
        Box::pin(ReceiverStream::new(rx)),
        false,
    )
    .await
}

/// The next response from a raw stream, its parts put together.
async fn raw_response(stream: &mut upstream::Responses) -> Vec<u8> {
    let mut parts = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("a response within 10 s")
            .expect("the stream is open")
            .expect("a response, not the end")
        {
            upstream::Piece::Whole(resp) => return resp.bytes().to_vec(),
            upstream::Piece::Part(b) => parts.extend_from_slice(&b),
            upstream::Piece::Last(b, _) => {
                parts.extend_from_slice(&b);
                // The gRPC header of a response relayed in parts.
                return parts.split_off(5);
            }
        }
    }
}

fn cds_with(n: usize, value_len: usize) -> DiscoveryResponse {
    let mut cds = resp(type_url::CLUSTER, "n1");
    for i in 0..n {
        let mut value = format!("cluster-{i}-").into_bytes();
        value.resize(value_len, b'x');
        cds.resources
            .push(proto::envoy_types_crate::pb::google::protobuf::Any {
                type_url: type_url::CLUSTER.into(),
                value,
            });
    }
    cds
}

/// Envoy receives each response as the bytes istiod sent (read here without decoding), a small
/// one held whole, a large one relayed as it arrives, large ones pushed before Envoy reads, and
/// an unknown method of the ADS service is UNIMPLEMENTED.
#[tokio::test]
async fn responses_reach_envoy_as_sent() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy(ads.connect(), false).await;
    let (tx, rx) = mpsc::channel(8);
    tx.send(req(type_url::CLUSTER, "")).await.unwrap();
    let mut from_proxy = raw_stream(&h.path, SOTW_PATH, rx).await.unwrap();
    let mut up = next(&mut ads.sotw).await;
    assert_eq!(next(&mut up.requests).await, req(type_url::CLUSTER, ""));
    // 100 clusters, 1.6 kB: held whole. 4,000 of 1 kB: over the hold limit, relayed in parts.
    for (n, len) in [(100, 16), (4000, 1000)] {
        let cds = cds_with(n, len);
        up.responses.send(Ok(cds.clone())).await.unwrap();
        let got = raw_response(&mut from_proxy).await;
        assert_eq!(got.len(), prost::Message::encoded_len(&cds));
        assert!(
            got == prost::Message::encode_to_vec(&cds),
            "{n} clusters: bytes differ"
        );
    }
    // Three large ones pushed before Envoy reads: their parts are gathered while Envoy's
    // queue is full, and still reach Envoy whole, in order, byte for byte.
    let pushed: Vec<DiscoveryResponse> = (1..=3).map(|i| cds_with(1500 * i, 700)).collect();
    for cds in &pushed {
        up.responses.send(Ok(cds.clone())).await.unwrap();
    }
    for cds in &pushed {
        let got = raw_response(&mut from_proxy).await;
        assert!(
            got == prost::Message::encode_to_vec(cds),
            "{} clusters pushed together: bytes differ",
            cds.resources.len()
        );
    }

    let (_tx2, rx2) = mpsc::channel::<DiscoveryRequest>(1);
    let Err(status) = raw_stream(
        &h.path,
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/NoSuchMethod",
        rx2,
    )
    .await
    else {
        panic!("an unknown method answered");
    };
    assert_eq!(status.code(), tonic::Code::Unimplemented);
}

mod hostile;
mod reconnect;
mod streams;
mod warm;
mod wasm;

/// Gathered writes never hold a response back: 300 small responses, each sent only after the
/// previous one arrived, every one reaches Envoy promptly (a flush left pending would wait
/// for the next write, which here never comes until the response arrives).
#[tokio::test]
async fn small_responses_are_not_held_by_write_gathering() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy(ads.connect(), false).await;
    let mut client = envoy_client(&h.path).await;
    let (tx, mut from_proxy, up) =
        open_sotw(&mut client, &mut ads, req(type_url::CLUSTER, "")).await;
    let mut slowest = Duration::ZERO;
    for i in 0..300 {
        let r = resp(type_url::CLUSTER, &i.to_string());
        let sent = std::time::Instant::now();
        up.responses.send(Ok(r.clone())).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), from_proxy.message())
            .await
            .expect("a response held back")
            .unwrap()
            .unwrap();
        slowest = slowest.max(sent.elapsed());
        assert_eq!(got, r);
    }
    eprintln!("slowest of 300 small responses: {slowest:?}");
    drop(tx);
}

/// Asserts `closed` resolves (the server closed the connection) at `limit` after now.
async fn closed_after<F: Future>(limit: Duration, closed: F) {
    let start = tokio::time::Instant::now();
    let _ = tokio::time::timeout(limit * 3, closed)
        .await
        .expect("closed by the server");
    let took = start.elapsed();
    assert!(
        took >= limit && took < limit + Duration::from_secs(1),
        "closed after {took:?}, limit {limit:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn connections_without_a_stream_are_closed_and_open_streams_are_kept() {
    use tokio::io::AsyncReadExt;
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy(ads.connect(), false).await;
    let limits = proto::listen::idle::UNIX_SOCKET_LIMITS;

    // No HTTP/2 preface at all.
    let mut silent = tokio::net::UnixStream::connect(&h.path).await.unwrap();
    let mut seen = Vec::new();
    closed_after(limits.first_stream, silent.read_to_end(&mut seen)).await;

    // The HTTP/2 handshake done (and the server's keepalive pings answered), but no stream.
    let io = hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(&h.path).await.unwrap());
    let (_send, conn) = hyper::client::conn::http2::handshake::<_, _, tonic::body::Body>(
        hyper_util::rt::TokioExecutor::new(),
        io,
    )
    .await
    .unwrap();
    closed_after(limits.first_stream, conn).await;

    // Envoy's stream: kept across ten times the idle limit (keepalive pings answered), then
    // still relayed both ways.
    let mut client = envoy_client(&h.path).await;
    let (tx, mut from_proxy, mut up) =
        open_sotw(&mut client, &mut ads, req(type_url::CLUSTER, "")).await;
    let quiet = tokio::time::timeout(limits.idle * 10, from_proxy.message()).await;
    assert!(quiet.is_err(), "stream still open: {quiet:?}");
    let cds = resp(type_url::CLUSTER, "n1");
    up.responses.send(Ok(cds.clone())).await.unwrap();
    assert_eq!(from_proxy.message().await.unwrap().unwrap(), cds);
    tx.send(req(type_url::CLUSTER, "n1")).await.unwrap();
    assert_eq!(next(&mut up.requests).await, req(type_url::CLUSTER, "n1"));
}

/// `<configPath>/XDS` under a working directory past the 108-byte `sun_path` limit is bound
/// (as Istio binds `./etc/istio/proxy/XDS`) and a client reaches it.
#[tokio::test]
async fn xds_socket_past_sun_path_is_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d".repeat(90)).join("etc/istio/proxy/XDS");
    assert!(path.as_os_str().len() > 108);
    let listener = bind_uds(&path).unwrap();
    let accept = tokio::spawn(async move { listener.accept().await.map(|_| ()) });
    proto::uds::connect(&path).await.unwrap();
    accept.await.unwrap().unwrap();
}

/// PCDS (`PROXY_CONFIG_XDS_AGENT`): after Envoy's first LDS request the proxy subscribes to
/// ProxyConfig, hands its `caCertificatesPem` to the trust store, acks it (nacks what the store
/// refuses) and never shows it to Envoy.
#[tokio::test]
async fn pcds_feeds_the_trust_store_and_is_acked_by_the_proxy() {
    use proto::istio::mesh::ProxyConfigTrust;
    let mut ads = FakeAds::start().await.unwrap();
    let got: Arc<std::sync::Mutex<Vec<Vec<String>>>> = Arc::default();
    let seen = got.clone();
    let sink: PcdsSink = Arc::new(move |pems: Vec<String>| {
        if pems.iter().any(|p| p == "bad") {
            return Err("caCertificatesPem[0]: not PEM".into());
        }
        seen.lock().unwrap().push(pems);
        Ok(())
    });
    let h = proxy_full(
        ads.connect(),
        false,
        None,
        true,
        Streams::One,
        Some(sink),
        None,
        XdsServer::default(),
    )
    .await;
    let mut client = envoy_client(&h.path).await;
    let (tx, rx) = mpsc::channel(8);
    tx.send(req(type_url::CLUSTER, "")).await.unwrap();
    let mut from_proxy = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut up = next(&mut ads.sotw).await;
    assert_eq!(next(&mut up.requests).await, req(type_url::CLUSTER, ""));
    tx.send(req(type_url::LISTENER, "")).await.unwrap();
    assert_eq!(next(&mut up.requests).await, req(type_url::LISTENER, ""));
    assert_eq!(
        next(&mut up.requests).await,
        req(type_url::PROXY_CONFIG, "")
    );

    let mut pcds = resp(type_url::PROXY_CONFIG, "p1");
    pcds.resources.push(proto::pack(&ProxyConfigTrust {
        ca_certificates_pem: vec!["anchor-1".into(), "anchor-2".into()],
    }));
    up.responses.send(Ok(pcds)).await.unwrap();
    let ack = next(&mut up.requests).await;
    assert_eq!(ack.type_url, type_url::PROXY_CONFIG);
    assert_eq!(ack.response_nonce, "p1");
    assert!(ack.error_detail.is_none());
    assert_eq!(
        *got.lock().unwrap(),
        vec![vec!["anchor-1".to_string(), "anchor-2".to_string()]]
    );

    let mut bad = resp(type_url::PROXY_CONFIG, "p2");
    bad.resources.push(proto::pack(&ProxyConfigTrust {
        ca_certificates_pem: vec!["bad".into()],
    }));
    up.responses.send(Ok(bad)).await.unwrap();
    let nack = next(&mut up.requests).await;
    assert_eq!(nack.response_nonce, "p2");
    assert!(nack.error_detail.is_some());

    // Envoy saw neither; its own responses still arrive.
    let cds = resp(type_url::CLUSTER, "n1");
    up.responses.send(Ok(cds.clone())).await.unwrap();
    assert_eq!(from_proxy.message().await.unwrap().unwrap(), cds);
    drop(h);
}

/// `ISTIO_GPRC_MAXRECVMSGSIZE`: a request from Envoy larger than the cap ends the stream with
/// an error and never reaches istiod; one within it is relayed.
#[tokio::test]
async fn requests_over_the_configured_size_are_refused() {
    let mut ads = FakeAds::start().await.unwrap();
    let server = XdsServer {
        max_recv_msg_size: 1024,
        ..XdsServer::default()
    };
    let h = proxy_full(
        ads.connect(),
        false,
        None,
        true,
        Streams::One,
        None,
        None,
        server,
    )
    .await;
    let mut client = envoy_client(&h.path).await;
    let small = req(type_url::CLUSTER, "");
    let (_tx, _from_proxy, _up) = open_sotw(&mut client, &mut ads, small).await;

    let mut big = req(type_url::LISTENER, "");
    big.resource_names = vec!["x".repeat(2048)];
    let (tx, rx) = mpsc::channel(8);
    tx.send(big).await.unwrap();
    let mut from_proxy = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let ended = tokio::time::timeout(Duration::from_secs(10), from_proxy.message())
        .await
        .expect("the stream ends");
    assert!(!matches!(ended, Ok(Some(_))), "{ended:?}");
    // No upstream stream carried it.
    while let Ok(mut up) = ads.sotw.try_recv() {
        if let Ok(Some(r)) =
            tokio::time::timeout(Duration::from_millis(200), up.requests.recv()).await
        {
            assert!(r.resource_names.iter().all(|n| n.len() < 1024));
        }
    }
}
