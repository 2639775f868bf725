//! Snapshots that follow the config: one [`Snapshot`] per config [`Revision`] the watcher
//! publishes.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{MeshSettings, Snapshot};
use crate::config::Revision;

/// The snapshot of the current revision at once, then of every new one until `cancel` (or until
/// the revisions' sender is gone). Needs a tokio runtime.
#[cfg(test)]
fn follow(
    revisions: watch::Receiver<Arc<Revision>>,
    mesh: Arc<MeshSettings>,
    cancel: CancellationToken,
) -> watch::Receiver<Arc<Snapshot>> {
    let (rx, follower) = Follower::new(revisions, mesh);
    tokio::spawn(follower.run(cancel));
    rx
}

/// Turns each config revision into a snapshot, once it runs.
pub struct Follower {
    revisions: watch::Receiver<Arc<Revision>>,
    mesh: Arc<MeshSettings>,
    tx: watch::Sender<Arc<Snapshot>>,
}

impl Follower {
    /// The snapshot of the current revision at once (the receiver's first value).
    pub fn new(
        mut revisions: watch::Receiver<Arc<Revision>>,
        mesh: Arc<MeshSettings>,
    ) -> (watch::Receiver<Arc<Snapshot>>, Follower) {
        let first = revisions.borrow_and_update().clone();
        let (tx, rx) = watch::channel(Arc::new(Snapshot::from_revision(&first, mesh.clone())));
        let follower = Follower {
            revisions,
            mesh,
            tx,
        };
        (rx, follower)
    }

    /// Runs until `cancel` (or until the revisions' sender is gone).
    pub async fn run(mut self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = self.revisions.changed() => if changed.is_err() { return },
            }
            let rev = self.revisions.borrow_and_update().clone();
            let snap = Arc::new(Snapshot::from_revision(&rev, self.mesh.clone()));
            tracing::debug!(version = %snap.version, services = snap.services.len(), "new snapshot");
            self.tx.send_replace(snap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, parse_file};

    fn revision(yaml: &str, n: u64) -> Arc<Revision> {
        let config = Config::from_objects(parse_file("test.yaml", yaml).expect("valid yaml"));
        Arc::new(Revision::new(Arc::new(config), n))
    }

    const SE: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api, namespace: web}
spec:
  hosts: [api.example.com]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 198.18.0.5}]
"#;

    #[tokio::test]
    async fn every_revision_becomes_a_snapshot_with_its_version() {
        let (tx, rx) = watch::channel(revision("", 1));
        let cancel = CancellationToken::new();
        let mut snaps = follow(rx, Arc::new(MeshSettings::default()), cancel.clone());
        let first = snaps.borrow_and_update().clone();
        assert_eq!(first.version, tx.borrow().version);
        assert!(first.services.is_empty());

        tx.send_replace(revision(SE, 2));
        tokio::time::timeout(std::time::Duration::from_secs(5), snaps.changed())
            .await
            .expect("a new snapshot within 5s")
            .expect("sender alive");
        let second = snaps.borrow_and_update().clone();
        assert_eq!(second.version, tx.borrow().version);
        assert!(second.version.ends_with("/2"), "{}", second.version);
        assert_eq!(second.created, tx.borrow().loaded);
        assert_eq!(second.services.len(), 1);
        assert_eq!(second.services[0].host, "api.example.com");
        cancel.cancel();
    }
}
