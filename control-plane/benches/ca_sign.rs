//! CSR signing throughput of the CA (one core): P-256 and RSA-2048 CSRs as the agent sends them.
//! CSRs/s/core = 1 / time per iteration.

use std::time::Duration;

use control_plane::{Ca, Identity};
use criterion::{Criterion, criterion_group, criterion_main};
use rcgen::{CertificateParams, DistinguishedName, KeyPair, SanType};

fn csr(alg: &'static rcgen::SignatureAlgorithm) -> String {
    let key = KeyPair::generate_for(alg).expect("key");
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = vec![SanType::URI(
        "spiffe://cluster.local/ns/default/sa/default"
            .to_string()
            .try_into()
            .expect("ia5"),
    )];
    params
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem")
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::load_or_create(dir.path()).expect("ca");
    let id = Identity::new("cluster.local", "default", "default");
    let mut g = c.benchmark_group("ca_sign");
    for (name, alg) in [
        ("p256_csr", &rcgen::PKCS_ECDSA_P256_SHA256),
        ("rsa2048_csr", &rcgen::PKCS_RSA_SHA256),
    ] {
        let pem = csr(alg);
        g.bench_function(name, |b| {
            b.iter(|| {
                ca.sign_workload(&pem, &id, Duration::from_secs(86400))
                    .expect("sign")
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
