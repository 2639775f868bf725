//! The proxy owns the upstream: on upstream loss Envoy's stream stays open, a new upstream
//! stream replays Envoy's subscriptions, and answers to the old stream's responses stay behind.

use proto::envoy::config::core::v3::Node;

use super::*;

fn node() -> Node {
    Node {
        id: "sidecar~198.18.0.1~pod.ns~ns.svc.cluster.local".into(),
        ..Default::default()
    }
}

fn ack(t: &str, nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: t.into(),
        response_nonce: nonce.into(),
        version_info: format!("v-{nonce}"),
        ..Default::default()
    }
}

fn reconnects(h: &Harness, reason: &'static str) -> u64 {
    h.metrics
        .upstream_reconnects
        .get_or_create(&ReconnectLabels { reason })
        .get()
}

/// Envoy's first Delta request: CDS, with the node.
fn delta_cds() -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: type_url::CLUSTER.into(),
        node: Some(node()),
        ..Default::default()
    }
}

/// SotW: the new stream starts with, per type in subscription order, the last request (names,
/// last ACKed version, no nonce; the node on the first); the proxy's own NDS with its last ACKed
/// version. An ACK for the old stream's response is not forwarded; an old answer that changes
/// the subscription goes up as a fresh request.
#[tokio::test]
async fn sotw_reconnect_replays_subscriptions_and_drops_old_acks() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy(ads.connect(), true).await;
    let mut client = envoy_client(&h.path).await;
    let mut first = req(type_url::CLUSTER, "");
    first.node = Some(node());
    let (tx, mut from_proxy, mut up) = open_sotw(&mut client, &mut ads, first).await;
    tx.send(req(type_url::LISTENER, "")).await.unwrap();
    assert_eq!(next(&mut up.requests).await, req(type_url::LISTENER, ""));
    assert_eq!(next(&mut up.requests).await, req(type_url::NAME_TABLE, ""));

    // CDS pushed and ACKed; NDS pushed and acked by the proxy; EDS subscribed; LDS and EDS
    // pushed but not answered before the loss.
    up.responses
        .send(Ok(resp(type_url::CLUSTER, "c1")))
        .await
        .unwrap();
    assert_eq!(from_proxy.message().await.unwrap().unwrap().nonce, "c1");
    tx.send(ack(type_url::CLUSTER, "c1")).await.unwrap();
    assert_eq!(next(&mut up.requests).await, ack(type_url::CLUSTER, "c1"));
    let mut nds = resp(type_url::NAME_TABLE, "nds1");
    nds.resources
        .push(proto::pack(&table("svc.ns.svc.cluster.local")));
    up.responses.send(Ok(nds)).await.unwrap();
    assert_eq!(next(&mut up.requests).await.response_nonce, "nds1");
    let mut eds = req(type_url::ENDPOINT, "");
    eds.resource_names = vec!["a".into(), "b".into()];
    tx.send(eds.clone()).await.unwrap();
    assert_eq!(next(&mut up.requests).await, eds);
    for (t, n) in [(type_url::LISTENER, "l1"), (type_url::ENDPOINT, "e1")] {
        up.responses.send(Ok(resp(t, n))).await.unwrap();
        assert_eq!(from_proxy.message().await.unwrap().unwrap().nonce, n);
    }

    // The connection is lost: Envoy's stream stays open, a new upstream stream replays.
    up.responses
        .send(Err(tonic::Status::unavailable("connection reset")))
        .await
        .unwrap();
    let mut up2 = next(&mut ads.sotw).await;
    assert_eq!(up2.metadata.get("authorization").unwrap(), "Bearer tok123");
    let mut cds = ack(type_url::CLUSTER, "c1");
    cds.response_nonce.clear();
    cds.node = Some(node());
    assert_eq!(next(&mut up2.requests).await, cds);
    assert_eq!(next(&mut up2.requests).await, req(type_url::LISTENER, ""));
    let mut nds = ack(type_url::NAME_TABLE, "nds1");
    nds.response_nonce.clear();
    assert_eq!(next(&mut up2.requests).await, nds);
    assert_eq!(next(&mut up2.requests).await, eds);
    assert_eq!(reconnects(&h, "lost"), 1);

    // Envoy's ACK of the old stream's LDS stays behind; its EDS answer with new names goes up
    // without the old nonce; the new stream's responses and ACKs flow as before.
    tx.send(ack(type_url::LISTENER, "l1")).await.unwrap();
    let mut eds2 = ack(type_url::ENDPOINT, "e1");
    eds2.resource_names = vec!["a".into(), "b".into(), "c".into()];
    tx.send(eds2.clone()).await.unwrap();
    eds2.response_nonce.clear();
    assert_eq!(next(&mut up2.requests).await, eds2);
    up2.responses
        .send(Ok(resp(type_url::LISTENER, "l2")))
        .await
        .unwrap();
    assert_eq!(from_proxy.message().await.unwrap().unwrap().nonce, "l2");
    tx.send(ack(type_url::LISTENER, "l2")).await.unwrap();
    assert_eq!(next(&mut up2.requests).await, ack(type_url::LISTENER, "l2"));

    // istiod closing the stream cleanly (a graceful restart) is a loss too.
    drop(up2.responses);
    let mut up3 = next(&mut ads.sotw).await;
    let mut lds = ack(type_url::LISTENER, "l2");
    lds.response_nonce.clear();
    assert_eq!(next(&mut up3.requests).await, cds);
    assert_eq!(next(&mut up3.requests).await, lds);
    assert_eq!(reconnects(&h, "closed"), 1);
}

