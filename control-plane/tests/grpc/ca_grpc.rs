//! `IstioCertificateService` over real gRPC on the TLS port of a running `server::serve` (the
//! plaintext port offers none, as Istio's 15010): token and client-certificate authentication,
//! identity from the caller, rejections with precise codes and reasons, plug-in cacerts.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use control_plane::{
    Claims, DEFAULT_TOKEN_CLOCK_SKEW, Running, ServerSettings, Settings, TokenIssuer, serve,
};
use proto::istio::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use proto::istio::ca::{IstioCertificateRequest, IstioCertificateResponse};
use rcgen::{CertificateParams, DistinguishedName, KeyPair, PKCS_ECDSA_P256_SHA256, SanType};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Request};

pub(crate) async fn start(config: &Path, ca: &Path) -> (Running, CancellationToken) {
    start_with_caps(config, ca, control_plane::GRPC_CAPS).await
}

/// [`start`] with the gRPC ports' connection caps.
pub(crate) async fn start_with_caps(
    config: &Path,
    ca: &Path,
    conn_caps: proto::listen::Caps,
) -> (Running, CancellationToken) {
    let cancel = CancellationToken::new();
    let settings = Settings::serve(
        config.to_path_buf(),
        None,
        ServerSettings {
            ca_dir: ca.to_path_buf(),
            trust_domain: "cluster.local".into(),
            grpc_addr: "127.0.0.1:0".parse().expect("addr"),
            secure_grpc_addr: "127.0.0.1:0".parse().expect("addr"),
            monitoring_addr: "127.0.0.1:0".parse().expect("addr"),
            sans: vec!["cp.test".into()],
            token_clock_skew: DEFAULT_TOKEN_CLOCK_SKEW,
            conn_caps,
        },
        &HashMap::new(),
    )
    .expect("settings");
    let running = serve(settings, cancel.clone()).await.expect("serve");
    (running, cancel)
}

fn csr(uri: &str) -> (String, KeyPair) {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = vec![SanType::URI(uri.to_string().try_into().expect("ia5"))];
    let pem = params
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem");
    (pem, key)
}

fn request(csr: &str, token: Option<&str>) -> Request<IstioCertificateRequest> {
    let mut r = Request::new(IstioCertificateRequest {
        csr: csr.to_string(),
        validity_duration: 3600,
        metadata: None,
    });
    if let Some(t) = token {
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {t}").parse().expect("header"),
        );
    }
    r
}

fn uri_sans(pem: &str) -> Vec<String> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).expect("pem");
    let (_, cert) = x509_parser::parse_x509_certificate(&p.contents).expect("x509");
    cert.subject_alternative_name()
        .expect("ext")
        .expect("san")
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::URI(u) => Some(u.to_string()),
            _ => None,
        })
        .collect()
}

async fn plaintext(addr: std::net::SocketAddr) -> IstioCertificateServiceClient<Channel> {
    IstioCertificateServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
}

async fn tls(
    addr: std::net::SocketAddr,
    root: &str,
    identity: Option<Identity>,
) -> IstioCertificateServiceClient<Channel> {
    let mut cfg = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(root))
        .domain_name("istiod.istio-system.svc");
    if let Some(id) = identity {
        cfg = cfg.identity(id);
    }
    let ch = Channel::from_shared(format!("https://{addr}"))
        .expect("uri")
        .tls_config(cfg)
        .expect("tls")
        .connect()
        .await
        .expect("tls connect");
    IstioCertificateServiceClient::new(ch)
}

/// Sends `csr` (with `token` as the bearer token, if any); `what` names the call if it fails.
/// Signs a fresh CSR for `uri` over mTLS with no token, authenticating with the client
/// certificate `client` (chain PEM, key PEM).
async fn signed_with_client_cert(
    addr: std::net::SocketAddr,
    root: &str,
    client: (String, String),
    uri: &str,
    what: &str,
) -> IstioCertificateResponse {
    let mut c = tls(addr, root, Some(Identity::from_pem(client.0, client.1))).await;
    let (p, _) = csr(uri);
    signed(&mut c, &p, None, what).await
}

