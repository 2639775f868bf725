//! The certificate authority: root material in `--ca-dir`, CSR signing, the serving certificate
//! for the secure gRPC port, and the issuer key that `istiod-lite token` signs with.
//!
//! Files in the CA directory (Istio's plug-in `cacerts` names):
//! - `ca-cert.pem`, `ca-key.pem`: the signing CA (the root itself when self-signed);
//! - `cert-chain.pem`: the signing CA's chain up to the root;
//! - `root-cert.pem`: the root workloads trust;
//! - `issuer-key.pem`: the ES256 key tokens are signed with (this CA's stand-in for the
//!   Kubernetes service-account issuer).
//!
//! When the four `cacerts` files are absent, a self-signed root (10 years) is created once and
//! written as those same files with mode 0600, so a restart keeps the same root.
//!
//! Replaced `cacerts` are picked up while serving ([`Reloader`]): the new CA signs from then on
//! and the old roots stay in the trust bundle until the certificates signed under them expire.
//! Those old roots are kept in `previous-roots.json` (with the time each may leave the bundle),
//! so a restart during that overlap still trusts them.

mod authn;
mod csr_policy;
mod issued_until;
mod previous_roots;
mod reload;
mod service;
mod token;

pub use authn::{Authenticator, peer_certs};
pub use previous_roots::PREVIOUS_ROOTS;
pub use reload::{Reloader, SharedCa};
pub use service::{CaMetrics, CaService};
pub use token::{Claims, DEFAULT_CLOCK_SKEW as DEFAULT_TOKEN_CLOCK_SKEW, KeyError, TokenIssuer};

#[cfg(test)]
use issued_until::ISSUED_UNTIL;
#[cfg(test)]
use reload::Reloaded;
#[cfg(test)]
use token::TokenError;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};

/// Lifetime of the self-signed root.
pub const ROOT_TTL: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Longest workload certificate this CA issues.
pub const MAX_WORKLOAD_TTL: Duration = Duration::from_secs(90 * 24 * 3600);
/// Workload certificate lifetime when the request asks for none.
pub const DEFAULT_WORKLOAD_TTL: Duration = Duration::from_secs(24 * 3600);
/// Largest CSR (PEM text) the CA reads; a workload CSR is about 1 KiB.
pub const MAX_CSR_BYTES: usize = 64 * 1024;
/// Smallest RSA modulus accepted in a CSR.
pub const MIN_RSA_BITS: usize = 2048;
/// Names always in the serving certificate of the secure gRPC port.
pub const DEFAULT_SERVING_SANS: [&str; 3] = ["istiod.istio-system.svc", "istiod", "localhost"];

pub const CA_CERT: &str = "ca-cert.pem";
pub const CA_KEY: &str = "ca-key.pem";
pub const CERT_CHAIN: &str = "cert-chain.pem";
pub const ROOT_CERT: &str = "root-cert.pem";
pub const ISSUER_KEY: &str = "issuer-key.pem";

/// CA errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    BadFile { path: PathBuf, reason: String },
    #[error("{path}: {source}")]
    TokenKey {
        path: PathBuf,
        #[source]
        source: KeyError,
    },
    #[error(
        "{dir}: plug-in cacerts are incomplete: {missing} is missing (need ca-cert.pem, ca-key.pem, root-cert.pem, cert-chain.pem, or none of them)"
    )]
    IncompletePlugin { dir: PathBuf, missing: &'static str },
    #[error("unparsable CSR: {0}")]
    Csr(String),
    #[error("CSR rejected: {0}")]
    CsrRejected(String),
    #[error("signing failed: {0}")]
    Sign(String),
    #[error("invalid identity {identity:?}: {reason}")]
    Identity { identity: String, reason: String },
}

/// A workload identity: `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    pub trust_domain: String,
    pub namespace: String,
    pub service_account: String,
}

impl Identity {
    pub fn new(trust_domain: &str, namespace: &str, service_account: &str) -> Self {
        Identity {
            trust_domain: trust_domain.to_string(),
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
        }
    }

