//! Client of Istio's `IstioCertificateService/CreateCertificate`.
//!
//! TLS as Istio (root from `CA_ROOT_CA` and fallbacks, ServerName from the CA host or
//! `ISTIOD_SAN`, `PROV_CERT` client identity when valid), plaintext for `:15010` or `http://`.
//! The bearer token is re-read on every call; a JWT whose `exp` has passed is not sent, and no
//! token is sent over plaintext unless
//! [`Config::allow_plaintext_token`] (`CA_ALLOW_PLAINTEXT_TOKEN=true`) says so: Istio
//! serves its CA on the TLS port 15012 only, so a plaintext CA address is almost always a
//! mistake that would put the workload's credential on the wire in clear.
//!
//! Credentials, as Istio's agent: the `PROV_CERT` client certificate (read again for every call,
//! so on a VM, where `OUTPUT_CERTS` is the same directory, the agent's own previous certificate)
//! when it is valid, and the token. istiod authenticates the client certificate first, so with
//! a valid one an expired or missing token does not stop the call (renewal after the onboarding
//! token expired, a VM rebooted with an empty `/run`): the call goes out without the token.
//! With neither, the call fails at once with one error naming the token file and why there is no
//! certificate. Retries: 5 tries, 100 ms doubling with 10% jitter, on
//! retryable codes only. The channel is rebuilt after any error and whenever the root file's
//! directory changes (kubelet `..data` swaps included).
//!
//! Several CAs: `CA_ADDR` (or the discovery address) resolving to several IPs, or a comma-separated
//! list of addresses (not Istio), is dialled one target at a time ([`Failover`]); a call that fails
//! as unreachable moves the next attempt (the retry 100 ms later) to the next target.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use notify::Watcher;
use proto::google::protobuf::{Struct, Value, value::Kind};
use proto::istio::ca::IstioCertificateRequest;
use proto::istio::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use tonic::transport::Channel;
use tracing::{debug, info, warn};

use crate::Error;
use crate::config::{CertDir, Config};
use crate::metrics::{Metrics, csr_labels};
use crate::tls::failover::Failover;
use crate::tls::{ChannelInputs, RootSource, grpc_channel_to, read_token};

/// Number of attempts per signing call (Istio's retry interceptor).
pub const MAX_ATTEMPTS: u32 = 5;
/// First retry delay; doubles on each retry, ±10% jitter.
pub const RETRY_BASE: Duration = Duration::from_millis(100);

/// Environment variable the agent maps onto [`Config::allow_plaintext_token`] (not an Istio
/// variable: Istio's agent has no way to send its token in clear).
pub const ALLOW_PLAINTEXT_TOKEN_ENV: &str = "CA_ALLOW_PLAINTEXT_TOKEN";

/// Signs CSRs at the Istio CA. Cheap to clone.
#[derive(Clone)]
pub struct CaClient {
    inner: Arc<Inner>,
}

struct Inner {
    addr: String,
    plaintext: bool,
    allow_plaintext_token: bool,
    root: RootSource,
    server_name: String,
    keepalive: Option<(Duration, Duration)>,
    compliance: crate::tls::Compliance,
    prov_cert: Option<CertDir>,
    token_path: std::path::PathBuf,
    cluster_id: String,
    headers: Vec<(String, String)>,
    cert_signer: String,
    ttl: Duration,
    metrics: Arc<Metrics>,
    /// The cached channel, the target it dials and the client certificate it presents.
    channel: Arc<Mutex<Option<Cached>>>,
    failover: Failover,
    /// Bumped whenever the root file's content changes (see [`CaClient::root_changes`]).
    root_changes: tokio::sync::watch::Receiver<u64>,
    _root_watch: Option<notify::RecommendedWatcher>,
}

/// A channel to the CA as built: rebuilt when the client certificate to present changes.
#[derive(Clone)]
struct Cached {
    channel: Channel,
    target: SocketAddr,
    /// The chain presented (PEM), or `None` when the channel has no client certificate.
    client_chain: Option<Vec<u8>>,
}

fn is_retryable(code: tonic::Code) -> bool {
    use tonic::Code::*;
    matches!(
        code,
        Cancelled | DeadlineExceeded | ResourceExhausted | Aborted | Internal | Unavailable
    )
}

/// `d` ± 10%.
fn jittered(d: Duration) -> Duration {
    let f: f64 = rand::random_range(0.9..=1.1);
    d.mul_f64(f)
}

