//! Real Envoy against our SDS server: a static listener takes `default` and `ROOTCA` from our
//! Unix socket; `/certs` shows the SPIFFE URI SAN; with a 10 s TTL the serial changes without
//! Envoy restarting; a TLS client verifying against our root completes a handshake.
//!
//! The CA is `sds::testing::FakeCa` (an rcgen CA served over TLS by tonic, in process).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use harness::{Envoy, assert_eventually};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use sds::testing::FakeCa;
use sds::{Config, KeyAlgorithm, Metrics, SdsServer, SecretManager};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const SPIFFE: &str = "spiffe://cluster.local/ns/sds-ns/sa/sds-sa";

fn bootstrap(socket: &Path) -> String {
    // One SDS config source: our socket, gRPC v3.
    let source = r#"sds_config:
                resource_api_version: V3
                api_config_source:
                  api_type: GRPC
                  transport_api_version: V3
                  grpc_services:
                  - envoy_grpc: { cluster_name: sds-grpc }"#;
    format!(
        r#"
node: {{ id: "sidecar~127.0.0.1~sds-test.sds-ns~sds-ns.svc.cluster.local", cluster: sds-test }}
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
static_resources:
  clusters:
  - name: sds-grpc
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    load_assignment:
      cluster_name: sds-grpc
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ pipe: {{ path: "{socket}" }} }} }}
  listeners:
  - name: mtls
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          require_client_certificate: false
          common_tls_context:
            tls_certificate_sds_secret_configs:
            - name: default
              {source}
            validation_context_sds_secret_config:
              name: ROOTCA
              {source}
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: mtls
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                direct_response: {{ status: 200, body: {{ inline_string: "hello from envoy" }} }}
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {{ "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }}
"#,
        socket = socket.display(),
    )
}

/// (SPIFFE URIs, serial) of the `default` certificate Envoy reports on `/certs`.
fn envoy_cert(envoy: &Envoy) -> Result<(Vec<String>, String), String> {
    let (code, body) = envoy.admin_get("/certs")?;
    if code != 200 {
        return Err(format!("/certs {code}: {body}"));
    }
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    for c in v["certificates"].as_array().into_iter().flatten() {
        for chain in c["cert_chain"].as_array().into_iter().flatten() {
            let uris: Vec<String> = chain["subject_alt_names"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s["uri"].as_str().map(str::to_string))
                .collect();
            if !uris.is_empty() {
                let serial = chain["serial_number"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                return Ok((uris, serial));
            }
        }
    }
    Err(format!("no certificate with a URI SAN yet: {body}"))
}

fn listener_addr(envoy: &Envoy) -> Result<std::net::SocketAddr, String> {
    let (_, body) = envoy.admin_get("/listeners?format=json")?;
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    for l in v["listener_statuses"].as_array().into_iter().flatten() {
        if l["name"] == "mtls" {
            let sa = &l["local_address"]["socket_address"];
            let port = sa["port_value"].as_u64().unwrap_or(0);
            if port != 0 {
                return format!("127.0.0.1:{port}")
                    .parse()
                    .map_err(|e| format!("{e}"));
            }
        }
    }
    Err(format!("listener not active yet: {body}"))
}

/// Verifies the chain against our root (WebPKI) and the SPIFFE URI instead of a DNS name,
/// as Istio peers do.
#[derive(Debug)]
struct SpiffeVerifier {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
}

impl ServerCertVerifier for SpiffeVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Ok(v) => Ok(v),
            // The chain is valid; the leaf carries a URI SAN, not a DNS name. Check the URI.
            Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                ..
            })) => {
                if end_entity
                    .as_ref()
                    .windows(SPIFFE.len())
                    .any(|w| w == SPIFFE.as_bytes())
                {
                    Ok(ServerCertVerified::assertion())
                } else {
                    Err(rustls::Error::General(
                        "leaf lacks the expected SPIFFE URI".into(),
                    ))
                }
            }
            Err(e) => Err(e),
        }
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(m, c, d)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(m, c, d)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

