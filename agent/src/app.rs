//! The composition root: the only place that knows every component. [`App::bind`] binds every
//! listener first (DNS, SDS, xDS, status) and reports the bound addresses; [`App::run`] runs
//! them, runs Envoy, and shuts down in order.
//!
//! Shutdown order: the signal (SIGTERM/SIGINT/`/quitquitquit`) closes the status server at once
//! (readiness fails), drains and stops Envoy; only then are the xDS proxy, SDS server and DNS
//! proxy stopped, so the application keeps DNS and Envoy keeps its config and certs while it
//! drains.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::bootstrap::{self, Ports};
use crate::config::{Config, NodeType};
use crate::envoy::{self, admin::Admin};
use crate::lifecycle::{Readiness, Shutdown};
use crate::status::{self, StatusServer, probe::Prober};
use crate::xds_proxy::{self, XdsProxy};

/// What [`App::bind`] needs.
pub struct Inputs {
    pub config: Config,
    pub shutdown: Shutdown,
    /// Where the status server listens; `None`: all interfaces on `statusPort`.
    pub status_addr: Option<SocketAddr>,
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
}

/// A bound, not yet running, agent.
pub struct App {
    config: Arc<Config>,
    shutdown: Shutdown,
    bound: Bound,
    status: StatusServer,
    xds: (XdsProxy, tokio::net::UnixListener),
    sds: Option<sds::SdsServer>,
    manager: sds::SecretManager,
    dns: Option<dns_proxy::DnsProxy>,
    health: Option<(
        status::probe::ReadinessProbe,
        Prober,
        tokio::sync::watch::Sender<Option<crate::health::Health>>,
    )>,
    sockets: SocketFiles,
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
    let has_v4 = config.ips.iter().any(IpAddr::is_ipv4);
    let has_v6 = config.ips.iter().any(IpAddr::is_ipv6);
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
    /// Binds every listener; nothing is served yet.
    pub async fn bind(inputs: Inputs) -> anyhow::Result<App> {
        let config = Arc::new(inputs.config);
        let config_dump = config.dump().to_string();
        tracing::info!(config = %config_dump, "effective configuration");
        let shutdown = inputs.shutdown;
        let mut registry = Registry::with_prefix("istio_agent");
        let readiness = Readiness::default();

        // 1. DNS proxy.
        let mut dns = None;
        if let Some(dns_config) = &config.dns {
            let metrics = Arc::new(dns_proxy::Metrics::new(&mut registry));
            dns = Some(
                dns_proxy::DnsProxy::bind(dns_config.clone(), metrics)
                    .await
                    .context("starting the DNS proxy")?,
            );
        }
        let table = dns.as_ref().map(dns_proxy::DnsProxy::table);

        // 2. Secret manager and SDS server (not with DISABLE_ENVOY: certs go to OUTPUT_CERTS).
        let sds_metrics = Arc::new(sds::Metrics::new(&mut registry));
        let manager = sds::SecretManager::new(Arc::new(config.identity.clone()), sds_metrics)
            .context("secret manager")?;
        let mut sockets = SocketFiles::default();
        if config.workload_socket.external {
            tracing::info!(
                external = %config.workload_socket.configured.display(),
                files = %config.sds_socket().display(),
                "an external SDS server already serves the workload identity socket (SPIRE?): \
                 Envoy takes default and ROOTCA from it; serving file certificates only, no CA calls"
            );
        }
        let sds = if config.disable_envoy {
            None
        } else {
            let server = sds::SdsServer::bind(&config.sds_socket(), manager.clone())
                .await
                .context("binding the SDS socket")?;
            sockets.0.push(server.path().to_path_buf());
            if let Some((uid, gid)) = envoy::envoy_credentials(&config) {
                // Envoy (1337) must reach the SDS socket the root agent created.
                for p in [Some(server.path()), server.path().parent()]
                    .into_iter()
                    .flatten()
                {
                    std::os::unix::fs::chown(p, Some(uid), Some(gid))
                        .with_context(|| format!("handing {} to Envoy's uid", p.display()))?;
                }
            }
            Some(server)
        };

        // 3. xDS proxy.
        let nds = table.clone().map(|table| {
            let guard = readiness.register("dns");
            let sink: xds_proxy::NdsSink = Arc::new(move |t| {
                table.update(&t);
                guard.ready();
                Ok(())
            });
            sink
        });
        if config.disable_envoy {
            // Proxyless gRPC: ready once the bootstrap and its certificates exist (Istio).
            let (path, guard) = (
                config.path(&config.grpc_xds_bootstrap),
                readiness.register("grpc"),
            );
            tokio::spawn(status::grpc_ready::wait(
                path,
                guard,
                shutdown.token().clone(),
            ));
        }
        let xds_metrics = xds_proxy::Metrics::new(&mut registry);
        let health_channel = config
            .status
            .health_probe
            .as_ref()
            .map(|_| tokio::sync::watch::channel(None));
        let proxy = XdsProxy::new(xds_proxy::Inputs {
            upstream: xds_proxy::upstream(&config.upstream).map_err(anyhow::Error::msg)?,
            nds,
            metrics: xds_metrics,
            health: health_channel.as_ref().map(|(_, rx)| rx.clone()),
            queue: 1,
            reconnect: config.upstream.reconnect,
            // A stalled istiod is given as long to open a stream as to answer a ping.
            open_timeout: config.upstream.keepalive.0 + config.upstream.keepalive.1,
        });
        let xds_path = config.xds_socket();
        let xds_listener = xds_proxy::bind_uds(&xds_path)?;
        sockets.0.push(xds_path.clone());

        // 4. Status server.
        let status_metrics = status::Metrics::new(&mut registry);
        let all_v6 = !config.ips.is_empty() && config.ips.iter().all(IpAddr::is_ipv6);
        let status_listeners = bind_status(&config, inputs.status_addr)?;
        let admin = (!config.disable_envoy).then(|| Admin {
            addr: envoy::admin_addr(&config),
        });
        let localhost: IpAddr = if all_v6 {
            Ipv6Addr::LOCALHOST.into()
        } else {
            Ipv4Addr::LOCALHOST.into()
        };
        let destination = config
            .status
            .probe_destination(config.instance_ip, localhost);
        let ndsz: Option<status::NdszFn> = table.map(|t| {
            let f: status::NdszFn =
                Arc::new(move || t.is_synced().then(|| t.debug_json().to_string()));
            f
        });
        let status = StatusServer::new(
            status_listeners,
            status::Inputs {
                node_type: config.node_type,
                admin,
                envoy_prometheus: (admin.is_some() && config.status.merge_envoy_stats)
                    .then(|| SocketAddr::new(localhost, config.envoy_prometheus_port)),
                app_metrics: if config.node_type == NodeType::Sidecar {
                    config.status.prometheus_annotations.clone()
                } else {
                    None
                },
                metrics_localhost_only: config.metrics_localhost_only,
                probers: config.status.app_probers.clone(),
                prober: Prober { destination },
                registry: Arc::new(registry),
                metrics: status_metrics,
                readiness,
                shutdown: shutdown.clone(),
                ndsz,
                config_dump,
                limits: status::conn::Limits::default(),
            },
        );

        let health = match (config.status.health_probe.clone(), health_channel) {
            (Some(probe), Some((tx, _))) => {
                let destination = config
                    .status
                    .probe_destination(config.ips.first().copied(), localhost);
                Some((probe, Prober { destination }, tx))
            }
            _ => None,
        };
        let bound = Bound {
            status: status.local_addr().ok(),
            status_all: status.local_addrs(),
            xds: xds_path,
            sds: sds.as_ref().map(|s| s.path().to_path_buf()),
            dns: dns.as_ref().map(|d| d.local_addrs()).unwrap_or_default(),
        };
        tracing::info!(
            status = ?bound.status_all,
            xds = %bound.xds.display(),
            sds = ?bound.sds,
            dns = ?bound.dns,
            node = %config.node_id(),
            discovery = %config.proxy.discovery_address,
            "agent listeners bound"
        );
        Ok(App {
            config,
            shutdown,
            bound,
            status,
            xds: (proxy, xds_listener),
            sds,
            manager,
            dns,
            health,
            sockets,
        })
    }