impl CaClient {
    /// Builds the client from `config`; the channel itself is created lazily on the first call.
    pub fn new(config: &Config, metrics: Arc<Metrics>) -> Result<CaClient, Error> {
        let channel: Arc<Mutex<Option<Cached>>> = Arc::new(Mutex::new(None));
        let failover = Failover::new(&config.ca_addr, config.ca_plaintext).map_err(|reason| {
            Error::Config {
                var: "CA_ADDR".to_string(),
                value: config.ca_addr.clone(),
                expected: reason.to_string(),
            }
        })?;
        let (root_tx, root_changes) = tokio::sync::watch::channel(0u64);
        let root_watch = match &config.ca_root {
            RootSource::File(path) if !config.ca_plaintext => {
                watch_root(path, channel.clone(), root_tx, &metrics)
            }
            _ => None,
        };
        Ok(CaClient {
            inner: Arc::new(Inner {
                addr: config.ca_addr.clone(),
                plaintext: config.ca_plaintext,
                allow_plaintext_token: config.allow_plaintext_token,
                root: config.ca_root.clone(),
                server_name: config.ca_server_name.clone(),
                keepalive: config.grpc_keepalive,
                compliance: config.compliance,
                prov_cert: config.prov_cert.clone(),
                token_path: config.token_path.clone(),
                cluster_id: config.cluster_id.clone(),
                headers: config.ca_headers.clone(),
                cert_signer: config.cert_signer.clone(),
                ttl: config.secret_ttl,
                metrics,
                channel,
                failover,
                root_changes,
                _root_watch: root_watch,
            }),
        })
    }

