//! The composition root: the only place that knows every component. [`App::bind`] binds every
//! listener first (DNS, SDS, xDS, status) and reports the bound addresses; [`App::run`] runs
//! them, runs Envoy, and shuts down in order.
//!
//! Shutdown order: the signal (SIGTERM/SIGINT/`/quitquitquit`) fails readiness at once (the
//! status server answers `/healthz/ready` with 503 until the agent exits), drains and stops
//! Envoy; only then are the xDS proxy, SDS server, DNS proxy and status server stopped, so the
//! application keeps DNS and Envoy keeps its config and certs while it drains.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use prometheus_client::registry::Registry;

use crate::bootstrap;
use crate::config::{Config, NodeType};
use crate::envoy::readiness::EnvoyReadiness;
use crate::envoy::{self, admin::Admin};
use crate::identity::{self, Sockets};
use crate::platform::Pending;
use crate::status::{self, StatusServer, probe::Prober};
use crate::xds_proxy::{self, XdsProxy};
use proto::lifecycle::{Components, Readiness, Shutdown};

/// What [`App::bind`] needs.
pub struct Inputs {
    pub config: Config,
    pub shutdown: Shutdown,
    /// Where the status server listens; `None`: all interfaces on `statusPort`.
    pub status_addr: Option<SocketAddr>,
}

/// The workload health checker's parts (`ProxyConfig.readinessProbe`, VMs).
struct HealthCheck {
    probe: status::probe::ReadinessProbe,
    prober: Prober,
    envoy: Option<EnvoyReadiness>,
    tx: tokio::sync::watch::Sender<Option<crate::health::Health>>,
}

/// The addresses the agent is serving on.
#[derive(Debug, Clone)]
pub struct Bound {
    /// The status server (the first of `status_all`); `None` when `statusPort` is 0.
    pub status: Option<SocketAddr>,
    /// Every status listener: one per address family of the pod.
    pub status_all: Vec<SocketAddr>,
    pub xds: PathBuf,
    pub sds: Option<PathBuf>,
    pub dns: Vec<SocketAddr>,
    /// Who serves the workload identity sockets, as found when binding.
    pub sockets: Sockets,
}

/// A bound, not yet running, agent.
pub struct App {
    config: Arc<Config>,
    shutdown: Shutdown,
    readiness: Readiness,
    bound: Bound,
    status: StatusServer,
    xds: (XdsProxy, tokio::net::UnixListener),
    sds: Option<sds::SdsServer>,
    manager: sds::SecretManager,
    dns: Option<dns_proxy::DnsProxy>,
    health: Option<HealthCheck>,
    sockets: SocketFiles,
    /// The cloud platform, searched for while the rest starts.
    platform: Pending,
}

/// The agent's Unix socket files, removed when dropped: after the run, or when binding fails
/// half way (like Go's listeners in Istio, closing a Unix socket removes its file).
#[derive(Default)]
struct SocketFiles(Vec<PathBuf>);

impl Drop for SocketFiles {
    fn drop(&mut self) {
        for path in &self.0 {
            remove_socket(path);
        }
    }
}

/// The status server's listeners: `addr` when given (tests), else `statusPort` on each address
/// family the pod has, IPv4 and IPv6 on their own sockets (kubelet probes `[podIPv6]:15020` in a
/// dual-stack pod); none when `statusPort` is 0 (`status.sidecar.istio.io/port: "0"`).
fn bind_status(
    config: &Config,
    addr: Option<SocketAddr>,
) -> anyhow::Result<Vec<tokio::net::TcpListener>> {
    let bind = |addr: SocketAddr| -> std::io::Result<tokio::net::TcpListener> {
        let domain = socket2::Domain::for_address(addr);
        let socket = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
        if addr.is_ipv6() {
            socket.set_only_v6(true)?;
        }
        socket.set_reuse_address(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&addr.into())?;
        socket.listen(1024)?;
        tokio::net::TcpListener::from_std(socket.into())
    };
    let context = |a: SocketAddr| format!("binding the status server on {a}");
    if let Some(addr) = addr {
        return Ok(vec![bind(addr).with_context(|| context(addr))?]);
    }
    let port = config.proxy.status_port;
    if port == 0 {
        tracing::info!("statusPort is 0: no status server");
        return Ok(Vec::new());
    }
    let v4 = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port);
    let v6 = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port);
    let has_v4 = config.node.ips.iter().any(IpAddr::is_ipv4);
    let has_v6 = config.node.ips.iter().any(IpAddr::is_ipv6);
    Ok(match (has_v4, has_v6) {
        (true, true) => {
            let mut out = vec![bind(v4).with_context(|| context(v4))?];
            match bind(v6) {
                Ok(l) => out.push(l),
                // A host with IPv6 disabled still serves IPv4.
                Err(e) => tracing::warn!(error = %e, addr = %v6, "no IPv6 status listener"),
            }
            out
        }
        (false, true) => vec![bind(v6).with_context(|| context(v6))?],
        _ => vec![bind(v4).with_context(|| context(v4))?],
    })
}

