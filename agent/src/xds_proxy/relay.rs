//! One Envoy stream relayed to one upstream stream; generic over SotW and Delta.

use std::sync::Arc;
use std::time::Duration;

use proto::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use proto::google::rpc::Status as RpcStatus;
use proto::istio::nds::NameTable;
use proto::type_url;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::wire::{Head, RawResponse, UpstreamCodec};
use super::{Inputs, TerminationLabels};
use crate::health::Health;

fn health_error(h: &Health) -> Option<RpcStatus> {
    match h {
        Health::Healthy => None,
        Health::Unhealthy(msg) => Some(nack_status(msg.clone())),
    }
}

/// What differs between SotW and Delta.
pub(crate) trait Flavor: Send + Sync + 'static {
    type Req: prost::Message + Clone + Default + Send + Sync + 'static;
    /// The full response message (decoded only for NDS).
    type Resp: prost::Message + Default;
    const NAME: &'static str;
    /// The ADS method's gRPC path.
    const PATH: &'static str;
    fn req_type(r: &Self::Req) -> &str;
    /// A NACK's nonce and error detail (`None` for a request or an ACK).
    fn req_nack(r: &Self::Req) -> Option<(&str, &RpcStatus)>;
    /// The proxy's own initial NDS request.
    fn nds_subscribe() -> Self::Req;
    /// The proxy's ACK (error `None`) or NACK for an NDS response.
    fn nds_ack(resp: &Head, error: Option<String>) -> Self::Req;
    /// Workload health for istiod: a request with `error_detail` when unhealthy.
    fn health(h: &Health) -> Self::Req;
    /// The first resource of a decoded NDS response.
    fn nds_table(resp: &Self::Resp) -> Result<NameTable, String>;
}

/// Opens the upstream ADS stream: typed requests out, responses in as received.
async fn call<F: Flavor>(
    channel: tonic::transport::Channel,
    req: tonic::Request<ReceiverStream<F::Req>>,
) -> Result<tonic::Streaming<RawResponse>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(i32::MAX as usize)
        .max_encoding_message_size(usize::MAX);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unknown(format!("Service was not ready: {e}")))?;
    grpc.streaming(
        req,
        http::uri::PathAndQuery::from_static(F::PATH),
        UpstreamCodec::<F::Req>::default(),
    )
    .await
    .map(tonic::Response::into_inner)
}

/// The first resource of an NDS response, decoded from the raw response.
fn nds_table<F: Flavor>(resp: &RawResponse) -> Result<NameTable, String> {
    let full = resp
        .decode::<F::Resp>()
        .map_err(|e| format!("malformed NDS response: {e}"))?;
    F::nds_table(&full)
}

/// State-of-the-world ADS.
pub(crate) struct Sotw;
/// Incremental ADS.
pub(crate) struct Delta;

fn nack_status(error: String) -> RpcStatus {
    RpcStatus {
        code: tonic::Code::Internal as i32,
        message: error,
        details: vec![],
    }
}

impl Flavor for Sotw {
    type Req = DiscoveryRequest;
    type Resp = DiscoveryResponse;
    const NAME: &'static str = "sotw";
    const PATH: &'static str = super::SOTW_PATH;
    fn req_type(r: &DiscoveryRequest) -> &str {
        &r.type_url
    }
    fn req_nack(r: &DiscoveryRequest) -> Option<(&str, &RpcStatus)> {
        r.error_detail
            .as_ref()
            .map(|e| (r.response_nonce.as_str(), e))
    }
    fn nds_subscribe() -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: type_url::NAME_TABLE.into(),
            ..Default::default()
        }
    }
    fn nds_ack(resp: &Head, error: Option<String>) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: type_url::NAME_TABLE.into(),
            version_info: resp.version_info.clone(),
            response_nonce: resp.nonce.clone(),
            error_detail: error.map(nack_status),
            ..Default::default()
        }
    }
    fn health(h: &Health) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: type_url::HEALTH_INFO.into(),
            error_detail: health_error(h),
            ..Default::default()
        }
    }
    fn nds_table(resp: &DiscoveryResponse) -> Result<NameTable, String> {
        let any = resp
            .resources
            .first()
            .ok_or("NDS response without a resource")?;
        proto::unpack::<NameTable>(any).map_err(|e| e.to_string())
    }
}

