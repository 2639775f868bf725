//! Bounds on what one peer can make istiod-lite hold: an ADS request over 4 MiB (istiod's
//! `ISTIO_GPRC_MAXRECVMSGSIZE` default) is refused, one under it is served; idle connections
//! are capped overall and per peer address.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

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
    running.wait().await.expect("stopped on shutdown");
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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match first_answer_from(Some(loopback(9)), addr, 0).await {
            Ok(Some(_)) => break,
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "a proxy is served once slots free: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(second_peer);
    cancel.cancel();
    running.wait().await.expect("stopped on shutdown");
}

/// An ADS stream on `channel` after its first (CDS) answer: the request sender, the answers and
/// that answer's nonce.
async fn ads_stream(
    channel: tonic::transport::Channel,
    token: Option<&str>,
) -> (
    tokio::sync::mpsc::Sender<DiscoveryRequest>,
    tonic::Streaming<DiscoveryResponse>,
    String,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(ads_request(proto::type_url::CLUSTER, ""))
        .await
        .unwrap();
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    if let Some(t) = token {
        let bearer = format!("Bearer {t}").parse().expect("header");
        request.metadata_mut().insert("authorization", bearer);
    }
    let mut answers = AggregatedDiscoveryServiceClient::new(channel)
        .stream_aggregated_resources(request)
        .await
        .expect("stream")
        .into_inner();
    let cds = tokio::time::timeout(Duration::from_secs(10), answers.message())
        .await
        .expect("CDS in time")
        .expect("ok")
        .expect("CDS");
    (tx, answers, cds.nonce)
}