/// The host's private addresses with their interface names: up, not loopback, not link-local.
pub fn host_interfaces() -> Vec<(String, IpAddr)> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for a in addrs {
        if !a.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP)
            || a.flags
                .contains(nix::net::if_::InterfaceFlags::IFF_LOOPBACK)
        {
            continue;
        }
        let Some(addr) = a.address else { continue };
        let ip = if let Some(v4) = addr.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        let link_local = match ip {
            IpAddr::V4(v4) => v4.is_link_local(),
            IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
        };
        if !link_local && !ip.is_unspecified() && !ip.is_loopback() {
            out.push((a.interface_name.clone(), ip));
        }
    }
    out
}

impl App {
    /// Binds every listener; nothing is served yet. In order: the DNS proxy, the workload
    /// identity (secret manager and SDS socket), the xDS proxy, the status server.
    pub async fn bind(inputs: Inputs) -> anyhow::Result<App> {
        let config = Arc::new(inputs.config);
        // First: the metadata servers are asked while everything else starts.
        let platform = Pending::start(config.platform.clone());
        let config_dump = config.dump().to_string();
        tracing::info!(config = %config_dump, "effective configuration");
        let shutdown = inputs.shutdown;
        // Go's process metrics unprefixed at the root, the agent's own under `istio_agent_`.
        let mut root = Registry::default();
        root.register_collector(Box::new(status::process::ProcessCollector));
        let registry = root.sub_registry_with_prefix("istio_agent");
        crate::config::EnvMetrics::new(registry).record(&config.env_fallbacks);
        let readiness = Readiness::default();
        let mut sockets = SocketFiles::default();

        let dns = bind_dns(&config, registry).await?;
        let (manager, sds, identity_sockets) =
            bind_identity(&config, registry, &mut sockets).await?;
        let health_channel = config
            .status
            .health_probe
            .as_ref()
            .map(|_| tokio::sync::watch::channel(None));
        let health_rx = health_channel.as_ref().map(|(_, rx)| rx.clone());
        let table = dns.as_ref().map(dns_proxy::DnsProxy::table);
        let xds = bind_xds(
            &config,
            registry,
            table.clone(),
            &manager,
            &readiness,
            health_rx,
        )?;
        sockets.0.push(xds.path.clone());
        let localhost = localhost_for(&config);
        let status = bind_status_server(
            &config,
            inputs.status_addr,
            StatusParts {
                registry: root,
                readiness: readiness.clone(),
                shutdown: shutdown.clone(),
                table,
                config_dump,
                localhost,
            },
        )?;
        let health = health_check(&config, localhost, health_channel.map(|(tx, _)| tx));

        let bound = Bound {
            status: status.local_addr().ok(),
            status_all: status.local_addrs(),
            xds: xds.path.clone(),
            sds: sds.as_ref().map(|s| s.path().to_path_buf()),
            dns: dns.as_ref().map(|d| d.local_addrs()).unwrap_or_default(),
            sockets: identity_sockets,
        };
        announce(&config, &bound);
        Ok(App {
            config,
            shutdown,
            readiness,
            bound,
            status,
            xds: (xds.proxy, xds.listener),
            sds,
            manager,
            dns,
            health,
            sockets,
            platform,
        })
    }

    #[cfg(test)]
    pub fn bound(&self) -> &Bound {
        &self.bound
    }

