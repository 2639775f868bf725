//! File-backed secrets: `file-cert:`/`file-root:` resources, `./etc/certs` and
//! `FILE_MOUNTED_CERTS`, read with retries, watched for changes (debounced) and re-published.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use notify::Watcher;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{Inner, SecretItem, lock};
use crate::config::SYSTEM_ROOT_CANDIDATES;
use crate::pem::parse_certs;
use crate::x509::{cert_validity, check_key_matches};
use crate::{Error, FILE_CERT_PREFIX, FILE_ROOT_PREFIX, ROOT_CA, WORKLOAD_KEY_CERT};

const FILE_RETRY_TOTAL: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum FileSource {
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

impl Inner {
    pub(super) fn file_source(&self, name: &str) -> Option<FileSource> {
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

    /// A file `ROOTCA` with the PCDS trust anchors merged in, as Istio merges them into a
    /// mounted root; other file secrets as they are.
    fn with_config_trust(&self, name: &str, mut item: SecretItem) -> SecretItem {
        if name == ROOT_CA {
            let config_trust = lock(&self.state).config_trust.clone();
            item.root_cert_pem = super::merge_trust(&item.root_cert_pem, &config_trust);
        }
        item
    }

    pub(super) async fn fetch_file(
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
        Ok(self.publish(name, self.with_config_trust(name, item)))
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
                        let now = self.publish(&name, self.with_config_trust(&name, item));
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
                out.extend_from_slice(&crate::pem::encode("CERTIFICATE", &der));
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
