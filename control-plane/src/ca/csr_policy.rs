//! What a CSR must satisfy before it is signed: a bounded size, an RSA key of at least
//! [`MIN_RSA_BITS`], and a signature algorithm of its key's type (an RSA key signs with an RSA
//! algorithm, an EC key with ECDSA, an Ed25519 key with Ed25519). Anything that does not parse
//! is left to the CSR parser, which says why. An EC key must be on P-256, P-384 or P-521 (what
//! Go's x509, and so Istio's CA, signs), whatever hash its CSR was signed with: the issued
//! certificate carries the key's own curve.

use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;

use super::{Error, MAX_CSR_BYTES, MIN_RSA_BITS};

/// A key or signature family, as named in error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Rsa,
    Ec,
    Ed25519,
}

impl Family {
    fn name(self) -> &'static str {
        match self {
            Family::Rsa => "RSA",
            Family::Ec => "EC",
            Family::Ed25519 => "Ed25519",
        }
    }
}

/// Family of a SubjectPublicKeyInfo algorithm OID.
fn key_family(oid: &str) -> Option<Family> {
    match oid {
        // rsaEncryption, id-RSASSA-PSS
        "1.2.840.113549.1.1.1" | "1.2.840.113549.1.1.10" => Some(Family::Rsa),
        // id-ecPublicKey
        "1.2.840.10045.2.1" => Some(Family::Ec),
        // id-Ed25519
        "1.3.101.112" => Some(Family::Ed25519),
        _ => None,
    }
}

/// Family and name of a signature algorithm OID.
fn signature_family(oid: &str) -> Option<(Family, &'static str)> {
    Some(match oid {
        "1.2.840.113549.1.1.5" => (Family::Rsa, "sha1WithRSAEncryption"),
        "1.2.840.113549.1.1.10" => (Family::Rsa, "RSASSA-PSS"),
        "1.2.840.113549.1.1.11" => (Family::Rsa, "sha256WithRSAEncryption"),
        "1.2.840.113549.1.1.12" => (Family::Rsa, "sha384WithRSAEncryption"),
        "1.2.840.113549.1.1.13" => (Family::Rsa, "sha512WithRSAEncryption"),
        "1.2.840.10045.4.1" => (Family::Ec, "ecdsa-with-SHA1"),
        "1.2.840.10045.4.3.2" => (Family::Ec, "ecdsa-with-SHA256"),
        "1.2.840.10045.4.3.3" => (Family::Ec, "ecdsa-with-SHA384"),
        "1.2.840.10045.4.3.4" => (Family::Ec, "ecdsa-with-SHA512"),
        "1.3.101.112" => (Family::Ed25519, "Ed25519"),
        _ => return None,
    })
}

/// A CSR that passed [`check_csr`]: the DER that was checked (the signer reads this, not the
/// PEM again) and, for an EC key, the algorithm of its curve.
#[derive(Debug)]
pub(super) struct CheckedCsr {
    pub der: Vec<u8>,
    pub curve: Option<&'static rcgen::SignatureAlgorithm>,
}

/// The curve of an EC key (its SubjectPublicKeyInfo parameters), as the rcgen algorithm that
/// writes a public key on it.
fn ec_curve(oid: &str) -> Option<&'static rcgen::SignatureAlgorithm> {
    match oid {
        "1.2.840.10045.3.1.7" => Some(&rcgen::PKCS_ECDSA_P256_SHA256),
        "1.3.132.0.34" => Some(&rcgen::PKCS_ECDSA_P384_SHA384),
        "1.3.132.0.35" => Some(&rcgen::PKCS_ECDSA_P521_SHA512),
        _ => None,
    }
}

