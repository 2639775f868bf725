//! The supervisor of a process's long-running components (the agent's DNS proxy, SDS server,
//! xDS proxy, health checker and status server; istiod-lite's gRPC, secure gRPC and monitoring
//! servers, config watcher and CA reloader).
//!
//! A component is a future that runs until it is told to stop. It stops for one of two reasons:
//! the process is stopping (its token, or the shutdown, is cancelled), which is fine; or on its
//! own (an error, a panic, or an end nobody asked for), which is a failure. A failure is logged
//! with its reason, marks the process not ready ([`Readiness::fail`]) and starts the shutdown,
//! so nothing runs on without the part that died (the agent's Envoy drains and exits instead of
//! running without DNS, certificates or config). The process then exits non-zero
//! ([`Components::stop`] returns the failures).

use std::collections::BTreeMap;
use std::fmt::Display;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Readiness, Shutdown};

/// The running components, their stop deadlines and what failed.
pub struct Components {
    shutdown: Shutdown,
    readiness: Readiness,
    token: CancellationToken,
    tasks: JoinSet<&'static str>,
    deadlines: BTreeMap<&'static str, Duration>,
    failures: Arc<Mutex<Vec<String>>>,
}

impl Components {
    pub fn new(shutdown: Shutdown, readiness: Readiness) -> Self {
        Components {
            shutdown,
            readiness,
            token: CancellationToken::new(),
            tasks: JoinSet::new(),
            deadlines: BTreeMap::new(),
            failures: Arc::default(),
        }
    }

