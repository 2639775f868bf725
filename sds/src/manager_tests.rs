use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use x509_parser::prelude::*;

use super::rotation::ROTATE_BACKOFF_START;
use super::*;
use crate::clock::{JumpClock, WALL_CLOCK_RECHECK};
use crate::config::KeyAlgorithm;
use crate::testing::{Answer, FakeCa};
use crate::x509::check_key_matches;

/// Writes an opaque token where `config` reads it (a CA over TLS needs a credential).
fn write_token(config: &Config) {
    std::fs::create_dir_all(config.token_path.parent().expect("parent")).expect("mkdir");
    std::fs::write(&config.token_path, "tok-setup").expect("token");
}

/// A base directory holding the fake CA's root (and an opaque token), and the config of a workload `ns1/sa1` with
/// ECDSA P-256 keys and no rotation jitter signed by that CA; tests change fields with `with`.
struct Setup {
    dir: tempfile::TempDir,
    config: Config,
}

impl Setup {
    fn new(ca: &FakeCa) -> Setup {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join(crate::config::paths::ISTIO_ROOT);
        std::fs::create_dir_all(root.parent().expect("parent")).expect("mkdir");
        std::fs::write(&root, &ca.tls_root_pem).expect("root");
        let config = Config {
            ca_addr: ca.ca_addr(),
            ca_server_name: "istiod.istio-system.svc".into(),
            namespace: "ns1".into(),
            service_account: "sa1".into(),
            key_algorithm: KeyAlgorithm::EcdsaP256,
            grace_ratio_jitter: 0.0,
            ..Config::defaults(dir.path())
        };
        write_token(&config);
        Setup { dir, config }
    }
    fn with(mut self, f: impl FnOnce(&mut Config)) -> Setup {
        f(&mut self.config);
        self
    }
    fn base(&self) -> &Path {
        self.dir.path()
    }
    fn manager(&self) -> SecretManager {
        self.manager_and_clock().0
    }
    /// The manager and its wall clock, which follows tokio's (paused) clock and can jump.
    fn manager_and_clock(&self) -> (SecretManager, Arc<JumpClock>) {
        let mut cfg = self.config.clone();
        // Paused-time tests must not have HTTP/2 ping timers racing the fake CA's replies.
        cfg.grpc_keepalive = None;
        let mut reg = prometheus_client::registry::Registry::default();
        let clock = Arc::new(JumpClock::new());
        let m = SecretManager::with_clock(
            Arc::new(cfg),
            Arc::new(Metrics::new(&mut reg)),
            clock.clone(),
        )
        .expect("manager");
        (m, clock)
    }
}

