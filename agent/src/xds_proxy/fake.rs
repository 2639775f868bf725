//! A fake ADS server for tests: a real tonic server on `127.0.0.1:0`. Each stream it accepts is
//! handed to the test as a [`FakeStream`], whose requests the test reads and whose responses the
//! test sends (bounded channels, so a test that stops reading exerts backpressure).

use std::net::SocketAddr;

use proto::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use proto::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

/// One ADS stream as the test sees it.
pub struct FakeStream<Req, Resp> {
    pub metadata: tonic::metadata::MetadataMap,
    pub requests: mpsc::Receiver<Req>,
    pub responses: mpsc::Sender<Result<Resp, tonic::Status>>,
}

/// Capacity of each fake stream's request and response channels.
pub const CAPACITY: usize = 1;

#[derive(Clone)]
struct Service {
    sotw: mpsc::Sender<FakeStream<DiscoveryRequest, DiscoveryResponse>>,
    delta: mpsc::Sender<FakeStream<DeltaDiscoveryRequest, DeltaDiscoveryResponse>>,
}

async fn accept<Req: Send + 'static, Resp: Send + 'static>(
    streams: &mpsc::Sender<FakeStream<Req, Resp>>,
    request: tonic::Request<tonic::Streaming<Req>>,
) -> Result<tonic::Response<ReceiverStream<Result<Resp, tonic::Status>>>, tonic::Status> {
    let metadata = request.metadata().clone();
    let mut incoming = request.into_inner();
    let (req_tx, req_rx) = mpsc::channel(CAPACITY);
    let (resp_tx, resp_rx) = mpsc::channel(CAPACITY);
    tokio::spawn(async move {
        while let Ok(Some(r)) = incoming.message().await {
            if req_tx.send(r).await.is_err() {
                break;
            }
        }
    });
    streams
        .send(FakeStream {
            metadata,
            requests: req_rx,
            responses: resp_tx,
        })
        .await
        .map_err(|_| tonic::Status::unavailable("fake ADS is not accepting streams"))?;
    Ok(tonic::Response::new(ReceiverStream::new(resp_rx)))
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Service {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, tonic::Status>>;
    type DeltaAggregatedResourcesStream =
        ReceiverStream<Result<DeltaDiscoveryResponse, tonic::Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::StreamAggregatedResourcesStream>, tonic::Status> {
        accept(&self.sotw, request).await
    }

    async fn delta_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::DeltaAggregatedResourcesStream>, tonic::Status> {
        accept(&self.delta, request).await
    }
}

/// The running fake server.
pub struct FakeAds {
    pub addr: SocketAddr,
    pub sotw: mpsc::Receiver<FakeStream<DiscoveryRequest, DiscoveryResponse>>,
    pub delta: mpsc::Receiver<FakeStream<DeltaDiscoveryRequest, DeltaDiscoveryResponse>>,
    stop: CancellationToken,
}

impl FakeAds {
    /// Starts on `127.0.0.1:0`.
    pub async fn start() -> std::io::Result<FakeAds> {
        Self::start_on("127.0.0.1:0".parse().map_err(std::io::Error::other)?).await
    }

    /// Starts on `addr` (a restart on the same port).
    pub async fn start_on(addr: SocketAddr) -> std::io::Result<FakeAds> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (sotw_tx, sotw) = mpsc::channel(16);
        let (delta_tx, delta) = mpsc::channel(16);
        let stop = CancellationToken::new();
        let svc = Service {
            sotw: sotw_tx,
            delta: delta_tx,
        };
        let token = stop.clone();
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(AggregatedDiscoveryServiceServer::new(svc))
                .serve_with_incoming_shutdown(
                    // TCP_NODELAY, as istiod: otherwise Nagle holds a response's DATA behind its
                    // HEADERS until the delayed ACK, 40 ms later.
                    futures::StreamExt::map(
                        tokio_stream::wrappers::TcpListenerStream::new(listener),
                        |s| s.and_then(|s| s.set_nodelay(true).map(|()| s)),
                    ),
                    token.cancelled_owned(),
                )
                .await;
        });
        Ok(FakeAds {
            addr,
            sotw,
            delta,
            stop,
        })
    }

    /// A plaintext channel factory for the proxy's upstream.
    pub fn connect(&self) -> super::Connect {
        let uri = format!("http://{}", self.addr);
        std::sync::Arc::new(move || {
            let uri = uri.clone();
            Box::pin(async move {
                Ok(tonic::transport::Endpoint::from_shared(uri)?
                    .connect()
                    .await?)
            })
        })
    }
}

impl Drop for FakeAds {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
