//! Composition root of `istiod-lite serve` (and of `replay`, through [`serve_sources`]): binds every listener first (so port 0 works and the
//! bound addresses can be reported), then serves ADS on the plaintext gRPC port (15010), CA + ADS
//! on the TLS gRPC port (15012) and the monitoring endpoints. As in Istio, the CA is never offered
//! in plaintext: a bearer token sent there would cross the network in clear.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use proto::istio::ca::istio_certificate_service_server::IstioCertificateServiceServer;
use proto::lifecycle::{Components, Readiness, Shutdown};
use proto::listen::idle::{Counted, Watched};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use crate::ca::{
    self, Authenticator, Ca, CaMetrics, CaService, DEFAULT_SERVING_SANS, Reloader, SharedCa,
    TokenIssuer,
};
use crate::config::{ConfigStatus, Watcher, WatcherInputs};
use crate::listen::{self, Acceptor};
use crate::model::{Follower, Snapshot};
use crate::settings::{ServerSettings, Settings, Source};
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
    #[error("`serve` needs a config directory; a config dump is served by `replay`")]
    NotConfigDir,
    #[error("TLS setup for the secure gRPC port: {0}")]
    Tls(#[from] tls::Error),
}

/// How long each component gets to stop once shutdown began; one still running after it is
/// abandoned. istiod-lite has no drain: its components stop with the shutdown token.
const STOP_DEADLINE: Duration = Duration::from_secs(5);

/// The components that stopped on their own (an error, an end before shutdown, a panic), each
/// as `name: reason`.
#[derive(Debug, thiserror::Error)]
#[error("{}; istiod-lite stops", .0.join("; "))]
pub struct Failure(pub Vec<String>);

/// A running server: its bound addresses and its components, supervised by the lifecycle types
/// the agent uses (`proto::lifecycle`).
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub secure_grpc_addr: SocketAddr,
    pub monitoring_addr: SocketAddr,
    shutdown: Shutdown,
    readiness: Readiness,
    components: Components,
}

impl Running {
    /// Readiness as `/ready` reports it.
    pub fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }

    /// Waits for the shutdown (the cancellation token fired, or a component stopped on its own
    /// and started it), then stops every component within [`STOP_DEADLINE`]. `Err` names the
    /// components that failed: the binary exits non-zero.
    pub async fn wait(self) -> Result<(), Failure> {
        self.shutdown.token().cancelled().await;
        let failures = self.components.stop().await;
        if failures.is_empty() {
            Ok(())
        } else {
            Err(Failure(failures))
        }
    }

    /// Runs `component` under the supervisor until the shutdown token it is given fires.
    fn spawn<F, Fut, E>(&mut self, name: &'static str, component: F)
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display,
    {
        let run = component(self.shutdown.token().clone());
        self.components.spawn(name, STOP_DEADLINE, run);
    }
}

fn bind(name: &'static str, addr: SocketAddr) -> Result<TcpListener, Error> {
    listen::bind(addr).map_err(|source| Error::Bind { name, addr, source })
}

/// The three listeners, bound, and the connection caps the two gRPC ports share.
struct Listeners {
    grpc: TcpListener,
    secure: TcpListener,
    monitoring: TcpListener,
    conn_caps: proto::listen::ConnCaps,
}

impl Listeners {
    fn bind(settings: &ServerSettings) -> Result<Listeners, Error> {
        let conn_caps = grpc_conn_caps(settings.conn_caps);
        let listeners = Listeners {
            grpc: bind("grpc", settings.grpc_addr)?,
            secure: bind("secure-grpc", settings.secure_grpc_addr)?,
            monitoring: bind("monitoring", settings.monitoring_addr)?,
            // One count for both gRPC ports: a proxy connects to one or the other.
            conn_caps: proto::listen::ConnCaps::new(conn_caps),
        };
        match listen::effective_backlog() {
            Some(b) if b < 2048 => tracing::warn!(
                backlog = b,
                "net.core.somaxconn caps the listen backlog below 2048: a fleet reconnecting at once may see resets; raise it"
            ),
            Some(b) => tracing::info!(backlog = b, "listen backlog"),
            None => {}
        }
        Ok(listeners)
    }

