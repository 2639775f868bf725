//! The timer anchor and the timeout sweep of relayed queries: a periodic tick, running only
//! while queries flow, that moves relayed queries past their server's deadline on to the next
//! server (or finishes them), and keeps arming a query's timeout cheap.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ForwardError;
use super::chan::{Chan, Pending, Waiter};
use super::pool::UdpPool;
use crate::datagrams::{ClientReply, send_client_replies};

impl UdpPool {
    /// Notes a query for the timer anchor, starting it on first use.
    pub(super) fn touch(self: &Arc<Self>) {
        if !self.anchor_started.swap(true, Ordering::Relaxed) {
            let tick =
                (self.timeout / 10).clamp(Duration::from_millis(5), Duration::from_millis(100));
            tokio::spawn(anchor(Arc::downgrade(self), tick, self.stop.clone()));
        }
        if !self.busy.swap(true, Ordering::Relaxed) {
            self.wake_anchor.notify_one();
        }
    }

    /// Times out relayed queries past their server's deadline (each moves on to its next
    /// server); returns the client answers of those that finished.
    fn sweep(self: &Arc<Self>, now: Instant) -> Vec<ClientReply> {
        let chans: Vec<Arc<Chan>> = match self.live.lock() {
            Ok(mut live) => {
                live.retain(|c| c.strong_count() > 0);
                live.iter().filter_map(Weak::upgrade).collect()
            }
            Err(_) => return Vec::new(),
        };
        let mut expired = Vec::new();
        for chan in &chans {
            let Ok(mut pending) = chan.pending.lock() else {
                continue;
            };
            let ids: Vec<u16> = pending
                .iter()
                .filter(
                    |(_, p)| matches!(p.waiter, Waiter::Relay { deadline, .. } if deadline <= now),
                )
                .map(|(&id, _)| id)
                .collect();
            for id in ids {
                if let Some(Pending {
                    waiter: Waiter::Relay { state, .. },
                    ..
                }) = pending.remove(&id)
                {
                    self.relays.fetch_sub(1, Ordering::Relaxed);
                    expired.push((chan.server, state));
                }
            }
            chan.removed(&pending);
        }
        expired
            .into_iter()
            .filter_map(|(server, st)| {
                self.advance(st, Some(Err(ForwardError::Timeout { server })))
            })
            .collect()
    }
}

/// Keeps a timer armed earlier than any query's timeout while queries flow, so arming a query's
/// timeout never has to wake the runtime's driver: tokio does so (an eventfd write, then one
/// more epoll_wait) whenever a new timer is due before every armed one, which at light load is
/// every query. Also the sweep timing out relayed queries. Ticks every `tick` while there were
/// queries since the last tick or relays are pending, then waits for the next query: no
/// wake-ups when idle.
async fn anchor(pool: Weak<UdpPool>, tick: Duration, stop: CancellationToken) {
    let Some((busy, wake)) = pool
        .upgrade()
        .map(|p| (p.busy.clone(), p.wake_anchor.clone()))
    else {
        return;
    };
    let cancelled = stop.cancelled();
    tokio::pin!(cancelled);
    loop {
        tokio::select! {
            _ = wake.notified() => {}
            _ = &mut cancelled => return,
        }
        loop {
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = &mut cancelled => return,
            }
            let Some(pool) = pool.upgrade() else { return };
            let relays = pool.relays.load(Ordering::Relaxed) > 0;
            if relays {
                let replies = pool.sweep(Instant::now());
                drop(pool);
                send_client_replies(replies).await;
            }
            if !busy.swap(false, Ordering::Relaxed) && !relays {
                break;
            }
        }
    }
}
