//! `COMPLIANCE_POLICY`: which TLS versions, cipher suites and key-exchange groups the agent's
//! own connections to istiod (CA and xDS) may use. Istio applies the same policy to its gRPC
//! clients (`fips-140-2`: TLS 1.2 with the four ECDHE AES-GCM suites and P-256; `fips-140-3`:
//! TLS 1.2–1.3, AES-GCM only, P-256 or P-384; `pqc`: TLS 1.3, AES-GCM, X25519MLKEM768 only).
//! Here the policy narrows the one crypto provider (aws-lc-rs) that every such client uses.

use std::sync::Arc;

use rustls::crypto::{CryptoProvider, SupportedKxGroup, aws_lc_rs};
use rustls::{CipherSuite, SupportedProtocolVersion, version};

/// The TLS 1.2 suites of both FIPS policies (Istio's `fipsGoCiphers`).
const FIPS_TLS12: [CipherSuite; 4] = [
    CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
];

/// The TLS 1.3 suites of `fips-140-3` and `pqc`: AES-GCM, no ChaCha20-Poly1305.
const AES_GCM_TLS13: [CipherSuite; 2] = [
    CipherSuite::TLS13_AES_128_GCM_SHA256,
    CipherSuite::TLS13_AES_256_GCM_SHA384,
];

/// A `COMPLIANCE_POLICY` value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum Compliance {
    /// Unset or empty: the provider's defaults (TLS 1.2–1.3).
    #[default]
    #[serde(rename = "")]
    None,
    #[serde(rename = "fips-140-2")]
    Fips1402,
    #[serde(rename = "fips-140-3")]
    Fips1403,
    #[serde(rename = "pqc")]
    Pqc,
}

impl Compliance {
    /// The policy a value names; `None` for a value Istio does not know (Istio warns and
    /// applies no restriction, so the caller does the same).
    pub fn parse(value: &str) -> Option<Compliance> {
        Some(match value {
            "" => Compliance::None,
            "fips-140-2" => Compliance::Fips1402,
            "fips-140-3" => Compliance::Fips1403,
            "pqc" => Compliance::Pqc,
            _ => return None,
        })
    }

    /// The TLS versions the policy allows.
    pub(crate) fn versions(self) -> &'static [&'static SupportedProtocolVersion] {
        static BOTH: [&SupportedProtocolVersion; 2] = [&version::TLS13, &version::TLS12];
        static TLS12: [&SupportedProtocolVersion; 1] = [&version::TLS12];
        static TLS13: [&SupportedProtocolVersion; 1] = [&version::TLS13];
        match self {
            Compliance::None | Compliance::Fips1403 => &BOTH,
            Compliance::Fips1402 => &TLS12,
            Compliance::Pqc => &TLS13,
        }
    }

    /// The aws-lc-rs provider narrowed to the policy's cipher suites and groups.
    pub(crate) fn provider(self) -> Arc<CryptoProvider> {
        let mut p = aws_lc_rs::default_provider();
        let groups: Vec<&'static dyn SupportedKxGroup> = match self {
            Compliance::None => return Arc::new(p),
            Compliance::Fips1402 => {
                p.cipher_suites.retain(|s| FIPS_TLS12.contains(&s.suite()));
                vec![aws_lc_rs::kx_group::SECP256R1]
            }
            Compliance::Fips1403 => {
                p.cipher_suites.retain(|s| {
                    FIPS_TLS12.contains(&s.suite()) || AES_GCM_TLS13.contains(&s.suite())
                });
                vec![
                    aws_lc_rs::kx_group::SECP256R1,
                    aws_lc_rs::kx_group::SECP384R1,
                ]
            }
            Compliance::Pqc => {
                p.cipher_suites
                    .retain(|s| AES_GCM_TLS13.contains(&s.suite()));
                vec![aws_lc_rs::kx_group::X25519MLKEM768]
            }
        };
        p.kx_groups = groups;
        Arc::new(p)
    }

    /// The environment Envoy is started with under this policy: Istio limits the TLS 1.2
    /// suites of Envoy's Google gRPC clients with `GRPC_SSL_CIPHER_SUITES` under both FIPS
    /// policies.
    pub fn envoy_env(self) -> Option<(&'static str, &'static str)> {
        match self {
            Compliance::Fips1402 | Compliance::Fips1403 => Some((
                "GRPC_SSL_CIPHER_SUITES",
                "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:\
                 ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384",
            )),
            Compliance::None | Compliance::Pqc => None,
        }
    }
}

#[cfg(test)]
#[path = "compliance_tests.rs"]
mod tests;