impl Flavor for Delta {
    type Req = DeltaDiscoveryRequest;
    type Resp = DeltaDiscoveryResponse;
    const NAME: &'static str = "delta";
    const PATH: &'static str = super::DELTA_PATH;
    fn req_type(r: &DeltaDiscoveryRequest) -> &str {
        &r.type_url
    }
    fn req_nack(r: &DeltaDiscoveryRequest) -> Option<(&str, &RpcStatus)> {
        r.error_detail
            .as_ref()
            .map(|e| (r.response_nonce.as_str(), e))
    }
    fn nds_subscribe() -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: type_url::NAME_TABLE.into(),
            ..Default::default()
        }
    }
    fn nds_ack(resp: &Head, error: Option<String>) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: type_url::NAME_TABLE.into(),
            response_nonce: resp.nonce.clone(),
            error_detail: error.map(nack_status),
            ..Default::default()
        }
    }
    fn health(h: &Health) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: type_url::HEALTH_INFO.into(),
            error_detail: health_error(h),
            ..Default::default()
        }
    }
    fn nds_table(resp: &DeltaDiscoveryResponse) -> Result<NameTable, String> {
        let any = resp
            .resources
            .first()
            .and_then(|r| r.resource.as_ref())
            .ok_or("NDS response without a resource")?;
        proto::unpack::<NameTable>(any).map_err(|e| e.to_string())
    }
}

/// Types relayed to Envoy; everything else from istiod is dropped.
fn forwarded(type_url: &str) -> bool {
    type_url.starts_with("type.googleapis.com/envoy.")
        || type_url.starts_with("type.googleapis.com/istio.workload.")
}

fn termination(status: &tonic::Status) -> &'static str {
    match status.code() {
        tonic::Code::Cancelled | tonic::Code::DeadlineExceeded | tonic::Code::Unavailable => {
            "cancelled"
        }
        _ => "error",
    }
}

/// Starts relaying `downstream` until either side ends or `done` is cancelled (then Envoy's
/// stream ends with OK); returns the stream of responses for Envoy at once.
pub(crate) fn start<F: Flavor>(
    inputs: Arc<Inputs>,
    downstream: tonic::Streaming<F::Req>,
    done: CancellationToken,
) -> ReceiverStream<Result<RawResponse, tonic::Status>> {
    let queue = inputs.queue.max(1);
    let (down_tx, down_rx) = mpsc::channel::<Result<RawResponse, tonic::Status>>(queue);
    let (up_tx, up_rx) = mpsc::channel::<F::Req>(queue);
    tracing::info!(flavor = F::NAME, "Envoy connected to the xDS proxy");
    tokio::spawn(downstream_to_upstream::<F>(
        inputs.clone(),
        downstream,
        up_tx.clone(),
        done.clone(),
    ));
    tokio::spawn(upstream_to_downstream::<F>(
        inputs, up_rx, up_tx, down_tx, done,
    ));
    ReceiverStream::new(down_rx)
}

/// Sends on a bounded channel until it has room, the other side is gone or the stream is done;
/// warns when Envoy or istiod has not taken a message for 10 s.
async fn send<T>(tx: &mpsc::Sender<T>, msg: T, done: &CancellationToken, what: &str) -> bool {
    let permit = async {
        let mut warned = false;
        loop {
            match tokio::time::timeout(Duration::from_secs(10), tx.reserve()).await {
                Ok(p) => return p.ok(),
                Err(_) if !warned => {
                    warned = true;
                    tracing::warn!(to = what, "xDS proxy has been waiting over 10s to send");
                }
                Err(_) => {}
            }
        }
    };
    tokio::select! {
        p = permit => match p {
            Some(p) => { p.send(msg); true }
            None => false,
        },
        _ = done.cancelled() => false,
    }
}

async fn downstream_to_upstream<F: Flavor>(
    inputs: Arc<Inputs>,
    mut downstream: tonic::Streaming<F::Req>,
    up_tx: mpsc::Sender<F::Req>,
    done: CancellationToken,
) {
    let mut lds_seen = false;
    let mut health = inputs.health.clone();
    loop {
        let msg = tokio::select! {
            _ = done.cancelled() => break,
            changed = async {
                match health.as_mut() {
                    Some(h) => h.changed().await,
                    None => std::future::pending().await,
                }
            }, if lds_seen => {
                if changed.is_err() {
                    health = None;
                    continue;
                }
                let current = health.as_mut().and_then(|h| h.borrow_and_update().clone());
                if let Some(h) = current
                    && !send(&up_tx, F::health(&h), &done, "istiod").await
                {
                    break;
                }
                continue;
            }
            m = downstream.message() => m,
        };
        match msg {
            Ok(Some(req)) => {
                inputs.metrics.requests.inc();
                if let Some((nonce, error)) = F::req_nack(&req) {
                    // Relayed as is; logged so that a rejected config shows in the agent's log.
                    tracing::warn!(flavor = F::NAME, type_url = F::req_type(&req), nonce,
                        code = error.code, error = %error.message, "Envoy rejected an xDS response (NACK)");
                }
                let first_lds = !lds_seen && F::req_type(&req) == type_url::LISTENER;
                if !send(&up_tx, req, &done, "istiod").await {
                    break;
                }
                if first_lds {
                    lds_seen = true;
                    if inputs.nds.is_some() {
                        tracing::debug!("subscribing to NDS after Envoy's first LDS request");
                        if !send(&up_tx, F::nds_subscribe(), &done, "istiod").await {
                            break;
                        }
                    }
                    // The last known health goes to every new upstream stream.
                    let current = health.as_mut().and_then(|h| h.borrow_and_update().clone());
                    if let Some(h) = current
                        && !send(&up_tx, F::health(&h), &done, "istiod").await
                    {
                        break;
                    }
                }
            }
            Ok(None) => {
                // Half-close: istiod may still answer; the stream ends when Envoy stops
                // reading or istiod ends it.
                tracing::debug!(flavor = F::NAME, "Envoy half-closed its xDS stream");
                return;
            }
            Err(status) => {
                tracing::info!(flavor = F::NAME, status = %status, "Envoy's xDS stream ended");
                inputs
                    .metrics
                    .envoy_connection_terminations
                    .get_or_create(&TerminationLabels {
                        r#type: termination(&status),
                    })
                    .inc();
                break;
            }
        }
    }
    // Envoy is gone (or the upstream ended): close the upstream side too.
    done.cancel();
}