async fn signed(
    client: &mut IstioCertificateServiceClient<Channel>,
    csr: &str,
    token: Option<&str>,
    what: &str,
) -> IstioCertificateResponse {
    client
        .create_certificate(request(csr, token))
        .await
        .expect(what)
        .into_inner()
}

/// A running server whose CA is plug-in cacerts, and a token for `ns/sa`.
struct PluginCa {
    running: Running,
    cancel: CancellationToken,
    root: String,
    int: String,
    token: String,
}

/// Writes plug-in cacerts (a root named `root_name`) into `ca_dir` and starts a server on them.
async fn start_plugin(config: &Path, ca_dir: &Path, root_name: &str) -> PluginCa {
    let (root, int) = write_cacerts(ca_dir, root_name);
    let (running, cancel) = start(config, ca_dir).await;
    let token = TokenIssuer::load_or_create(ca_dir).expect("issuer").issue(
        "ns",
        "sa",
        "istio-ca",
        Duration::from_secs(600),
    );
    PluginCa {
        running,
        cancel,
        root,
        int,
        token,
    }
}

#[tokio::test]
async fn token_and_client_certificate_authentication() {
    let config = tempfile::tempdir().expect("tempdir");
    let ca_dir = tempfile::tempdir().expect("tempdir");
    let (running, cancel) = start(config.path(), ca_dir.path()).await;
    let root = std::fs::read_to_string(ca_dir.path().join("root-cert.pem")).expect("root");
    let issuer = TokenIssuer::load_or_create(ca_dir.path()).expect("issuer");
    let token = issuer.issue("app", "web", "istio-ca", Duration::from_secs(600));

    // Good token: the SAN is the token's identity, even though the CSR asks for another one.
    let (pem, key) = csr("spiffe://cluster.local/ns/kube-system/sa/admin");
    let mut client = tls(running.secure_grpc_addr, &root, None).await;
    let resp = signed(&mut client, &pem, Some(&token), "signed").await;
    assert_eq!(
        uri_sans(&resp.cert_chain[0]),
        vec!["spiffe://cluster.local/ns/app/sa/web"]
    );
    assert_eq!(resp.cert_chain.last(), Some(&root), "root last");
    assert_eq!(resp.root_cert.map(|r| r.ca_cert), Some(vec![root.clone()]));

    // A second TLS connection to the secure port (server cert for istiod.istio-system.svc).
    let mut secure = tls(running.secure_grpc_addr, &root, None).await;
    let (pem2, _) = csr("spiffe://cluster.local/ns/app/sa/web");
    let resp2 = signed(&mut secure, &pem2, Some(&token), "signed over TLS").await;

    // The plaintext port serves xDS only: no CA there, so no token crosses the wire in clear.
    let mut clear = plaintext(running.grpc_addr).await;
    let s = clear
        .create_certificate(request(&pem2, None))
        .await
        .expect_err("no CA on the plaintext port");
    assert_eq!(s.code(), Code::Unimplemented, "{s:?}");
    assert_eq!(
        uri_sans(&resp2.cert_chain[0]),
        vec!["spiffe://cluster.local/ns/app/sa/web"]
    );

    // Renewal with the issued certificate as client certificate, no token.
    let chain_pem: String = resp.cert_chain.concat();
    let resp3 = signed_with_client_cert(
        running.secure_grpc_addr,
        &root,
        (chain_pem, key.serialize_pem()),
        "spiffe://cluster.local/ns/other/sa/other",
        "renewed with mTLS",
    )
    .await;
    assert_eq!(
        uri_sans(&resp3.cert_chain[0]),
        vec!["spiffe://cluster.local/ns/app/sa/web"]
    );

    // Rejections: code and reason.
    let reject = |code: Code, needle: &'static str| {
        move |r: Result<tonic::Response<IstioCertificateResponse>, tonic::Status>| {
            let s = r.expect_err("must be rejected");
            assert_eq!(s.code(), code, "{s:?}");
            assert!(
                s.message().contains(needle),
                "{needle:?} not in {:?}",
                s.message()
            );
        }
    };
    let other_dir = tempfile::tempdir().expect("tempdir");
    let forged = TokenIssuer::load_or_create(other_dir.path())
        .expect("forger")
        .issue("app", "web", "istio-ca", Duration::from_secs(600));
    reject(Code::Unauthenticated, "bad signature")(
        client
            .create_certificate(request(&pem, Some(&forged)))
            .await,
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_secs();
    let expired = issuer.sign(&Claims {
        iss: "istiod-lite".into(),
        sub: "system:serviceaccount:app:web".into(),
        aud: vec!["istio-ca".into()],
        // Expired beyond the allowed clock skew.
        exp: now - DEFAULT_TOKEN_CLOCK_SKEW.as_secs() - 5,
        nbf: now - 100,
        iat: now - 100,
    });
    reject(Code::Unauthenticated, "expired")(
        client
            .create_certificate(request(&pem, Some(&expired)))
            .await,
    );
    let wrong_aud = issuer.issue("app", "web", "kubernetes", Duration::from_secs(600));
    reject(Code::Unauthenticated, "audience")(
        client
            .create_certificate(request(&pem, Some(&wrong_aud)))
            .await,
    );
    reject(Code::Unauthenticated, "no credentials")(
        client.create_certificate(request(&pem, None)).await,
    );
    reject(Code::InvalidArgument, "CSR")(
        client
            .create_certificate(request(
                "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
                Some(&token),
            ))
            .await,
    );
    cancel.cancel();
    running.wait().await.expect("stopped on shutdown");
}

