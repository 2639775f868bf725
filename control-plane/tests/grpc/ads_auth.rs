//! ADS on the secure port is authenticated and authorized as istiod's 15012
//! (`pilot/pkg/xds/auth.go`, `pkg/security`): a stream with no credentials or a bad token ends
//! `UNAUTHENTICATED` before anything is read; a client certificate from another CA fails the TLS
//! handshake (istiod verifies client certificates against the mesh roots when given); an
//! identity whose namespace or service account does not match the node ends
//! `PERMISSION_DENIED` at the first request; a matching token or mesh certificate is served.
//! The plaintext port stays unauthenticated, as istiod's 15010.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use control_plane::{Ca, Claims, Identity as MeshIdentity, TokenIssuer};
use proto::envoy::config::core::v3::Node;
use proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DiscoveryRequest, DiscoveryResponse,
};
use proto::google::protobuf::{Struct, Value, value::Kind};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, IsCa, Issuer, KeyPair,
    PKCS_ECDSA_P256_SHA256, SanType,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Request, Status};

/// A sidecar node in `ns`, its pod's service account `sa` (metadata as Istio's agent sends it).
fn node(ns: &str, sa: &str) -> Node {
    let s = |v: &str| Value {
        kind: Some(Kind::StringValue(v.into())),
    };
    Node {
        id: format!("sidecar~198.18.0.1~a.{ns}~{ns}.svc.cluster.local"),
        metadata: Some(Struct {
            fields: [
                ("NAMESPACE".into(), s(ns)),
                ("SERVICE_ACCOUNT".into(), s(sa)),
            ]
            .into_iter()
            .collect(),
        }),
        ..Default::default()
    }
}

async fn channel(
    addr: SocketAddr,
    root: &str,
    client: Option<Identity>,
) -> Result<Channel, Status> {
    let mut cfg = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(root))
        .domain_name("istiod.istio-system.svc");
    if let Some(id) = client {
        cfg = cfg.identity(id);
    }
    let endpoint = Channel::from_shared(format!("https://{addr}"))
        .expect("uri")
        .tls_config(cfg)
        .expect("tls");
    tokio::time::timeout(Duration::from_secs(10), endpoint.connect())
        .await
        .map_err(|_| Status::deadline_exceeded("TLS connect"))?
        .map_err(|e| Status::unavailable(format!("connect: {e}")))
}

fn with_token<T>(msg: T, token: Option<&str>) -> Request<T> {
    let mut r = Request::new(msg);
    if let Some(t) = token {
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {t}").parse().expect("header"),
        );
    }
    r
}

/// The first SotW answer (CDS) for `node` on `ch`, or the status the stream ended with.
async fn first_cds(
    ch: Channel,
    token: Option<&str>,
    node: Node,
) -> Result<DiscoveryResponse, Status> {
    let request = DiscoveryRequest {
        type_url: proto::type_url::CLUSTER.into(),
        node: Some(node),
        ..Default::default()
    };
    let mut answers = AggregatedDiscoveryServiceClient::new(ch)
        .stream_aggregated_resources(with_token(futures::stream::iter(vec![request]), token))
        .await?
        .into_inner();
    tokio::time::timeout(Duration::from_secs(10), answers.message())
        .await
        .map_err(|_| Status::deadline_exceeded("no answer"))??
        .ok_or_else(|| Status::ok("stream ended without an answer"))
}

/// [`first_cds`] on a Delta stream.
async fn first_delta_cds(ch: Channel, token: Option<&str>, node: Node) -> Result<(), Status> {
    let request = DeltaDiscoveryRequest {
        type_url: proto::type_url::CLUSTER.into(),
        node: Some(node),
        ..Default::default()
    };
    let mut answers = AggregatedDiscoveryServiceClient::new(ch)
        .delta_aggregated_resources(with_token(futures::stream::iter(vec![request]), token))
        .await?
        .into_inner();
    tokio::time::timeout(Duration::from_secs(10), answers.message())
        .await
        .map_err(|_| Status::deadline_exceeded("no answer"))??
        .map(|_| ())
        .ok_or_else(|| Status::ok("stream ended without an answer"))
}

fn refused<T: std::fmt::Debug>(r: Result<T, Status>, code: Code, needle: &str, what: &str) {
    let s = r.expect_err(what);
    assert_eq!(s.code(), code, "{what}: {s:?}");
    assert!(
        s.message().contains(needle),
        "{what}: {needle:?} not in {:?}",
        s.message()
    );
}

/// A client certificate (chain PEM, key PEM) for `uri` signed by the server's CA in `ca_dir`.
fn mesh_cert(ca_dir: &Path, ns: &str, sa: &str) -> Identity {
    let ca = Ca::load_or_create(ca_dir).expect("ca");
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    let csr = params
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem");
    let chain = ca
        .sign_workload(
            &csr,
            &MeshIdentity::new("cluster.local", ns, sa),
            Duration::from_secs(3600),
        )
        .expect("sign");
    Identity::from_pem(chain[..chain.len() - 1].concat(), key.serialize_pem())
}

