use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{CertificateParams, KeyPair, PKCS_ECDSA_P256_SHA256};

use super::csr_policy::rsa_modulus_bits;
use super::*;

/// An Istio-style CSR: empty subject, one URI SAN.
pub(crate) fn csr_for(uri: &str, key: &KeyPair) -> String {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = vec![SanType::URI(
        rcgen::string::Ia5String::try_from(uri.to_string()).expect("ia5"),
    )];
    params
        .serialize_request(key)
        .expect("csr")
        .pem()
        .expect("pem")
}

fn parse(pem: &str) -> Vec<u8> {
    pem_der(pem).expect("pem")
}

fn leaf_uri_sans(pem: &str) -> Vec<String> {
    let der = parse(pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("x509");
    cert.subject_alternative_name()
        .expect("san ext")
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

fn validity_secs(pem: &str) -> i64 {
    let der = parse(pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("x509");
    cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp()
}

#[test]
fn self_signed_root_is_created_once_with_private_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::load_or_create(dir.path()).expect("create");
    assert!(!ca.is_plugin());
    for f in [CA_CERT, CA_KEY, CERT_CHAIN, ROOT_CERT] {
        let mode = std::fs::metadata(dir.path().join(f))
            .expect(f)
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{f} mode");
    }
    let root1 = ca.root_pem().to_string();
    let again = Ca::load_or_create(dir.path()).expect("reload");
    assert_eq!(again.root_pem(), root1, "restart keeps the same root");
    let der = parse(&root1);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("x509");
    assert!(cert.is_ca());
    let years = (cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp())
        / (365 * 24 * 3600);
    assert_eq!(years, 10);
}

#[test]
fn san_comes_from_identity_not_csr_and_chain_ends_with_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::load_or_create(dir.path()).expect("create");
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let csr = csr_for("spiffe://cluster.local/ns/admin/sa/root", &key);
    let id = Identity::new("cluster.local", "app", "web");
    let chain = ca
        .sign_workload(&csr, &id, Duration::from_secs(3600))
        .expect("sign");
    assert_eq!(chain.len(), 2, "leaf + root");
    assert_eq!(
        leaf_uri_sans(&chain[0]),
        vec!["spiffe://cluster.local/ns/app/sa/web"]
    );
    assert_eq!(chain.last().map(String::as_str), Some(ca.root_pem()));
    // 60 s of backdating for clock skew.
    assert_eq!(validity_secs(&chain[0]), 3600 + 60);
    // The leaf's public key is the CSR's.
    let der = parse(&chain[0]);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("x509");
    assert_eq!(
        cert.public_key().subject_public_key.data.as_ref(),
        key.public_key_raw()
    );
}

#[test]
fn ttl_is_capped_at_90_days() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::load_or_create(dir.path()).expect("create");
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let csr = csr_for("spiffe://cluster.local/ns/a/sa/b", &key);
    let chain = ca
        .sign_workload(
            &csr,
            &Identity::new("cluster.local", "a", "b"),
            Duration::from_secs(365 * 86400),
        )
        .expect("sign");
    assert_eq!(
        validity_secs(&chain[0]),
        MAX_WORKLOAD_TTL.as_secs() as i64 + 60
    );
}

#[test]
fn rsa_csr_is_signed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::load_or_create(dir.path()).expect("create");
    let key = KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("rsa key");
    let csr = csr_for("spiffe://cluster.local/ns/a/sa/b", &key);
    let chain = ca
        .sign_workload(
            &csr,
            &Identity::new("cluster.local", "a", "b"),
            DEFAULT_WORKLOAD_TTL,
        )
        .expect("sign rsa");
    assert_eq!(
        leaf_uri_sans(&chain[0]),
        vec!["spiffe://cluster.local/ns/a/sa/b"]
    );
}