    /// A counter bumped each time the CA root file's content changes: the mesh's trust bundle
    /// changed (a root CA rotation), so the workload certificate should be re-issued to get the
    /// CA's new chain and bundle.
    pub(crate) fn root_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.root_changes.clone()
    }

    /// The cached channel, or a new one to the failover's first target. The `PROV_CERT` files
    /// are read on every call: a channel built with another client certificate (or none: the
    /// first certificate of a VM is written there after the first call) is rebuilt.
    async fn channel(&self) -> Result<Cached, Error> {
        let identity = self.inner.prov_cert.as_ref().and_then(load_client_identity);
        let client_chain = identity.as_ref().map(|(chain, _)| chain.clone());
        if let Some(cached) = self
            .inner
            .channel
            .lock()
            .map_err(|_| Error::Closed)?
            .as_ref()
            .filter(|c| c.client_chain == client_chain)
        {
            return Ok(cached.clone());
        }
        let targets = self
            .inner
            .failover
            .targets()
            .await
            .map_err(|reason| Error::Channel {
                addr: self.inner.addr.clone(),
                reason: reason.to_string(),
            })?;
        let target = &targets[0];
        let inputs = ChannelInputs {
            addr: self.inner.addr.clone(),
            plaintext: self.is_plaintext(),
            root: self.inner.root.clone(),
            server_name: self.inner.server_name.clone(),
            client_identity: identity,
            keepalive: self.inner.keepalive,
            window: crate::tls::DEFAULT_WINDOW,
            compliance: self.inner.compliance,
        };
        let ch = grpc_channel_to(&inputs, target)?;
        debug!(addr = %self.inner.addr, target = %target.addr, server_name = %self.inner.server_name, root = %self.inner.root.describe(), client_cert = client_chain.is_some(), "built CA channel");
        let cached = Cached {
            channel: ch,
            target: target.addr,
            client_chain,
        };
        let mut guard = self.inner.channel.lock().map_err(|_| Error::Closed)?;
        *guard = Some(cached.clone());
        Ok(cached)
    }

    fn reset_channel(&self) {
        if let Ok(mut g) = self.inner.channel.lock() {
            *g = None;
        }
    }

    /// The request for `csr_pem`; `client_cert` says whether the channel presents a valid client
    /// certificate, which stands in for an expired or missing token.
    fn request(
        &self,
        csr_pem: &[u8],
        client_cert: bool,
    ) -> Result<tonic::Request<IstioCertificateRequest>, Error> {
        let mut fields = BTreeMap::new();
        fields.insert(
            "CertSigner".to_string(),
            Value {
                kind: Some(Kind::StringValue(self.inner.cert_signer.clone())),
            },
        );
        let body = IstioCertificateRequest {
            csr: String::from_utf8_lossy(csr_pem).into_owned(),
            validity_duration: self.inner.ttl.as_secs() as i64,
            metadata: Some(Struct {
                fields: fields.into_iter().collect(),
            }),
        };
        let mut req = tonic::Request::new(body);
        self.insert_headers(req.metadata_mut())?;
        let Some(token) = read_token(&self.inner.token_path) else {
            // Over plaintext the CA sees no certificate either; what it accepts there is its own
            // policy (Istio sends nothing on :15010).
            if !client_cert && !self.is_plaintext() {
                return Err(Error::NoCredential {
                    addr: self.inner.addr.clone(),
                    token: self.inner.token_path.display().to_string(),
                    client_cert: self.client_cert_absence(),
                });
            }
            return Ok(req);
        };
        if self.is_plaintext() && !self.inner.allow_plaintext_token {
            return Err(Error::PlaintextToken {
                addr: self.inner.addr.clone(),
                token: self.inner.token_path.display().to_string(),
            });
        }
        if client_cert {
            if let Err(e) = crate::token::check_not_expired(
                &self.inner.token_path,
                &token,
                SystemTime::now(),
                "",
            ) {
                debug!(error = %e, "token expired; the CA call authenticates with the client certificate alone");
                return Ok(req);
            }
        } else {
            crate::token::check_not_expired(
                &self.inner.token_path,
                &token,
                SystemTime::now(),
                &self.client_cert_absence(),
            )?;
        }
        let v = format!("Bearer {token}").parse().map_err(|e| {
            Error::file(
                &self.inner.token_path,
                format!("token is not a valid header value: {e}"),
            )
        })?;
        req.metadata_mut().insert("authorization", v);
        Ok(req)
    }

    /// The CA call's headers: `clusterid` (`ISTIO_META_CLUSTER_ID`) and each `CA_HEADER_*`.
    fn insert_headers(&self, md: &mut tonic::metadata::MetadataMap) -> Result<(), Error> {
        let bad_header = |k: &str, e: String| Error::Config {
            var: k.to_string(),
            value: String::new(),
            expected: format!("a valid gRPC header ({e})"),
        };
        if !self.inner.cluster_id.is_empty() {
            let v = self
                .inner
                .cluster_id
                .parse()
                .map_err(|e| bad_header("ISTIO_META_CLUSTER_ID", format!("{e}")))?;
            md.insert("clusterid", v);
        }
        for (k, v) in &self.inner.headers {
            let key = tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
                .map_err(|e| bad_header(&format!("CA_HEADER_{k}"), e.to_string()))?;
            let val = v
                .parse()
                .map_err(|e| bad_header(&format!("CA_HEADER_{k}"), format!("{e}")))?;
            md.insert(key, val);
        }
        Ok(())
    }

    /// Why no client certificate is presented, for an error that has no credential left.
    fn client_cert_absence(&self) -> String {
        if self.is_plaintext() {
            return "a plaintext connection presents no client certificate".to_string();
        }
        match &self.inner.prov_cert {
            None => "PROV_CERT is not set (no client certificate)".to_string(),
            Some(dir) => format!(
                "PROV_CERT has no valid client certificate ({} and {}: {})",
                dir.cert_chain.display(),
                dir.key.display(),
                client_identity_problem(dir)
            ),
        }
    }

    /// True when the connection to the CA has no TLS: `:15010` (Istio's plaintext port) or an
    /// `http://` address.
    fn is_plaintext(&self) -> bool {
        self.inner.plaintext
            || self
                .inner
                .addr
                .get(..7)
                .is_some_and(|s| s.eq_ignore_ascii_case("http://"))
    }

    /// Sends `csr_pem`; returns the certificate chain, leaf first, root last (at least 2).
    /// A JWT token whose `exp` has passed is not sent: with a valid `PROV_CERT` client certificate
    /// the call goes out without it, else it fails ([`Error::TokenExpired`]); with neither token
    /// nor certificate over TLS it fails ([`Error::NoCredential`]). No token goes over plaintext
    /// unless allowed ([`Error::PlaintextToken`]). Every failed call counts once in
    /// `csr_failures_total{reason}`.
    pub async fn sign(&self, csr_pem: &[u8]) -> Result<Vec<String>, Error> {
        let result = self.sign_with_retries(csr_pem).await;
        if let Err(e) = &result {
            self.inner.metrics.csr_failed(e.reason());
        }
        result
    }

    async fn sign_with_retries(&self, csr_pem: &[u8]) -> Result<Vec<String>, Error> {
        let labels = csr_labels();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let Cached {
                channel,
                target,
                client_chain,
            } = self.channel().await?;
            let req = self.request(csr_pem, client_chain.is_some())?;
            self.inner
                .metrics
                .outgoing_requests
                .get_or_create(&labels)
                .inc();
            let started = std::time::Instant::now();
            let result = IstioCertificateServiceClient::new(channel)
                .max_decoding_message_size(usize::MAX)
                .create_certificate(req)
                .await;
            self.inner
                .metrics
                .outgoing_latency
                .get_or_create(&labels)
                .observe(started.elapsed().as_secs_f64());
            match result {
                Ok(resp) => {
                    self.inner.failover.succeeded(target);
                    let chain = resp.into_inner().cert_chain;
                    if chain.len() <= 1 {
                        self.inner
                            .metrics
                            .failed_outgoing_requests
                            .get_or_create(&labels)
                            .inc();
                        return Err(Error::InvalidResponse {
                            addr: self.inner.addr.clone(),
                            reason: format!(
                                "invalid empty CertChain ({} entries, expected leaf..root)",
                                chain.len()
                            ),
                        });
                    }
                    return Ok(chain);
                }
                Err(status) => {
                    self.inner
                        .metrics
                        .failed_outgoing_requests
                        .get_or_create(&labels)
                        .inc();
                    // A new root file or a new CA address takes effect on the next call.
                    self.reset_channel();
                    let code = status.code();
                    if matches!(
                        code,
                        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                    ) {
                        // Unreachable: the next attempt goes to the next CA address, if any.
                        self.inner.failover.failed(target);
                    } else {
                        self.inner.failover.succeeded(target);
                    }
                    if is_retryable(code) && attempt < MAX_ATTEMPTS {
                        let delay = jittered(RETRY_BASE * 2u32.pow(attempt - 1));
                        debug!(addr = %self.inner.addr, ?code, attempt, ?delay, "CA call failed; retrying");
                        self.inner
                            .metrics
                            .outgoing_retries
                            .get_or_create(&labels)
                            .inc();
                        tokio::time::sleep(delay).await;
                        continue;
                    }
                    return Err(self.refused(&status));
                }
            }
        }
    }

    /// The error of a CA call that failed with `status` for good: the CA's address, the root
    /// and token it was called with, and its answer.
    fn refused(&self, status: &tonic::Status) -> Error {
        Error::Ca {
            addr: self.inner.addr.clone(),
            root: if self.is_plaintext() {
                "plaintext".to_string()
            } else {
                self.inner.root.describe()
            },
            token: self.inner.token_path.display().to_string(),
            code: status.code(),
            message: status.message().to_string(),
        }
    }
}

