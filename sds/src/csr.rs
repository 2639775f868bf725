//! Workload key generation and Istio's CSR: one critical URI SAN, subject `O=""`.

use rcgen::{CertificateParams, CustomExtension, DistinguishedName, DnType, KeyPair, RsaKeySize};

use crate::Error;
use crate::config::KeyAlgorithm;

/// PEM-encodes DER with the given label (kept here for callers of `csr::pem_encode`).
pub use crate::pem::encode as pem_encode;

/// A freshly generated private key and the PEM CSR signed with it.
pub struct KeyAndCsr {
    /// PEM: `RSA PRIVATE KEY` / `EC PRIVATE KEY`, or `PRIVATE KEY` with PKCS#8.
    pub private_key_pem: Vec<u8>,
    /// PEM `CERTIFICATE REQUEST`.
    pub csr_pem: Vec<u8>,
}

impl std::fmt::Debug for KeyAndCsr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyAndCsr")
            .field("csr_pem", &String::from_utf8_lossy(&self.csr_pem))
            .finish_non_exhaustive()
    }
}

const OID_SAN: &[u64] = &[2, 5, 29, 17];
const OID_P256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_P384: &[u8] = &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22];

/// Generates a new key and a CSR for `identity` (a SPIFFE URI).
pub fn generate(identity: &str, algorithm: KeyAlgorithm, pkcs8: bool) -> Result<KeyAndCsr, Error> {
    let keygen_err = |e: rcgen::Error| Error::KeyGen {
        algorithm: format!("{algorithm:?}"),
        reason: e.to_string(),
    };
    let key = match algorithm {
        KeyAlgorithm::Rsa(bits) => {
            let size = match bits {
                2048 => RsaKeySize::_2048,
                3072 => RsaKeySize::_3072,
                4096 => RsaKeySize::_4096,
                other => {
                    return Err(Error::KeyGen {
                        algorithm: format!("RSA-{other}"),
                        reason: "supported sizes are 2048, 3072 and 4096".to_string(),
                    });
                }
            };
            KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, size).map_err(keygen_err)?
        }
        KeyAlgorithm::EcdsaP256 => {
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(keygen_err)?
        }
        KeyAlgorithm::EcdsaP384 => {
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).map_err(keygen_err)?
        }
    };
    let csr_pem = csr_for_key(identity, &key)?;
    let private_key_pem =
        key_pem(&key.serialize_der(), algorithm, pkcs8).map_err(|reason| Error::KeyGen {
            algorithm: format!("{algorithm:?}"),
            reason,
        })?;
    Ok(KeyAndCsr {
        private_key_pem,
        csr_pem,
    })
}

/// Builds Istio's CSR for `identity` signed by `key`.
pub fn csr_for_key(identity: &str, key: &KeyPair) -> Result<Vec<u8>, Error> {
    let csr_err = |reason: String| Error::Csr {
        identity: identity.to_string(),
        reason,
    };
    if !identity.is_ascii() || identity.is_empty() {
        return Err(csr_err(
            "the identity must be a non-empty ASCII URI".to_string(),
        ));
    }
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "");
    params.distinguished_name = dn;
    // GeneralNames ::= SEQUENCE { [6] IA5String uri }, critical because the subject is empty.
    let general_name = der_tlv(0x86, identity.as_bytes());
    let mut san = CustomExtension::from_oid_content(OID_SAN, der_tlv(0x30, &general_name));
    san.set_criticality(true);
    params.custom_extensions.push(san);
    let csr = params
        .serialize_request(key)
        .map_err(|e| csr_err(e.to_string()))?;
    let pem = csr.pem().map_err(|e| csr_err(e.to_string()))?;
    Ok(pem.into_bytes())
}

/// Encodes a DER TLV with a definite length.
pub(crate) fn der_tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len() + 6);
    out.push(tag);
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

