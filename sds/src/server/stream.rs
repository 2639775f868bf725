//! One SDS stream, SotW or Delta, driven by one loop ([`serve`]): requests change the names
//! the stream watches ([`Watches`]), each watched name's task forwards its new values, and the
//! protocol ([`Protocol`]: [`Sotw`], [`Delta`]) turns requests into watch changes and new
//! values into responses.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use proto::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tonic::Status;
use tracing::{debug, warn};

use super::{FETCH_BACKOFF_MAX, FETCH_BACKOFF_START, Sds, content_version, new_nonce, to_secret};
use crate::Error;
use crate::manager::{SecretItem, SecretManager};

/// A name's new value.
pub(super) type Update = (String, Arc<SecretItem>);

/// What differs between the two protocols.
pub(super) trait Protocol: Send + 'static {
    type Request: prost::Message + Default + Send + 'static;
    type Response: Send + 'static;
    /// Applies `req` to the watches; returns the names to answer now with their current
    /// values (`None`: the request is ignored).
    fn on_request(&mut self, req: Self::Request, w: &mut Watches) -> Option<Vec<String>>;
    /// The response carrying what in `batch` is news to the stream, and the values it carries
    /// (`None`: nothing to send).
    fn respond(
        &mut self,
        sds: &Sds,
        w: &mut Watches,
        batch: Vec<Update>,
        crl: Option<&Path>,
    ) -> Option<(Self::Response, Vec<Update>)>;
    /// The response was handed to the stream.
    fn sent(&mut self, _resp_nonce: &str) {}
    /// The response's nonce.
    fn nonce(resp: &Self::Response) -> &str;
}

/// Serves one stream until the peer leaves, the stream fails or the server shuts down.
pub(super) async fn serve<P: Protocol, S>(
    sds: Sds,
    mut protocol: P,
    mut inbound: S,
    out: mpsc::Sender<Result<P::Response, Status>>,
) where
    S: Stream<Item = Result<P::Request, Status>> + Unpin,
{
    let (tx, mut updates) = mpsc::channel(64);
    let mut w = Watches {
        manager: sds.manager.clone(),
        tx,
        tasks: HashMap::new(),
        sent: HashMap::new(),
    };
    let crl = sds.manager.config().crl_path.clone();
    loop {
        let batch = tokio::select! {
            _ = sds.shutdown.cancelled() => return,
            req = inbound.next() => {
                let req = match req {
                    Some(Ok(r)) => r,
                    None => return,
                    Some(Err(e)) => {
                        debug!(error = %e, "SDS stream closed by peer");
                        return;
                    }
                };
                let Some(names) = protocol.on_request(req, &mut w) else {
                    continue;
                };
                names
                    .into_iter()
                    .filter_map(|n| {
                        let item = sds.manager.subscribe(&n).borrow().clone()?;
                        Some((n, item))
                    })
                    .collect::<Vec<_>>()
            }
            Some(update) = updates.recv() => {
                let mut batch = vec![update];
                while let Ok(more) = updates.try_recv() {
                    batch.push(more);
                }
                batch
            }
        };
        if batch.is_empty() {
            continue;
        }
        let Some((resp, carried)) = protocol.respond(&sds, &mut w, batch, crl.as_deref()) else {
            continue;
        };
        let nonce = P::nonce(&resp).to_string();
        if out.send(Ok(resp)).await.is_err() {
            return;
        }
        protocol.sent(&nonce);
        for (n, item) in carried {
            w.sent.insert(n, item);
        }
    }
}

/// SotW `StreamSecrets`: every request names the whole set; ACKs get no response, NACKs are
/// logged, a changed set answers the added names only, a request without a nonce (a new
/// stream, or Envoy asking again) answers every name.
#[derive(Default)]
pub(super) struct Sotw {
    last_nonce: String,
}

impl Protocol for Sotw {
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;