/// A P-384 key in a CSR signed with ecdsa-with-SHA256 (`openssl req -new -sha256`).
const P384_KEY_SHA256_CSR: &str = "-----BEGIN CERTIFICATE REQUEST-----\nMIIBCDCBjgIBADAPMQ0wCwYDVQQKDAR0ZXN0MHYwEAYHKoZIzj0CAQYFK4EEACID\nYgAEsDtfFxLPcNIrwIHNXGfCNE/DxhruIZV2OFZ2sBZoi+RTLpTHUl2CEnvLwGfU\n+n/jqpvJ50CM8n6it094aC6eQ+ni2RdIXVGycqQWZmxhpyLVTyOvK0Sp+NA1oJRr\n/yG6oAAwCgYIKoZIzj0EAwIDaQAwZgIxAJHfWZBMSIqE3PxZgyQbkB2arQkcunUq\nGvFCxmW1RFByzlSPRSTLPVdH+i/lNbTjowIxAOmMJbbblsKEJZHXsmAaQ/ESeSND\n6YhVcBqvSX9fru+7B6JokTcBGYTWt/l5Zr3ryA==\n-----END CERTIFICATE REQUEST-----\n";
/// A P-256 key in a CSR signed with ecdsa-with-SHA384.
const P256_KEY_SHA384_CSR: &str = "-----BEGIN CERTIFICATE REQUEST-----\nMIHJMHECAQAwDzENMAsGA1UECgwEdGVzdDBZMBMGByqGSM49AgEGCCqGSM49AwEH\nA0IABHyiUEF0iHJlbBUvBVrJJ7TaEW6EJ0n6BR3bzRLhHXcuyobmVo3ExnbvqSZd\n35/R+sGimBjmPbdMwTkQbNLeRFWgADAKBggqhkjOPQQDAwNIADBFAiA/iTtkQzwk\nLJxiSXnrpkAN+xyB6aZpAwx3WNhfTvi9YwIhAKrEKrf+/w+SX+dRrrJCsywM9Mug\nQz93yL6XvxqYF0st\n-----END CERTIFICATE REQUEST-----\n";

/// The curve (SubjectPublicKeyInfo parameters) and key bytes of a certificate or CSR's key.
fn spki_of(spki: &x509_parser::x509::SubjectPublicKeyInfo<'_>) -> (String, Vec<u8>) {
    let curve = spki
        .algorithm
        .parameters
        .as_ref()
        .and_then(|p| p.as_oid().ok())
        .map(|o| o.to_id_string())
        .unwrap_or_default();
    (curve, spki.subject_public_key.data.to_vec())
}

/// The CSR's key is issued on its own curve, whatever hash signed the CSR (Istio's Go CA copies
/// the key; rcgen alone labelled it with the hash's curve).
#[test]
fn an_ec_key_keeps_its_curve_whatever_hash_signed_the_csr() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::load_or_create(dir.path()).expect("create");
    for (csr, curve) in [
        (P384_KEY_SHA256_CSR, "1.3.132.0.34"),
        (P256_KEY_SHA384_CSR, "1.2.840.10045.3.1.7"),
    ] {
        let chain = ca
            .sign_workload(
                csr,
                &Identity::new("cluster.local", "a", "b"),
                DEFAULT_WORKLOAD_TTL,
            )
            .expect("signed");
        let csr_der = parse(csr);
        let (_, req) =
            <x509_parser::certification_request::X509CertificationRequest as x509_parser::prelude::FromDer<'_, _>>::from_der(&csr_der)
                .expect("csr");
        let leaf_der = parse(&chain[0]);
        let (_, leaf) = x509_parser::parse_x509_certificate(&leaf_der).expect("x509");
        let issued = spki_of(leaf.public_key());
        assert_eq!(issued.0, curve, "the key's own curve");
        assert_eq!(issued, spki_of(&req.certification_request_info.subject_pki));
        assert!(leaf.public_key().parsed().is_ok(), "a usable key");
    }
}

/// Found by fuzzing (`ca_csr_pem`): a space inside the base64 made the policy's PEM parser fail
/// while the signer's accepted it, so the curve check was skipped for what got signed. One
/// decoder now serves both: such a CSR is refused, or issued on its own curve.
#[test]
fn a_csr_the_checks_cannot_read_is_never_signed_unchecked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::load_or_create(dir.path()).expect("create");
    let mangled = P384_KEY_SHA256_CSR.replacen("YgAE", "YgA E", 1);
    assert_ne!(mangled, P384_KEY_SHA256_CSR);
    let id = Identity::new("cluster.local", "a", "b");
    if let Ok(chain) = ca.sign_workload(&mangled, &id, DEFAULT_WORKLOAD_TTL) {
        let leaf_der = parse(&chain[0]);
        let (_, leaf) = x509_parser::parse_x509_certificate(&leaf_der).expect("x509");
        assert_eq!(
            spki_of(leaf.public_key()).0,
            "1.3.132.0.34",
            "the key's own curve"
        );
    }
}

#[test]
fn garbage_csr_is_a_csr_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::load_or_create(dir.path()).expect("create");
    let err = ca
        .sign_workload(
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
            &Identity::new("td", "a", "b"),
            DEFAULT_WORKLOAD_TTL,
        )
        .expect_err("garbage");
    assert!(matches!(err, Error::Csr(_)), "{err}");
    assert!(matches!(
        ca.sign_workload(
            "not pem",
            &Identity::new("td", "a", "b"),
            DEFAULT_WORKLOAD_TTL
        ),
        Err(Error::Csr(_))
    ));
}