/// `PROV_CERT` identity, only when the chain parses and the leaf is unexpired.
fn load_client_identity(dir: &CertDir) -> Option<(Vec<u8>, Vec<u8>)> {
    let cert = std::fs::read(&dir.cert_chain).ok()?;
    let key = std::fs::read(&dir.key).ok()?;
    let leaf = crate::pem::parse_certs(&cert).into_iter().next()?;
    match crate::x509::cert_validity(&leaf) {
        Some((_, not_after)) if not_after > SystemTime::now() => Some((cert, key)),
        _ => {
            warn!(path = %dir.cert_chain.display(), "PROV_CERT certificate is expired or unparsable; using the token alone");
            None
        }
    }
}

/// Why `dir` holds no usable client identity (for an error message).
fn client_identity_problem(dir: &CertDir) -> String {
    let cert = match std::fs::read(&dir.cert_chain) {
        Ok(c) => c,
        Err(e) => return format!("{}: {e}", dir.cert_chain.display()),
    };
    if let Err(e) = std::fs::metadata(&dir.key) {
        return format!("{}: {e}", dir.key.display());
    }
    let Some(leaf) = crate::pem::parse_certs(&cert).into_iter().next() else {
        return "no PEM certificate in the chain".to_string();
    };
    match crate::x509::cert_validity(&leaf) {
        Some((_, not_after)) if not_after <= SystemTime::now() => format!(
            "the certificate expired at {}",
            crate::timestamp::rfc3339(not_after)
        ),
        Some(_) => "valid".to_string(),
        None => "the certificate does not parse".to_string(),
    }
}

/// The `PROV_CERT` client identity (chain, key): one policy for the CA client and the agent's
/// xDS upstream, so the same files are offered or refused by both.
pub fn prov_cert_identity(dir: &CertDir) -> Option<(Vec<u8>, Vec<u8>)> {
    load_client_identity(dir)
}

