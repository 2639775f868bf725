//! The ADS server: `StreamAggregatedResources` (SotW) and `DeltaAggregatedResources`.
//!
//! One task per stream owns the stream's state. Per type it tracks the nonce it sent and the
//! nonce the proxy acknowledged; it never has more than one un-acked push per type (a change that
//! arrives meanwhile is pushed after the ACK/NACK). A NACK is logged and the proxy keeps its last
//! good config: nothing is re-sent until the proxy's view changes again. On a new snapshot the
//! task regenerates the proxy's resources (shared across proxies with equal views) and pushes, in
//! the order CDS, EDS, LDS, RDS, NDS, only the types whose content changed for this proxy; at
//! most `PILOT_PUSH_THROTTLE` connections generate and send at once.
//!
//! Responses are not built as messages per proxy: the cache keeps each generation's resource
//! entries encoded once (`xds::encoded`), a push writes a small head (version, type, nonce,
//! removals) and hands the shared bytes to the stream's response body (`ads/service.rs`, the
//! hand-written gRPC service).

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use futures::{Stream, StreamExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use prost::bytes::BytesMut;
use proto::envoy::config::core::v3::Node;
use proto::envoy::config::endpoint::v3::ClusterLoadAssignment;
use proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::cache::{CacheSlot, CachedSnapshot};
use super::encoded::{self, Encoded};
use super::{FixedResources, SyncTable, XdsType};
use crate::ca::Identity;
use crate::model::{Proxy, Snapshot};

#[cfg(any(test, feature = "fuzzing"))]
mod fuzz;
mod service;

#[cfg(feature = "fuzzing")]
pub use fuzz::fuzz_ads_requests;

pub use service::AdsService;
use service::Wire;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabels {
    r#type: &'static str,
}

/// xDS metrics (Istio's `pilot_*` names).
#[derive(Clone)]
pub struct XdsMetrics {
    pushes: Family<TypeLabels, Counter>,
    rejects: Family<TypeLabels, Counter>,
    push_time: Family<TypeLabels, Histogram>,
    convergence: Histogram,
    connected: Gauge,
}

impl XdsMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = XdsMetrics {
            pushes: Family::default(),
            rejects: Family::default(),
            push_time: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0001, 4.0, 10))
            }),
            convergence: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            connected: Gauge::default(),
        };
        registry.register("pilot_xds_pushes", "Pushes sent, by type", m.pushes.clone());
        registry.register(
            "pilot_total_xds_rejects",
            "NACKs received, by type",
            m.rejects.clone(),
        );
        registry.register(
            "pilot_xds_push_time",
            "Seconds to generate and send one push, by type",
            m.push_time.clone(),
        );
        registry.register(
            "pilot_proxy_convergence_time",
            "Seconds from a config snapshot to the proxy's ACK of the push it caused",
            m.convergence.clone(),
        );
        registry.register("pilot_xds", "Connected xDS streams", m.connected.clone());
        m
    }
}

/// Inputs of [`AdsServer::new`].
pub struct AdsInputs {
    pub snapshots: watch::Receiver<Arc<Snapshot>>,
    /// Resources served to every proxy instead of generated from the snapshots (`istiod-lite
    /// replay`); `None` generates.
    pub fixed: Option<Arc<dyn FixedResources>>,
    /// `PILOT_PUSH_THROTTLE`: connections generating/sending at once.
    pub push_throttle: usize,
    pub metrics: XdsMetrics,
    pub sync: SyncTable,
    pub cancel: CancellationToken,
}

struct Inner {
    snapshots: watch::Receiver<Arc<Snapshot>>,
    /// What was generated from the newest snapshot, shared by every stream.
    cache: CacheSlot,
    throttle: Arc<Semaphore>,
    metrics: XdsMetrics,
    sync: SyncTable,
    cancel: CancellationToken,
    next_conn: AtomicU64,
    next_nonce: AtomicU64,
}

/// The ADS service (clone it into each gRPC server).
#[derive(Clone)]
pub struct AdsServer {
    inner: Arc<Inner>,
}

impl AdsServer {
    pub fn new(inputs: AdsInputs) -> Self {
        AdsServer {
            inner: Arc::new(Inner {
                snapshots: inputs.snapshots,
                cache: CacheSlot::new(inputs.fixed),
                throttle: Arc::new(Semaphore::new(inputs.push_throttle.max(1))),
                metrics: inputs.metrics,
                sync: inputs.sync,
                cancel: inputs.cancel,
                next_conn: AtomicU64::new(1),
                next_nonce: AtomicU64::new(1),
            }),
        }
    }
}

