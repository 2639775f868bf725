//! The on-disk module cache, keyed as Istio's: a module is its name (the URL; for OCI the
//! repository without tag or digest) and its sha256. A URL fetched without a checksum
//! remembers the checksum it had, per WasmPlugin resource version, so the next push of the
//! same resource version is a hit without a fetch (unless the pull policy says `Always`, or
//! says nothing and the image is `:latest`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::metrics::{self, Metrics};
use super::{Error, Options, fetch, oci, sha256_hex, unpack};

/// `ISTIO_META_WASM_IMAGE_PULL_POLICY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PullPolicy {
    #[default]
    Unspecified,
    IfNotPresent,
    Always,
}

impl PullPolicy {
    /// Istio's names; anything else is unspecified.
    pub fn parse(s: &str) -> Self {
        match s {
            "IfNotPresent" => PullPolicy::IfNotPresent,
            "Always" => PullPolicy::Always,
            _ => PullPolicy::Unspecified,
        }
    }
}

/// What one ECDS resource asks of the cache.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The expected sha256 (hex); empty when the plugin names none.
    pub checksum: String,
    /// The ECDS resource's name.
    pub resource_name: String,
    /// `ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION`.
    pub resource_version: String,
    /// The whole fetch's deadline (the remote source's `http_uri.timeout`, else 5s).
    pub timeout: Duration,
    pub pull_policy: PullPolicy,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct ModuleKey {
    name: String,
    checksum: String,
}

struct Entry {
    path: PathBuf,
    last: Instant,
    /// URLs whose remembered checksum points here (forgotten when the entry is purged).
    urls: BTreeSet<String>,
    /// The file's size.
    size: u64,
}

struct Remembered {
    checksum: String,
    version_by_resource: HashMap<String, String>,
}

#[derive(Default)]
struct State {
    modules: BTreeMap<ModuleKey, Entry>,
    checksums: HashMap<String, Remembered>,
    /// The modules' bytes on disk.
    bytes: u64,
}

/// The module cache (Istio's `LocalFileCache`).
pub struct Cache {
    opts: Options,
    state: Mutex<State>,
    metrics: Metrics,
    work: super::Work,
}

const OCI: &str = "oci://";

/// The module name of a URL: for OCI the repository without tag or digest.
fn module_name(url: &str) -> String {
    match url.strip_prefix(OCI) {
        Some(rest) => format!(
            "{OCI}{}",
            oci::Reference::parse(rest).map_or_else(|_| rest.to_string(), |r| r.name())
        ),
        None => url.to_string(),
    }
}

/// Whether a remembered checksum serves every resource version (Istio's rule).
fn ignores_resource_version(policy: PullPolicy, url: &str) -> bool {
    match policy {
        PullPolicy::Always => false,
        PullPolicy::IfNotPresent => true,
        PullPolicy::Unspecified => !(url.starts_with(OCI) && url.ends_with(":latest")),
    }
}

