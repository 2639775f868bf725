//! One Envoy stream relayed to one upstream stream; generic over SotW and Delta.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use proto::istio::mesh::ProxyConfigTrust;
use proto::istio::nds::NameTable;
use proto::type_url;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::backoff::Backoff;
use super::codec::{Down, RawResponse, forwarded};
use super::streams::Stream;
use super::subscriptions::Subscriptions;
use super::upstream::{HOLD, Piece, RequestStream, Responses};
use super::warm::{self, Claim};
use super::{Inputs, ReconnectLabels, TerminationLabels};

mod flavor;
mod handover;
mod respond;
pub(crate) use flavor::{Delta, Flavor, Sotw};
use flavor::{OwnResponseError, own_resource};
pub(crate) use handover::{AnyWarm, Warm, prefetch};
use handover::{claim, flush_ready, overflow, pass_warm};
use respond::relay;

fn termination(status: &tonic::Status) -> &'static str {
    match status.code() {
        tonic::Code::Cancelled | tonic::Code::DeadlineExceeded | tonic::Code::Unavailable => {
            "cancelled"
        }
        _ => "error",
    }
}

/// The upstream side both tasks write to: the current generation's request channel and, when
/// the proxy reconnects on its own, the subscriptions a new generation replays. Requests are
/// recorded and the channel read under one lock, so a request is either in a generation's
/// replay or sent on that generation's channel, never lost between two.
struct Link<F: Flavor> {
    tx: mpsc::Sender<F::Req>,
    subs: Option<F::Subs>,
    /// The last ECDS version Envoy acknowledged (the proxy's own ECDS NACKs carry it).
    ecds_version: String,
    /// A warm stream's responses held for Envoy ([`warm`]); `None` once all are handed over,
    /// and on a stream Envoy opened.
    warm: Option<warm::Held>,
}

type Shared<F> = Arc<std::sync::Mutex<Link<F>>>;

fn lock<F: Flavor>(link: &Shared<F>) -> std::sync::MutexGuard<'_, Link<F>> {
    link.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Sends a request (Envoy's or the proxy's own) on the current upstream generation. False when
/// the relay is over: done, or (Istio's behaviour) the upstream is gone.
async fn to_upstream<F: Flavor>(link: &Shared<F>, req: F::Req, done: &CancellationToken) -> bool {
    let (req, tx, reconnect) = {
        let mut l = lock(link);
        let req = match l.subs.as_mut() {
            Some(subs) => subs.on_request(req),
            None => Some(req),
        };
        (req, l.tx.clone(), l.subs.is_some())
    };
    let Some(req) = req else {
        tracing::debug!("not forwarding an answer to an earlier upstream stream's response");
        return true;
    };
    // A generation that ended before taking the request replays it on the next one.
    send(&tx, req, done, "istiod").await || (reconnect && !done.is_cancelled())
}