/// Writes plug-in cacerts: a root and an intermediate signed by it. Returns (root pem, intermediate pem).
pub(crate) fn write_plugin_cacerts(dir: &Path) -> (String, String) {
    write_plugin_cacerts_valid(dir, None)
}

/// [`write_plugin_cacerts`] with the intermediate (the signing CA) valid until `not_after`
/// (rcgen's default when `None`).
fn write_plugin_cacerts_valid(dir: &Path, not_after: Option<SystemTime>) -> (String, String) {
    let root_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut root_params = CertificateParams::default();
    root_params.distinguished_name = DistinguishedName::new();
    root_params
        .distinguished_name
        .push(DnType::CommonName, "plug-in root");
    root_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    root_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let root = root_params.self_signed(&root_key).expect("root");
    let root_issuer = Issuer::new(root_params, root_key);
    let int_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut int_params = CertificateParams::default();
    int_params.distinguished_name = DistinguishedName::new();
    int_params
        .distinguished_name
        .push(DnType::CommonName, "plug-in intermediate");
    int_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    int_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    if let Some(t) = not_after {
        int_params.not_before = to_offset(t - Duration::from_secs(7 * 24 * 3600));
        int_params.not_after = to_offset(t);
    }
    let int = int_params
        .signed_by(&int_key, &root_issuer)
        .expect("intermediate");
    std::fs::create_dir_all(dir).expect("mkdir");
    std::fs::write(dir.join(CA_CERT), int.pem()).expect("write");
    std::fs::write(dir.join(CA_KEY), int_key.serialize_pem()).expect("write");
    std::fs::write(dir.join(ROOT_CERT), root.pem()).expect("write");
    std::fs::write(dir.join(CERT_CHAIN), format!("{}{}", int.pem(), root.pem())).expect("write");
    (root.pem(), int.pem())
}

fn not_after(pem: &str) -> SystemTime {
    let der = parse(pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("x509");
    unix_time(cert.validity().not_after.timestamp())
}

#[test]
fn leaf_lifetime_is_clamped_to_the_signing_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Whole seconds, as in a certificate.
    let ca_until = unix_time(now() as i64 + 2 * 3600);
    let (_, int) = write_plugin_cacerts_valid(dir.path(), Some(ca_until));
    let ca = Ca::load_or_create(dir.path()).expect("plug-in");
    assert_eq!(not_after(&int), ca_until);
    // 24 h asked, 2 h left on the signing CA: the leaf ends with the CA.
    let chain = sign_with(&ca);
    assert_eq!(not_after(&chain[0]), ca_until);
    assert!(
        validity_secs(&chain[0]) <= 2 * 3600 + 60,
        "{}",
        validity_secs(&chain[0])
    );
    assert!(signed_by(&chain[0], &int));
    // A shorter request than what the CA has left is kept.
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let short = ca
        .sign_workload(
            &csr_for("spiffe://cluster.local/ns/a/sa/b", &key),
            &Identity::new("cluster.local", "a", "b"),
            Duration::from_secs(600),
        )
        .expect("sign");
    assert!(not_after(&short[0]) < ca_until);
    assert_eq!(validity_secs(&short[0]), 660, "10 min + 60 s backdating");
}

#[test]
fn an_expired_signing_ca_signs_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_plugin_cacerts_valid(dir.path(), Some(unix_time(now() as i64 - 3600)));
    let ca = Ca::load_or_create(dir.path()).expect("plug-in");
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let err = ca
        .sign_workload(
            &csr_for("spiffe://cluster.local/ns/a/sa/b", &key),
            &Identity::new("cluster.local", "a", "b"),
            DEFAULT_WORKLOAD_TTL,
        )
        .expect_err("expired CA");
    let msg = err.to_string();
    assert!(matches!(err, Error::Sign(_)), "{msg}");
    assert!(
        msg.contains("ca-cert.pem") && msg.contains("expired"),
        "{msg}"
    );
}

#[test]
fn plugin_cacerts_sign_as_intermediate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, int) = write_plugin_cacerts(dir.path());
    let ca = Ca::load_or_create(dir.path()).expect("plug-in");
    assert!(ca.is_plugin());
    assert_eq!(ca.root_pem(), root);
    let chain = sign_with(&ca);
    assert_eq!(
        chain,
        vec![chain[0].clone(), int.clone(), root.clone()],
        "leaf, intermediate, root"
    );
    let leaf_der = parse(&chain[0]);
    let int_der = parse(&int);
    let (_, leaf) = x509_parser::parse_x509_certificate(&leaf_der).expect("leaf");
    let (_, icert) = x509_parser::parse_x509_certificate(&int_der).expect("int");
    assert_eq!(leaf.issuer(), icert.subject());
    assert!(
        signed_by(&chain[0], &int),
        "leaf signed by the intermediate"
    );
}

