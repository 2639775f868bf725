//! Workload identity for the sidecar: keypair and CSR, Istio CA client, secret cache with
//! rotation, and the SDS server Envoy reads its certificates from over a Unix socket.
//!
//! # Public API (what the agent calls)
//!
//! ```text
//! Config::defaults(base_dir) -> Config   // Istio's defaults, no environment (the agent's
//!                                        // config module sets the fields from Istio's variables)
//!   pub fields: base_dir, trust_domain, namespace, service_account, ca_addr, ca_plaintext,
//!   ca_root: RootSource, ca_server_name, prov_cert: Option<CertDir>, cluster_id, ca_headers,
//!   cert_signer, token_path, secret_ttl, grace_ratio, grace_ratio_jitter, key_algorithm,
//!   pkcs8_key, output_certs, socket_path, etc_certs: CertDir, file_mounted_certs: Option<CertDir>,
//!   file_debounce, crl_path, max_backoff, grpc_keepalive, compliance: Compliance,
//!   allow_plaintext_token   // CA_ALLOW_PLAINTEXT_TOKEN, default false
//!   serve_only_files        // an external SDS server (SPIRE) owns the workload socket
//! Config::spiffe_id() -> String
//! Metrics::new(&mut Registry) -> Metrics
//! SecretManager::new(Arc<Config>, Arc<Metrics>) -> Result<SecretManager, Error>   // Clone
//!   .fetch(name).await -> Result<Arc<SecretItem>, Error>   // "default", "ROOTCA", "file-cert:<c>~<k>",
//!                                                          // "file-root:<ca>", "file-root:system"
//!   .warm()                                   // spawn: default then ROOTCA, infinite backoff
//!   .subscribe(name) -> watch::Receiver<Option<Arc<SecretItem>>>   // every new value of `name`
//!   .config() -> &Arc<Config>
//!   .shutdown()                               // stop background tasks (also on last drop)
//! SecretItem { resource_name, cert_chain_pem, private_key_pem, root_cert_pem, expire_time, created_time }
//!   .is_root()                                // ROOTCA / file-root:* (a validation context)
//! SdsServer::bind(&socket_path, manager).await -> Result<SdsServer, Error>   // stale socket removed
//!   .path(), .run(CancellationToken).await -> Result<(), Error>   // socket removed at the end
//! ChannelInputs { addr, plaintext, root: RootSource, server_name, client_identity, keepalive, window, compliance }
//! ChannelInputs::new(addr, root, server_name)  // TLS, no client cert, Istio keepalive 30s/10s, 4 MiB windows
//! RootSource::{System, Pem(Vec<u8>), File(PathBuf)}
//! Compliance::{None, Fips1402, Fips1403, Pqc}   // COMPLIANCE_POLICY: ::parse(value) -> Option,
//!                                           // .provider(), .versions(), .envoy_env()
//! grpc_channel(&ChannelInputs) -> Result<tonic::transport::Channel, Error>   // lazy, non-blocking
//! external::check_socket(&Path, timeout) -> Result<SocketCheck, Error>  // Absent | Healthy |
//!                                           // RemovedStale (a socket nobody answers on)
//! tls::failover::Failover::new(address, plaintext)?   // Istio's one address, or a comma list:
//!   .targets().await, .succeeded(addr), .failed(addr)   // every IP of every entry, in order
//! tls::connect_failover(&ChannelInputs, &Failover, per_target).await -> (Channel, SocketAddr)
//! read_token(&Path) -> Option<String>
//! token::jwt_expiry(&str) -> Option<SystemTime>   // `exp` of a JWT, signature not checked
//! csr::generate(identity, KeyAlgorithm, pkcs8) -> Result<KeyAndCsr, Error>
//! CaClient::new(&Config, Arc<Metrics>)?.sign(csr_pem).await -> Result<Vec<String>, Error>
//! pem::{parse_certs, encode}, x509::{cert_validity, check_key_matches}, timestamp::rfc3339
//! manager::{write_atomic, parse_certs, cert_validity}, server::to_secret   // the last two re-exported
//! ```
//!
//! # Modules, lowest first (a module uses only those above it)
//!
//! ```text
//! pem, x509, timestamp      leaf helpers: PEM blocks, certificate validity and key match, RFC 3339
//! metrics                   prometheus metrics of the crate
//! tls                       gRPC channels (one TLS policy for CA and xDS)          -> pem
//! config                    the typed Config and Istio's defaults                  -> tls
//! token                     the bearer token's own expiry                          -> timestamp
//! csr                       key generation and Istio's CSR                         -> config, pem
//! ca                        IstioCertificateService client     -> config, tls, token, pem, x509, metrics
//! manager (+ rotation, file_secrets, output_certs)
//!                           the secret cache                   -> ca, csr, config, pem, x509, timestamp
//! server                    the SDS gRPC server on a Unix socket          -> manager, timestamp
//! external                  is someone else's SDS server on a socket?     (leaf)
//! testing                   (feature) a fake Istio CA
//! ```
//!
//! Feature `testing` adds [`testing::FakeCa`], an in-process Istio CA (real tonic server on
//! `127.0.0.1:0` over TLS) whose next answers a test sets.
//!
//! Differences from Istio, on purpose: the SDS stream stays open when the CA fails (the
//! request is answered once the secret exists), `DeltaSecrets` is served, and rotation
//! refreshes the certificate in place (the old one keeps being served until the new one is
//! signed, with jittered exponential backoff on failure, capped at a tenth of the certificate's
//! lifetime within 1 s..60 s) instead of clearing the cache first. A JWT token whose `exp` has
//! passed is not sent to the CA. With a valid client certificate (`PROV_CERT`, on a VM the
//! agent's own previous certificate, as `OUTPUT_CERTS` is the same directory) the call goes out
//! over mTLS without it, and a missing token is fine too: the CA authenticates the certificate,
//! as istiod does. With neither, the call fails at once with one error naming the token file
//! (and its expiry time) and why there is no client certificate, counted in
//! `csr_failures_total{reason="token_expired"}` or `{reason="no_credential"}` (not an Istio
//! metric; it counts every failed signing call by reason). Nor is a token sent to a CA reached
//! over plaintext (`:15010`, `http://`) unless `Config::allow_plaintext_token`
//! (`CA_ALLOW_PLAINTEXT_TOKEN=true`): the call fails at once, saying why and how to allow it
//! (`reason="plaintext_token"`).