/// Watches the root file's directory; a change of the root file's content drops the cached
/// channel and bumps `changes`.
fn watch_root(
    path: &Path,
    channel: Arc<Mutex<Option<Cached>>>,
    changes: tokio::sync::watch::Sender<u64>,
    metrics: &Metrics,
) -> Option<notify::RecommendedWatcher> {
    let dir = path.parent()?.to_path_buf();
    let file = path.to_path_buf();
    // The directory may hold other files that change often (on a VM PROV_CERT and OUTPUT_CERTS
    // are both ./etc/certs): rebuild only when the root file's content changes (symlinks
    // followed, so kubelet `..data` swaps count).
    let last = Mutex::new(std::fs::read(&file).ok());
    let handler = move |ev: notify::Result<notify::Event>| {
        let Ok(ev) = ev else { return };
        if ev.kind.is_access() {
            return;
        }
        let now = std::fs::read(&file).ok();
        let Ok(mut last) = last.lock() else { return };
        if *last == now {
            return;
        }
        *last = now;
        info!(root = %file.display(), "CA root file changed; the CA channel will be rebuilt");
        if let Ok(mut g) = channel.lock() {
            *g = None;
        }
        changes.send_modify(|n| *n += 1);
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            metrics.file_watcher_failures.inc();
            warn!(error = %e, "cannot create a file watcher for the CA root");
            return None;
        }
    };
    if let Err(e) = watcher.watch(&dir, notify::RecursiveMode::NonRecursive) {
        metrics.file_watcher_failures.inc();
        warn!(error = %e, dir = %dir.display(), "cannot watch the CA root directory; root changes apply after the next CA error");
        return None;
    }
    Some(watcher)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyAlgorithm;
    use crate::testing::FakeCa;

    fn client(ca: &FakeCa, base: &Path, plaintext: bool) -> CaClient {
        client_at(ca.ca_addr(), base, plaintext).0
    }

    /// A client of the CA at `ca_addr` with its config under `base`; also returns that config
    /// and the registry holding the client's metrics.
    fn client_at(
        ca_addr: String,
        base: &Path,
        plaintext: bool,
    ) -> (CaClient, Config, prometheus_client::registry::Registry) {
        client_with(ca_addr, base, plaintext, false)
    }

    /// [`client_at`] with [`Config::allow_plaintext_token`] set to `allow_plaintext_token`.
    fn client_with(
        ca_addr: String,
        base: &Path,
        plaintext: bool,
        allow_plaintext_token: bool,
    ) -> (CaClient, Config, prometheus_client::registry::Registry) {
        let cfg = Config {
            ca_addr,
            ca_server_name: "istiod.istio-system.svc".into(),
            ca_plaintext: plaintext,
            allow_plaintext_token,
            ..Config::defaults(base)
        };
        // Over TLS a call needs a credential: an opaque token (unless the test wrote one), which
        // tests replace or remove.
        if !plaintext && !cfg.token_path.exists() {
            std::fs::create_dir_all(cfg.token_path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&cfg.token_path, "opaque").expect("token");
        }
        let mut reg = prometheus_client::registry::Registry::default();
        let client = CaClient::new(&cfg, Arc::new(Metrics::new(&mut reg))).expect("client");
        (client, cfg, reg)
    }

    /// The metrics in `reg`, in the text format.
    fn metrics_text(reg: &prometheus_client::registry::Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, reg).expect("encode");
        out
    }

    fn csr() -> Vec<u8> {
        crate::csr::generate(
            "spiffe://cluster.local/ns/a/sa/b",
            KeyAlgorithm::EcdsaP256,
            false,
        )
        .expect("csr")
        .csr_pem
    }

    /// kubelet-style projected volume: `root-cert.pem -> ..data/root-cert.pem`, `..data -> ..<ts>`.
    fn kubelet_write(dir: &Path, content: &str) {
        let ts = dir.join(format!("..{:x}", rand::random::<u64>()));
        std::fs::create_dir_all(&ts).expect("mkdir");
        std::fs::write(ts.join("root-cert.pem"), content).expect("write");
        let tmp = dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(ts.file_name().expect("name"), &tmp).expect("symlink");
        std::fs::rename(&tmp, dir.join("..data")).expect("swap");
        let link = dir.join("root-cert.pem");
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink("..data/root-cert.pem", &link).expect("symlink");
        }
    }

    async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !f().await {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for: {what}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn root_file_swap_rebuilds_the_channel() {
        let ca = FakeCa::start();
        let other = FakeCa::start();
        let base = tempfile::tempdir().expect("tempdir");
        let dir = base.path().join("var/run/secrets/istio");
        std::fs::create_dir_all(&dir).expect("mkdir");
        kubelet_write(&dir, &ca.tls_root_pem);
        let c = client(&ca, base.path(), false);
        let chain = c.sign(&csr()).await.expect("signed with the right root");
        assert_eq!(chain.len(), 2);
        // A wrong root swapped in: the cached (working) channel must be dropped, so calls fail.
        kubelet_write(&dir, &other.tls_root_pem);
        eventually("calls fail with the wrong root", async || {
            c.sign(&csr()).await.is_err()
        })
        .await;
        // The right root back: calls succeed again.
        kubelet_write(&dir, &ca.tls_root_pem);
        eventually("calls succeed with the right root", async || {
            c.sign(&csr()).await.is_ok()
        })
        .await;
    }

    #[tokio::test]
    async fn other_files_in_the_root_directory_keep_the_channel() {
        let ca = FakeCa::start();
        let base = tempfile::tempdir().expect("tempdir");
        let dir = base.path().join("var/run/secrets/istio");
        std::fs::create_dir_all(&dir).expect("mkdir");
        kubelet_write(&dir, &ca.tls_root_pem);
        let c = client(&ca, base.path(), false);
        c.sign(&csr()).await.expect("signed");
        let cached = || c.inner.channel.lock().expect("lock").is_some();
        assert!(cached());
        // A VM writes its issued certs next to the root (OUTPUT_CERTS = PROV_CERT = ./etc/certs),
        // and kubelet may re-project the same root: neither is a root change.
        for i in 0..5 {
            std::fs::write(dir.join("cert-chain.pem"), format!("chain {i}")).expect("write");
            std::fs::write(dir.join("key.pem"), format!("key {i}")).expect("write");
        }
        kubelet_write(&dir, &ca.tls_root_pem);
        // Absence of a rebuild can only be observed by waiting a moment for events to land.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            cached(),
            "the channel was dropped for a write that did not change the root"
        );
        // A real change still drops it.
        let other = FakeCa::start();
        kubelet_write(&dir, &other.tls_root_pem);
        eventually("the channel is dropped on a root change", async || {
            !cached()
        })
        .await;
    }

    fn jwt(exp: SystemTime) -> String {
        use base64::Engine;
        let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let exp = exp
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("after epoch")
            .as_secs();
        format!(
            "{}.{}.sig",
            e.encode(r#"{"alg":"ES256"}"#),
            e.encode(format!(
                r#"{{"sub":"system:serviceaccount:a:b","exp":{exp}}}"#
            ))
        )
    }

    /// A VM: `PROV_CERT` and `OUTPUT_CERTS` are one directory. The first certificate is had with
    /// the token; once it sits in `PROV_CERT`, an expired or missing token no longer stops a
    /// renewal: the call goes over mTLS with the previous certificate and no token. Without
    /// either credential the error names both.
    #[tokio::test]
    async fn expired_or_missing_token_with_a_valid_client_certificate_goes_over_mtls() {
        let ca = FakeCa::start();
        let base = tempfile::tempdir().expect("tempdir");
        let root = base.path().join(crate::config::paths::ISTIO_ROOT);
        std::fs::create_dir_all(root.parent().expect("parent")).expect("mkdir");
        std::fs::write(&root, &ca.tls_root_pem).expect("root");
        let certs = base.path().join("etc/certs");
        std::fs::create_dir_all(&certs).expect("mkdir");
        let cfg = Config {
            ca_addr: ca.ca_addr(),
            ca_server_name: "istiod.istio-system.svc".into(),
            prov_cert: Some(CertDir::istio(&certs)),
            ..Config::defaults(base.path())
        };
        let mut reg = prometheus_client::registry::Registry::default();
        let c = CaClient::new(&cfg, Arc::new(Metrics::new(&mut reg))).expect("client");
        let token_path = &cfg.token_path;
        std::fs::create_dir_all(token_path.parent().expect("parent")).expect("mkdir");

        // Onboarding: a valid token, no certificate yet.
        let fresh = jwt(SystemTime::now() + Duration::from_secs(3600));
        std::fs::write(token_path, &fresh).expect("write");
        let key = crate::csr::generate(
            "spiffe://cluster.local/ns/a/sa/b",
            KeyAlgorithm::EcdsaP256,
            false,
        )
        .expect("csr");
        let chain = c.sign(&key.csr_pem).await.expect("signed with the token");
        let got = ca.received();
        assert!(!got[0].client_cert);
        assert_eq!(
            got[0].header("authorization"),
            Some(format!("Bearer {fresh}").as_str())
        );
        // OUTPUT_CERTS writes the certificate where PROV_CERT reads it.
        std::fs::write(certs.join("cert-chain.pem"), chain.concat()).expect("chain");
        std::fs::write(certs.join("key.pem"), &key.private_key_pem).expect("key");

        // The token expires: the renewal goes out with the certificate, without the token.
        std::fs::write(token_path, jwt(SystemTime::now() - Duration::from_secs(30)))
            .expect("write");
        c.sign(&csr()).await.expect("renewed over mTLS");
        let got = ca.received();
        assert_eq!(got.len(), 2);
        assert!(
            got[1].client_cert,
            "the previous certificate was not presented"
        );
        assert_eq!(
            got[1].header("authorization"),
            None,
            "an expired token was sent"
        );

        // A reboot empties /run: no token file at all is fine too.
        std::fs::remove_file(token_path).expect("rm");
        c.sign(&csr()).await.expect("renewed without a token file");
        let got = ca.received();
        assert!(got[2].client_cert && got[2].header("authorization").is_none());

        // Neither credential: one error naming the token and the certificate, nothing sent.
        std::fs::remove_file(certs.join("cert-chain.pem")).expect("rm");
        let e = c.sign(&csr()).await.expect_err("no credential");
        assert!(matches!(e, Error::NoCredential { .. }), "{e}");
        assert_eq!(e.reason(), "no_credential");
        let msg = e.to_string();
        assert!(
            msg.contains(&token_path.display().to_string())
                && msg.contains("does not exist")
                && msg.contains("PROV_CERT has no valid client certificate")
                && msg.contains("cert-chain.pem"),
            "{msg}"
        );
        std::fs::write(token_path, jwt(SystemTime::now() - Duration::from_secs(30)))
            .expect("write");
        let e = c
            .sign(&csr())
            .await
            .expect_err("expired token, no certificate");
        assert!(matches!(e, Error::TokenExpired { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("expired at") && msg.contains("PROV_CERT has no valid client certificate"),
            "{msg}"
        );
        assert_eq!(
            ca.received().len(),
            3,
            "a call without credentials was sent"
        );
        assert!(
            metrics_text(&reg).contains("csr_failures_total{reason=\"no_credential\"} 1"),
            "{}",
            metrics_text(&reg)
        );
    }

    #[tokio::test]
    async fn expired_token_is_not_sent_and_a_replaced_one_is() {
        let ca = FakeCa::start_plaintext();
        let base = tempfile::tempdir().expect("tempdir");
        // A plaintext CA: sending the token there has to be allowed explicitly.
        let (c, cfg, reg) = client_with(ca.ca_addr(), base.path(), true, true);
        let token_path = &cfg.token_path;
        std::fs::create_dir_all(token_path.parent().expect("parent")).expect("mkdir");

        let expired = jwt(SystemTime::now() - Duration::from_secs(30));
        std::fs::write(token_path, &expired).expect("write");
        let e = c.sign(&csr()).await.expect_err("expired token");
        assert!(matches!(e, Error::TokenExpired { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains(&token_path.display().to_string()) && msg.contains("expired at"),
            "{msg}"
        );
        assert!(ca.received().is_empty(), "an expired token was sent");

        // A new token in the same file: the next call sends it.
        let fresh = jwt(SystemTime::now() + Duration::from_secs(3600));
        std::fs::write(token_path, &fresh).expect("write");
        c.sign(&csr()).await.expect("fresh token");
        let got = ca.received();
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].header("authorization"),
            Some(format!("Bearer {fresh}").as_str())
        );

        // An opaque (non-JWT) token is sent as it is.
        std::fs::write(token_path, "opaque").expect("write");
        c.sign(&csr()).await.expect("opaque token");

        let out = metrics_text(&reg);
        assert!(
            out.contains("csr_failures_total{reason=\"token_expired\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("num_outgoing_requests_total{request_type=\"csr\"} 2"),
            "{out}"
        );
    }

    #[tokio::test]
    async fn unreachable_ca_counts_one_failure_per_call_by_reason() {
        let base = tempfile::tempdir().expect("tempdir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let (c, _, reg) = client_at(format!("127.0.0.1:{port}"), base.path(), true);
        let e = c.sign(&csr()).await.expect_err("nobody listens");
        assert_eq!(e.reason(), "unavailable", "{e}");
        let out = metrics_text(&reg);
        assert!(
            out.contains("csr_failures_total{reason=\"unavailable\"} 1"),
            "{out}"
        );
        assert!(
            out.contains(&format!(
                "num_outgoing_requests_total{{request_type=\"csr\"}} {MAX_ATTEMPTS}"
            )),
            "{out}"
        );
    }

    #[tokio::test]
    async fn a_list_of_cas_fails_over_past_a_dead_one_and_stays_on_the_live_one() {
        let ca = FakeCa::start_plaintext();
        let base = tempfile::tempdir().expect("tempdir");
        let dead = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port");
        let (c, _, reg) = client_at(format!("{dead}, {}", ca.ca_addr()), base.path(), true);
        let chain = c.sign(&csr()).await.expect("signed by the second CA");
        assert!(chain.len() >= 2);
        // One failed attempt at the dead address, then the live one; the next call goes straight
        // to the live one.
        c.sign(&csr()).await.expect("signed again");
        let out = metrics_text(&reg);
        assert!(
            out.contains("num_outgoing_requests_total{request_type=\"csr\"} 3"),
            "{out}"
        );
        assert!(
            out.contains("num_outgoing_retries_total{request_type=\"csr\"} 1"),
            "{out}"
        );
        // A bad entry is an error naming CA_ADDR and the entry.
        let cfg = Config {
            ca_addr: "127.0.0.1:1,:2".into(),
            ..Config::defaults(base.path())
        };
        let mut reg = prometheus_client::registry::Registry::default();
        let e = CaClient::new(&cfg, Arc::new(Metrics::new(&mut reg)))
            .err()
            .expect("bad entry");
        assert!(
            e.to_string().contains("CA_ADDR") && e.to_string().contains("\":2\""),
            "{e}"
        );
    }

    #[tokio::test]
    async fn no_token_goes_over_plaintext_unless_allowed() {
        let ca = FakeCa::start_plaintext();
        let base = tempfile::tempdir().expect("tempdir");
        let (c, cfg, reg) = client_at(ca.ca_addr(), base.path(), true);
        assert!(!cfg.allow_plaintext_token);
        let token_path = &cfg.token_path;
        std::fs::create_dir_all(token_path.parent().expect("parent")).expect("mkdir");
        let token = jwt(SystemTime::now() + Duration::from_secs(3600));
        std::fs::write(token_path, &token).expect("write");
        let e = c.sign(&csr()).await.expect_err("token over plaintext");
        assert!(matches!(e, Error::PlaintextToken { .. }), "{e}");
        assert_eq!(e.reason(), "plaintext_token");
        let msg = e.to_string();
        assert!(
            msg.contains(&token_path.display().to_string())
                && msg.contains(&ca.ca_addr())
                && msg.contains("plaintext")
                && msg.contains("15012")
                && msg.contains("CA_ALLOW_PLAINTEXT_TOKEN=true"),
            "{msg}"
        );
        assert!(ca.received().is_empty(), "the token was sent in clear");
        assert!(
            metrics_text(&reg).contains("csr_failures_total{reason=\"plaintext_token\"} 1"),
            "{}",
            metrics_text(&reg)
        );

        // An `http://` address is plaintext too, whatever the port.
        let (h, hcfg, _) = client_at(format!("http://{}", ca.ca_addr()), base.path(), false);
        assert_eq!(hcfg.token_path, *token_path);
        let e = h.sign(&csr()).await.expect_err("token over http://");
        assert!(matches!(e, Error::PlaintextToken { .. }), "{e}");
        assert!(ca.received().is_empty(), "the token was sent in clear");

        // Explicitly allowed: sent as is.
        let (ok, _, _) = client_with(ca.ca_addr(), base.path(), true, true);
        ok.sign(&csr()).await.expect("allowed");
        let got = ca.received();
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].header("authorization"),
            Some(format!("Bearer {token}").as_str())
        );
    }

    #[tokio::test]
    async fn plaintext_needs_no_root() {
        let ca = FakeCa::start_plaintext();
        let base = tempfile::tempdir().expect("tempdir");
        let c = client(&ca, base.path(), true);
        assert_eq!(c.sign(&csr()).await.expect("signed").len(), 2);
    }
}
