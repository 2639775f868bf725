//! Warm start: the upstream stream opened before Envoy connects, taken over by Envoy's first
//! stream (`XDS_PROXY_PREFETCH`).

use proto::envoy::config::core::v3::Node;
use proto::google::rpc::Status as RpcStatus;

use super::*;

fn node() -> Node {
    Node {
        id: "sidecar~198.18.0.1~pod.ns~ns.svc.cluster.local".into(),
        cluster: "pod.ns".into(),
        ..Default::default()
    }
}

fn prefetch(delta: bool) -> Prefetch {
    Prefetch {
        node: node(),
        delta,
    }
}

/// Envoy's error for a response it rejects.
fn rejection(message: &str) -> Option<RpcStatus> {
    Some(RpcStatus {
        code: tonic::Code::InvalidArgument as i32,
        message: message.into(),
        details: vec![],
    })
}

fn nack(t: &str, nonce: &str, version: &str, message: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: t.into(),
        response_nonce: nonce.into(),
        version_info: version.into(),
        error_detail: rejection(message),
        ..Default::default()
    }
}

/// A proxy (with NDS or not) prefetching in Delta or SotW.
async fn warm(delta: bool, nds: bool) -> (FakeAds, Harness) {
    let ads = FakeAds::start().await.unwrap();
    let h = proxy(ads.connect(), nds).await;
    h.proxy.prefetch(prefetch(delta), h.token.clone());
    (ads, h)
}

type Warm<Req, Resp> = (FakeAds, Harness, UpStream<Req, Resp>);

/// [`warm`] in SotW, and the warm upstream stream it opened.
async fn warm_sotw(nds: bool) -> Warm<DiscoveryRequest, DiscoveryResponse> {
    let (mut ads, h) = warm(false, nds).await;
    let up = next(&mut ads.sotw).await;
    (ads, h, up)
}

/// [`warm`] in Delta without NDS, and the warm upstream stream it opened.
async fn warm_delta() -> Warm<DeltaDiscoveryRequest, DeltaDiscoveryResponse> {
    let (mut ads, h) = warm(true, false).await;
    let up = next(&mut ads.delta).await;
    (ads, h, up)
}

/// istiod sends `r` on the upstream stream `up`.
async fn push<Req, Resp>(up: &UpStream<Req, Resp>, r: Resp) {
    up.responses.send(Ok(r)).await.unwrap();
}

/// The upstream stream whose requests arrive on `requests` ends within 10 s.
async fn ends<T>(requests: &mut mpsc::Receiver<T>, failure: &str) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while requests.recv().await.is_some() {}
    })
    .await
    .expect(failure);
}

/// Envoy's side of a stream: its request sender and the proxy's responses.
type Envoy<Req, Resp> = (mpsc::Sender<Req>, tonic::Streaming<Resp>);

/// Envoy's stream on the proxy, opened by `open`, its first request `first` sent.
async fn envoy_stream<Req, Resp, F, Fut>(h: &Harness, first: Req, open: F) -> Envoy<Req, Resp>
where
    F: FnOnce(EnvoyClient, ReceiverStream<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<tonic::Streaming<Resp>>, tonic::Status>>,
{
    let client = envoy_client(&h.path).await;
    let (tx, rx) = mpsc::channel(8);
    tx.send(first).await.unwrap();
    let from_proxy = open(client, ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, from_proxy)
}

async fn envoy_sotw(
    h: &Harness,
    first: DiscoveryRequest,
) -> Envoy<DiscoveryRequest, DiscoveryResponse> {
    envoy_stream(h, first, |mut c, rx| async move {
        c.stream_aggregated_resources(rx).await
    })
    .await
}

async fn envoy_delta(
    h: &Harness,
    first: DeltaDiscoveryRequest,
) -> Envoy<DeltaDiscoveryRequest, DeltaDiscoveryResponse> {
    envoy_stream(h, first, |mut c, rx| async move {
        c.delta_aggregated_resources(rx).await
    })
    .await
}

/// Envoy sends `r`; it reaches istiod as it is.
async fn relayed<T: Clone + PartialEq + std::fmt::Debug>(
    tx: &mpsc::Sender<T>,
    upstream: &mut mpsc::Receiver<T>,
    r: &T,
) {
    tx.send(r.clone()).await.unwrap();
    assert_eq!(&next(upstream).await, r);
}

async fn message<T>(s: &mut tonic::Streaming<T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), s.message())
        .await
        .expect("timed out")
        .unwrap()
        .unwrap()
}