#[test]
fn incomplete_plugin_is_an_error_naming_the_missing_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_plugin_cacerts(dir.path());
    std::fs::remove_file(dir.path().join(CERT_CHAIN)).expect("rm");
    let err = Ca::load_or_create(dir.path()).expect_err("incomplete");
    assert!(err.to_string().contains("cert-chain.pem"), "{err}");
}

#[test]
fn serving_cert_has_dns_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::load_or_create(dir.path()).expect("create");
    let names = vec![
        "istiod.istio-system.svc".to_string(),
        "extra.example".to_string(),
    ];
    let kp = ca
        .issue_serving(&names, Duration::from_secs(3600))
        .expect("serving");
    let certs = split_pem_certs(&kp.chain_pem);
    assert_eq!(certs.len(), 2);
    let der = parse(&certs[0]);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("x509");
    let dns: Vec<String> = cert
        .subject_alternative_name()
        .expect("ext")
        .expect("san")
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(dns, names);
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("time")
        .as_secs()
}

#[test]
fn tokens_verify_and_reject_with_reasons() {
    let dir = tempfile::tempdir().expect("tempdir");
    let issuer = TokenIssuer::load_or_create(dir.path()).expect("issuer");
    let mode = std::fs::metadata(dir.path().join(ISSUER_KEY))
        .expect("key")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let good = issuer.issue("ns1", "sa1", "istio-ca", Duration::from_secs(600));
    assert_eq!(
        issuer.verify(&good, "istio-ca"),
        Ok(("ns1".into(), "sa1".into()))
    );
    // The same key is loaded again (the `token` command and `serve` agree).
    let again = TokenIssuer::load_or_create(dir.path()).expect("reload");
    assert!(again.verify(&good, "istio-ca").is_ok());

    assert_eq!(
        issuer.verify(&good, "other"),
        Err(TokenError::WrongAudience {
            expected: "other".into()
        })
    );
    let claims = |exp: u64, nbf: u64, sub: &str| Claims {
        iss: "istiod-lite".into(),
        sub: sub.into(),
        aud: vec!["istio-ca".into()],
        exp,
        nbf,
        iat: nbf,
    };
    // Expired beyond the allowed clock skew.
    let expired = issuer.sign(&claims(
        now() - DEFAULT_TOKEN_CLOCK_SKEW.as_secs() - 10,
        now() - 100,
        "system:serviceaccount:a:b",
    ));
    assert_eq!(
        issuer.verify(&expired, "istio-ca"),
        Err(TokenError::Expired)
    );
    let early = issuer.sign(&claims(
        now() + 1000,
        now() + 500,
        "system:serviceaccount:a:b",
    ));
    assert_eq!(
        issuer.verify(&early, "istio-ca"),
        Err(TokenError::NotYetValid)
    );
    let mut other_iss = claims(now() + 1000, now(), "system:serviceaccount:a:b");
    other_iss.iss = "https://kubernetes.default.svc".into();
    assert_eq!(
        issuer.verify(&issuer.sign(&other_iss), "istio-ca"),
        Err(TokenError::WrongIssuer {
            expected: "istiod-lite".into()
        })
    );
    let bad_sub = issuer.sign(&claims(now() + 1000, now(), "alice"));
    assert!(matches!(
        issuer.verify(&bad_sub, "istio-ca"),
        Err(TokenError::BadSubject(_))
    ));

    let other_dir = tempfile::tempdir().expect("tempdir");
    let forger = TokenIssuer::load_or_create(other_dir.path()).expect("issuer");
    let forged = forger.issue("ns1", "sa1", "istio-ca", Duration::from_secs(600));
    assert_eq!(
        issuer.verify(&forged, "istio-ca"),
        Err(TokenError::BadSignature)
    );
    assert!(matches!(
        issuer.verify("a.b.c", "istio-ca"),
        Err(TokenError::Malformed(_))
    ));
}

