//! Local work to produce a CSR (fresh key + CSR) for RSA-2048 and P-256, and a full fetch of
//! the workload certificate against the in-process fake CA (TLS over loopback).
//! Target: the P-256 keygen+CSR path ≤ 2 ms.

use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use sds::KeyAlgorithm;
use sds::bench::CaClient;
use sds::testing::FakeCa;
use sds::{Config, Metrics, SecretManager};

const ID: &str = "spiffe://cluster.local/ns/default/sa/bench";

fn keygen_csr(c: &mut Criterion) {
    let mut g = c.benchmark_group("keygen_csr");
    g.bench_function("p256", |b| {
        b.iter(|| sds::bench::generate(ID, KeyAlgorithm::EcdsaP256, false).expect("csr"))
    });
    g.sample_size(20);
    g.bench_function("rsa2048", |b| {
        b.iter(|| sds::bench::generate(ID, KeyAlgorithm::Rsa(2048), false).expect("csr"))
    });
    g.finish();
}

fn full_fetch(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let ca = FakeCa::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("var/run/secrets/istio/root-cert.pem");
    std::fs::create_dir_all(root.parent().expect("parent")).expect("mkdir");
    std::fs::write(&root, &ca.tls_root_pem).expect("root");
    // The CA client needs a credential: the pod's token, as in a pod.
    let token = dir.path().join("var/run/secrets/tokens/istio-token");
    std::fs::create_dir_all(token.parent().expect("parent")).expect("mkdir");
    std::fs::write(&token, "bench-token").expect("token");
    let cfg = Arc::new(Config {
        ca_addr: ca.ca_addr(),
        ca_server_name: "istiod.istio-system.svc".into(),
        key_algorithm: KeyAlgorithm::EcdsaP256,
        namespace: "default".into(),
        service_account: "bench".into(),
        ..Config::defaults(dir.path())
    });
    let mut reg = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(Metrics::new(&mut reg));

    let mut g = c.benchmark_group("fetch_p256");
    // Cold: a new manager per fetch (channel + TLS handshake + keygen + CSR + signing).
    g.bench_function("cold_manager", |b| {
        b.to_async(&rt).iter(|| {
            let (cfg, metrics) = (cfg.clone(), metrics.clone());
            async move {
                let m = SecretManager::new(cfg, metrics).expect("manager");
                let item = m.fetch("default").await.expect("fetch");
                m.shutdown();
                item
            }
        })
    });
    // Warm channel: keygen + CSR + CreateCertificate round trip (what a rotation costs).
    let client = CaClient::new(&cfg, metrics.clone()).expect("client");
    g.bench_function("warm_channel", |b| {
        b.to_async(&rt).iter(|| {
            let client = client.clone();
            async move {
                let kc = sds::bench::generate(ID, KeyAlgorithm::EcdsaP256, false).expect("csr");
                client.sign(&kc.csr_pem).await.expect("sign")
            }
        })
    });
    g.finish();
}

criterion_group!(benches, keygen_csr, full_fetch);
criterion_main!(benches);
