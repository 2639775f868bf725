//! The xDS proxy: Envoy's ADS stream (SotW and Delta) on the UDS `<configPath>/XDS`, relayed to
//! istiod over one fresh upstream connection per Envoy stream (Envoy's first stream takes over
//! the one opened before Envoy ran, see warm start below).
//!
//! - Requests, ACKs, NACKs and responses pass verbatim and in order; the proxy never acks for
//!   Envoy. Responses are relayed as the bytes istiod sent, never decoded beyond their type
//!   URL, version and nonce (see [`codec`]); requests are decoded (the proxy reads their type URL).
//! - Responses up to 64 KiB are held until complete, then relayed; a longer one for Envoy goes
//!   on frame by frame as it arrives, its head read on the way ([`upstream`], [`sieve`]), so the
//!   second hop overlaps the first and the proxy never holds a large response whole.
//!   While Envoy's queue is full, the parts that arrive are gathered (up to 256 KiB) and handed
//!   over together, and the frames written to Envoy between two flushes go out in one write
//!   ([`coalesce`]): a burst costs Envoy one wakeup, not one per 16 KiB frame.
//! - NDS (the DNS name table) and, with `PROXY_CONFIG_XDS_AGENT`, PCDS (ProxyConfig's trust
//!   anchors) are the proxy's own; NDS is subscribed after Envoy's first LDS
//!   request when DNS capture is on, decoded in full, acked or nacked by the proxy (a malformed
//!   table is nacked), never shown to Envoy.
//! - Memory is bounded by construction: each direction is one bounded channel drained by its own
//!   task, so a slow reader on either side pushes back (HTTP/2 flow control) on the writer
//!   instead of queueing, and neither direction can block the other (no istio#39209 deadlock,
//!   no istio#34097 unbounded queue).
//! - The proxy owns the upstream (unlike Istio): when the upstream stream or connection is lost
//!   (istiod restarted, or a stalled connection caught by the HTTP/2 keepalive), Envoy's stream
//!   stays open; the proxy reconnects (jittered backoff from 100 ms, capped at 1 s; with several
//!   istiod addresses or IPs, to the next one first: [`connect`]) and opens
//!   the new stream with Envoy's current subscriptions ([`subscriptions`]), so Envoy never
//!   sees the restart. ACKs/NACKs for the old stream's responses are not forwarded. The one
//!   loss Envoy does see: in the middle of a long response already partly relayed, Envoy holds
//!   part of a message that can never be completed, so its stream ends (UNAVAILABLE). With
//!   `XDS_PROXY_RECONNECT=false` (Istio's behaviour), and always when istiod refuses the stream
//!   (e.g. PERMISSION_DENIED) or Envoy leaves, the other side is closed with the same status.
//! - Streams on the socket ([`streams`]): with Envoy, one at a time (as Istio): a new stream,
//!   SotW or Delta, ends the previous one (OK status) and closes its upstream. For proxyless
//!   gRPC (not Istio; istio#53532) every stream is served: gRPC-Go 1.66+ opens one ADS stream
//!   per channel target (one xDS client each) and Istio's rule makes them end each other. Each
//!   stream gets its own upstream stream, as with Envoy, rather than one shared upstream
//!   demultiplexed per stream: each client's nonces, versions, subscriptions and NACKs are its
//!   own and istiod sees one ordinary proxyless connection per client, so nothing has to be
//!   rewritten or merged, and the reconnect and replay above work per stream unchanged. The
//!   cost is one istiod connection per stream, bounded by the cap ([`MAX_STREAMS`], 32): one
//!   more stream is refused with RESOURCE_EXHAUSTED. `XDS_PROXY_MULTI_STREAM` picks the rule
//!   (default: on for proxyless, i.e. `DISABLE_ENVOY=true` or `ISTIO_META_GENERATOR=grpc`).
//!   NDS stays single: one open stream holds the proxy's NDS subscription and hands it to
//!   another when it ends.
//! - Warm start ([`warm`], `XDS_PROXY_PREFETCH`, on by default; not Istio): once Envoy's
//!   bootstrap is written ([`XdsProxy::prefetch`]), the upstream stream opens with the
//!   bootstrap's node and subscribes to CDS and LDS (and NDS), then to the EDS and RDS names
//!   their responses give, while Envoy starts. Envoy's first stream takes it over: its first
//!   requests for them are answered with the responses istiod already sent (the newest, for
//!   SotW; all, in order, for Delta) and not repeated upstream, so istiod sees one stream whose
//!   nonces Envoy's ACKs and NACKs answer.

mod authority;
mod backoff;
mod coalesce;
mod codec;
mod connect;
#[cfg(test)]
mod fake;
mod hpack;
mod relay;
mod sieve;
mod streams;
mod subscriptions;
mod upstream;
pub mod warm;
pub mod wasm;

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use proto::istio::nds::NameTable;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

