//! Several downstream streams at once (proxyless gRPC; gRPC-Go 1.66+ opens one ADS stream per
//! channel target, istio#53532): each keeps its own upstream stream and subscriptions, the cap
//! refuses one more, NDS stays with one stream, and every stream survives an upstream loss.
//! Istio's one-stream behaviour (`Streams::One`) is `a_new_envoy_stream_replaces_the_previous_one`
//! and [`one_stream_policy_ends_the_older_stream`].

use super::*;

fn lds(name: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: type_url::LISTENER.into(),
        resource_names: vec![name.into()],
        ..Default::default()
    }
}

fn lds_resp(nonce: &str) -> DiscoveryResponse {
    resp(type_url::LISTENER, nonce)
}

fn many(cap: usize) -> Streams {
    Streams::Many { cap }
}

async fn message(s: &mut tonic::Streaming<DiscoveryResponse>) -> DiscoveryResponse {
    tokio::time::timeout(Duration::from_secs(10), s.message())
        .await
        .expect("timed out")
        .expect("stream ended with an error")
        .expect("stream ended")
}

/// Nothing arrives on `rx` within 300 ms (the stream is still open and quiet).
async fn quiet<T: std::fmt::Debug>(rx: &mut mpsc::Receiver<T>) {
    if let Ok(got) = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await {
        panic!("expected nothing, got {got:?}");
    }
}

#[tokio::test]
async fn concurrent_streams_each_keep_their_own_upstream() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy_streams(ads.connect(), false, None, true, many(4)).await;
    let mut client = envoy_client(&h.path).await;
    let (tx_a, mut a, mut up_a) = open_sotw(&mut client, &mut ads, lds("a:80")).await;
    let (tx_b, mut b, mut up_b) = open_sotw(&mut client, &mut ads, lds("b:80")).await;
    assert_eq!(h.metrics.downstream_streams.get(), 2);

    // Each upstream's responses reach its own stream only; each ACK goes to its own upstream.
    for _ in 0..3 {
        up_b.responses.send(Ok(lds_resp("b1"))).await.unwrap();
        up_a.responses.send(Ok(lds_resp("a1"))).await.unwrap();
        assert_eq!(message(&mut a).await.nonce, "a1");
        assert_eq!(message(&mut b).await.nonce, "b1");
    }
    let mut ack_a = lds("a:80");
    ack_a.response_nonce = "a1".into();
    tx_a.send(ack_a.clone()).await.unwrap();
    let mut ack_b = lds("b:80");
    ack_b.response_nonce = "b1".into();
    tx_b.send(ack_b.clone()).await.unwrap();
    assert_eq!(next(&mut up_a.requests).await, ack_a);
    assert_eq!(next(&mut up_b.requests).await, ack_b);

    // One leaving does not disturb the other.
    drop((tx_a, a));
    assert!(
        tokio::time::timeout(Duration::from_secs(10), up_a.requests.recv())
            .await
            .unwrap()
            .is_none()
    );
    up_b.responses.send(Ok(lds_resp("b2"))).await.unwrap();
    assert_eq!(message(&mut b).await.nonce, "b2");
    wait_open(&h, 1).await;
}

/// Waits until the gauge shows `n` open streams.
async fn wait_open(h: &Harness, n: i64) {
    for _ in 0..100 {
        if h.metrics.downstream_streams.get() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "open streams: {}, expected {n}",
        h.metrics.downstream_streams.get()
    );
}

/// Istio's behaviour (`XDS_PROXY_MULTI_STREAM=false`, Envoy's default): the second stream ends
/// the first, even when both are gRPC clients' streams for different targets.
#[tokio::test]
async fn one_stream_policy_ends_the_older_stream() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy_streams(ads.connect(), false, None, true, Streams::One).await;
    let mut client = envoy_client(&h.path).await;
    let (_tx_a, mut a, mut up_a) = open_sotw(&mut client, &mut ads, lds("a:80")).await;
    let (_tx_b, mut b, up_b) = open_sotw(&mut client, &mut ads, lds("b:80")).await;
    let end = tokio::time::timeout(Duration::from_secs(10), a.message())
        .await
        .expect("the first stream ends");
    assert!(matches!(end, Ok(None)), "{end:?}");
    assert!(
        tokio::time::timeout(Duration::from_secs(10), up_a.requests.recv())
            .await
            .unwrap()
            .is_none()
    );
    up_b.responses.send(Ok(lds_resp("b1"))).await.unwrap();
    assert_eq!(message(&mut b).await.nonce, "b1");
    wait_open(&h, 1).await;
}

#[tokio::test]
async fn a_stream_over_the_cap_is_refused_with_resource_exhausted() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy_streams(ads.connect(), false, None, true, many(2)).await;
    let mut client = envoy_client(&h.path).await;
    let (tx_a, a, mut up_a) = open_sotw(&mut client, &mut ads, lds("a:80")).await;
    let (_tx_b, mut b, up_b) = open_sotw(&mut client, &mut ads, lds("b:80")).await;

    let (tx_c, rx_c) = mpsc::channel(8);
    tx_c.send(lds("c:80")).await.unwrap();
    let refused = client
        .stream_aggregated_resources(ReceiverStream::new(rx_c))
        .await
        .expect_err("over the cap");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");
    assert_eq!(h.metrics.streams_refused.get(), 1);
    // No upstream stream was opened for it, and the two admitted ones still relay.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), ads.sotw.recv())
            .await
            .is_err()
    );
    up_b.responses.send(Ok(lds_resp("b1"))).await.unwrap();
    assert_eq!(message(&mut b).await.nonce, "b1");

    // A stream that leaves frees its slot.
    drop((tx_a, a));
    assert!(
        tokio::time::timeout(Duration::from_secs(10), up_a.requests.recv())
            .await
            .unwrap()
            .is_none()
    );
    wait_open(&h, 1).await;
    let (_tx_d, mut d, up_d) = open_sotw(&mut client, &mut ads, lds("d:80")).await;
    up_d.responses.send(Ok(lds_resp("d1"))).await.unwrap();
    assert_eq!(message(&mut d).await.nonce, "d1");
}

