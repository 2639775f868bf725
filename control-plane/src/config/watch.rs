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

/// Inputs of [`Watcher::bind`].
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
    /// Loads the directory once (version 1) and starts watching it; the returned
    /// [`WatchLoop`] turns the changes into revisions once it runs.
    pub fn bind(inputs: WatcherInputs) -> Result<(Watcher, WatchLoop), WatchError> {
        if !inputs.dir.is_dir() {
            return Err(WatchError::NotADir(inputs.dir));
        }
        let mut store = Store::default();
        let config = store.reload(&inputs.dir);
        let rev = Arc::new(Revision::new(Arc::new(config), 1));
        let status = Arc::new(ConfigStatus {
            version: rev.version.clone(),
            objects: rev.config.len(),
            errors: store.errors().to_vec(),
        });
        tracing::info!(version = %rev.version, objects = rev.config.len(), errors = store.errors().len(), "config loaded");
        let (rev_tx, rev_rx) = watch::channel(rev);
        let (status_tx, status_rx) = watch::channel(status);

        let (ev_tx, ev_rx) = mpsc::unbounded_channel::<()>();
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
        let watch_loop = WatchLoop {
            _fs_watcher: fs_watcher,
            events: ev_rx,
            store,
            version: 1,
            dir: inputs.dir,
            after: inputs.debounce_after,
            max: inputs.debounce_max,
            rev_tx,
            status_tx,
        };
        let watcher = Watcher {
            revisions: rev_rx,
            status: status_rx,
        };
        Ok((watcher, watch_loop))
    }
}

/// The watched directory's changes, debounced, turned into config revisions.
pub struct WatchLoop {
    /// Watching as long as the loop lives.
    _fs_watcher: notify::RecommendedWatcher,
    events: mpsc::UnboundedReceiver<()>,
    store: Store,
    version: u64,
    dir: PathBuf,
    after: Duration,
    max: Duration,
    rev_tx: watch::Sender<Arc<Revision>>,
    status_tx: watch::Sender<Arc<ConfigStatus>>,
}

impl WatchLoop {
    /// Runs until `cancel` (or until the file watcher is gone).
    pub async fn run(mut self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                ev = self.events.recv() => if ev.is_none() { return },
            }
            let Some((first, events)) = self.debounce(&cancel).await else {
                return;
            };
            self.reload(first, events);
        }
    }

    /// Waits for `after` of quiet, but no longer than `max` in total, counting the events;
    /// `None` when cancelled or when the watcher is gone.
    async fn debounce(&mut self, cancel: &CancellationToken) -> Option<(Instant, u64)> {
        let first = Instant::now();
        let mut last = first;
        let mut events = 1u64;
        loop {
            let deadline = (last + self.after).min(first + self.max);
            tokio::select! {
                _ = cancel.cancelled() => return None,
                _ = tokio::time::sleep_until(deadline) => return Some((first, events)),
                ev = self.events.recv() => match ev {
                    Some(()) => { last = Instant::now(); events += 1; }
                    None => return None,
                },
            }
        }
    }

    /// Re-reads the directory: a new revision when the config changed, the status always.
    fn reload(&mut self, first: Instant, events: u64) {
        let config = self.store.reload(&self.dir);
        let current = self.rev_tx.borrow().clone();
        if *current.config != config {
            self.version += 1;
            let rev = Arc::new(Revision::new(Arc::new(config), self.version));
            tracing::info!(version = %rev.version, objects = rev.config.len(), events,
                debounced_ms = first.elapsed().as_millis() as u64, "config changed: new revision");
            self.rev_tx.send_replace(rev);
        }
        let rev = self.rev_tx.borrow().clone();
        self.status_tx.send_replace(Arc::new(ConfigStatus {
            version: rev.version.clone(),
            objects: rev.config.len(),
            errors: self.store.errors().to_vec(),
        }));
    }
}
