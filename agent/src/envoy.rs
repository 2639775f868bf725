//! Envoy's command line, process and drain sequence.
//!
//! Envoy runs until it exits by itself (the agent then exits with Envoy's status: non-zero when
//! Envoy crashed, unlike Istio) or until shutdown: drain inbound listeners, wait (a sidecar:
//! while the app's outbound connections are open, then `terminationDrainDuration` without any,
//! `follow.rs`; with `DRAIN_FOLLOWS_APP=false` or for routers, Istio's fixed
//! `terminationDrainDuration`; with `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`, Istio's wait for no
//! downstream connection), then stop Envoy.

pub mod admin;
pub mod follow;
pub mod readiness;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use tokio::process::Command;

use crate::bootstrap::{self, ADMIN_SOCKET, Written, local_address_ip_version};
use crate::config::{Config, NodeType};
use crate::http1::Target;
use admin::Admin;
use proto::lifecycle::{DrainMode, Shutdown};

/// Envoy process errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot start Envoy {binary}: {source} (is binaryPath right?)")]
    Spawn {
        binary: PathBuf,
        source: std::io::Error,
    },
    #[error("waiting for Envoy failed: {0}")]
    Wait(std::io::Error),
    #[error("{}: {source}", path.display())]
    OverrideRead {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    OverrideParse {
        path: PathBuf,
        source: serde_yaml::Error,
    },
}

/// How the Envoy run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Envoy exited by itself with this status.
    Exited(Option<i32>),
    /// Shutdown stopped Envoy (after a drain unless it was skipped).
    Stopped,
}

impl Outcome {
    /// The agent's exit code: 0 after a shutdown or a clean Envoy exit; Envoy's code, or
    /// 128+signal, when Envoy died.
    pub fn exit_code(self) -> i32 {
        match self {
            Outcome::Stopped => 0,
            Outcome::Exited(code) => code.unwrap_or(1),
        }
    }
}

fn status_code(status: ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|s| 128 + s))
}

/// Splits `--proxyLogLevel` into Envoy's level and component levels.
fn split_component_log(level: &str) -> (String, Vec<String>) {
    let mut log_level = String::new();
    let mut components = Vec::new();
    for item in level.split(',') {
        match item.split(':').count() {
            1 => log_level = item.to_string(),
            2 => components.push(item.to_string()),
            _ => tracing::warn!(level = item, "dropping invalid log level"),
        }
    }
    (log_level, components)
}

/// Reads `ISTIO_BOOTSTRAP_OVERRIDE` (YAML or JSON) as JSON, with `$(HOST_IP)` substituted.
fn override_json(path: &Path, host_ip: &str) -> Result<serde_json::Value, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::OverrideRead {
        path: path.into(),
        source,
    })?;
    let host = if host_ip.contains(':') {
        format!("[{host_ip}]")
    } else {
        host_ip.to_string()
    };
    let text = text.replace("$(HOST_IP)", &host);
    serde_yaml::from_str(&text).map_err(|source| Error::OverrideParse {
        path: path.into(),
        source,
    })
}