    /// Runs until Envoy exits, shutdown completes or a component fails; returns the process
    /// exit code (non-zero when a component failed).
    pub async fn run(self) -> anyhow::Result<i32> {
        let App {
            config,
            shutdown,
            readiness,
            bound,
            status,
            xds,
            sds,
            manager,
            dns,
            health,
            sockets,
            platform,
        } = self;
        let (components, prefetch) = spawn_components(Parts {
            config: &config,
            sockets: bound.sockets,
            shutdown: &shutdown,
            readiness: &readiness,
            status,
            xds,
            sds,
            manager: &manager,
            dns,
            health,
            platform: &platform,
        });
        let result = if config.envoy.launched() && !shutdown.is_shutting_down() {
            // A failed component triggers the shutdown Envoy watches: Envoy drains and exits.
            run_envoy(&config, &bound, &shutdown, &platform, prefetch).await
        } else {
            tokio::select! {
                _ = shutdown.token().cancelled() => {}
                _ = components.failed() => {}
            }
            Ok(0)
        };
        // Envoy is gone (exited, drained or never started): everything else stops too.
        shutdown.trigger();
        manager.shutdown();
        let failures = components.stop().await;
        drop(sockets);
        let result = match result {
            Ok(0) if !failures.is_empty() => {
                tracing::error!(failures = ?failures, "agent exiting after a component failed");
                Ok(1)
            }
            other => other,
        };
        if let Ok(code) = &result {
            tracing::info!(code, "agent exiting");
        }
        result
    }
}

/// The workload health check (`readinessProbe` on a VM), when there is one: its prober, and
/// Envoy's readiness while Envoy runs.
fn health_check(
    config: &Config,
    localhost: IpAddr,
    tx: Option<tokio::sync::watch::Sender<Option<crate::health::Health>>>,
) -> Option<HealthCheck> {
    let (Some(probe), Some(tx)) = (config.status.health_probe.clone(), tx) else {
        return None;
    };
    let destination = config
        .status
        .probe_destination(config.node.ips.first().copied(), localhost);
    Some(HealthCheck {
        probe,
        prober: Prober {
            destination,
            http2: true,
            keepalive: None,
        },
        // As Istio: a VM is unhealthy while its Envoy is not ready.
        envoy: (!config.envoy.disabled).then(|| {
            EnvoyReadiness::new(Admin {
                addr: envoy::admin_target(config),
            })
        }),
        tx,
    })
}

/// Logs the bound listeners.
fn announce(config: &Config, bound: &Bound) {
    tracing::info!(
        status = ?bound.status_all,
        xds = %bound.xds.display(),
        sds = ?bound.sds,
        dns = ?bound.dns,
        node = %config.node_id(),
        discovery = %config.proxy.discovery_address,
        "agent listeners bound"
    );
}

/// What [`spawn_components`] starts, out of a bound [`App`].
struct Parts<'a> {
    config: &'a Arc<Config>,
    sockets: Sockets,
    shutdown: &'a Shutdown,
    readiness: &'a Readiness,
    status: StatusServer,
    xds: (XdsProxy, tokio::net::UnixListener),
    sds: Option<sds::SdsServer>,
    manager: &'a sds::SecretManager,
    dns: Option<dns_proxy::DnsProxy>,
    health: Option<HealthCheck>,
    platform: &'a Pending,
}

/// Spawns every component but Envoy (status, health, DNS, SDS, xDS, the gRPC bootstrap and its
/// readiness); returns them with what a prefetching Envoy start needs.
fn spawn_components(
    p: Parts<'_>,
) -> (
    Components,
    Option<(XdsProxy, tokio_util::sync::CancellationToken)>,
) {
    let Parts {
        config,
        sockets,
        shutdown,
        readiness,
        status,
        xds,
        sds,
        manager,
        dns,
        health,
        platform,
    } = p;
    let mut components = Components::new(shutdown.clone(), readiness.clone());
    let token = components.token();
    let stop = token.clone();
    components.spawn("status", Duration::from_secs(1), async move {
        status.run(stop).await;
        Ok::<(), String>(())
    });
    if let Some(h) = health {
        let token = token.clone();
        components.spawn("health", Duration::from_secs(1), async move {
            crate::health::run(h.probe, h.prober, h.envoy, h.tx, token).await;
            Ok::<(), String>(())
        });
    }
    if let Some(dns) = dns {
        components.spawn("dns", Duration::from_secs(2), dns.run(token.clone()));
    }
    // Proxyless without SDS: the manager fetches and rotates certificates for OUTPUT_CERTS.
    manager.warm();
    if let Some(sds) = sds {
        components.spawn("sds", Duration::from_secs(2), sds.run(token.clone()));
    }
    let (proxy, listener) = xds;
    let prefetch = config
        .upstream
        .prefetch
        .then(|| (proxy.clone(), token.clone()));
    components.spawn(
        "xds",
        Duration::from_secs(2),
        xds_proxy::serve(proxy, listener, token.clone()),
    );
    if config.envoy.disabled || config.identity.output_certs.is_some() {
        // Proxyless gRPC, or any proxy writing OUTPUT_CERTS (as Istio): ready once the gRPC
        // bootstrap and the certificates it names exist.
        let guard = readiness.register(
            "grpc",
            "gRPC xDS bootstrap or its certificates are not written yet",
        );
        let path = config.bootstrap.grpc_xds_bootstrap.clone();
        tokio::spawn(status::grpc_ready::wait(path, guard, token.clone()));
    }
    tokio::spawn(write_grpc_bootstrap(
        config.clone(),
        sockets,
        platform.clone(),
    ));
    (components, prefetch)
}