/// Refuses, with a reason naming the limit or the mismatch, CSRs over [`MAX_CSR_BYTES`], RSA
/// keys under [`MIN_RSA_BITS`], EC keys on curves other than P-256, P-384 and P-521, and CSRs whose
/// signature algorithm is not of their key's type. For an EC key, returns the algorithm of its
/// curve: the CSR parser labels the key with the curve its *signature* hash goes with
/// (ecdsa-with-SHA256: P-256), which would issue a P-384 key in a SHA-256 CSR as a P-256 key
/// (and a P-256 key in a SHA-384 CSR as P-384), a certificate no peer can use.
pub(super) fn check_csr(csr_pem: &str) -> Result<CheckedCsr, Error> {
    if csr_pem.len() > MAX_CSR_BYTES {
        return Err(Error::CsrRejected(format!(
            "CSR is {} bytes, over the {MAX_CSR_BYTES}-byte limit",
            csr_pem.len()
        )));
    }
    // One PEM decoder for the checks and the signer: were they to read different bytes (PEM
    // parsers differ on stray whitespace), the checks could be skipped for what gets signed.
    use rustls_pki_types::pem::PemObject;
    let der = rustls_pki_types::CertificateSigningRequestDer::from_pem_slice(csr_pem.as_bytes())
        .map_err(|e| Error::Csr(format!("not a PEM CERTIFICATE REQUEST: {e}")))?
        .as_ref()
        .to_vec();
    let Ok((_, req)) = X509CertificationRequest::from_der(&der) else {
        // The signer's parser says why.
        return Ok(CheckedCsr { der, curve: None });
    };
    let spki = &req.certification_request_info.subject_pki;
    if let Ok(x509_parser::public_key::PublicKey::RSA(rsa)) = spki.parsed() {
        let bits = rsa_modulus_bits(rsa.modulus);
        if bits < MIN_RSA_BITS {
            return Err(Error::CsrRejected(format!(
                "{bits}-bit RSA key is too weak: RSA keys must be at least {MIN_RSA_BITS} bits"
            )));
        }
    }
    let key_oid = spki.algorithm.algorithm.to_id_string();
    let sig_oid = req.signature_algorithm.algorithm.to_id_string();
    let Some(key) = key_family(&key_oid) else {
        return Err(Error::CsrRejected(format!(
            "unsupported key type (algorithm {key_oid}): expected an RSA, EC or Ed25519 key"
        )));
    };
    let curve = if key == Family::Ec {
        let params = spki.algorithm.parameters.as_ref();
        let curve_oid = params
            .and_then(|p| p.as_oid().ok())
            .map(|o| o.to_id_string())
            .unwrap_or_default();
        Some(ec_curve(&curve_oid).ok_or_else(|| {
            Error::CsrRejected(format!(
                "unsupported EC curve {curve_oid:?}: expected a P-256, P-384 or P-521 key"
            ))
        })?)
    } else {
        None
    };
    match signature_family(&sig_oid) {
        Some((sig, _)) if sig == key => Ok(CheckedCsr { der, curve }),
        Some((_, name)) => Err(Error::CsrRejected(format!(
            "the CSR's signature algorithm {name} does not match its {} key: a CSR must be signed with an algorithm of its key's type",
            key.name()
        ))),
        None => Err(Error::CsrRejected(format!(
            "unsupported CSR signature algorithm {sig_oid} for its {} key",
            key.name()
        ))),
    }
}