/// Istio's Envoy argv (after the binary).
pub fn args(config: &Config, bootstrap_path: &Path) -> Vec<String> {
    let flush = config
        .proxy
        .file_flush_interval
        .map(|d| d.as_millis().to_string())
        .unwrap_or_else(|| "1000".into());
    let mut args = vec![
        "-c".to_string(),
        bootstrap_path.display().to_string(),
        "--drain-time-s".into(),
        config.proxy.drain_duration.as_secs().to_string(),
        "--drain-strategy".into(),
        "immediate".into(),
        "--local-address-ip-version".into(),
        local_address_ip_version(config).into(),
        "--file-flush-interval-msec".into(),
        flush,
        "--disable-hot-restart".into(),
        "--allow-unknown-static-fields".into(),
    ];
    if config.proxy.file_flush_min_size_kb > 0 {
        args.push("--file-flush-min-size-kb".into());
        args.push(config.proxy.file_flush_min_size_kb.to_string());
    }
    let (level, components) = split_component_log(&config.flags.proxy_log_level);
    if !level.is_empty() {
        args.push("-l".into());
        args.push(level);
    }
    if !components.is_empty() {
        args.push("--component-log-level".into());
        args.push(components.join(","));
    } else if !config.flags.proxy_component_log_level.is_empty() {
        args.push("--component-log-level".into());
        args.push(config.flags.proxy_component_log_level.clone());
    }
    if config.envoy.skip_deprecated_logs {
        args.push("--skip-deprecated-logs".into());
    }
    if config.envoy.enable_core_dump {
        args.push("--enable-core-dump".into());
    }
    // One `--config-yaml` (Envoy takes one): the heap bound's overload manager, then
    // ISTIO_BOOTSTRAP_OVERRIDE merged over it.
    let mut overlay = config
        .envoy
        .heap_limit
        .as_ref()
        .map(bootstrap::overload::heap_fragment);
    if !config.envoy.bootstrap_override.is_empty() {
        match override_json(
            &config.path(&config.envoy.bootstrap_override),
            &config.node.host_ip,
        ) {
            Ok(json) => match &mut overlay {
                Some(o) => bootstrap::overload::merge(o, json),
                None => overlay = Some(json),
            },
            Err(e) => tracing::warn!(error = %e, "failed to read bootstrap override"),
        }
    }
    if let Some(o) = overlay {
        args.push("--config-yaml".into());
        args.push(o.to_string());
    }
    if config.concurrency() > 0 {
        args.push("--concurrency".into());
        args.push(config.concurrency().to_string());
    }
    args
}

/// The admin address Envoy listens on (per the bootstrap's localhost choice).
pub fn admin_addr(config: &Config) -> SocketAddr {
    let all_v6 =
        !config.node.ips.is_empty() && config.node.ips.iter().all(std::net::IpAddr::is_ipv6);
    let ip: std::net::IpAddr = if all_v6 {
        std::net::Ipv6Addr::LOCALHOST.into()
    } else {
        std::net::Ipv4Addr::LOCALHOST.into()
    };
    SocketAddr::new(ip, config.proxy.proxy_admin_port)
}

/// Where the agent reaches Envoy's admin API: the Unix socket in the proxy's directory with
/// `PROXY_LIFECYCLE_LOCKDOWN`, else TCP on localhost (Istio's).
pub fn admin_target(config: &Config) -> Target {
    if config.envoy.lifecycle_lockdown {
        Target::Unix(admin_socket_path(config))
    } else {
        Target::Tcp(admin_addr(config).to_string())
    }
}

/// The admin socket's path as the agent opens it.
pub fn admin_socket_path(config: &Config) -> PathBuf {
    config.path(&config.proxy.config_path).join(ADMIN_SOCKET)
}

/// The uids that are the proxy's own: the agent's effective uid, and Envoy's when it runs as
/// another (root is always allowed on top).
pub fn proxy_uids(config: &Config, agent_euid: u32) -> Vec<u32> {
    let mut uids = vec![agent_euid];
    if let Some((uid, _)) = envoy_credentials(config)
        && uid != agent_euid
    {
        uids.push(uid);
    }
    uids
}