/// Loopback of the pod's family: IPv6 when every pod IP is IPv6.
fn localhost_for(config: &Config) -> IpAddr {
    let ips = &config.node.ips;
    if !ips.is_empty() && ips.iter().all(IpAddr::is_ipv6) {
        Ipv6Addr::LOCALHOST.into()
    } else {
        Ipv4Addr::LOCALHOST.into()
    }
}

/// The DNS proxy, when enabled (bound first).
async fn bind_dns(
    config: &Config,
    registry: &mut Registry,
) -> anyhow::Result<Option<dns_proxy::DnsProxy>> {
    let Some(dns_config) = &config.dns else {
        return Ok(None);
    };
    let metrics = Arc::new(dns_proxy::Metrics::new(registry));
    let dns = dns_proxy::DnsProxy::bind(dns_config.clone(), metrics)
        .await
        .context("starting the DNS proxy")?;
    Ok(Some(dns))
}

/// Workload identity (bound second): who serves the workload sockets (a live external server
/// is left alone, a stale socket file removed: [`identity::settle`]), the secret manager, and
/// the SDS server unless Envoy is disabled (proxyless: certificates go to `OUTPUT_CERTS`).
async fn bind_identity(
    config: &Arc<Config>,
    registry: &mut Registry,
    sockets: &mut SocketFiles,
) -> anyhow::Result<(sds::SecretManager, Option<sds::SdsServer>, Sockets)> {
    // Probing a socket may wait for its server's answer: off the runtime's one thread.
    let settled = {
        let config = config.clone();
        tokio::task::spawn_blocking(move || identity::settle(&config))
            .await
            .context("settling the workload identity")??
    };
    let listen = settled.identity.socket_path.clone();
    if settled.sockets.external {
        tracing::info!(
            external = %config.workload_socket.configured.display(),
            files = %listen.display(),
            "an external SDS server already serves the workload identity socket (SPIRE?): \
             Envoy takes default and ROOTCA from it; serving file certificates only, no CA calls"
        );
    }
    let metrics = Arc::new(sds::Metrics::new(registry));
    let manager =
        sds::SecretManager::new(Arc::new(settled.identity), metrics).context("secret manager")?;
    if config.envoy.disabled {
        return Ok((manager, None, settled.sockets));
    }
    let server = sds::SdsServer::bind(&listen, manager.clone())
        .await
        .context("binding the SDS socket")?;
    sockets.0.push(server.path().to_path_buf());
    if let Some((uid, gid)) = envoy::envoy_credentials(config) {
        // Envoy (1337) must reach the SDS socket the root agent created.
        for p in [Some(server.path()), server.path().parent()]
            .into_iter()
            .flatten()
        {
            std::os::unix::fs::chown(p, Some(uid), Some(gid))
                .with_context(|| format!("handing {} to Envoy's uid", p.display()))?;
        }
    }
    Ok((manager, Some(server), settled.sockets))
}

/// The xDS proxy, bound on `<configPath>/XDS`.
struct BoundXds {
    proxy: XdsProxy,
    listener: tokio::net::UnixListener,
    path: PathBuf,
}

