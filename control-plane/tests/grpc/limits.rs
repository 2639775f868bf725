//! Bounds on what one peer can make istiod-lite hold: an ADS request over 4 MiB (istiod's
//! `ISTIO_GPRC_MAXRECVMSGSIZE` default) is refused, one under it is served.

use proto::envoy::config::core::v3::Node;
use proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use tonic::Code;

/// The first answer on an ADS stream whose request's node carries `padding` bytes (`None`: the
/// stream ended without one).
async fn first_answer(
    addr: std::net::SocketAddr,
    padding: usize,
) -> Result<Option<DiscoveryResponse>, tonic::Status> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
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