async fn upstream_to_downstream<F: Flavor>(
    inputs: Arc<Inputs>,
    up_rx: mpsc::Receiver<F::Req>,
    up_tx: mpsc::Sender<F::Req>,
    down_tx: mpsc::Sender<Result<RawResponse, tonic::Status>>,
    done: CancellationToken,
) {
    let fail = |status: tonic::Status| {
        inputs.metrics.istiod_connection_failures.inc();
        tracing::warn!(status = %status, "cannot open the upstream xDS stream (is istiod reachable?)");
        status
    };
    let channel = tokio::select! {
        _ = done.cancelled() => return,
        c = (inputs.upstream.connect)() => c,
    };
    let channel = match channel {
        Ok(c) => c,
        Err(e) => {
            let status = fail(tonic::Status::unavailable(format!(
                "connecting to istiod: {e}"
            )));
            let _ = down_tx.send(Err(status)).await;
            done.cancel();
            return;
        }
    };
    let mut request = tonic::Request::new(ReceiverStream::new(up_rx));
    for (k, v) in &inputs.upstream.metadata {
        match (
            tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes()),
            tonic::metadata::MetadataValue::try_from(v.as_str()),
        ) {
            (Ok(k), Ok(v)) => {
                request.metadata_mut().insert(k, v);
            }
            _ => tracing::warn!(header = %k, "skipping invalid upstream xDS header"),
        }
    }
    if let Some(token) = (inputs.upstream.token)()
        && let Ok(v) = tonic::metadata::MetadataValue::try_from(format!("Bearer {token}"))
    {
        request.metadata_mut().insert("authorization", v);
    }
    let upstream = tokio::select! {
        _ = done.cancelled() => return,
        s = call::<F>(channel, request) => s,
    };
    let mut upstream = match upstream {
        Ok(s) => s,
        Err(status) => {
            let status = fail(status);
            let _ = down_tx.send(Err(status)).await;
            done.cancel();
            return;
        }
    };
    loop {
        let msg = tokio::select! {
            _ = done.cancelled() => break,
            _ = down_tx.closed() => {
                tracing::info!(flavor = F::NAME, "Envoy disconnected from the xDS proxy");
                inputs
                    .metrics
                    .envoy_connection_terminations
                    .get_or_create(&TerminationLabels { r#type: "cancelled" })
                    .inc();
                break;
            }
            m = upstream.message() => m,
        };
        match msg {
            Ok(Some(resp)) => {
                inputs.metrics.responses.inc();
                let t = resp.type_url();
                if t == type_url::NAME_TABLE {
                    let Some(sink) = &inputs.nds else {
                        tracing::warn!("dropping an NDS response: DNS capture is off");
                        continue;
                    };
                    let result = nds_table::<F>(&resp).and_then(|table| sink(table));
                    if let Err(e) = &result {
                        tracing::warn!(error = %e, "rejecting NDS response");
                    }
                    if !send(
                        &up_tx,
                        F::nds_ack(&resp.head, result.err()),
                        &done,
                        "istiod",
                    )
                    .await
                    {
                        break;
                    }
                } else if forwarded(t) {
                    if !send(&down_tx, Ok(resp), &done, "Envoy").await {
                        break;
                    }
                } else {
                    tracing::error!(type_url = t, "dropping a response of unknown type");
                }
            }
            Ok(None) => {
                tracing::info!(flavor = F::NAME, "istiod closed the xDS stream");
                inputs
                    .metrics
                    .istiod_connection_terminations
                    .get_or_create(&TerminationLabels {
                        r#type: "cancelled",
                    })
                    .inc();
                break;
            }
            Err(status) => {
                tracing::warn!(flavor = F::NAME, status = %status, "upstream xDS stream ended");
                inputs
                    .metrics
                    .istiod_connection_terminations
                    .get_or_create(&TerminationLabels {
                        r#type: termination(&status),
                    })
                    .inc();
                // Envoy's stream ends with istiod's status.
                let _ =
                    tokio::time::timeout(Duration::from_secs(5), down_tx.send(Err(status))).await;
                break;
            }
        }
    }
    done.cancel();
}