    fn on_request(&mut self, req: DiscoveryRequest, w: &mut Watches) -> Option<Vec<String>> {
        if !req.type_url.is_empty() && req.type_url != proto::type_url::SECRET {
            warn!(type_url = %req.type_url, "SDS request for an unexpected type; ignored");
            return None;
        }
        if !req.response_nonce.is_empty() {
            if req.response_nonce != self.last_nonce {
                debug!(nonce = %req.response_nonce, "stale nonce; ignored");
                return None;
            }
            if let Some(err) = &req.error_detail {
                warn!(names = ?req.resource_names, version = %req.version_info, error = %err.message, "Envoy rejected (NACK) a secret");
                return None;
            }
        }
        let wanted: HashSet<String> = req.resource_names.iter().cloned().collect();
        let current = w.names();
        for gone in current.difference(&wanted) {
            debug!(resource = %gone, "unsubscribed");
            w.remove(gone);
        }
        let fresh_request = req.response_nonce.is_empty();
        let mut answer = Vec::new();
        for n in wanted {
            // A new request answers every name, cached or not; after an ACK, the added ones.
            if fresh_request || !current.contains(&n) {
                w.remove(&n);
                w.add(&n);
                answer.push(n);
            }
        }
        Some(answer)
    }

    fn respond(
        &mut self,
        sds: &Sds,
        w: &mut Watches,
        batch: Vec<Update>,
        crl: Option<&Path>,
    ) -> Option<(DiscoveryResponse, Vec<Update>)> {
        let mut news: Vec<Update> = batch
            .into_iter()
            .filter(|(n, item)| w.is_news(n, item))
            .collect::<HashMap<_, _>>()
            .into_iter()
            .collect();
        if news.is_empty() {
            return None;
        }
        news.sort_by(|a, b| a.0.cmp(&b.0));
        let version = sds.version();
        debug!(names = ?news.iter().map(|(n, _)| n).collect::<Vec<_>>(), %version, "SDS push");
        let resp = DiscoveryResponse {
            version_info: version,
            resources: news
                .iter()
                .map(|(n, item)| proto::pack(&named_secret(n, item, crl)))
                .collect(),
            type_url: proto::type_url::SECRET.to_string(),
            nonce: new_nonce(),
            ..Default::default()
        };
        Some((resp, news))
    }

    fn sent(&mut self, nonce: &str) {
        self.last_nonce = nonce.to_string();
    }

    fn nonce(resp: &DiscoveryResponse) -> &str {
        &resp.nonce
    }
}

/// Incremental `DeltaSecrets`: subscriptions change by difference; a name Envoy already has
/// at the same version (`initial_resource_versions`, after a reconnect) is not sent again.
#[derive(Default)]
pub(super) struct Delta {
    /// Versions Envoy already has, consumed on the first send of each name.
    known: HashMap<String, String>,
}

impl Protocol for Delta {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;

    fn on_request(&mut self, req: DeltaDiscoveryRequest, w: &mut Watches) -> Option<Vec<String>> {
        if !req.type_url.is_empty() && req.type_url != proto::type_url::SECRET {
            warn!(type_url = %req.type_url, "delta SDS request for an unexpected type; ignored");
            return None;
        }
        if let Some(err) = &req.error_detail {
            warn!(nonce = %req.response_nonce, error = %err.message, "Envoy rejected (NACK) a delta secret");
        }
        for (n, v) in req.initial_resource_versions {
            w.add(&n);
            self.known.insert(n, v);
        }
        for n in &req.resource_names_unsubscribe {
            w.remove(n);
            self.known.remove(n);
        }
        let mut answer = Vec::new();
        for n in req.resource_names_subscribe {
            if !w.tasks.contains_key(&n) {
                w.add(&n);
                answer.push(n);
            }
        }
        Some(answer)
    }

