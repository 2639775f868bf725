//! One process's shutdown signal, readiness guards and long-running components, the same in
//! both binaries (the agent and istiod-lite):
//!
//! - [`Shutdown`]: every way of stopping (SIGTERM, SIGINT, the agent's `/quitquitquit`) cancels
//!   the same token; the mode says whether the served traffic is drained first
//!   ([`DrainMode::Graceful`]: the agent drains Envoy) or stopped at once
//!   ([`DrainMode::Immediate`]).
//! - [`Readiness`]: named guards, each with the reason it gives while pending; the readiness
//!   endpoint (the agent's `/healthz/ready`, istiod-lite's `/ready`) lists the reasons of the
//!   ones still pending and of the components that failed.
//! - [`Components`]: the long-running parts under one supervisor. One that fails (or ends
//!   before shutdown, or panics) marks the process not ready and starts its shutdown, with the
//!   reason logged; at the end each is stopped within its own deadline, and the failures are
//!   returned so that the process exits non-zero.

mod components;

pub use components::Components;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// How the served traffic (the agent's Envoy) is stopped once shutdown begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainMode {
    /// Drain inbound listeners and wait (SIGTERM/SIGINT).
    Graceful,
    /// Stop now (the agent's `/quitquitquit`, or its `/drain` already ran).
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

    /// Marks the drain as done or unwanted: a later shutdown stops immediately.
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

/// Named readiness guards. Each guard carries the reason the readiness endpoint gives while it
/// is pending, so the endpoint lists reasons without knowing the components.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    states: Arc<Mutex<BTreeMap<String, Check>>>,
}

#[derive(Debug, Clone)]
enum Check {
    Pending(String),
    Ready,
    Failed(String),
}

/// Marks its name ready when [`ReadyGuard::ready`] is called.
#[derive(Debug, Clone)]
pub struct ReadyGuard {
    name: String,
    states: Arc<Mutex<BTreeMap<String, Check>>>,
}

impl Readiness {
    /// A guard named `name`; until it is ready, the readiness endpoint says `pending_reason`.
    pub fn register(&self, name: &str, pending_reason: &str) -> ReadyGuard {
        self.set(name, Check::Pending(pending_reason.to_string()));
        ReadyGuard {
            name: name.to_string(),
            states: self.states.clone(),
        }
    }

    /// Marks `name` failed for good (a component that stopped): the process is not ready.
    pub fn fail(&self, name: &str, reason: &str) {
        self.set(name, Check::Failed(format!("{name} failed: {reason}")));
    }

    /// Why the process is not ready: failed components first, then pending guards, each sorted
    /// by name.
    pub fn not_ready(&self) -> Vec<String> {
        let Ok(states) = self.states.lock() else {
            return vec!["readiness state unavailable".into()];
        };
        let failed = states.values().filter_map(|c| match c {
            Check::Failed(r) => Some(r.clone()),
            _ => None,
        });
        let pending = states.values().filter_map(|c| match c {
            Check::Pending(r) => Some(r.clone()),
            _ => None,
        });
        failed.chain(pending).collect()
    }

    /// Names of the guards not ready yet (pending or failed), sorted.
    pub fn pending(&self) -> Vec<String> {
        self.states
            .lock()
            .map(|s| {
                s.iter()
                    .filter(|(_, c)| !matches!(c, Check::Ready))
                    .map(|(n, _)| n.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn set(&self, name: &str, check: Check) {
        if let Ok(mut s) = self.states.lock() {
            s.insert(name.to_string(), check);
        }
    }
}

impl ReadyGuard {
    pub fn ready(&self) {
        if let Ok(mut s) = self.states.lock() {
            // A failed component stays failed.
            if !matches!(s.get(&self.name), Some(Check::Failed(_))) {
                s.insert(self.name.clone(), Check::Ready);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_and_modes() {
        let r = Readiness::default();
        let a = r.register("dns", "DNS table not ready");
        let _b = r.register("envoy", "Envoy not ready");
        assert_eq!(r.pending(), vec!["dns", "envoy"]);
        assert_eq!(
            r.not_ready(),
            vec!["DNS table not ready", "Envoy not ready"]
        );
        a.ready();
        assert_eq!(r.pending(), vec!["envoy"]);
        r.fail("dns", "socket closed");
        a.ready();
        assert_eq!(
            r.not_ready(),
            vec!["dns failed: socket closed", "Envoy not ready"]
        );

        let s = Shutdown::default();
        assert_eq!(s.mode(), DrainMode::Graceful);
        s.trigger_immediate();
        assert!(s.is_shutting_down());
        assert_eq!(s.mode(), DrainMode::Immediate);
    }
}
