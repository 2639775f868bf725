//! The identity crate's typed configuration. [`Config::defaults`] holds Istio's defaults; the
//! agent's configuration module maps Istio's environment variables onto its fields (this crate
//! reads no environment).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::tls::RootSource;

/// Istio's default CA address when neither `CA_ADDR` nor a discovery address is configured.
pub const DEFAULT_CA_ADDR: &str = "istiod.istio-system.svc:15012";
/// TLS ServerName for [`DEFAULT_CA_ADDR`] (its host).
pub const DEFAULT_CA_SERVER_NAME: &str = "istiod.istio-system.svc";
/// ServerName used when the CA host contains `localhost`.
pub const LOCALHOST_SERVER_NAME: &str = "istiod.istio-system.svc";
/// SDS socket file name in [`paths::WORKLOAD_SPIFFE_UDS`] (`WORKLOAD_IDENTITY_SOCKET_FILE`).
pub const DEFAULT_SOCKET_FILE: &str = "socket";

/// Relative paths, resolved against [`Config::base_dir`].
pub mod paths {
    /// The projected service account token (`third-party-jwt`).
    pub const TOKEN: &str = "var/run/secrets/tokens/istio-token";
    /// The mesh root certificate istiod's `istio-ca-root-cert` ConfigMap mounts.
    pub const ISTIO_ROOT: &str = "var/run/secrets/istio/root-cert.pem";
    /// Istio's cert directory: `default`/`ROOTCA` come from it when its files are present.
    pub const ETC_CERTS: &str = "etc/certs";
    /// SPIFFE credentials mounted in the workload's folder (selects file-mounted certificates).
    pub const WORKLOAD_SPIFFE_CREDENTIALS: &str = "var/run/secrets/workload-spiffe-credentials";
    /// The directory of the workload identity SDS socket.
    pub const WORKLOAD_SPIFFE_UDS: &str = "var/run/secrets/workload-spiffe-uds";
    /// The CA's certificate revocation list (`PILOT_ENABLE_CA_CRL`).
    pub const CRL: &str = "var/run/secrets/istio/crl/ca-crl.pem";
    /// The credential-name SDS socket an external server may offer (`sds-external` cluster).
    pub const CREDENTIAL_SOCKET: &str = "var/run/secrets/credential-uds/socket";
    /// Where the agent's own SDS server listens when an external server (SPIRE) owns the
    /// workload socket: it then serves file certificates only (`sds-files-grpc` cluster).
    pub const FILE_CREDENTIAL_SOCKET: &str = "var/run/secrets/credential-uds/files-socket";
}

/// File names inside a cert directory (`./etc/certs`, `PROV_CERT`, `OUTPUT_CERTS`, ...).
pub const CERT_CHAIN_FILE: &str = "cert-chain.pem";
/// The private key's file name in a cert directory.
pub const KEY_FILE: &str = "key.pem";
/// The root certificate's file name in a cert directory.
pub const ROOT_CERT_FILE: &str = "root-cert.pem";

