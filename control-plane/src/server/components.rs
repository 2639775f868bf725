//! The long-running parts of a server (its listeners' servers, the CA reloader), each run with
//! the shutdown token under one supervisor: when one fails, or stops before shutdown was asked
//! for, the server reports not ready, the others are stopped, and [`Components::wait`] returns
//! the reason (the binary then exits non-zero).

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Why a component stopped.
#[derive(Debug, thiserror::Error)]
pub enum Stopped {
    #[error("failed: {0}")]
    Failed(#[source] tonic::transport::Error),
    #[error("stopped before shutdown")]
    Early,
    #[error("panicked: {0}")]
    Panicked(#[source] tokio::task::JoinError),
}

/// A component that stopped on its own.
#[derive(Debug, thiserror::Error)]
#[error("{name} {reason}; istiod-lite stops")]
pub struct Failure {
    pub name: &'static str,
    #[source]
    pub reason: Stopped,
}

/// The running components, the readiness they make up and the token that stops them.
pub struct Components {
    tasks: JoinSet<(&'static str, Result<(), Stopped>)>,
    ready: watch::Sender<bool>,
    cancel: CancellationToken,
}

impl Components {
    /// No component yet; not ready until [`Components::started`].
    pub fn new(cancel: CancellationToken) -> Components {
        Components {
            tasks: JoinSet::new(),
            ready: watch::channel(false).0,
            cancel,
        }
    }

    /// Readiness as `/ready` reports it.
    pub fn readiness(&self) -> watch::Receiver<bool> {
        self.ready.subscribe()
    }

    /// Runs `component` (which gets the shutdown token) as `name`.
    pub fn spawn<F, Fut>(&mut self, name: &'static str, component: F)
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = Result<(), Stopped>> + Send + 'static,
    {
        // The component in its own task, so that a panic is reported under its name.
        let run = tokio::spawn(component(self.cancel.clone()));
        self.tasks.spawn(async move {
            match run.await {
                Ok(result) => (name, result),
                Err(e) => (name, Err(Stopped::Panicked(e))),
            }
        });
    }

    /// Every component is running: ready.
    pub fn started(&self) {
        self.ready.send_replace(true);
    }

    /// Waits until every component has stopped. The first one to stop on its own (an error,
    /// an early end, a panic) makes the server not ready and stops the rest; its reason is
    /// returned.
    pub async fn wait(mut self) -> Result<(), Failure> {
        let mut failure = None;
        while let Some(joined) = self.tasks.join_next().await {
            let (name, result) = match joined {
                Ok(stopped) => stopped,
                Err(e) => ("a component", Err(Stopped::Panicked(e))),
            };
            let reason = match result {
                Err(reason) => reason,
                Ok(()) if self.cancel.is_cancelled() => continue,
                Ok(()) => Stopped::Early,
            };
            if failure.is_none() {
                tracing::error!(component = name, error = %reason, "istiod-lite is not ready and stops");
                self.ready.send_replace(false);
                self.cancel.cancel();
                failure = Some(Failure { name, reason });
            }
        }
        failure.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener's server that dies: not ready, the others stopped, the reason returned.
    #[tokio::test]
    async fn a_dead_component_makes_the_server_not_ready_and_stops_the_rest() {
        let cancel = CancellationToken::new();
        let mut c = Components::new(cancel.clone());
        let ready = c.readiness();
        let (die_tx, die_rx) = tokio::sync::oneshot::channel::<()>();
        c.spawn("monitoring", |cancel| async move {
            cancel.cancelled().await;
            Ok(())
        });
        c.spawn("grpc", |_| async move {
            let _ = die_rx.await;
            Err(Stopped::Early)
        });
        c.started();
        assert!(*ready.borrow());
        let waited = tokio::spawn(c.wait());
        die_tx.send(()).expect("send");
        let failure = waited.await.expect("join").expect_err("must fail");
        assert_eq!(failure.name, "grpc");
        assert!(!*ready.borrow(), "still ready after a component died");
        assert!(
            cancel.is_cancelled(),
            "the other components were not stopped"
        );
        assert!(failure.to_string().contains("grpc"), "{failure}");
    }

    #[tokio::test]
    async fn a_component_ending_before_shutdown_is_a_failure_and_one_after_is_not() {
        let cancel = CancellationToken::new();
        let mut c = Components::new(cancel.clone());
        c.spawn("secure-grpc", |_| async { Ok(()) });
        let failure = c.wait().await.expect_err("must fail");
        assert!(matches!(failure.reason, Stopped::Early), "{failure}");

        let cancel = CancellationToken::new();
        let mut c = Components::new(cancel.clone());
        c.spawn("grpc", |cancel| async move {
            cancel.cancelled().await;
            Ok(())
        });
        c.spawn("monitoring", |cancel| async move {
            cancel.cancelled().await;
            Ok(())
        });
        cancel.cancel();
        assert!(c.wait().await.is_ok());
    }

    #[tokio::test]
    async fn a_panicking_component_is_named() {
        let mut c = Components::new(CancellationToken::new());
        c.spawn("reloader", |_| async { panic!("boom") });
        let failure = c.wait().await.expect_err("must fail");
        assert_eq!(failure.name, "reloader");
        assert!(matches!(failure.reason, Stopped::Panicked(_)), "{failure}");
    }
}