    /// Parses a SPIFFE URI.
    pub fn parse_spiffe(uri: &str) -> Result<Self, Error> {
        let bad = |reason: &str| Error::Identity {
            identity: uri.to_string(),
            reason: reason.to_string(),
        };
        let rest = uri
            .strip_prefix("spiffe://")
            .ok_or_else(|| bad("expected spiffe://<trust domain>/ns/<ns>/sa/<sa>"))?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            [td, "ns", ns, "sa", sa] if !td.is_empty() && !ns.is_empty() && !sa.is_empty() => {
                Ok(Identity::new(td, ns, sa))
            }
            _ => Err(bad("expected spiffe://<trust domain>/ns/<ns>/sa/<sa>")),
        }
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

/// The signing CA loaded from (or created in) the CA directory.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// PEM of every certificate between the leaf and the roots: signing CA, intermediates.
    chain: Vec<String>,
    /// Every certificate in `root-cert.pem` (an operator may put old and new roots there).
    roots: Vec<String>,
    /// `not_after` of the signing CA certificate: no leaf outlives it.
    signer_not_after: SystemTime,
    /// Roots of CAs this one replaced, still trusted while certificates they signed may be valid.
    retired: Vec<RetiredRoot>,
    /// Latest `not_after` of any workload certificate this CA signed.
    issued_until: Mutex<SystemTime>,
    /// What `issued-until.json` holds for this CA (rounded up to the hour).
    recorded_until: Mutex<SystemTime>,
    /// Contents of the four `cacerts` files this CA was loaded from.
    files: CaFiles,
    dir: PathBuf,
    plugin: bool,
}

/// A root of a replaced CA and how long it stays in the trust bundle.
#[derive(Clone, Debug)]
struct RetiredRoot {
    pem: String,
    until: SystemTime,
}

/// Contents of `ca-cert.pem`, `ca-key.pem`, `root-cert.pem`, `cert-chain.pem`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaFiles(Vec<Vec<u8>>);

impl CaFiles {
    /// Reads the four files; `None` when any is missing or unreadable (e.g. mid-replacement).
    pub fn read(dir: &Path) -> Option<CaFiles> {
        [CA_CERT, CA_KEY, ROOT_CERT, CERT_CHAIN]
            .iter()
            .map(|n| std::fs::read(dir.join(n)).ok())
            .collect::<Option<Vec<_>>>()
            .map(CaFiles)
    }
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("dir", &self.dir)
            .field("plugin", &self.plugin)
            .field("roots", &self.roots.len())
            .field("retired", &self.retired.len())
            .finish_non_exhaustive()
    }
}

/// A signed certificate and its key (for the serving certificate).
pub struct IssuedKeyPair {
    /// Leaf first, root last, PEM concatenated.
    pub chain_pem: String,
    pub key_pem: String,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `contents` to a new file with mode 0600; fails if it exists.
pub(crate) fn write_private(path: &Path, contents: &[u8]) -> Result<(), Error> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err(path))?;
    f.write_all(contents).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}

/// Splits a PEM bundle into its `CERTIFICATE` blocks (each re-encoded as PEM with a trailing newline).
pub fn split_pem_certs(bundle: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut inside = false;
    for line in bundle.lines() {
        let line = line.trim();
        if line == "-----BEGIN CERTIFICATE-----" {
            inside = true;
            cur.clear();
        }
        if inside {
            cur.push_str(line);
            cur.push('\n');
        }
        if line == "-----END CERTIFICATE-----" && inside {
            inside = false;
            out.push(std::mem::take(&mut cur));
        }
    }
    out
}

fn pem_der(pem_str: &str) -> Option<Vec<u8>> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem_str.as_bytes()).ok()?;
    Some(pem.contents)
}

fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

fn to_offset(t: SystemTime) -> time::OffsetDateTime {
    time::OffsetDateTime::from(t)
}

