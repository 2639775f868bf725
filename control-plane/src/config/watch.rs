//! Watches the config directory with `notify`, debounces changes (`PILOT_DEBOUNCE_AFTER` quiet
//! time, `PILOT_DEBOUNCE_MAX` at most) and publishes a new [`Revision`] when the validated config
//! changed. It knows nothing of the mesh model or of xDS: the model builds its snapshot from each
//! revision (`model::follow`), the xDS server generates from those snapshots.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use notify::Watcher as _;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Config, ConfigError, Store};

/// A validated config as the watcher published it, with the version it is in force under.
#[derive(Clone, Debug)]
pub struct Revision {
    /// `<unix seconds>/<n>`, `n` counting published revisions from 1 (the pushes' version).
    pub version: String,
    /// When it was loaded: convergence time is measured from here.
    pub loaded: std::time::Instant,
    pub config: Arc<Config>,
}

impl Revision {
    /// Revision `n` of `config`, loaded now.
    pub fn new(config: Arc<Config>, n: u64) -> Revision {
        let secs = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Revision {
            version: format!("{secs}/{n}"),
            loaded: std::time::Instant::now(),
            config,
        }
    }
}

/// What `/debug/configz` shows about the config directory.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ConfigStatus {
    /// Version of the revision in force.
    pub version: String,
    pub objects: usize,
    /// Documents rejected at the last reload (their files' last good config is in force).
    pub errors: Vec<ConfigError>,
}

/// Inputs of [`Watcher::start`].
pub struct WatcherInputs {
    pub dir: PathBuf,
    pub debounce_after: Duration,
    pub debounce_max: Duration,
}

/// The running watcher: receivers for the config revisions and the config status.
pub struct Watcher {
    pub revisions: watch::Receiver<Arc<Revision>>,
    pub status: watch::Receiver<Arc<ConfigStatus>>,
}

/// Errors starting the watcher.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("cannot watch config dir {dir}: {source}")]
    Notify {
        dir: PathBuf,
        #[source]
        source: notify::Error,
    },
    #[error("config dir {0} does not exist or is not a directory")]
    NotADir(PathBuf),
}

impl Watcher {
    /// Loads the directory once (version 1), then watches it until `cancel`.
    pub fn start(inputs: WatcherInputs, cancel: CancellationToken) -> Result<Watcher, WatchError> {
        if !inputs.dir.is_dir() {
            return Err(WatchError::NotADir(inputs.dir));
        }
        let mut store = Store::default();
        let config = store.reload(&inputs.dir);
        let mut version = 1u64;
        let rev = Arc::new(Revision::new(Arc::new(config), version));
        let status = Arc::new(ConfigStatus {
            version: rev.version.clone(),
            objects: rev.config.len(),
            errors: store.errors().to_vec(),
        });
        tracing::info!(version = %rev.version, objects = rev.config.len(), errors = store.errors().len(), "config loaded");
        let (rev_tx, rev_rx) = watch::channel(rev);
        let (status_tx, status_rx) = watch::channel(status);

        let (ev_tx, mut ev_rx) = mpsc::unbounded_channel::<()>();
        let mut fs_watcher =
            notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
                Ok(ev) if ev.kind.is_access() => {}
                Ok(_) => {
                    let _ = ev_tx.send(());
                }
                Err(e) => tracing::warn!(error = %e, "config watch error"),
            })
            .map_err(|source| WatchError::Notify {
                dir: inputs.dir.clone(),
                source,
            })?;
        fs_watcher
            .watch(&inputs.dir, notify::RecursiveMode::Recursive)
            .map_err(|source| WatchError::Notify {
                dir: inputs.dir.clone(),
                source,
            })?;

        let dir = inputs.dir;
        let (after, max) = (inputs.debounce_after, inputs.debounce_max);
        tokio::spawn(async move {
            let _keep = fs_watcher;
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    ev = ev_rx.recv() => if ev.is_none() { return },
                }
                // Debounce: wait for `after` of quiet, but no longer than `max` in total.
                let first = Instant::now();
                let mut last = first;
                let mut events = 1u64;
                loop {
                    let deadline = (last + after).min(first + max);
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep_until(deadline) => break,
                        ev = ev_rx.recv() => match ev {
                            Some(()) => { last = Instant::now(); events += 1; }
                            None => return,
                        },
                    }
                }
                let config = store.reload(&dir);
                let current = rev_tx.borrow().clone();
                let changed = *current.config != config;
                if changed {
                    version += 1;
                    let rev = Arc::new(Revision::new(Arc::new(config), version));
                    tracing::info!(version = %rev.version, objects = rev.config.len(), events,
                        debounced_ms = first.elapsed().as_millis() as u64, "config changed: new revision");
                    rev_tx.send_replace(rev);
                }
                let rev = rev_tx.borrow().clone();
                status_tx.send_replace(Arc::new(ConfigStatus {
                    version: rev.version.clone(),
                    objects: rev.config.len(),
                    errors: store.errors().to_vec(),
                }));
            }
        });
        Ok(Watcher {
            revisions: rev_rx,
            status: status_rx,
        })
    }
}
