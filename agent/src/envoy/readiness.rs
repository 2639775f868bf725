//! Envoy's readiness as Istio's agent checks it: config received (CDS and LDS each updated at
//! least once, none rejected) and the server live (`server.state` 0, workers started). Each
//! condition, once met, is not asked again. Used by `/healthz/ready` and by the workload health
//! checker (a VM is unhealthy while its Envoy is not ready, as Istio aggregates them).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::admin::Admin;

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
    pub async fn check(&self) -> Result<(), String> {
        let admin = &self.admin;
        if !self.config_received.load(Ordering::Relaxed) {
            let stats = admin
                .stats(
                    r"^(cluster_manager\.cds|listener_manager\.lds)\.(update_success|update_rejected)$",
                    Duration::from_secs(1),
                )
                .await
                .map_err(|e| format!("failed to get readiness stats: {e}"))?;
            let get = |k: &str| -> u64 {
                stats
                    .iter()
                    .find(|(n, _)| n == k)
                    .and_then(|(_, v)| v.parse().ok())
                    .unwrap_or(0)
            };
            let (cds_ok, cds_rej) = (
                get("cluster_manager.cds.update_success"),
                get("cluster_manager.cds.update_rejected"),
            );
            let (lds_ok, lds_rej) = (
                get("listener_manager.lds.update_success"),
                get("listener_manager.lds.update_rejected"),
            );
            let detail = format!(
                "cds updates: {cds_ok} successful, {cds_rej} rejected; lds updates: {lds_ok} successful, {lds_rej} rejected"
            );
            if cds_ok == 0 || lds_ok == 0 {
                if cds_ok == 0 && lds_ok == 0 && cds_rej == 0 && lds_rej == 0 {
                    return Err(format!(
                        "config not received from XDS server (is Istiod running?): {detail}"
                    ));
                }
                if cds_rej > 0 || lds_rej > 0 {
                    return Err(format!(
                        "config received from XDS server, but was rejected: {detail}"
                    ));
                }
                return Err(format!(
                    "config not fully received from XDS server: {detail}"
                ));
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
                .map_err(|e| format!("failed to get server state: {e}"))?;
            let get = |k: &str| stats.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
            // As Istio: an answer without `server.state` is not a live Envoy (the stat appears once
            // the server is up), and the workers must have started.
            match get("server.state") {
                None => return Err("server.state is not yet updated".into()),
                Some("0") => {}
                Some(value) => {
                    let s = match value {
                        "1" => "DRAINING",
                        "2" => "PRE_INITIALIZING",
                        "3" => "INITIALIZING",
                        _ => "UNKNOWN",
                    };
                    return Err(format!("server is not live, current state is: {s}"));
                }
            }
            if get("listener_manager.workers_started") != Some("1") {
                return Err("workers have not yet started".into());
            }
            self.live.store(true, Ordering::Relaxed);
        }
        Ok(())
    }
}