/// Bit length of a big-endian unsigned modulus (leading zero bytes ignored).
pub(super) fn rsa_modulus_bits(modulus: &[u8]) -> usize {
    let digits = match modulus.iter().position(|&b| b != 0) {
        Some(i) => &modulus[i..],
        None => return 0,
    };
    (digits.len() - 1) * 8 + (8 - digits[0].leading_zeros() as usize)
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use rcgen::{CertificateParams, KeyPair};

    use super::*;

    /// DER AlgorithmIdentifier of sha256WithRSAEncryption (with its NULL parameters).
    const SHA256_WITH_RSA: &[u8] = &[
        0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b, 0x05, 0x00,
    ];
    /// DER AlgorithmIdentifier of ecdsa-with-SHA256.
    const ECDSA_WITH_SHA256: &[u8] = &[
        0x30, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02,
    ];

    fn csr(alg: &'static rcgen::SignatureAlgorithm) -> String {
        let key = KeyPair::generate_for(alg).expect("key");
        CertificateParams::default()
            .serialize_request(&key)
            .expect("csr")
            .pem()
            .expect("pem")
    }

    /// (header length, content length) of the DER TLV at the start of `der`.
    fn tlv(der: &[u8]) -> (usize, usize) {
        let first = der[1] as usize;
        if first < 0x80 {
            return (2, first);
        }
        let n = first & 0x7f;
        let len = der[2..2 + n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | *b as usize);
        (2 + n, len)
    }

    fn encode_len(len: usize) -> Vec<u8> {
        if len < 0x80 {
            return vec![len as u8];
        }
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        let mut out = vec![0x80 | (bytes.len() - skip) as u8];
        out.extend_from_slice(&bytes[skip..]);
        out
    }

    /// `csr_pem` with its signature algorithm replaced by `alg` (the signature bits unchanged).
    fn with_signature_algorithm(csr_pem: &str, alg: &[u8]) -> String {
        let (_, pem) = x509_parser::pem::parse_x509_pem(csr_pem.as_bytes()).expect("pem");
        let der = pem.contents;
        let (outer_hdr, _) = tlv(&der);
        let body = &der[outer_hdr..];
        let (h, l) = tlv(body);
        let (info, rest) = body.split_at(h + l);
        let (h, l) = tlv(rest);
        let signature = &rest[h + l..];
        let mut content = info.to_vec();
        content.extend_from_slice(alg);
        content.extend_from_slice(signature);
        let mut out = vec![0x30];
        out.extend(encode_len(content.len()));
        out.extend(content);
        let b64 = base64::engine::general_purpose::STANDARD.encode(out);
        let lines: Vec<&str> = b64
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).expect("ascii"))
            .collect();
        format!(
            "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
            lines.join("\n")
        )
    }

    #[test]
    fn csrs_signed_with_their_key_type_pass() {
        check_csr(&csr(&rcgen::PKCS_ECDSA_P256_SHA256)).expect("P-256 / ECDSA-SHA256");
        check_csr(&csr(&rcgen::PKCS_ECDSA_P384_SHA384)).expect("P-384 / ECDSA-SHA384");
        check_csr(&csr(&rcgen::PKCS_ED25519)).expect("Ed25519");
        let rsa = KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
            .expect("rsa");
        let rsa_csr = CertificateParams::default()
            .serialize_request(&rsa)
            .expect("csr")
            .pem()
            .expect("pem");
        check_csr(&rsa_csr).expect("RSA-2048 / sha256WithRSAEncryption");
        // The rewriting helper keeps a matching CSR valid.
        let p256 = csr(&rcgen::PKCS_ECDSA_P256_SHA256);
        check_csr(&with_signature_algorithm(&p256, ECDSA_WITH_SHA256)).expect("same algorithm");
    }

    #[test]
    fn a_signature_algorithm_of_another_key_type_is_rejected() {
        let forged =
            with_signature_algorithm(&csr(&rcgen::PKCS_ECDSA_P256_SHA256), SHA256_WITH_RSA);
        let err = check_csr(&forged).expect_err("EC key, RSA signature");
        assert!(matches!(err, Error::CsrRejected(_)), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("sha256WithRSAEncryption") && msg.contains("EC key"),
            "{msg}"
        );
        let forged = with_signature_algorithm(&csr(&rcgen::PKCS_ED25519), ECDSA_WITH_SHA256);
        let msg = check_csr(&forged)
            .expect_err("Ed25519 key, ECDSA")
            .to_string();
        assert!(
            msg.contains("ecdsa-with-SHA256") && msg.contains("Ed25519 key"),
            "{msg}"
        );
    }

    #[test]
    fn an_unknown_signature_algorithm_is_rejected() {
        // id-dsa-with-sha256 (2.16.840.1.101.3.4.3.2), not something a workload key signs with.
        let dsa = [
            0x30, 0x0b, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x03, 0x02,
        ];
        let forged = with_signature_algorithm(&csr(&rcgen::PKCS_ECDSA_P256_SHA256), &dsa);
        let msg = check_csr(&forged).expect_err("DSA signature").to_string();
        assert!(msg.contains("2.16.840.1.101.3.4.3.2"), "{msg}");
    }
}