    pub fn bound(&self) -> &Bound {
        &self.bound
    }

    /// Runs until Envoy exits or shutdown completes; returns the process exit code.
    pub async fn run(self) -> anyhow::Result<i32> {
        let App {
            config,
            shutdown,
            bound,
            status,
            xds,
            sds,
            manager,
            dns,
            health,
            sockets,
        } = self;
        // Stops the components that must outlive Envoy's drain.
        let components = CancellationToken::new();
        let mut tasks = JoinSet::new();
        tasks.spawn(async move {
            status.run().await;
        });
        if let Some((probe, prober, tx)) = health {
            tasks.spawn(crate::health::run(probe, prober, tx, components.clone()));
        }
        if let Some(dns) = dns {
            let token = components.clone();
            tasks.spawn(async move {
                if let Err(e) = dns.run(token).await {
                    tracing::error!(error = %e, "DNS proxy failed");
                }
            });
        }
        if let Some(sds) = sds {
            manager.warm();
            let token = components.clone();
            tasks.spawn(async move {
                if let Err(e) = sds.run(token).await {
                    tracing::error!(error = %e, "SDS server failed");
                }
            });
        } else {
            // Proxyless: fetch and rotate certificates for OUTPUT_CERTS.
            manager.warm();
        }
        {
            let token = components.clone();
            let (proxy, listener) = xds;
            tasks.spawn(async move {
                if let Err(e) = xds_proxy::serve(proxy, listener, token).await {
                    tracing::error!(error = %e, "xDS proxy failed");
                }
            });
        }
        if let Err(e) = bootstrap::write_grpc_bootstrap(&config) {
            tracing::warn!(error = %e, "writing the gRPC xDS bootstrap failed");
        }

        let result = if config.launches_envoy() && !shutdown.is_shutting_down() {
            run_envoy(&config, &bound, &shutdown).await
        } else {
            shutdown.token().cancelled().await;
            Ok(0)
        };
        // Envoy is gone (exited, drained or never started): everything else stops too.
        shutdown.trigger();
        components.cancel();
        manager.shutdown();
        let drained = tokio::time::timeout(Duration::from_secs(5), async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("components did not stop within 5s");
        }
        drop(sockets);
        if let Ok(code) = &result {
            tracing::info!(code, "agent exiting");
        }
        result
    }
}