/// Nothing more arrives on `rx` within a short while.
async fn quiet<T: std::fmt::Debug>(rx: &mut mpsc::Receiver<T>) {
    if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
        panic!("unexpected {m:?}");
    }
}

/// SotW: the upstream stream opens before Envoy with the bootstrap's node, CDS then LDS; Envoy's
/// first requests are answered with istiod's newest responses (a change pushed before Envoy
/// asked is not lost) and not repeated upstream; Envoy's ACK and its NACK (with its error)
/// answer istiod's nonces on the same upstream stream; Envoy's later subscriptions and istiod's
/// later pushes pass as ever.
#[tokio::test]
async fn sotw_envoy_takes_over_the_prefetched_stream() {
    let (mut ads, h, mut up) = warm_sotw(false).await;
    assert_eq!(up.metadata.get("authorization").unwrap(), "Bearer tok123");
    let cds = next(&mut up.requests).await;
    assert_eq!(cds.type_url, type_url::CLUSTER);
    assert_eq!(cds.node, Some(node()));
    assert!(cds.resource_names.is_empty() && cds.response_nonce.is_empty());
    assert_eq!(next(&mut up.requests).await, req(type_url::LISTENER, ""));

    // istiod answers, and pushes a change before Envoy is there.
    push(&up, resp(type_url::CLUSTER, "c1")).await;
    push(&up, resp(type_url::LISTENER, "l1")).await;
    push(&up, resp(type_url::CLUSTER, "c2")).await;

    let mut first = req(type_url::CLUSTER, "");
    first.node = Some(Node {
        user_agent_name: "envoy".into(),
        ..node()
    });
    let (tx, mut from_proxy) = envoy_sotw(&h, first).await;
    assert_eq!(
        message(&mut from_proxy).await,
        resp(type_url::CLUSTER, "c2")
    );
    // One upstream stream, and Envoy's first CDS request not repeated on it.
    let mut ack = req(type_url::CLUSTER, "c2");
    ack.version_info = "v-c2".into();
    relayed(&tx, &mut up.requests, &ack).await;

    tx.send(req(type_url::LISTENER, "")).await.unwrap();
    assert_eq!(
        message(&mut from_proxy).await,
        resp(type_url::LISTENER, "l1")
    );
    let rejected = nack(type_url::LISTENER, "l1", "", "listener 'x': bad filter");
    relayed(&tx, &mut up.requests, &rejected).await;

    // Envoy's own later subscription goes upstream; the answer and later pushes reach Envoy.
    let mut eds = req(type_url::ENDPOINT, "");
    eds.resource_names = vec!["outbound|80||a.ns.svc.cluster.local".into()];
    relayed(&tx, &mut up.requests, &eds).await;
    push(&up, resp(type_url::ENDPOINT, "e1")).await;
    assert_eq!(
        message(&mut from_proxy).await,
        resp(type_url::ENDPOINT, "e1")
    );
    push(&up, resp(type_url::CLUSTER, "c3")).await;
    assert_eq!(
        message(&mut from_proxy).await,
        resp(type_url::CLUSTER, "c3")
    );
    assert_eq!(h.metrics.prefetch_served.get(), 2);
    assert!(ads.sotw.try_recv().is_err(), "a second upstream stream");
    quiet(&mut up.requests).await;
}

