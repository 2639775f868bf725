//! `envoy.service.secret.v3.SecretDiscoveryService` on a Unix socket: SotW `StreamSecrets`
//! and incremental `DeltaSecrets`.
//!
//! Both protocols run one stream loop ([`stream`]). Each stream keeps, per watched name, a task that waits for the secret (retrying the fetch
//! with backoff: a CA outage leaves the request pending, the stream stays open) and then
//! forwards every new value. Responses are sent only for names the stream watches; ACKs get
//! no response, NACKs are logged, a changed name set answers the added names only.

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
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use proto::envoy::service::secret::v3::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info};

#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod fuzz;
mod stream;

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
        let listener = proto::uds::bind(socket_path).map_err(|e| err(format!("bind: {e}")))?;
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
    /// A connection must open a stream within 10 s and goes after 60 s with none open
    /// ([`proto::listen::idle::UNIX_SOCKET_LIMITS`]).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let svc = Sds {
            manager: self.manager,
            shutdown: shutdown.clone(),
            counter: Arc::new(AtomicU64::new(0)),
        };
        use proto::listen::idle;
        // Capped, and never spinning on EMFILE (tonic retries a failed accept at once); a
        // connection without a stream in time is closed.
        let limits = idle::UNIX_SOCKET_LIMITS;
        let incoming = futures::StreamExt::map(
            proto::listen::incoming(
                self.listener,
                proto::listen::ConnCaps::new(proto::listen::UNIX_SOCKET_CAPS),
                "sds",
            ),
            move |conn| conn.map(|c| idle::Watched::new(c, limits)),
        );
        let res = tonic::transport::Server::builder()
            .max_concurrent_streams(100_000)
            .add_service(idle::Counted::new(SecretDiscoveryServiceServer::new(svc)))
            .serve_with_incoming_shutdown(incoming, shutdown.cancelled())
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

impl Sds {
    fn version(&self) -> String {
        format!(
            "{}/{}",
            rfc3339(SystemTime::now()),
            self.counter.fetch_add(1, Ordering::Relaxed) + 1
        )
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
        let sotw = stream::Sotw::default();
        tokio::spawn(stream::serve(self.clone(), sotw, request.into_inner(), tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_secrets(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaSecretsStream>, Status> {
        let (tx, rx) = mpsc::channel(16);
        let delta = stream::Delta::default();
        tokio::spawn(stream::serve(self.clone(), delta, request.into_inner(), tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn fetch_secrets(
        &self,
        request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        let req = request.into_inner();
        let distinct: std::collections::HashSet<&str> =
            req.resource_names.iter().map(String::as_str).collect();
        if distinct.len() > stream::MAX_WATCHED_NAMES {
            return Err(Status::resource_exhausted(format!(
                "SDS fetch names {} resources; at most {} per request (MAX_WATCHED_NAMES)",
                distinct.len(),
                stream::MAX_WATCHED_NAMES
            )));
        }
        let crl = self.manager.config().crl_path.clone();
        let mut resources = Vec::new();
        for n in &req.resource_names {
            let item = self
                .manager
                .fetch(n)
                .await
                .map_err(|e| Status::unavailable(format!("secret {n}: {e}")))?;
            resources.push(proto::pack(&stream::named_secret(n, &item, crl.as_deref())));
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
mod tests;
