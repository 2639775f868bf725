//! The push machinery over real gRPC, with a scripted client acting like Envoy: ACK/NACK
//! tracking, one un-acked push per type, pushes only for changed views, Delta add/remove.

use std::sync::Arc;
use std::time::Duration;

use control_plane::{
    AdsInputs, AdsServer, Config, MeshSettings, Snapshot, SyncTable, XdsMetrics, parse_file,
};
use prometheus_client::registry::Registry;
use proto::envoy::config::core::v3::Node;
use proto::envoy::config::endpoint::v3::ClusterLoadAssignment;
use proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use proto::google::rpc::Status as RpcStatus;
use proto::type_url::{CLUSTER, ENDPOINT, LISTENER, ROUTE};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;

fn yaml(endpoint: &str, extra_host: bool) -> String {
    let mut y = format!(
        r#"
kind: ServiceEntry
metadata: {{name: api, namespace: web}}
spec:
  hosts: [api.example.com]
  addresses: [198.18.10.1]
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: {endpoint}}}]
"#
    );
    if extra_host {
        y.push_str("---\nkind: ServiceEntry\nmetadata: {name: db, namespace: web}\nspec: {hosts: [db.example.com], ports: [{number: 5432, name: tcp}], resolution: STATIC, endpoints: [{address: 198.18.0.20}]}\n");
    }
    y
}

fn snap(text: &str, version: u64) -> Arc<Snapshot> {
    let config = Config::from_objects(parse_file("t.yaml", text).expect("valid"));
    Arc::new(Snapshot::new(
        Arc::new(config),
        Arc::new(MeshSettings::default()),
        version,
    ))
}

struct Harness {
    snapshots: watch::Sender<Arc<Snapshot>>,
    sync: SyncTable,
    client: AggregatedDiscoveryServiceClient<tonic::transport::Channel>,
    cancel: CancellationToken,
}

async fn harness(initial: Arc<Snapshot>) -> Harness {
    let (tx, rx) = watch::channel(initial);
    let sync = SyncTable::default();
    let cancel = CancellationToken::new();
    let ads = AdsServer::new(AdsInputs {
        snapshots: rx,
        fixed: None,
        push_throttle: 4,
        metrics: XdsMetrics::new(&mut Registry::default()),
        sync: sync.clone(),
        cancel: cancel.clone(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let c = cancel.clone();
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(ads.service(64 << 20))
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                c.cancelled(),
            )
            .await;
    });
    let client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    Harness {
        snapshots: tx,
        sync,
        client,
        cancel,
    }
}

fn node() -> Node {
    Node {
        id: "sidecar~198.18.0.100~client.web~web.svc.cluster.local".into(),
        ..Default::default()
    }
}

struct Sotw {
    tx: mpsc::Sender<DiscoveryRequest>,
    rx: Streaming<DiscoveryResponse>,
}

impl Sotw {
    async fn open(h: &mut Harness) -> Sotw {
        let (tx, rx) = mpsc::channel(16);
        let resp = h
            .client
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await
            .expect("stream");
        Sotw {
            tx,
            rx: resp.into_inner(),
        }
    }

    async fn send(&self, type_url: &str, names: &[&str], nonce: &str, error: Option<&str>) {
        self.tx
            .send(DiscoveryRequest {
                node: Some(node()),
                type_url: type_url.into(),
                resource_names: names.iter().map(|s| s.to_string()).collect(),
                response_nonce: nonce.into(),
                error_detail: error.map(|m| RpcStatus {
                    code: 13,
                    message: m.into(),
                    details: vec![],
                }),
                ..Default::default()
            })
            .await
            .expect("send");
    }

    async fn recv(&mut self) -> DiscoveryResponse {
        tokio::time::timeout(Duration::from_secs(5), self.rx.message())
            .await
            .expect("a response within 5 s")
            .expect("stream ok")
            .expect("not closed")
    }

    /// Asserts nothing arrives for a while.
    async fn quiet(&mut self) {
        if let Ok(r) = tokio::time::timeout(Duration::from_millis(300), self.rx.message()).await {
            panic!("unexpected push: {r:?}");
        }
    }

    /// Subscribes to a type and ACKs the answer; returns it.
    async fn subscribe(&mut self, type_url: &str, names: &[&str]) -> DiscoveryResponse {
        self.send(type_url, names, "", None).await;
        let r = self.recv().await;
        assert_eq!(r.type_url, type_url);
        self.send(type_url, names, &r.nonce, None).await;
        r
    }
}

