//! PEM blocks: the certificates in a PEM bundle, and DER encoded as PEM.
//!
//! A leaf module: the CA client, the TLS channel, the key generator and the secret cache all
//! read or write PEM through it.

use base64::Engine;

/// DER of every `CERTIFICATE` block in `pem`; other blocks and unparsable ones are skipped.
pub fn parse_certs(pem: &[u8]) -> Vec<Vec<u8>> {
    x509_parser::pem::Pem::iter_from_buffer(pem)
        .filter_map(|p| p.ok())
        .filter(|p| p.label == "CERTIFICATE")
        .map(|p| p.contents)
        .collect()
}

/// PEM-encodes DER with the given label (64-column base64 lines).
pub fn encode(label: &str, der: &[u8]) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_certificates_parse_back_and_other_blocks_are_skipped() {
        let der = vec![0x30, 0x03, 0x02, 0x01, 0x05];
        let mut bundle = encode("CERTIFICATE", &der);
        bundle.extend_from_slice(&encode("EC PRIVATE KEY", &[1, 2, 3]));
        bundle.extend_from_slice(&encode("CERTIFICATE", &[0x30, 0x00]));
        assert_eq!(parse_certs(&bundle), vec![der, vec![0x30, 0x00]]);
        assert!(parse_certs(b"not pem").is_empty());
    }

    #[test]
    fn lines_are_64_columns() {
        let pem = String::from_utf8(encode("X", &[0u8; 100])).expect("ascii");
        let lines: Vec<&str> = pem.lines().collect();
        assert_eq!(lines[0], "-----BEGIN X-----");
        assert_eq!(lines[1].len(), 64);
        assert_eq!(lines.last(), Some(&"-----END X-----"));
    }
}