#[test]
fn token_times_allow_the_configured_clock_skew() {
    let dir = tempfile::tempdir().expect("tempdir");
    let load = || TokenIssuer::load_or_create(dir.path()).expect("issuer");
    assert_eq!(load().clock_skew(), DEFAULT_TOKEN_CLOCK_SKEW);
    assert_eq!(DEFAULT_TOKEN_CLOCK_SKEW, Duration::from_secs(60));
    let issuer = load().with_clock_skew(Duration::from_secs(30));
    let token = |exp: u64, nbf: u64| {
        issuer.sign(&Claims {
            iss: "istiod-lite".into(),
            sub: "system:serviceaccount:a:b".into(),
            aud: vec!["istio-ca".into()],
            exp,
            nbf,
            iat: nbf,
        })
    };
    let ok = Ok(("a".to_string(), "b".to_string()));
    // Inside the skew (20 s of 30 s): expired a moment ago, or valid a moment from now.
    assert_eq!(
        issuer.verify(&token(now() - 20, now() - 100), "istio-ca"),
        ok
    );
    assert_eq!(
        issuer.verify(&token(now() + 600, now() + 20), "istio-ca"),
        ok
    );
    // Outside it (40 s).
    assert_eq!(
        issuer.verify(&token(now() - 40, now() - 100), "istio-ca"),
        Err(TokenError::Expired)
    );
    assert_eq!(
        issuer.verify(&token(now() + 600, now() + 40), "istio-ca"),
        Err(TokenError::NotYetValid)
    );
    // No skew: a token expired a second ago is refused.
    let strict = load().with_clock_skew(Duration::ZERO);
    assert_eq!(
        strict.verify(&token(now() - 1, now() - 100), "istio-ca"),
        Err(TokenError::Expired)
    );
}

#[test]
fn identity_round_trips_and_rejects_garbage() {
    let id = Identity::parse_spiffe("spiffe://td/ns/a/sa/b").expect("parse");
    assert_eq!(id, Identity::new("td", "a", "b"));
    assert_eq!(id.to_string(), "spiffe://td/ns/a/sa/b");
    for bad in [
        "spiffe://td/ns/a",
        "http://td/ns/a/sa/b",
        "spiffe://td/ns//sa/b",
    ] {
        assert!(Identity::parse_spiffe(bad).is_err(), "{bad}");
    }
}

#[test]
fn rsa_modulus_bits_ignores_leading_zeros() {
    assert_eq!(rsa_modulus_bits(&[]), 0);
    assert_eq!(rsa_modulus_bits(&[0, 0]), 0);
    assert_eq!(rsa_modulus_bits(&[0x01]), 1);
    // DER's sign byte before a 1024-bit modulus, and the same modulus without it.
    let mut m = vec![0u8; 129];
    m[1] = 0x80;
    assert_eq!(rsa_modulus_bits(&m), 1024);
    assert_eq!(rsa_modulus_bits(&m[1..]), 1024);
    m[1] = 0x7f;
    assert_eq!(rsa_modulus_bits(&m), 1023);
}

#[test]
fn oversized_csr_is_refused_before_parsing() {
    let ca_dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::load_or_create(ca_dir.path()).expect("ca");
    let id = Identity::new("cluster.local", "ns", "sa");
    let huge = "A".repeat(MAX_CSR_BYTES + 1);
    let err = ca
        .sign_workload(&huge, &id, Duration::from_secs(60))
        .expect_err("oversized");
    assert!(matches!(err, Error::CsrRejected(_)), "{err}");
    assert!(err.to_string().contains("65537 bytes"), "{err}");
}

fn sign_with(ca: &Ca) -> Vec<String> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let csr = csr_for("spiffe://cluster.local/ns/a/sa/b", &key);
    ca.sign_workload(
        &csr,
        &Identity::new("cluster.local", "a", "b"),
        DEFAULT_WORKLOAD_TTL,
    )
    .expect("sign")
}

fn signed_by(leaf_pem: &str, ca_pem: &str) -> bool {
    let leaf_der = parse(leaf_pem);
    let ca_der = parse(ca_pem);
    let (_, leaf) = x509_parser::parse_x509_certificate(&leaf_der).expect("leaf");
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).expect("ca");
    leaf.verify_signature(Some(ca.public_key())).is_ok()
}

/// Plug-in cacerts in a fresh directory, the CA on them and a reloader watching it:
/// (directory, (root, intermediate), CA, reloader).
fn reloading_plugin_ca() -> (tempfile::TempDir, (String, String), SharedCa, Reloader) {
    let dir = tempfile::tempdir().expect("tempdir");
    let pems = write_plugin_cacerts(dir.path());
    let shared = SharedCa::new(Ca::load_or_create(dir.path()).expect("A"));
    let reloader = Reloader::new(shared.clone());
    (dir, pems, shared, reloader)
}

/// Polls until the reloader settles on something other than `Settling`.
fn settle(r: &mut Reloader) -> Result<Reloaded, Error> {
    for _ in 0..5 {
        match r.poll()? {
            Reloaded::Settling => continue,
            other => return Ok(other),
        }
    }
    panic!("the reloader never settled");
}