    /// The token that stops the components: cancelled by [`Components::stop`]. It is not the
    /// shutdown's: the agent's components serve on while Envoy drains (the application keeps
    /// DNS, and Envoy its config and certificates), and are stopped once Envoy is gone.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Runs `component` until it ends; `deadline` is how long [`Components::stop`] waits for
    /// it once told to stop. A panic is a failure under its name.
    pub fn spawn<F, E>(&mut self, name: &'static str, deadline: Duration, component: F)
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: Display,
    {
        let (shutdown, readiness, token, failures) = (
            self.shutdown.clone(),
            self.readiness.clone(),
            self.token.clone(),
            self.failures.clone(),
        );
        self.deadlines.insert(name, deadline);
        self.tasks.spawn(async move {
            let result = AssertUnwindSafe(component).catch_unwind().await;
            let stopping = token.is_cancelled() || shutdown.is_shutting_down();
            let reason = match result {
                Err(panic) => Some(format!("panicked: {}", panic_message(&*panic))),
                Ok(Err(e)) => Some(e.to_string()),
                Ok(Ok(())) if !stopping => Some("stopped on its own".to_string()),
                Ok(Ok(())) => None,
            };
            if let Some(reason) = reason {
                tracing::error!(
                    component = name,
                    reason = %reason,
                    "component failed: not ready, shutting down"
                );
                readiness.fail(name, &reason);
                if let Ok(mut f) = failures.lock() {
                    f.push(format!("{name}: {reason}"));
                }
                shutdown.trigger();
            }
            name
        });
    }

    /// Resolves when a component has failed (never, if none does).
    pub async fn failed(&self) {
        self.shutdown.token().cancelled().await;
        // Shutdown started; it was a failure only if one was recorded.
        if self.failures.lock().map(|f| f.is_empty()).unwrap_or(true) {
            std::future::pending::<()>().await;
        }
    }

    /// Tells every component to stop and waits for each up to its own deadline (those past it
    /// are logged and abandoned). Returns the failures seen while running.
    pub async fn stop(mut self) -> Vec<String> {
        self.token.cancel();
        let start = Instant::now();
        let mut running = self.deadlines.clone();
        while !running.is_empty() {
            let Some(next) = running.values().min().map(|d| start + *d) else {
                break;
            };
            tokio::select! {
                joined = self.tasks.join_next() => match joined {
                    Some(Ok(name)) => {
                        running.remove(name);
                    }
                    Some(Err(e)) => {
                        tracing::error!(error = %e, "a component panicked");
                        if let Ok(mut f) = self.failures.lock() {
                            f.push(format!("a component panicked: {e}"));
                        }
                        // Caught in `spawn`; this one escaped it, its name lost: the deadlines
                        // decide the rest.
                    }
                    None => break,
                },
                _ = tokio::time::sleep_until(next) => {
                    let now = Instant::now();
                    running.retain(|name, deadline| {
                        let late = start + *deadline <= now;
                        if late {
                            tracing::warn!(component = name, ?deadline, "did not stop in time");
                        }
                        !late
                    });
                }
            }
        }
        self.tasks.abort_all();
        self.failures.lock().map(|f| f.clone()).unwrap_or_default()
    }
}

/// The message a panic was raised with, when it is a string.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a non-string payload")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn supervisor() -> (Components, Shutdown, Readiness) {
        let (shutdown, readiness) = (Shutdown::default(), Readiness::default());
        (
            Components::new(shutdown.clone(), readiness.clone()),
            shutdown,
            readiness,
        )
    }

    /// The finding of the hostile-peer review: a DNS listener that failed left SDS and the
    /// xDS proxy stopped while Envoy ran on. Now the failure shuts the agent down.
    #[tokio::test(start_paused = true)]
    async fn a_failed_component_starts_the_shutdown_and_says_why() {
        let (mut c, shutdown, readiness) = supervisor();
        let token = c.token();
        c.spawn("sds", Duration::from_secs(1), async move {
            token.cancelled().await;
            Ok::<(), &str>(())
        });
        c.spawn("dns", Duration::from_secs(1), async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            Err("UDP socket closed")
        });
        tokio::time::timeout(Duration::from_secs(10), c.failed())
            .await
            .expect("the failure is seen");
        assert!(shutdown.is_shutting_down(), "Envoy is told to drain");
        assert_eq!(readiness.not_ready(), ["dns failed: UDP socket closed"]);
        assert_eq!(c.stop().await, ["dns: UDP socket closed"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_component_that_ends_on_its_own_is_a_failure() {
        let (mut c, shutdown, _) = supervisor();
        c.spawn("xds", Duration::from_secs(1), async { Ok::<(), &str>(()) });
        tokio::time::timeout(Duration::from_secs(1), c.failed())
            .await
            .expect("the failure is seen");
        assert!(shutdown.is_shutting_down());
        assert_eq!(c.stop().await, ["xds: stopped on its own"]);
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_is_not_a_failure_and_each_deadline_holds() {
        let (mut c, shutdown, readiness) = supervisor();
        let token = c.token();
        c.spawn("sds", Duration::from_secs(1), async move {
            token.cancelled().await;
            Ok::<(), &str>(())
        });
        // Ignores the token: abandoned after its 2 s deadline.
        c.spawn("stuck", Duration::from_secs(2), async {
            std::future::pending::<Result<(), &str>>().await
        });
        shutdown.trigger();
        let started = Instant::now();
        assert!(c.stop().await.is_empty());
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        assert!(readiness.not_ready().is_empty());
        // No failure: `failed` never resolves.
        let (c, shutdown, _) = supervisor();
        shutdown.trigger();
        assert!(
            tokio::time::timeout(Duration::from_secs(60), c.failed())
                .await
                .is_err()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_component_is_a_failure_under_its_name() {
        let (mut c, shutdown, readiness) = supervisor();
        c.spawn("ca-reloader", Duration::from_secs(1), async { boom() });
        tokio::time::timeout(Duration::from_secs(1), c.failed())
            .await
            .expect("the panic is seen");
        assert!(shutdown.is_shutting_down());
        assert_eq!(
            readiness.not_ready(),
            ["ca-reloader failed: panicked: boom"]
        );
        assert_eq!(c.stop().await, ["ca-reloader: panicked: boom"]);
    }

    fn boom() -> Result<(), &'static str> {
        panic!("boom")
    }
}