pub use connect::{ConnectError, upstream};
pub use warm::Prefetch;

#[cfg(feature = "fuzzing")]
pub(crate) mod fuzzing {
    pub use super::authority::fuzz_rewrite;
    pub use super::codec::{ResponseHead, decode_response_head};
    pub use super::sieve::check_against_prost;
    pub use super::upstream::relay_frames;
    pub use super::wasm::fuzzing::{manifest as wasm_manifest, unpack as wasm_unpack};
}

/// The ADS service's gRPC name and its two methods.
const SERVICE: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// xDS proxy errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create the xDS socket {path}: {source}")]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("xDS server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// Opens a new upstream channel to istiod (called once per Envoy stream).
pub type Connect = Arc<
    dyn Fn() -> BoxFuture<'static, Result<tonic::transport::Channel, ConnectError>> + Send + Sync,
>;

/// Called when an upstream connection is lost: what became of the istiod it went to
/// (`dead`: its address refuses connections; `stalled`: it still accepts TCP, so the process is
/// there but stopped answering on the connection; `unreachable`: no answer at all within a
/// quarter second). The address is read when called, the answer comes later.
pub type Probe = Arc<dyn Fn() -> BoxFuture<'static, Option<&'static str>> + Send + Sync>;

/// Between attempts after a loss: does the address of the last connection accept a TCP
/// connection now (`Some(true)`), refuse it (`Some(false)`), or no answer/no address (`None`)?
/// A refusal followed by an accept ends the wait for the next attempt (see `backoff.rs`).
pub type Knock = Arc<dyn Fn() -> BoxFuture<'static, Option<bool>> + Send + Sync>;

/// Returns the bearer token for the next upstream stream, if any.
pub type TokenFn = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// Why a sink refused what it was given: the component's own error, whose message the NACK
/// carries.
pub type SinkError = Box<dyn std::error::Error + Send + Sync>;

/// Receives each NDS table; an error becomes a NACK.
pub type NdsSink = Arc<dyn Fn(NameTable) -> Result<(), SinkError> + Send + Sync>;

/// Receives each PCDS `caCertificatesPem` (`PROXY_CONFIG_XDS_AGENT`); an error becomes a NACK.
pub type PcdsSink = Arc<dyn Fn(Vec<String>) -> Result<(), SinkError> + Send + Sync>;

/// How to reach istiod.
#[derive(Clone)]
pub struct Upstream {
    pub connect: Connect,
    /// gRPC metadata on every upstream stream (`ClusterID`, `XDS_HEADER_*`).
    pub metadata: Vec<(String, String)>,
    pub token: TokenFn,
    /// Labels a lost connection (`None`: `lost` / `keepalive` from the status alone).
    pub probe: Option<Probe>,
    /// Watches for a restarted istiod between attempts (`None`: the backoff alone).
    pub knock: Option<Knock>,
}

/// What the proxy needs.
#[derive(Clone)]
pub struct Inputs {
    pub upstream: Upstream,
    /// `Some` when DNS capture is on: the proxy subscribes to NDS and feeds this sink.
    pub nds: Option<NdsSink>,
    /// `Some` with `PROXY_CONFIG_XDS_AGENT`: every stream subscribes to PCDS after its first
    /// LDS request and feeds ProxyConfig's `caCertificatesPem` to this sink (the trust store).
    pub pcds: Option<PcdsSink>,
    pub metrics: Metrics,
    /// Workload health (`readinessProbe`), sent upstream as `HealthInformation` after Envoy's
    /// first LDS request on each stream, and on every change.
    pub health: Option<tokio::sync::watch::Receiver<Option<crate::health::Health>>>,
    /// Capacity of each direction's queue (messages). Istio's is 1 downstream, unbounded
    /// upstream; ours is bounded both ways.
    pub queue: usize,
    /// Keep Envoy's stream open and reconnect on upstream loss (`false`: Istio's behaviour,
    /// Envoy's stream ends with the upstream's).
    pub reconnect: bool,
    /// How long connecting and opening a new upstream stream may take before the next attempt
    /// (a stopped istiod accepts TCP connections but never completes the handshake).
    pub open_timeout: std::time::Duration,
    /// How many downstream streams are served at once.
    pub streams: Streams,
    /// `ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION` (default on): ECDS Wasm filters with
    /// remote code are rewritten to the module fetched into this cache; `None` relays ECDS as is.
    pub wasm: Option<Arc<wasm::Cache>>,
    /// The XDS socket's gRPC server: keepalive towards Envoy, stream cap, largest request.
    pub server: crate::config::XdsServer,
}