/// A certificate time (Unix seconds, possibly before the epoch) as `SystemTime`.
fn unix_time(secs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

impl Ca {
    /// Loads the plug-in `cacerts` in `dir`, or creates a self-signed root there on first start.
    /// The roots of CAs replaced before a restart are read back from `previous-roots.json`
    /// (expired and malformed entries dropped, with a warning for the malformed ones).
    pub fn load_or_create(dir: &Path) -> Result<Ca, Error> {
        let mut ca = Self::load_or_create_cacerts(dir)?;
        let now = SystemTime::now();
        let (retired, stale) = previous_roots::load(dir, &ca.roots, now);
        if !retired.is_empty() {
            tracing::info!(
                dir = %dir.display(),
                previous_roots = retired.len(),
                "trust bundle holds the roots of replaced CAs until the certificates they signed expire"
            );
        }
        ca.retired = retired;
        // Certificates this CA signed before the restart: a replacement keeps its root for them.
        if let Some(until) = issued_until::load(dir, ca.ca_cert_pem(), now) {
            *ca.issued_until.lock().unwrap_or_else(|p| p.into_inner()) = until;
            *ca.recorded_until.lock().unwrap_or_else(|p| p.into_inner()) = until;
        }
        if stale && let Err(e) = ca.persist_previous_roots_at(now) {
            tracing::warn!(error = %e, "cannot rewrite the previous CA roots without their expired entries");
        }
        Ok(ca)
    }

    fn load_or_create_cacerts(dir: &Path) -> Result<Ca, Error> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let names = [CA_CERT, CA_KEY, ROOT_CERT, CERT_CHAIN];
        let present: Vec<bool> = names.iter().map(|n| dir.join(n).exists()).collect();
        if present.iter().all(|p| !p) {
            Self::create_self_signed(dir)?;
            return Self::load(dir, false);
        }
        Self::load_present(dir)
    }

    /// Loads the four `cacerts` files in `dir`; never creates anything.
    fn load_present(dir: &Path) -> Result<Ca, Error> {
        let names = [CA_CERT, CA_KEY, ROOT_CERT, CERT_CHAIN];
        if let Some(missing) = names.iter().find(|n| !dir.join(n).exists()) {
            return Err(Error::IncompletePlugin {
                dir: dir.to_path_buf(),
                missing,
            });
        }
        let self_signed = std::fs::read_to_string(dir.join(CA_CERT)).ok()
            == std::fs::read_to_string(dir.join(ROOT_CERT)).ok();
        Self::load(dir, !self_signed)
    }

    fn create_self_signed(dir: &Path) -> Result<(), Error> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| Error::Sign(e.to_string()))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "cluster.local");
        dn.push(DnType::CommonName, "istiod-lite root CA");
        params.distinguished_name = dn;
        let now = SystemTime::now();
        params.not_before = to_offset(now - Duration::from_secs(60));
        params.not_after = to_offset(now + ROOT_TTL);
        params.serial_number = Some(random_serial());
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params
            .self_signed(&key)
            .map_err(|e| Error::Sign(e.to_string()))?;
        let cert_pem = cert.pem();
        // Key first: a crash in between leaves an incomplete set that the next start reports.
        write_private(&dir.join(CA_KEY), key.serialize_pem().as_bytes())?;
        write_private(&dir.join(CA_CERT), cert_pem.as_bytes())?;
        write_private(&dir.join(CERT_CHAIN), cert_pem.as_bytes())?;
        write_private(&dir.join(ROOT_CERT), cert_pem.as_bytes())?;
        tracing::info!(dir = %dir.display(), "created self-signed root CA");
        Ok(())
    }

    fn load(dir: &Path, plugin: bool) -> Result<Ca, Error> {
        let read = |name: &str| -> Result<String, Error> {
            let p = dir.join(name);
            std::fs::read_to_string(&p).map_err(io_err(&p))
        };
        let bad = |name: &str, reason: String| Error::BadFile {
            path: dir.join(name),
            reason,
        };
        let files = CaFiles::read(dir);
        let ca_cert = read(CA_CERT)?;
        let ca_key = read(CA_KEY)?;
        let root = read(ROOT_CERT)?;
        let chain = read(CERT_CHAIN)?;
        let key = KeyPair::from_pem(&ca_key)
            .map_err(|e| bad(CA_KEY, format!("not a usable private key: {e}")))?;
        let ca_pem = split_pem_certs(&ca_cert)
            .into_iter()
            .next()
            .ok_or_else(|| bad(CA_CERT, "holds no CERTIFICATE block".into()))?;
        let ca_der = pem_der(&ca_pem)
            .ok_or_else(|| bad(CA_CERT, "holds an unparsable certificate".into()))?;
        let (_, parsed) = x509_parser::parse_x509_certificate(&ca_der)
            .map_err(|e| bad(CA_CERT, format!("unparsable certificate: {e}")))?;
        // A half-replaced set (new certificate, old key) must not sign anything.
        if parsed.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            return Err(bad(
                CA_KEY,
                format!("does not match the public key of {CA_CERT}"),
            ));
        }
        let signer_not_after = unix_time(parsed.validity().not_after.timestamp());
        let issuer = Issuer::from_ca_cert_pem(&ca_cert, key)
            .map_err(|e| bad(CA_CERT, format!("not a usable CA certificate: {e}")))?;
        let roots = split_pem_certs(&root);
        if roots.is_empty() {
            return Err(bad(ROOT_CERT, "holds no CERTIFICATE block".into()));
        }
        let mut root_ders = Vec::new();
        for r in &roots {
            root_ders.push(
                pem_der(r)
                    .ok_or_else(|| bad(ROOT_CERT, "holds an unparsable certificate".into()))?,
            );
        }
        // Between the leaf and the roots: signing CA, then cert-chain.pem's entries; no
        // duplicates, no roots (the trust bundle comes last).
        let mut ordered: Vec<String> = Vec::new();
        let mut seen: Vec<Vec<u8>> = Vec::new();
        for pem in std::iter::once(ca_pem).chain(split_pem_certs(&chain)) {
            let Some(der) = pem_der(&pem) else {
                return Err(bad(CERT_CHAIN, "holds an unparsable certificate".into()));
            };
            if root_ders.contains(&der) || seen.contains(&der) {
                continue;
            }
            seen.push(der);
            ordered.push(pem);
        }
        Ok(Ca {
            issuer,
            chain: ordered,
            roots,
            signer_not_after,
            retired: Vec::new(),
            issued_until: Mutex::new(SystemTime::UNIX_EPOCH),
            recorded_until: Mutex::new(SystemTime::UNIX_EPOCH),
            files: files.unwrap_or(CaFiles(Vec::new())),
            dir: dir.to_path_buf(),
            plugin,
        })
    }

    /// Loads the `cacerts` now in the CA directory as this CA's successor: it signs from now
    /// on, and this CA's roots (and the retired roots still in their overlap) stay in the trust
    /// bundle until every workload certificate signed under them has expired.
    pub fn successor(&self) -> Result<Ca, Error> {
        let mut next = Self::load_present(&self.dir)?;
        let now = SystemTime::now();
        let until = *self.issued_until.lock().unwrap_or_else(|p| p.into_inner());
        let current: Vec<Option<Vec<u8>>> = next.roots.iter().map(|r| pem_der(r)).collect();
        let mut retired: Vec<RetiredRoot> = Vec::new();
        let candidates = self
            .roots
            .iter()
            .map(|pem| RetiredRoot {
                pem: pem.clone(),
                until,
            })
            .chain(self.retired.iter().cloned());
        for r in candidates {
            let der = pem_der(&r.pem);
            if r.until <= now || current.contains(&der) {
                continue;
            }
            match retired.iter_mut().find(|x| pem_der(&x.pem) == der) {
                Some(x) => x.until = x.until.max(r.until),
                None => retired.push(r),
            }
        }
        next.retired = retired;
        Ok(next)
    }

    /// Writes the retired roots still in their overlap at `now` to `previous-roots.json` in the
    /// CA directory (removes it when there are none).
    pub fn persist_previous_roots_at(&self, now: SystemTime) -> Result<(), Error> {
        previous_roots::store(&self.dir, &self.retired, now)
    }

    /// The earliest time after `now` a retired root leaves the trust bundle.
    pub fn next_root_expiry(&self, now: SystemTime) -> Option<SystemTime> {
        self.retired
            .iter()
            .map(|r| r.until)
            .filter(|t| *t > now)
            .min()
    }

    /// The contents of the `cacerts` files this CA was loaded from.
    pub fn files(&self) -> &CaFiles {
        &self.files
    }

    /// The trust bundle: every root of `root-cert.pem`, then the retired roots still in their
    /// overlap (PEM, one certificate each).
    pub fn trust_bundle(&self) -> Vec<String> {
        let now = SystemTime::now();
        self.roots
            .iter()
            .cloned()
            .chain(
                self.retired
                    .iter()
                    .filter(|r| r.until > now)
                    .map(|r| r.pem.clone()),
            )
            .collect()
    }

    /// The trust bundle as one PEM text.
    pub fn trust_bundle_pem(&self) -> String {
        self.trust_bundle().concat()
    }

    fn note_issued(&self, not_after: SystemTime) {
        {
            let mut until = self.issued_until.lock().unwrap_or_else(|p| p.into_inner());
            *until = (*until).max(not_after);
        }
        // Kept on disk too (at most once an hour), so a restart does not forget it.
        let rounded = issued_until::round_up(not_after);
        let mut recorded = self
            .recorded_until
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if rounded > *recorded {
            match issued_until::store(&self.dir, self.ca_cert_pem(), rounded) {
                Ok(()) => *recorded = rounded,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot record when this CA's certificates expire; a replacement after a restart may drop its root early")
                }
            }
        }
    }

    /// The signing CA's certificate (PEM): the first of the chain, or the root when the root
    /// signs itself.
    fn ca_cert_pem(&self) -> &str {
        self.chain.first().unwrap_or(&self.roots[0])
    }

    /// The first root of `root-cert.pem` (PEM).
    pub fn root_pem(&self) -> &str {
        &self.roots[0]
    }

    /// True when the material came from plug-in `cacerts` rather than our own self-signed root.
    pub fn is_plugin(&self) -> bool {
        self.plugin
    }

    /// Signs a workload CSR for `identity`; the SAN comes from `identity`, never from the CSR.
    /// The lifetime is `ttl`, at most `MAX_WORKLOAD_TTL` (90 days) and never past the signing CA
    /// certificate's own expiry (a CA that has expired signs nothing). Returns the chain leaf first, then the intermediates, then the trust bundle as one entry
    /// (as Istio does: with one root that is the root; during a root change the last entry
    /// holds every trusted root, and agents take it as their ROOTCA).
    pub fn sign_workload(
        &self,
        csr_pem: &str,
        identity: &Identity,
        ttl: Duration,
    ) -> Result<Vec<String>, Error> {
        let checked = csr_policy::check_csr(csr_pem)?;
        let csr = CertificateSigningRequestParams::from_der(&checked.der.into())
            .map_err(|e| Error::Csr(e.to_string()))?;
        let key = LeafKey {
            alg: checked
                .curve
                .unwrap_or_else(|| rcgen::PublicKeyData::algorithm(&csr.public_key)),
            raw: rcgen::PublicKeyData::der_bytes(&csr.public_key).to_vec(),
        };
        let uri = identity.to_string();
        let san = rcgen::string::Ia5String::try_from(uri.clone()).map_err(|e| Error::Identity {
            identity: uri.clone(),
            reason: e.to_string(),
        })?;
        let now = SystemTime::now();
        let remaining = self.signer_not_after.duration_since(now).map_err(|_| {
            Error::Sign(format!(
                "the signing CA certificate {} expired at {}: replace the CA files before anything can be signed",
                self.dir.join(CA_CERT).display(),
                to_offset(self.signer_not_after)
            ))
        })?;
        let ttl = ttl.min(MAX_WORKLOAD_TTL).min(remaining);
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = vec![SanType::URI(san)];
        params.not_before = to_offset(now - Duration::from_secs(60).min(ttl));
        params.not_after = to_offset(now + ttl);
        params.serial_number = Some(random_serial());
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| Error::Sign(e.to_string()))?;
        self.note_issued(now + ttl);
        let mut out = vec![cert.pem()];
        out.extend(self.chain.iter().cloned());
        out.push(self.trust_bundle_pem());
        Ok(out)
    }

    /// Issues a serving certificate (P-256) for the given DNS names.
    pub fn issue_serving(
        &self,
        dns_names: &[String],
        ttl: Duration,
    ) -> Result<IssuedKeyPair, Error> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| Error::Sign(e.to_string()))?;
        let mut params =
            CertificateParams::new(dns_names.to_vec()).map_err(|e| Error::Identity {
                identity: dns_names.join(","),
                reason: e.to_string(),
            })?;
        params.distinguished_name = DistinguishedName::new();
        let now = SystemTime::now();
        params.not_before = to_offset(now - Duration::from_secs(60));
        params.not_after = to_offset(now + ttl);
        params.serial_number = Some(random_serial());
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        // Not noted in `issued_until`: the serving certificate is re-issued when the CA is
        // replaced, so it never needs the old root.
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| Error::Sign(e.to_string()))?;
        let mut chain_pem = cert.pem();
        for c in &self.chain {
            chain_pem.push_str(c);
        }
        for r in &self.roots {
            chain_pem.push_str(r);
        }
        Ok(IssuedKeyPair {
            chain_pem,
            key_pem: key.serialize_pem(),
        })
    }
}

/// Reads the identity (URI SAN) from a DER certificate.
pub fn identity_from_cert(der: &[u8]) -> Result<Identity, Error> {
    let bad = |reason: String| Error::Identity {
        identity: "<client certificate>".into(),
        reason,
    };
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| bad(format!("unparsable certificate: {e}")))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| bad(format!("bad SAN extension: {e}")))?
        .ok_or_else(|| bad("no SAN extension".into()))?;
    for name in &san.value.general_names {
        if let x509_parser::extensions::GeneralName::URI(uri) = name
            && uri.starts_with("spiffe://")
        {
            return Identity::parse_spiffe(uri);
        }
    }
    Err(bad("no spiffe:// URI SAN".into()))
}

/// A CSR's public key as the issued certificate carries it: its bytes with the algorithm of its
/// own curve (see `csr_policy::check_csr`).
struct LeafKey {
    alg: &'static rcgen::SignatureAlgorithm,
    raw: Vec<u8>,
}

impl rcgen::PublicKeyData for LeafKey {
    fn der_bytes(&self) -> &[u8] {
        &self.raw
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        self.alg
    }
}

#[cfg(test)]
mod tests;
