//! Bounds on what one peer can make istiod-lite hold: an ADS request over 4 MiB (istiod's
//! `ISTIO_GPRC_MAXRECVMSGSIZE` default) is refused, one under it is served; idle connections
//! are capped overall and per peer address.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use proto::envoy::config::core::v3::Node;
use proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};
use tonic::Code;

/// The first answer on an ADS stream whose request's node carries `padding` bytes (`None`: the
/// stream ended without one).
async fn first_answer(
    addr: SocketAddr,
    padding: usize,
) -> Result<Option<DiscoveryResponse>, tonic::Status> {
    first_answer_from(None, addr, padding).await
}

/// [`first_answer`] from the local address `source` (`None`: the system's choice).
async fn first_answer_from(
    source: Option<IpAddr>,
    addr: SocketAddr,
    padding: usize,
) -> Result<Option<DiscoveryResponse>, tonic::Status> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .local_address(source)
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connect: {e}")))?;
    let mut client =
        AggregatedDiscoveryServiceClient::new(channel).max_encoding_message_size(usize::MAX);
    let request = DiscoveryRequest {
        type_url: proto::type_url::CLUSTER.into(),
        node: Some(Node {
            id: "sidecar~198.18.0.1~a.ns~ns.svc.cluster.local".into(),
            user_agent_name: "x".repeat(padding),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut answers = client
        .stream_aggregated_resources(futures::stream::iter(vec![request]))
        .await?
        .into_inner();
    answers.message().await
}

#[tokio::test]
async fn an_ads_request_over_4_mib_is_refused() {
    let (config, ca) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (running, cancel) = super::ca_grpc::start(config.path(), ca.path()).await;
    let served = first_answer(running.grpc_addr, 3 << 20).await;
    assert!(
        matches!(served, Ok(Some(_))),
        "a 3 MiB request is served: {served:?}"
    );
    let refused = first_answer(running.grpc_addr, 5 << 20)
        .await
        .expect_err("a 5 MiB request is refused");
    assert!(
        refused.code() == Code::OutOfRange && refused.message().contains("too large"),
        "{refused:?}"
    );
    cancel.cancel();
    running.wait().await;
}

fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// Opens `n` idle TCP connections from `source` to istiod-lite's plaintext gRPC port, one after
/// the other; returns those it kept (its HTTP/2 SETTINGS arrived) and how many it closed at once
/// (EOF before any byte: over a cap).
async fn open_idle(source: IpAddr, addr: SocketAddr, n: usize) -> (Vec<TcpStream>, usize) {
    let (mut kept, mut closed) = (Vec::new(), 0);
    for _ in 0..n {
        let socket = TcpSocket::new_v4().expect("socket");
        socket.bind(SocketAddr::new(source, 0)).expect("bind");
        let mut conn = socket.connect(addr).await.expect("connect");
        let mut first = [0; 64];
        match conn.read(&mut first).await {
            Ok(0) | Err(_) => closed += 1,
            Ok(_) => kept.push(conn),
        }
    }
    (kept, closed)
}

#[tokio::test]
async fn idle_connections_are_capped_overall_and_per_peer_address() {
    let (config, ca) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let caps = proto::listen::Caps {
        total: 8,
        per_peer: 4,
    };
    let (running, cancel) = super::ca_grpc::start_with_caps(config.path(), ca.path(), caps).await;
    let addr = running.grpc_addr;

    // One peer: 4 of its 10 idle connections kept, the rest closed at once.
    let (first_peer, closed) = open_idle(loopback(2), addr, 10).await;
    assert_eq!((first_peer.len(), closed), (4, 6), "per peer");
    // A second: 4 more, and the total (8) is reached; a third gets nothing.
    let (second_peer, closed) = open_idle(loopback(3), addr, 10).await;
    assert_eq!((second_peer.len(), closed), (4, 6), "per peer");
    let (third_peer, closed) = open_idle(loopback(4), addr, 10).await;
    assert_eq!((third_peer.len(), closed), (0, 10), "overall");
    let refused = first_answer_from(Some(loopback(9)), addr, 0).await;
    assert!(refused.is_err(), "no slot left for a proxy: {refused:?}");

    // The first peer leaves: a proxy is served beside the second peer's idle connections (the
    // server frees the slots as it reads the closes).
    drop(first_peer);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match first_answer_from(Some(loopback(9)), addr, 0).await {
            Ok(Some(_)) => break,
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "a proxy is served once slots free: {other:?}"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    drop(second_peer);
    cancel.cancel();
    running.wait().await;
}