/// How many downstream xDS streams the socket serves at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streams {
    /// Istio's: one at a time; a new stream ends the previous one (OK status).
    One,
    /// Every stream is served with its own subscriptions and its own upstream stream, up to
    /// `cap` at once; one more is refused with RESOURCE_EXHAUSTED.
    Many { cap: usize },
}

/// The cap on concurrent downstream streams when several are served: gRPC-Go opens one per
/// channel target plus one for its xDS servers.
pub const MAX_STREAMS: usize = 32;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TerminationLabels {
    pub(crate) r#type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReconnectLabels {
    /// `closed` (istiod ended the stream); for a lost connection, what the probe of its address
    /// found: `dead` (refused: istiod gone), `stalled` (still accepts TCP: istiod there but not
    /// answering, e.g. caught by the keepalive ping), `unreachable` (no answer); without a probe
    /// `lost` or `keepalive` (from the stream's status).
    pub(crate) reason: &'static str,
}

/// Istio's xDS proxy metrics, and the proxy's own reconnects.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub(crate) istiod_connection_failures: Counter,
    pub(crate) istiod_connection_terminations: Family<TerminationLabels, Counter>,
    pub(crate) envoy_connection_terminations: Family<TerminationLabels, Counter>,
    pub(crate) requests: Counter,
    pub(crate) responses: Counter,
    pub(crate) upstream_reconnects: Family<ReconnectLabels, Counter>,
    pub(crate) downstream_streams: Gauge,
    pub(crate) streams_refused: Counter,
    pub(crate) prefetch_served: Counter,
}

impl Metrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Metrics::default();
        registry.register(
            "istiod_connection_failures",
            "Failures to open an upstream stream to istiod",
            m.istiod_connection_failures.clone(),
        );
        registry.register(
            "istiod_connection_terminations",
            "Upstream streams ended by istiod, by type",
            m.istiod_connection_terminations.clone(),
        );
        registry.register(
            "envoy_connection_terminations",
            "Downstream streams ended by Envoy, by type",
            m.envoy_connection_terminations.clone(),
        );
        registry.register(
            "xds_proxy_requests",
            "Requests relayed to istiod",
            m.requests.clone(),
        );
        registry.register(
            "xds_proxy_responses",
            "Responses received from istiod",
            m.responses.clone(),
        );
        registry.register(
            "xds_upstream_reconnects",
            "Upstream xDS streams lost and reopened by the proxy while Envoy's stayed open, by reason",
            m.upstream_reconnects.clone(),
        );
        registry.register(
            "xds_proxy_downstream_streams",
            "xDS streams open on the XDS socket",
            m.downstream_streams.clone(),
        );
        registry.register(
            "xds_proxy_streams_refused",
            "xDS streams refused because the XDS socket's concurrent stream cap was reached",
            m.streams_refused.clone(),
        );
        registry.register(
            "xds_proxy_prefetch_served",
            "Responses handed to Envoy from those the proxy fetched before Envoy asked (XDS_PROXY_PREFETCH)",
            m.prefetch_served.clone(),
        );
        m
    }
}

/// The ADS service Envoy talks to.
#[derive(Clone)]
pub struct XdsProxy {
    inputs: Arc<Inputs>,
    /// The open downstream streams (SotW and Delta alike).
    open: streams::Open,
    /// The warm stream Envoy's first stream takes over ([`XdsProxy::prefetch`]).
    warm: Arc<std::sync::Mutex<Option<relay::AnyWarm>>>,
}

impl XdsProxy {
    pub fn new(inputs: Inputs) -> Self {
        let open = streams::Open::new(inputs.streams, inputs.metrics.downstream_streams.clone());
        XdsProxy {
            inputs: Arc::new(inputs),
            open,
            warm: Arc::default(),
        }
    }

    fn warm_slot(&self) -> std::sync::MutexGuard<'_, Option<relay::AnyWarm>> {
        self.warm
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Opens the warm stream ([`warm`]) with `prefetch`'s node and flavor, for the next stream
    /// on the socket to take over; it ends with `token` when none has. Only with one stream at
    /// a time (Envoy's rule): with several there is no "Envoy's first stream".
    pub fn prefetch(&self, prefetch: Prefetch, token: CancellationToken) {
        if self.inputs.streams != Streams::One {
            tracing::debug!("no xDS prefetch: the socket serves several streams");
            return;
        }
        let stream = match self.open.admit() {
            Ok(s) => s,
            Err(status) => {
                tracing::warn!(status = %status, "no xDS prefetch: the stream was not admitted");
                return;
            }
        };
        let done = stream.done().clone();
        let inputs = self.inputs.clone();
        let warm = if prefetch.delta {
            relay::AnyWarm::Delta(relay::prefetch::<relay::Delta>(
                inputs,
                stream,
                prefetch.node,
            ))
        } else {
            relay::AnyWarm::Sotw(relay::prefetch::<relay::Sotw>(
                inputs,
                stream,
                prefetch.node,
            ))
        };
        *self.warm_slot() = Some(warm);
        let slot = self.warm.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = token.cancelled() => {}
                _ = done.cancelled() => {}
            }
            // Not taken over (or over): dropping it ends it.
            let left = slot
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take_if(|w| w.is_over() || token.is_cancelled());
            drop(left);
        });
    }

    /// The tonic service (also usable on other transports in tests).
    pub fn service(&self) -> AdsService {
        AdsService {
            proxy: self.clone(),
        }
    }
}