/// The xDS proxy (bound third): Envoy's ADS to istiod, NDS into the DNS table, workload health to istiod.
fn bind_xds(
    config: &Config,
    registry: &mut Registry,
    table: Option<dns_proxy::TableHandle>,
    manager: &sds::SecretManager,
    readiness: &Readiness,
    health: Option<tokio::sync::watch::Receiver<Option<crate::health::Health>>>,
) -> anyhow::Result<BoundXds> {
    let nds = table.map(|table| {
        let guard = readiness.register(
            "dns",
            "istio DNS capture is turned ON and DNS lookup table is not ready yet",
        );
        let sink: xds_proxy::NdsSink = Arc::new(move |t| {
            table.update(&t);
            guard.ready();
            Ok(())
        });
        sink
    });
    let proxy = XdsProxy::new(xds_proxy::Inputs {
        upstream: xds_proxy::upstream(&config.upstream)?,
        nds,
        pcds: config.upstream.proxy_config_xds.then(|| {
            let manager = manager.clone();
            let sink: xds_proxy::PcdsSink =
                Arc::new(move |pems| Ok(manager.set_config_trust_bundle(&pems)?));
            sink
        }),
        metrics: xds_proxy::Metrics::new(registry),
        health,
        queue: 1,
        reconnect: config.upstream.reconnect,
        // A stalled istiod is given as long to open a stream as to answer a ping.
        open_timeout: config.upstream.keepalive.0 + config.upstream.keepalive.1,
        wasm: config
            .upstream
            .wasm
            .clone()
            .map(|o| xds_proxy::wasm::Cache::new(o, xds_proxy::wasm::Metrics::new(registry))),
        server: config.xds_server,
        streams: if config.upstream.multi_stream {
            xds_proxy::Streams::Many {
                cap: xds_proxy::MAX_STREAMS,
            }
        } else {
            xds_proxy::Streams::One
        },
    });
    let path = config.xds_socket();
    let listener = xds_proxy::bind_uds(&path)?;
    Ok(BoundXds {
        proxy,
        listener,
        path,
    })
}

/// What the status server is built from besides the config.
struct StatusParts {
    registry: Registry,
    readiness: Readiness,
    shutdown: Shutdown,
    table: Option<dns_proxy::TableHandle>,
    config_dump: String,
    localhost: IpAddr,
}

/// The status server (bound last): probes, readiness, merged metrics, debug pages.
fn bind_status_server(
    config: &Config,
    addr: Option<SocketAddr>,
    parts: StatusParts,
) -> anyhow::Result<StatusServer> {
    let mut registry = parts.registry;
    let metrics = status::Metrics::new(registry.sub_registry_with_prefix("istio_agent"));
    let listeners = bind_status(config, addr)?;
    let admin = (!config.envoy.disabled).then(|| Admin {
        addr: envoy::admin_target(config),
    });
    let lockdown = config
        .envoy
        .lifecycle_lockdown
        .then(|| status::lockdown::Lockdown {
            proxy_uids: envoy::proxy_uids(config, nix::unistd::geteuid().as_raw()),
        });
    let destination = config
        .status
        .probe_destination(config.node.instance_ip, parts.localhost);
    let ndsz: Option<status::NdszFn> = parts.table.map(|t| {
        let f: status::NdszFn = Arc::new(move || t.is_synced().then(|| t.debug_json().to_string()));
        f
    });
    Ok(StatusServer::new(
        listeners,
        status::Inputs {
            node_type: config.node.kind,
            admin,
            envoy_prometheus: (!config.envoy.disabled && config.status.merge_envoy_stats)
                .then(|| SocketAddr::new(parts.localhost, config.envoy.prometheus_port)),
            app_metrics: if config.node.kind == NodeType::Sidecar {
                config.status.prometheus_annotations.clone()
            } else {
                None
            },
            metrics_localhost_only: config.status.metrics_localhost_only,
            profiling: config.status.profiling,
            probers: config.status.app_probers.clone(),
            prober: Prober {
                destination,
                http2: config.status.http2_probing,
                keepalive: config
                    .status
                    .probe_keepalive
                    .then(status::probe::Connections::default),
            },
            registry: Arc::new(registry),
            metrics,
            readiness: parts.readiness,
            shutdown: parts.shutdown,
            ndsz,
            config_dump: parts.config_dump,
            limits: status::conn::Limits::default(),
            lockdown,
        },
    ))
}

/// Writes the gRPC xDS bootstrap once the platform is known.
async fn write_grpc_bootstrap(config: Arc<Config>, sockets: Sockets, platform: Pending) {
    let platform = platform.get().await;
    if let Err(e) = bootstrap::write_grpc_bootstrap(&config, sockets, &platform) {
        tracing::warn!(error = %e, "writing the gRPC xDS bootstrap failed");
    }
}