fn status(h: &Harness, ty: &str) -> (String, Option<String>) {
    let rows = h.sync.rows();
    let t = &rows[0].types[ty];
    (t.status.to_string(), t.nack.clone())
}

const EDS_NAME: &str = "outbound|80||api.example.com";

#[tokio::test]
async fn sotw_pushes_only_changed_types_and_tracks_acks() {
    let mut h = harness(snap(&yaml("198.18.0.5", false), 1)).await;
    let mut s = Sotw::open(&mut h).await;
    let cds = s.subscribe(CLUSTER, &[]).await;
    assert!(cds.resources.len() >= 4, "{} clusters", cds.resources.len());
    let eds = s.subscribe(ENDPOINT, &[EDS_NAME]).await;
    assert_eq!(eds.resources.len(), 1);
    s.subscribe(LISTENER, &[]).await;
    let rds = s.subscribe(ROUTE, &["80"]).await;
    assert_eq!(rds.resources.len(), 1);
    s.quiet().await;
    for ty in ["CDS", "EDS", "LDS", "RDS"] {
        assert_eq!(status(&h, ty).0, "SYNCED", "{ty}");
    }
    assert_eq!(status(&h, "NDS").0, "NOT SENT");

    // A WorkloadEntry change reaches only EDS.
    h.snapshots
        .send_replace(snap(&yaml("198.18.0.6", false), 2));
    let push = s.recv().await;
    assert_eq!(push.type_url, ENDPOINT);
    assert_eq!(push.version_info, h.snapshots.borrow().version);
    assert_eq!(status(&h, "EDS").0, "STALE", "sent, not yet acked");
    s.send(ENDPOINT, &[EDS_NAME], &push.nonce, None).await;
    s.quiet().await;
    assert_eq!(status(&h, "EDS").0, "SYNCED");

    // A snapshot that changes nothing for this proxy pushes nothing.
    h.snapshots
        .send_replace(snap(&yaml("198.18.0.6", false), 3));
    s.quiet().await;

    // NACK: logged and tracked, nothing re-sent.
    h.snapshots
        .send_replace(snap(&yaml("198.18.0.7", false), 4));
    let push = s.recv().await;
    s.send(ENDPOINT, &[EDS_NAME], &push.nonce, Some("bad endpoint"))
        .await;
    s.quiet().await;
    assert_eq!(
        status(&h, "EDS"),
        ("STALE".into(), Some("code 13: bad endpoint".into()))
    );
    // syncz says which type and which push were rejected.
    let rows = h.sync.rows();
    assert_eq!(rows[0].types["EDS"].type_url, ENDPOINT);
    assert_eq!(
        rows[0].types["EDS"].nack_nonce.as_deref(),
        Some(push.nonce.as_str())
    );
    // The next change is pushed again and ACKed.
    h.snapshots
        .send_replace(snap(&yaml("198.18.0.8", false), 5));
    let push = s.recv().await;
    s.send(ENDPOINT, &[EDS_NAME], &push.nonce, None).await;
    s.quiet().await;
    assert_eq!(status(&h, "EDS"), ("SYNCED".into(), None));
    assert_eq!(h.sync.rows()[0].types["EDS"].nack_nonce, None);
    h.cancel.cancel();
}

#[tokio::test]
async fn at_most_one_unacked_push_per_type() {
    let mut h = harness(snap(&yaml("198.18.0.5", false), 1)).await;
    let mut s = Sotw::open(&mut h).await;
    s.subscribe(CLUSTER, &[]).await;
    // A new service changes CDS: pushed, but not ACKed.
    h.snapshots.send_replace(snap(&yaml("198.18.0.5", true), 2));
    let first = s.recv().await;
    assert_eq!(first.type_url, CLUSTER);
    // Two more changes while the push is un-acked: held back.
    h.snapshots
        .send_replace(snap(&yaml("198.18.0.5", false), 3));
    h.snapshots.send_replace(snap(&yaml("198.18.0.5", true), 4));
    // db disappears (3) then comes back (4): the latest view is what counts.
    h.snapshots
        .send_replace(snap(&yaml("198.18.0.5", false), 5));
    s.quiet().await;
    // The ACK releases exactly one push with the latest state.
    s.send(CLUSTER, &[], &first.nonce, None).await;
    let second = s.recv().await;
    assert_eq!(second.type_url, CLUSTER);
    assert_eq!(
        second.resources.len(),
        first.resources.len() - 1,
        "db removed again"
    );
    assert!(
        second.version_info.ends_with("/5"),
        "{}",
        second.version_info
    );
    s.send(CLUSTER, &[], &second.nonce, None).await;
    s.quiet().await;
    // A stale nonce is ignored.
    s.send(CLUSTER, &[], &first.nonce, None).await;
    s.quiet().await;
    assert_eq!(status(&h, "CDS").0, "SYNCED");
    h.cancel.cancel();
}