/// A request of either protocol, normalised.
struct Req {
    node: Option<Node>,
    type_url: String,
    nonce: String,
    error: Option<String>,
    /// SotW: the complete name list.
    names: Vec<String>,
    /// Delta only.
    subscribe: Vec<String>,
    unsubscribe: Vec<String>,
    initial_versions: BTreeMap<String, String>,
}

impl From<DiscoveryRequest> for Req {
    fn from(r: DiscoveryRequest) -> Self {
        Req {
            node: r.node,
            type_url: r.type_url,
            nonce: r.response_nonce,
            error: r
                .error_detail
                .map(|e| format!("code {}: {}", e.code, e.message)),
            names: r.resource_names,
            subscribe: Vec::new(),
            unsubscribe: Vec::new(),
            initial_versions: BTreeMap::new(),
        }
    }
}

impl From<DeltaDiscoveryRequest> for Req {
    fn from(r: DeltaDiscoveryRequest) -> Self {
        Req {
            node: r.node,
            type_url: r.type_url,
            nonce: r.response_nonce,
            error: r
                .error_detail
                .map(|e| format!("code {}: {}", e.code, e.message)),
            names: Vec::new(),
            subscribe: r.resource_names_subscribe,
            unsubscribe: r.resource_names_unsubscribe,
            initial_versions: r.initial_resource_versions.into_iter().collect(),
        }
    }
}

struct Pending {
    /// When the snapshot that caused this push was created (for convergence time).
    trigger: Option<Instant>,
}

#[derive(Default)]
struct TypeState {
    requested: bool,
    wildcard: bool,
    names: Names,
    /// Delta: what the proxy has (name → hash), from what was sent and its initial versions;
    /// the names of what was sent are the generation's own ([`Encoded::names`]).
    sent: Sent,
    /// SotW: a digest of the names and hashes of the last response (a SotW response is
    /// complete, so equal digests mean nothing changed); kept instead of a map of names so
    /// that a stream holds no copy of what it sent.
    sent_digest: Option<u64>,
    last_nonce: String,
    pending: Option<Pending>,
    dirty: bool,
}

/// What a Delta stream's proxy has: (name, hash) sorted by name, in one allocation of the exact
/// size (a map would hold a node of eleven entries for every few names).
#[derive(Default)]
struct Sent(Vec<(Arc<str>, u64)>);

impl Sent {
    fn new(mut entries: Vec<(Arc<str>, u64)>) -> Sent {
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|a, b| a.0 == b.0);
        entries.shrink_to_fit();
        Sent(entries)
    }

    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(n, _)| (**n).cmp(name))
    }

    fn get(&self, name: &str) -> Option<u64> {
        self.find(name).ok().map(|i| self.0[i].1)
    }

    /// Removes every name in `gone` (one pass, however many).
    fn remove_all(&mut self, gone: &BTreeSet<&str>) {
        if !gone.is_empty() {
            self.0.retain(|(n, _)| !gone.contains(&**n));
        }
    }
}

/// The names a proxy subscribed to, sorted, in one allocation of the exact size (a set would
/// hold a node of eleven entries for every few names, each name with spare capacity).
#[derive(Default, PartialEq)]
struct Names(Vec<Box<str>>);

impl Names {
    fn new(names: Vec<String>) -> Names {
        let mut n = Names::default();
        n.extend(names);
        n
    }

    fn contains(&self, name: &str) -> bool {
        self.0.binary_search_by(|n| (**n).cmp(name)).is_ok()
    }

    /// Adds `names` (one sort, however many); true if any was new.
    fn extend(&mut self, names: Vec<String>) -> bool {
        if names.is_empty() {
            return false;
        }
        let before = self.0.len();
        self.0.extend(names.into_iter().map(String::into_boxed_str));
        self.0.sort_unstable();
        self.0.dedup();
        self.0.shrink_to_fit();
        self.0.len() > before
    }

    /// Removes every name in `gone` (one pass, however many).
    fn remove_all(&mut self, gone: &BTreeSet<&str>) {
        if !gone.is_empty() {
            self.0.retain(|n| !gone.contains(&**n));
        }
    }

    fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|n| &**n)
    }
}

/// Every type's state, by [`XdsType::index`], in one allocation (a map's node holds eleven).
#[derive(Default)]
struct Types(Box<[TypeState; XdsType::ALL.len()]>);

