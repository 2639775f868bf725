//! `envoy.service.secret.v3.SecretDiscoveryService` on a Unix socket: SotW `StreamSecrets`
//! and incremental `DeltaSecrets`.
//!
//! Each stream keeps, per watched name, a task that waits for the secret (retrying the fetch
//! with backoff: a CA outage leaves the request pending, the stream stays open) and then
//! forwards every new value. Responses are sent only for names the stream watches; ACKs get
//! no response, NACKs are logged, a changed name set answers the added names only.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use futures::Stream;
use proto::envoy::config::core::v3::{DataSource, data_source::Specifier};
use proto::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, Secret, TlsCertificate, secret,
};
use proto::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use proto::envoy::service::secret::v3::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use crate::Error;
use crate::manager::{SecretItem, SecretManager};
use crate::timestamp::rfc3339;

const FETCH_BACKOFF_START: Duration = Duration::from_millis(500);
const FETCH_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// A bound SDS server; [`SdsServer::run`] serves until the token is cancelled.
pub struct SdsServer {
    listener: UnixListener,
    path: PathBuf,
    manager: SecretManager,
}

impl SdsServer {
    /// Removes a stale socket, creates the directory (0750) when it is missing and binds the
    /// socket (0660). An existing directory is left as it is, as Istio's listener does: in a pod
    /// it is an emptyDir the kubelet made (root-owned, 0777) that the proxy user cannot chmod.
    pub async fn bind(socket_path: &Path, manager: SecretManager) -> Result<SdsServer, Error> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let err = |reason: String| Error::Socket {
            path: socket_path.display().to_string(),
            reason,
        };
        if let Some(dir) = socket_path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(dir)
                .map_err(|e| err(format!("creating the directory: {e}")))?;
        }
        match std::fs::remove_file(socket_path) {
            Ok(()) => debug!(path = %socket_path.display(), "removed stale SDS socket"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(format!("removing the stale socket: {e}"))),
        }
        let listener = UnixListener::bind(socket_path).map_err(|e| err(format!("bind: {e}")))?;
        std::fs::set_permissions(socket_path, std::fs::Permissions::from_mode(0o660))
            .map_err(|e| err(format!("chmod 0660: {e}")))?;
        info!(path = %socket_path.display(), "SDS server listening");
        Ok(SdsServer {
            listener,
            path: socket_path.to_path_buf(),
            manager,
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves until `shutdown` is cancelled; open streams end then, and the socket is removed.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let svc = Sds {
            manager: self.manager,
            shutdown: shutdown.clone(),
            counter: Arc::new(AtomicU64::new(0)),
        };
        let res = tonic::transport::Server::builder()
            .max_concurrent_streams(100_000)
            .add_service(SecretDiscoveryServiceServer::new(svc))
            .serve_with_incoming_shutdown(
                // Capped, and never spinning on EMFILE (tonic retries a failed accept at once).
                proto::listen::incoming(
                    self.listener,
                    proto::listen::ConnCaps::new(proto::listen::UNIX_SOCKET_CAPS),
                    "sds",
                ),
                shutdown.cancelled(),
            )
            .await;
        let _ = std::fs::remove_file(&self.path);
        res.map_err(|e| Error::Server(format!("serving on {}: {e}", self.path.display())))
    }
}

#[derive(Clone)]
struct Sds {
    manager: SecretManager,
    shutdown: CancellationToken,
    counter: Arc<AtomicU64>,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Builds Envoy's `Secret` for an item.
pub fn to_secret(item: &SecretItem, crl: Option<&Path>) -> Secret {
    let inline = |b: &[u8]| {
        Some(DataSource {
            specifier: Some(Specifier::InlineBytes(b.to_vec())),
            ..Default::default()
        })
    };
    let kind = if item.is_root() {
        secret::Type::ValidationContext(CertificateValidationContext {
            trusted_ca: inline(&item.root_cert_pem),
            crl: crl.filter(|p| p.exists()).map(|p| DataSource {
                specifier: Some(Specifier::Filename(p.display().to_string())),
                ..Default::default()
            }),
            ..Default::default()
        })
    } else {
        secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: inline(&item.cert_chain_pem),
            private_key: inline(&item.private_key_pem),
            ..Default::default()
        })
    };
    Secret {
        name: item.resource_name.clone(),
        r#type: Some(kind),
    }
}

fn new_nonce() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Content version of a secret for Delta (stable for equal content within a process).
fn content_version(item: &SecretItem) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    item.cert_chain_pem.hash(&mut h);
    item.private_key_pem.hash(&mut h);
    item.root_cert_pem.hash(&mut h);
    format!("{:016x}", h.finish())
}

