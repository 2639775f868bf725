//! Each policy against a local rustls server that speaks HTTP/2 after its handshake: a server
//! that offers only a suite, group or version the policy forbids is refused; one that offers an
//! allowed one connects. The client is the one every istiod channel uses
//! ([`crate::tls::connect_failover`]), so these also show the policy reaches the channels.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::{CryptoProvider, SupportedKxGroup, aws_lc_rs};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{CipherSuite, SupportedProtocolVersion, version};

use super::Compliance;
use crate::tls::failover::Failover;
use crate::tls::{ChannelInputs, RootSource, connect_failover};

const NAME: &str = "istiod.istio-system.svc";

/// What the test server offers.
struct Offer {
    suites: &'static [CipherSuite],
    groups: &'static [&'static dyn SupportedKxGroup],
    versions: &'static [&'static SupportedProtocolVersion],
}

const TLS13: &[&SupportedProtocolVersion] = &[&version::TLS13];
const TLS12: &[&SupportedProtocolVersion] = &[&version::TLS12];

/// A TLS server on loopback offering `offer` with an ECDSA P-256 certificate for [`NAME`],
/// answering HTTP/2 on every connection. Returns its address and root PEM.
async fn server(offer: Offer) -> (std::net::SocketAddr, String) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let cert = rcgen::CertificateParams::new(vec![NAME.to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    let mut provider = aws_lc_rs::default_provider();
    provider
        .cipher_suites
        .retain(|s| offer.suites.contains(&s.suite()));
    provider.kx_groups = offer.groups.to_vec();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(offer.versions)
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .expect("server config");
    let mut config = config;
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(|_req| async {
                    Ok::<_, Infallible>(hyper::Response::new(
                        http_body_util::Empty::<bytes::Bytes>::new(),
                    ))
                });
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                        .await;
            });
        }
    });
    (addr, cert.pem())
}

/// Whether a channel under `policy` connects to a server offering `offer`; the error otherwise.
async fn connects(policy: Compliance, offer: Offer) -> Result<(), crate::Error> {
    let (addr, root) = server(offer).await;
    let mut inputs = ChannelInputs::new(addr.to_string(), RootSource::Pem(root.into_bytes()), NAME);
    inputs.compliance = policy;
    let failover = Failover::new(&addr.to_string(), false).expect("address");
    connect_failover(&inputs, &failover, Duration::from_secs(5))
        .await
        .map(|_| ())
}

fn refused(result: Result<(), crate::Error>, what: &str) {
    let e = result.expect_err(what).to_string();
    assert!(
        e.contains("peer") || e.contains("alert") || e.contains("handshake"),
        "{what}: the handshake should be refused, got {e}"
    );
}

const ECDSA_AES128_TLS12: &[CipherSuite] = &[CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256];
const ECDSA_CHACHA_TLS12: &[CipherSuite] =
    &[CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256];
const AES128_TLS13: &[CipherSuite] = &[CipherSuite::TLS13_AES_128_GCM_SHA256];
const CHACHA_TLS13: &[CipherSuite] = &[CipherSuite::TLS13_CHACHA20_POLY1305_SHA256];
const P256: &[&dyn SupportedKxGroup] = &[aws_lc_rs::kx_group::SECP256R1];
const P384: &[&dyn SupportedKxGroup] = &[aws_lc_rs::kx_group::SECP384R1];
const X25519: &[&dyn SupportedKxGroup] = &[aws_lc_rs::kx_group::X25519];
const MLKEM: &[&dyn SupportedKxGroup] = &[aws_lc_rs::kx_group::X25519MLKEM768];

fn offer(
    suites: &'static [CipherSuite],
    groups: &'static [&'static dyn SupportedKxGroup],
    versions: &'static [&'static SupportedProtocolVersion],
) -> Offer {
    Offer {
        suites,
        groups,
        versions,
    }
}

#[tokio::test]
async fn no_policy_takes_what_the_provider_offers() {
    connects(Compliance::None, offer(CHACHA_TLS13, X25519, TLS13))
        .await
        .expect("ChaCha20 with X25519 under no policy");
    connects(Compliance::None, offer(ECDSA_CHACHA_TLS12, X25519, TLS12))
        .await
        .expect("TLS 1.2 ChaCha20 under no policy");
}

#[tokio::test]
async fn fips_140_2_is_tls12_fips_suites_and_p256() {
    let p = Compliance::Fips1402;
    connects(p, offer(ECDSA_AES128_TLS12, P256, TLS12))
        .await
        .expect("TLS 1.2 ECDHE-ECDSA-AES128-GCM with P-256");
    refused(
        connects(p, offer(AES128_TLS13, P256, TLS13)).await,
        "TLS 1.3 only",
    );
    refused(
        connects(p, offer(ECDSA_CHACHA_TLS12, P256, TLS12)).await,
        "a ChaCha20 suite only",
    );
    refused(
        connects(p, offer(ECDSA_AES128_TLS12, P384, TLS12)).await,
        "P-384 only",
    );
    refused(
        connects(p, offer(ECDSA_AES128_TLS12, X25519, TLS12)).await,
        "X25519 only",
    );
}

