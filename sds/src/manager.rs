//! The secret cache: one watch channel per resource name, one CSR at a time, rotation at the
//! grace-period ratio with jitter, backoff on failure while the valid certificate keeps being
//! served, file-mounted certificates reloaded on change, and `OUTPUT_CERTS`.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use notify::Watcher;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{debug, error, info, warn};

use crate::ca::CaClient;
use crate::config::SYSTEM_ROOT_CANDIDATES;
use crate::csr;
use crate::{
    Config, Error, FILE_CERT_PREFIX, FILE_ROOT_PREFIX, Metrics, ROOT_CA, WORKLOAD_KEY_CERT,
};

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
    rotate_at: Instant,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum FileSource {
    KeyCert { cert: PathBuf, key: PathBuf },
    Root(PathBuf),
    SystemRoot,
}

impl FileSource {
    fn paths(&self) -> Vec<PathBuf> {
        match self {
            FileSource::KeyCert { cert, key } => vec![cert.clone(), key.clone()],
            FileSource::Root(p) => vec![p.clone()],
            FileSource::SystemRoot => system_root_path().into_iter().collect(),
        }
    }
}

type Slot = watch::Sender<Option<Arc<SecretItem>>>;

#[derive(Default)]
struct State {
    workload: Option<Arc<Workload>>,
    channels: HashMap<String, Slot>,
    rotation_started: bool,
    watcher: Option<notify::RecommendedWatcher>,
    watched_dirs: HashSet<PathBuf>,
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
}

/// Secret cache and rotation. Cheap to clone; background tasks stop when the last clone is
/// dropped or [`SecretManager::shutdown`] is called.
#[derive(Clone)]
pub struct SecretManager {
    inner: Arc<Inner>,
    _guard: Arc<DropGuard>,
}

const WARM_BACKOFF_START: Duration = Duration::from_millis(500);
const ROTATE_BACKOFF_START: Duration = Duration::from_secs(1);
const FILE_RETRY_TOTAL: Duration = Duration::from_secs(10);

impl SecretManager {
    pub fn new(config: Arc<Config>, metrics: Arc<Metrics>) -> Result<SecretManager, Error> {
        let ca = if config.file_mounted_certs.is_some() {
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
            }),
        })
    }

    /// The configuration this manager runs with.
    pub fn config(&self) -> &Arc<Config> {
        &self.inner.config
    }

    /// Returns the secret for `resource_name`, generating it (CSR) or reading its files when
    /// not cached. Every new value is also published to [`SecretManager::subscribe`]rs.
    pub async fn fetch(&self, resource_name: &str) -> Result<Arc<SecretItem>, Error> {
        Inner::fetch(&self.inner, resource_name).await
    }

    /// Spawns the warm-up: `default` then `ROOTCA`, each retried with exponential backoff
    /// (500 ms doubling to the max backoff) until it succeeds. Needs a tokio runtime.
    pub fn warm(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            error!("SecretManager::warm called outside a tokio runtime; skipping warm-up");
            return;
        };
        let inner = self.inner.clone();
        rt.spawn(async move {
            for name in [WORKLOAD_KEY_CERT, ROOT_CA] {
                let mut backoff = WARM_BACKOFF_START;
                loop {
                    match Inner::fetch(&inner, name).await {
                        Ok(_) => {
                            debug!(resource = name, "warmed");
                            break;
                        }
                        Err(e) => {
                            warn!(resource = name, error = %e, retry_in = ?backoff, "warm-up failed");
                            tokio::select! {
                                _ = inner.shutdown.cancelled() => return,
                                _ = tokio::time::sleep(jitter(backoff, 0.1)) => {}
                            }
                            backoff = (backoff * 2).min(inner.config.max_backoff);
                        }
                    }
                }
            }
        });
    }

    /// A receiver that sees every new value of `resource_name` (`None` until the first).
    /// Subscribing does not fetch; call [`SecretManager::fetch`] for that.
    pub fn subscribe(&self, resource_name: &str) -> watch::Receiver<Option<Arc<SecretItem>>> {
        let mut st = lock(&self.inner.state);
        if let Some(tx) = st.channels.get(resource_name) {
            return tx.subscribe();
        }
        let initial = match &st.workload {
            Some(w) if self.inner.file_source(resource_name).is_none() => {
                Some(Arc::new(workload_item(resource_name, w)))
            }
            _ => None,
        };
        let (tx, rx) = watch::channel(initial);
        st.channels.insert(resource_name.to_string(), tx);
        rx
    }

    /// Stops background tasks (rotation, warm-up, file watches).
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `d` scaled by a random factor in `1 ± frac`.
fn jitter(d: Duration, frac: f64) -> Duration {
    d.mul_f64(rand::random_range((1.0 - frac)..=(1.0 + frac)))
}