/// Delta: the new stream subscribes each type again with the names Envoy subscribed and the
/// versions it ACKed as `initial_resource_versions` (a NACKed response's are not Envoy's).
#[tokio::test]
async fn delta_reconnect_replays_initial_resource_versions() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy(ads.connect(), false).await;
    let mut client = envoy_client(&h.path).await;
    let (tx, mut from_proxy, mut up) = open_delta(&mut client, &mut ads, delta_cds()).await;
    let eds = DeltaDiscoveryRequest {
        type_url: type_url::ENDPOINT.into(),
        resource_names_subscribe: vec!["a".into(), "b".into()],
        ..Default::default()
    };
    tx.send(eds.clone()).await.unwrap();
    assert_eq!(next(&mut up.requests).await, eds);

    let resource = |name: &str, version: &str| Resource {
        name: name.into(),
        version: version.into(),
        resource: Some(proto::pack(&table("ignored"))),
        ..Default::default()
    };
    let push = |t: &str, nonce: &str, resources: Vec<Resource>, removed: Vec<String>| {
        DeltaDiscoveryResponse {
            type_url: t.into(),
            nonce: nonce.into(),
            resources,
            removed_resources: removed,
            ..Default::default()
        }
    };
    let answer = |t: &str, nonce: &str, nack: bool| DeltaDiscoveryRequest {
        type_url: t.into(),
        response_nonce: nonce.into(),
        error_detail: nack.then(|| proto::google::rpc::Status {
            code: 13,
            message: "rejected".into(),
            details: vec![],
        }),
        ..Default::default()
    };
    // Two CDS pushes ACKed (the second removes one cluster), one EDS push NACKed.
    let steps = [
        (
            push(
                type_url::CLUSTER,
                "c1",
                vec![resource("x", "1"), resource("y", "2")],
                vec![],
            ),
            answer(type_url::CLUSTER, "c1", false),
        ),
        (
            push(
                type_url::CLUSTER,
                "c2",
                vec![resource("z", "3")],
                vec!["y".into()],
            ),
            answer(type_url::CLUSTER, "c2", false),
        ),
        (
            push(type_url::ENDPOINT, "e1", vec![resource("a", "9")], vec![]),
            answer(type_url::ENDPOINT, "e1", true),
        ),
    ];
    for (pushed, answered) in steps {
        up.responses.send(Ok(pushed.clone())).await.unwrap();
        assert_eq!(from_proxy.message().await.unwrap().unwrap(), pushed);
        tx.send(answered.clone()).await.unwrap();
        assert_eq!(next(&mut up.requests).await, answered);
    }

    up.responses
        .send(Err(tonic::Status::unavailable("connection reset")))
        .await
        .unwrap();
    let mut up2 = next(&mut ads.delta).await;
    let replayed_cds = next(&mut up2.requests).await;
    assert_eq!(replayed_cds.type_url, type_url::CLUSTER);
    assert_eq!(replayed_cds.node, Some(node()));
    assert!(replayed_cds.resource_names_subscribe.is_empty());
    assert!(replayed_cds.response_nonce.is_empty());
    assert_eq!(
        replayed_cds.initial_resource_versions,
        [("x", "1"), ("z", "3")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    );
    let replayed_eds = next(&mut up2.requests).await;
    assert_eq!(replayed_eds.type_url, type_url::ENDPOINT);
    assert_eq!(replayed_eds.resource_names_subscribe, ["a", "b"]);
    assert!(replayed_eds.initial_resource_versions.is_empty());
    assert_eq!(replayed_eds.node, None);

    // An ACK for the old stream stays behind; the new stream relays both ways.
    tx.send(answer(type_url::ENDPOINT, "e1", false))
        .await
        .unwrap();
    let pushed = push(type_url::CLUSTER, "c3", vec![resource("w", "4")], vec![]);
    up2.responses.send(Ok(pushed.clone())).await.unwrap();
    assert_eq!(from_proxy.message().await.unwrap().unwrap(), pushed);
    tx.send(answer(type_url::CLUSTER, "c3", false))
        .await
        .unwrap();
    assert_eq!(
        next(&mut up2.requests).await,
        answer(type_url::CLUSTER, "c3", false)
    );
    assert_eq!(reconnects(&h, "lost"), 1);
}