/// Sums `listener.*.downstream_cx_active` over the listeners that carry workload traffic;
/// `None` when the stats hold no such listener.
pub fn active_connections(stats: &[(String, String)], config: &Config) -> Option<u64> {
    let skip = [
        format!(
            "listener.0.0.0.0_{}.downstream_cx_active",
            config.envoy.status_port
        ),
        format!(
            "listener.0.0.0.0_{}.downstream_cx_active",
            config.envoy.prometheus_port
        ),
        format!(
            "listener.[__]_{}.downstream_cx_active",
            config.envoy.status_port
        ),
        format!(
            "listener.[__]_{}.downstream_cx_active",
            config.envoy.prometheus_port
        ),
        "listener.admin.downstream_cx_active".to_string(),
        "listener.admin.main_thread.downstream_cx_active".to_string(),
    ];
    // The mTLS metrics listeners (`ENVOY_SECURE_METRICS_PORT`, `_MERGED_`) are scrapers, not
    // workload traffic: skipped as Istio skips them.
    let secure: Vec<String> = [
        config.bootstrap.secure_metrics_port,
        config.bootstrap.secure_merged_metrics_port,
    ]
    .into_iter()
    .filter(|p| *p != 0)
    .flat_map(|p| {
        [
            format!("listener.0.0.0.0_{p}.downstream_cx_active"),
            format!("listener.[__]_{p}.downstream_cx_active"),
        ]
    })
    .collect();
    let mut seen = false;
    let mut sum = 0u64;
    for (name, value) in stats {
        if !name.starts_with("listener.")
            || !name.ends_with("downstream_cx_active")
            || name.contains("worker_")
            || name.starts_with("listener.envoy_internal_")
            || skip.contains(name)
            || secure.contains(name)
        {
            continue;
        }
        seen = true;
        sum += value.parse::<u64>().unwrap_or(0);
    }
    seen.then_some(sum)
}

/// Runs Envoy until it exits or shutdown stops it.
pub async fn run(
    config: &Config,
    bootstrap: Written,
    shutdown: Shutdown,
) -> Result<Outcome, Error> {
    let remove_bootstrap = || {
        if bootstrap.generated {
            let _ = std::fs::remove_file(&bootstrap.path);
        }
    };
    if shutdown.is_shutting_down() {
        // The signal came during startup: never start an Envoy only to drain it.
        tracing::info!("shutdown before Envoy started; not starting it");
        remove_bootstrap();
        return Ok(Outcome::Stopped);
    }
    if config.envoy.lifecycle_lockdown {
        remove_leftover_admin_socket(config);
    }
    let binary = config.path(&config.proxy.binary_path);
    let argv = args(config, &bootstrap.path);
    tracing::info!(binary = %binary.display(), args = ?argv, "starting Envoy");
    let mut cmd = Command::new(&binary);
    cmd.args(&argv)
        .env_clear()
        .envs(&config.envoy.env)
        .current_dir(&config.base_dir)
        .kill_on_drop(true);
    if let Some((uid, gid)) = envoy_credentials(config) {
        cmd.uid(uid).gid(gid);
    }
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn().map_err(|source| Error::Spawn {
        binary: binary.clone(),
        source,
    })?;
    let admin = Admin {
        addr: admin_target(config),
    };
    let outcome = tokio::select! {
        status = child.wait() => {
            let status = status.map_err(Error::Wait)?;
            if status.success() {
                tracing::info!("Envoy exited");
            } else {
                tracing::error!(status = %status, "Envoy exited abnormally (it may have been OOM killed if it got SIGKILL)");
            }
            Outcome::Exited(status_code(status))
        }
        _ = shutdown.token().cancelled() => {
            terminate(config, &mut child, &admin, shutdown.mode()).await?;
            Outcome::Stopped
        }
    };
    remove_bootstrap();
    if config.envoy.lifecycle_lockdown {
        remove_leftover_admin_socket(config);
    }
    Ok(outcome)
}

/// Removes Envoy's admin socket file: Envoy leaves it behind, and one left by an earlier run
/// (the proxy's directory is an emptyDir that outlives the container) would make Envoy's bind
/// fail.
fn remove_leftover_admin_socket(config: &Config) {
    let path = admin_socket_path(config);
    match std::fs::remove_file(&path) {
        Ok(()) => tracing::debug!(path = %path.display(), "removed the admin socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove the leftover admin socket")
        }
    }
}

/// Istio's proxy uid and gid.
pub const ENVOY_UID: u32 = 1337;