fn leaf(item: &SecretItem) -> (String, Vec<u8>) {
    let der = parse_certs(&item.cert_chain_pem)
        .into_iter()
        .next()
        .expect("leaf");
    let (_, cert) = X509Certificate::from_der(&der).expect("parse");
    let san = cert
        .subject_alternative_name()
        .expect("san ext")
        .map(|s| {
            s.value
                .general_names
                .iter()
                .map(|g| format!("{g}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    (san, cert.raw_serial().to_vec())
}

#[tokio::test]
async fn fetch_issues_a_spiffe_cert_with_istio_metadata() {
    let ca = FakeCa::start();
    let setup = Setup::new(&ca).with(|c| {
        c.cluster_id = "Kubernetes".into();
        c.ca_headers = vec![("X-Tenant".into(), "t1".into())];
        c.cert_signer = "signer1".into();
        c.secret_ttl = Duration::from_secs(2 * 3600);
    });
    let tok = setup.base().join(crate::config::paths::TOKEN);
    std::fs::create_dir_all(tok.parent().expect("p")).expect("mkdir");
    std::fs::write(&tok, "tok-123\n").expect("token");
    let m = setup.manager();
    let item = m.fetch("default").await.expect("default");
    let (san, _) = leaf(&item);
    assert_eq!(san, "URI(spiffe://cluster.local/ns/ns1/sa/sa1)");
    assert!(String::from_utf8_lossy(&item.private_key_pem).contains("EC PRIVATE KEY"));
    check_key_matches(&parse_certs(&item.cert_chain_pem)[0], &item.private_key_pem)
        .expect("key matches cert");
    // Chain includes the root, and the root is the chain's last element.
    assert_eq!(parse_certs(&item.cert_chain_pem).len(), 2);
    assert_eq!(item.root_cert_pem, ca.signing_root_pem().into_bytes());

    let root = m.fetch("ROOTCA").await.expect("ROOTCA");
    assert_eq!(root.root_cert_pem, item.root_cert_pem);
    assert!(root.private_key_pem.is_empty());

    let got = ca.received();
    assert_eq!(got.len(), 1, "ROOTCA served from the cached CSR result");
    let r = &got[0];
    assert_eq!(r.header("authorization"), Some("Bearer tok-123"));
    assert_eq!(r.header("clusterid"), Some("Kubernetes"));
    assert_eq!(r.header("x-tenant"), Some("t1"));
    assert_eq!(r.cert_signer.as_deref(), Some("signer1"));
    assert_eq!(r.validity_duration, 7200);
}

#[tokio::test]
async fn no_token_and_no_client_certificate_is_one_error_naming_both() {
    let ca = FakeCa::start();
    let setup = Setup::new(&ca).with(|c| {
        c.prov_cert = Some(crate::config::CertDir::istio(&c.base_dir.join("etc/certs")));
    });
    std::fs::remove_file(&setup.config.token_path).expect("rm token");
    let e = setup
        .manager()
        .fetch("default")
        .await
        .expect_err("no credential");
    let msg = e.to_string();
    assert!(
        msg.contains(&setup.config.token_path.display().to_string())
            && msg.contains("does not exist")
            && msg.contains("PROV_CERT has no valid client certificate")
            && msg.contains("cert-chain.pem"),
        "{msg}"
    );
    assert!(
        ca.received().is_empty(),
        "a call without credentials was sent"
    );
}

#[tokio::test]
async fn concurrent_requests_share_one_csr() {
    let ca = FakeCa::start();
    let setup = Setup::new(&ca);
    let m = setup.manager();
    let futs: Vec<_> = (0..8)
        .map(|i| {
            let m = m.clone();
            async move { m.fetch(if i % 2 == 0 { "default" } else { "ROOTCA" }).await }
        })
        .collect();
    for r in futures::future::join_all(futs).await {
        r.expect("fetch");
    }
    assert_eq!(ca.received().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn retries_retryable_codes_then_succeeds() {
    let ca = FakeCa::start();
    ca.push_answers([
        Answer::Fail(tonic::Code::Unavailable),
        Answer::Fail(tonic::Code::Internal),
    ]);
    let setup = Setup::new(&ca);
    setup
        .manager()
        .fetch("default")
        .await
        .expect("third try signs");
    assert_eq!(ca.received().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn gives_up_after_five_tries_and_not_on_permanent_codes() {
    let ca = FakeCa::start();
    ca.set_default_answer(Answer::Fail(tonic::Code::Unavailable));
    let setup = Setup::new(&ca);
    let m = setup.manager();
    let e = m.fetch("default").await.expect_err("CA down");
    assert_eq!(ca.received().len(), 5);
    let msg = e.to_string();
    assert!(
        msg.contains(&ca.ca_addr()) && msg.contains("root-cert.pem"),
        "{msg}"
    );

    ca.set_default_answer(Answer::Fail(tonic::Code::PermissionDenied));
    m.fetch("default").await.expect_err("denied");
    assert_eq!(ca.received().len(), 6, "PermissionDenied is not retried");

    ca.set_default_answer(Answer::ShortChain);
    let e = m.fetch("default").await.expect_err("short chain");
    assert!(matches!(e, Error::InvalidResponse { .. }), "{e}");
}

// Paused time: the tests wait on events (CA request counts, watch channels), never on
// timeouts, so tokio only auto-advances to the manager's own rotation and backoff timers.
#[test]
fn rotation_backoff_is_capped_by_the_certificate_lifetime() {
    let max = Duration::from_secs(60);
    let cap = |secs: u64| rotation_backoff_cap(Duration::from_secs(secs), max);
    assert_eq!(cap(86400), max, "24 h certificate: the 60 s cap");
    assert_eq!(cap(600), max);
    assert_eq!(cap(300), Duration::from_secs(30));
    assert_eq!(cap(30), Duration::from_secs(3));
    assert_eq!(
        cap(5),
        ROTATE_BACKOFF_START,
        "never below the first backoff"
    );
    assert_eq!(cap(0), ROTATE_BACKOFF_START);
}

#[tokio::test(start_paused = true)]
async fn short_lived_certificate_retries_at_most_a_tenth_of_its_lifetime_apart() {
    let ca = FakeCa::start();
    let setup = Setup::new(&ca).with(|c| c.secret_ttl = Duration::from_secs(20));
    let m = setup.manager();
    m.fetch("default").await.expect("first");
    ca.set_default_answer(Answer::Fail(tonic::Code::PermissionDenied));
    // Rotation at 10 s, then ~1 s, ~2 s, and then the 2 s cap (not 4 s, 8 s).
    ca.wait_received(2).await;
    assert_retry_gaps(&ca, &[(3, 1.0), (4, 2.0), (5, 2.0), (6, 2.0)]).await;
}

/// Waits for each CA request `n` of `gaps` in turn: it must come `want` seconds (±15 %) after
/// the one before (the first: after now).
async fn assert_retry_gaps(ca: &FakeCa, gaps: &[(usize, f64)]) {
    let mut prev = tokio::time::Instant::now();
    for &(n, want) in gaps {
        ca.wait_received(n).await;
        let gap = prev.elapsed().as_secs_f64();
        assert!(
            gap >= want * 0.85 && gap <= want * 1.15,
            "retry {n} after {gap}s, want ~{want}s"
        );
        prev = tokio::time::Instant::now();
    }
}

#[tokio::test(start_paused = true)]
async fn rotates_at_grace_ratio_and_keeps_cert_on_failure() {
    let ca = FakeCa::start();
    let setup = Setup::new(&ca).with(|c| c.secret_ttl = Duration::from_secs(100));
    let m = setup.manager();
    let mut rx = m.subscribe("default");
    let t0 = tokio::time::Instant::now();
    let first = m.fetch("default").await.expect("first");
    rx.borrow_and_update();
    let (_, serial1) = leaf(&first);

    // The CA fails permanently from now on; rotation is due at 50% of the lifetime.
    ca.set_default_answer(Answer::Fail(tonic::Code::PermissionDenied));
    ca.wait_received(2).await;
    let at = t0.elapsed();
    assert!(
        at >= Duration::from_secs(49) && at <= Duration::from_secs(51),
        "rotation at {at:?}"
    );
    let still = m.fetch("default").await.expect("still served");
    assert!(
        Arc::ptr_eq(&still, &first),
        "valid cert kept during CA failure"
    );

    // Jittered exponential backoff: ~1s, then ~2s, then ~4s.
    assert_retry_gaps(&ca, &[(3, 1.0), (4, 2.0), (5, 4.0)]).await;
    assert!(
        !rx.has_changed().expect("open"),
        "nothing pushed while failing"
    );

    // The CA recovers: the next retry issues a new cert and subscribers see it.
    ca.set_default_answer(Answer::Sign);
    rx.changed().await.expect("pushed");
    let second = rx.borrow_and_update().clone().expect("value");
    assert_ne!(leaf(&second).1, serial1, "new serial after rotation");
    assert!(Arc::ptr_eq(
        &m.fetch("default").await.expect("cached"),
        &second
    ));
}

#[tokio::test(start_paused = true)]
async fn root_change_pushes_rootca() {
    let ca = FakeCa::start();
    let setup = Setup::new(&ca).with(|c| c.secret_ttl = Duration::from_secs(100));
    let m = setup.manager();
    let mut roots = m.subscribe("ROOTCA");
    let r1 = m.fetch("ROOTCA").await.expect("root");
    roots.borrow_and_update();
    let new_root = ca.rotate_signing_root();
    roots.changed().await.expect("ROOTCA pushed");
    let r2 = roots.borrow_and_update().clone().expect("value");
    assert_ne!(r1.root_cert_pem, r2.root_cert_pem);
    assert_eq!(r2.root_cert_pem, new_root.into_bytes());
}

/// Root CA rotation: the trust bundle in the CA root file changes (kubelet updates the
/// mesh's root ConfigMap), so the certificate is re-issued at once instead of at its rotation
/// time: Envoy gets the CA's new root (ROOTCA) and a certificate signed under it.
#[tokio::test]
async fn root_file_change_reissues_the_certificate_at_once() {
    let ca = FakeCa::start();
    let setup = Setup::new(&ca).with(|c| c.secret_ttl = Duration::from_secs(24 * 3600));
    let m = setup.manager();
    let mut roots = m.subscribe("ROOTCA");
    let mut certs = m.subscribe("default");
    let first = m.fetch("default").await.expect("cert");
    m.fetch("ROOTCA").await.expect("root");
    roots.borrow_and_update();
    certs.borrow_and_update();
    let new_root = ca.rotate_signing_root();
    let root_file = setup.base().join(crate::config::paths::ISTIO_ROOT);
    std::fs::write(&root_file, format!("{}{new_root}", ca.tls_root_pem)).expect("write root");
    tokio::time::timeout(Duration::from_secs(20), certs.changed())
        .await
        .expect("re-issued within 20 s, not at the 24 h rotation")
        .expect("open");
    let second = certs.borrow_and_update().clone().expect("value");
    assert_ne!(leaf(&second).1, leaf(&first).1, "a new certificate");
    tokio::time::timeout(Duration::from_secs(5), roots.changed())
        .await
        .expect("ROOTCA pushed")
        .expect("open");
    let root = roots.borrow_and_update().clone().expect("value");
    assert_eq!(root.root_cert_pem, new_root.into_bytes());
    assert_eq!(ca.received().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn unchanged_root_is_not_pushed_on_rotation() {
    let ca = FakeCa::start();
    let setup = Setup::new(&ca).with(|c| c.secret_ttl = Duration::from_secs(100));
    let m = setup.manager();
    let mut roots = m.subscribe("ROOTCA");
    let mut certs = m.subscribe("default");
    m.fetch("ROOTCA").await.expect("root");
    roots.borrow_and_update();
    certs.borrow_and_update();
    certs.changed().await.expect("rotated");
    assert_eq!(ca.received().len(), 2);
    assert!(
        !roots.has_changed().expect("open"),
        "same root: no ROOTCA push"
    );
}

#[tokio::test]
async fn output_certs_are_written_0600() {
    use std::os::unix::fs::PermissionsExt;
    let ca = FakeCa::start();
    let setup = Setup::new(&ca);
    let out = setup.base().join("out");
    let setup = setup.with(|c| c.output_certs = Some(out.clone()));
    let item = setup.manager().fetch("default").await.expect("default");
    for (f, want) in [
        ("key.pem", &item.private_key_pem),
        ("cert-chain.pem", &item.cert_chain_pem),
        ("root-cert.pem", &item.root_cert_pem),
    ] {
        let p = out.join(f);
        assert_eq!(&std::fs::read(&p).expect(f), want);
        assert_eq!(
            std::fs::metadata(&p).expect("meta").permissions().mode() & 0o777,
            0o600,
            "{f}"
        );
    }
}

fn self_signed_pair(cn: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let cert = rcgen::CertificateParams::new(vec![cn.to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    (cert.pem(), key.serialize_pem())
}

#[tokio::test]
async fn file_mounted_certs_are_served_and_reloaded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("etc/certs");
    std::fs::create_dir_all(&certs).expect("mkdir");
    let (c1, k1) = self_signed_pair("one.example");
    std::fs::write(certs.join("cert-chain.pem"), &c1).expect("w");
    std::fs::write(certs.join("key.pem"), &k1).expect("w");
    std::fs::write(
        certs.join("root-cert.pem"),
        format!("{c1}-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"),
    )
    .expect("w");
    let defaults = Config::defaults(dir.path());
    let cfg = Config {
        file_mounted_certs: Some(defaults.etc_certs.clone()),
        file_debounce: Duration::from_millis(10),
        ..defaults
    };
    let mut reg = prometheus_client::registry::Registry::default();
    let m = SecretManager::new(Arc::new(cfg), Arc::new(Metrics::new(&mut reg))).expect("manager");
    let item = m.fetch("default").await.expect("default from files");
    assert_eq!(item.cert_chain_pem, c1.as_bytes());
    let root = m.fetch("ROOTCA").await.expect("root from files");
    assert_eq!(
        parse_certs(&root.root_cert_pem).len(),
        1,
        "invalid cert in the bundle skipped"
    );

    let mut rx = m.subscribe("default");
    rx.borrow_and_update();
    let (c2, k2) = self_signed_pair("two.example");
    // Key first, then cert: the intermediate state (mismatched pair) must not be served.
    write_atomic(&certs.join("key.pem"), k2.as_bytes()).expect("w");
    write_atomic(&certs.join("cert-chain.pem"), c2.as_bytes()).expect("w");
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            rx.changed().await.expect("open");
            let v = rx.borrow_and_update().clone().expect("value");
            if v.cert_chain_pem == c2.as_bytes() {
                return v;
            }
        }
    })
    .await
    .expect("reloaded within 10s");
    assert_eq!(got.private_key_pem, k2.as_bytes());
}

#[tokio::test]
async fn file_cert_and_file_root_names() {
    let ca = FakeCa::start();
    let setup = Setup::new(&ca);
    let (c, k) = self_signed_pair("x.example");
    std::fs::write(setup.base().join("c.pem"), &c).expect("w");
    std::fs::write(setup.base().join("k.pem"), &k).expect("w");
    let (other, _) = self_signed_pair("y.example");
    std::fs::write(setup.base().join("wrong.pem"), &other).expect("w");
    let m = setup.manager();
    let item = m.fetch("file-cert:c.pem~k.pem").await.expect("file-cert");
    assert_eq!(item.cert_chain_pem, c.as_bytes());
    let root = m.fetch("file-root:c.pem").await.expect("file-root");
    assert!(root.is_root());
    assert!(ca.received().is_empty(), "file names never call the CA");
    tokio::time::pause();
    let e = m
        .fetch("file-cert:wrong.pem~k.pem")
        .await
        .expect_err("mismatched pair");
    assert!(e.to_string().contains("does not match"), "{e}");
}

/// An external SDS server owns the workload socket (SPIRE): file names are served, `default`
/// and `ROOTCA` are refused with a message naming why, and the CA is never called, not even by
/// the warm-up.
#[tokio::test]
async fn serve_only_files_serves_files_and_never_calls_the_ca() {
    let ca = FakeCa::start();
    let setup = Setup::new(&ca).with(|c| c.serve_only_files = true);
    let (c, k) = self_signed_pair("x.example");
    std::fs::write(setup.base().join("c.pem"), &c).expect("w");
    std::fs::write(setup.base().join("k.pem"), &k).expect("w");
    let m = setup.manager();
    m.warm();
    let item = m.fetch("file-cert:c.pem~k.pem").await.expect("file-cert");
    assert_eq!(item.cert_chain_pem, c.as_bytes());
    for name in ["default", "ROOTCA"] {
        let e = m.fetch(name).await.expect_err(name);
        assert!(matches!(e, Error::FilesOnly { .. }), "{name}: {e}");
        assert!(e.to_string().contains("file certificates only"), "{e}");
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(ca.received().is_empty(), "the CA was called");
}

#[test]
fn rotation_time_follows_ratio() {
    let now = SystemTime::now();
    let day = Duration::from_secs(86400);
    let at = rotation_time(now, now + day, 0.5, 0.0);
    assert_eq!(at, now + Duration::from_secs(43200));
    let at = rotation_time(now, now + day, 0.5, 0.01);
    let d = at.duration_since(now).expect("after creation");
    assert!(
        d >= Duration::from_secs(43200 - 865) && d <= Duration::from_secs(43200 + 865),
        "{d:?}"
    );
}

/// A host suspended past the rotation point (the wall clock jumps, the monotonic clock does
/// not move): the certificate is re-issued within WALL_CLOCK_RECHECK of the resume, not 12 h
/// of running time later as a timer on the monotonic clock would.
#[tokio::test(start_paused = true)]
async fn rotation_survives_a_host_suspend() {
    let ca = FakeCa::start();
    let setup = Setup::new(&ca).with(|c| c.secret_ttl = Duration::from_secs(86400));
    let (m, clock) = setup.manager_and_clock();
    let mut rx = m.subscribe("default");
    let first = m.fetch("default").await.expect("first");
    rx.borrow_and_update();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(ca.received().len(), 1, "no rotation before the suspend");
    clock.jump(Duration::from_secs(13 * 3600));
    let resumed = tokio::time::Instant::now();
    rx.changed().await.expect("a new certificate pushed");
    let after = resumed.elapsed();
    assert!(
        after <= WALL_CLOCK_RECHECK,
        "re-issued {after:?} after the resume"
    );
    let second = rx.borrow_and_update().clone().expect("value");
    assert_ne!(leaf(&second).1, leaf(&first).1, "a new certificate");
}

/// A certificate that expired while the host slept is never served as valid: with the CA
/// failing, the fetch fails instead of handing out the expired one; once the CA answers, a
/// fresh certificate is served.
#[tokio::test(start_paused = true)]
async fn an_expired_certificate_is_not_served() {
    let ca = FakeCa::start();
    let setup = Setup::new(&ca).with(|c| c.secret_ttl = Duration::from_secs(86400));
    let (m, clock) = setup.manager_and_clock();
    let first = m.fetch("default").await.expect("first");
    ca.set_default_answer(Answer::Fail(tonic::Code::PermissionDenied));
    clock.jump(Duration::from_secs(25 * 3600));
    let served = m.fetch("default").await;
    assert!(
        served.is_err(),
        "an expired certificate was served: {served:?}"
    );
    // The fake CA's clock did not jump: it issues for long enough to be valid on the agent's.
    ca.set_ttl(Some(Duration::from_secs(48 * 3600)));
    ca.set_default_answer(Answer::Sign);
    let fresh = m.fetch("default").await.expect("re-issued");
    assert_ne!(
        leaf(&fresh).1,
        leaf(&first).1,
        "a new certificate, not the expired one"
    );
}

/// A CA that answers with an already-expired leaf (its clock is wrong) is failing, not
/// answering: the still-valid certificate keeps being served and the re-issue backs off as for
/// any CA failure, instead of re-issuing at once, again and again.
#[tokio::test(start_paused = true)]
async fn an_expired_leaf_from_the_ca_is_retried_with_backoff() {
    let ca = FakeCa::start();
    let setup = Setup::new(&ca).with(|c| c.secret_ttl = Duration::from_secs(100));
    let m = setup.manager();
    let first = m.fetch("default").await.expect("first");
    ca.set_default_answer(Answer::Expired);
    // Rotation at 50 s, then ~1 s, ~2 s, ~4 s apart.
    ca.wait_received(2).await;
    assert_retry_gaps(&ca, &[(3, 1.0), (4, 2.0), (5, 4.0)]).await;
    let still = m.fetch("default").await.expect("still served");
    assert!(Arc::ptr_eq(&still, &first), "the valid certificate is kept");

    // With nothing cached, the fetch fails and says why; warm-up asks again, never in a tight
    // loop (each retry at least its first backoff after the one before).
    let ca = FakeCa::start();
    ca.set_default_answer(Answer::Expired);
    let setup = Setup::new(&ca);
    let m = setup.manager();
    let e = m
        .fetch("default")
        .await
        .expect_err("an expired leaf is refused");
    assert!(e.to_string().contains("clock"), "{e}");
    m.warm();
    ca.wait_received(2).await;
    for n in 3..=4 {
        let before = tokio::time::Instant::now();
        ca.wait_received(n).await;
        let gap = before.elapsed();
        assert!(
            gap >= Duration::from_millis(400),
            "retry {n} after {gap:?}: a tight loop"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn warm_fills_default_and_rootca_with_backoff() {
    let ca = FakeCa::start();
    // The CA is down for the first two calls; warm-up keeps retrying.
    ca.push_answers([
        Answer::Fail(tonic::Code::PermissionDenied),
        Answer::Fail(tonic::Code::PermissionDenied),
    ]);
    let setup = Setup::new(&ca);
    let m = setup.manager();
    let mut root = m.subscribe("ROOTCA");
    m.warm();
    root.changed().await.expect("ROOTCA warmed");
    assert_eq!(
        ca.received().len(),
        3,
        "two failures, then one CSR for both names"
    );
    let cached = m.subscribe("default").borrow().clone();
    assert!(
        cached.is_some(),
        "default is in the cache before any SDS request"
    );
}

/// PCDS trust anchors (ProxyConfig `caCertificatesPem`): merged into `ROOTCA` (each certificate
/// once, sorted), pushed to its subscribers, and the workload certificate re-issued; the same
/// set again changes nothing; an entry that is not a certificate is refused.
#[tokio::test]
async fn config_trust_bundle_is_merged_into_rootca() {
    let ca = FakeCa::start();
    let setup = Setup::new(&ca);
    let m = setup.manager();
    let mut roots = m.subscribe("ROOTCA");
    let mut certs = m.subscribe("default");
    let first = m.fetch("default").await.expect("cert");
    let r1 = m.fetch("ROOTCA").await.expect("root");
    roots.borrow_and_update();
    certs.borrow_and_update();
    let other = rcgen::CertificateParams::new(vec!["other-ca".to_string()])
        .expect("params")
        .self_signed(&rcgen::KeyPair::generate().expect("key"))
        .expect("cert")
        .pem();
    // The CA's own root among the anchors appears once.
    let own = String::from_utf8(r1.root_cert_pem.clone()).expect("utf8");
    m.set_config_trust_bundle(&[other.clone(), own.clone()])
        .expect("anchors");
    roots.changed().await.expect("ROOTCA pushed");
    let r2 = roots.borrow_and_update().clone().expect("value");
    let merged = String::from_utf8(r2.root_cert_pem.clone()).expect("utf8");
    assert_eq!(parse_certs(&r2.root_cert_pem).len(), 2, "{merged}");
    assert!(merged.contains(other.trim()) && merged.contains(own.trim()));
    let mut sorted = [other.trim().to_string(), own.trim().to_string()];
    sorted.sort();
    assert_eq!(merged, format!("{}\n{}\n", sorted[0], sorted[1]));
    // As Istio: the workload certificate is re-issued too.
    certs.changed().await.expect("default re-issued");
    let second = certs.borrow_and_update().clone().expect("value");
    assert_ne!(first.cert_chain_pem, second.cert_chain_pem);
    // The same anchors again: nothing new.
    m.set_config_trust_bundle(&[own, other]).expect("same");
    assert!(!roots.has_changed().expect("open"));
    // Not a certificate: refused, the anchors kept.
    let e = m
        .set_config_trust_bundle(&["garbage".to_string()])
        .expect_err("not PEM")
        .to_string();
    assert!(e.contains("caCertificatesPem[0]"), "{e}");
    let r3 = m.fetch("ROOTCA").await.expect("root");
    assert_eq!(r3.root_cert_pem, r2.root_cert_pem);
}

/// A mounted root (`FILE_MOUNTED_CERTS`) gets the PCDS trust anchors merged in as well.
#[tokio::test]
async fn config_trust_bundle_is_merged_into_a_mounted_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("etc/certs");
    std::fs::create_dir_all(&certs).expect("mkdir");
    let (c1, k1) = self_signed_pair("one.example");
    std::fs::write(certs.join("cert-chain.pem"), &c1).expect("w");
    std::fs::write(certs.join("key.pem"), &k1).expect("w");
    std::fs::write(certs.join("root-cert.pem"), &c1).expect("w");
    let defaults = Config::defaults(dir.path());
    let cfg = Config {
        file_mounted_certs: Some(defaults.etc_certs.clone()),
        ..defaults
    };
    let mut reg = prometheus_client::registry::Registry::default();
    let m = SecretManager::new(Arc::new(cfg), Arc::new(Metrics::new(&mut reg))).expect("manager");
    let mut roots = m.subscribe("ROOTCA");
    let root = m.fetch("ROOTCA").await.expect("root from files");
    assert_eq!(parse_certs(&root.root_cert_pem).len(), 1);
    roots.borrow_and_update();
    let (other, _) = self_signed_pair("other-ca.example");
    m.set_config_trust_bundle(std::slice::from_ref(&other))
        .expect("anchors");
    tokio::time::timeout(Duration::from_secs(10), roots.changed())
        .await
        .expect("in time")
        .expect("ROOTCA pushed");
    let merged = roots.borrow_and_update().clone().expect("value");
    assert_eq!(parse_certs(&merged.root_cert_pem).len(), 2);
    assert!(String::from_utf8_lossy(&merged.root_cert_pem).contains(other.trim()));
}

/// A peer asking for ever new names (each watched, then dropped) does not grow the manager
/// without end: unwatched names go once the bound is reached; watched ones, `default` and
/// `ROOTCA` stay.
#[test]
fn names_nobody_watches_are_dropped_past_the_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = Config {
        serve_only_files: true,
        ..Config::defaults(dir.path())
    };
    let mut reg = prometheus_client::registry::Registry::default();
    let m = SecretManager::new(Arc::new(cfg), Arc::new(Metrics::new(&mut reg))).expect("manager");
    let _default = m.subscribe("default");
    let _root = m.subscribe("ROOTCA");
    let kept = m.subscribe("file-root:kept.pem");
    for i in 0..10 * MAX_UNWATCHED_NAMES {
        drop(m.subscribe(&format!("name-{i}")));
    }
    let st = lock(&m.inner.state);
    assert!(
        st.channels.len() <= MAX_UNWATCHED_NAMES,
        "{} names held",
        st.channels.len()
    );
    for name in ["default", "ROOTCA", "file-root:kept.pem"] {
        assert!(st.channels.contains_key(name), "{name} kept");
    }
    drop(kept);
}