#[test]
fn replaced_cacerts_sign_from_then_on_and_the_bundle_keeps_the_old_root() {
    let (dir, (root_a, int_a), shared, mut reloader) = reloading_plugin_ca();
    assert_eq!(reloader.poll().expect("poll"), Reloaded::Unchanged);
    let before = sign_with(&shared.current());
    assert_eq!(
        before.last(),
        Some(&root_a),
        "one root: the last entry is it"
    );

    let (root_b, int_b) = write_plugin_cacerts(dir.path());
    assert_eq!(
        reloader.poll().expect("poll"),
        Reloaded::Settling,
        "a change is loaded once the files stayed the same for a second poll"
    );
    assert_eq!(reloader.poll().expect("poll"), Reloaded::Replaced);
    assert_eq!(reloader.poll().expect("poll"), Reloaded::Unchanged);

    let ca = shared.current();
    assert_eq!(ca.trust_bundle(), vec![root_b.clone(), root_a.clone()]);
    let after = sign_with(&ca);
    assert!(signed_by(&after[0], &int_b), "the new CA signs");
    assert!(!signed_by(&after[0], &int_a));
    assert_eq!(after[1], int_b);
    assert_eq!(
        split_pem_certs(after.last().expect("bundle")),
        vec![root_b.clone(), root_a.clone()],
        "the last entry (the agents' ROOTCA) trusts both roots during the overlap"
    );

    // A second replacement keeps A (its certificates are still valid) and B.
    let (root_c, _) = write_plugin_cacerts(dir.path());
    assert_eq!(settle(&mut reloader).expect("poll"), Reloaded::Replaced);
    assert_eq!(
        shared.current().trust_bundle(),
        vec![root_c, root_b, root_a]
    );
}

#[test]
fn an_old_root_that_signed_no_workload_certificate_leaves_the_bundle() {
    let (dir, _, shared, mut reloader) = reloading_plugin_ca();
    // The serving certificate does not count: it is re-issued by the new CA.
    shared
        .current()
        .issue_serving(&["istiod".to_string()], Duration::from_secs(3600))
        .expect("serving");
    let (root_b, _) = write_plugin_cacerts(dir.path());
    assert_eq!(settle(&mut reloader).expect("poll"), Reloaded::Replaced);
    assert_eq!(shared.current().trust_bundle(), vec![root_b]);
}

#[test]
fn a_half_replaced_set_is_rejected_once_and_the_old_ca_keeps_signing() {
    let (dir, (root_a, int_a), shared, mut reloader) = reloading_plugin_ca();
    // The new certificate without its key.
    let b = tempfile::tempdir().expect("tempdir");
    let (root_b, _) = write_plugin_cacerts(b.path());
    for f in [CA_CERT, ROOT_CERT, CERT_CHAIN] {
        std::fs::copy(b.path().join(f), dir.path().join(f)).expect("copy");
    }
    let err = settle(&mut reloader).expect_err("mismatched key");
    assert!(
        err.to_string().contains("ca-key.pem") && err.to_string().contains("does not match"),
        "{err}"
    );
    assert_eq!(
        reloader.poll().expect("poll"),
        Reloaded::Rejected,
        "reported once, not on every poll"
    );
    let chain = sign_with(&shared.current());
    assert!(signed_by(&chain[0], &int_a), "the old CA still signs");
    assert_eq!(shared.current().trust_bundle(), vec![root_a]);

    // The key arrives: the new CA takes over.
    std::fs::copy(b.path().join(CA_KEY), dir.path().join(CA_KEY)).expect("copy");
    assert_eq!(settle(&mut reloader).expect("poll"), Reloaded::Replaced);
    assert_eq!(shared.current().root_pem(), root_b);
}

#[test]
fn a_file_missing_mid_replacement_changes_nothing() {
    let (dir, (root_a, _), shared, mut reloader) = reloading_plugin_ca();
    std::fs::remove_file(dir.path().join(CA_KEY)).expect("rm");
    for _ in 0..3 {
        assert_eq!(reloader.poll().expect("poll"), Reloaded::Unchanged);
    }
    assert_eq!(shared.current().root_pem(), root_a);
}

fn previous_roots_json(entries: &[(&str, u64)]) -> String {
    let roots: Vec<serde_json::Value> = entries
        .iter()
        .map(|(pem, until)| serde_json::json!({"pem": pem, "keep_until": until}))
        .collect();
    serde_json::json!({ "roots": roots }).to_string()
}

/// The PEMs in `previous-roots.json`.
fn previous_root_pems(path: &Path) -> Vec<String> {
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json");
    file["roots"]
        .as_array()
        .expect("roots")
        .iter()
        .map(|e| e["pem"].as_str().expect("pem").to_string())
        .collect()
}