fn workload_item(name: &str, w: &Workload) -> SecretItem {
    if name == ROOT_CA {
        SecretItem {
            resource_name: name.to_string(),
            cert_chain_pem: Vec::new(),
            private_key_pem: Vec::new(),
            root_cert_pem: w.root_cert_pem.clone(),
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

/// Resolves when the CA root file changed; never without a CA root file watch.
async fn root_file_changed(rx: &mut Option<watch::Receiver<u64>>) {
    if let Some(r) = rx
        && r.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// Delay until rotation: Istio's `rotateTime`, with the ratio jittered by ±`jitter_max`.
pub fn rotation_delay(
    created: SystemTime,
    expire: SystemTime,
    ratio: f64,
    jitter_max: f64,
) -> Duration {
    let j = rand::random::<f64>() * jitter_max * if rand::random::<bool>() { 1.0 } else { -1.0 };
    let r = (ratio + j).clamp(0.0, 1.0);
    let lifetime = expire.duration_since(created).unwrap_or_default();
    let at = expire - lifetime.mul_f64(r);
    at.duration_since(SystemTime::now()).unwrap_or_default()
}

/// Longest pause between failed rotation attempts: a tenth of the certificate's lifetime, at
/// least [`ROTATE_BACKOFF_START`], at most `max`. A 24 h certificate backs off up to `max` (60 s);
/// a short-lived one retries often enough to rotate before it expires once the CA is back (a
/// 30 s certificate rotating at 15 s would otherwise wait 8 s, then 16 s, past its expiry).
pub fn rotation_backoff_cap(lifetime: Duration, max: Duration) -> Duration {
    (lifetime / 10).min(max).max(ROTATE_BACKOFF_START)
}

impl Inner {
    fn file_source(&self, name: &str) -> Option<FileSource> {
        let cfg = &self.config;
        let etc_usable = |p: &Path| {
            cfg.output_certs.as_deref() != p.parent()
                && std::fs::metadata(p).map(|m| m.len() > 0).unwrap_or(false)
        };
        match name {
            WORKLOAD_KEY_CERT => {
                if let Some(fm) = &cfg.file_mounted_certs {
                    return Some(FileSource::KeyCert {
                        cert: fm.cert_chain.clone(),
                        key: fm.key.clone(),
                    });
                }
                let etc = &cfg.etc_certs;
                (etc_usable(&etc.cert_chain) && etc_usable(&etc.key)).then(|| FileSource::KeyCert {
                    cert: etc.cert_chain.clone(),
                    key: etc.key.clone(),
                })
            }
            ROOT_CA => {
                if let Some(fm) = &cfg.file_mounted_certs {
                    return Some(FileSource::Root(fm.root.clone()));
                }
                etc_usable(&cfg.etc_certs.root)
                    .then(|| FileSource::Root(cfg.etc_certs.root.clone()))
            }
            _ => {
                if let Some(rest) = name.strip_prefix(FILE_ROOT_PREFIX) {
                    if rest == "system" {
                        return Some(FileSource::SystemRoot);
                    }
                    return Some(FileSource::Root(cfg.base_dir.join(rest)));
                }
                if let Some(rest) = name.strip_prefix(FILE_CERT_PREFIX) {
                    let (c, k) = rest.split_once('~').unwrap_or((rest, ""));
                    return Some(FileSource::KeyCert {
                        cert: cfg.base_dir.join(c),
                        key: cfg.base_dir.join(k),
                    });
                }
                None
            }
        }
    }

    async fn fetch(self: &Arc<Self>, name: &str) -> Result<Arc<SecretItem>, Error> {
        if self.shutdown.is_cancelled() {
            return Err(Error::Closed);
        }
        if let Some(src) = self.file_source(name) {
            return self.fetch_file(name, &src).await;
        }
        let cached = lock(&self.state).workload.clone();
        if let Some(w) = cached {
            return Ok(self.publish(name, workload_item(name, &w)));
        }
        let w = self.generate(None).await?;
        Ok(self.publish(name, workload_item(name, &w)))
    }

    /// Publishes `item` under `name` unless an equal value is already there; returns the
    /// value now held (so equal items keep their identity).
    fn publish(&self, name: &str, item: SecretItem) -> Arc<SecretItem> {
        let mut st = lock(&self.state);
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
            expires = %crate::server::rfc3339(w.expire_time),
            rotate_in = ?w.rotate_at.saturating_duration_since(Instant::now()),
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
                    self.publish(name, workload_item(name, &w));
                }
            } else {
                self.publish(name, workload_item(name, &w));
            }
        }
        self.metrics.set_expiry(WORKLOAD_KEY_CERT, w.expire_time);
        self.write_output(&w);
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
        let created_time = SystemTime::now();
        let delay = rotation_delay(
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
            rotate_at: Instant::now() + delay,
        })
    }

    fn start_rotation(self: &Arc<Self>) {
        {
            let mut st = lock(&self.state);
            if st.rotation_started {
                return;
            }
            st.rotation_started = true;
        }
        let inner = self.clone();
        tokio::spawn(async move { inner.rotation_loop().await });
    }

    async fn rotation_loop(self: Arc<Self>) {
        let mut root_changes = self.ca.as_ref().map(|ca| ca.root_changes());
        loop {
            let Some(w) = lock(&self.state).workload.clone() else {
                return;
            };
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = self.rotation_wake.notified() => continue,
                _ = tokio::time::sleep_until(w.rotate_at) => {}
                // A new trust bundle (root CA rotation): re-issue now rather than at the next
                // rotation, so Envoy gets the CA's new ROOTCA and, once the CA signs with the
                // new root, a certificate from it.
                _ = root_file_changed(&mut root_changes) => {
                    info!("CA root file changed; re-issuing the workload certificate");
                }
            }
            let cap = rotation_backoff_cap(
                w.expire_time
                    .duration_since(w.created_time)
                    .unwrap_or_default(),
                self.config.max_backoff,
            );
            let mut backoff = ROTATE_BACKOFF_START;
            loop {
                match self.generate(Some(w.created_time)).await {
                    Ok(_) => break,
                    Err(e) => {
                        let remaining = w
                            .expire_time
                            .duration_since(SystemTime::now())
                            .unwrap_or_default();
                        let delay = jitter(backoff, 0.1);
                        if remaining.is_zero() {
                            error!(error = %e, retry_in = ?delay, expired_at = %crate::server::rfc3339(w.expire_time), "certificate rotation failed and the served certificate has expired");
                        } else {
                            warn!(error = %e, retry_in = ?delay, still_valid_for = ?remaining, "certificate rotation failed; still serving the current certificate");
                        }
                        tokio::select! {
                            _ = self.shutdown.cancelled() => return,
                            _ = tokio::time::sleep(delay) => {}
                        }
                        backoff = (backoff * 2).min(cap);
                    }
                }
            }
        }
    }

    fn write_output(&self, w: &Workload) {
        let Some(dir) = &self.config.output_certs else {
            return;
        };
        for (file, data) in [
            (crate::config::KEY_FILE, &w.private_key_pem),
            (crate::config::CERT_CHAIN_FILE, &w.cert_chain_pem),
            (crate::config::ROOT_CERT_FILE, &w.root_cert_pem),
        ] {
            if let Err(e) = write_atomic_mode(&dir.join(file), data, self.config.output_certs_mode)
            {
                warn!(error = %e, "cannot write OUTPUT_CERTS");
            }
        }
    }

    async fn fetch_file(
        self: &Arc<Self>,
        name: &str,
        src: &FileSource,
    ) -> Result<Arc<SecretItem>, Error> {
        let start = Instant::now();
        let mut backoff = self.config.file_debounce.max(Duration::from_millis(10));
        let item = loop {
            match read_file_source(name, src) {
                Ok(item) => break item,
                Err(e) => {
                    if start.elapsed() + backoff > FILE_RETRY_TOTAL {
                        self.metrics.file_secret_failures.inc();
                        return Err(e);
                    }
                    debug!(resource = name, error = %e, "file secret not ready; retrying");
                    tokio::select! {
                        _ = self.shutdown.cancelled() => return Err(Error::Closed),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff *= 2;
                }
            }
        };
        self.watch_files(src);
        Ok(self.publish(name, item))
    }

    /// Watches the directories of `src`'s files; a change re-reads every subscribed file
    /// resource in that directory and publishes new values.
    fn watch_files(self: &Arc<Self>, src: &FileSource) {
        let dirs: Vec<PathBuf> = src
            .paths()
            .iter()
            .filter_map(|p| p.parent().map(Path::to_path_buf))
            .collect();
        let mut st = lock(&self.state);
        if st.watcher.is_none() {
            let (tx, rx) = mpsc::unbounded_channel::<PathBuf>();
            let handler = move |ev: notify::Result<notify::Event>| {
                if let Ok(ev) = ev
                    && !ev.kind.is_access()
                {
                    for p in ev.paths {
                        let _ = tx.send(p);
                    }
                }
            };
            match notify::recommended_watcher(handler) {
                Ok(w) => {
                    st.watcher = Some(w);
                    let inner = self.clone();
                    tokio::spawn(async move { inner.file_loop(rx).await });
                }
                Err(e) => {
                    self.metrics.file_watcher_failures.inc();
                    warn!(error = %e, "cannot create a file watcher; file certificates will not reload");
                    return;
                }
            }
        }
        for dir in dirs {
            if st.watched_dirs.contains(&dir) {
                continue;
            }
            let res = match st.watcher.as_mut() {
                Some(w) => w.watch(&dir, notify::RecursiveMode::NonRecursive),
                None => return,
            };
            match res {
                Ok(()) => {
                    st.watched_dirs.insert(dir);
                }
                Err(e) => {
                    self.metrics.file_watcher_failures.inc();
                    warn!(error = %e, dir = %dir.display(), "cannot watch certificate directory");
                }
            }
        }
    }

    async fn file_loop(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<PathBuf>) {
        loop {
            let first = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                p = rx.recv() => match p { Some(p) => p, None => return },
            };
            // Debounce: collect the burst of events a kubelet swap or an editor produces.
            tokio::time::sleep(self.config.file_debounce).await;
            let mut dirs: HashSet<PathBuf> = HashSet::new();
            dirs.extend(first.parent().map(Path::to_path_buf));
            while let Ok(p) = rx.try_recv() {
                dirs.extend(p.parent().map(Path::to_path_buf));
            }
            let names: Vec<String> = lock(&self.state).channels.keys().cloned().collect();
            for name in names {
                let Some(src) = self.file_source(&name) else {
                    continue;
                };
                if !src
                    .paths()
                    .iter()
                    .any(|p| p.parent().is_some_and(|d| dirs.contains(d)))
                {
                    continue;
                }
                match read_file_source(&name, &src) {
                    Ok(item) => {
                        let before = lock(&self.state)
                            .channels
                            .get(&name)
                            .and_then(|t| t.borrow().clone());
                        let now = self.publish(&name, item);
                        if before.is_none_or(|b| !Arc::ptr_eq(&b, &now)) {
                            info!(resource = %name, "file certificate changed; pushing");
                        }
                    }
                    Err(e) => {
                        self.metrics.file_secret_failures.inc();
                        warn!(resource = %name, error = %e, "changed certificate files do not load; keeping the previous value");
                    }
                }
            }
        }
    }
}

