//! When the workload certificate is re-issued: at Istio's grace-period ratio of its lifetime
//! (with jitter), at once when the CA root file changes, and with jittered exponential backoff
//! while the CA fails (the still-valid certificate keeps being served). Also the warm-up that
//! fetches `default` then `ROOTCA` at start.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use super::{Inner, lock};
use crate::clock::WALL_CLOCK_RECHECK;
use crate::timestamp::rfc3339;
use crate::{ROOT_CA, WORKLOAD_KEY_CERT};

const WARM_BACKOFF_START: Duration = Duration::from_millis(500);
pub(super) const ROTATE_BACKOFF_START: Duration = Duration::from_secs(1);

/// Fetches `default` then `ROOTCA`, each retried with exponential backoff (500 ms doubling to
/// the max backoff) until it succeeds or the manager shuts down.
pub(super) async fn warm_up(inner: Arc<Inner>) {
    for name in [WORKLOAD_KEY_CERT, ROOT_CA] {
        let mut backoff = WARM_BACKOFF_START;
        loop {
            match Inner::fetch(&inner, name).await {
                Ok(_) => {
                    debug!(resource = name, "warmed");
                    break;
                }
                Err(e) => {
                    warn!(resource = name, error = %e, retry_in = ?backoff, "warm-up failed");
                    tokio::select! {
                        _ = inner.shutdown.cancelled() => return,
                        _ = tokio::time::sleep(jitter(backoff, 0.1)) => {}
                    }
                    backoff = (backoff * 2).min(inner.config.max_backoff);
                }
            }
        }
    }
}

/// `d` scaled by a random factor in `1 ± frac`.
fn jitter(d: Duration, frac: f64) -> Duration {
    d.mul_f64(rand::random_range((1.0 - frac)..=(1.0 + frac)))
}

/// Resolves when the CA root file changed; never without a CA root file watch.
async fn root_file_changed(rx: &mut Option<watch::Receiver<u64>>) {
    if let Some(r) = rx
        && r.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// When to rotate: Istio's `rotateTime` (at `ratio` of the lifetime before expiry), with the
/// ratio jittered by ±`jitter_max`; a wall-clock time.
pub fn rotation_time(
    created: SystemTime,
    expire: SystemTime,
    ratio: f64,
    jitter_max: f64,
) -> SystemTime {
    let j = rand::random::<f64>() * jitter_max * if rand::random::<bool>() { 1.0 } else { -1.0 };
    let r = (ratio + j).clamp(0.0, 1.0);
    let lifetime = expire.duration_since(created).unwrap_or_default();
    expire - lifetime.mul_f64(r)
}

/// Longest pause between failed rotation attempts: a tenth of the certificate's lifetime, at
/// least [`ROTATE_BACKOFF_START`], at most `max`. A 24 h certificate backs off up to `max` (60 s);
/// a short-lived one retries often enough to rotate before it expires once the CA is back (a
/// 30 s certificate rotating at 15 s would otherwise wait 8 s, then 16 s, past its expiry).
pub fn rotation_backoff_cap(lifetime: Duration, max: Duration) -> Duration {
    (lifetime / 10).min(max).max(ROTATE_BACKOFF_START)
}

impl Inner {
    pub(super) fn start_rotation(self: &Arc<Self>) {
        {
            let mut st = lock(&self.state);
            if st.rotation_started {
                return;
            }
            st.rotation_started = true;
        }
        let inner = self.clone();
        tokio::spawn(async move { inner.rotation_loop().await });
    }

    async fn rotation_loop(self: Arc<Self>) {
        let mut root_changes = self.ca.as_ref().map(|ca| ca.root_changes());
        loop {
            let Some(w) = lock(&self.state).workload.clone() else {
                return;
            };
            // The deadline is wall-clock time: sleep at most WALL_CLOCK_RECHECK on the
            // monotonic clock (which stops during a host suspend), then look at the wall clock
            // again.
            let left = w
                .rotate_at
                .duration_since(self.clock.now())
                .unwrap_or_default();
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = self.rotation_wake.notified() => continue,
                _ = tokio::time::sleep(left.min(WALL_CLOCK_RECHECK)) => {
                    if self.clock.now() < w.rotate_at {
                        continue;
                    }
                }
                // A new trust bundle (root CA rotation): re-issue now rather than at the next
                // rotation, so Envoy gets the CA's new ROOTCA and, once the CA signs with the
                // new root, a certificate from it.
                _ = root_file_changed(&mut root_changes) => {
                    info!("CA root file changed; re-issuing the workload certificate");
                }
            }
            let cap = rotation_backoff_cap(
                w.expire_time
                    .duration_since(w.created_time)
                    .unwrap_or_default(),
                self.config.max_backoff,
            );
            let mut backoff = ROTATE_BACKOFF_START;
            loop {
                match self.generate(Some(w.created_time)).await {
                    Ok(_) => break,
                    Err(e) => {
                        let remaining = w
                            .expire_time
                            .duration_since(self.clock.now())
                            .unwrap_or_default();
                        let delay = jitter(backoff, 0.1);
                        if remaining.is_zero() {
                            error!(error = %e, retry_in = ?delay, expired_at = %rfc3339(w.expire_time), "certificate rotation failed and the served certificate has expired");
                        } else {
                            warn!(error = %e, retry_in = ?delay, still_valid_for = ?remaining, "certificate rotation failed; still serving the current certificate");
                        }
                        tokio::select! {
                            _ = self.shutdown.cancelled() => return,
                            _ = tokio::time::sleep(delay) => {}
                        }
                        backoff = (backoff * 2).min(cap);
                    }
                }
            }
        }
    }
}
