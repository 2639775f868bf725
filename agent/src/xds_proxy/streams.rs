//! The downstream streams open on the XDS socket: admission (Istio's one stream at a time, or
//! several up to a cap), the gauge of open streams, and which stream owns the proxy's own NDS
//! subscription.
//!
//! NDS is the proxy's, not the client's: one table feeds the DNS proxy, so exactly one open
//! stream subscribes to it upstream. The first stream to send LDS takes it; when that stream
//! ends, a stream still open that has sent LDS takes it over and subscribes on its own upstream
//! (its replay on reconnect then carries the subscription too).

use std::collections::HashMap;
use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Streams;

/// The registry of open downstream streams (shared by every connection on the socket).
#[derive(Clone)]
pub(crate) struct Open {
    inner: Arc<Inner>,
}

struct Inner {
    policy: Streams,
    live: std::sync::Mutex<Live>,
    /// The id of the stream that owns the NDS subscription, if any.
    nds_owner: watch::Sender<Option<u64>>,
    gauge: Gauge,
}

#[derive(Default)]
struct Live {
    next_id: u64,
    /// Each open stream's stop token.
    streams: HashMap<u64, CancellationToken>,
}

/// One admitted downstream stream; dropping it (when both of its relay tasks are done) frees its
/// slot and its NDS ownership.
pub(crate) struct Stream {
    id: u64,
    done: CancellationToken,
    nds_owner: watch::Receiver<Option<u64>>,
    inner: Arc<Inner>,
}

impl Open {
    pub(crate) fn new(policy: Streams, gauge: Gauge) -> Open {
        Open {
            inner: Arc::new(Inner {
                policy,
                live: std::sync::Mutex::default(),
                nds_owner: watch::Sender::new(None),
                gauge,
            }),
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        self.inner
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Admits a new stream. With [`Streams::One`] (Istio) the streams still open are ended (OK
    /// status) and their upstreams closed; with [`Streams::Many`] a stream over the cap is
    /// refused with RESOURCE_EXHAUSTED.
    pub(crate) fn admit(&self) -> Result<Stream, tonic::Status> {
        let done = CancellationToken::new();
        let id = {
            let mut live = self.live();
            match self.inner.policy {
                Streams::One => {
                    for (_, previous) in live.streams.drain() {
                        if !previous.is_cancelled() {
                            tracing::info!("a new Envoy xDS stream replaces the previous one");
                            previous.cancel();
                        }
                    }
                }
                Streams::Many { cap } => {
                    if live.streams.len() >= cap {
                        tracing::warn!(
                            cap,
                            "refusing an xDS stream: the XDS socket's concurrent stream cap is reached"
                        );
                        return Err(tonic::Status::resource_exhausted(format!(
                            "the agent's XDS socket serves at most {cap} concurrent xDS streams"
                        )));
                    }
                }
            }
            let id = live.next_id;
            live.next_id += 1;
            live.streams.insert(id, done.clone());
            id
        };
        self.inner.gauge.inc();
        tracing::debug!(stream = id, "xDS stream admitted");
        Ok(Stream {
            id,
            done,
            nds_owner: self.inner.nds_owner.subscribe(),
            inner: self.inner.clone(),
        })
    }
}

impl Stream {
    /// Cancelled to end the stream (replaced, or the relay is over).
    pub(crate) fn done(&self) -> &CancellationToken {
        &self.done
    }

    /// Takes the NDS subscription when no open stream has it; true when this stream now owns it
    /// (and so must subscribe).
    pub(crate) fn claim_nds(&self) -> bool {
        let id = self.id;
        let mut claimed = false;
        self.inner.nds_owner.send_if_modified(|owner| {
            if owner.is_none() {
                *owner = Some(id);
                claimed = true;
            }
            claimed
        });
        claimed
    }

    /// True when this stream owns the NDS subscription.
    pub(crate) fn owns_nds(&self) -> bool {
        *self.nds_owner.borrow() == Some(self.id)
    }

    /// Resolves when no stream owns the NDS subscription (its owner ended).
    pub(crate) async fn nds_free(&self) {
        let mut owner = self.nds_owner.clone();
        if owner.wait_for(Option::is_none).await.is_err() {
            // The registry is gone: nothing will ever free it.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.done.cancel();
        let id = self.id;
        self.inner
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .streams
            .remove(&id);
        self.inner.nds_owner.send_if_modified(|owner| {
            if *owner == Some(id) {
                *owner = None;
                true
            } else {
                false
            }
        });
        self.inner.gauge.dec();
        tracing::debug!(stream = id, "xDS stream closed");
    }
}
