//! Service-account tokens: ES256 JWTs signed with `<ca-dir>/issuer-key.pem`.
//!
//! They stand in for Kubernetes projected tokens: `sub` is
//! `system:serviceaccount:<ns>:<sa>`, `aud` holds `istio-ca` by default, and `exp`/`nbf` bound
//! the lifetime. Verification allows a small clock skew between the hosts (default
//! [`DEFAULT_CLOCK_SKEW`], as common JWT libraries do): a token is still accepted up to the skew
//! after its `exp`, and from the skew before its `nbf`.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use super::{Error, ISSUER_KEY, write_private};

/// Issuer name put in `iss`.
pub const ISSUER: &str = "istiod-lite";
/// Clock skew allowed on `exp` and `nbf` unless configured (`--token-clock-skew`).
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(60);

/// The claims of a token.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    pub aud: Vec<String>,
    pub exp: u64,
    pub nbf: u64,
    pub iat: u64,
}

/// Why a token was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TokenError {
    #[error("token expired")]
    Expired,
    #[error("token not yet valid (nbf in the future)")]
    NotYetValid,
    #[error("wrong audience: token is not for {expected:?}")]
    WrongAudience { expected: String },
    #[error("bad signature: token was not signed by this CA's issuer key")]
    BadSignature,
    #[error("wrong issuer: token is not from {expected:?}")]
    WrongIssuer { expected: String },
    #[error("malformed token: {0}")]
    Malformed(String),
    #[error("subject {0:?} is not a service account (expected system:serviceaccount:<ns>:<sa>)")]
    BadSubject(String),
}

/// Why a PEM is not the issuer's key.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("not a private key: {0}")]
    NotPrivateKey(#[source] rcgen::Error),
    #[error("not a P-256 key: {0}")]
    NotP256(#[source] jsonwebtoken::errors::Error),
    #[error("public key: {0}")]
    PublicKey(#[source] jsonwebtoken::errors::Error),
}

/// Signs and verifies tokens.
pub struct TokenIssuer {
    encoding: EncodingKey,
    decoding: DecodingKey,
    clock_skew: Duration,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl TokenIssuer {
    /// Loads `<dir>/issuer-key.pem`, creating it (P-256, mode 0600) if absent.
    pub fn load_or_create(dir: &Path) -> Result<TokenIssuer, Error> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(ISSUER_KEY);
        if !path.exists() {
            let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
                .map_err(|e| Error::Sign(e.to_string()))?;
            match write_private(&path, key.serialize_pem().as_bytes()) {
                Ok(()) => {}
                // Someone else (a concurrent `token` or `serve`) created it first: use theirs.
                Err(Error::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        let pem = std::fs::read_to_string(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        Self::from_pem(&pem).map_err(|source| Error::TokenKey { path, source })
    }

    /// Builds an issuer from a PKCS#8 P-256 private key PEM.
    pub fn from_pem(pem: &str) -> Result<TokenIssuer, KeyError> {
        let key = rcgen::KeyPair::from_pem(pem).map_err(KeyError::NotPrivateKey)?;
        let encoding =
            EncodingKey::from_ec_pem(key.serialize_pem().as_bytes()).map_err(KeyError::NotP256)?;
        let decoding = DecodingKey::from_ec_pem(key.public_key_pem().as_bytes())
            .map_err(KeyError::PublicKey)?;
        Ok(TokenIssuer {
            encoding,
            decoding,
            clock_skew: DEFAULT_CLOCK_SKEW,
        })
    }

    /// The same issuer, verifying with `skew` of tolerance on `exp` and `nbf` (whole seconds).
    pub fn with_clock_skew(mut self, skew: Duration) -> TokenIssuer {
        self.clock_skew = skew;
        self
    }

    /// The clock skew `verify` allows.
    pub fn clock_skew(&self) -> Duration {
        self.clock_skew
    }

    /// Issues a token for `system:serviceaccount:<ns>:<sa>` valid from now for `ttl`.
    pub fn issue(
        &self,
        namespace: &str,
        service_account: &str,
        audience: &str,
        ttl: Duration,
    ) -> String {
        let now = now_secs();
        self.sign(&Claims {
            iss: ISSUER.to_string(),
            sub: format!("system:serviceaccount:{namespace}:{service_account}"),
            aud: vec![audience.to_string()],
            exp: now + ttl.as_secs(),
            nbf: now,
            iat: now,
        })
    }

    /// Signs arbitrary claims (tests use it for expired or not-yet-valid tokens).
    pub fn sign(&self, claims: &Claims) -> String {
        // ES256 signing with a key we just parsed cannot fail short of an allocation failure.
        jsonwebtoken::encode(&Header::new(Algorithm::ES256), claims, &self.encoding)
            .unwrap_or_default()
    }

    /// Verifies signature, issuer, `exp`, `nbf` (each with the configured clock skew) and
    /// audience; returns (namespace, service account).
    pub fn verify(&self, token: &str, audience: &str) -> Result<(String, String), TokenError> {
        let mut v = Validation::new(Algorithm::ES256);
        v.set_audience(&[audience]);
        v.set_issuer(&[ISSUER]);
        v.set_required_spec_claims(&["exp", "sub", "aud", "iss"]);
        v.validate_nbf = true;
        v.leeway = self.clock_skew.as_secs();
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &v).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind as K;
            match e.kind() {
                K::ExpiredSignature => TokenError::Expired,
                K::ImmatureSignature => TokenError::NotYetValid,
                K::InvalidAudience => TokenError::WrongAudience {
                    expected: audience.to_string(),
                },
                K::InvalidSignature | K::InvalidAlgorithm => TokenError::BadSignature,
                K::InvalidIssuer => TokenError::WrongIssuer {
                    expected: ISSUER.to_string(),
                },
                _ => TokenError::Malformed(e.to_string()),
            }
        })?;
        let sub = data.claims.sub;
        let parts: Vec<&str> = sub.split(':').collect();
        match parts.as_slice() {
            ["system", "serviceaccount", ns, sa] if !ns.is_empty() && !sa.is_empty() => {
                Ok((ns.to_string(), sa.to_string()))
            }
            _ => Err(TokenError::BadSubject(sub.clone())),
        }
    }
}
