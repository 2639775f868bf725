//! Envoy's readiness as Istio's agent checks it: config received (CDS and LDS each updated at
//! least once, none rejected) and the server live (`server.state` 0, workers started). Each
//! condition, once met, is not asked again. Used by `/healthz/ready` and by the workload health
//! checker (a VM is unhealthy while its Envoy is not ready, as Istio aggregates them).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::admin::{self, Admin};

/// Why Envoy is not ready, in Istio's words (`/healthz/ready` answers them).
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    #[error("failed to get readiness stats: {0}")]
    ReadinessStats(#[source] admin::Error),
    #[error("config not received from XDS server (is Istiod running?): {0}")]
    ConfigNotReceived(Updates),
    #[error("config received from XDS server, but was rejected: {0}")]
    ConfigRejected(Updates),
    #[error("config not fully received from XDS server: {0}")]
    ConfigPartial(Updates),
    #[error("failed to get server state: {0}")]
    ServerStats(#[source] admin::Error),
    #[error("server.state is not yet updated")]
    NoServerState,
    /// Envoy's `server.state` by name (`DRAINING`, `PRE_INITIALIZING`, ...).
    #[error("server is not live, current state is: {0}")]
    NotLive(&'static str),
    #[error("workers have not yet started")]
    WorkersNotStarted,
}

/// Envoy's CDS and LDS update counters.
#[derive(Debug, Clone, Copy)]
pub struct Updates {
    pub cds_ok: u64,
    pub cds_rejected: u64,
    pub lds_ok: u64,
    pub lds_rejected: u64,
}

impl std::fmt::Display for Updates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cds updates: {} successful, {} rejected; lds updates: {} successful, {} rejected",
            self.cds_ok, self.cds_rejected, self.lds_ok, self.lds_rejected
        )
    }
}

/// Envoy's readiness, remembered once reached.
#[derive(Debug)]
pub struct EnvoyReadiness {
    admin: Admin,
    config_received: AtomicBool,
    live: AtomicBool,
}

impl EnvoyReadiness {
    pub fn new(admin: Admin) -> Self {
        EnvoyReadiness {
            admin,
            config_received: AtomicBool::new(false),
            live: AtomicBool::new(false),
        }
    }

    /// Ready, or why not (Istio's wording).
    pub async fn check(&self) -> Result<(), NotReady> {
        let admin = &self.admin;
        if !self.config_received.load(Ordering::Relaxed) {
            let stats = admin
                .stats(
                    r"^(cluster_manager\.cds|listener_manager\.lds)\.(update_success|update_rejected)$",
                    Duration::from_secs(1),
                )
                .await
                .map_err(NotReady::ReadinessStats)?;
            let get = |k: &str| -> u64 {
                stats
                    .iter()
                    .find(|(n, _)| n == k)
                    .and_then(|(_, v)| v.parse().ok())
                    .unwrap_or(0)
            };
            let u = Updates {
                cds_ok: get("cluster_manager.cds.update_success"),
                cds_rejected: get("cluster_manager.cds.update_rejected"),
                lds_ok: get("listener_manager.lds.update_success"),
                lds_rejected: get("listener_manager.lds.update_rejected"),
            };
            if u.cds_ok == 0 || u.lds_ok == 0 {
                let rejected = u.cds_rejected > 0 || u.lds_rejected > 0;
                if u.cds_ok == 0 && u.lds_ok == 0 && !rejected {
                    return Err(NotReady::ConfigNotReceived(u));
                }
                if rejected {
                    return Err(NotReady::ConfigRejected(u));
                }
                return Err(NotReady::ConfigPartial(u));
            }
            self.config_received.store(true, Ordering::Relaxed);
        }
        if !self.live.load(Ordering::Relaxed) {
            let stats = admin
                .stats(
                    r"^(server\.state|listener_manager\.workers_started)",
                    Duration::from_secs(3),
                )
                .await
                .map_err(NotReady::ServerStats)?;
            let get = |k: &str| stats.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
            // As Istio: an answer without `server.state` is not a live Envoy (the stat appears once
            // the server is up), and the workers must have started.
            match get("server.state") {
                None => return Err(NotReady::NoServerState),
                Some("0") => {}
                Some(value) => {
                    let s = match value {
                        "1" => "DRAINING",
                        "2" => "PRE_INITIALIZING",
                        "3" => "INITIALIZING",
                        _ => "UNKNOWN",
                    };
                    return Err(NotReady::NotLive(s));
                }
            }
            if get("listener_manager.workers_started") != Some("1") {
                return Err(NotReady::WorkersNotStarted);
            }
            self.live.store(true, Ordering::Relaxed);
        }
        Ok(())
    }
}