    /// The bound addresses (the real ports when port 0 was asked for).
    fn addrs(
        &self,
        settings: &ServerSettings,
    ) -> Result<(SocketAddr, SocketAddr, SocketAddr), Error> {
        let local = |l: &TcpListener, name: &'static str, addr: SocketAddr| {
            l.local_addr()
                .map_err(|source| Error::Bind { name, addr, source })
        };
        Ok((
            local(&self.grpc, "grpc", settings.grpc_addr)?,
            local(&self.secure, "secure-grpc", settings.secure_grpc_addr)?,
            local(&self.monitoring, "monitoring", settings.monitoring_addr)?,
        ))
    }
}

/// The CA, the token issuer and the secure port's serving certificate, from the CA directory.
struct CaMaterial {
    ca: SharedCa,
    tokens: Arc<TokenIssuer>,
    serving: Arc<tls::ServingTls>,
}

impl CaMaterial {
    fn load(settings: &ServerSettings) -> Result<CaMaterial, Error> {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let ca = SharedCa::new(Ca::load_or_create(&settings.ca_dir)?);
        let tokens = Arc::new(
            TokenIssuer::load_or_create(&settings.ca_dir)?
                .with_clock_skew(settings.token_clock_skew),
        );
        let mut names: Vec<String> = DEFAULT_SERVING_SANS.iter().map(|s| s.to_string()).collect();
        for s in &settings.sans {
            if !names.contains(s) {
                names.push(s.clone());
            }
        }
        let serving = tls::ServingTls::new(&ca.current(), names)?;
        Ok(CaMaterial {
            ca,
            tokens,
            serving,
        })
    }
}

/// The configured caps of the gRPC ports, lowered to fit the open-file limit (raised first).
fn grpc_conn_caps(configured: proto::listen::Caps) -> proto::listen::Caps {
    let caps = match listen::raise_open_file_limit() {
        Ok((soft, _)) => {
            if soft < 4096 {
                tracing::warn!(
                    limit = soft,
                    "the open-file limit (RLIMIT_NOFILE, hard) caps the proxies that can connect; raise it"
                );
            } else {
                tracing::info!(limit = soft, "open-file limit");
            }
            listen::within_open_files(configured, soft)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-file limit");
            configured
        }
    };
    tracing::info!(
        total = caps.total,
        per_ip = caps.per_peer,
        "gRPC connection caps"
    );
    caps
}

/// `istiod-lite serve`: starts everything from `settings`; returns once every listener is
/// bound and serving.
pub async fn serve(settings: Settings, cancel: CancellationToken) -> Result<Running, Error> {
    let Source::ConfigDir {
        config_dir, mesh, ..
    } = &settings.source
    else {
        return Err(Error::NotConfigDir);
    };
    let (watcher, watch_loop) = Watcher::bind(WatcherInputs {
        dir: config_dir.clone(),
        debounce_after: settings.tunables.debounce_after,
        debounce_max: settings.tunables.debounce_max,
    })?;
    // Config revisions become model snapshots; the ADS server generates (and caches) from those.
    let (snapshots, follower) = Follower::new(watcher.revisions.clone(), Arc::new(mesh.clone()));
    let sources = Sources {
        snapshots,
        config_status: watcher.status,
        fixed: None,
    };
    let mut running = serve_sources(&settings, sources, cancel).await?;
    running.spawn("config-watch", |c| async move {
        watch_loop.run(c).await;
        Ok::<(), Infallible>(())
    });
    running.spawn("snapshots", |c| async move {
        follower.run(c).await;
        Ok::<(), Infallible>(())
    });
    Ok(running)
}

/// Where pushes and `/debug/configz` come from: model snapshots that follow the config watcher
/// (`serve`), or one empty snapshot plus fixed resources answered instead of generating
/// (`replay`).
pub struct Sources {
    pub snapshots: watch::Receiver<Arc<Snapshot>>,
    pub config_status: watch::Receiver<Arc<ConfigStatus>>,
    /// When present, the ADS server serves these instead of generating from the snapshot.
    pub fixed: Option<Arc<dyn FixedResources>>,
}