/// `XDS_PROXY_RECONNECT=false` (Istio): a lost upstream ends Envoy's stream with its status
/// and the proxy opens no stream of its own.
#[tokio::test]
async fn istio_behaviour_closes_envoy_stream_on_upstream_loss() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy_with(ads.connect(), false, None, false).await;
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
    up.responses
        .send(Err(tonic::Status::unavailable("connection reset")))
        .await
        .unwrap();
    let status = from_proxy.message().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), ads.sotw.recv())
            .await
            .is_err(),
        "the proxy opened an upstream stream of its own"
    );
    assert_eq!(reconnects(&h, "lost"), 0);
}

/// A TCP relay in front of the fake ADS whose existing connections can be frozen: bytes stop
/// flowing but the sockets stay open (a stopped istiod, a blackhole). Later connections pass.
struct Freezer {
    addr: std::net::SocketAddr,
    freeze_below: tokio::sync::watch::Sender<u64>,
    accepted: Arc<AtomicUsize>,
}

impl Freezer {
    async fn start(to: std::net::SocketAddr) -> Freezer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (freeze_below, rx) = tokio::sync::watch::channel(0u64);
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            let mut id = 0u64;
            while let Ok((mut down, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let mut rx = rx.clone();
                let this = id;
                id += 1;
                tokio::spawn(async move {
                    let Ok(mut up) = tokio::net::TcpStream::connect(to).await else {
                        return;
                    };
                    let frozen = tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut down, &mut up) => false,
                        _ = rx.wait_for(|below| this < *below) => true,
                    };
                    if frozen {
                        std::future::pending::<()>().await;
                    }
                });
            }
        });
        Freezer {
            addr,
            freeze_below,
            accepted,
        }
    }

    /// Freezes every connection accepted so far.
    fn freeze(&self) {
        let n = self.accepted.load(Ordering::SeqCst) as u64;
        self.freeze_below.send_replace(n);
    }

    /// Plaintext channels through the relay with a short HTTP/2 keepalive.
    fn connect(&self, keepalive: Duration) -> Connect {
        let uri = format!("http://{}", self.addr);
        Arc::new(move || {
            let uri = uri.clone();
            Box::pin(async move {
                Ok(tonic::transport::Endpoint::from_shared(uri)?
                    .http2_keep_alive_interval(keepalive)
                    .keep_alive_timeout(keepalive)
                    .connect_lazy())
            })
        })
    }
}