#[tokio::test]
async fn fips_140_3_is_tls12_or_13_aes_gcm_and_p256_or_p384() {
    let p = Compliance::Fips1403;
    connects(p, offer(AES128_TLS13, P384, TLS13))
        .await
        .expect("TLS 1.3 AES-128-GCM with P-384");
    connects(p, offer(ECDSA_AES128_TLS12, P256, TLS12))
        .await
        .expect("TLS 1.2 ECDHE-ECDSA-AES128-GCM with P-256");
    refused(
        connects(p, offer(CHACHA_TLS13, P256, TLS13)).await,
        "TLS 1.3 ChaCha20 only",
    );
    refused(
        connects(p, offer(AES128_TLS13, X25519, TLS13)).await,
        "X25519 only",
    );
    refused(
        connects(p, offer(AES128_TLS13, MLKEM, TLS13)).await,
        "X25519MLKEM768 only",
    );
}

#[tokio::test]
async fn pqc_is_tls13_aes_gcm_and_x25519mlkem768() {
    let p = Compliance::Pqc;
    connects(p, offer(AES128_TLS13, MLKEM, TLS13))
        .await
        .expect("TLS 1.3 AES-128-GCM with X25519MLKEM768");
    refused(
        connects(p, offer(AES128_TLS13, X25519, TLS13)).await,
        "classical X25519 only",
    );
    refused(
        connects(p, offer(AES128_TLS13, P256, TLS13)).await,
        "P-256 only",
    );
    refused(
        connects(p, offer(CHACHA_TLS13, MLKEM, TLS13)).await,
        "ChaCha20 only",
    );
    refused(
        connects(p, offer(ECDSA_AES128_TLS12, P256, TLS12)).await,
        "TLS 1.2 only",
    );
}

#[test]
fn values_are_istios() {
    assert_eq!(Compliance::parse(""), Some(Compliance::None));
    assert_eq!(Compliance::parse("fips-140-2"), Some(Compliance::Fips1402));
    assert_eq!(Compliance::parse("fips-140-3"), Some(Compliance::Fips1403));
    assert_eq!(Compliance::parse("pqc"), Some(Compliance::Pqc));
    // Istio's agent warns about a value it does not know and restricts nothing.
    assert_eq!(Compliance::parse("FIPS-140-2"), None);
    assert_eq!(Compliance::parse("fips"), None);
    assert!(Compliance::Fips1402.envoy_env().is_some());
    assert!(Compliance::Fips1403.envoy_env().is_some());
    assert_eq!(Compliance::Pqc.envoy_env(), None);
    assert_eq!(Compliance::None.envoy_env(), None);
}

/// The provider is the only thing a policy changes for `None`: the defaults every channel had.
#[test]
fn no_policy_is_the_default_provider() {
    let p: Arc<CryptoProvider> = Compliance::None.provider();
    assert_eq!(
        p.cipher_suites.len(),
        aws_lc_rs::default_provider().cipher_suites.len()
    );
}

/// The CA client dials under the policy of its config: against a server offering only X25519
/// in TLS 1.3, no policy gets past the handshake (the server is no CA, so the call then fails
/// on gRPC) and `pqc` is refused at the handshake.
#[tokio::test]
async fn the_ca_client_dials_under_the_policy() {
    use crate::ca::CaClient;
    use crate::{Config, Metrics};
    let (addr, root) = server(offer(AES128_TLS13, X25519, TLS13)).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let csr = crate::csr::generate(
        "spiffe://cluster.local/ns/a/sa/b",
        crate::KeyAlgorithm::EcdsaP256,
        false,
    )
    .expect("csr")
    .csr_pem;
    for (policy, refused_at_handshake) in [(Compliance::None, false), (Compliance::Pqc, true)] {
        let cfg = Config {
            ca_addr: addr.to_string(),
            ca_server_name: NAME.into(),
            ca_root: RootSource::Pem(root.clone().into_bytes()),
            compliance: policy,
            ..Config::defaults(dir.path())
        };
        std::fs::create_dir_all(cfg.token_path.parent().expect("p")).expect("mkdir");
        std::fs::write(&cfg.token_path, "tok").expect("token");
        let mut reg = prometheus_client::registry::Registry::default();
        let client = CaClient::new(&cfg, Arc::new(Metrics::new(&mut reg))).expect("client");
        let e = client
            .sign(&csr)
            .await
            .expect_err("the server is no CA")
            .to_string();
        assert_eq!(
            e.contains("HandshakeFailure"),
            refused_at_handshake,
            "{policy:?}: {e}"
        );
    }
}