fn ads_request(type_url: &str, nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: type_url.into(),
        response_nonce: nonce.into(),
        node: Some(Node {
            id: "sidecar~198.18.0.1~a.ns~ns.svc.cluster.local".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Real time, the production deadline (10 s): the in-process server does not run on paused
/// time (its config watcher's thread), and the deadline itself is unit-tested on paused time
/// in `proto::listen::idle`.
#[tokio::test]
async fn a_connection_without_a_stream_is_closed_and_ads_streams_are_kept() {
    let (config, ca) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (running, cancel) = super::ca_grpc::start(config.path(), ca.path()).await;
    let limits = control_plane::GRPC_STREAM_LIMITS;

    // A proxy on each port (TLS: tonic's connection info differs, the streams are counted all
    // the same), its stream open from the start.
    let plain = tonic::transport::Channel::from_shared(format!("http://{}", running.grpc_addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let root = std::fs::read_to_string(ca.path().join("root-cert.pem")).expect("root");
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(root))
        .domain_name("istiod.istio-system.svc");
    let endpoint =
        tonic::transport::Channel::from_shared(format!("https://{}", running.secure_grpc_addr))
            .expect("uri")
            .tls_config(tls)
            .expect("tls");
    let secure = tokio::time::timeout(Duration::from_secs(10), endpoint.connect())
        .await
        .expect("TLS connect in time")
        .expect("tls connect");
    // The secure port's ADS wants credentials (a token of the node's namespace).
    let token = control_plane::TokenIssuer::load_or_create(ca.path())
        .expect("issuer")
        .issue("ns", "sa", "istio-ca", Duration::from_secs(600));
    let mut streams = vec![
        ads_stream(plain, None).await,
        ads_stream(secure, Some(&token)).await,
    ];

    // No HTTP/2 preface on the plaintext port; no TLS ClientHello on the secure one.
    let closed = |addr: SocketAddr| async move {
        let mut silent = TcpStream::connect(addr).await.expect("connect");
        let start = tokio::time::Instant::now();
        let mut seen = Vec::new();
        let _ = tokio::time::timeout(limits.first_stream * 3, silent.read_to_end(&mut seen))
            .await
            .unwrap_or_else(|_| panic!("{addr}: a silent connection is closed"));
        start.elapsed()
    };
    let (plain_took, secure_took) =
        tokio::join!(closed(running.grpc_addr), closed(running.secure_grpc_addr));
    for took in [plain_took, secure_took] {
        assert!(took >= limits.first_stream, "closed after {took:?}");
    }

    // Past the deadline the proxies' streams are still served.
    for (tx, answers, nonce) in &mut streams {
        // Envoy's way: ACK the CDS answer, then subscribe to LDS.
        tx.send(ads_request(proto::type_url::CLUSTER, nonce))
            .await
            .unwrap();
        tx.send(ads_request(proto::type_url::LISTENER, ""))
            .await
            .unwrap();
        let lds = tokio::time::timeout(Duration::from_secs(10), answers.message())
            .await
            .expect("LDS in time")
            .expect("ok")
            .expect("LDS");
        assert_eq!(lds.type_url, proto::type_url::LISTENER);
    }
    cancel.cancel();
    running.wait().await.expect("stopped on shutdown");
}

/// HTTP/2 frames in `bytes` as (type, stream id, payload).
fn frames(mut bytes: &[u8]) -> Vec<(u8, u32, Vec<u8>)> {
    let mut out = Vec::new();
    while bytes.len() >= 9 {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        let id = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff;
        let end = (9 + len).min(bytes.len());
        out.push((bytes[3], id, bytes[9..end].to_vec()));
        bytes = &bytes[end..];
    }
    out
}

/// A connection that opened no stream in time is closed as Go's and hyper's servers close an
/// idle one: GOAWAY (NO_ERROR, last stream 0), then a clean close. A real HTTP/2 client (h2)
/// sees its connection end without error, and a request raced onto the connection after the
/// deadline is not taken (above the GOAWAY's last stream: retryable elsewhere), nor answered
/// with a reset.
#[tokio::test]
async fn a_connection_without_a_stream_gets_a_goaway_before_it_closes() {
    use tokio::io::AsyncWriteExt;
    let (config, ca) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (running, cancel) = super::ca_grpc::start(config.path(), ca.path()).await;
    let limits = control_plane::GRPC_STREAM_LIMITS;
    let addr = running.grpc_addr;

    let h2_client = async {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let (client, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
        let start = tokio::time::Instant::now();
        let ended = tokio::time::timeout(limits.first_stream * 2, conn)
            .await
            .expect("the server ends the connection");
        (ended, start.elapsed(), client.ready().await.err())
    };
    let racing = async {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
        tokio::time::sleep(limits.first_stream + Duration::from_millis(200)).await;
        // HEADERS on stream 1 (POST, http, /), END_STREAM | END_HEADERS, sent after the
        // deadline and before reading what the server sent.
        let _ = s
            .write_all(&[0, 0, 3, 1, 5, 0, 0, 0, 1, 0x83, 0x86, 0x84])
            .await;
        let mut seen = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut seen))
            .await
            .expect("closed in time");
        (read, seen)
    };
    let ((ended, took, refused), (read, seen)) = tokio::join!(h2_client, racing);

    assert!(
        ended.is_ok(),
        "the h2 client's connection ends cleanly on the GOAWAY: {ended:?}"
    );
    assert!(took >= limits.first_stream, "after the deadline: {took:?}");
    let refused = refused.expect("no new request on a connection that went away");
    println!("h2 client after the GOAWAY: {refused:?}");
    assert!(refused.is_go_away(), "{refused:?}");

    read.expect("a clean close (FIN), no reset, even with the racing request unread");
    let goaways: Vec<_> = frames(&seen)
        .into_iter()
        .filter(|(ty, _, _)| *ty == 7)
        .collect();
    assert_eq!(goaways.len(), 1, "one GOAWAY: {:?}", frames(&seen));
    let (_, id, payload) = &goaways[0];
    assert_eq!(*id, 0, "GOAWAY is a connection frame");
    assert_eq!(
        payload[..4],
        [0, 0, 0, 0],
        "last stream 0: stream 1 was not taken"
    );
    assert_eq!(payload[4..8], [0, 0, 0, 0], "NO_ERROR");
    assert!(
        !frames(&seen)
            .iter()
            .any(|(ty, id, _)| *id == 1 && (*ty == 1 || *ty == 3)),
        "no answer or reset for the racing stream"
    );
    cancel.cancel();
    running.wait().await.expect("stopped on shutdown");
}