/// Serves CA, ADS (from `sources`) and monitoring under `settings`; returns once every
/// listener is bound and its server running.
pub async fn serve_sources(
    settings: &Settings,
    sources: Sources,
    cancel: CancellationToken,
) -> Result<Running, Error> {
    let inputs = &settings.server;
    let push_throttle = settings.tunables.push_throttle;
    let CaMaterial {
        ca,
        tokens,
        serving,
    } = CaMaterial::load(inputs)?;

    let listeners = Listeners::bind(inputs)?;
    let (grpc_addr, secure_grpc_addr, monitoring_addr) = listeners.addrs(inputs)?;
    let Listeners {
        grpc,
        secure,
        monitoring,
        conn_caps,
    } = listeners;

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
    let shutdown = Shutdown::new(cancel);
    let readiness = Readiness::default();
    let starting = readiness.register("listeners", "listeners starting");
    let mut running = Running {
        grpc_addr,
        secure_grpc_addr,
        monitoring_addr,
        components: Components::new(shutdown.clone(), readiness.clone()),
        shutdown,
        readiness,
    };
    spawn_plaintext(&mut running, &ads, grpc, conn_caps.clone());
    // One authenticator for the CA and ADS on the secure port: istiod accepts the same
    // credentials (a mesh certificate or the `istio-ca` token) for both.
    let authn = Authenticator::new(tokens, &inputs.trust_domain, "istio-ca");
    let secure_grpc = SecureGrpc {
        listener: secure,
        conn_caps,
        ca: CaService::new(ca.clone(), authn.clone(), ca_metrics),
        authn,
        tls_config: serving.server_config(),
    };
    spawn_secure(&mut running, &ads, secure_grpc);
    // New cacerts: the secure port's certificate and client roots follow the new CA.
    let reloader = Reloader::new(ca).on_replace(move |ca| match serving.update(ca) {
        Ok(()) => tracing::info!("secure gRPC port: serving certificate re-issued by the new CA"),
        Err(e) => tracing::error!(error = %e, "secure gRPC port keeps its previous certificate"),
    });
    running.spawn("ca-reloader", |c| async move {
        reloader.run(c).await;
        Ok::<(), Infallible>(())
    });
    let monitoring_inputs = crate::monitoring::MonitoringInputs {
        registry: Arc::new(registry),
        sync,
        config_status: sources.config_status,
        snapshots: sources.snapshots,
        readiness: running.readiness(),
        config_dump: settings.dump(),
        timeouts: listen::MONITORING_TIMEOUTS,
    };
    running.spawn("monitoring", |c| async move {
        crate::monitoring::serve(monitoring, monitoring_inputs, c).await;
        Ok::<(), Infallible>(())
    });
    // The listeners are bound and their servers running: connections queue until served.
    starting.ready();
    Ok(running)
}

/// The HTTP/2 settings of both gRPC ports.
///
/// Receive windows bound what a peer may send before istiod-lite reads it (a stream's task
/// stops reading while it waits to push): 64 KiB per stream and per connection at first,
/// grown by bandwidth-delay estimation (adaptive window) only while requests flow faster, as
/// Go's gRPC server does by default. hyper's default is a fixed 1 MiB of each. Requests are
/// small (a Delta request with 10,000 initial versions is under 1 MiB); responses are not
/// limited by these windows but by the proxy's (Envoy's are 256 MiB), so a CDS of several MB
/// still goes out at once.
fn grpc_server() -> Server {
    Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_adaptive_window(Some(true))
}

/// The plaintext gRPC port: xDS only (no CA: `IstioCertificateService` answers UNIMPLEMENTED
/// here).
fn spawn_plaintext(
    running: &mut Running,
    ads: &AdsServer,
    grpc: TcpListener,
    conn_caps: proto::listen::ConnCaps,
) {
    let plain = grpc_server().add_service(Counted::new(ads.service(MAX_REQUEST_SIZE)));
    let incoming = futures::StreamExt::map(
        Acceptor::new(grpc, "grpc", conn_caps).into_stream(),
        |conn| conn.map(|c| Watched::new(c, listen::GRPC_STREAM_LIMITS)),
    );
    running.spawn("grpc", |c| async move {
        plain
            .serve_with_incoming_shutdown(incoming, c.cancelled_owned())
            .await
    });
}

