//! The CA's parsers of client input: CSR PEM through signing (the SAN must always be the
//! caller's identity, never one from the CSR, and the certificate must carry the CSR's own key,
//! curve included), PEM bundle splitting, DER certificate identity, SPIFFE URIs. Bad input is an
//! error, never a panic.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use control_plane::fuzzing::{identity_from_cert, split_pem_certs};
use control_plane::{Ca, Identity};

fn ca() -> &'static Ca {
    static CA: OnceLock<Ca> = OnceLock::new();
    CA.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("ca-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create CA dir");
        Ca::load_or_create(&dir).expect("self-signed CA")
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = identity_from_cert(data);
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = Identity::parse_spiffe(text);
    for cert in split_pem_certs(text) {
        assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"), "{cert}");
    }
    let id = Identity::new("cluster.local", "default", "fuzz");
    if let Ok(chain) = ca().sign_workload(text, &id, Duration::from_secs(3600)) {
        // Whatever the CSR asked for, the leaf names the caller's identity and nothing else.
        let leaf = chain.first().expect("a chain has a leaf");
        let (_, pem) = x509_parser::pem::parse_x509_pem(leaf.as_bytes()).expect("leaf is PEM");
        let got = identity_from_cert(&pem.contents).expect("leaf carries an identity");
        assert_eq!(got, id);
        // The issued key is the CSR's: same algorithm (with its curve) and same key bits.
        // The CA's PEM decoder tolerates whitespace inside the base64; x509-parser's does not.
        let body: String = text
            .lines()
            .map(|l| if l.starts_with("-----") { l.to_string() } else { l.replace([' ', '\t'], "") })
            .collect::<Vec<_>>()
            .join("\n");
        let Ok((_, csr_pem)) = x509_parser::pem::parse_x509_pem(body.as_bytes()) else {
            return;
        };
        let (_, csr) = <x509_parser::certification_request::X509CertificationRequest as
            x509_parser::prelude::FromDer<'_, _>>::from_der(&csr_pem.contents)
        .expect("signed: a CSR");
        let (_, cert) = x509_parser::parse_x509_certificate(&pem.contents).expect("leaf is X.509");
        let (want, issued) = (&csr.certification_request_info.subject_pki, cert.public_key());
        assert_eq!(issued.algorithm.algorithm, want.algorithm.algorithm, "key algorithm");
        assert_eq!(
            issued.algorithm.parameters.as_ref().map(|p| p.as_bytes()),
            want.algorithm.parameters.as_ref().map(|p| p.as_bytes()),
            "key parameters (the curve)"
        );
        assert_eq!(issued.subject_public_key.data, want.subject_public_key.data, "key bits");
    }
});