/// Envoy's ADS service, hand-written rather than generated so that responses are written with
/// [`codec::ResponseBody`] (bytes as received from istiod) instead of being re-encoded.
#[derive(Clone)]
pub struct AdsService {
    proxy: XdsProxy,
}

impl tonic::server::NamedService for AdsService {
    const NAME: &'static str = SERVICE;
}

/// One ADS stream: Envoy's requests decoded by tonic, the relay's responses written by
/// [`codec::ResponseBody`] as the bytes istiod sent.
fn serve_method<F: relay::Flavor>(
    proxy: XdsProxy,
    request: http::Request<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    if request
        .headers()
        .get("grpc-encoding")
        .is_some_and(|e| e != "identity")
    {
        return tonic::Status::unimplemented("compressed xDS requests are not supported")
            .into_http();
    }
    // Envoy's first stream takes the warm one over when it speaks its flavor and it is alive.
    let warm = proxy
        .warm_slot()
        .take()
        .and_then(|w| F::warm(w).filter(|w| !w.is_over()));
    let decode = |body| {
        tonic::Streaming::new_request(
            codec::request_decoder::<F::Req>(),
            body,
            None,
            Some(proxy.inputs.server.max_recv_msg_size),
        )
    };
    let responses = match warm {
        Some(warm) => warm.attach(decode(request.into_body())),
        None => match proxy.open.admit() {
            Ok(stream) => {
                relay::start::<F>(proxy.inputs.clone(), decode(request.into_body()), stream)
            }
            Err(status) => {
                proxy.inputs.metrics.streams_refused.inc();
                return status.into_http();
            }
        },
    };
    let mut response =
        http::Response::new(tonic::body::Body::new(codec::ResponseBody::new(responses)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for AdsService {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let proxy = self.proxy.clone();
        match request.uri().path() {
            SOTW_PATH => Box::pin(async move { Ok(serve_method::<relay::Sotw>(proxy, request)) }),
            DELTA_PATH => Box::pin(async move { Ok(serve_method::<relay::Delta>(proxy, request)) }),
            _ => Box::pin(async move {
                Ok(tonic::Status::unimplemented("unknown ADS method").into_http())
            }),
        }
    }
}

/// Binds a Unix socket the way Istio does: stale file removed, parent created (0750), socket
/// mode 0666.
pub fn bind_uds(path: &Path) -> Result<UnixListener, Error> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let err = |source| Error::Bind {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .map_err(err)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    // However deep the path: Istio binds it relative to the working directory.
    let listener = proto::uds::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(err)?;
    Ok(listener)
}

/// Serves the proxy on `listener` until `token` is cancelled.
pub async fn serve(
    proxy: XdsProxy,
    listener: UnixListener,
    token: CancellationToken,
) -> Result<(), Error> {
    use proto::listen::idle;
    // Capped, and never spinning on EMFILE (tonic retries a failed accept at once); a
    // connection without a stream in time is closed (the keepalive ping below only finds a
    // peer that stopped answering, not one that answers and opens nothing).
    let caps = proto::listen::ConnCaps::new(proto::listen::UNIX_SOCKET_CAPS);
    let incoming = authority::fix(futures::StreamExt::map(
        proto::listen::incoming(listener, caps, "xds"),
        |conn| {
            conn.map(|c| coalesce::Coalesce::new(idle::Watched::new(c, idle::UNIX_SOCKET_LIMITS)))
        },
    ));
    let settings = proxy.inputs.server;
    tonic::transport::Server::builder()
        .max_concurrent_streams(settings.max_streams)
        .http2_keepalive_interval(Some(settings.keepalive.0))
        .http2_keepalive_timeout(Some(settings.keepalive.1))
        // The cap the header rewriter enforces too (see `authority`).
        .http2_max_header_list_size(hpack::MAX_HEADER_LIST as u32)
        .add_service(idle::Counted::new(proxy.service()))
        .serve_with_incoming_shutdown(incoming, token.cancelled_owned())
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests;