/// Per-name task: fetch (retrying while it fails), then forward every new value.
fn watch_name(
    manager: SecretManager,
    name: String,
    tx: mpsc::Sender<(String, Arc<SecretItem>)>,
) -> JoinHandle<()> {
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
struct Watches {
    manager: SecretManager,
    tx: mpsc::Sender<(String, Arc<SecretItem>)>,
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

impl Sds {
    fn version(&self) -> String {
        format!(
            "{}/{}",
            rfc3339(SystemTime::now()),
            self.counter.fetch_add(1, Ordering::Relaxed) + 1
        )
    }

    fn crl(&self) -> Option<PathBuf> {
        self.manager.config().crl_path.clone()
    }

    async fn sotw(
        self,
        mut inbound: Streaming<DiscoveryRequest>,
        out: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    ) {
        let (tx, mut updates) = mpsc::channel(64);
        let mut w = Watches {
            manager: self.manager.clone(),
            tx,
            tasks: HashMap::new(),
            sent: HashMap::new(),
        };
        let mut last_nonce = String::new();
        let crl = self.crl();
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                req = inbound.message() => {
                    let req = match req {
                        Ok(Some(r)) => r,
                        Ok(None) => return,
                        Err(e) => { debug!(error = %e, "SDS stream closed by peer"); return; }
                    };
                    if !req.type_url.is_empty() && req.type_url != proto::type_url::SECRET {
                        warn!(type_url = %req.type_url, "SDS request for an unexpected type; ignored");
                        continue;
                    }
                    if !req.response_nonce.is_empty() {
                        if req.response_nonce != last_nonce {
                            debug!(nonce = %req.response_nonce, "stale nonce; ignored");
                            continue;
                        }
                        if let Some(err) = &req.error_detail {
                            warn!(names = ?req.resource_names, version = %req.version_info, error = %err.message, "Envoy rejected (NACK) a secret");
                            continue;
                        }
                    }
                    let wanted: HashSet<String> = req.resource_names.iter().cloned().collect();
                    let current = w.names();
                    for gone in current.difference(&wanted) {
                        debug!(resource = %gone, "unsubscribed");
                        w.remove(gone);
                    }
                    if req.response_nonce.is_empty() {
                        // A new request (or a reconnect): answer every name, cached or not.
                        for n in &wanted { w.sent.remove(n); }
                    }
                    // Newly added names (after an ACK, or initial): answer them only.
                    let mut ready = Vec::new();
                    for n in &wanted {
                        if req.response_nonce.is_empty() || !current.contains(n) {
                            w.remove(n);
                            w.add(n);
                            if let Some(item) = self.manager.subscribe(n).borrow().clone() {
                                ready.push((n.clone(), item));
                            }
                        }
                    }
                    if !ready.is_empty() && !self.send_sotw(&mut w, ready, &out, &mut last_nonce, crl.as_deref()).await { return; }
                }
                Some((name, item)) = updates.recv() => {
                    let mut batch = vec![(name, item)];
                    while let Ok(more) = updates.try_recv() { batch.push(more); }
                    if !self.send_sotw(&mut w, batch, &out, &mut last_nonce, crl.as_deref()).await { return; }
                }
            }
        }
    }

    async fn send_sotw(
        &self,
        w: &mut Watches,
        batch: Vec<(String, Arc<SecretItem>)>,
        out: &mpsc::Sender<Result<DiscoveryResponse, Status>>,
        last_nonce: &mut String,
        crl: Option<&Path>,
    ) -> bool {
        let mut by_name: HashMap<String, Arc<SecretItem>> = HashMap::new();
        for (n, item) in batch {
            if w.is_news(&n, &item) {
                by_name.insert(n, item);
            }
        }
        if by_name.is_empty() {
            return true;
        }
        let mut resources = Vec::new();
        let mut names: Vec<&String> = by_name.keys().collect();
        names.sort();
        for n in names {
            let item = &by_name[n];
            let mut s = to_secret(item, crl);
            s.name = n.clone();
            resources.push(proto::pack(&s));
        }
        let nonce = new_nonce();
        let version = self.version();
        debug!(names = ?by_name.keys().collect::<Vec<_>>(), %version, "SDS push");
        let resp = DiscoveryResponse {
            version_info: version,
            resources,
            type_url: proto::type_url::SECRET.to_string(),
            nonce: nonce.clone(),
            ..Default::default()
        };
        if out.send(Ok(resp)).await.is_err() {
            return false;
        }
        *last_nonce = nonce;
        for (n, item) in by_name {
            w.sent.insert(n, item);
        }
        true
    }

    async fn delta(
        self,
        mut inbound: Streaming<DeltaDiscoveryRequest>,
        out: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
    ) {
        let (tx, mut updates) = mpsc::channel(64);
        let mut w = Watches {
            manager: self.manager.clone(),
            tx,
            tasks: HashMap::new(),
            sent: HashMap::new(),
        };
        // Versions Envoy already has (initial_resource_versions), consumed on first send.
        let mut known: HashMap<String, String> = HashMap::new();
        let crl = self.crl();
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                req = inbound.message() => {
                    let req = match req {
                        Ok(Some(r)) => r,
                        Ok(None) => return,
                        Err(e) => { debug!(error = %e, "delta SDS stream closed by peer"); return; }
                    };
                    if !req.type_url.is_empty() && req.type_url != proto::type_url::SECRET {
                        warn!(type_url = %req.type_url, "delta SDS request for an unexpected type; ignored");
                        continue;
                    }
                    if let Some(err) = &req.error_detail {
                        warn!(nonce = %req.response_nonce, error = %err.message, "Envoy rejected (NACK) a delta secret");
                    }
                    for (n, v) in &req.initial_resource_versions {
                        known.insert(n.clone(), v.clone());
                        w.add(n);
                    }
                    for n in &req.resource_names_unsubscribe {
                        w.remove(n);
                        known.remove(n);
                    }
                    let mut ready = Vec::new();
                    for n in &req.resource_names_subscribe {
                        if !w.tasks.contains_key(n) {
                            w.add(n);
                            if let Some(item) = self.manager.subscribe(n).borrow().clone() {
                                ready.push((n.clone(), item));
                            }
                        }
                    }
                    if !ready.is_empty() && !self.send_delta(&mut w, ready, &mut known, &out, crl.as_deref()).await { return; }
                }
                Some((name, item)) = updates.recv() => {
                    let mut batch = vec![(name, item)];
                    while let Ok(more) = updates.try_recv() { batch.push(more); }
                    if !self.send_delta(&mut w, batch, &mut known, &out, crl.as_deref()).await { return; }
                }
            }
        }
    }

    async fn send_delta(
        &self,
        w: &mut Watches,
        batch: Vec<(String, Arc<SecretItem>)>,
        known: &mut HashMap<String, String>,
        out: &mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
        crl: Option<&Path>,
    ) -> bool {
        let mut resources = Vec::new();
        let mut sent = Vec::new();
        for (n, item) in batch {
            if !w.is_news(&n, &item) {
                continue;
            }
            let version = content_version(&item);
            if known.remove(&n).is_some_and(|v| v == version) {
                w.sent.insert(n, item);
                continue;
            }
            let mut s = to_secret(&item, crl);
            s.name = n.clone();
            resources.push(Resource {
                name: n.clone(),
                version,
                resource: Some(proto::pack(&s)),
                ..Default::default()
            });
            sent.push((n, item));
        }
        if resources.is_empty() {
            return true;
        }
        let resp = DeltaDiscoveryResponse {
            system_version_info: self.version(),
            resources,
            type_url: proto::type_url::SECRET.to_string(),
            nonce: new_nonce(),
            ..Default::default()
        };
        if out.send(Ok(resp)).await.is_err() {
            return false;
        }
        for (n, item) in sent {
            w.sent.insert(n, item);
        }
        true
    }
}

#[tonic::async_trait]
impl SecretDiscoveryService for Sds {
    type StreamSecretsStream = BoxStream<DiscoveryResponse>;
    type DeltaSecretsStream = BoxStream<DeltaDiscoveryResponse>;

    async fn stream_secrets(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamSecretsStream>, Status> {
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(self.clone().sotw(request.into_inner(), tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_secrets(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaSecretsStream>, Status> {
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(self.clone().delta(request.into_inner(), tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn fetch_secrets(
        &self,
        request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        let req = request.into_inner();
        let crl = self.crl();
        let mut resources = Vec::new();
        for n in &req.resource_names {
            let item = self
                .manager
                .fetch(n)
                .await
                .map_err(|e| Status::unavailable(format!("secret {n}: {e}")))?;
            let mut s = to_secret(&item, crl.as_deref());
            s.name = n.clone();
            resources.push(proto::pack(&s));
        }
        Ok(Response::new(DiscoveryResponse {
            version_info: self.version(),
            resources,
            type_url: proto::type_url::SECRET.to_string(),
            nonce: new_nonce(),
            ..Default::default()
        }))
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