/// Writes Envoy's bootstrap once the platform is known and runs Envoy; returns the exit code
/// (0 when shut down before). With `prefetch` (`XDS_PROXY_PREFETCH`), the xDS proxy opens its
/// upstream stream with the bootstrap's node before Envoy starts.
async fn run_envoy(
    config: &Config,
    bound: &Bound,
    shutdown: &Shutdown,
    platform: &Pending,
    prefetch: Option<(XdsProxy, tokio_util::sync::CancellationToken)>,
) -> anyhow::Result<i32> {
    let platform = tokio::select! {
        p = platform.get() => p,
        _ = shutdown.token().cancelled() => return Ok(0),
    };
    let written = bootstrap::write(
        config,
        bootstrap::Bound {
            status: bound.status.map_or(config.proxy.status_port, |a| a.port()),
            sockets: bound.sockets,
        },
        &platform,
        None,
    )
    .context("writing Envoy's bootstrap")?;
    if let Some((proxy, token)) = prefetch {
        // A customConfigFile is the operator's own: its node and ADS are not ours to assume.
        match written
            .generated
            .then(|| xds_proxy::Prefetch::from_bootstrap(&written.path))
        {
            Some(Ok(p)) => proxy.prefetch(p, token),
            Some(Err(e)) => tracing::warn!(error = %e, "no xDS prefetch"),
            None => tracing::info!("no xDS prefetch: Envoy runs a customConfigFile"),
        }
    }
    Ok(match envoy::run(config, written, shutdown.clone()).await {
        Ok(o) => o.exit_code(),
        Err(e) => {
            tracing::error!(error = %e, "Envoy failed");
            1
        }
    })
}

/// Removes the socket file at `path` (only a socket: never a file someone put there instead).
fn remove_socket(path: &Path) {
    use std::os::unix::fs::FileTypeExt;
    let is_socket = std::fs::symlink_metadata(path)
        .map(|m| m.file_type().is_socket())
        .unwrap_or(false);
    if is_socket && let Err(e) = std::fs::remove_file(path) {
        tracing::warn!(error = %e, path = %path.display(), "removing the socket failed");
    }
}

/// `pilot-agent proxy`: binds every listener and runs the agent and Envoy until shutdown;
/// returns the process exit code. The malloc arena is trimmed while the agent is idle.
pub async fn proxy(config: Config, shutdown: Shutdown) -> anyhow::Result<i32> {
    tracing::info!(
        proxy_config = %crate::config::dump::redact_proxy_config(&config.proxy.raw),
        node = %config.node_id(),
        "effective proxy config (credentials redacted)"
    );
    tokio::spawn(crate::runtime::trim_while_idle(shutdown.token().clone()));
    let app = App::bind(Inputs {
        config,
        shutdown,
        status_addr: None,
    })
    .await?;
    app.run().await
}

/// The cloud platform `config` names or the metadata servers reveal, waited for at most
/// [`crate::platform::BOUND`].
pub async fn discover_platform(config: &Config) -> crate::platform::Platform {
    crate::platform::discover(&config.platform, crate::platform::BOUND).await
}

/// `pilot-agent bootstrap`: writes Envoy's bootstrap for an externally run Envoy on
/// `platform` (into `out`, or where `proxy` would), with the configured status port and the
/// workload sockets as found now (a stale socket file is removed, as at bind). Returns the
/// file's path.
pub fn write_bootstrap(
    config: &Config,
    platform: &crate::platform::Platform,
    out: Option<&Path>,
) -> anyhow::Result<PathBuf> {
    let sockets = identity::sockets(&config.workload_socket)?;
    let bound = bootstrap::Bound {
        status: config.proxy.status_port,
        sockets,
    };
    Ok(bootstrap::write(config, bound, platform, out)?.path)
}