/// Reads one DER TLV: (tag, content, rest).
fn der_read(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | *b as usize);
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// PKCS#8 DER → the PEM type Istio writes: PKCS#8 as is, or the inner PKCS#1 (RSA) /
/// SEC1 (EC, with the curve parameters Go includes) key.
fn key_pem(pkcs8_der: &[u8], algorithm: KeyAlgorithm, pkcs8: bool) -> Result<Vec<u8>, String> {
    if pkcs8 {
        return Ok(pem_encode("PRIVATE KEY", pkcs8_der));
    }
    let bad = || "unexpected PKCS#8 structure from the key generator".to_string();
    // PrivateKeyInfo ::= SEQUENCE { version INTEGER, algorithm AlgorithmIdentifier, privateKey OCTET STRING, ... }
    let (tag, body, _) = der_read(pkcs8_der).ok_or_else(bad)?;
    if tag != 0x30 {
        return Err(bad());
    }
    let (_, _version, rest) = der_read(body).ok_or_else(bad)?;
    let (_, _alg, rest) = der_read(rest).ok_or_else(bad)?;
    let (tag, inner, _) = der_read(rest).ok_or_else(bad)?;
    if tag != 0x04 {
        return Err(bad());
    }
    match algorithm {
        KeyAlgorithm::Rsa(_) => Ok(pem_encode("RSA PRIVATE KEY", inner)),
        KeyAlgorithm::EcdsaP256 | KeyAlgorithm::EcdsaP384 => {
            let curve = if algorithm == KeyAlgorithm::EcdsaP256 {
                OID_P256
            } else {
                OID_P384
            };
            // ECPrivateKey ::= SEQUENCE { version, privateKey OCTET STRING, [0] params OPTIONAL, [1] publicKey OPTIONAL }
            let (tag, body, _) = der_read(inner).ok_or_else(bad)?;
            if tag != 0x30 {
                return Err(bad());
            }
            let mut fields = Vec::new();
            let mut rest = body;
            while !rest.is_empty() {
                let (t, c, r) = der_read(rest).ok_or_else(bad)?;
                let consumed = rest.len() - r.len();
                fields.push((t, c, &rest[..consumed]));
                rest = r;
            }
            let mut out = Vec::new();
            let has_params = fields.iter().any(|(t, _, _)| *t == 0xa0);
            for (i, (t, _, raw)) in fields.iter().enumerate() {
                if !has_params && *t == 0xa1 {
                    out.extend_from_slice(&der_tlv(0xa0, curve));
                }
                out.extend_from_slice(raw);
                if !has_params && i == fields.len() - 1 && *t != 0xa1 {
                    out.extend_from_slice(&der_tlv(0xa0, curve));
                }
            }
            Ok(pem_encode("EC PRIVATE KEY", &der_tlv(0x30, &out)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::*;

    const ID: &str = "spiffe://cluster.local/ns/default/sa/bookinfo";

    fn check_csr(pem: &[u8]) {
        let (_, pem) = parse_x509_pem(pem).expect("pem");
        assert_eq!(pem.label, "CERTIFICATE REQUEST");
        let (_, csr) = X509CertificationRequest::from_der(&pem.contents).expect("der");
        csr.verify_signature().expect("self-signature verifies");
        let info = &csr.certification_request_info;
        // Subject: exactly one RDN with one attribute, O = "".
        let rdns: Vec<_> = info.subject.iter().collect();
        assert_eq!(rdns.len(), 1);
        let attrs: Vec<_> = rdns[0].iter().collect();
        assert_eq!(attrs.len(), 1);
        assert_eq!(
            attrs[0].attr_type(),
            &oid_registry::OID_X509_ORGANIZATION_NAME
        );
        assert_eq!(attrs[0].as_str().expect("string"), "");
        assert_eq!(info.subject.iter_common_name().count(), 0);
        // Extensions: only the SAN, critical, with exactly one URI.
        let exts = csr
            .requested_extensions()
            .expect("extension request")
            .collect::<Vec<_>>();
        assert_eq!(exts.len(), 1, "{exts:?}");
        let raw: Vec<_> = info
            .iter_attributes()
            .filter_map(|a| match a.parsed_attribute() {
                ParsedCriAttribute::ExtensionRequest(er) => Some(er.extensions.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(raw.len(), 1);
        assert_eq!(raw[0].oid, oid_registry::OID_X509_EXT_SUBJECT_ALT_NAME);
        assert!(raw[0].critical, "SAN must be critical");
        match raw[0].parsed_extension() {
            ParsedExtension::SubjectAlternativeName(san) => {
                assert_eq!(san.general_names, vec![GeneralName::URI(ID)]);
            }
            other => panic!("not a SAN: {other:?}"),
        }
    }

    #[test]
    fn ecdsa_p256_csr_is_istio_shaped() {
        let out = generate(ID, KeyAlgorithm::EcdsaP256, false).expect("generate");
        check_csr(&out.csr_pem);
        let (_, key) = parse_x509_pem(&out.private_key_pem).expect("key pem");
        assert_eq!(key.label, "EC PRIVATE KEY");
        // SEC1 with the curve OID, as Go writes it: loadable by rcgen via PKCS#8? check the OID bytes.
        assert!(key.contents.windows(OID_P256.len()).any(|w| w == OID_P256));
    }

    #[test]
    fn ecdsa_p384_and_pkcs8() {
        let out = generate(ID, KeyAlgorithm::EcdsaP384, true).expect("generate");
        check_csr(&out.csr_pem);
        let (_, key) = parse_x509_pem(&out.private_key_pem).expect("key pem");
        assert_eq!(key.label, "PRIVATE KEY");
        KeyPair::try_from(key.contents.as_slice()).expect("PKCS#8 key loads");
    }

    #[test]
    fn rsa_2048_csr_is_istio_shaped() {
        let out = generate(ID, KeyAlgorithm::Rsa(2048), false).expect("generate");
        check_csr(&out.csr_pem);
        let (_, key) = parse_x509_pem(&out.private_key_pem).expect("key pem");
        assert_eq!(key.label, "RSA PRIVATE KEY");
        let (_, csr_pem) = parse_x509_pem(&out.csr_pem).expect("pem");
        let (_, csr) = X509CertificationRequest::from_der(&csr_pem.contents).expect("der");
        assert_eq!(
            csr.signature_algorithm.algorithm,
            oid_registry::OID_PKCS1_SHA256WITHRSA
        );
    }

    #[test]
    fn every_call_makes_a_fresh_key() {
        let a = generate(ID, KeyAlgorithm::EcdsaP256, false).expect("a");
        let b = generate(ID, KeyAlgorithm::EcdsaP256, false).expect("b");
        assert_ne!(a.private_key_pem, b.private_key_pem);
    }

    #[test]
    fn rejects_unsupported_rsa_size() {
        assert!(generate(ID, KeyAlgorithm::Rsa(1024), false).is_err());
    }
}