#[tokio::test]
async fn plugin_cacerts_chain_through_the_intermediate() {
    let ca_dir = tempfile::tempdir().expect("tempdir");
    let config = tempfile::tempdir().expect("tempdir");
    let ca = start_plugin(config.path(), ca_dir.path(), "org root").await;
    // The serving certificate chains to the plug-in root too.
    let mut client = tls(ca.running.secure_grpc_addr, &ca.root, None).await;
    let (pem, _) = csr("spiffe://cluster.local/ns/ns/sa/sa");
    let resp = signed(&mut client, &pem, Some(&ca.token), "signed").await;
    assert_eq!(resp.cert_chain.len(), 3, "leaf, intermediate, root");
    assert_eq!(resp.cert_chain[1], ca.int);
    assert_eq!(resp.cert_chain[2], ca.root);
    ca.cancel.cancel();
    ca.running.wait().await.expect("stopped on shutdown");
}

/// `citadel_server_success_cert_issuance_count` from the monitoring port.
async fn issued_count(monitoring: std::net::SocketAddr) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(monitoring)
        .await
        .expect("connect monitoring");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut body = String::new();
    s.read_to_string(&mut body).await.expect("read");
    body.lines()
        .find(|l| l.starts_with("citadel_server_success_cert_issuance_count"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no issuance counter in {body}"))
}

/// Issue 9, hostile input: every request is refused with a precise code and reason, and the
/// issuance counter does not move.
#[tokio::test]
async fn hostile_requests_are_rejected_and_issue_nothing() {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;

    let config = tempfile::tempdir().expect("tempdir");
    let ca_dir = tempfile::tempdir().expect("tempdir");
    let (running, cancel) = start(config.path(), ca_dir.path()).await;
    let issuer = TokenIssuer::load_or_create(ca_dir.path()).expect("issuer");
    let token = issuer.issue("app", "web", "istio-ca", Duration::from_secs(600));
    let root = std::fs::read_to_string(ca_dir.path().join("root-cert.pem")).expect("root");
    let mut client = tls(running.secure_grpc_addr, &root, None).await;
    let (pem, _) = csr("spiffe://cluster.local/ns/app/sa/web");
    let before = issued_count(running.monitoring_addr).await;

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_secs();
    let claims = |iss: &str, nbf: u64| Claims {
        iss: iss.into(),
        sub: "system:serviceaccount:app:web".into(),
        aud: vec!["istio-ca".into()],
        exp: now + 600,
        nbf,
        iat: now,
    };
    let cases: Vec<(&str, String, String, Code, &str)> = vec![
        (
            "alg: none, no signature",
            format!(
                "{}.{}.",
                B64.encode(br#"{"alg":"none","typ":"JWT"}"#),
                B64.encode(serde_json::to_vec(&claims("istiod-lite", now)).expect("json"))
            ),
            pem.clone(),
            Code::Unauthenticated,
            "token rejected: malformed token",
        ),
        (
            "HS256 with the public key as secret (algorithm confusion)",
            jsonwebtoken::encode(
                &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
                &claims("istiod-lite", now),
                &jsonwebtoken::EncodingKey::from_secret(b"istio-ca").expect("secret"),
            )
            .expect("hs256"),
            pem.clone(),
            Code::Unauthenticated,
            "bad signature",
        ),
        (
            "not yet valid",
            issuer.sign(&claims("istiod-lite", now + 3600)),
            pem.clone(),
            Code::Unauthenticated,
            "not yet valid",
        ),
        (
            "1024-bit RSA key",
            token.clone(),
            include_str!("../data/rsa1024.csr.pem").to_string(),
            Code::InvalidArgument,
            "1024-bit RSA",
        ),
        (
            "1 MiB CSR",
            token.clone(),
            oversized_csr(),
            Code::InvalidArgument,
            "limit",
        ),
    ];
    for (what, tok, body, code, needle) in cases {
        let s = client
            .create_certificate(request(&body, Some(&tok)))
            .await
            .expect_err(what);
        assert_eq!(s.code(), code, "{what}: {s:?}");
        assert!(
            s.message().contains(needle),
            "{what}: {needle:?} not in {:?}",
            s.message()
        );
    }
    assert_eq!(
        issued_count(running.monitoring_addr).await,
        before,
        "a hostile request was issued a certificate"
    );

    // A token signed with the right key but claiming another issuer is refused too.
    let wrong_iss = issuer.sign(&claims("https://evil.example", now));
    let s = client
        .create_certificate(request(&pem, Some(&wrong_iss)))
        .await
        .expect_err("wrong issuer");
    assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    assert!(s.message().contains("wrong issuer"), "{s:?}");
    assert_eq!(issued_count(running.monitoring_addr).await, before);
    cancel.cancel();
    running.wait().await.expect("stopped on shutdown");
}

/// A well-formed, correctly signed CSR of about 1 MiB (thousands of DNS names).
fn oversized_csr() -> String {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = (0..18_000)
        .map(|i| {
            SanType::DnsName(
                format!("host-{i:06}.padding-padding-padding.example")
                    .try_into()
                    .expect("ia5"),
            )
        })
        .collect();
    let pem = params
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem");
    assert!(pem.len() >= 1 << 20, "CSR is only {} bytes", pem.len());
    pem
}

/// Writes plug-in cacerts (a root named `name` and an intermediate); returns (root, intermediate).
fn write_cacerts(dir: &Path, name: &str) -> (String, String) {
    use rcgen::{BasicConstraints, DnType, IsCa, Issuer, KeyUsagePurpose};
    let root_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut rp = CertificateParams::default();
    rp.distinguished_name.push(DnType::CommonName, name);
    rp.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    rp.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let root = rp.self_signed(&root_key).expect("root");
    let root_issuer = Issuer::new(rp, root_key);
    let int_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut ip = CertificateParams::default();
    ip.distinguished_name
        .push(DnType::CommonName, format!("{name} intermediate"));
    ip.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ip.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let int = ip.signed_by(&int_key, &root_issuer).expect("int");
    // Like an operator copying files one by one; the CA must not mix old and new.
    std::fs::write(dir.join("ca-cert.pem"), int.pem()).expect("w");
    std::fs::write(dir.join("ca-key.pem"), int_key.serialize_pem()).expect("w");
    std::fs::write(dir.join("root-cert.pem"), root.pem()).expect("w");
    std::fs::write(dir.join("cert-chain.pem"), int.pem() + &root.pem()).expect("w");
    (root.pem(), int.pem())
}

fn verifies(leaf_pem: &str, issuer_pem: &str) -> bool {
    let (_, l) = x509_parser::pem::parse_x509_pem(leaf_pem.as_bytes()).expect("pem");
    let (_, i) = x509_parser::pem::parse_x509_pem(issuer_pem.as_bytes()).expect("pem");
    let (_, leaf) = x509_parser::parse_x509_certificate(&l.contents).expect("x509");
    let (_, issuer) = x509_parser::parse_x509_certificate(&i.contents).expect("x509");
    leaf.verify_signature(Some(issuer.public_key())).is_ok()
}

/// Issue 9, root CA changed: plug-in cacerts replaced under a running server. The new CA signs
/// from then on, responses carry the old and the new root (`root_cert` and the last
/// `cert_chain` entry), and the TLS port serves a certificate from the new CA and accepts
/// client certificates from both.
#[tokio::test]
async fn replaced_plugin_cacerts_take_over_and_the_bundle_keeps_the_old_root() {
    let ca_dir = tempfile::tempdir().expect("tempdir");
    let d = ca_dir.path();
    let config = tempfile::tempdir().expect("tempdir");
    let PluginCa {
        running,
        cancel,
        root: root_a,
        int: int_a,
        token,
    } = start_plugin(config.path(), d, "root A").await;
    let mut client = tls(running.secure_grpc_addr, &root_a, None).await;
    let (pem, before_key) = csr("spiffe://cluster.local/ns/ns/sa/sa");
    let before = signed(&mut client, &pem, Some(&token), "signed").await;
    assert!(verifies(&before.cert_chain[0], &int_a));
    assert_eq!(
        before.root_cert.expect("roots").ca_cert,
        vec![root_a.clone()]
    );

    let (root_b, int_b) = write_cacerts(d, "root B");
    let t0 = std::time::Instant::now();
    let after = loop {
        let r = signed(&mut client, &pem, Some(&token), "signed during the change").await;
        if verifies(&r.cert_chain[0], &int_b) {
            break r;
        }
        assert!(
            verifies(&r.cert_chain[0], &int_a),
            "until the switch the old CA signs"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the new CA never took over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!("FIGURE ca_reload new_ca_signing_after={:?}", t0.elapsed());
    assert_eq!(
        after.root_cert.expect("roots").ca_cert,
        vec![root_b.clone(), root_a.clone()]
    );
    assert_eq!(after.cert_chain[1], int_b);
    assert_eq!(
        after.cert_chain.last().expect("bundle"),
        &format!("{root_b}{root_a}")
    );
    // The secure port follows the CA (as istiod re-signs its own certificate): clients that
    // trust the new root reach it, and both a certificate from the old CA (its root is still
    // in the bundle) and one from the new CA authenticate as client certificates.
    let old_chain = before.cert_chain.concat();
    let old_client = (old_chain.clone(), before_key.serialize_pem());
    let mut fresh = tls(running.secure_grpc_addr, &root_b, None).await;
    let (new_pem, new_key) = csr("spiffe://cluster.local/ns/ns/sa/sa");
    let new_chain = signed(
        &mut fresh,
        &new_pem,
        Some(&token),
        "new-root clients reach the CA",
    )
    .await
    .cert_chain;
    assert!(verifies(&new_chain[0], &int_b));
    for (what, chain, key) in [
        ("old-CA", old_chain, before_key.serialize_pem()),
        ("new-CA", new_chain.concat(), new_key.serialize_pem()),
    ] {
        let r = signed_with_client_cert(
            running.secure_grpc_addr,
            &format!("{root_b}{root_a}"),
            (chain, key),
            "spiffe://cluster.local/ns/x/sa/y",
            &format!("{what} client certificate refused"),
        )
        .await;
        assert_eq!(
            uri_sans(&r.cert_chain[0]),
            vec!["spiffe://cluster.local/ns/ns/sa/sa"],
            "{what}"
        );
    }
    cancel.cancel();
    running.wait().await.expect("stopped on shutdown");

    // A restart during the overlap: the old root was saved in previous-roots.json, so it is
    // still in the bundle, and the old CA's client certificates still authenticate.
    assert!(d.join(control_plane::PREVIOUS_ROOTS).exists());
    let (running, cancel) = start(config.path(), d).await;
    let r = signed_with_client_cert(
        running.secure_grpc_addr,
        &root_b,
        old_client,
        "spiffe://cluster.local/ns/x/sa/y",
        "old-CA client certificate after a restart",
    )
    .await;
    assert!(verifies(&r.cert_chain[0], &int_b), "the new CA still signs");
    assert_eq!(
        r.root_cert.expect("roots").ca_cert,
        vec![root_b.clone(), root_a.clone()],
        "the old root survived the restart"
    );
    assert_eq!(
        r.cert_chain.last().expect("bundle"),
        &format!("{root_b}{root_a}")
    );
    cancel.cancel();
    running.wait().await.expect("stopped on shutdown");
}