fn system_root_path() -> Option<PathBuf> {
    SYSTEM_ROOT_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

fn read_file_source(name: &str, src: &FileSource) -> Result<SecretItem, Error> {
    let now = SystemTime::now();
    match src {
        FileSource::KeyCert { cert, key } => {
            let cert_pem = std::fs::read(cert).map_err(|e| Error::file(cert, e))?;
            let key_pem = std::fs::read(key).map_err(|e| Error::file(key, e))?;
            let leaf = parse_certs(&cert_pem)
                .into_iter()
                .next()
                .ok_or_else(|| Error::file(cert, "no PEM CERTIFICATE block"))?;
            let (_, expire_time) = cert_validity(&leaf)
                .ok_or_else(|| Error::file(cert, "the certificate does not parse"))?;
            check_key_matches(&leaf, &key_pem).map_err(|reason| Error::file(key, reason))?;
            Ok(SecretItem {
                resource_name: name.to_string(),
                cert_chain_pem: cert_pem,
                private_key_pem: key_pem,
                root_cert_pem: Vec::new(),
                expire_time,
                created_time: now,
            })
        }
        FileSource::Root(path) => read_root(name, path),
        FileSource::SystemRoot => {
            let path = system_root_path().ok_or_else(|| Error::File {
                path: SYSTEM_ROOT_CANDIDATES.join(", "),
                reason: "no OS CA bundle found".to_string(),
            })?;
            read_root(name, &path)
        }
    }
}

/// Reads a trust bundle; certificates that do not parse are skipped (as Istio does).
fn read_root(name: &str, path: &Path) -> Result<SecretItem, Error> {
    let pem = std::fs::read(path).map_err(|e| Error::file(path, e))?;
    let mut out = Vec::new();
    let mut expire: Option<SystemTime> = None;
    for der in parse_certs(&pem) {
        match cert_validity(&der) {
            Some((_, not_after)) => {
                expire = Some(expire.map_or(not_after, |e| e.min(not_after)));
                out.extend_from_slice(&csr::pem_encode("CERTIFICATE", &der));
            }
            None => {
                warn!(path = %path.display(), "skipping an invalid certificate in the root bundle")
            }
        }
    }
    let Some(expire_time) = expire else {
        return Err(Error::file(path, "no valid PEM certificate in the bundle"));
    };
    Ok(SecretItem {
        resource_name: name.to_string(),
        cert_chain_pem: Vec::new(),
        private_key_pem: Vec::new(),
        root_cert_pem: out,
        expire_time,
        created_time: SystemTime::now(),
    })
}

fn check_key_matches(leaf_der: &[u8], key_pem: &[u8]) -> Result<(), String> {
    use x509_parser::prelude::FromDer;
    let key_str =
        std::str::from_utf8(key_pem).map_err(|_| "the key file is not PEM text".to_string())?;
    let key = rcgen::KeyPair::from_pem(key_str)
        .map_err(|e| format!("the private key does not load: {e}"))?;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(leaf_der)
        .map_err(|e| format!("the certificate does not parse: {e}"))?;
    if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Err("the private key does not match the certificate".to_string());
    }
    Ok(())
}

