//! Workload identity for the sidecar: keypair and CSR, Istio CA client, secret cache with
//! rotation, and the SDS server Envoy reads its certificates from over a Unix socket.
//!
//! The API is what the crate root re-exports below (each item documented where it is defined);
//! the modules themselves are private.
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
//! testing                   (feature `testing`) a fake Istio CA
//! ```
//!
//! Feature `testing` adds [`testing::FakeCa`], an in-process Istio CA (real tonic server on
//! `127.0.0.1:0` over TLS) whose next answers a test sets, and [`bench`], the CSR and CA-call
//! entry points of `benches/csr.rs`. Feature `fuzzing` adds [`fuzzing`], the fuzz target's
//! entry point into the SDS stream loop.
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

mod ca;
mod clock;
mod config;
mod csr;
mod external;
mod manager;
mod metrics;
mod pem;
mod server;
mod tls;
mod token;
mod x509;

use go_syntax::timestamp;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

// Configuration: Istio's defaults and file layout; the agent sets the fields from Istio's
// variables.
pub use ca::ALLOW_PLAINTEXT_TOKEN_ENV;
pub use config::{
    CertDir, Config, DEFAULT_SOCKET_FILE, KeyAlgorithm, LOCALHOST_SERVER_NAME, ROOT_CERT_FILE,
    output_certs_mode, paths,
};

// The secret cache and the SDS server Envoy reads it from.
pub use manager::{NotCertificates, SecretItem, SecretManager};
pub use metrics::Metrics;
pub use server::SdsServer;

// gRPC channels to istiod (CA and xDS): one TLS policy, failover across istiod's addresses.
pub use ca::prov_cert_identity;
pub use tls::failover::{Error as FailoverError, Failover, address_entries};
pub use tls::{
    ChannelInputs, Compliance, DEFAULT_KEEPALIVE, RootSource, connect_failover, grpc_channel,
    read_token,
};

// An SDS server someone else (SPIRE) may run on the workload socket.
pub use external::{CHECK_TIMEOUT, SocketCheck, check_socket};

/// The CSR and CA-call paths for `benches/csr.rs`; not part of the stable API.
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod bench {
    pub use crate::ca::CaClient;
    pub use crate::csr::{KeyAndCsr, generate};
}

/// The SDS stream loop's entry point for the fuzz target; not part of the stable API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::server::fuzz::fuzz_sds_requests;
}

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
    pub(crate) fn reason(&self) -> &'static str {
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