#[test]
fn old_roots_survive_a_restart_during_the_overlap() {
    let (dir, (root_a, _), shared, mut reloader) = reloading_plugin_ca();
    sign_with(&shared.current());
    let path = dir.path().join(PREVIOUS_ROOTS);
    assert!(!path.exists(), "nothing to keep before a replacement");

    let (root_b, _) = write_plugin_cacerts(dir.path());
    assert_eq!(settle(&mut reloader).expect("poll"), Reloaded::Replaced);
    assert_eq!(
        shared.current().trust_bundle(),
        vec![root_b.clone(), root_a.clone()]
    );
    let mode = std::fs::metadata(&path)
        .expect("written")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644, "public certificates only");
    assert!(!dir.path().join("previous-roots.json.tmp").exists());

    // A restart: a new CA from the same directory still trusts A, and signs with B.
    let restarted = Ca::load_or_create(dir.path()).expect("restart");
    assert_eq!(
        restarted.trust_bundle(),
        vec![root_b.clone(), root_a.clone()]
    );
    let chain = sign_with(&restarted);
    assert_eq!(
        split_pem_certs(chain.last().expect("bundle")),
        vec![root_b.clone(), root_a.clone()]
    );
    // Kept until the certificates A signed expire (24 h), rounded up to the second.
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
    let until = file["roots"][0]["keep_until"].as_u64().expect("keep_until");
    let ttl = DEFAULT_WORKLOAD_TTL.as_secs();
    assert!(
        until > now() + ttl - 3600 && until <= now() + ttl + 1,
        "{until}"
    );

    // A further replacement after the restart keeps A and adds B.
    let shared = SharedCa::new(restarted);
    let mut reloader = Reloader::new(shared.clone());
    let (root_c, _) = write_plugin_cacerts(dir.path());
    assert_eq!(settle(&mut reloader).expect("poll"), Reloaded::Replaced);
    assert_eq!(
        Ca::load_or_create(dir.path())
            .expect("restart")
            .trust_bundle(),
        vec![root_c, root_b, root_a]
    );
}

#[test]
fn expired_previous_roots_are_dropped_at_start_and_when_they_expire() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root_a, _) = write_plugin_cacerts(dir.path());
    let other = tempfile::tempdir().expect("tempdir");
    let (old_1, _) = write_plugin_cacerts(other.path());
    let (old_2, _) = write_plugin_cacerts(other.path());
    let (old_3, _) = write_plugin_cacerts(other.path());
    let path = dir.path().join(PREVIOUS_ROOTS);
    let t = now();
    std::fs::write(
        &path,
        previous_roots_json(&[
            (&old_1, t - 10),
            (&old_2, t + 3600),
            (&old_3, t + 7200),
            // The current root: not a previous one.
            (&root_a, t + 3600),
        ]),
    )
    .expect("write");

    let ca = Ca::load_or_create(dir.path()).expect("start");
    assert_eq!(
        ca.trust_bundle(),
        vec![root_a.clone(), old_2.clone(), old_3.clone()]
    );
    assert_eq!(
        previous_root_pems(&path),
        vec![old_2.clone(), old_3.clone()]
    );

    // When old_2's time comes, the reloader rewrites the file without it.
    let shared = SharedCa::new(ca);
    let mut reloader = Reloader::new(shared);
    let when = std::time::UNIX_EPOCH + Duration::from_secs(t + 3601);
    reloader.prune_expired_roots_at(when);
    assert_eq!(previous_root_pems(&path), vec![old_3.clone()]);
    reloader.prune_expired_roots_at(std::time::UNIX_EPOCH + Duration::from_secs(t + 7201));
    assert!(!path.exists(), "no previous root left: no file");
}

