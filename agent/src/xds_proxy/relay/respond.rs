//! The response half of a stream generation: what istiod sends, relayed to Envoy (gathered
//! while Envoy's queue is full, Wasm rewrites in order) or answered by the agent itself (NDS,
//! PCDS), until istiod closes the stream or it is lost.

use super::*;

/// Most bytes of a relayed response gathered while Envoy's queue is full.
const HELD_MAX: usize = 256 << 10;

/// Parts of a relayed response not yet handed to Envoy's stream. While Envoy's queue is full
/// the relay goes on reading istiod and gathers what arrives (up to [`HELD_MAX`]), so one
/// hand-off, and one write to Envoy, carries many frames instead of one each.
#[derive(Default)]
struct Held {
    parts: Vec<bytes::Bytes>,
    bytes: usize,
}

impl Held {
    fn push(&mut self, part: bytes::Bytes) {
        self.bytes += part.len();
        self.parts.push(part);
    }

    fn take(&mut self) -> Down {
        self.bytes = 0;
        Down::Part(std::mem::take(&mut self.parts))
    }
}

/// Most ECDS responses of one stream being rewritten at once.
const MAX_REWRITES: usize = 8;

/// One ECDS response's Wasm rewrite, on a task of its own so that the responses istiod sends
/// after it (LDS, CDS, ...) reach Envoy while a module is fetched, as Istio's agent does
/// (`rewriteAndForward` runs on a goroutine). The relay hands rewritten responses to Envoy in
/// the order istiod sent them (Istio's goroutines may swap two ECDS pushes, so a stale filter
/// could win), each between two whole messages. What is not guaranteed, by Istio or here, is
/// an ECDS response reaching Envoy before a later LDS that names its filter: Envoy keeps such
/// a listener warming until the filter's config arrives (istiod's `config_discovery` has no
/// default config), so a listener never serves without its Wasm filter or its RBAC fallback.
/// The task is aborted when dropped and ends with the stream's `done`; its fetch is bounded
/// by the plugin's `httpUri.timeout`.
struct Rewrite(tokio::task::JoinHandle<Option<Rewritten>>);

/// The original response and what the rewrite made of it.
type Rewritten = (
    RawResponse,
    Result<Option<bytes::Bytes>, super::super::wasm::ConvertError>,
);

impl Rewrite {
    fn start<F: Flavor>(
        resp: RawResponse,
        cache: Arc<super::super::wasm::Cache>,
        done: CancellationToken,
    ) -> Self {
        Rewrite(tokio::spawn(async move {
            let converted = tokio::select! {
                _ = done.cancelled() => None,
                r = F::convert_wasm(&resp.bytes, &cache) => Some(r),
            };
            converted.map(|r| (resp, r))
        }))
    }
}

impl Drop for Rewrite {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The oldest rewrite's outcome (`None`: cancelled).
async fn next_rewrite(q: &mut VecDeque<Rewrite>) -> Option<Rewritten> {
    let front = q.front_mut()?;
    match (&mut front.0).await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "the ECDS rewrite task failed; dropping the response");
            None
        }
    }
}

/// Sends a rewritten ECDS response to Envoy, or NACKs it upstream with the last version Envoy
/// acknowledged. False when the relay is over.
async fn forward_rewrite<F: Flavor>(
    link: &Shared<F>,
    rewritten: Option<Rewritten>,
    down_tx: &mpsc::Sender<Result<Down, tonic::Status>>,
    done: &CancellationToken,
) -> bool {
    let Some((resp, converted)) = rewritten else {
        return !done.is_cancelled();
    };
    let out = match converted {
        Ok(None) => resp,
        Ok(Some(bytes)) => match RawResponse::new(bytes) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "re-encoded ECDS response does not decode");
                return true;
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, nonce = resp.head.nonce, "NACKing an ECDS response: its Wasm could not be converted");
            let version = lock(link).ecds_version.clone();
            return to_upstream(
                link,
                F::ecds_nack(&resp.head, &version, e.to_string()),
                done,
            )
            .await;
        }
    };
    send(down_tx, Ok(Down::Whole(out)), done, "Envoy").await
}

/// One upstream generation's relay state.
struct Generation {
    upstream: Responses,
    held: Held,
    /// ECDS responses being rewritten, oldest first; dropped (their work aborted) when this
    /// generation ends: the next one's replay gets ECDS again.
    rewrites: VecDeque<Rewrite>,
    /// Between a response's first part and its last: nothing else may go to Envoy until it ends.
    mid_message: bool,
}