#![forbid(unsafe_code)]

pub mod ca;
pub mod clock;
pub mod config;
pub mod csr;
pub mod external;
pub mod manager;
pub mod metrics;
pub mod pem;
pub mod server;
pub mod tls;
pub mod token;
pub mod x509;

pub use go_syntax::timestamp;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use ca::CaClient;
pub use config::{CertDir, Config, KeyAlgorithm};
pub use manager::{SecretItem, SecretManager};
pub use metrics::Metrics;
pub use server::SdsServer;
pub use tls::{ChannelInputs, Compliance, RootSource, grpc_channel, read_token};

/// Resource name of the workload certificate.
pub const WORKLOAD_KEY_CERT: &str = "default";
/// Resource name of the trust bundle.
pub const ROOT_CA: &str = "ROOTCA";
/// Prefix of file-backed key+cert resources: `file-cert:<cert path>~<key path>`.
pub const FILE_CERT_PREFIX: &str = "file-cert:";
/// Prefix of file-backed root resources: `file-root:<ca path>` or `file-root:system`.
pub const FILE_ROOT_PREFIX: &str = "file-root:";

/// Errors of the identity crate. `Clone` so a failure can be shared by every waiter.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    #[error("invalid {var}={value:?}: expected {expected}")]
    Config {
        var: String,
        value: String,
        expected: String,
    },
    #[error("generating a {algorithm} key failed: {reason}")]
    KeyGen { algorithm: String, reason: String },
    #[error("building the CSR for {identity} failed: {reason}")]
    Csr { identity: String, reason: String },
    #[error("cannot build the gRPC channel to {addr}: {reason}")]
    Channel { addr: String, reason: String },
    #[error(
        "CA call CreateCertificate to {addr} failed with {code:?}: {message} (root: {root}; is the CA reachable at {addr}, is the root right and the token at {token} valid?)"
    )]
    Ca {
        addr: String,
        root: String,
        token: String,
        code: tonic::Code,
        message: String,
    },
    #[error(
        "the token at {path} expired at {expired_at} ({ago}s ago) and {client_cert}: no credential left for the CA (it would answer UNAUTHENTICATED); refresh the token file, or give the agent a valid client certificate (PROV_CERT)"
    )]
    TokenExpired {
        path: String,
        expired_at: String,
        ago: u64,
        /// Why no client certificate could stand in for the token.
        client_cert: String,
    },
    #[error(
        "no credential for the CA at {addr}: the token {token} does not exist or is empty and {client_cert}; write the service account token there (istioctl x workload entry configure makes one), or give the agent a valid client certificate (PROV_CERT)"
    )]
    NoCredential {
        addr: String,
        token: String,
        client_cert: String,
    },
    #[error(
        "refusing to send the bearer token {token} to the CA at {addr} over plaintext: anyone on the path could read and replay it (Istio serves its CA on the TLS port 15012 only); use the CA's TLS address (e.g. CA_ADDR=istiod.istio-system.svc:15012), or set CA_ALLOW_PLAINTEXT_TOKEN=true to send it in clear anyway"
    )]
    PlaintextToken { addr: String, token: String },
    #[error("CA {addr} returned an unusable certificate chain: {reason}")]
    InvalidResponse { addr: String, reason: String },
    #[error("reading {path}: {reason}")]
    File { path: String, reason: String },
    #[error("writing {path}: {reason}")]
    Output { path: String, reason: String },
    #[error("SDS socket {path}: {reason}")]
    Socket { path: String, reason: String },
    #[error(
        "this SDS server ({socket}) serves file certificates only: an external SDS server owns the workload identity socket and serves `default` and `ROOTCA`"
    )]
    FilesOnly { socket: String },
    #[error("SDS server: {0}")]
    Server(String),
    #[error("the secret manager has shut down")]
    Closed,
}

