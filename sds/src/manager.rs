//! The secret cache: one watch channel per resource name, one CSR at a time, and the
//! CA-issued workload certificate published to every subscriber.
//!
//! The parts: [`rotation`] schedules re-issuing (grace-period ratio with jitter, backoff on
//! failure while the valid certificate keeps being served) and the warm-up; [`file_secrets`]
//! reads and watches file-mounted certificates; [`output_certs`] writes `OUTPUT_CERTS`.

mod file_secrets;
mod output_certs;
mod rotation;

#[cfg(test)]
use output_certs::write_atomic;
#[cfg(test)]
use rotation::rotation_backoff_cap;
use rotation::rotation_time;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio::sync::{Notify, watch};

use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{error, info, warn};

use crate::ca::CaClient;
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::csr;
use crate::metrics::Metrics;
use crate::pem::parse_certs;
use crate::timestamp::rfc3339;
use crate::x509::cert_validity;
use crate::{Error, FILE_ROOT_PREFIX, ROOT_CA, WORKLOAD_KEY_CERT};

/// A ProxyConfig `caCertificatesPem` entry that holds no PEM certificate.
#[derive(Debug, thiserror::Error)]
#[error("caCertificatesPem[{index}]: expected PEM certificates, got {len} bytes that are not")]
pub struct NotCertificates {
    pub index: usize,
    pub len: usize,
}

/// One resource as served to Envoy.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretItem {
    pub resource_name: String,
    /// Leaf first; for CA-issued certs the chain includes the root, as Istio's does.
    pub cert_chain_pem: Vec<u8>,
    pub private_key_pem: Vec<u8>,
    /// Trust bundle (set for `ROOTCA`/`file-root:*`, and for CA-issued workload certs).
    pub root_cert_pem: Vec<u8>,
    pub expire_time: SystemTime,
    pub created_time: SystemTime,
}

impl SecretItem {
    /// True for trust-bundle resources (served as a validation context).
    pub fn is_root(&self) -> bool {
        is_root_name(&self.resource_name)
    }
}

/// `ROOTCA` and `file-root:*` are trust bundles; everything else is a key and certificate.
pub fn is_root_name(name: &str) -> bool {
    name == ROOT_CA || name.starts_with(FILE_ROOT_PREFIX)
}

impl std::fmt::Debug for SecretItem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretItem")
            .field("resource_name", &self.resource_name)
            .field("cert_chain_len", &self.cert_chain_pem.len())
            .field("root_cert_len", &self.root_cert_pem.len())
            .field("expire_time", &self.expire_time)
            .finish_non_exhaustive()
    }
}

/// The CA-issued workload identity.
struct Workload {
    cert_chain_pem: Vec<u8>,
    private_key_pem: Vec<u8>,
    root_cert_pem: Vec<u8>,
    expire_time: SystemTime,
    created_time: SystemTime,
    /// When to re-issue: a wall-clock time, re-checked (see [`crate::clock`]).
    rotate_at: SystemTime,
}

type Slot = watch::Sender<Option<Arc<SecretItem>>>;

/// Names kept before the unwatched ones are dropped: every name a peer on the SDS socket asks
/// for gets a slot, so without a bound ever new names grow the map without end. A name no
/// stream watches is dropped once this many are held (asked again, it is rebuilt from the
/// workload certificate or its files); `default` and `ROOTCA` always stay.
const MAX_UNWATCHED_NAMES: usize = 1024;

/// The least validity a CA-issued leaf must have left to be taken (see
/// [`Inner::build_workload`]).
const MIN_LEAF_VALIDITY: std::time::Duration = std::time::Duration::from_secs(1);

/// Makes room for one more name (see [`MAX_UNWATCHED_NAMES`]).
fn make_room(channels: &mut HashMap<String, Slot>) {
    if channels.len() < MAX_UNWATCHED_NAMES {
        return;
    }
    channels
        .retain(|name, tx| tx.receiver_count() > 0 || name == ROOT_CA || name == WORKLOAD_KEY_CERT);
}

#[derive(Default)]
struct State {
    workload: Option<Arc<Workload>>,
    channels: HashMap<String, Slot>,
    rotation_started: bool,
    watcher: Option<notify::RecommendedWatcher>,
    watched_dirs: HashSet<PathBuf>,
    /// ProxyConfig `caCertificatesPem` from PCDS: extra trust anchors merged into `ROOTCA`
    /// (one PEM certificate each, sorted, no duplicates).
    config_trust: Vec<String>,
}

struct Inner {
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    ca: Option<CaClient>,
    state: Mutex<State>,
    /// Serialises CSRs: concurrent requests wait here and then find the cache filled.
    generating: tokio::sync::Mutex<()>,
    rotation_wake: Notify,
    shutdown: CancellationToken,
    clock: Arc<dyn Clock>,
}

