//! Picks up replaced plug-in `cacerts` while serving (Istio's istiod watches its plugged-in
//! certificates the same way): the directory is polled, a change is loaded once the files have
//! stayed the same for two polls in a row (an operator copies four files one after another), and
//! a set that does not load (a key that does not match its certificate, a missing file) leaves
//! the current CA in force and is reported once.

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use super::{Ca, CaFiles, Error};

/// The CA in force; cheap to clone, shared by every request handler.
#[derive(Clone, Debug)]
pub struct SharedCa {
    current: Arc<RwLock<Arc<Ca>>>,
}

impl SharedCa {
    pub fn new(ca: Ca) -> Self {
        SharedCa {
            current: Arc::new(RwLock::new(Arc::new(ca))),
        }
    }

    /// The CA signing now.
    pub fn current(&self) -> Arc<Ca> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn replace(&self, ca: Ca) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(ca);
    }
}

/// What one poll did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reloaded {
    /// The files are those of the CA in force (or unreadable right now).
    Unchanged,
    /// The files changed; waiting for them to stay the same for another poll.
    Settling,
    /// A new CA signs from now on.
    Replaced,
    /// The new files do not make a usable CA; the current one stays (reported once per content).
    Rejected,
}

/// Called with each CA right after it took over.
type OnReplace = Box<dyn Fn(&Ca) + Send + Sync>;

/// Polls the CA directory and installs the successor CA when the `cacerts` change.
pub struct Reloader {
    ca: SharedCa,
    pending: Option<CaFiles>,
    rejected: Option<CaFiles>,
    on_replace: Option<OnReplace>,
    /// When `previous-roots.json` next holds an expired root and is rewritten without it.
    prune_at: Option<SystemTime>,
}

/// How often the CA directory is read.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

impl Reloader {
    pub fn new(ca: SharedCa) -> Self {
        let prune_at = ca.current().next_root_expiry(SystemTime::now());
        Reloader {
            ca,
            pending: None,
            rejected: None,
            on_replace: None,
            prune_at,
        }
    }

    /// Rewrites `previous-roots.json` without the roots expired at `now`, once one has.
    pub fn prune_expired_roots_at(&mut self, now: SystemTime) {
        if self.prune_at.is_none_or(|t| t > now) {
            return;
        }
        let current = self.ca.current();
        if let Err(e) = current.persist_previous_roots_at(now) {
            tracing::warn!(error = %e, "cannot rewrite the previous CA roots without the expired ones");
        }
        self.prune_at = current.next_root_expiry(now);
    }

    /// Calls `f` with each new CA right after it took over (e.g. to re-issue the serving
    /// certificate).
    pub fn on_replace(mut self, f: impl Fn(&Ca) + Send + Sync + 'static) -> Self {
        self.on_replace = Some(Box::new(f));
        self
    }

    /// Reads the directory once and acts on what it finds.
    pub fn poll(&mut self) -> Result<Reloaded, Error> {
        self.prune_expired_roots_at(SystemTime::now());
        let current = self.ca.current();
        let dir = current.dir.clone();
        let Some(files) = CaFiles::read(&dir) else {
            // Mid-replacement (a file removed before its new version is written).
            self.pending = None;
            return Ok(Reloaded::Unchanged);
        };
        if &files == current.files() {
            self.pending = None;
            return Ok(Reloaded::Unchanged);
        }
        if self.rejected.as_ref() == Some(&files) {
            return Ok(Reloaded::Rejected);
        }
        if self.pending.as_ref() != Some(&files) {
            self.pending = Some(files);
            return Ok(Reloaded::Settling);
        }
        self.pending = None;
        match current.successor() {
            Ok(next) if next.files() == &files => {
                let retired_until = next.retired.iter().map(|r| r.until).max();
                tracing::info!(
                    dir = %dir.display(),
                    roots = next.roots.len(),
                    retired_roots = next.retired.len(),
                    old_roots_trusted_until = ?retired_until.map(humantime_utc),
                    "plug-in cacerts replaced: signing with the new CA; trust bundle holds the old and new roots"
                );
                let now = SystemTime::now();
                if let Err(e) = next.persist_previous_roots_at(now) {
                    tracing::warn!(error = %e, "cannot save the old CA roots: a restart during the overlap would drop them from the trust bundle");
                }
                self.prune_at = next.next_root_expiry(now);
                self.ca.replace(next);
                self.rejected = None;
                if let Some(f) = &self.on_replace {
                    f(&self.ca.current());
                }
                Ok(Reloaded::Replaced)
            }
            // Changed again while loading: look again next poll.
            Ok(_) => Ok(Reloaded::Settling),
            Err(e) => {
                self.rejected = Some(files);
                Err(e)
            }
        }
    }

    /// Polls every [`POLL_INTERVAL`] until `cancel`.
    pub async fn run(mut self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(POLL_INTERVAL) => {}
            }
            // Reading four small files: fine on the reactor.
            if let Err(e) = self.poll() {
                tracing::warn!(error = %e, "replaced plug-in cacerts are not usable; still signing with the previous CA");
            }
        }
    }
}

/// Seconds since the epoch, for logs.
fn humantime_utc(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}