/// Relays one upstream generation's responses until it ends.
pub(super) async fn relay<F: Flavor>(
    inputs: &Inputs,
    link: &Shared<F>,
    upstream: Responses,
    down_tx: &mpsc::Sender<Result<Down, tonic::Status>>,
    done: &CancellationToken,
    flush: &tokio::sync::Notify,
    backoff: &mut Backoff,
) -> Outcome {
    let mut g = Generation {
        upstream,
        held: Held::default(),
        rewrites: VecDeque::new(),
        mid_message: false,
    };
    loop {
        if g.held.bytes >= HELD_MAX && !send(down_tx, Ok(g.held.take()), done, "Envoy").await {
            return Outcome::Done;
        }
        let msg = tokio::select! {
            biased;
            _ = done.cancelled() => return Outcome::Done,
            _ = down_tx.closed() => return Outcome::Done,
            permit = down_tx.reserve(), if g.held.bytes > 0 => {
                match permit {
                    Ok(permit) => permit.send(Ok(g.held.take())),
                    Err(_) => return Outcome::Done,
                }
                continue;
            }
            rewritten = next_rewrite(&mut g.rewrites), if !g.mid_message && !g.rewrites.is_empty() => {
                g.rewrites.pop_front();
                if !forward_rewrite::<F>(link, rewritten, down_tx, done).await {
                    return Outcome::Done;
                }
                continue;
            }
            // A warm stream's responses Envoy just asked for.
            () = flush.notified(), if !g.mid_message => {
                if !flush_ready::<F>(inputs, link, &mut g.upstream, down_tx, done).await {
                    return Outcome::Done;
                }
                continue;
            }
            // With MAX_REWRITES pending, istiod is read again once the oldest is done.
            m = g.upstream.next(), if g.mid_message || g.rewrites.len() < MAX_REWRITES => m,
        };
        if let ControlFlow::Break(outcome) =
            on_piece::<F>(inputs, link, &mut g, msg, down_tx, done, backoff).await
        {
            return outcome;
        }
    }
}

/// What the relay does with one read from istiod: a part or a whole response, or the end of the
/// stream.
async fn on_piece<F: Flavor>(
    inputs: &Inputs,
    link: &Shared<F>,
    g: &mut Generation,
    msg: Result<Option<Piece>, tonic::Status>,
    down_tx: &mpsc::Sender<Result<Down, tonic::Status>>,
    done: &CancellationToken,
    backoff: &mut Backoff,
) -> ControlFlow<Outcome> {
    match msg {
        Ok(Some(Piece::Part(bytes))) => {
            if !g.mid_message && lock(link).warm.as_ref().is_some_and(warm::Held::holding) {
                // Longer than the warm cap: it cannot be held.
                return ControlFlow::Break(overflow(link));
            }
            g.mid_message = true;
            g.held.push(bytes);
        }
        Ok(Some(Piece::Last(bytes, resp))) => {
            g.mid_message = false;
            // A long response ran code the idle agent does not run again (and the first push
            // after startup comes after the startup code is released): its pages go at the
            // next idle tick.
            crate::runtime::release_code_later();
            inputs.metrics.responses.inc();
            backoff.reset();
            if let Some(subs) = lock(link).subs.as_mut() {
                subs.on_response(&resp);
            }
            g.held.push(bytes);
            if !send(down_tx, Ok(g.held.take()), done, "Envoy").await {
                return ControlFlow::Break(Outcome::Done);
            }
        }
        Ok(Some(Piece::Whole(resp))) => {
            inputs.metrics.responses.inc();
            backoff.reset();
            let resp =
                match pass_warm::<F>(inputs, link, resp, &mut g.upstream, down_tx, done).await {
                    Ok(Some(resp)) => resp,
                    Ok(None) => return ControlFlow::Continue(()),
                    Err(outcome) => return ControlFlow::Break(outcome),
                };
            if !dispatch::<F>(inputs, link, resp, &mut g.rewrites, down_tx, done).await {
                return ControlFlow::Break(Outcome::Done);
            }
        }
        Ok(None) => return ControlFlow::Break(istiod_closed::<F>(inputs)),
        Err(status) => return ControlFlow::Break(upstream_ended::<F>(inputs, &g.upstream, status)),
    }
    ControlFlow::Continue(())
}