    fn respond(
        &mut self,
        sds: &Sds,
        w: &mut Watches,
        batch: Vec<Update>,
        crl: Option<&Path>,
    ) -> Option<(DeltaDiscoveryResponse, Vec<Update>)> {
        let mut resources = Vec::new();
        let mut carried = Vec::new();
        for (n, item) in batch {
            if !w.is_news(&n, &item) {
                continue;
            }
            let version = content_version(&item);
            if self.known.remove(&n).is_some_and(|v| v == version) {
                // Envoy has it already: not sent, but it is what the stream holds.
                w.sent.insert(n, item);
                continue;
            }
            resources.push(Resource {
                name: n.clone(),
                version,
                resource: Some(proto::pack(&named_secret(&n, &item, crl))),
                ..Default::default()
            });
            carried.push((n, item));
        }
        if resources.is_empty() {
            return None;
        }
        let resp = DeltaDiscoveryResponse {
            system_version_info: sds.version(),
            resources,
            type_url: proto::type_url::SECRET.to_string(),
            nonce: new_nonce(),
            ..Default::default()
        };
        Some((resp, carried))
    }

    fn nonce(resp: &DeltaDiscoveryResponse) -> &str {
        &resp.nonce
    }
}

/// Envoy's `Secret` for `item`, under the name the stream asked for.
pub(super) fn named_secret(
    name: &str,
    item: &SecretItem,
    crl: Option<&Path>,
) -> proto::envoy::extensions::transport_sockets::tls::v3::Secret {
    let mut s = to_secret(item, crl);
    s.name = name.to_string();
    s
}

/// Per-name task: fetch (retrying while it fails), then forward every new value.
fn watch_name(manager: SecretManager, name: String, tx: mpsc::Sender<Update>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut rx = manager.subscribe(&name);
        let current = rx.borrow_and_update().clone();
        match current {
            Some(item) => {
                if tx.send((name.clone(), item)).await.is_err() {
                    return;
                }
            }
            None => {
                let mut backoff = FETCH_BACKOFF_START;
                loop {
                    match manager.fetch(&name).await {
                        Ok(item) => {
                            rx.borrow_and_update();
                            if tx.send((name.clone(), item)).await.is_err() {
                                return;
                            }
                            break;
                        }
                        Err(Error::Closed) => return,
                        Err(e) => {
                            warn!(resource = %name, error = %e, retry_in = ?backoff, "cannot generate the secret; the SDS request stays pending");
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(FETCH_BACKOFF_MAX);
                        }
                    }
                }
            }
        }
        while rx.changed().await.is_ok() {
            let v = rx.borrow_and_update().clone();
            if let Some(item) = v
                && tx.send((name.clone(), item)).await.is_err()
            {
                return;
            }
        }
    })
}

/// The names a stream watches, each with its forwarding task and what was last sent.
pub(super) struct Watches {
    manager: SecretManager,
    tx: mpsc::Sender<Update>,
    tasks: HashMap<String, JoinHandle<()>>,
    sent: HashMap<String, Arc<SecretItem>>,
}

impl Watches {
    fn add(&mut self, name: &str) {
        if !self.tasks.contains_key(name) {
            self.tasks.insert(
                name.to_string(),
                watch_name(self.manager.clone(), name.to_string(), self.tx.clone()),
            );
        }
    }
    fn remove(&mut self, name: &str) {
        if let Some(t) = self.tasks.remove(name) {
            t.abort();
        }
        self.sent.remove(name);
    }
    fn names(&self) -> HashSet<String> {
        self.tasks.keys().cloned().collect()
    }
    /// True when `item` is new for a watched `name`.
    fn is_news(&self, name: &str, item: &Arc<SecretItem>) -> bool {
        self.tasks.contains_key(name)
            && self
                .sent
                .get(name)
                .is_none_or(|s| !Arc::ptr_eq(s, item) && **s != **item)
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        for t in self.tasks.values() {
            t.abort();
        }
    }
}