/// OS CA bundles, first existing wins (`file-root:system`, `CA_ROOT_CA=SYSTEM` falls back to
/// the platform verifier instead).
pub const SYSTEM_ROOT_CANDIDATES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Workload key type (`ECC_SIGNATURE_ALGORITHM`, `ECC_CURVE`, `WORKLOAD_RSA_KEY_SIZE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum KeyAlgorithm {
    /// RSA with this many bits (2048, 3072 or 4096).
    Rsa(u32),
    EcdsaP256,
    EcdsaP384,
}

/// A directory holding `cert-chain.pem`, `key.pem` and `root-cert.pem`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CertDir {
    pub cert_chain: PathBuf,
    pub key: PathBuf,
    pub root: PathBuf,
}

impl CertDir {
    /// The standard Istio file names inside `dir`.
    pub fn istio(dir: &Path) -> CertDir {
        CertDir {
            cert_chain: dir.join(CERT_CHAIN_FILE),
            key: dir.join(KEY_FILE),
            root: dir.join(ROOT_CERT_FILE),
        }
    }
}

/// Everything the identity crate needs, parsed and validated once.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Config {
    /// Directory Istio's relative paths are resolved against (`/` in a pod).
    pub base_dir: PathBuf,
    /// `TRUST_DOMAIN` (cluster.local).
    pub trust_domain: String,
    /// `POD_NAMESPACE`.
    pub namespace: String,
    /// `SERVICE_ACCOUNT`.
    pub service_account: String,
    /// `CA_ADDR` (host:port); the agent may overwrite it with the discovery address.
    pub ca_addr: String,
    /// True when `CA_ADDR` ends in `:15010` (Istio's plaintext port).
    pub ca_plaintext: bool,
    /// Root the CA's serving certificate is verified against (`CA_ROOT_CA` and fallbacks).
    pub ca_root: RootSource,
    /// TLS ServerName for the CA (`ISTIOD_SAN`, else from the CA host).
    pub ca_server_name: String,
    /// `PROV_CERT`: client identity directory for the CA connection (VMs).
    pub prov_cert: Option<CertDir>,
    /// `ISTIO_META_CLUSTER_ID`, sent as the `ClusterID` header.
    pub cluster_id: String,
    /// `CA_HEADER_<K>=<V>`, sent as extra gRPC metadata, sorted by key.
    pub ca_headers: Vec<(String, String)>,
    /// `ISTIO_META_CERT_SIGNER`, sent as CSR body metadata `CertSigner`.
    pub cert_signer: String,
    /// `./var/run/secrets/tokens/istio-token`, re-read on every CA call.
    pub token_path: PathBuf,
    /// `SECRET_TTL` (24h): requested certificate validity.
    pub secret_ttl: Duration,
    /// `SECRET_GRACE_PERIOD_RATIO` (0.5).
    pub grace_ratio: f64,
    /// `SECRET_GRACE_PERIOD_RATIO_JITTER` (0.01).
    pub grace_ratio_jitter: f64,
    /// Workload key type.
    pub key_algorithm: KeyAlgorithm,
    /// `PKCS8_KEY`: `PRIVATE KEY` PEM instead of `RSA PRIVATE KEY`/`EC PRIVATE KEY`.
    pub pkcs8_key: bool,
    /// `OUTPUT_CERTS`: directory the workload key, chain and root are written to on change.
    pub output_certs: Option<PathBuf>,
    /// Mode of the `OUTPUT_CERTS` files: 0644 in Kubernetes (`KUBERNETES_SERVICE_HOST` set: the
    /// pod's other containers, such as a proxyless gRPC app, read them), else 0600 (Istio).
    pub output_certs_mode: u32,
    /// The SDS Unix socket (`./var/run/secrets/workload-spiffe-uds/<WORKLOAD_IDENTITY_SOCKET_FILE>`).
    pub socket_path: PathBuf,
    /// `./etc/certs`: used for `default`/`ROOTCA` when the files are present and non-empty.
    pub etc_certs: CertDir,
    /// When set, `default` and `ROOTCA` come only from these files and the CA is never called
    /// (`FILE_MOUNTED_CERTS=true` uses `./etc/certs`; a complete
    /// `./var/run/secrets/workload-spiffe-credentials/` also selects this mode).
    pub file_mounted_certs: Option<CertDir>,
    /// `FILE_DEBOUNCE_DURATION` (100ms): initial backoff when re-reading changed files.
    pub file_debounce: Duration,
    /// CRL file added to `ROOTCA` when it exists and `PILOT_ENABLE_CA_CRL` is true.
    pub crl_path: Option<PathBuf>,
    /// Maximum backoff between failed CA refreshes (not an Istio variable; 60 s).
    pub max_backoff: Duration,
    /// HTTP/2 keepalive (interval, timeout) on the CA channel; Istio dials with 30s/10s.
    pub grpc_keepalive: Option<(Duration, Duration)>,
    /// `COMPLIANCE_POLICY`: the TLS versions, suites and groups of the CA connection.
    pub compliance: crate::tls::Compliance,
    /// Send the bearer token even when the CA is reached over plaintext (`CA_ADDR` ending in
    /// `:15010` or starting with `http://`). Default false: such a call fails with
    /// [`crate::Error::PlaintextToken`] before anything is sent. Env:
    /// [`crate::ca::ALLOW_PLAINTEXT_TOKEN_ENV`] (not an Istio variable).
    pub allow_plaintext_token: bool,
    /// An external SDS server (SPIRE) owns the workload identity socket: this crate's server
    /// serves only file certificates (`file-cert:`/`file-root:`, `./etc/certs`), never calls
    /// the CA, and does not warm `default`/`ROOTCA` (Istio's `ServeOnlyFiles`).
    pub serve_only_files: bool,
}

/// The `OUTPUT_CERTS` file mode: 0644 in Kubernetes (`KUBERNETES_SERVICE_HOST` set: the pod's
/// other containers, such as a proxyless gRPC app, read them), else 0600 (Istio).
pub fn output_certs_mode(in_kubernetes: bool) -> u32 {
    if in_kubernetes { 0o644 } else { 0o600 }
}