impl Cache {
    /// A cache in `opts.dir`, with its purge task (ended when the cache is dropped). Staging
    /// files a killed agent left are removed.
    pub fn new(opts: Options, metrics: Metrics) -> Arc<Self> {
        unpack::remove_staging(&opts.dir);
        let cache = Arc::new(Cache {
            opts,
            state: Mutex::new(State::default()),
            metrics,
            work: super::Work::new(super::WORKERS),
        });
        let weak = Arc::downgrade(&cache);
        let every = cache.opts.purge_interval.max(Duration::from_millis(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(cache) = weak.upgrade() else { return };
                cache.purge(Instant::now());
            }
        });
        cache
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    fn entries_changed(&self, s: &State) {
        self.metrics
            .cache_entries
            .set(i64::try_from(s.modules.len()).unwrap_or(i64::MAX));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Removes modules unused for longer than the expiry, with their files.
    pub fn purge(&self, now: Instant) {
        let mut s = self.lock();
        let expired: Vec<ModuleKey> = s
            .modules
            .iter()
            .filter(|(_, e)| now.duration_since(e.last) > self.opts.module_expiry)
            .map(|(k, _)| k.clone())
            .collect();
        for k in expired {
            if let Some(e) = s.modules.get(&k) {
                tracing::debug!(path = %e.path.display(), "removing stale Wasm module");
            }
            remove(&mut s, &k);
        }
        self.entries_changed(&s);
    }

    /// How many modules the cache holds.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().modules.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Looks the module up; the checksum it would have (known or remembered) comes back too.
    fn lookup(&self, url: &str, req: &Request, ignore_version: bool) -> (Option<PathBuf>, String) {
        let mut s = self.lock();
        let mut checksum = req.checksum.clone();
        if checksum.is_empty()
            && let Some(rest) = url.strip_prefix(OCI)
            && let Ok(r) = oci::Reference::parse(rest)
            && let Some(d) = r.digest()
        {
            checksum = d.to_string();
        }
        if checksum.is_empty()
            && let Some(rem) = s.checksums.get_mut(url)
        {
            if ignore_version
                || rem.version_by_resource.get(&req.resource_name) == Some(&req.resource_version)
            {
                checksum = rem.checksum.clone();
            }
            rem.version_by_resource
                .insert(req.resource_name.clone(), req.resource_version.clone());
        }
        let key = ModuleKey {
            name: module_name(url),
            checksum: checksum.clone(),
        };
        let hit = match s.modules.get_mut(&key) {
            Some(e) => {
                e.last = Instant::now();
                Some(e.path.clone())
            }
            None => None,
        };
        if hit.is_some() {
            remember(&mut s, url, req, &key);
        }
        self.metrics.lookup(hit.is_some());
        (hit, checksum)
    }

    /// The local file of the module at `url`: from the cache, or fetched, checked and written.
    pub async fn get(&self, url: &str, req: &Request) -> Result<PathBuf, Error> {
        let bad = |reason: &str| Error::Url {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let ignore_version = ignores_resource_version(req.pull_policy, url);
        let (hit, checksum) = self.lookup(url, req, ignore_version);
        if let Some(path) = hit {
            return Ok(path);
        }
        let fetched = self.fetch(url, scheme, rest, &checksum);
        let (staged, got) = tokio::time::timeout(req.timeout, fetched)
            .await
            .map_err(|_| {
                self.metrics.fetch(metrics::DOWNLOAD_FAILURE);
                Error::Fetch {
                    url: url.to_string(),
                    reason: format!("timed out after {:?}", req.timeout),
                }
            })??;
        if !checksum.is_empty() && got != checksum {
            self.metrics.fetch(metrics::CHECKSUM_MISMATCH);
            return Err(Error::Checksum {
                url: url.to_string(),
                got,
                want: checksum,
            });
        }
        if checksum.is_empty() {
            // The URL's content may already be cached under the checksum it turned out to have.
            let known = Request {
                checksum: got.clone(),
                ..req.clone()
            };
            if let (Some(path), _) = self.lookup(url, &known, true) {
                return Ok(path);
            }
        }
        if !staged.wasm {
            self.metrics.fetch(metrics::FETCH_FAILURE);
            return Err(Error::Invalid {
                url: url.to_string(),
            });
        }
        self.metrics.fetch(metrics::FETCH_SUCCESS);
        self.add(url, req, got, staged)
    }

    /// Fetches the module at `url` and stages it in the cache's directory; returns it with its
    /// checksum (an OCI manifest's digest, else the staged file's sha256).
    async fn fetch(
        &self,
        url: &str,
        scheme: &str,
        rest: &str,
        checksum: &str,
    ) -> Result<(unpack::Staged, String), Error> {
        let bad = |reason: &str| Error::Url {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let fail = |reason: String| Error::Fetch {
            url: url.to_string(),
            reason,
        };
        // The body, and the checksum the module has when it is known before unpacking
        // (an OCI manifest's digest).
        let (body, manifest_digest) = match scheme {
            "http" | "https" => match fetch::http(&self.opts, url).await {
                Ok(b) => (unpack::Body::Http(b), None),
                Err(e) => {
                    self.metrics.fetch(metrics::DOWNLOAD_FAILURE);
                    return Err(e);
                }
            },
            "oci" => match oci::fetch(&self.opts, &self.work, url, rest, checksum).await {
                Ok((b, digest)) => (b, Some(digest)),
                Err(e) => {
                    self.metrics.fetch(match e {
                        Error::Checksum { .. } => metrics::CHECKSUM_MISMATCH,
                        _ => metrics::MANIFEST_FAILURE,
                    });
                    return Err(e);
                }
            },
            other => {
                return Err(bad(&format!(
                    "unsupported scheme {other:?} (expected http, https or oci)"
                )));
            }
        };
        let (dir, cap) = (self.opts.dir.clone(), self.opts.max_binary_size);
        let staged = self
            .work
            .run(move || unpack::stage(body, &dir, cap))
            .await
            .map_err(|e| fail(e.to_string()))?
            .map_err(|e| {
                self.metrics.fetch(metrics::FETCH_FAILURE);
                fail(e.to_string())
            })?;
        let got = manifest_digest.unwrap_or_else(|| staged.sha256.clone());
        Ok((staged, got))
    }

    fn add(
        &self,
        url: &str,
        req: &Request,
        checksum: String,
        staged: unpack::Staged,
    ) -> Result<PathBuf, Error> {
        let key = ModuleKey {
            name: module_name(url),
            checksum,
        };
        let mut s = self.lock();
        remember(&mut s, url, req, &key);
        if let Some(e) = s.modules.get_mut(&key) {
            e.last = Instant::now();
            return Ok(e.path.clone());
        }
        let dir = self.opts.dir.join(sha256_hex(key.name.as_bytes()));
        let path = dir.join(format!("{}.wasm", key.checksum));
        std::fs::create_dir_all(&dir).map_err(|source| Error::Write {
            path: dir.clone(),
            source,
        })?;
        let size = staged.size;
        staged.keep(&path).map_err(|source| Error::Write {
            path: path.clone(),
            source,
        })?;
        let mut urls = BTreeSet::new();
        if remembers(url) {
            urls.insert(url.to_string());
        }
        s.bytes = s.bytes.saturating_add(size);
        s.modules.insert(
            key.clone(),
            Entry {
                path: path.clone(),
                last: Instant::now(),
                urls,
                size,
            },
        );
        self.evict(&mut s, &key);
        self.entries_changed(&s);
        Ok(path)
    }

    /// Removes the modules used longest ago (never `keep`, the one just added) until the cache
    /// is within `WASM_CACHE_MAX_BYTES` and `WASM_CACHE_MAX_ENTRIES`.
    fn evict(&self, s: &mut State, keep: &ModuleKey) {
        while s.bytes > self.opts.max_cache_bytes || s.modules.len() > self.opts.max_cache_entries {
            let Some(oldest) = s
                .modules
                .iter()
                .filter(|(k, _)| *k != keep)
                .min_by_key(|(_, e)| e.last)
                .map(|(k, _)| k.clone())
            else {
                return;
            };
            if let Some(e) = s.modules.get(&oldest) {
                tracing::info!(path = %e.path.display(), bytes = s.bytes, entries = s.modules.len(),
                    "Wasm module cache full; removing the module used longest ago");
            }
            remove(s, &oldest);
        }
    }
}

/// Forgets a module and removes its file.
fn remove(s: &mut State, k: &ModuleKey) {
    let Some(e) = s.modules.remove(k) else { return };
    if let Err(err) = std::fs::remove_file(&e.path)
        && err.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(error = %err, path = %e.path.display(), "failed to remove a Wasm module");
    }
    s.bytes = s.bytes.saturating_sub(e.size);
    for url in e.urls {
        s.checksums.remove(&url);
    }
}

/// Whether a URL's checksum is remembered: all but OCI references by digest.
fn remembers(url: &str) -> bool {
    !url.starts_with(OCI) || !url.contains('@')
}

fn remember(s: &mut State, url: &str, req: &Request, key: &ModuleKey) {
    if !remembers(url) {
        return;
    }
    let rem = s
        .checksums
        .entry(url.to_string())
        .or_insert_with(|| Remembered {
            checksum: String::new(),
            version_by_resource: HashMap::new(),
        });
    rem.checksum = key.checksum.clone();
    rem.version_by_resource
        .insert(req.resource_name.clone(), req.resource_version.clone());
    if let Some(e) = s.modules.get_mut(key) {
        e.urls.insert(url.to_string());
    }
}