/// Stall watchdog: an upstream that keeps the connection but stops answering is caught by the
/// unanswered HTTP/2 ping within two keepalive periods and replaced; Envoy's stream stays open.
#[tokio::test]
async fn a_stalled_upstream_is_replaced_within_two_keepalive_periods() {
    const KEEPALIVE: Duration = Duration::from_millis(300);
    let mut ads = FakeAds::start().await.unwrap();
    let freezer = Freezer::start(ads.addr).await;
    let h = proxy(freezer.connect(KEEPALIVE), false).await;
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
    up.responses
        .send(Ok(resp(type_url::CLUSTER, "c1")))
        .await
        .unwrap();
    assert_eq!(from_proxy.message().await.unwrap().unwrap().nonce, "c1");
    tx.send(ack(type_url::CLUSTER, "c1")).await.unwrap();
    assert_eq!(next(&mut up.requests).await, ack(type_url::CLUSTER, "c1"));

    let frozen_at = tokio::time::Instant::now();
    freezer.freeze();
    let mut up2 = next(&mut ads.sotw).await;
    let detected = frozen_at.elapsed();
    eprintln!("stalled upstream replaced after {detected:?} (keepalive {KEEPALIVE:?})");
    // Two periods, plus the backoff's first step and scheduling slack.
    assert!(
        detected <= 2 * KEEPALIVE + BACKOFF_SLACK,
        "stall detected after {detected:?}"
    );
    // hyper drops the stalled connection: its stream reports a broken pipe.
    assert_eq!(reconnects(&h, "lost") + reconnects(&h, "keepalive"), 1);
    let mut cds = ack(type_url::CLUSTER, "c1");
    cds.response_nonce.clear();
    assert_eq!(next(&mut up2.requests).await, cds);
    up2.responses
        .send(Ok(resp(type_url::CLUSTER, "c2")))
        .await
        .unwrap();
    assert_eq!(from_proxy.message().await.unwrap().unwrap().nonce, "c2");
}

/// The first backoff step (at most 100 ms) and scheduling slack on a loaded machine.
const BACKOFF_SLACK: Duration = Duration::from_millis(400);

/// After a reconnect whose `initial_resource_versions` matched, istiod answers the proxy's NDS
/// subscription with no resource: nothing changed, the table stays and the answer is acked.
#[tokio::test]
async fn delta_nds_without_resources_is_acked_and_keeps_the_table() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy(ads.connect(), true).await;
    let mut client = envoy_client(&h.path).await;
    let lds = DeltaDiscoveryRequest {
        type_url: type_url::LISTENER.into(),
        ..Default::default()
    };
    let (_tx, _from_proxy, mut up) = open_delta(&mut client, &mut ads, lds).await;
    assert_eq!(next(&mut up.requests).await.type_url, type_url::NAME_TABLE);
    up.responses
        .send(Ok(DeltaDiscoveryResponse {
            type_url: type_url::NAME_TABLE.into(),
            nonce: "n1".into(),
            ..Default::default()
        }))
        .await
        .unwrap();
    let ack = next(&mut up.requests).await;
    assert_eq!(ack.response_nonce, "n1");
    assert_eq!(ack.error_detail, None);
    assert!(h.tables.lock().unwrap().is_empty());
}

/// A TCP relay in front of the fake ADS whose first connection ends after `limit` bytes from
/// istiod: istiod lost in the middle of a response. Later connections pass whole.
async fn cutter(to: std::net::SocketAddr, limit: u64) -> Connect {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut down, _)) = listener.accept().await {
            let cut = std::mem::take(&mut first);
            tokio::spawn(async move {
                let Ok(mut up) = tokio::net::TcpStream::connect(to).await else {
                    return;
                };
                if !cut {
                    let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    return;
                }
                let (mut up_r, mut up_w) = up.into_split();
                let (mut down_r, mut down_w) = down.into_split();
                let requests = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut down_r, &mut up_w).await;
                });
                let _ = tokio::io::copy(&mut (&mut up_r).take(limit), &mut down_w).await;
                requests.abort();
            });
        }
    });
    let uri = format!("http://{addr}");
    Arc::new(move || {
        let uri = uri.clone();
        Box::pin(async move { Ok(tonic::transport::Endpoint::from_shared(uri)?.connect_lazy()) })
    })
}

