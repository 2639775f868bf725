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

/// Distinct resource names one stream may watch at once. Each watched name costs a task and a
/// watch on the secret manager, and one request (up to the 4 MiB message limit) can name
/// hundreds of thousands, so a request that would take a stream past this is refused with
/// `RESOURCE_EXHAUSTED` and the stream ends. A sidecar's Envoy asks for `default` and `ROOTCA`;
/// a gateway asks for one name per credential it terminates (`file-cert:`/`file-root:` or
/// `kubernetes://` names), so 1,024 leaves a wide margin for the gateways we know of. Istio's
/// agent has no such bound.
pub(super) const MAX_WATCHED_NAMES: usize = 1024;

/// The refusal of a request that would make a stream watch `names` names.
fn too_many_names(names: usize) -> Status {
    Status::resource_exhausted(format!(
        "SDS request would make the stream watch {names} resource names; at most \
         {MAX_WATCHED_NAMES} per stream (MAX_WATCHED_NAMES)"
    ))
}

/// What differs between the two protocols.
pub(super) trait Protocol: Send + 'static {
    type Request: prost::Message + Default + Send + 'static;
    type Response: Send + 'static;
    /// Applies `req` to the watches; returns the names to answer now with their current
    /// values (`None`: the request is ignored). A request that would take the stream past
    /// [`MAX_WATCHED_NAMES`] changes nothing and is refused (`Err`: the stream ends with it).
    fn on_request(
        &mut self,
        req: Self::Request,
        w: &mut Watches,
    ) -> Result<Option<Vec<String>>, Status>;
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
                let names = match protocol.on_request(req, &mut w) {
                    Ok(Some(names)) => names,
                    Ok(None) => continue,
                    Err(status) => {
                        warn!(error = %status.message(), "SDS request refused; closing the stream");
                        let _ = out.send(Err(status)).await;
                        return;
                    }
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

    fn on_request(
        &mut self,
        req: DiscoveryRequest,
        w: &mut Watches,
    ) -> Result<Option<Vec<String>>, Status> {
        if !req.type_url.is_empty() && req.type_url != proto::type_url::SECRET {
            warn!(type_url = %req.type_url, "SDS request for an unexpected type; ignored");
            return Ok(None);
        }
        if !req.response_nonce.is_empty() {
            if req.response_nonce != self.last_nonce {
                debug!(nonce = %req.response_nonce, "stale nonce; ignored");
                return Ok(None);
            }
            if let Some(err) = &req.error_detail {
                warn!(names = req.resource_names.len(), version = %req.version_info, error = %err.message, "Envoy rejected (NACK) a secret");
                return Ok(None);
            }
        }
        let wanted: HashSet<String> = req.resource_names.into_iter().collect();
        if wanted.len() > MAX_WATCHED_NAMES {
            return Err(too_many_names(wanted.len()));
        }
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
        Ok(Some(answer))
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

    fn on_request(
        &mut self,
        req: DeltaDiscoveryRequest,
        w: &mut Watches,
    ) -> Result<Option<Vec<String>>, Status> {
        if !req.type_url.is_empty() && req.type_url != proto::type_url::SECRET {
            warn!(type_url = %req.type_url, "delta SDS request for an unexpected type; ignored");
            return Ok(None);
        }
        if let Some(err) = &req.error_detail {
            warn!(nonce = %req.response_nonce, error = %err.message, "Envoy rejected (NACK) a delta secret");
        }
        // The names watched once the request is applied (initial versions, then unsubscribes,
        // then subscribes, as below), counted before anything changes.
        let watched_after = {
            let unsubscribe: HashSet<&str> = req
                .resource_names_unsubscribe
                .iter()
                .map(String::as_str)
                .collect();
            w.tasks
                .keys()
                .chain(req.initial_resource_versions.keys())
                .map(String::as_str)
                .filter(|n| !unsubscribe.contains(n))
                .chain(req.resource_names_subscribe.iter().map(String::as_str))
                .collect::<HashSet<&str>>()
                .len()
        };
        if watched_after > MAX_WATCHED_NAMES {
            return Err(too_many_names(watched_after));
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
        Ok(Some(answer))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream's watches on a manager with no CA reachable (names wait, never answered).
    fn watches(dir: &Path) -> (Watches, mpsc::Receiver<Update>) {
        let mut reg = prometheus_client::registry::Registry::default();
        let manager = SecretManager::new(
            Arc::new(crate::Config::defaults(dir)),
            Arc::new(crate::Metrics::new(&mut reg)),
        )
        .expect("manager");
        let (tx, rx) = mpsc::channel(64);
        let w = Watches {
            manager,
            tx,
            tasks: HashMap::new(),
            sent: HashMap::new(),
        };
        (w, rx)
    }

    fn names(range: std::ops::Range<usize>) -> Vec<String> {
        range
            .map(|i| format!("file-cert:/c/{i}.pem~/c/{i}.key"))
            .collect()
    }

    #[tokio::test]
    async fn sotw_request_over_the_cap_changes_no_watch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut w, _rx) = watches(dir.path());
        let mut sotw = Sotw::default();
        let req = |names: Vec<String>| DiscoveryRequest {
            resource_names: names,
            type_url: proto::type_url::SECRET.to_string(),
            ..Default::default()
        };
        let answered = sotw
            .on_request(req(names(0..2)), &mut w)
            .expect("served")
            .expect("answered");
        assert_eq!(answered.len(), 2);
        let err = sotw
            .on_request(req(names(0..MAX_WATCHED_NAMES + 1)), &mut w)
            .expect_err("over the cap");
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert_eq!(w.tasks.len(), 2, "no task added or removed");
        // A duplicated name counts once: cap distinct names are served.
        let mut at = names(0..MAX_WATCHED_NAMES);
        at.push(at[0].clone());
        sotw.on_request(req(at), &mut w).expect("served");
        assert_eq!(w.tasks.len(), MAX_WATCHED_NAMES);
    }

    #[tokio::test]
    async fn delta_requests_count_what_the_stream_watches_after_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut w, _rx) = watches(dir.path());
        let mut delta = Delta::default();
        let req = |sub: Vec<String>, unsub: Vec<String>| DeltaDiscoveryRequest {
            resource_names_subscribe: sub,
            resource_names_unsubscribe: unsub,
            type_url: proto::type_url::SECRET.to_string(),
            ..Default::default()
        };
        let cap = MAX_WATCHED_NAMES;
        delta
            .on_request(req(names(0..cap - 24), vec![]), &mut w)
            .expect("served");
        assert_eq!(w.tasks.len(), cap - 24);
        // 25 more: one over. Refused whole; nothing changes.
        let err = delta
            .on_request(req(names(cap - 24..cap + 1), vec![]), &mut w)
            .expect_err("over the cap");
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains(&format!("{}", cap + 1)), "{err:?}");
        assert_eq!(w.tasks.len(), cap - 24);
        // Names already watched, and names unsubscribed in the same request, make room.
        delta
            .on_request(req(names(0..cap), vec![]), &mut w)
            .expect("served at the cap");
        assert_eq!(w.tasks.len(), cap);
        delta
            .on_request(req(names(cap..cap + 10), names(0..10)), &mut w)
            .expect("ten out, ten in");
        assert_eq!(w.tasks.len(), cap);
        // Initial versions (a reconnect) count too.
        let mut reconnect = req(vec![], vec![]);
        reconnect
            .initial_resource_versions
            .insert("file-root:/c/extra.pem".into(), "v1".into());
        assert!(delta.on_request(reconnect, &mut w).is_err());
        assert_eq!(w.tasks.len(), cap);
    }
}