/// A client certificate with the identity `spiffe://cluster.local/ns/<ns>/sa/<sa>` from a CA
/// the server does not trust.
fn foreign_cert(ns: &str, sa: &str) -> Identity {
    let ca_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("ca");
    let issuer = Issuer::new(ca, &ca_key);
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut leaf = CertificateParams::new(Vec::<String>::new()).expect("params");
    leaf.subject_alt_names = vec![SanType::URI(
        format!("spiffe://cluster.local/ns/{ns}/sa/{sa}")
            .try_into()
            .expect("ia5"),
    )];
    let cert = leaf.signed_by(&key, &issuer).expect("leaf");
    Identity::from_pem(
        format!("{}{}", cert.pem(), ca_cert.pem()),
        key.serialize_pem(),
    )
}

#[tokio::test]
async fn secure_port_ads_is_authenticated_and_authorized_as_istiod() {
    let (config, ca_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (running, cancel) = super::ca_grpc::start(config.path(), ca_dir.path()).await;
    let addr = running.secure_grpc_addr;
    let root = std::fs::read_to_string(ca_dir.path().join("root-cert.pem")).expect("root");
    let issuer = TokenIssuer::load_or_create(ca_dir.path()).expect("issuer");
    let hour = Duration::from_secs(3600);
    let good = issuer.issue("ns", "sa", "istio-ca", hour);
    let ch = || async { channel(addr, &root, None).await.expect("TLS") };

    // Served: the right token, and a mesh certificate of the node's identity.
    let served = first_cds(ch().await, Some(&good), node("ns", "sa")).await;
    assert_eq!(
        served.expect("token served").type_url,
        proto::type_url::CLUSTER
    );
    first_delta_cds(ch().await, Some(&good), node("ns", "sa"))
        .await
        .expect("token served (Delta)");
    let mtls = channel(addr, &root, Some(mesh_cert(ca_dir.path(), "ns", "sa")))
        .await
        .expect("mTLS");
    first_cds(mtls, None, node("ns", "sa"))
        .await
        .expect("mesh certificate served");
    // A node that names no service account: the namespace decides (istiod skips an empty one).
    first_cds(ch().await, Some(&good), node("ns", ""))
        .await
        .expect("no SERVICE_ACCOUNT: namespace checked only");

    // No credentials, on both protocols.
    refused(
        first_cds(ch().await, None, node("ns", "sa")).await,
        Code::Unauthenticated,
        "no credentials",
        "no credentials (SotW)",
    );
    refused(
        first_delta_cds(ch().await, None, node("ns", "sa")).await,
        Code::Unauthenticated,
        "no credentials",
        "no credentials (Delta)",
    );
    // Bad tokens: garbage, another issuer's key, the wrong audience, expired.
    let other_issuer = TokenIssuer::load_or_create(tempfile::tempdir().unwrap().path()).expect("x");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_secs();
    let expired = Claims {
        iss: "istiod-lite".into(),
        sub: "system:serviceaccount:ns:sa".into(),
        aud: vec!["istio-ca".into()],
        exp: now - 3600,
        nbf: now - 7200,
        iat: now - 7200,
    };
    for (token, needle) in [
        ("not-a-jwt".to_string(), "token rejected"),
        (
            other_issuer.issue("ns", "sa", "istio-ca", hour),
            "bad signature",
        ),
        (
            issuer.issue("ns", "sa", "other-audience", hour),
            "wrong audience",
        ),
        (issuer.sign(&expired), "expired"),
    ] {
        refused(
            first_cds(ch().await, Some(&token), node("ns", "sa")).await,
            Code::Unauthenticated,
            needle,
            needle,
        );
    }

    // A certificate from another CA never gets past the handshake (istiod: the same, its TLS
    // config verifies a given client certificate against the mesh roots).
    let foreign = async {
        let ch = channel(addr, &root, Some(foreign_cert("ns", "sa"))).await?;
        first_cds(ch, None, node("ns", "sa")).await
    };
    let s = foreign.await.expect_err("foreign CA refused");
    assert!(
        matches!(s.code(), Code::Unavailable | Code::Unknown | Code::Internal),
        "a transport failure, not an answer: {s:?}"
    );

    // Authenticated, but another namespace or service account than the node's.
    for (token, what) in [
        (
            issuer.issue("other", "sa", "istio-ca", hour),
            "token of another namespace",
        ),
        (
            issuer.issue("ns", "other", "istio-ca", hour),
            "token of another service account",
        ),
    ] {
        refused(
            first_cds(ch().await, Some(&token), node("ns", "sa")).await,
            Code::PermissionDenied,
            "authorization failed",
            what,
        );
    }
    let other_ns = channel(addr, &root, Some(mesh_cert(ca_dir.path(), "other", "sa")))
        .await
        .expect("mTLS");
    refused(
        first_delta_cds(other_ns, None, node("ns", "sa")).await,
        Code::PermissionDenied,
        "spiffe://cluster.local/ns/other/sa/sa",
        "mesh certificate of another namespace",
    );

    // The plaintext port asks for nothing, as istiod's 15010.
    let plain = Channel::from_shared(format!("http://{}", running.grpc_addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    first_cds(plain, None, node("ns", "sa"))
        .await
        .expect("plaintext served without credentials");
    cancel.cancel();
    running.wait().await.expect("stopped on shutdown");
}