/// What the secure gRPC port serves with.
struct SecureGrpc {
    listener: TcpListener,
    conn_caps: proto::listen::ConnCaps,
    ca: CaService,
    authn: Authenticator,
    tls_config: Arc<rustls::ServerConfig>,
}

/// The secure gRPC port: the CA and authenticated ADS over TLS.
fn spawn_secure(running: &mut Running, ads: &AdsServer, s: SecureGrpc) {
    let SecureGrpc {
        listener,
        conn_caps,
        ca,
        authn,
        tls_config,
    } = s;
    let secure_router = grpc_server()
        .add_service(Counted::new(IstioCertificateServiceServer::new(ca)))
        .add_service(Counted::new(
            ads.service(MAX_REQUEST_SIZE).authenticated(authn),
        ));
    running.spawn("secure-grpc", |c| async move {
        let incoming = tls::incoming(
            Acceptor::new(listener, "secure-grpc", conn_caps),
            tls_config,
            c.clone(),
        );
        secure_router
            .serve_with_incoming_shutdown(incoming, c.cancelled_owned())
            .await
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(cancel: &CancellationToken) -> (Running, proto::lifecycle::ReadyGuard) {
        let shutdown = Shutdown::new(cancel.clone());
        let readiness = Readiness::default();
        let starting = readiness.register("listeners", "listeners starting");
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let running = Running {
            grpc_addr: addr,
            secure_grpc_addr: addr,
            monitoring_addr: addr,
            components: Components::new(shutdown.clone(), readiness.clone()),
            shutdown,
            readiness,
        };
        (running, starting)
    }

    /// A listener's server that dies: not ready, the others stopped, the reason returned.
    #[tokio::test]
    async fn a_dead_component_makes_the_server_not_ready_and_stops_the_rest() {
        let cancel = CancellationToken::new();
        let (mut r, starting) = running(&cancel);
        let readiness = r.readiness();
        assert_eq!(readiness.not_ready(), ["listeners starting"]);
        let (die_tx, die_rx) = tokio::sync::oneshot::channel::<()>();
        let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
        r.spawn("monitoring", |cancel| async move {
            cancel.cancelled().await;
            let _ = stopped_tx.send(());
            Ok::<(), Infallible>(())
        });
        r.spawn("grpc", |_| async move {
            let _ = die_rx.await;
            Err("listener closed")
        });
        starting.ready();
        assert!(readiness.not_ready().is_empty());
        let waited = tokio::spawn(r.wait());
        die_tx.send(()).expect("send");
        let failure = waited.await.expect("join").expect_err("must fail");
        assert_eq!(failure.0, ["grpc: listener closed"]);
        assert_eq!(readiness.not_ready(), ["grpc failed: listener closed"]);
        assert!(cancel.is_cancelled(), "the shutdown was not started");
        stopped_rx.await.expect("the other components were stopped");
        assert!(failure.to_string().contains("grpc"), "{failure}");
    }

    #[tokio::test]
    async fn a_component_ending_before_shutdown_is_a_failure_and_one_after_is_not() {
        let cancel = CancellationToken::new();
        let (mut r, _) = running(&cancel);
        r.spawn("secure-grpc", |_| async { Ok::<(), Infallible>(()) });
        let failure = r.wait().await.expect_err("must fail");
        assert_eq!(failure.0, ["secure-grpc: stopped on its own"]);

        let cancel = CancellationToken::new();
        let (mut r, _) = running(&cancel);
        for name in ["grpc", "monitoring"] {
            r.spawn(name, |cancel| async move {
                cancel.cancelled().await;
                Ok::<(), Infallible>(())
            });
        }
        cancel.cancel();
        assert!(r.wait().await.is_ok());
    }

    #[tokio::test]
    async fn a_panicking_component_is_named() {
        let cancel = CancellationToken::new();
        let (mut r, _) = running(&cancel);
        r.spawn("ca-reloader", |_| async { reload() });
        let failure = r.wait().await.expect_err("must fail");
        assert_eq!(failure.0, ["ca-reloader: panicked: boom"]);
    }

    fn reload() -> Result<(), Infallible> {
        panic!("boom")
    }
}