#[tokio::test]
async fn delta_sends_changes_and_removals() {
    let mut h = harness(snap(&yaml("198.18.0.5", true), 1)).await;
    let (tx, rx) = mpsc::channel(16);
    let mut stream = h
        .client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    let mut recv = async || -> DeltaDiscoveryResponse {
        tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("response within 5 s")
            .expect("ok")
            .expect("open")
    };
    let req = |type_url: &str, sub: &[&str], nonce: &str| DeltaDiscoveryRequest {
        node: Some(node()),
        type_url: type_url.into(),
        resource_names_subscribe: sub.iter().map(|s| s.to_string()).collect(),
        response_nonce: nonce.into(),
        ..Default::default()
    };
    tx.send(req(CLUSTER, &[], "")).await.expect("send");
    let cds = recv().await;
    let names: Vec<&str> = cds.resources.iter().map(|r| r.name.as_str()).collect();
    assert!(
        names.contains(&"outbound|5432||db.example.com"),
        "{names:?}"
    );
    assert!(cds.resources.iter().all(|r| !r.version.is_empty()));
    tx.send(req(CLUSTER, &[], &cds.nonce)).await.expect("ack");
    tx.send(req(ENDPOINT, &[EDS_NAME], "")).await.expect("send");
    let eds = recv().await;
    assert_eq!(eds.resources.len(), 1);
    tx.send(req(ENDPOINT, &[], &eds.nonce)).await.expect("ack");

    // Removing db: CDS sends only the removal; EDS is unchanged for the subscribed name.
    h.snapshots
        .send_replace(snap(&yaml("198.18.0.5", false), 2));
    let push = recv().await;
    assert_eq!(push.type_url, CLUSTER);
    assert!(push.resources.is_empty(), "nothing changed, only removed");
    assert_eq!(
        push.removed_resources,
        vec!["outbound|5432||db.example.com"]
    );
    tx.send(req(CLUSTER, &[], &push.nonce)).await.expect("ack");
    // An endpoint change: only the changed resource.
    h.snapshots
        .send_replace(snap(&yaml("198.18.0.9", false), 3));
    let push = recv().await;
    assert_eq!(push.type_url, ENDPOINT);
    assert_eq!(push.resources.len(), 1);
    tx.send(req(ENDPOINT, &[], &push.nonce)).await.expect("ack");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), stream.message())
            .await
            .is_err(),
        "no further pushes"
    );
    let rows = h.sync.rows();
    assert_eq!(rows[0].stream, "delta");
    assert_eq!(rows[0].types["CDS"].status, "SYNCED");
    assert_eq!(rows[0].types["EDS"].status, "SYNCED");
    h.cancel.cancel();
}

/// Istio answers EDS for a cluster it has no service for with an empty assignment (a slow Envoy
/// may ask for clusters of a config that is gone); without it the cluster warms until Envoy's
/// initial-fetch timeout.
#[tokio::test]
async fn eds_for_an_unknown_cluster_is_an_empty_assignment() {
    let gone = "outbound|80||gone.example.com";
    let mut h = harness(snap(&yaml("198.18.0.5", false), 1)).await;
    let mut s = Sotw::open(&mut h).await;
    let eds = s.subscribe(ENDPOINT, &[EDS_NAME, gone]).await;
    let mut names: Vec<String> = eds
        .resources
        .iter()
        .map(|r| {
            let cla: ClusterLoadAssignment = prost::Message::decode(&r.value[..]).expect("CLA");
            if cla.cluster_name == gone {
                assert!(cla.endpoints.is_empty(), "{cla:?}");
            }
            cla.cluster_name
        })
        .collect();
    names.sort();
    assert_eq!(names, [EDS_NAME, gone]);
    h.cancel.cancel();
}

#[tokio::test]
async fn a_stream_without_a_node_is_refused() {
    let mut h = harness(snap("", 1)).await;
    let (tx, rx) = mpsc::channel(4);
    let mut stream = h
        .client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    tx.send(DiscoveryRequest {
        type_url: CLUSTER.into(),
        ..Default::default()
    })
    .await
    .expect("send");
    let err = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("answer")
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("node"), "{}", err.message());
    h.cancel.cancel();
}
