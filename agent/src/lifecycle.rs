//! The agent's one shutdown signal and its readiness guards.
//!
//! - [`Shutdown`]: SIGTERM, SIGINT and `/quitquitquit` all cancel the same token; the mode says
//!   whether Envoy is drained first ([`DrainMode::Graceful`]) or stopped at once
//!   ([`DrainMode::Immediate`], after `/quitquitquit` or once `/drain` already drained it).
//! - [`Readiness`]: named guards; `/healthz/ready` lists the ones still pending.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// How Envoy is stopped once shutdown begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainMode {
    /// Drain inbound listeners and wait (SIGTERM/SIGINT).
    Graceful,
    /// Stop Envoy now (`/quitquitquit`, or `/drain` already ran).
    Immediate,
}

/// The one shutdown token plus the drain mode.
#[derive(Debug, Clone)]
pub struct Shutdown {
    token: CancellationToken,
    mode: Arc<AtomicU8>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new(CancellationToken::new())
    }
}

impl Shutdown {
    pub fn new(token: CancellationToken) -> Self {
        Shutdown {
            token,
            mode: Arc::new(AtomicU8::new(0)),
        }
    }

    /// The token every component watches.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Starts shutdown with a graceful drain.
    pub fn trigger(&self) {
        self.token.cancel();
    }

    /// Marks the drain as done or unwanted: a later shutdown stops Envoy immediately.
    pub fn skip_drain(&self) {
        self.mode.store(1, Ordering::SeqCst);
    }

    /// Starts shutdown without a drain.
    pub fn trigger_immediate(&self) {
        self.skip_drain();
        self.token.cancel();
    }

    pub fn mode(&self) -> DrainMode {
        if self.mode.load(Ordering::SeqCst) == 1 {
            DrainMode::Immediate
        } else {
            DrainMode::Graceful
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.token.is_cancelled()
    }
}

/// Named readiness guards.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    pending: Arc<Mutex<BTreeMap<String, bool>>>,
}

/// Marks its name ready when [`ReadyGuard::ready`] is called.
#[derive(Debug, Clone)]
pub struct ReadyGuard {
    name: String,
    pending: Arc<Mutex<BTreeMap<String, bool>>>,
}

impl Readiness {
    pub fn register(&self, name: &str) -> ReadyGuard {
        if let Ok(mut p) = self.pending.lock() {
            p.insert(name.to_string(), false);
        }
        ReadyGuard {
            name: name.to_string(),
            pending: self.pending.clone(),
        }
    }

    /// Names not ready yet, sorted.
    pub fn pending(&self) -> Vec<String> {
        self.pending
            .lock()
            .map(|p| {
                p.iter()
                    .filter(|(_, ready)| !**ready)
                    .map(|(n, _)| n.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl ReadyGuard {
    pub fn ready(&self) {
        if let Ok(mut p) = self.pending.lock() {
            p.insert(self.name.clone(), true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_and_modes() {
        let r = Readiness::default();
        let a = r.register("dns");
        let _b = r.register("envoy");
        assert_eq!(r.pending(), vec!["dns", "envoy"]);
        a.ready();
        assert_eq!(r.pending(), vec!["envoy"]);

        let s = Shutdown::default();
        assert_eq!(s.mode(), DrainMode::Graceful);
        s.trigger_immediate();
        assert!(s.is_shutting_down());
        assert_eq!(s.mode(), DrainMode::Immediate);
    }
}
