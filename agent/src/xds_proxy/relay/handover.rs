//! The warm stream's part of the relay: the upstream opened before Envoy connects
//! ([`prefetch`]), what it holds for Envoy, and Envoy's first stream taking it over.

use super::*;

/// A warm stream ([`warm`]): opened upstream before Envoy connects, taken over by Envoy's
/// first stream. Dropped without being taken over, it ends.
pub(crate) struct Warm<F: Flavor> {
    inputs: Arc<Inputs>,
    link: Shared<F>,
    stream: Arc<Stream>,
    flush: Arc<tokio::sync::Notify>,
    down_rx: Option<mpsc::Receiver<Result<Down, tonic::Status>>>,
}

/// Opens the warm stream: the upstream with `node` on its first request, subscribed to CDS and
/// LDS (and NDS when this stream takes it), its responses held for Envoy.
pub(crate) fn prefetch<F: Flavor>(
    inputs: Arc<Inputs>,
    stream: Stream,
    node: proto::envoy::config::core::v3::Node,
) -> Warm<F> {
    let stream = Arc::new(stream);
    let done = stream.done().clone();
    let queue = inputs.queue.max(1);
    let (down_tx, down_rx) = mpsc::channel::<Result<Down, tonic::Status>>(queue);
    let (up_tx, up_rx) = mpsc::channel::<F::Req>(queue);
    let mut first: Vec<F::Req> = warm::FIRST.iter().map(|t| F::subscribe(t)).collect();
    if let Some(req) = first.first_mut() {
        F::set_node(req, node);
    }
    if inputs.nds.is_some() && stream.claim_nds() {
        first.push(F::subscribe(type_url::NAME_TABLE));
    }
    let mut subs = inputs.reconnect.then(F::Subs::default);
    if let Some(subs) = subs.as_mut() {
        for req in &first {
            subs.on_request(req.clone());
        }
    }
    let link: Shared<F> = Arc::new(std::sync::Mutex::new(Link {
        tx: up_tx,
        subs,
        ecds_version: String::new(),
        warm: Some(warm::Held::new(F::DELTA, warm::FIRST)),
    }));
    tracing::info!(
        flavor = F::NAME,
        "opening the upstream xDS stream before Envoy connects (XDS_PROXY_PREFETCH)"
    );
    let flush = Arc::new(tokio::sync::Notify::new());
    let task = (inputs.clone(), link.clone(), stream.clone(), flush.clone());
    tokio::spawn(async move {
        let (inputs, link, stream, flush) = task;
        upstream_to_downstream::<F>(inputs, (first, up_rx), link, down_tx, done, flush).await;
        drop(stream);
    });
    Warm {
        inputs,
        link,
        stream,
        flush,
        down_rx: Some(down_rx),
    }
}

/// A warm stream of either flavor.
pub(crate) enum AnyWarm {
    Sotw(Warm<Sotw>),
    Delta(Warm<Delta>),
}

impl AnyWarm {
    pub(crate) fn is_over(&self) -> bool {
        match self {
            AnyWarm::Sotw(w) => w.is_over(),
            AnyWarm::Delta(w) => w.is_over(),
        }
    }
}

impl<F: Flavor> Warm<F> {
    /// True once the warm stream has ended (it cannot be taken over).
    pub(crate) fn is_over(&self) -> bool {
        self.stream.done().is_cancelled()
    }

    /// Envoy's stream takes the warm one over; returns the stream of responses for Envoy.
    pub(crate) fn attach(
        mut self,
        downstream: tonic::Streaming<F::Req>,
    ) -> ReceiverStream<Result<Down, tonic::Status>> {
        if let Some(w) = lock(&self.link).warm.as_mut() {
            w.attached = true;
        }
        tracing::info!(
            flavor = F::NAME,
            "Envoy connected to the xDS proxy; it takes over the prefetched upstream stream"
        );
        tokio::spawn(downstream_to_upstream::<F>(
            self.inputs.clone(),
            downstream,
            self.link.clone(),
            self.stream.clone(),
            self.flush.clone(),
        ));
        let Some(rx) = self.down_rx.take() else {
            unreachable!("attach consumes the warm stream")
        };
        ReceiverStream::new(rx)
    }
}

impl<F: Flavor> Drop for Warm<F> {
    fn drop(&mut self) {
        if self.down_rx.is_some() {
            // Never taken over: the upstream stream ends.
            self.stream.done().cancel();
        }
    }
}