#[test]
fn a_malformed_previous_roots_file_is_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root_a, _) = write_plugin_cacerts(dir.path());
    let other = tempfile::tempdir().expect("tempdir");
    let (old, _) = write_plugin_cacerts(other.path());
    let path = dir.path().join(PREVIOUS_ROOTS);
    let t = now();
    for bad in [
        "not json".to_string(),
        "{}".to_string(),
        r#"{"roots": [{"pem": "x"}]}"#.to_string(),
        r#"{"roots": [{"pem": 1, "keep_until": 1}]}"#.to_string(),
        format!(r#"{{"roots": [{{"pem": "x", "keep_until": {}}}]}}"#, t + 60),
        previous_roots_json(&[(&old[..40], t + 60)]),
        previous_roots_json(&[(&old, u64::MAX)]),
    ] {
        std::fs::write(&path, &bad).expect("write");
        let ca =
            Ca::load_or_create(dir.path()).expect("a bad previous-roots.json never stops the CA");
        assert_eq!(ca.trust_bundle(), vec![root_a.clone()], "{bad}");
    }
    std::fs::write(&path, b"\xff\xfe{").expect("write");
    let ca = Ca::load_or_create(dir.path()).expect("not UTF-8");
    assert_eq!(ca.trust_bundle(), vec![root_a.clone()]);
    // A good entry beside a bad one is kept.
    std::fs::write(
        &path,
        format!(
            r#"{{"roots": [{{"pem": "junk", "keep_until": {}}}, {{"pem": {}, "keep_until": {}}}]}}"#,
            t + 60,
            serde_json::Value::from(old.clone()),
            t + 60
        ),
    )
    .expect("write");
    let ca = Ca::load_or_create(dir.path()).expect("start");
    assert_eq!(ca.trust_bundle(), vec![root_a.clone(), old.clone()]);
    // Far beyond any certificate's lifetime: kept, but only up to the longest lifetime.
    std::fs::write(
        &path,
        previous_roots_json(&[(&old, t + 10 * MAX_WORKLOAD_TTL.as_secs())]),
    )
    .expect("write");
    let ca = Ca::load_or_create(dir.path()).expect("start");
    assert_eq!(ca.trust_bundle(), vec![root_a, old]);
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
    let until = file["roots"][0]["keep_until"].as_u64().expect("keep_until");
    assert!(until <= now() + MAX_WORKLOAD_TTL.as_secs() + 1, "{until}");
}

/// A CA that signed certificates, then was restarted and replaced before signing again: its
/// root stays in the bundle for the certificates signed before the restart.
#[test]
fn a_restart_remembers_what_the_signing_ca_issued() {
    let (dir, (root_a, _), shared, _) = reloading_plugin_ca();
    sign_with(&shared.current());
    let record = dir.path().join(ISSUED_UNTIL);
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&record).expect("recorded")).expect("json");
    let until = file["until"].as_u64().expect("until");
    let ttl = DEFAULT_WORKLOAD_TTL.as_secs();
    assert!(
        until.is_multiple_of(3600),
        "rounded up to the hour: {until}"
    );
    assert!(
        until >= now() + ttl && until <= now() + ttl + 3600,
        "{until}"
    );
    let mode = std::fs::metadata(&record)
        .expect("record")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644, "a public certificate only");
    // More certificates within the same hour do not rewrite the file.
    let before = std::fs::metadata(&record)
        .expect("record")
        .modified()
        .expect("mtime");
    std::thread::sleep(Duration::from_millis(20));
    sign_with(&shared.current());
    let after = std::fs::metadata(&record)
        .expect("record")
        .modified()
        .expect("mtime");
    assert_eq!(before, after, "rewritten within the hour");

    // Restart, then the cacerts are replaced before the restarted CA signs anything.
    drop(shared);
    let shared = SharedCa::new(Ca::load_or_create(dir.path()).expect("restart"));
    let mut reloader = Reloader::new(shared.clone());
    let (root_b, _) = write_plugin_cacerts(dir.path());
    assert_eq!(settle(&mut reloader).expect("poll"), Reloaded::Replaced);
    assert_eq!(shared.current().trust_bundle(), vec![root_b, root_a]);
}

/// Another CA's record, or a malformed one, is ignored: the CA starts and a replacement keeps
/// the old root only for what it signs from then on.
#[test]
fn a_foreign_or_malformed_issued_until_record_is_ignored() {
    let other = tempfile::tempdir().expect("tempdir");
    let (_, int_other) = write_plugin_cacerts(other.path());
    for text in [
        format!(r#"{{"ca_cert": {:?}, "until": 99999999999}}"#, int_other),
        "{not json".to_string(),
        r#"{"ca_cert": "no pem", "until": 1}"#.to_string(),
        r#"{"until": 1}"#.to_string(),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (root_a, _) = write_plugin_cacerts(dir.path());
        std::fs::write(dir.path().join(ISSUED_UNTIL), &text).expect("write");
        let shared = SharedCa::new(Ca::load_or_create(dir.path()).expect("starts"));
        let mut reloader = Reloader::new(shared.clone());
        let (root_b, _) = write_plugin_cacerts(dir.path());
        assert_eq!(settle(&mut reloader).expect("poll"), Reloaded::Replaced);
        assert_eq!(
            shared.current().trust_bundle(),
            vec![root_b],
            "{text}: nothing signed, nothing to keep"
        );
        assert!(!root_a.is_empty());
    }
}