/// The uid and gid Envoy runs as when they differ from the agent's: an agent running as root to
/// serve DNS on `:53` starts Envoy as 1337 (as Istio), so Envoy's own traffic stays out of the
/// capture and Envoy has no root.
pub fn envoy_credentials(config: &Config) -> Option<(u32, u32)> {
    config
        .envoy
        .run_as_proxy_user
        .then_some((ENVOY_UID, ENVOY_UID))
}

/// Envoy gets SIGKILL if the agent dies without stopping it (SIGKILL, the OOM killer), so no
/// orphan Envoy keeps the pod's ports. The signal follows the thread that spawned Envoy: `App::run`
/// is driven by `block_on` on the main thread, which lives as long as the process.
#[allow(unsafe_code)] // pre_exec: prctl(2) in the forked child
fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and calls only async-signal-safe
    // functions (prctl, getppid); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The agent died between fork and prctl: do not start an orphan.
            if libc::getppid() as u32 != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

async fn terminate(
    config: &Config,
    child: &mut tokio::process::Child,
    admin: &Admin,
    mode: DrainMode,
) -> Result<(), Error> {
    if mode == DrainMode::Graceful {
        let q = if bootstrap::inbound_only(config.node.kind) {
            "/drain_listeners?inboundonly&graceful"
        } else {
            "/drain_listeners?graceful"
        };
        match admin
            .request(http::Method::POST, q, Duration::from_secs(5))
            .await
        {
            Ok((status, _)) => tracing::info!(status, "Envoy draining listeners"),
            Err(e) => tracing::warn!(error = %e, "draining Envoy's listeners failed"),
        }
        // With EXIT_ON_ZERO_ACTIVE_CONNECTIONS, as Istio: after MINIMUM_DRAIN_DURATION, wait
        // for the last connection however long it takes (the pod's grace period is the bound:
        // the kubelet's SIGKILL); without it, terminationDrainDuration.
        // Ours (the default for sidecars): while the app's outbound connections are open, then
        // terminationDrainDuration without any.
        let wait = async {
            if config.envoy.exit_on_zero_active_connections {
                tokio::time::sleep(config.envoy.minimum_drain_duration).await;
                wait_for_zero_connections(config, admin).await;
            } else if follows_app(config) {
                let waited = follow::until_quiet(
                    follow::captured_outbound,
                    config.proxy.termination_drain_duration,
                )
                .await;
                tracing::info!(
                    waited = ?waited,
                    "no outbound connection of the app for terminationDrainDuration: stopping Envoy"
                );
            } else {
                tokio::time::sleep(config.proxy.termination_drain_duration).await;
            }
        };
        tokio::select! {
            _ = wait => {}
            status = child.wait() => {
                tracing::info!(status = ?status.ok(), "Envoy exited during drain");
                return Ok(());
            }
        }
    }
    stop(child).await
}