/// istiod lost after part of a large response went to Envoy (relayed as it arrived): Envoy
/// holds a message that can never be completed, so its stream ends (UNAVAILABLE) and the proxy
/// opens no upstream stream of its own; Envoy's next stream is served.
#[tokio::test]
async fn loss_inside_a_relayed_response_ends_envoys_stream() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy(cutter(ads.addr, 1 << 20).await, false).await;
    let mut client = envoy_client(&h.path).await;
    let (_tx, mut from_proxy, up) =
        open_sotw(&mut client, &mut ads, req(type_url::CLUSTER, "")).await;
    // 4 MB: the connection ends a quarter of the way in, well past the hold limit.
    let big = cds_with(4000, 1000);
    let _ = up.responses.send(Ok(big.clone())).await;
    let status = tokio::time::timeout(Duration::from_secs(10), from_proxy.message())
        .await
        .expect("Envoy's stream ends")
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
    assert!(
        status.message().contains("middle of a response"),
        "{status}"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(500), ads.sotw.recv())
            .await
            .is_err(),
        "the proxy reconnected though Envoy holds part of a message"
    );
    assert_eq!(reconnects(&h, "lost"), 0);

    // Envoy reconnects (a new stream, a new upstream connection that is not cut).
    let (_tx, mut from_proxy, up) =
        open_sotw(&mut client, &mut ads, req(type_url::CLUSTER, "")).await;
    up.responses.send(Ok(big.clone())).await.unwrap();
    let got = from_proxy.message().await.unwrap().unwrap();
    assert_eq!(got, big);
}

/// istiod lost while the proxy still held the start of a large response (under the hold
/// limit, nothing of it sent to Envoy): the proxy reconnects on its own, Envoy's stream stays
/// open and gets the response from the new upstream stream, whole.
#[tokio::test]
async fn loss_inside_a_held_response_is_invisible_to_envoy() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy(cutter(ads.addr, 20_000).await, false).await;
    let mut client = envoy_client(&h.path).await;
    let (_tx, mut from_proxy, up) =
        open_sotw(&mut client, &mut ads, req(type_url::CLUSTER, "")).await;
    let big = cds_with(4000, 1000);
    let _ = up.responses.send(Ok(big.clone())).await;
    // The proxy's own new stream replays Envoy's request.
    let mut up = next(&mut ads.sotw).await;
    assert_eq!(next(&mut up.requests).await.type_url, type_url::CLUSTER);
    up.responses.send(Ok(big.clone())).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), from_proxy.message())
        .await
        .expect("a response")
        .expect("Envoy's stream stays open")
        .unwrap();
    assert_eq!(got, big);
    assert_eq!(reconnects(&h, "lost"), 1);
}

/// A Delta push longer than the hold limit is relayed in parts, and the names and versions the
/// sieve read on the way are what the next upstream stream's `initial_resource_versions` say.
#[tokio::test]
async fn delta_names_of_a_relayed_response_are_replayed() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy(ads.connect(), false).await;
    let mut client = envoy_client(&h.path).await;
    let (tx, mut from_proxy, mut up) = open_delta(&mut client, &mut ads, delta_cds()).await;
    // 2,000 clusters of ~300 bytes: 600 kB, relayed as it arrives.
    let pushed = DeltaDiscoveryResponse {
        type_url: type_url::CLUSTER.into(),
        nonce: "big".into(),
        resources: (0..2000)
            .map(|i| Resource {
                name: format!("cluster-{i}"),
                version: format!("v{i}"),
                resource: Some(proto::envoy_types_crate::pb::google::protobuf::Any {
                    type_url: type_url::CLUSTER.into(),
                    value: vec![b'c'; 300],
                }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    assert!(prost::Message::encoded_len(&pushed) > upstream::HOLD * 4);
    up.responses.send(Ok(pushed.clone())).await.unwrap();
    assert_eq!(from_proxy.message().await.unwrap().unwrap(), pushed);
    let ack = DeltaDiscoveryRequest {
        type_url: type_url::CLUSTER.into(),
        response_nonce: "big".into(),
        ..Default::default()
    };
    tx.send(ack.clone()).await.unwrap();
    assert_eq!(next(&mut up.requests).await, ack);

    up.responses
        .send(Err(tonic::Status::unavailable("connection reset")))
        .await
        .unwrap();
    let mut up2 = next(&mut ads.delta).await;
    let replayed = next(&mut up2.requests).await;
    assert_eq!(replayed.initial_resource_versions.len(), 2000);
    assert_eq!(
        replayed
            .initial_resource_versions
            .get("cluster-1999")
            .map(String::as_str),
        Some("v1999")
    );
    assert_eq!(reconnects(&h, "lost"), 1);
}
