//! What the agent reads from an X.509 certificate: its validity window, and whether a private
//! key belongs to it.
//!
//! A leaf module, used by the CA client (`PROV_CERT`) and the secret cache (CA-issued and
//! file-mounted certificates).

use std::time::{Duration, SystemTime};

use x509_parser::prelude::FromDer;

/// (NotBefore, NotAfter) of a DER certificate; `None` when it does not parse.
pub fn cert_validity(der: &[u8]) -> Option<(SystemTime, SystemTime)> {
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

/// Why a private key is not the key of a certificate.
#[derive(Debug, thiserror::Error)]
pub enum KeyMismatch {
    #[error("the key file is not PEM text")]
    NotPem(#[source] std::str::Utf8Error),
    #[error("the private key does not load: {0}")]
    KeyLoad(#[source] rcgen::Error),
    #[error("the certificate does not parse: {0}")]
    CertParse(#[source] x509_parser::nom::Err<x509_parser::error::X509Error>),
    #[error("the private key does not match the certificate")]
    Different,
}

/// Fails, saying why, unless `key_pem` is the private key of the DER certificate `leaf_der`.
pub fn check_key_matches(leaf_der: &[u8], key_pem: &[u8]) -> Result<(), KeyMismatch> {
    let key_str = std::str::from_utf8(key_pem).map_err(KeyMismatch::NotPem)?;
    let key = rcgen::KeyPair::from_pem(key_str).map_err(KeyMismatch::KeyLoad)?;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(leaf_der)
        .map_err(KeyMismatch::CertParse)?;
    if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Err(KeyMismatch::Different);
    }
    Ok(())
}