/// Writes `data` to `path` through a temporary file and a rename, mode 0600; skipped when the
/// content is unchanged.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<(), Error> {
    write_atomic_mode(path, data, 0o600)
}

/// [`write_atomic`] with the file mode `mode` (set explicitly: the umask does not apply).
pub fn write_atomic_mode(path: &Path, data: &[u8], mode: u32) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::fs::PermissionsExt;
    let out_err = |reason: String| Error::Output {
        path: path.display().to_string(),
        reason,
    };
    let same_mode = |m: std::fs::Metadata| m.permissions().mode() & 0o777 == mode;
    if std::fs::read(path).is_ok_and(|cur| cur == data)
        && std::fs::metadata(path).is_ok_and(same_mode)
    {
        return Ok(());
    }
    let dir = path
        .parent()
        .ok_or_else(|| out_err("no parent directory".into()))?;
    std::fs::create_dir_all(dir).map_err(|e| out_err(e.to_string()))?;
    let file_name = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.tmp-{:x}", rand::random::<u64>()));
    let res = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        return Err(out_err(e.to_string()));
    }
    Ok(())
}

/// DER of every `CERTIFICATE` block in `pem`.
pub fn parse_certs(pem: &[u8]) -> Vec<Vec<u8>> {
    x509_parser::pem::Pem::iter_from_buffer(pem)
        .filter_map(|p| p.ok())
        .filter(|p| p.label == "CERTIFICATE")
        .map(|p| p.contents)
        .collect()
}

/// (NotBefore, NotAfter) of a DER certificate.
pub fn cert_validity(der: &[u8]) -> Option<(SystemTime, SystemTime)> {
    use x509_parser::prelude::FromDer;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der).ok()?;
    let v = cert.validity();
    let to_sys = |t: i64| {
        if t >= 0 {
            SystemTime::UNIX_EPOCH + Duration::from_secs(t as u64)
        } else {
            SystemTime::UNIX_EPOCH - Duration::from_secs(t.unsigned_abs())
        }
    };
    Some((
        to_sys(v.not_before.timestamp()),
        to_sys(v.not_after.timestamp()),
    ))
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