/// Secret cache and rotation. Cheap to clone; background tasks stop when the last clone is
/// dropped or [`SecretManager::shutdown`] is called.
#[derive(Clone)]
pub struct SecretManager {
    inner: Arc<Inner>,
    _guard: Arc<DropGuard>,
}

impl SecretManager {
    /// A manager for `config`; its CA client (none with file-mounted certificates) is built
    /// from the same config.
    pub fn new(config: Arc<Config>, metrics: Arc<Metrics>) -> Result<SecretManager, Error> {
        SecretManager::with_clock(config, metrics, Arc::new(SystemClock))
    }

    /// [`SecretManager::new`] measuring certificate deadlines on `clock` (tests jump it).
    pub(crate) fn with_clock(
        config: Arc<Config>,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Result<SecretManager, Error> {
        let ca = if config.file_mounted_certs.is_some() || config.serve_only_files {
            None
        } else {
            Some(CaClient::new(&config, metrics.clone())?)
        };
        let shutdown = CancellationToken::new();
        Ok(SecretManager {
            _guard: Arc::new(shutdown.clone().drop_guard()),
            inner: Arc::new(Inner {
                config,
                metrics,
                ca,
                state: Mutex::new(State::default()),
                generating: tokio::sync::Mutex::new(()),
                rotation_wake: Notify::new(),
                shutdown,
                clock,
            }),
        })
    }

    /// The configuration this manager runs with.
    pub(crate) fn config(&self) -> &Arc<Config> {
        &self.inner.config
    }

    /// Returns the secret for `resource_name`, generating it (CSR) or reading its files when
    /// not cached. Every new value is also published to every subscriber (the SDS server's
    /// streams).
    pub async fn fetch(&self, resource_name: &str) -> Result<Arc<SecretItem>, Error> {
        Inner::fetch(&self.inner, resource_name).await
    }

    /// Spawns the warm-up: `default` then `ROOTCA`, each retried with exponential backoff
    /// (500 ms doubling to the max backoff) until it succeeds. Needs a tokio runtime.
    pub fn warm(&self) {
        if self.inner.config.serve_only_files {
            tracing::debug!("serving file certificates only; nothing to warm");
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            error!("SecretManager::warm called outside a tokio runtime; skipping warm-up");
            return;
        };
        rt.spawn(rotation::warm_up(self.inner.clone()));
    }

    /// A receiver that sees every new value of `resource_name` (`None` until the first).
    /// Subscribing does not fetch; call [`SecretManager::fetch`] for that.
    pub(crate) fn subscribe(
        &self,
        resource_name: &str,
    ) -> watch::Receiver<Option<Arc<SecretItem>>> {
        let mut st = lock(&self.inner.state);
        if let Some(tx) = st.channels.get(resource_name) {
            return tx.subscribe();
        }
        let initial = match &st.workload {
            Some(w) if self.inner.file_source(resource_name).is_none() => {
                Some(Arc::new(workload_item(resource_name, w, &st.config_trust)))
            }
            _ => None,
        };
        let (tx, rx) = watch::channel(initial);
        make_room(&mut st.channels);
        st.channels.insert(resource_name.to_string(), tx);
        rx
    }

    /// ProxyConfig `caCertificatesPem` from PCDS (`PROXY_CONFIG_XDS_AGENT`): extra trust
    /// anchors merged into `ROOTCA`. As Istio's agent: an unchanged set does nothing; a new one
    /// re-publishes `ROOTCA` and re-issues the workload certificate. An entry that holds no PEM
    /// certificate is an error (the response is NACKed).
    pub fn set_config_trust_bundle(&self, pems: &[String]) -> Result<(), NotCertificates> {
        let mut anchors = std::collections::BTreeSet::new();
        for (i, pem) in pems.iter().enumerate() {
            let blocks = pem_blocks(pem);
            if blocks.is_empty() || blocks.iter().any(|b| parse_certs(b.as_bytes()).is_empty()) {
                return Err(NotCertificates {
                    index: i,
                    len: pem.len(),
                });
            }
            anchors.extend(blocks);
        }
        let anchors: Vec<String> = anchors.into_iter().collect();
        let workload = {
            let mut st = lock(&self.inner.state);
            if st.config_trust == anchors {
                return Ok(());
            }
            st.config_trust = anchors;
            st.workload.clone()
        };
        info!(
            anchors = lock(&self.inner.state).config_trust.len(),
            "ProxyConfig trust anchors changed; pushing ROOTCA"
        );
        let rt = tokio::runtime::Handle::try_current();
        let subscribed = lock(&self.inner.state).channels.contains_key(ROOT_CA);
        if let Some(src) = self.inner.file_source(ROOT_CA) {
            // A mounted root: read again, merged.
            if subscribed && let Ok(rt) = &rt {
                let inner = self.inner.clone();
                rt.spawn(async move {
                    if let Err(e) = inner.fetch_file(ROOT_CA, &src).await {
                        warn!(error = %e, "re-reading ROOTCA after a trust change failed");
                    }
                });
            }
        }
        let Some(w) = workload else {
            return Ok(());
        };
        if self.inner.file_source(ROOT_CA).is_none() && subscribed {
            self.inner.publish(ROOT_CA, self.inner.item(ROOT_CA, &w));
        }
        if let Ok(rt) = rt {
            let inner = self.inner.clone();
            rt.spawn(async move {
                if let Err(e) = inner.generate(Some(w.created_time)).await {
                    warn!(error = %e, "re-issuing the workload certificate after a trust change failed");
                }
            });
        }
        Ok(())
    }

    /// Stops background tasks (rotation, warm-up, file watches).
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn workload_item(name: &str, w: &Workload, config_trust: &[String]) -> SecretItem {
    if name == ROOT_CA {
        SecretItem {
            resource_name: name.to_string(),
            cert_chain_pem: Vec::new(),
            private_key_pem: Vec::new(),
            root_cert_pem: merge_trust(&w.root_cert_pem, config_trust),
            expire_time: w.expire_time,
            created_time: w.created_time,
        }
    } else {
        SecretItem {
            resource_name: name.to_string(),
            cert_chain_pem: w.cert_chain_pem.clone(),
            private_key_pem: w.private_key_pem.clone(),
            root_cert_pem: w.root_cert_pem.clone(),
            expire_time: w.expire_time,
            created_time: w.created_time,
        }
    }
}

impl Inner {
    /// The secret `name` of workload `w`, `ROOTCA` with the PCDS trust anchors merged in.
    fn item(&self, name: &str, w: &Workload) -> SecretItem {
        let config_trust = lock(&self.state).config_trust.clone();
        workload_item(name, w, &config_trust)
    }

    async fn fetch(self: &Arc<Self>, name: &str) -> Result<Arc<SecretItem>, Error> {
        if self.shutdown.is_cancelled() {
            return Err(Error::Closed);
        }
        if let Some(src) = self.file_source(name) {
            return self.fetch_file(name, &src).await;
        }
        let cached = lock(&self.state).workload.clone();
        let w = match cached {
            // An expired certificate is never served as if valid (a host suspended past its
            // NotAfter): it is replaced first, and the error is returned if that fails.
            Some(w) if w.expire_time <= self.clock.now() => {
                warn!(expired_at = %rfc3339(w.expire_time), "the cached certificate has expired; re-issuing before serving");
                self.rotation_wake.notify_one();
                self.generate(Some(w.created_time)).await?
            }
            Some(w) => return Ok(self.publish(name, self.item(name, &w))),
            None => self.generate(None).await?,
        };
        Ok(self.publish(name, self.item(name, &w)))
    }

    /// Publishes `item` under `name` unless an equal value is already there; returns the
    /// value now held (so equal items keep their identity).
    fn publish(&self, name: &str, item: SecretItem) -> Arc<SecretItem> {
        let mut st = lock(&self.state);
        if !st.channels.contains_key(name) {
            make_room(&mut st.channels);
        }
        let tx = st
            .channels
            .entry(name.to_string())
            .or_insert_with(|| watch::channel(None).0);
        if let Some(cur) = tx.borrow().as_ref()
            && **cur == item
        {
            return cur.clone();
        }
        let item = Arc::new(item);
        tx.send_replace(Some(item.clone()));
        if !item.cert_chain_pem.is_empty() || item.is_root() {
            self.metrics.set_expiry(name, item.expire_time);
        }
        item
    }

    /// Generates a new workload certificate. With `replace = Some(created)`, a new one is made
    /// only if the cached one is still the one created then (rotation); with `None`, only if
    /// nothing is cached (first request). Concurrent callers share one CSR.
    async fn generate(
        self: &Arc<Self>,
        replace: Option<SystemTime>,
    ) -> Result<Arc<Workload>, Error> {
        let _one = self.generating.lock().await;
        let cached = lock(&self.state).workload.clone();
        match (&cached, replace) {
            (Some(w), None) => return Ok(w.clone()),
            (Some(w), Some(created)) if w.created_time != created => return Ok(w.clone()),
            _ => {}
        }
        let Some(ca) = &self.ca else {
            if self.config.serve_only_files {
                return Err(Error::FilesOnly {
                    socket: self.config.socket_path.display().to_string(),
                });
            }
            return Err(Error::File {
                path: self.config.file_mounted_certs.as_ref().map(|c| c.cert_chain.display().to_string()).unwrap_or_default(),
                reason: "file-mounted certificates are configured but not readable; the CA is not used in this mode".to_string(),
            });
        };
        let identity = self.config.spiffe_id();
        let (alg, pkcs8) = (self.config.key_algorithm, self.config.pkcs8_key);
        let kc = tokio::task::spawn_blocking(move || csr::generate(&identity, alg, pkcs8))
            .await
            .map_err(|e| Error::KeyGen {
                algorithm: format!("{alg:?}"),
                reason: e.to_string(),
            })??;
        let chain = ca.sign(&kc.csr_pem).await?;
        let w = Arc::new(self.build_workload(&chain, kc.private_key_pem)?);
        info!(
            identity = %self.config.spiffe_id(),
            expires = %rfc3339(w.expire_time),
            rotate_in = ?w.rotate_at.duration_since(self.clock.now()).unwrap_or_default(),
            "workload certificate issued"
        );
        let root_changed = cached
            .as_ref()
            .is_none_or(|c| c.root_cert_pem != w.root_cert_pem);
        let names: Vec<String> = {
            let mut st = lock(&self.state);
            st.workload = Some(w.clone());
            st.channels.keys().cloned().collect()
        };
        for name in names.iter().filter(|n| self.file_source(n).is_none()) {
            if name == ROOT_CA {
                if root_changed {
                    info!("root certificate changed; pushing ROOTCA");
                    self.publish(name, self.item(name, &w));
                }
            } else {
                self.publish(name, self.item(name, &w));
            }
        }
        self.metrics.set_expiry(WORKLOAD_KEY_CERT, w.expire_time);
        self.write_output(&w).await;
        self.start_rotation();
        self.rotation_wake.notify_one();
        Ok(w)
    }

    fn build_workload(&self, chain: &[String], key: Vec<u8>) -> Result<Workload, Error> {
        let invalid = |reason: String| Error::InvalidResponse {
            addr: self.config.ca_addr.clone(),
            reason,
        };
        let mut cert_chain_pem = Vec::new();
        for c in chain {
            cert_chain_pem.extend_from_slice(c.as_bytes());
            if !c.ends_with('\n') {
                cert_chain_pem.push(b'\n');
            }
        }
        let leaf = parse_certs(chain[0].as_bytes())
            .into_iter()
            .next()
            .ok_or_else(|| invalid("the first cert_chain entry is not a PEM certificate".into()))?;
        let (_, expire_time) = cert_validity(&leaf)
            .ok_or_else(|| invalid("the leaf certificate does not parse".into()))?;
        let root = chain
            .last()
            .map(|s| s.as_bytes().to_vec())
            .unwrap_or_default();
        if parse_certs(&root).is_empty() {
            return Err(invalid(
                "the last cert_chain entry (the root) is not a PEM certificate".into(),
            ));
        }
        let created_time = self.clock.now();
        // A leaf that is already expired (or about to be) is no answer: taken, its rotation
        // time is already past and the re-issue would run again at once, in a loop against
        // the CA. As an error it is retried with backoff, and a still-valid certificate keeps
        // being served meanwhile.
        if expire_time <= created_time + MIN_LEAF_VALIDITY {
            return Err(invalid(format!(
                "the leaf certificate expires at {}, {MIN_LEAF_VALIDITY:?} or less from now ({}); is the CA's clock right?",
                rfc3339(expire_time),
                rfc3339(created_time),
            )));
        }
        let rotate_at = rotation_time(
            created_time,
            expire_time,
            self.config.grace_ratio,
            self.config.grace_ratio_jitter,
        );
        Ok(Workload {
            cert_chain_pem,
            private_key_pem: key,
            root_cert_pem: root,
            expire_time,
            created_time,
            rotate_at,
        })
    }
}

/// The PEM certificate blocks of `pem`, each trimmed.
fn pem_blocks(pem: &str) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = pem;
    while let Some(start) = rest.find("-----BEGIN CERTIFICATE-----") {
        let Some(end) = rest[start..].find(END) else {
            break;
        };
        let stop = start + end + END.len();
        out.push(rest[start..stop].to_string());
        rest = &rest[stop..];
    }
    out
}

/// `root` with the `extra` anchors, as Istio merges ProxyConfig's: every certificate once,
/// sorted, one per line. `root` as it is when there are none.
fn merge_trust(root: &[u8], extra: &[String]) -> Vec<u8> {
    if extra.is_empty() {
        return root.to_vec();
    }
    let mut all: std::collections::BTreeSet<String> = pem_blocks(&String::from_utf8_lossy(root))
        .into_iter()
        .collect();
    all.extend(extra.iter().cloned());
    let mut out = Vec::new();
    for cert in all {
        out.extend_from_slice(cert.as_bytes());
        out.push(b'\n');
    }
    out
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