/// Writes Envoy's bootstrap and runs Envoy; returns the exit code.
async fn run_envoy(config: &Config, bound: &Bound, shutdown: &Shutdown) -> anyhow::Result<i32> {
    let written = bootstrap::write(
        config,
        Ports {
            status: bound.status.map_or(config.proxy.status_port, |a| a.port()),
        },
        None,
    )
    .context("writing Envoy's bootstrap")?;
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProxyFlags;

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(1)
    }

    /// A sidecar's configuration under `dir`: pod `p` in `ns` at 127.0.0.1, an unreachable CA,
    /// the `extra` variables and `proxy_config` as PROXY_CONFIG.
    fn sidecar_config(dir: &Path, extra: &[(&str, &str)], proxy_config: &str) -> Config {
        let env: HashMap<String, String> = [
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
        Config::load(crate::config::Inputs {
            node_type: NodeType::Sidecar,
            flags: ProxyFlags::default(),
            env: &env,
            base_dir: dir.to_path_buf(),
            interface_ips: vec![],
        })
        .unwrap()
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
        assert!(!config.launches_envoy());
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

    /// Binding fails half way (the status port is taken): the socket files already bound are
    /// removed with the error.
    #[tokio::test]
    async fn failed_bind_leaves_no_socket_file() {
        let dir = tempfile::tempdir().unwrap();
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let config = sidecar_config(dir.path(), &[], r#"{"discoveryAddress":"127.0.0.1:1"}"#);
        let xds = config.xds_socket();
        let sds = config.sds_socket();
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
        assert!(config.launches_envoy());
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
        config.ips.push("::1".parse().unwrap());
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