/// Where a whole response goes by its type: NDS and PCDS to the proxy itself, ECDS through the
/// Wasm rewrite when Wasm is on, the rest to Envoy. False when the relay is over.
async fn dispatch<F: Flavor>(
    inputs: &Inputs,
    link: &Shared<F>,
    resp: RawResponse,
    rewrites: &mut VecDeque<Rewrite>,
    down_tx: &mpsc::Sender<Result<Down, tonic::Status>>,
    done: &CancellationToken,
) -> bool {
    let t = resp.type_url();
    if t == type_url::NAME_TABLE {
        own_nds::<F>(inputs, link, &resp, done).await
    } else if t == type_url::PROXY_CONFIG {
        own_pcds::<F>(inputs, link, &resp, done).await
    } else if t == type_url::ECDS
        && let Some(cache) = &inputs.wasm
    {
        rewrites.push_back(Rewrite::start::<F>(resp, cache.clone(), done.clone()));
        true
    } else if forwarded(t) {
        send(down_tx, Ok(Down::Whole(resp)), done, "Envoy").await
    } else {
        tracing::error!(type_url = t, "dropping a response of unknown type");
        true
    }
}

/// Hands an NDS response to the DNS proxy and ACKs (or NACKs) it upstream. False when the
/// relay is over.
async fn own_nds<F: Flavor>(
    inputs: &Inputs,
    link: &Shared<F>,
    resp: &RawResponse,
    done: &CancellationToken,
) -> bool {
    let Some(sink) = &inputs.nds else {
        tracing::warn!("dropping an NDS response: DNS capture is off");
        return true;
    };
    let result = own_resource::<F, NameTable>(resp, "NDS").and_then(|table| match table {
        Some(table) => sink(table).map_err(OwnResponseError::Rejected),
        None => Ok(()),
    });
    if let Err(e) = &result {
        tracing::warn!(error = %e, "rejecting NDS response");
    }
    ack_own::<F>(link, resp, result, done).await
}

/// Hands a PCDS response's trust anchors to their sink and ACKs (or NACKs) it upstream. False
/// when the relay is over.
async fn own_pcds<F: Flavor>(
    inputs: &Inputs,
    link: &Shared<F>,
    resp: &RawResponse,
    done: &CancellationToken,
) -> bool {
    let Some(sink) = &inputs.pcds else {
        tracing::warn!("dropping a PCDS response: PROXY_CONFIG_XDS_AGENT is off");
        return true;
    };
    let result = own_resource::<F, ProxyConfigTrust>(resp, "PCDS").and_then(|pc| match pc {
        Some(pc) => sink(pc.ca_certificates_pem).map_err(OwnResponseError::Rejected),
        None => Ok(()),
    });
    if let Err(e) = &result {
        tracing::warn!(error = %e, "rejecting PCDS response");
    }
    ack_own::<F>(link, resp, result, done).await
}

/// The proxy's own ACK (or, with the error, NACK) of a response it consumed.
async fn ack_own<F: Flavor>(
    link: &Shared<F>,
    resp: &RawResponse,
    result: Result<(), OwnResponseError>,
    done: &CancellationToken,
) -> bool {
    let error = result.err().map(|e| e.to_string());
    to_upstream(link, F::ack(resp.type_url(), &resp.head, error), done).await
}

/// istiod ended the stream cleanly: a loss the proxy may reconnect after.
fn istiod_closed<F: Flavor>(inputs: &Inputs) -> Outcome {
    tracing::info!(flavor = F::NAME, "istiod closed the xDS stream");
    inputs
        .metrics
        .istiod_connection_terminations
        .get_or_create(&TerminationLabels {
            r#type: "cancelled",
        })
        .inc();
    Outcome::Lost {
        status: None,
        reason: "closed",
    }
}

/// The upstream stream ended with `status`: Envoy's stream ends when it holds part of a
/// response or istiod refused it; a lost connection is a loss the proxy may reconnect after.
fn upstream_ended<F: Flavor>(
    inputs: &Inputs,
    upstream: &Responses,
    status: tonic::Status,
) -> Outcome {
    inputs
        .metrics
        .istiod_connection_terminations
        .get_or_create(&TerminationLabels {
            r#type: termination(&status),
        })
        .inc();
    if upstream.relaying() {
        // Envoy holds part of a response that can never be completed: its stream
        // ends (as Istio's always does) and Envoy reconnects.
        tracing::warn!(flavor = F::NAME, status = %status,
            "upstream xDS stream ended in the middle of a response partly relayed to Envoy; ending Envoy's stream");
        return Outcome::End(tonic::Status::unavailable(format!(
            "the upstream xDS stream ended in the middle of a response: {}",
            status.message()
        )));
    }
    tracing::warn!(flavor = F::NAME, status = %status, "upstream xDS stream ended");
    if !lost(&status) {
        return Outcome::End(status);
    }
    let reason = loss_reason(&status);
    Outcome::Lost {
        status: Some(status),
        reason,
    }
}