/// Starts relaying `downstream` until either side ends or the stream's `done` is cancelled
/// (then Envoy's stream ends with OK); returns the stream of responses for Envoy at once. The
/// admitted `stream` lives until both directions are done.
pub(crate) fn start<F: Flavor>(
    inputs: Arc<Inputs>,
    downstream: tonic::Streaming<F::Req>,
    stream: Stream,
) -> ReceiverStream<Result<Down, tonic::Status>> {
    let stream = Arc::new(stream);
    let done = stream.done().clone();
    let queue = inputs.queue.max(1);
    let (down_tx, down_rx) = mpsc::channel::<Result<Down, tonic::Status>>(queue);
    let (up_tx, up_rx) = mpsc::channel::<F::Req>(queue);
    let link: Shared<F> = Arc::new(std::sync::Mutex::new(Link {
        tx: up_tx,
        subs: inputs.reconnect.then(F::Subs::default),
        ecds_version: String::new(),
        warm: None,
    }));
    tracing::info!(flavor = F::NAME, "Envoy connected to the xDS proxy");
    let flush = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(downstream_to_upstream::<F>(
        inputs.clone(),
        downstream,
        link.clone(),
        stream.clone(),
        flush.clone(),
    ));
    tokio::spawn(async move {
        let first = (Vec::new(), up_rx);
        upstream_to_downstream::<F>(inputs, first, link, down_tx, done, flush).await;
        drop(stream);
    });
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

type HealthRx = tokio::sync::watch::Receiver<Option<crate::health::Health>>;

async fn downstream_to_upstream<F: Flavor>(
    inputs: Arc<Inputs>,
    mut downstream: tonic::Streaming<F::Req>,
    link: Shared<F>,
    stream: Arc<Stream>,
    flush: Arc<tokio::sync::Notify>,
) {
    let done = stream.done().clone();
    let mut lds_seen = false;
    let mut health = inputs.health.clone();
    loop {
        let msg = tokio::select! {
            _ = done.cancelled() => break,
            // The stream that owned NDS ended: this one (past its first LDS) takes it over.
            () = stream.nds_free(), if lds_seen && inputs.nds.is_some() && !stream.owns_nds() => {
                if stream.claim_nds() {
                    tracing::debug!("taking over the NDS subscription from a stream that ended");
                    if !to_upstream(&link, F::subscribe(type_url::NAME_TABLE), &done).await {
                        break;
                    }
                }
                continue;
            }
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
                if !send_health(&link, &mut health, &done).await {
                    break;
                }
                continue;
            }
            m = downstream.message() => m,
        };
        match msg {
            Ok(Some(req)) => {
                let first_lds = !lds_seen && F::req_type(&req) == type_url::LISTENER;
                if !from_envoy(&inputs, &link, req, &flush, &done).await {
                    break;
                }
                if first_lds {
                    lds_seen = true;
                    if !after_first_lds(&inputs, &link, &stream, &mut health, &done).await {
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

/// Sends the workload's last known health upstream, if there is one. False when the relay is
/// over.
async fn send_health<F: Flavor>(
    link: &Shared<F>,
    health: &mut Option<HealthRx>,
    done: &CancellationToken,
) -> bool {
    let current = health.as_mut().and_then(|h| h.borrow_and_update().clone());
    match current {
        Some(h) => to_upstream(link, F::health(&h), done).await,
        None => true,
    }
}

/// Relays one of Envoy's requests upstream (with the request the proxy adds for a warm stream's
/// handover, if any). False when the relay is over.
async fn from_envoy<F: Flavor>(
    inputs: &Inputs,
    link: &Shared<F>,
    req: F::Req,
    flush: &tokio::sync::Notify,
    done: &CancellationToken,
) -> bool {
    inputs.metrics.requests.inc();
    if let Some((nonce, error)) = F::req_nack(&req) {
        // Relayed as is; logged so that a rejected config shows in the agent's log.
        tracing::warn!(flavor = F::NAME, type_url = F::req_type(&req), nonce,
            code = error.code, error = %error.message, "Envoy rejected an xDS response (NACK)");
    }
    if F::req_type(&req) == type_url::ECDS && F::req_nack(&req).is_none() {
        lock(link).ecds_version = F::req_version(&req).to_string();
    }
    let (relay, own) = claim::<F>(link, &req, flush);
    if relay && !to_upstream(link, req, done).await {
        return false;
    }
    match own {
        Some(own) => to_upstream(link, own, done).await,
        None => true,
    }
}

/// The proxy's own subscriptions after Envoy's first LDS request on a stream: NDS, PCDS and the
/// workload's health. False when the relay is over.
async fn after_first_lds<F: Flavor>(
    inputs: &Inputs,
    link: &Shared<F>,
    stream: &Stream,
    health: &mut Option<HealthRx>,
    done: &CancellationToken,
) -> bool {
    // One open stream at a time holds the NDS subscription.
    if inputs.nds.is_some() && stream.claim_nds() {
        tracing::debug!("subscribing to NDS after Envoy's first LDS request");
        if !to_upstream(link, F::subscribe(type_url::NAME_TABLE), done).await {
            return false;
        }
    }
    // PCDS (`PROXY_CONFIG_XDS_AGENT`), as Istio: on every stream after its first
    // LDS request; the same anchors from two streams change nothing.
    if inputs.pcds.is_some() && !to_upstream(link, F::subscribe(type_url::PROXY_CONFIG), done).await
    {
        return false;
    }
    // The last known health goes to every new upstream stream.
    send_health(link, health, done).await
}

/// How one upstream generation ended.
enum Outcome {
    /// Envoy is gone or the relay was stopped.
    Done,
    /// The stream ended in a way that is istiod's answer (not a lost connection): Envoy gets it
    /// (`None`: OK) even when the proxy reconnects on its own.
    End(tonic::Status),
    /// A new stream could not be opened (the next attempt follows the backoff).
    Retry,
    /// The stream or connection was lost (`None`: istiod closed it cleanly).
    Lost {
        status: Option<tonic::Status>,
        reason: &'static str,
    },
}

/// Statuses that mean the connection or stream was lost, not that istiod refused Envoy.
fn lost(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Cancelled
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Aborted
            | tonic::Code::ResourceExhausted
    )
}

/// True when the HTTP/2 keepalive ping went unanswered (hyper's "keep-alive timed out").
fn keepalive_timed_out(status: &tonic::Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(status);
    while let Some(e) = source {
        if e.to_string().contains("keep-alive timed out") {
            return true;
        }
        source = e.source();
    }
    false
}

/// The label of a lost upstream stream in `xds_upstream_reconnects`: `keepalive` when the
/// status says the ping went unanswered, else `lost`. hyper ends a connection whose ping timed
/// out by dropping it, so its streams usually report a broken pipe, as after a dead istiod:
/// both are `lost`.
fn loss_reason(status: &tonic::Status) -> &'static str {
    if keepalive_timed_out(status) {
        "keepalive"
    } else {
        "lost"
    }
}

/// Opens one upstream generation: a channel, then the stream whose first requests are
/// `replay`, then whatever the two tasks send on the generation's channel.
async fn open<F: Flavor>(
    inputs: &Inputs,
    replay: Vec<F::Req>,
    rx: mpsc::Receiver<F::Req>,
) -> Result<Responses, tonic::Status> {
    let channel = (inputs.upstream.connect)()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connecting to istiod: {e}")))?;
    let body: RequestStream<F::Req> = Box::pin(futures::StreamExt::chain(
        futures::stream::iter(replay),
        ReceiverStream::new(rx),
    ));
    let mut headers = http::HeaderMap::new();
    for (k, v) in &inputs.upstream.metadata {
        match (
            http::HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes()),
            http::HeaderValue::try_from(v.as_str()),
        ) {
            (Ok(k), Ok(v)) if !k.as_str().starts_with("grpc-") && !k.as_str().starts_with(':') => {
                headers.insert(k, v);
            }
            _ => tracing::warn!(header = %k, "skipping invalid upstream xDS header"),
        }
    }
    if let Some(token) = (inputs.upstream.token)()
        && let Ok(v) = http::HeaderValue::try_from(format!("Bearer {token}"))
    {
        headers.insert(http::header::AUTHORIZATION, v);
    }
    super::upstream::call(channel, F::PATH, headers, body, F::DELTA).await
}

async fn upstream_to_downstream<F: Flavor>(
    inputs: Arc<Inputs>,
    first: (Vec<F::Req>, mpsc::Receiver<F::Req>),
    link: Shared<F>,
    down_tx: mpsc::Sender<Result<Down, tonic::Status>>,
    done: CancellationToken,
    flush: Arc<tokio::sync::Notify>,
) {
    let envoy_gone = || envoy_gone::<F>(&inputs, &link);
    let mut body = first;
    let mut established = false;
    let mut backoff = Backoff::default();
    let mut generation = 0u64;
    loop {
        let (replay, rx) = body;
        let opened = tokio::select! {
            _ = done.cancelled() => break,
            _ = down_tx.closed() => { envoy_gone(); break }
            o = open_in_time::<F>(&inputs, replay, rx) => o,
        };
        let outcome = match opened {
            Ok(mut upstream) => {
                established = true;
                if lock(&link).warm.as_ref().is_some_and(warm::Held::holding) {
                    // Held responses are held whole (and bounded by the warm cap).
                    upstream.hold(warm::MAX_HELD);
                }
                relay::<F>(
                    &inputs,
                    &link,
                    upstream,
                    &down_tx,
                    &done,
                    &flush,
                    &mut backoff,
                )
                .await
            }
            Err(status) => {
                open_failed(&inputs, &status, &backoff);
                if !inputs.reconnect || !established {
                    let _ = down_tx.send(Err(status)).await;
                    break;
                }
                Outcome::Retry
            }
        };
        if !settle::<F>(&inputs, &link, &down_tx, outcome).await {
            break;
        }
        let (replay, rx) = next_generation(&inputs, &link);
        generation += 1;
        let delay = backoff.next();
        tracing::debug!(
            generation,
            requests = replay.len(),
            ?delay,
            "next upstream xDS stream"
        );
        body = (replay, rx);
        tokio::select! {
            _ = done.cancelled() => break,
            _ = down_tx.closed() => { envoy_gone(); break }
            _ = backoff.pause(delay, inputs.upstream.knock.as_ref()) => {}
        }
    }
    done.cancel();
}

/// What follows an upstream generation's end: true when a new generation follows, false when
/// the relay is over (Envoy's stream ends with istiod's status, if any).
async fn settle<F: Flavor>(
    inputs: &Inputs,
    link: &Shared<F>,
    down_tx: &mpsc::Sender<Result<Down, tonic::Status>>,
    outcome: Outcome,
) -> bool {
    match outcome {
        Outcome::Done => {
            if down_tx.is_closed() {
                envoy_gone::<F>(inputs, link);
            }
            false
        }
        Outcome::End(status) => {
            let _ = tokio::time::timeout(Duration::from_secs(5), down_tx.send(Err(status))).await;
            false
        }
        Outcome::Retry => true,
        Outcome::Lost { status, reason } => {
            if !inputs.reconnect {
                // Istio's behaviour: Envoy's stream ends with istiod's status.
                if let Some(status) = status {
                    let _ = tokio::time::timeout(Duration::from_secs(5), down_tx.send(Err(status)))
                        .await;
                }
                return false;
            }
            report_loss::<F>(inputs, status.as_ref(), reason).await;
            true
        }
    }
}

/// Counts and logs Envoy's stream as gone (the downstream receiver was dropped).
fn envoy_gone<F: Flavor>(inputs: &Inputs, link: &Shared<F>) {
    // A warm stream no Envoy took over has no Envoy to lose.
    if lock(link).warm.as_ref().is_some_and(|w| !w.attached) {
        return;
    }
    tracing::info!(flavor = F::NAME, "Envoy disconnected from the xDS proxy");
    inputs
        .metrics
        .envoy_connection_terminations
        .get_or_create(&TerminationLabels {
            r#type: "cancelled",
        })
        .inc();
}

/// [`open`] within the proxy's open timeout.
async fn open_in_time<F: Flavor>(
    inputs: &Inputs,
    replay: Vec<F::Req>,
    rx: mpsc::Receiver<F::Req>,
) -> Result<Responses, tonic::Status> {
    tokio::time::timeout(inputs.open_timeout, open::<F>(inputs, replay, rx))
        .await
        .unwrap_or_else(|_| {
            Err(tonic::Status::deadline_exceeded(format!(
                "istiod did not open the xDS stream within {:?}",
                inputs.open_timeout
            )))
        })
}

/// Counts and logs an upstream stream that could not be opened: one warning per outage, the
/// retries that follow at debug.
fn open_failed(inputs: &Inputs, status: &tonic::Status, backoff: &Backoff) {
    inputs.metrics.istiod_connection_failures.inc();
    if backoff.attempts() <= 1 {
        tracing::warn!(status = %status, "cannot open the upstream xDS stream (is istiod reachable?)");
    } else {
        tracing::debug!(status = %status, "cannot open the upstream xDS stream yet");
    }
}

/// Counts and logs a lost upstream stream in `xds_upstream_reconnects`. With a reachability
/// probe the reason is the probe's answer, which comes while the reconnect goes on.
async fn report_loss<F: Flavor>(
    inputs: &Inputs,
    status: Option<&tonic::Status>,
    reason: &'static str,
) {
    let status = status.map(ToString::to_string);
    let probe = (reason != "closed")
        .then(|| inputs.upstream.probe.as_ref().map(|p| p()))
        .flatten();
    let metrics = inputs.metrics.upstream_reconnects.clone();
    let report = async move {
        let reason = match probe {
            Some(p) => p.await.unwrap_or(reason),
            None => reason,
        };
        metrics.get_or_create(&ReconnectLabels { reason }).inc();
        tracing::warn!(
            flavor = F::NAME,
            reason,
            status,
            "upstream xDS stream lost (closed by istiod, istiod dead, or stalled: a keepalive ping unanswered); reconnecting with Envoy's subscriptions, Envoy's stream stays open"
        );
    };
    if inputs.upstream.probe.is_some() && reason != "closed" {
        tokio::spawn(report);
    } else {
        report.await;
    }
}

/// The next generation's channel and replay, built together under the link's lock (see
/// [`Link`]).
fn next_generation<F: Flavor>(
    inputs: &Inputs,
    link: &Shared<F>,
) -> (Vec<F::Req>, mpsc::Receiver<F::Req>) {
    let (tx, rx) = mpsc::channel(inputs.queue.max(1));
    let mut l = lock(link);
    l.tx = tx;
    if let Some(w) = l.warm.as_mut() {
        w.new_generation();
    }
    let replay = l
        .subs
        .as_mut()
        .map(Subscriptions::replay)
        .unwrap_or_default();
    (replay, rx)
}