/// Envoy's request against the warm stream's held responses: whether it is relayed (false when
/// the held responses answer it), and the warm stream's own request it calls for (a NACK of a
/// CDS or LDS lets go of what that response named).
pub(super) fn claim<F: Flavor>(
    link: &Shared<F>,
    req: &F::Req,
    flush: &tokio::sync::Notify,
) -> (bool, Option<F::Req>) {
    let t = F::req_type(req);
    let (claim, own) = {
        let mut l = lock(link);
        let Some(w) = l.warm.as_mut() else {
            return (true, None);
        };
        let own = F::req_nack(req).and_then(|_| w.rejected(t));
        (w.claim(t, F::initial_names(req).as_deref()), own)
    };
    let own = own.map(|f| {
        tracing::debug!(
            flavor = F::NAME,
            type_url = f.type_url,
            "Envoy rejected what named it; letting go of the prefetched type"
        );
        F::follow(&f)
    });
    match claim {
        Claim::Relay => (true, own),
        Claim::Served => {
            tracing::debug!(
                flavor = F::NAME,
                type_url = t,
                "answering Envoy's request with the prefetched responses"
            );
            flush.notify_one();
            (false, own)
        }
        Claim::Changed => {
            tracing::debug!(
                flavor = F::NAME,
                type_url = t,
                "Envoy's request differs from the prefetched subscription; relaying it"
            );
            flush.notify_one();
            (true, own)
        }
    }
}

/// Sends the warm stream's released responses to Envoy, in istiod's order; drops the warm
/// state once everything is handed over. False when the relay is over.
pub(super) async fn flush_ready<F: Flavor>(
    inputs: &Inputs,
    link: &Shared<F>,
    upstream: &mut Responses,
    down_tx: &mpsc::Sender<Result<Down, tonic::Status>>,
    done: &CancellationToken,
) -> bool {
    let ready = {
        let mut l = lock(link);
        let Some(w) = l.warm.as_mut() else {
            return true;
        };
        if !w.attached {
            return true;
        }
        let ready = w.take_ready();
        if w.finished() {
            l.warm = None;
            upstream.hold(HOLD);
        }
        ready
    };
    for resp in ready {
        inputs.metrics.prefetch_served.inc();
        if !send(down_tx, Ok(Down::Whole(resp)), done, "Envoy").await {
            return false;
        }
    }
    true
}

/// A warm stream's held responses passed [`warm::MAX_HELD`]: it ends, and Envoy's stream with
/// it when Envoy took it over.
pub(super) fn overflow<F: Flavor>(link: &Shared<F>) -> Outcome {
    let attached = lock(link).warm.as_ref().is_some_and(|w| w.attached);
    tracing::warn!(
        max = warm::MAX_HELD,
        attached,
        "the responses prefetched for Envoy passed the cap; ending the prefetched xDS stream"
    );
    if attached {
        Outcome::End(tonic::Status::unavailable(
            "the xDS proxy's prefetched responses passed its cap; reconnect",
        ))
    } else {
        Outcome::Done
    }
}

/// A whole response through the warm stream's state (on every stream: the subscriptions
/// record it first): held for Envoy (`Ok(None)`), with a subscription for what a held CDS or
/// LDS names; dropped before Envoy is there (`Ok(None)`); or handed back to be relayed, after
/// the held responses Envoy asked for are sent.
pub(super) async fn pass_warm<F: Flavor>(
    inputs: &Inputs,
    link: &Shared<F>,
    resp: RawResponse,
    upstream: &mut Responses,
    down_tx: &mpsc::Sender<Result<Down, tonic::Status>>,
    done: &CancellationToken,
) -> Result<Option<RawResponse>, Outcome> {
    // A held CDS or LDS names what Envoy asks for next: read outside the lock.
    let follows = lock(link)
        .warm
        .as_ref()
        .is_some_and(|w| w.follows(resp.type_url()));
    let update = follows
        .then(|| warm::names::update(resp.type_url(), &resp.bytes, F::DELTA))
        .and_then(|u| {
            u.map_err(|e| tracing::debug!(error = %e, "not following a prefetched response"))
                .ok()
        });
    let (kept, follow) = {
        let mut l = lock(link);
        if let Some(subs) = l.subs.as_mut() {
            subs.on_response(&resp);
        }
        match l.warm.as_mut() {
            Some(w) => {
                let follow = update.and_then(|u| w.follow(resp.type_url(), u));
                (w.keep(resp), follow)
            }
            None => (Ok(Some(resp)), None),
        }
    };
    if let Some(f) = follow {
        tracing::debug!(
            flavor = F::NAME,
            type_url = f.type_url,
            names = f.names.len(),
            "prefetching what a held response names"
        );
        if !to_upstream(link, F::follow(&f), done).await {
            return Err(Outcome::Done);
        }
    }
    let resp = match kept {
        Ok(Some(resp)) => resp,
        // Held for Envoy until it asks for the type.
        Ok(None) => return Ok(None),
        Err(warm::Overflow) => return Err(overflow(link)),
    };
    if forwarded(resp.type_url()) && lock(link).warm.as_ref().is_some_and(|w| !w.attached) {
        // No Envoy yet, and none that subscribed to it.
        tracing::debug!(
            type_url = resp.type_url(),
            "dropping a response no Envoy asked for"
        );
        return Ok(None);
    }
    // What Envoy asked for before goes first.
    if !flush_ready::<F>(inputs, link, upstream, down_tx, done).await {
        return Err(Outcome::Done);
    }
    Ok(Some(resp))
}