impl Config {
    /// Istio's defaults with every relative path under `base_dir`: the CA at
    /// `istiod.istio-system.svc:15012` over TLS verified against `./var/run/secrets/istio/root-cert.pem`,
    /// trust domain `cluster.local`, 24h certificates rotated at half their life (jitter 0.01),
    /// RSA 2048 keys, the SDS socket `./var/run/secrets/workload-spiffe-uds/socket`, the CRL on,
    /// and no token sent over plaintext. Reads neither the environment nor the filesystem: the
    /// agent's configuration overrides fields from its inputs.
    pub fn defaults(base_dir: &Path) -> Config {
        let base = |rel: &str| base_dir.join(rel);
        Config {
            base_dir: base_dir.to_path_buf(),
            trust_domain: "cluster.local".to_string(),
            namespace: String::new(),
            service_account: String::new(),
            ca_addr: DEFAULT_CA_ADDR.to_string(),
            ca_plaintext: false,
            ca_root: RootSource::File(base(paths::ISTIO_ROOT)),
            ca_server_name: DEFAULT_CA_SERVER_NAME.to_string(),
            prov_cert: None,
            cluster_id: String::new(),
            ca_headers: Vec::new(),
            cert_signer: String::new(),
            token_path: base(paths::TOKEN),
            secret_ttl: Duration::from_secs(24 * 3600),
            grace_ratio: 0.5,
            grace_ratio_jitter: 0.01,
            key_algorithm: KeyAlgorithm::Rsa(2048),
            pkcs8_key: false,
            output_certs: None,
            output_certs_mode: 0o600,
            socket_path: base(paths::WORKLOAD_SPIFFE_UDS).join(DEFAULT_SOCKET_FILE),
            etc_certs: CertDir::istio(&base(paths::ETC_CERTS)),
            file_mounted_certs: None,
            file_debounce: Duration::from_millis(100),
            crl_path: Some(base(paths::CRL)),
            max_backoff: Duration::from_secs(60),
            grpc_keepalive: Some(crate::tls::DEFAULT_KEEPALIVE),
            compliance: crate::tls::Compliance::None,
            allow_plaintext_token: false,
            serve_only_files: false,
        }
    }

    /// `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`.
    pub fn spiffe_id(&self) -> String {
        format!(
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_istio() {
        let c = Config::defaults(Path::new("/b"));
        assert_eq!(c.trust_domain, "cluster.local");
        assert_eq!(c.ca_addr, DEFAULT_CA_ADDR);
        assert_eq!(c.secret_ttl, Duration::from_secs(86400));
        assert_eq!(c.grace_ratio, 0.5);
        assert_eq!(c.grace_ratio_jitter, 0.01);
        assert_eq!(c.key_algorithm, KeyAlgorithm::Rsa(2048));
        assert!(!c.pkcs8_key);
        assert_eq!(
            c.ca_root,
            RootSource::File("/b/var/run/secrets/istio/root-cert.pem".into())
        );
        assert_eq!(c.ca_server_name, "istiod.istio-system.svc");
        assert!(
            DEFAULT_CA_ADDR.starts_with(&format!("{DEFAULT_CA_SERVER_NAME}:")),
            "the default ServerName is the default CA's host"
        );
        assert!(!c.ca_plaintext);
        assert_eq!(
            c.socket_path,
            Path::new("/b/var/run/secrets/workload-spiffe-uds/socket")
        );
        assert_eq!(
            c.token_path,
            Path::new("/b/var/run/secrets/tokens/istio-token")
        );
        assert_eq!(c.etc_certs, CertDir::istio(Path::new("/b/etc/certs")));
        assert!(c.file_mounted_certs.is_none());
        assert!(c.output_certs.is_none());
        assert_eq!(c.file_debounce, Duration::from_millis(100));
        assert_eq!(
            c.crl_path.as_deref(),
            Some(Path::new("/b/var/run/secrets/istio/crl/ca-crl.pem"))
        );
        assert_eq!(c.max_backoff, Duration::from_secs(60));
        assert_eq!(c.grpc_keepalive, Some(crate::tls::DEFAULT_KEEPALIVE));
        assert!(
            !c.allow_plaintext_token,
            "no token over plaintext by default"
        );
    }

    #[test]
    fn spiffe_id_from_trust_domain_namespace_and_account() {
        let c = Config {
            trust_domain: "td".into(),
            namespace: "ns1".into(),
            service_account: "sa1".into(),
            ..Config::defaults(Path::new("/b"))
        };
        assert_eq!(c.spiffe_id(), "spiffe://td/ns/ns1/sa/sa1");
    }
}