/// Loads the configuration for `proxy`/`bootstrap` from the process environment.
pub fn load_config(
    node_type: NodeType,
    flags: crate::config::ProxyFlags,
    env: &HashMap<String, String>,
    base_dir: PathBuf,
) -> Result<Config, crate::config::Error> {
    let interface_ips = crate::config::private_ips(&base_dir, host_interfaces())?;
    Config::load(crate::config::Inputs {
        node_type,
        flags,
        env,
        base_dir,
        interface_ips,
        is_root: nix::unistd::geteuid().is_root(),
        cgroup_memory_limit: crate::cgroup::memory_limit(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(1)
    }

    /// A sidecar's configuration under `dir`: pod `p` in `ns` at 127.0.0.1, an unreachable CA,
    /// no cloud platform (no metadata server is asked), the `extra` variables and
    /// `proxy_config` as PROXY_CONFIG.
    fn sidecar_config(dir: &Path, extra: &[(&str, &str)], proxy_config: &str) -> Config {
        let env: HashMap<String, String> = [
            ("CLOUD_PLATFORM", "none"),
            ("POD_NAME", "p"),
            ("POD_NAMESPACE", "ns"),
            ("INSTANCE_IP", "127.0.0.1"),
            ("CA_ADDR", "127.0.0.1:1"),
            ("PROXY_CONFIG", proxy_config),
        ]
        .iter()
        .chain(extra)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        Config::sidecar_for_test(dir, &env).unwrap()
    }

    /// Binds an app on `config` (status server on a free port); returns it with its shutdown
    /// signal and what it bound.
    async fn bind(config: Config) -> (App, Shutdown, Bound) {
        let shutdown = Shutdown::default();
        let app = App::bind(Inputs {
            config,
            shutdown: shutdown.clone(),
            status_addr: Some("127.0.0.1:0".parse().unwrap()),
        })
        .await
        .unwrap();
        let bound = app.bound().clone();
        (app, shutdown, bound)
    }

    /// `--external-envoy`: every listener is bound (port 0 for status), nothing launches Envoy,
    /// readiness reports the missing Envoy, and shutdown ends the run with 0.
    #[tokio::test]
    async fn external_envoy_binds_everything_and_shuts_down_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let config = sidecar_config(
            dir.path(),
            &[("ISTIO_AGENT_EXTERNAL_ENVOY", "true")],
            &format!(
                r#"{{"discoveryAddress":"127.0.0.1:1","proxyAdminPort":{}}}"#,
                free_port()
            ),
        );
        assert!(!config.envoy.launched());
        let (app, shutdown, bound) = bind(config).await;
        let status = bound.status.expect("status server");
        assert_ne!(status.port(), 0);
        assert_eq!(bound.xds, dir.path().join("etc/istio/proxy/XDS"));
        assert_eq!(
            bound.sds.as_deref(),
            Some(
                dir.path()
                    .join("var/run/secrets/workload-spiffe-uds/socket")
                    .as_path()
            )
        );
        assert!(bound.dns.is_empty());
        let run = tokio::spawn(app.run());

        let url = format!("http://{status}/healthz/ready");
        let (code, body) = crate::client::send("GET", &url, None, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(code, 503);
        assert!(body.contains("readiness stats"), "{body}");
        let (code, metrics) = crate::client::send(
            "GET",
            &format!("http://{status}/stats/prometheus"),
            None,
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(code, 200);
        assert!(
            metrics.contains("istio_agent_xds_proxy_requests"),
            "{metrics}"
        );
        assert!(
            dir.path()
                .join("etc/istio/proxy/grpc-bootstrap.json")
                .exists()
        );

        shutdown.trigger();
        let code = tokio::time::timeout(Duration::from_secs(10), run)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(code, 0);
        // The socket files go with the listeners.
        assert!(!bound.xds.exists(), "{} left behind", bound.xds.display());
        let sds = bound.sds.unwrap();
        assert!(!sds.exists(), "{} left behind", sds.display());
    }

    /// The workload socket is settled when binding, not when the configuration loads: a
    /// leftover socket file is removed and the agent's SDS server takes its place; a live
    /// server there (SPIRE's agent, say) is left alone and the agent serves file certificates
    /// only, on the files socket.
    #[tokio::test]
    async fn binding_settles_the_workload_socket() {
        let external_envoy = [("ISTIO_AGENT_EXTERNAL_ENVOY", "true")];
        let istiod = r#"{"discoveryAddress":"127.0.0.1:1"}"#;
        let dir = tempfile::tempdir().unwrap();
        let socket = identity::tests::stale_workload_socket(dir.path());
        let config = sidecar_config(dir.path(), &external_envoy, istiod);
        assert!(
            socket.exists(),
            "loading the configuration touched the socket"
        );
        let (app, _shutdown, bound) = bind(config).await;
        assert_eq!(bound.sockets, Sockets::default());
        assert_eq!(bound.sds.as_deref(), Some(socket.as_path()));
        drop(app);

        let dir = tempfile::tempdir().unwrap();
        let socket = dir
            .path()
            .join("var/run/secrets/workload-spiffe-uds/socket");
        let manager = sds::SecretManager::new(
            Arc::new(sds::Config::defaults(dir.path())),
            Arc::new(sds::Metrics::new(&mut Registry::default())),
        )
        .unwrap();
        let external = sds::SdsServer::bind(&socket, manager).await.unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let serving = tokio::spawn(external.run(stop.clone()));
        let config = sidecar_config(dir.path(), &external_envoy, istiod);
        let (app, _shutdown, bound) = bind(config).await;
        assert!(bound.sockets.external);
        assert_eq!(
            bound.sds.as_deref(),
            Some(
                dir.path()
                    .join("var/run/secrets/credential-uds/files-socket")
                    .as_path()
            )
        );
        assert!(socket.exists(), "the external server's socket was touched");
        drop(app);
        stop.cancel();
        serving.await.unwrap().unwrap();
    }

    /// Binding fails half way (the status port is taken): the socket files already bound are
    /// removed with the error.
    #[tokio::test]
    async fn failed_bind_leaves_no_socket_file() {
        let dir = tempfile::tempdir().unwrap();
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let config = sidecar_config(dir.path(), &[], r#"{"discoveryAddress":"127.0.0.1:1"}"#);
        let xds = config.xds_socket();
        let sds = config.workload_socket.configured.clone();
        let err = App::bind(Inputs {
            config,
            shutdown: Shutdown::default(),
            status_addr: Some(taken.local_addr().unwrap()),
        })
        .await
        .err()
        .expect("the status port is taken");
        assert!(format!("{err:#}").contains("status server"), "{err:#}");
        assert!(!xds.exists(), "{} left behind", xds.display());
        assert!(!sds.exists(), "{} left behind", sds.display());
    }

    /// A signal during startup: the run ends at once with 0, no Envoy is started and no socket
    /// file is left.
    #[tokio::test]
    async fn shutdown_before_run_starts_no_envoy() {
        let dir = tempfile::tempdir().unwrap();
        let config = sidecar_config(
            dir.path(),
            &[],
            &format!(
                r#"{{"discoveryAddress":"127.0.0.1:1","proxyAdminPort":{},"binaryPath":"/nonexistent/envoy"}}"#,
                free_port()
            ),
        );
        assert!(config.envoy.launched());
        let (app, shutdown, bound) = bind(config).await;
        shutdown.trigger();
        // Starting the (nonexistent) Envoy would have failed with 1.
        let code = tokio::time::timeout(Duration::from_secs(10), app.run())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(code, 0);
        assert!(!bound.xds.exists());
        assert!(!bound.sds.unwrap().exists());
        assert!(!dir.path().join("etc/istio/proxy/envoy-rev.json").exists());
    }

    /// Binds with the status server on its configured port(s), as in a pod.
    async fn bind_on_config_port(config: Config) -> (App, Shutdown, Bound) {
        let shutdown = Shutdown::default();
        let app = App::bind(Inputs {
            config,
            shutdown: shutdown.clone(),
            status_addr: None,
        })
        .await
        .unwrap();
        let bound = app.bound().clone();
        (app, shutdown, bound)
    }

    /// `status.sidecar.istio.io/port: "0"` turns the status server off instead of failing.
    #[tokio::test]
    async fn status_port_zero_disables_the_status_server() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc/istio/pod")).unwrap();
        std::fs::write(
            dir.path().join("etc/istio/pod/annotations"),
            "status.sidecar.istio.io/port=\"0\"\n",
        )
        .unwrap();
        let config = sidecar_config(
            dir.path(),
            &[("ISTIO_AGENT_EXTERNAL_ENVOY", "true")],
            r#"{"discoveryAddress":"127.0.0.1:1"}"#,
        );
        assert_eq!(config.proxy.status_port, 0);
        let (app, shutdown, bound) = bind_on_config_port(config).await;
        assert_eq!(bound.status, None);
        assert!(bound.status_all.is_empty());
        let run = tokio::spawn(app.run());
        shutdown.trigger();
        assert_eq!(run.await.unwrap().unwrap(), 0);
    }

    /// A dual-stack pod's status port answers on both families (kubelet probes
    /// `[podIPv6]:15020`).
    #[tokio::test]
    async fn dual_stack_pod_serves_status_on_both_families() {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut config = sidecar_config(
            dir.path(),
            &[("ISTIO_AGENT_EXTERNAL_ENVOY", "true")],
            &format!(r#"{{"discoveryAddress":"127.0.0.1:1","statusPort":{port}}}"#),
        );
        config.node.ips.push("::1".parse().unwrap());
        let (app, shutdown, bound) = bind_on_config_port(config).await;
        let families: Vec<bool> = bound.status_all.iter().map(SocketAddr::is_ipv6).collect();
        assert_eq!(families, vec![false, true], "{:?}", bound.status_all);
        let run = tokio::spawn(app.run());
        for host in ["127.0.0.1", "[::1]"] {
            let url = format!("http://{host}:{port}/healthz/ready");
            let (code, _) = crate::client::send("GET", &url, None, Duration::from_secs(5))
                .await
                .unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(code, 503, "{url}");
        }
        shutdown.trigger();
        assert_eq!(run.await.unwrap().unwrap(), 0);
    }
}