impl Types {
    fn state(&mut self, ty: XdsType) -> &mut TypeState {
        &mut self.0[ty.index()]
    }
}

/// A digest of a SotW response's resources (names and content hashes, in order).
fn digest<'a>(resources: impl Iterator<Item = &'a super::Resource>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for r in resources {
        r.name.hash(&mut h);
        r.hash.hash(&mut h);
    }
    h.finish()
}

type ReqStream = Pin<Box<dyn Stream<Item = Result<Req, Status>> + Send>>;

struct Conn {
    inner: Arc<Inner>,
    /// Responses (encoded) and the final status, to the stream's response body.
    out: mpsc::Sender<Wire>,
    /// A Delta stream (else SotW).
    delta: bool,
    conn_id: String,
    /// Who opened the stream (the secure port authenticates every stream; `None` on the
    /// plaintext port, as istiod's 15010).
    identity: Option<Box<Identity>>,
    proxy: Option<Proxy>,
    snap: Arc<CachedSnapshot>,
    types: Types,
}

fn parse_hash(v: &str) -> u64 {
    u64::from_str_radix(v, 16).unwrap_or(0)
}

impl Conn {
    async fn run(mut self, mut requests: ReqStream) {
        let mut snapshots = self.inner.snapshots.clone();
        self.snap = self
            .inner
            .cache
            .for_snapshot(&snapshots.borrow_and_update());
        let cancel = self.inner.cancel.clone();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                req = requests.next() => match req {
                    Some(Ok(req)) => {
                        // Boxed: the task's future stays small while the stream idles (every
                        // connected proxy holds one); the request's future lives only while it runs.
                        if let Err(status) = Box::pin(self.on_request(req)).await {
                            tracing::warn!(conn = %self.conn_id, error = %status.message(), "closing xDS stream");
                            // Boxed too: the status and the send would sit in every idle task.
                            Box::pin(self.send_error(status)).await;
                            break;
                        }
                    }
                    Some(Err(e)) => {
                        tracing::debug!(conn = %self.conn_id, error = %e, "xDS stream ended");
                        // A request that could not be taken (over the size limit, undecodable)
                        // is answered with why; a peer that went away is not.
                        if matches!(e.code(), tonic::Code::OutOfRange | tonic::Code::Internal) {
                            Box::pin(self.send_error(e)).await;
                        }
                        break;
                    }
                    None => break,
                },
                changed = snapshots.changed() => {
                    if changed.is_err() { break; }
                    let snap = self.inner.cache.for_snapshot(&snapshots.borrow_and_update());
                    if self.proxy.is_some() && Box::pin(self.on_snapshot(snap)).await.is_err() {
                        break;
                    }
                }
            }
        }
        if self.proxy.is_some() {
            self.inner.sync.disconnect(&self.conn_id);
            self.inner.metrics.connected.dec();
            tracing::info!(conn = %self.conn_id, "proxy disconnected");
        }
    }

    async fn send_error(&self, status: Status) {
        let _ = self.out.send(Wire::End(Box::new(status))).await;
    }

    async fn on_snapshot(&mut self, snap: Arc<CachedSnapshot>) -> Result<(), ()> {
        self.snap = snap;
        let _permit = self
            .inner
            .throttle
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ())?;
        for ty in XdsType::ALL {
            let st = self.types.state(ty);
            if !st.requested {
                continue;
            }
            if st.pending.is_some() {
                st.dirty = true;
                continue;
            }
            self.push(ty, false, Some(self.snap.snapshot().created))
                .await?;
        }
        Ok(())
    }

    async fn on_request(&mut self, req: Req) -> Result<(), Status> {
        if self.proxy.is_none() {
            let proxy = Proxy::from_node(req.node.as_ref())
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            if let Some(id) = &self.identity {
                authorize(id, &proxy)?;
            }
            self.conn_id = format!(
                "{}-{}",
                proxy.id,
                self.inner.next_conn.fetch_add(1, Ordering::Relaxed)
            );
            let stream = if self.delta { "delta" } else { "sotw" };
            self.inner.sync.connect(&self.conn_id, &proxy.id, stream);
            self.inner.metrics.connected.inc();
            tracing::info!(conn = %self.conn_id, namespace = %proxy.view.namespace, stream, "proxy connected");
            self.proxy = Some(proxy);
        }
        let Some(ty) = XdsType::from_type_url(&req.type_url) else {
            tracing::debug!(conn = %self.conn_id, type_url = %req.type_url, "ignoring request for an unserved type");
            return Ok(());
        };
        if self.delta {
            self.on_delta_request(ty, req).await
        } else {
            self.on_sotw_request(ty, req).await
        }
        .map_err(|()| Status::unavailable("stream closed"))
    }

    /// ACK/NACK bookkeeping when `nonce` answers our latest push. Returns false for a stale nonce.
    fn on_response(&mut self, ty: XdsType, nonce: &str, error: Option<String>) -> bool {
        let conn_id = self.conn_id.clone();
        let version = self.snap.snapshot().version.clone();
        let st = self.types.state(ty);
        if nonce != st.last_nonce {
            return false;
        }
        let pending = st.pending.take();
        match error {
            Some(err) => {
                self.inner
                    .metrics
                    .rejects
                    .get_or_create(&TypeLabels { r#type: ty.short() })
                    .inc();
                tracing::warn!(conn = %conn_id, r#type = ty.short(), type_url = ty.type_url(), nonce, error = %err,
                    "proxy rejected push (NACK); it keeps its last good config");
                // `sent` stays what was sent: nothing is re-sent until the view changes again.
                let nonce = nonce.to_string();
                self.inner.sync.update(&conn_id, ty, |t| {
                    t.nack = Some(err);
                    t.nack_nonce = Some(nonce);
                });
            }
            None => {
                if let Some(trigger) = pending.and_then(|p| p.trigger) {
                    self.inner
                        .metrics
                        .convergence
                        .observe(trigger.elapsed().as_secs_f64());
                }
                let nonce = nonce.to_string();
                self.inner.sync.update(&conn_id, ty, |t| {
                    t.acked_nonce = nonce;
                    t.acked_version = if t.sent_version.is_empty() {
                        version
                    } else {
                        t.sent_version.clone()
                    };
                    t.nack = None;
                    t.nack_nonce = None;
                });
            }
        }
        true
    }

    async fn on_sotw_request(&mut self, ty: XdsType, req: Req) -> Result<(), ()> {
        let names = Names::new(req.names);
        if req.nonce.is_empty() {
            // First request for the type on this stream (or Envoy re-subscribing).
            let st = self.types.state(ty);
            st.requested = true;
            st.wildcard = ty.is_wildcard() || names.contains("*");
            st.names = names;
            return self.push(ty, true, None).await;
        }
        if !self.on_response(ty, &req.nonce, req.error) {
            tracing::debug!(conn = %self.conn_id, r#type = ty.short(), nonce = %req.nonce, "stale nonce ignored");
            return Ok(());
        }
        let st = self.types.state(ty);
        let names_changed = !st.wildcard && st.names != names;
        if names_changed {
            st.names = names;
        }
        let dirty = std::mem::take(&mut st.dirty);
        if names_changed || dirty {
            self.push(ty, names_changed, None).await?;
        }
        Ok(())
    }

    async fn on_delta_request(&mut self, ty: XdsType, req: Req) -> Result<(), ()> {
        let st = self.types.state(ty);
        let first = !st.requested;
        let mut added = false;
        if first {
            st.requested = true;
            st.wildcard = ty.is_wildcard()
                && (req.subscribe.is_empty() || req.subscribe.iter().any(|n| n == "*"));
            st.sent = Sent::new(
                req.initial_versions
                    .iter()
                    .map(|(k, v)| (Arc::from(k.as_str()), parse_hash(v)))
                    .collect(),
            );
        }
        let mut subscribe = req.subscribe;
        if subscribe.iter().any(|n| n == "*") {
            subscribe.retain(|n| n != "*");
            added |= !st.wildcard;
            st.wildcard = true;
        }
        added |= st.names.extend(subscribe);
        let gone: BTreeSet<&str> = req.unsubscribe.iter().map(String::as_str).collect();
        if gone.contains("*") {
            st.wildcard = false;
        }
        st.names.remove_all(&gone);
        st.sent.remove_all(&gone);
        if first {
            return self.push(ty, true, None).await;
        }
        if !req.nonce.is_empty() && !self.on_response(ty, &req.nonce, req.error) {
            tracing::debug!(conn = %self.conn_id, r#type = ty.short(), nonce = %req.nonce, "stale nonce");
        }
        let st = self.types.state(ty);
        if st.pending.is_some() {
            st.dirty |= added;
            return Ok(());
        }
        let dirty = std::mem::take(&mut st.dirty);
        if added || dirty {
            self.push(ty, false, None).await?;
        }
        Ok(())
    }

    /// Generates and sends `ty` if the proxy's view changed (or `force`). Err = stream closed.
    async fn push(&mut self, ty: XdsType, force: bool, trigger: Option<Instant>) -> Result<(), ()> {
        let Some(proxy) = &self.proxy else {
            return Ok(());
        };
        let start = Instant::now();
        let all = self.snap.encoded(&proxy.view, ty);
        let st = self.types.state(ty);
        let empty = if ty == XdsType::Eds && !st.wildcard {
            empty_assignments(&all, st)
        } else {
            None
        };
        // The selected resources, as indices into `all` and into `empty`.
        let picked: Vec<usize> = (0..all.resources.len())
            .filter(|i| st.wildcard || st.names.contains(&all.resources[*i].name))
            .collect();
        let picked_empty: Vec<usize> = empty
            .as_ref()
            .map(|e| (0..e.resources.len()).collect())
            .unwrap_or_default();
        let selected = || {
            picked.iter().map(|i| &all.resources[*i]).chain(
                picked_empty
                    .iter()
                    .map(|i| &empty.as_ref().expect("picked").resources[*i]),
            )
        };
        let nonce = format!(
            "{:x}",
            self.inner.next_nonce.fetch_add(1, Ordering::Relaxed)
        );
        let version = self.snap.snapshot().version.clone();
        // The entries of `all`, then of `empty`, in one body.
        let body = |delta: bool, from_all: &[usize], from_empty: &[usize]| {
            let a = all.entries(delta, from_all);
            match &empty {
                Some(e) if !from_empty.is_empty() => {
                    let mut b = BytesMut::from(&a[..]);
                    b.extend_from_slice(&e.entries(delta, from_empty));
                    b.freeze()
                }
                _ => a,
            }
        };
        let (frame, count, sent) = if self.delta {
            let named = |e: &Encoded, i: usize| (e.names[i].clone(), e.resources[i].hash);
            let new_map = Sent::new(
                picked
                    .iter()
                    .map(|i| named(&all, *i))
                    .chain(
                        picked_empty
                            .iter()
                            .map(|i| named(empty.as_ref().expect("picked"), *i)),
                    )
                    .collect(),
            );
            let changed = |r: &super::Resource| st.sent.get(&r.name) != Some(r.hash);
            let changed_all: Vec<usize> = picked
                .iter()
                .copied()
                .filter(|i| changed(&all.resources[*i]))
                .collect();
            let changed_empty: Vec<usize> = picked_empty
                .iter()
                .copied()
                .filter(|i| changed(&empty.as_ref().expect("picked").resources[*i]))
                .collect();
            let removed: Vec<String> = st
                .sent
                .0
                .iter()
                .filter(|(k, _)| new_map.find(k).is_err())
                .map(|(k, _)| k.to_string())
                .collect();
            if !force && changed_all.is_empty() && changed_empty.is_empty() && removed.is_empty() {
                return Ok(());
            }
            let count = changed_all.len() + changed_empty.len();
            let frame = encoded::delta_response(
                &version,
                ty.type_url(),
                &nonce,
                &removed,
                body(true, &changed_all, &changed_empty),
            );
            (frame, count, Some(new_map))
        } else {
            let new_digest = digest(selected());
            if !force && st.sent_digest == Some(new_digest) {
                return Ok(());
            }
            st.sent_digest = Some(new_digest);
            let frame = encoded::sotw_response(
                &version,
                ty.type_url(),
                &nonce,
                body(false, &picked, &picked_empty),
            );
            (frame, picked.len() + picked_empty.len(), None)
        };
        self.out
            .send(Wire::Message(Box::new(frame)))
            .await
            .map_err(|_| ())?;
        if let Some(sent) = sent {
            st.sent = sent;
        }
        st.last_nonce = nonce.clone();
        st.pending = Some(Pending { trigger });
        self.pushed(ty, start, nonce, version, count);
        Ok(())
    }

    /// Metrics, `/debug/syncz` and the log line of a push that was sent.
    fn pushed(&self, ty: XdsType, start: Instant, nonce: String, version: String, count: usize) {
        let labels = TypeLabels { r#type: ty.short() };
        self.inner.metrics.pushes.get_or_create(&labels).inc();
        self.inner
            .metrics
            .push_time
            .get_or_create(&labels)
            .observe(start.elapsed().as_secs_f64());
        let v = version.clone();
        self.inner.sync.update(&self.conn_id, ty, |t| {
            t.sent_nonce = nonce;
            t.sent_version = v;
        });
        tracing::debug!(conn = %self.conn_id, r#type = ty.short(), resources = count, version = %version, "pushed");
    }
}

/// As Istio: a requested cluster with no service gets an empty assignment, so Envoy does not
/// keep a cluster from a superseded config warming until its initial-fetch timeout (15 s) — a
/// slow Envoy applies such configs.
fn empty_assignments(all: &Encoded, st: &TypeState) -> Option<Encoded> {
    let have: BTreeSet<&str> = all.resources.iter().map(|r| r.name.as_str()).collect();
    let missing: Vec<super::Resource> = st
        .names
        .iter()
        .filter(|n| !have.contains(n))
        .map(|n| {
            let cla = ClusterLoadAssignment {
                cluster_name: n.to_string(),
                ..Default::default()
            };
            super::resource(n.to_string(), &cla)
        })
        .collect();
    (!missing.is_empty()).then(|| Encoded::new(Arc::new(missing)))
}

/// istiod's authorization of an authenticated stream (`pilot/pkg/xds/auth.go`): the identity's
/// namespace must be the proxy's config namespace and, when the node names a service account
/// (metadata `SERVICE_ACCOUNT`), its service account that one. Else `PERMISSION_DENIED`, before
/// anything is generated for the node.
fn authorize(id: &Identity, proxy: &Proxy) -> Result<(), Status> {
    let ns = &proxy.view.namespace;
    let sa = &proxy.service_account;
    if id.namespace == *ns && (sa.is_empty() || id.service_account == *sa) {
        return Ok(());
    }
    tracing::warn!(identity = %id, node = %proxy.id, namespace = %ns, service_account = %sa, "unauthorized xDS stream");
    Err(Status::permission_denied(format!(
        "authorization failed: identity {id} does not match the node's namespace {ns:?} and service account {sa:?}"
    )))
}

impl AdsServer {
    /// Starts the task that serves one ADS stream: `requests` in, encoded responses to `out`;
    /// `identity` is the authenticated caller's (secure port), checked against the node.
    fn spawn(
        &self,
        out: mpsc::Sender<Wire>,
        delta: bool,
        requests: ReqStream,
        identity: Option<Identity>,
    ) {
        tokio::spawn(self.conn(out, delta, identity).run(requests));
    }

    /// A stream's state before its first request.
    fn conn(&self, out: mpsc::Sender<Wire>, delta: bool, identity: Option<Identity>) -> Conn {
        Conn {
            inner: self.inner.clone(),
            out,
            delta,
            identity: identity.map(Box::new),
            conn_id: String::new(),
            proxy: None,
            snap: self
                .inner
                .cache
                .for_snapshot(&self.inner.snapshots.borrow()),
            types: Types::default(),
        }
    }

    /// The gRPC service (`envoy.service.discovery.v3.AggregatedDiscoveryService`, SotW and
    /// Delta) to add to a tonic server; requests larger than `max_decoding_message_size` are
    /// refused.
    pub fn service(&self, max_decoding_message_size: usize) -> AdsService {
        AdsService::new(self.clone(), max_decoding_message_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Revision};
    use crate::model::MeshSettings;

    #[tokio::test]
    async fn an_idle_stream_task_is_small() {
        let rev = Revision::new(Arc::new(Config::default()), 1);
        let snap = Arc::new(Snapshot::from_revision(
            &rev,
            Arc::new(MeshSettings::default()),
        ));
        let (_tx, rx) = watch::channel(snap.clone());
        let ads = AdsServer::new(AdsInputs {
            snapshots: rx,
            fixed: None,
            push_throttle: 1,
            metrics: XdsMetrics::new(&mut Registry::default()),
            sync: SyncTable::default(),
            cancel: CancellationToken::new(),
        });
        let (out, _rx) = mpsc::channel(1);
        let conn = Conn {
            inner: ads.inner.clone(),
            out,
            delta: false,
            identity: None,
            conn_id: String::new(),
            proxy: None,
            snap: ads.inner.cache.for_snapshot(&snap),
            types: Types::default(),
        };
        let task = conn.run(Box::pin(futures::stream::empty()));
        // Every connected proxy holds one such task: request handling and pushes are boxed
        // while they run, so the idle task stays small (debug build: 2.1 KB; 4.7 KB unboxed).
        let size = size_of_val(&task);
        assert!(size < 3072, "stream task future is {size} bytes");
        assert!(size_of::<Wire>() <= 16, "channel items stay small");
    }
}