impl Error {
    /// Label for `csr_failures_total{reason}`: `token_expired`, `no_credential`, `plaintext_token`, the CA's gRPC
    /// code in snake case (`unavailable`, `unauthenticated`, ...), `invalid_response`, or `other`.
    pub fn reason(&self) -> &'static str {
        use tonic::Code::*;
        match self {
            Error::TokenExpired { .. } => "token_expired",
            Error::NoCredential { .. } => "no_credential",
            Error::PlaintextToken { .. } => "plaintext_token",
            Error::InvalidResponse { .. } => "invalid_response",
            Error::Ca { code, .. } => match code {
                Ok => "ok",
                Cancelled => "cancelled",
                Unknown => "unknown",
                InvalidArgument => "invalid_argument",
                DeadlineExceeded => "deadline_exceeded",
                NotFound => "not_found",
                AlreadyExists => "already_exists",
                PermissionDenied => "permission_denied",
                ResourceExhausted => "resource_exhausted",
                FailedPrecondition => "failed_precondition",
                Aborted => "aborted",
                OutOfRange => "out_of_range",
                Unimplemented => "unimplemented",
                Internal => "internal",
                Unavailable => "unavailable",
                DataLoss => "data_loss",
                Unauthenticated => "unauthenticated",
            },
            _ => "other",
        }
    }

    #[allow(dead_code)]
    pub(crate) fn file(path: &std::path::Path, reason: impl std::fmt::Display) -> Error {
        Error::File {
            path: path.display().to_string(),
            reason: reason.to_string(),
        }
    }
}