async fn handshake(addr: std::net::SocketAddr, root_pem: &str) -> Result<String, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for der in sds::testing::parse_certs(root_pem.as_bytes()) {
        roots
            .add(CertificateDer::from(der))
            .map_err(|e| e.to_string())?;
    }
    let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|e| e.to_string())?;
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(SpiffeVerifier { inner }))
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("sds-test.sds-ns.svc").map_err(|e| e.to_string())?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tls.write_all(b"GET / HTTP/1.1\r\nHost: sds-test\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    // Read until the server closes; a close without close_notify after the body is fine.
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match tls.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    if !text.starts_with("HTTP/1.1 200") {
        return Err(format!("unexpected response: {text:?}"));
    }
    Ok(text
        .rsplit("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn envoy_gets_workload_certs_over_sds_and_rotates() {
    let Some(envoy_bin) = harness::envoy_bin() else {
        return;
    };
    let ca = FakeCa::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("var/run/secrets/istio/root-cert.pem");
    std::fs::create_dir_all(root.parent().expect("parent")).expect("mkdir");
    std::fs::write(&root, &ca.tls_root_pem).expect("root");
    let cfg = Arc::new(Config {
        ca_addr: ca.ca_addr(),
        ca_server_name: "istiod.istio-system.svc".into(),
        namespace: "sds-ns".into(),
        service_account: "sds-sa".into(),
        secret_ttl: Duration::from_secs(10),
        key_algorithm: KeyAlgorithm::EcdsaP256,
        ..Config::defaults(dir.path())
    });
    // A CA reached over TLS needs a credential: an opaque token the fake CA accepts.
    std::fs::create_dir_all(cfg.token_path.parent().expect("parent")).expect("mkdir");
    std::fs::write(&cfg.token_path, "tok-sds").expect("token");
    let mut reg = prometheus_client::registry::Registry::default();
    let manager =
        SecretManager::new(cfg.clone(), Arc::new(Metrics::new(&mut reg))).expect("manager");
    manager.warm();
    let server = SdsServer::bind(&cfg.socket_path, manager.clone())
        .await
        .expect("bind SDS");
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(server.run(shutdown.clone()));

    let yaml = bootstrap(&cfg.socket_path);
    let (envoy, first_serial) = tokio::task::spawn_blocking(move || {
        let envoy = Envoy::start(&envoy_bin, None, &yaml);
        let (uris, serial) = assert_eventually(Duration::from_secs(30), || envoy_cert(&envoy));
        assert_eq!(uris, vec![SPIFFE.to_string()]);
        (envoy, serial)
    })
    .await
    .expect("envoy");
    let pid = envoy.child.id();

    let addr = tokio::task::spawn_blocking({
        let envoy_admin = envoy.admin();
        move || {
            assert_eventually(Duration::from_secs(30), || {
                harness::http_get(envoy_admin, "/ready").and_then(|(c, _)| {
                    if c == 200 {
                        Ok(())
                    } else {
                        Err(format!("ready {c}"))
                    }
                })
            })
        }
    });
    addr.await.expect("ready");
    let listen = listener_addr(&envoy).expect("listener address");
    let body = handshake(listen, &ca.signing_root_pem())
        .await
        .expect("TLS handshake verified against our root");
    assert_eq!(body, "hello from envoy");
    let stranger = FakeCa::start();
    let wrong = handshake(listen, &stranger.signing_root_pem()).await;
    assert!(
        wrong.is_err(),
        "a client trusting another root must fail: {wrong:?}"
    );

    // 10 s TTL, rotation at ~5 s: Envoy picks up the new cert over the open SDS stream.
    let envoy = tokio::task::spawn_blocking(move || {
        let second = assert_eventually(Duration::from_secs(30), || {
            let (uris, serial) = envoy_cert(&envoy)?;
            if serial != first_serial {
                Ok((uris, serial))
            } else {
                Err(format!("serial still {serial}"))
            }
        });
        assert_eq!(second.0, vec![SPIFFE.to_string()]);
        envoy
    })
    .await
    .expect("rotation seen by Envoy");
    assert_eq!(envoy.child.id(), pid, "same Envoy process");
    let mut envoy = envoy;
    assert!(envoy.child.try_wait().is_none(), "Envoy still running");
    // And the rotated cert still verifies against our root.
    let body = handshake(listen, &ca.signing_root_pem())
        .await
        .expect("handshake after rotation");
    assert_eq!(body, "hello from envoy");
    assert!(ca.received().len() >= 2, "a second CSR was issued");

    shutdown.cancel();
    drop(envoy);
    served
        .await
        .expect("join")
        .expect("SDS server shut down cleanly");
}