fn delta_resp(t: &str, nonce: &str, names: &[&str]) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        type_url: t.into(),
        nonce: nonce.into(),
        resources: names
            .iter()
            .map(|n| Resource {
                name: (*n).into(),
                version: format!("{n}-{nonce}"),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn delta_req(t: &str, nonce: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: t.into(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

/// Delta: every response istiod sent before Envoy asked reaches Envoy, in istiod's order; a
/// NACK of a prefetched response reaches istiod with Envoy's error.
#[tokio::test]
async fn delta_envoy_gets_every_prefetched_response_in_order() {
    let (mut ads, h, mut up) = warm_delta().await;
    let cds = next(&mut up.requests).await;
    assert_eq!(
        (cds.type_url.as_str(), cds.node),
        (type_url::CLUSTER, Some(node()))
    );
    assert_eq!(
        next(&mut up.requests).await,
        delta_req(type_url::LISTENER, "")
    );
    let c1 = delta_resp(type_url::CLUSTER, "c1", &["a", "b"]);
    let c2 = DeltaDiscoveryResponse {
        removed_resources: vec!["a".into()],
        ..delta_resp(type_url::CLUSTER, "c2", &["c"])
    };
    let l1 = delta_resp(type_url::LISTENER, "l1", &["virtualInbound"]);
    for r in [&c1, &l1, &c2] {
        push(&up, r.clone()).await;
    }

    let first = DeltaDiscoveryRequest {
        node: Some(node()),
        ..delta_req(type_url::CLUSTER, "")
    };
    let (tx, mut from_proxy) = envoy_delta(&h, first).await;
    assert_eq!(message(&mut from_proxy).await, c1);
    assert_eq!(message(&mut from_proxy).await, c2);
    for n in ["c1", "c2"] {
        relayed(&tx, &mut up.requests, &delta_req(type_url::CLUSTER, n)).await;
    }
    tx.send(delta_req(type_url::LISTENER, "")).await.unwrap();
    assert_eq!(message(&mut from_proxy).await, l1);
    let rejected = DeltaDiscoveryRequest {
        error_detail: rejection("listener 'virtualInbound': bad filter"),
        ..delta_req(type_url::LISTENER, "l1")
    };
    relayed(&tx, &mut up.requests, &rejected).await;
    assert_eq!(h.metrics.prefetch_served.get(), 3);
    assert!(ads.delta.try_recv().is_err(), "a second upstream stream");
}

/// Envoy speaking the other flavor than its bootstrap named, or a second Envoy stream: the
/// warm stream is not used; the stream is relayed as without prefetch.
#[tokio::test]
async fn another_flavor_ends_the_warm_stream_and_is_relayed_cold() {
    let (mut ads, h, mut warm) = warm_delta().await;
    next(&mut warm.requests).await;
    let (_tx, mut from_proxy) = envoy_sotw(&h, req(type_url::CLUSTER, "")).await;
    let mut up = next(&mut ads.sotw).await;
    assert_eq!(next(&mut up.requests).await, req(type_url::CLUSTER, ""));
    push(&up, resp(type_url::CLUSTER, "c1")).await;
    assert_eq!(
        message(&mut from_proxy).await,
        resp(type_url::CLUSTER, "c1")
    );
    // The warm stream's upstream ends.
    ends(&mut warm.requests, "the warm upstream stream stays open").await;
    assert_eq!(h.metrics.prefetch_served.get(), 0);
}

/// The warm stream subscribes to NDS at once (the DNS table is filled before Envoy starts),
/// and Envoy's first LDS request does not subscribe it a second time.
#[tokio::test]
async fn the_warm_stream_takes_nds_before_envoy() {
    let (_ads, h, mut up) = warm_sotw(true).await;
    next(&mut up.requests).await;
    next(&mut up.requests).await;
    assert_eq!(next(&mut up.requests).await, req(type_url::NAME_TABLE, ""));
    let mut nds = resp(type_url::NAME_TABLE, "nds1");
    nds.resources
        .push(proto::pack(&table("svc.ns.svc.cluster.local")));
    push(&up, nds).await;
    assert_eq!(next(&mut up.requests).await.response_nonce, "nds1");
    assert_eq!(h.tables.lock().unwrap().len(), 1);
    push(&up, resp(type_url::LISTENER, "l1")).await;
    let (_tx, mut from_proxy) = envoy_sotw(&h, req(type_url::LISTENER, "")).await;
    assert_eq!(
        message(&mut from_proxy).await,
        resp(type_url::LISTENER, "l1")
    );
    quiet(&mut up.requests).await;
}

/// Shutdown before any Envoy connected ends the warm stream.
#[tokio::test]
async fn shutdown_ends_a_warm_stream_no_envoy_took() {
    let mut ads = FakeAds::start().await.unwrap();
    let h = proxy(ads.connect(), false).await;
    let token = CancellationToken::new();
    h.proxy.prefetch(prefetch(false), token.clone());
    let mut up = next(&mut ads.sotw).await;
    next(&mut up.requests).await;
    token.cancel();
    ends(
        &mut up.requests,
        "the warm upstream stream stays open after shutdown",
    )
    .await;
}

fn eds_cluster(name: &str) -> proto::envoy_types_crate::pb::google::protobuf::Any {
    use proto::envoy::config::cluster::v3 as c;
    proto::pack(&c::Cluster {
        name: name.into(),
        cluster_discovery_type: Some(c::cluster::ClusterDiscoveryType::Type(
            c::cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(c::cluster::EdsClusterConfig {
            service_name: name.into(),
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn rds_listener(name: &str, route: &str) -> proto::envoy_types_crate::pb::google::protobuf::Any {
    use proto::envoy::config::listener::v3 as l;
    use proto::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;
    let manager = hcm::HttpConnectionManager {
        route_specifier: Some(hcm::http_connection_manager::RouteSpecifier::Rds(
            hcm::Rds {
                route_config_name: route.into(),
                ..Default::default()
            },
        )),
        ..Default::default()
    };
    proto::pack(&l::Listener {
        name: name.into(),
        filter_chains: vec![l::FilterChain {
            filters: vec![l::Filter {
                name: "envoy.filters.network.http_connection_manager".into(),
                config_type: Some(l::filter::ConfigType::TypedConfig(proto::pack(&manager))),
            }],
            ..Default::default()
        }],
        ..Default::default()
    })
}

/// SotW: the EDS names of the held CDS and the RDS names of the held LDS are subscribed before
/// Envoy runs; Envoy's own EDS and RDS requests for them are answered from what is held.
#[tokio::test]
async fn sotw_eds_and_rds_named_by_held_responses_are_prefetched() {
    let (_ads, h, mut up) = warm_sotw(false).await;
    next(&mut up.requests).await;
    next(&mut up.requests).await;
    let svc = "outbound|80||a.ns.svc.cluster.local";
    let mut cds = resp(type_url::CLUSTER, "c1");
    cds.resources = vec![eds_cluster(svc)];
    push(&up, cds.clone()).await;
    let mut eds = req(type_url::ENDPOINT, "");
    eds.resource_names = vec![svc.into()];
    assert_eq!(next(&mut up.requests).await, eds);
    let mut lds = resp(type_url::LISTENER, "l1");
    lds.resources = vec![rds_listener("0.0.0.0_80", "80")];
    push(&up, lds.clone()).await;
    let mut rds = req(type_url::ROUTE, "");
    rds.resource_names = vec!["80".into()];
    assert_eq!(next(&mut up.requests).await, rds);
    for r in [resp(type_url::ENDPOINT, "e1"), resp(type_url::ROUTE, "r1")] {
        push(&up, r).await;
    }

    let (tx, mut from_proxy) = envoy_sotw(&h, req(type_url::CLUSTER, "")).await;
    assert_eq!(message(&mut from_proxy).await, cds);
    tx.send(eds.clone()).await.unwrap();
    assert_eq!(
        message(&mut from_proxy).await,
        resp(type_url::ENDPOINT, "e1")
    );
    tx.send(req(type_url::LISTENER, "")).await.unwrap();
    assert_eq!(message(&mut from_proxy).await, lds);
    tx.send(rds.clone()).await.unwrap();
    assert_eq!(message(&mut from_proxy).await, resp(type_url::ROUTE, "r1"));
    // None of Envoy's four first requests went upstream; its ACK does.
    let mut ack = req(type_url::ROUTE, "r1");
    ack.version_info = "v-r1".into();
    ack.resource_names = vec!["80".into()];
    relayed(&tx, &mut up.requests, &ack).await;
    assert_eq!(h.metrics.prefetch_served.get(), 4);
}

/// Delta: a NACK of a prefetched LDS unsubscribes the routes it named (Envoy did not ask for
/// them), after relaying Envoy's NACK with its error.
#[tokio::test]
async fn delta_nack_of_a_held_lds_lets_go_of_its_routes() {
    let (_ads, h, mut up) = warm_delta().await;
    next(&mut up.requests).await;
    next(&mut up.requests).await;
    let lds = DeltaDiscoveryResponse {
        resources: vec![Resource {
            name: "0.0.0.0_80".into(),
            version: "1".into(),
            resource: Some(rds_listener("0.0.0.0_80", "80")),
            ..Default::default()
        }],
        ..delta_resp(type_url::LISTENER, "l1", &[])
    };
    push(&up, lds.clone()).await;
    assert_eq!(
        next(&mut up.requests).await,
        DeltaDiscoveryRequest {
            resource_names_subscribe: vec!["80".into()],
            ..delta_req(type_url::ROUTE, "")
        }
    );
    let (tx, mut from_proxy) = envoy_delta(&h, delta_req(type_url::LISTENER, "")).await;
    assert_eq!(message(&mut from_proxy).await, lds);
    let rejected = DeltaDiscoveryRequest {
        error_detail: rejection("listener '0.0.0.0_80': bad filter"),
        ..delta_req(type_url::LISTENER, "l1")
    };
    relayed(&tx, &mut up.requests, &rejected).await;
    assert_eq!(
        next(&mut up.requests).await,
        DeltaDiscoveryRequest {
            resource_names_unsubscribe: vec!["80".into()],
            ..delta_req(type_url::ROUTE, "")
        }
    );
}

/// The warm stream's upstream lost before Envoy connects: the new upstream stream replays its
/// subscriptions (with the node), what the lost one sent is dropped, Envoy gets the new one's.
#[tokio::test]
async fn a_warm_stream_lost_before_envoy_reconnects_and_serves_the_new_streams_responses() {
    let (mut ads, h, mut up) = warm_sotw(false).await;
    next(&mut up.requests).await;
    next(&mut up.requests).await;
    push(&up, resp(type_url::CLUSTER, "old")).await;
    drop(up);
    let mut up = next(&mut ads.sotw).await;
    let cds = next(&mut up.requests).await;
    assert_eq!(
        (cds.type_url.as_str(), cds.node),
        (type_url::CLUSTER, Some(node()))
    );
    assert_eq!(next(&mut up.requests).await, req(type_url::LISTENER, ""));
    push(&up, resp(type_url::CLUSTER, "new")).await;
    // The response is held before Envoy asks.
    tokio::time::timeout(Duration::from_secs(10), async {
        while h.metrics.responses.get() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the new stream's CDS reaches the proxy");
    let (tx, mut from_proxy) = envoy_sotw(&h, req(type_url::CLUSTER, "")).await;
    assert_eq!(
        message(&mut from_proxy).await,
        resp(type_url::CLUSTER, "new")
    );
    let mut ack = req(type_url::CLUSTER, "new");
    ack.version_info = "v-new".into();
    relayed(&tx, &mut up.requests, &ack).await;
    assert_eq!(h.metrics.prefetch_served.get(), 1);
}