async fn wait_for_zero_connections(config: &Config, admin: &Admin) {
    let mut errors = 0;
    loop {
        match admin
            .stats("downstream_cx_active$", Duration::from_secs(2))
            .await
        {
            Ok(stats) => {
                errors = 0;
                match active_connections(&stats, config) {
                    None | Some(0) => {
                        tracing::info!("no active downstream connections left");
                        return;
                    }
                    Some(n) => tracing::info!(active = n, "waiting for connections to close"),
                }
            }
            Err(e) => {
                errors += 1;
                tracing::warn!(error = %e, errors, "reading active connections failed");
                if errors >= 5 {
                    return;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// SIGTERM, then SIGKILL if Envoy has not exited within 5 s.
async fn stop(child: &mut tokio::process::Child) -> Result<(), Error> {
    if let Some(pid) = child.id() {
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        if let Ok(status) = tokio::time::timeout(Duration::from_secs(5), child.wait()).await {
            tracing::info!(status = ?status.ok(), "Envoy stopped");
            return Ok(());
        }
    }
    let _ = child.start_kill();
    child.wait().await.map_err(Error::Wait)?;
    Ok(())
}

/// Whether a graceful shutdown waits for the app's outbound connections (`follow.rs`): sidecars
/// with `DRAIN_FOLLOWS_APP` on; routers and waypoints have no app beside them.
pub fn follows_app(config: &Config) -> bool {
    config.envoy.drain_follows_app && config.node.kind == NodeType::Sidecar
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Inputs, ProxyFlags};
    use std::collections::HashMap;

    fn config(pairs: &[(&str, &str)], flags: ProxyFlags) -> Config {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::load(Inputs {
            node_type: NodeType::Sidecar,
            flags,
            env: &env,
            base_dir: PathBuf::from("/nonexistent-base"),
            interface_ips: vec!["198.18.0.2".parse().unwrap()],
            is_root: false,
            cgroup_memory_limit: None,
        })
        .unwrap()
    }

    #[test]
    fn default_argv_matches_istio() {
        let c = config(
            &[],
            ProxyFlags {
                proxy_component_log_level: "misc:error".into(),
                ..ProxyFlags::default()
            },
        );
        let a = args(&c, Path::new("/etc/istio/proxy/envoy-rev.json"));
        assert_eq!(
            a,
            [
                "-c",
                "/etc/istio/proxy/envoy-rev.json",
                "--drain-time-s",
                "45",
                "--drain-strategy",
                "immediate",
                "--local-address-ip-version",
                "v4",
                "--file-flush-interval-msec",
                "1000",
                "--disable-hot-restart",
                "--allow-unknown-static-fields",
                "-l",
                "warning",
                "--component-log-level",
                "misc:error",
                "--skip-deprecated-logs",
            ]
        );
    }

    #[test]
    fn component_levels_in_proxy_log_level_win() {
        let c = config(
            &[
                ("ISTIO_CPU_LIMIT", "2"),
                ("ENVOY_SKIP_DEPRECATED_LOGS", "false"),
            ],
            ProxyFlags {
                proxy_log_level: "debug,upstream:info,a:b:c".into(),
                proxy_component_log_level: "misc:error".into(),
                ..ProxyFlags::default()
            },
        );
        let a = args(&c, Path::new("b.json"));
        let tail: Vec<&str> = a[12..].iter().map(String::as_str).collect();
        assert_eq!(
            tail,
            [
                "-l",
                "debug",
                "--component-log-level",
                "upstream:info",
                "--concurrency",
                "2"
            ]
        );
    }

    #[test]
    fn bootstrap_override_substitutes_host_ip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o.yaml");
        std::fs::write(&p, "admin:\n  address: \"$(HOST_IP)\"\n").unwrap();
        assert_eq!(
            override_json(&p, "198.18.0.1").unwrap().to_string(),
            r#"{"admin":{"address":"198.18.0.1"}}"#
        );
        assert_eq!(
            override_json(&p, "fd00::1").unwrap().to_string(),
            r#"{"admin":{"address":"[fd00::1]"}}"#
        );
    }

    /// `ENVOY_MEMORY_OVERLOAD`: the heap bound reaches Envoy as one `--config-yaml`, merged
    /// with `ISTIO_BOOTSTRAP_OVERRIDE`; GOMEMLIMIT (the template's `limits.memory`) when the
    /// cgroup has no limit.
    #[test]
    fn memory_overload_reaches_envoy_as_config_yaml() {
        let yaml = |c: &Config| {
            let a = args(c, Path::new("/b.json"));
            a.iter()
                .position(|x| x == "--config-yaml")
                .map(|i| serde_json::from_str::<serde_json::Value>(&a[i + 1]).unwrap())
        };
        assert_eq!(
            yaml(&config(&[("GOMEMLIMIT", "512MiB")], ProxyFlags::default())),
            None
        );
        let c = config(
            &[("ENVOY_MEMORY_OVERLOAD", "true"), ("GOMEMLIMIT", "1000MiB")],
            ProxyFlags::default(),
        );
        let limit = c.envoy.heap_limit.expect("a heap limit");
        assert_eq!(
            (limit.source, limit.max_heap_bytes),
            ("GOMEMLIMIT", 850 << 20)
        );
        let v = yaml(&c).expect("--config-yaml");
        assert_eq!(
            v["overload_manager"]["resource_monitors"][0]["name"],
            "envoy.resource_monitors.fixed_heap"
        );
        let dir = tempfile::tempdir().unwrap();
        let o = dir.path().join("override.yaml");
        std::fs::write(&o, "admin:\n  address: \"$(HOST_IP)\"\n").unwrap();
        let c = config(
            &[
                ("ENVOY_MEMORY_OVERLOAD", "true"),
                ("GOMEMLIMIT", "1000MiB"),
                ("ISTIO_BOOTSTRAP_OVERRIDE", o.to_str().unwrap()),
                ("HOST_IP", "198.18.0.1"),
            ],
            ProxyFlags::default(),
        );
        let v = yaml(&c).expect("--config-yaml");
        assert_eq!(v["admin"]["address"], "198.18.0.1");
        assert!(v["overload_manager"].is_object());
        // No limit anywhere: nothing to bound by (a warning, no fragment).
        let c = config(&[("ENVOY_MEMORY_OVERLOAD", "true")], ProxyFlags::default());
        assert_eq!(c.envoy.heap_limit, None);
        // A malformed GOMEMLIMIT names itself.
        let env: HashMap<String, String> =
            [("ENVOY_MEMORY_OVERLOAD", "true"), ("GOMEMLIMIT", "1G")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        let err = Config::load(Inputs {
            node_type: NodeType::Sidecar,
            flags: ProxyFlags::default(),
            env: &env,
            base_dir: PathBuf::from("/nonexistent-base"),
            interface_ips: vec![],
            is_root: false,
            cgroup_memory_limit: Some(256 << 20),
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("GOMEMLIMIT"), "{err}");
    }

    #[test]
    fn only_sidecars_follow_the_app_and_the_switch_turns_it_off() {
        let sidecar = config(&[], ProxyFlags::default());
        assert!(follows_app(&sidecar));
        let istio = config(&[("DRAIN_FOLLOWS_APP", "false")], ProxyFlags::default());
        assert!(!follows_app(&istio));
        let mut router = config(&[], ProxyFlags::default());
        router.node.kind = NodeType::Router;
        assert!(!follows_app(&router));
    }

    #[test]
    fn active_connections_skip_istio_listeners() {
        let c = config(&[], ProxyFlags::default());
        let stats: Vec<(String, String)> = [
            ("listener.0.0.0.0_15006.downstream_cx_active", "2"),
            ("listener.0.0.0.0_15006.worker_0.downstream_cx_active", "2"),
            ("listener.0.0.0.0_15021.downstream_cx_active", "5"),
            ("listener.admin.downstream_cx_active", "1"),
            ("listener.198.18.0.2_8080.downstream_cx_active", "1"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(active_connections(&stats, &c), Some(3));
        assert_eq!(active_connections(&stats[2..4], &c), None);
        // The secure metrics listeners are scrapers, not workload traffic.
        let c = config(
            &[
                ("ENVOY_SECURE_METRICS_PORT", "15091"),
                ("ENVOY_SECURE_MERGED_METRICS_PORT", "15092"),
            ],
            ProxyFlags::default(),
        );
        let mut with_secure = stats.clone();
        with_secure.push((
            "listener.0.0.0.0_15091.downstream_cx_active".into(),
            "4".into(),
        ));
        with_secure.push((
            "listener.[__]_15092.downstream_cx_active".into(),
            "7".into(),
        ));
        assert_eq!(active_connections(&with_secure, &c), Some(3));
        assert_eq!(Outcome::Exited(Some(139)).exit_code(), 139);
        assert_eq!(Outcome::Stopped.exit_code(), 0);
    }
}
