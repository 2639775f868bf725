//! Workload health for istiod (`ProxyConfig.readinessProbe`, typically VMs): the probe runs on
//! its period and a state change that reaches its threshold is published; the xDS proxy sends it
//! upstream as `HealthInformation`.

use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::status::probe::{Prober, ReadinessProbe};

/// The last health published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Unhealthy(String),
}

/// Runs `probe` until `token` is cancelled, publishing threshold-crossing changes on `tx`.
pub async fn run(
    probe: ReadinessProbe,
    prober: Prober,
    tx: watch::Sender<Option<Health>>,
    token: CancellationToken,
) {
    tokio::select! {
        _ = token.cancelled() => return,
        _ = tokio::time::sleep(probe.initial_delay) => {}
    }
    let (mut successes, mut failures) = (0u32, 0u32);
    loop {
        let result = prober.run(&probe.probe, &http::HeaderMap::new()).await;
        let healthy = (200..400).contains(&result.status);
        let next = if healthy {
            successes += 1;
            failures = 0;
            (successes >= probe.success_threshold).then_some(Health::Healthy)
        } else {
            failures += 1;
            successes = 0;
            (failures >= probe.failure_threshold).then(|| {
                Health::Unhealthy(format!(
                    "probe failed with status {}: {}",
                    result.status,
                    String::from_utf8_lossy(&result.body)
                ))
            })
        };
        if let Some(next) = next {
            tx.send_if_modified(|cur| {
                let changed =
                    cur.as_ref().map(std::mem::discriminant) != Some(std::mem::discriminant(&next));
                if changed {
                    tracing::info!(health = ?next, "workload health changed");
                    *cur = Some(next);
                }
                changed
            });
        }
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(probe.period.max(Duration::from_millis(10))) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::probe::{AppProbe, ProbeAction};

    #[tokio::test]
    async fn publishes_changes_after_thresholds() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accept = tokio::spawn(async move {
            // Accept a few probes, then go away.
            for _ in 0..2 {
                let _ = listener.accept().await;
            }
        });
        let probe = ReadinessProbe {
            probe: AppProbe {
                action: ProbeAction::Tcp {
                    port,
                    host: String::new(),
                },
                timeout: Duration::from_secs(1),
            },
            initial_delay: Duration::ZERO,
            period: Duration::from_millis(20),
            success_threshold: 1,
            failure_threshold: 2,
        };
        let (tx, mut rx) = watch::channel(None);
        let token = CancellationToken::new();
        tokio::spawn(run(
            probe,
            Prober {
                destination: "127.0.0.1".parse().unwrap(),
                http2: true,
            },
            tx,
            token.clone(),
        ));
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), Some(Health::Healthy));
        accept.await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(*rx.borrow(), Some(Health::Unhealthy(_))));
        token.cancel();
    }
}
