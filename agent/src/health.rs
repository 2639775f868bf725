//! Workload health for istiod (`ProxyConfig.readinessProbe`, typically VMs): the probe runs on
//! its period and a state change that reaches its threshold is published; the xDS proxy sends it
//! upstream as `HealthInformation`.

use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::envoy::readiness::EnvoyReadiness;
use crate::status::probe::{ProbeResult, Prober, ReadinessProbe};

/// The last health published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Unhealthy(String),
}

/// Runs `probe` until `token` is cancelled, publishing threshold-crossing changes on `tx`.
/// With `envoy`, as Istio aggregates them: unhealthy while Envoy is not ready, whatever the
/// app's probe says.
pub async fn run(
    probe: ReadinessProbe,
    prober: Prober,
    envoy: Option<EnvoyReadiness>,
    tx: watch::Sender<Option<Health>>,
    token: CancellationToken,
) {
    tokio::select! {
        _ = token.cancelled() => return,
        _ = tokio::time::sleep(probe.initial_delay) => {}
    }
    let (mut successes, mut failures) = (0u32, 0u32);
    loop {
        let envoy_not_ready = match &envoy {
            Some(e) => e.check().await.err(),
            None => None,
        };
        let result = match &envoy_not_ready {
            Some(why) => ProbeResult {
                status: 503,
                body: format!("Envoy is not ready: {why}").into(),
            },
            None => prober.run(&probe.probe, &http::HeaderMap::new()).await,
        };
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
                keepalive: None,
            },
            None,
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

    /// As Istio aggregates them: the app answers, but Envoy has no config yet, so the
    /// workload is unhealthy, saying why.
    #[tokio::test]
    async fn unhealthy_while_envoy_is_not_ready() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let app = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let app_port = app.local_addr().unwrap().port();
        tokio::spawn(async move { while let Ok((_s, _)) = app.accept().await {} });
        // Envoy's admin: config not received yet.
        let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin_addr = admin.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = admin.accept().await {
                let mut buf = [0u8; 2048];
                let _ = s.read(&mut buf).await;
                let body = "cluster_manager.cds.update_success: 0\n";
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            }
        });
        let probe = ReadinessProbe {
            probe: AppProbe {
                action: ProbeAction::Tcp {
                    port: app_port,
                    host: String::new(),
                },
                timeout: Duration::from_secs(1),
            },
            initial_delay: Duration::ZERO,
            period: Duration::from_millis(20),
            success_threshold: 1,
            failure_threshold: 1,
        };
        let (tx, mut rx) = watch::channel(None);
        let token = CancellationToken::new();
        let envoy = EnvoyReadiness::new(crate::envoy::admin::Admin {
            addr: crate::http1::Target::Tcp(admin_addr.to_string()),
        });
        tokio::spawn(run(
            probe,
            Prober {
                destination: "127.0.0.1".parse().unwrap(),
                http2: true,
                keepalive: None,
            },
            Some(envoy),
            tx,
            token.clone(),
        ));
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .unwrap()
            .unwrap();
        match &*rx.borrow() {
            Some(Health::Unhealthy(why)) => {
                assert!(why.contains("Envoy is not ready"), "{why}");
                assert!(why.contains("config not received"), "{why}");
            }
            other => panic!("expected unhealthy, got {other:?}"),
        }
        token.cancel();
    }
}