/// NDS is the proxy's: only the first stream's upstream subscribes; when that stream ends, a
/// stream still open takes the subscription over on its own upstream.
#[tokio::test]
async fn one_stream_owns_nds_and_another_takes_it_over() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy_streams(ads.connect(), true, None, true, many(4)).await;
    let mut client = envoy_client(&h.path).await;
    let (tx_a, a, mut up_a) = open_sotw(&mut client, &mut ads, lds("a:80")).await;
    assert_eq!(
        next(&mut up_a.requests).await,
        req(type_url::NAME_TABLE, "")
    );
    let (_tx_b, _b, mut up_b) = open_sotw(&mut client, &mut ads, lds("b:80")).await;
    quiet(&mut up_b.requests).await;

    drop((tx_a, a));
    assert_eq!(
        next(&mut up_b.requests).await,
        req(type_url::NAME_TABLE, "")
    );
    let mut nds = resp(type_url::NAME_TABLE, "nds1");
    nds.resources
        .push(proto::pack(&table("svc.ns.svc.cluster.local")));
    up_b.responses.send(Ok(nds)).await.unwrap();
    assert_eq!(next(&mut up_b.requests).await.response_nonce, "nds1");
    assert_eq!(h.tables.lock().unwrap().len(), 1);
}

/// istiod restarts: every open stream stays open and its own upstream replays its own
/// subscriptions (and only the NDS owner's replays NDS).
#[tokio::test]
async fn every_stream_reconnects_and_replays_its_own_subscriptions() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy_streams(ads.connect(), true, None, true, many(4)).await;
    let mut client = envoy_client(&h.path).await;
    let (_tx_a, mut a, mut up_a) = open_sotw(&mut client, &mut ads, lds("a:80")).await;
    assert_eq!(
        next(&mut up_a.requests).await,
        req(type_url::NAME_TABLE, "")
    );
    let (_tx_b, mut b, up_b) = open_sotw(&mut client, &mut ads, lds("b:80")).await;

    // Both upstream streams are lost (as when istiod goes away).
    for up in [&up_a.responses, &up_b.responses] {
        up.send(Err(tonic::Status::unavailable("connection reset")))
            .await
            .unwrap();
    }
    let mut replays = std::collections::HashMap::new();
    for _ in 0..2 {
        let mut up = next(&mut ads.sotw).await;
        let first = next(&mut up.requests).await;
        assert_eq!(first.type_url, type_url::LISTENER);
        replays.insert(first.resource_names[0].clone(), up);
    }
    assert_eq!(
        h.metrics
            .upstream_reconnects
            .get_or_create(&ReconnectLabels { reason: "lost" })
            .get(),
        2
    );
    let mut up_a = replays.remove("a:80").expect("a's replay");
    let mut up_b = replays.remove("b:80").expect("b's replay");
    assert_eq!(
        next(&mut up_a.requests).await,
        req(type_url::NAME_TABLE, "")
    );
    quiet(&mut up_b.requests).await;

    up_a.responses.send(Ok(lds_resp("a2"))).await.unwrap();
    up_b.responses.send(Ok(lds_resp("b2"))).await.unwrap();
    assert_eq!(message(&mut a).await.nonce, "a2");
    assert_eq!(message(&mut b).await.nonce, "b2");
    assert_eq!(h.metrics.downstream_streams.get(), 2);
}

/// SotW and Delta streams are admitted alike: a Delta stream opened beside a SotW one leaves it
/// open, and each relays on its own upstream.
#[tokio::test]
async fn sotw_and_delta_streams_stay_open_side_by_side() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy_streams(ads.connect(), false, None, true, many(4)).await;
    let mut client = envoy_client(&h.path).await;
    let (_tx_a, mut a, up_a) = open_sotw(&mut client, &mut ads, lds("a:80")).await;
    let first = DeltaDiscoveryRequest {
        type_url: type_url::LISTENER.into(),
        resource_names_subscribe: vec!["b:80".into()],
        ..Default::default()
    };
    let (_tx_b, mut b, up_b) = open_delta(&mut client, &mut ads, first).await;
    let pushed = DeltaDiscoveryResponse {
        type_url: type_url::LISTENER.into(),
        nonce: "b1".into(),
        ..Default::default()
    };
    up_b.responses.send(Ok(pushed.clone())).await.unwrap();
    up_a.responses.send(Ok(lds_resp("a1"))).await.unwrap();
    assert_eq!(message(&mut a).await.nonce, "a1");
    let got = tokio::time::timeout(Duration::from_secs(10), b.message())
        .await
        .expect("timed out")
        .unwrap()
        .unwrap();
    assert_eq!(got, pushed);
    assert_eq!(h.metrics.downstream_streams.get(), 2);
}
