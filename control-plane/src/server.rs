//! Composition root of `istiod-lite serve` (and of `replay`, through [`serve_sources`]): binds every listener first (so port 0 works and the
//! bound addresses can be reported), then serves ADS on the plaintext gRPC port (15010), CA + ADS
//! on the TLS gRPC port (15012) and the monitoring endpoints. As in Istio, the CA is never offered
//! in plaintext: a bearer token sent there would cross the network in clear.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use proto::istio::ca::istio_certificate_service_server::IstioCertificateServiceServer;
use proto::listen::idle::{Counted, Watched};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use crate::ca::{
    self, Authenticator, Ca, CaMetrics, CaService, DEFAULT_SERVING_SANS, Reloader, SharedCa,
    TokenIssuer,
};
use crate::config::{ConfigStatus, Watcher, WatcherInputs};
use crate::listen::{self, Acceptor};
use crate::model::{MeshSettings, Snapshot};
use crate::xds::{AdsInputs, AdsServer, FixedResources, SyncTable, XdsMetrics};

pub mod tls;

/// Largest ADS request accepted: 4 MiB, istiod's default (`ISTIO_GPRC_MAXRECVMSGSIZE`), as the
/// agent's xDS proxy takes from Envoy. A Delta request naming 10,000 resources with their
/// versions is well under 1 MiB; 64 MiB let one peer make istiod-lite buffer that much per stream.
pub(crate) const MAX_REQUEST_SIZE: usize = 4 << 20;

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot bind {name} listener on {addr}: {source} (is the port in use?)")]
    Bind {
        name: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Ca(#[from] ca::Error),
    #[error(transparent)]
    Watch(#[from] crate::config::WatchError),
    #[error("{var}={value:?}: {expected}")]
    Env {
        var: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("mesh config {path}: {reason}")]
    Mesh { path: PathBuf, reason: String },
    #[error("TLS setup for the secure gRPC port: {0}")]
    Tls(#[from] tls::Error),
}

/// What every flavour of the server shares (`serve`, `replay`): the CA directory, the
/// listeners, the serving certificate's names and the token clock skew.
#[derive(Clone, Debug)]
pub struct ServerSettings {
    pub ca_dir: PathBuf,
    pub trust_domain: String,
    pub grpc_addr: SocketAddr,
    pub secure_grpc_addr: SocketAddr,
    pub monitoring_addr: SocketAddr,
    /// Extra DNS names for the serving certificate.
    pub sans: Vec<String>,
    /// Clock skew allowed when verifying a token's `exp` and `nbf`
    /// ([`ca::DEFAULT_TOKEN_CLOCK_SKEW`] unless configured).
    pub token_clock_skew: Duration,
    /// Connection caps of the two gRPC ports together ([`listen::GRPC_CAPS`] unless
    /// configured; the total is lowered to fit the open-file limit).
    pub conn_caps: proto::listen::Caps,
}

/// Everything `serve` needs.
#[derive(Clone, Debug)]
pub struct ServeInputs {
    pub config_dir: PathBuf,
    pub mesh_file: Option<PathBuf>,
    pub server: ServerSettings,
    /// Environment (PILOT_DEBOUNCE_AFTER, PILOT_DEBOUNCE_MAX, PILOT_PUSH_THROTTLE,
    /// PILOT_ENABLE_IP_AUTOALLOCATE).
    pub env: HashMap<String, String>,
}

/// Tunables read from the environment.
#[derive(Clone, Debug, PartialEq)]
pub struct Tunables {
    pub debounce_after: Duration,
    pub debounce_max: Duration,
    pub push_throttle: usize,
    pub ip_autoallocate: bool,
}

impl Tunables {
    pub fn from_env(env: &HashMap<String, String>) -> Result<Tunables, Error> {
        let dur = |var: &'static str, default: Duration| -> Result<Duration, Error> {
            match env.get(var) {
                None => Ok(default),
                Some(v) => go_syntax::parse_duration(v).map_err(|_| Error::Env {
                    var,
                    value: v.clone(),
                    expected: "a duration such as 100ms or 10s",
                }),
            }
        };
        let push_throttle = match env.get("PILOT_PUSH_THROTTLE") {
            None => 100,
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| Error::Env {
                    var: "PILOT_PUSH_THROTTLE",
                    value: v.clone(),
                    expected: "a positive integer",
                })?,
        };
        let ip_autoallocate = match env.get("PILOT_ENABLE_IP_AUTOALLOCATE").map(|s| s.as_str()) {
            None => true,
            Some("true" | "1") => true,
            Some("false" | "0") => false,
            Some(v) => {
                return Err(Error::Env {
                    var: "PILOT_ENABLE_IP_AUTOALLOCATE",
                    value: v.to_string(),
                    expected: "true or false",
                });
            }
        };
        Ok(Tunables {
            debounce_after: dur("PILOT_DEBOUNCE_AFTER", Duration::from_millis(100))?,
            debounce_max: dur("PILOT_DEBOUNCE_MAX", Duration::from_secs(10))?,
            push_throttle,
            ip_autoallocate,
        })
    }
}

/// Reads the few MeshConfig fields istiod-lite uses.
fn load_mesh(
    path: Option<&PathBuf>,
    trust_domain: &str,
    ip_autoallocate: bool,
) -> Result<MeshSettings, Error> {
    let mut mesh = MeshSettings {
        trust_domain: trust_domain.to_string(),
        ip_autoallocate,
        ..Default::default()
    };
    let Some(path) = path else { return Ok(mesh) };
    let bad = |reason: String| Error::Mesh {
        path: path.clone(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let v: serde_yaml::Value = serde_yaml::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if let Some(ns) = v.get("rootNamespace").and_then(|x| x.as_str()) {
        mesh.root_namespace = ns.to_string();
    }
    if let Some(td) = v.get("trustDomain").and_then(|x| x.as_str()) {
        mesh.trust_domain = td.to_string();
    }
    if let Some(mode) = v
        .get("outboundTrafficPolicy")
        .and_then(|o| o.get("mode"))
        .and_then(|m| m.as_str())
    {
        mesh.allow_any = match mode {
            "ALLOW_ANY" => true,
            "REGISTRY_ONLY" => false,
            other => {
                return Err(bad(format!(
                    "outboundTrafficPolicy.mode {other:?}: expected ALLOW_ANY or REGISTRY_ONLY"
                )));
            }
        };
    }
    Ok(mesh)
}

/// A running server.
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub secure_grpc_addr: SocketAddr,
    pub monitoring_addr: SocketAddr,
    tasks: JoinSet<()>,
}

impl Running {
    /// Waits until every server task has stopped (after the cancellation token fired).
    pub async fn wait(mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}

fn bind(name: &'static str, addr: SocketAddr) -> Result<TcpListener, Error> {
    listen::bind(addr).map_err(|source| Error::Bind { name, addr, source })
}

/// Starts everything; returns once every listener is bound and serving.
pub async fn serve(inputs: ServeInputs, cancel: CancellationToken) -> Result<Running, Error> {
    let tunables = Tunables::from_env(&inputs.env)?;
    let mesh = load_mesh(
        inputs.mesh_file.as_ref(),
        &inputs.server.trust_domain,
        tunables.ip_autoallocate,
    )?;
    tracing::info!(config_dir = %inputs.config_dir.display(), ca_dir = %inputs.server.ca_dir.display(),
        trust_domain = %mesh.trust_domain, root_namespace = %mesh.root_namespace, allow_any = mesh.allow_any,
        debounce_after = ?tunables.debounce_after, debounce_max = ?tunables.debounce_max,
        push_throttle = tunables.push_throttle, token_clock_skew = ?inputs.server.token_clock_skew, "starting istiod-lite");
    let watcher = Watcher::start(
        WatcherInputs {
            dir: inputs.config_dir.clone(),
            debounce_after: tunables.debounce_after,
            debounce_max: tunables.debounce_max,
        },
        cancel.clone(),
    )?;
    // Config revisions become model snapshots; the ADS server generates (and caches) from those.
    let snapshots = crate::model::follow(watcher.revisions.clone(), Arc::new(mesh), cancel.clone());
    let core = CoreInputs {
        server: inputs.server,
        push_throttle: tunables.push_throttle,
    };
    let sources = Sources {
        snapshots,
        config_status: watcher.status,
        fixed: None,
    };
    serve_sources(core, sources, cancel).await
}

/// What every flavour of the server needs besides its sources (`serve`, `replay`).
#[derive(Clone, Debug)]
pub struct CoreInputs {
    pub server: ServerSettings,
    /// `PILOT_PUSH_THROTTLE`.
    pub push_throttle: usize,
}

/// Where pushes and `/debug/configz` come from: model snapshots that follow the config watcher
/// (`serve`), or one empty snapshot plus fixed resources answered instead of generating
/// (`replay`).
pub struct Sources {
    pub snapshots: tokio::sync::watch::Receiver<Arc<Snapshot>>,
    pub config_status: tokio::sync::watch::Receiver<Arc<ConfigStatus>>,
    /// When present, the ADS server serves these instead of generating from the snapshot.
    pub fixed: Option<Arc<dyn FixedResources>>,
}

/// Serves CA, ADS (from `sources`) and monitoring; returns once every listener is bound.
pub async fn serve_sources(
    core: CoreInputs,
    sources: Sources,
    cancel: CancellationToken,
) -> Result<Running, Error> {
    let (inputs, push_throttle) = (core.server, core.push_throttle);
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let ca = SharedCa::new(Ca::load_or_create(&inputs.ca_dir)?);
    let tokens = Arc::new(
        TokenIssuer::load_or_create(&inputs.ca_dir)?.with_clock_skew(inputs.token_clock_skew),
    );
    let mut names: Vec<String> = DEFAULT_SERVING_SANS.iter().map(|s| s.to_string()).collect();
    for s in &inputs.sans {
        if !names.contains(s) {
            names.push(s.clone());
        }
    }
    let serving = tls::ServingTls::new(&ca.current(), names)?;

    let conn_caps = match listen::raise_open_file_limit() {
        Ok((soft, _)) => {
            if soft < 4096 {
                tracing::warn!(
                    limit = soft,
                    "the open-file limit (RLIMIT_NOFILE, hard) caps the proxies that can connect; raise it"
                );
            } else {
                tracing::info!(limit = soft, "open-file limit");
            }
            listen::within_open_files(inputs.conn_caps, soft)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-file limit");
            inputs.conn_caps
        }
    };
    tracing::info!(
        total = conn_caps.total,
        per_ip = conn_caps.per_peer,
        "gRPC connection caps"
    );
    // One count for both gRPC ports: a proxy connects to one or the other.
    let conn_caps = proto::listen::ConnCaps::new(conn_caps);
    let grpc = bind("grpc", inputs.grpc_addr)?;
    let secure = bind("secure-grpc", inputs.secure_grpc_addr)?;
    let monitoring = bind("monitoring", inputs.monitoring_addr)?;
    match listen::effective_backlog() {
        Some(b) if b < 2048 => tracing::warn!(
            backlog = b,
            "net.core.somaxconn caps the listen backlog below 2048: a fleet reconnecting at once may see resets; raise it"
        ),
        Some(b) => tracing::info!(backlog = b, "listen backlog"),
        None => {}
    }
    let local = |l: &TcpListener, name: &'static str, addr: SocketAddr| {
        l.local_addr()
            .map_err(|source| Error::Bind { name, addr, source })
    };
    let grpc_addr = local(&grpc, "grpc", inputs.grpc_addr)?;
    let secure_grpc_addr = local(&secure, "secure-grpc", inputs.secure_grpc_addr)?;
    let monitoring_addr = local(&monitoring, "monitoring", inputs.monitoring_addr)?;

    let mut registry = Registry::default();
    let ca_metrics = CaMetrics::new(&mut registry);
    let xds_metrics = XdsMetrics::new(&mut registry);
    let sync = SyncTable::default();
    let ads = AdsServer::new(AdsInputs {
        snapshots: sources.snapshots.clone(),
        fixed: sources.fixed,
        push_throttle,
        metrics: xds_metrics,
        sync: sync.clone(),
        cancel: cancel.clone(),
    });
    // One authenticator for the CA and ADS on the secure port: istiod accepts the same
    // credentials (a mesh certificate or the `istio-ca` token) for both.
    let authn = Authenticator::new(tokens, &inputs.trust_domain, "istio-ca");
    let ca_svc = CaService::new(ca.clone(), authn.clone(), ca_metrics);

    let tls_config = serving.server_config();

    let (ready_tx, ready_rx) = tokio::sync::watch::channel(false);
    let mut tasks = JoinSet::new();
    {
        // Plaintext: xDS only (no CA: `IstioCertificateService` answers UNIMPLEMENTED here).
        let router = Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .add_service(Counted::new(ads.service(MAX_REQUEST_SIZE)));
        let c = cancel.clone();
        let incoming = futures::StreamExt::map(
            Acceptor::new(grpc, "grpc", conn_caps.clone()).into_stream(),
            |conn| conn.map(|c| Watched::new(c, listen::GRPC_STREAM_LIMITS)),
        );
        tasks.spawn(async move {
            if let Err(e) = router
                .serve_with_incoming_shutdown(incoming, c.cancelled())
                .await
            {
                tracing::error!(error = %e, "grpc server failed");
            }
        });
    }
    {
        let router = Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .add_service(Counted::new(IstioCertificateServiceServer::new(ca_svc)))
            .add_service(Counted::new(
                ads.service(MAX_REQUEST_SIZE).authenticated(authn),
            ));
        let c = cancel.clone();
        tasks.spawn(async move {
            if let Err(e) = router
                .serve_with_incoming_shutdown(
                    tls::incoming(
                        Acceptor::new(secure, "secure-grpc", conn_caps),
                        tls_config,
                        c.clone(),
                    ),
                    c.cancelled(),
                )
                .await
            {
                tracing::error!(error = %e, "secure grpc server failed");
            }
        });
    }
    // New cacerts: the secure port's certificate and client roots follow the new CA.
    let reloader = Reloader::new(ca).on_replace(move |ca| match serving.update(ca) {
        Ok(()) => tracing::info!("secure gRPC port: serving certificate re-issued by the new CA"),
        Err(e) => tracing::error!(error = %e, "secure gRPC port keeps its previous certificate"),
    });
    tasks.spawn(reloader.run(cancel.clone()));
    tasks.spawn(crate::monitoring::serve(
        monitoring,
        crate::monitoring::MonitoringInputs {
            registry: Arc::new(registry),
            sync,
            config_status: sources.config_status,
            snapshots: sources.snapshots,
            ready: ready_rx,
            timeouts: listen::MONITORING_TIMEOUTS,
        },
        cancel.clone(),
    ));
    // The listeners are bound and their accept loops spawned: connections queue until served.
    let _ = ready_tx.send(true);
    tasks.spawn(async move {
        // Keep the readiness sender alive for the server's lifetime.
        cancel.cancelled().await;
        drop(ready_tx);
    });
    Ok(Running {
        grpc_addr,
        secure_grpc_addr,
        monitoring_addr,
        tasks,
    })
}
