//! The connector to istiod, from the upstream sub-config: every connection dials the targets of
//! the discovery address in failover order (several IPs for one name, or a comma-separated
//! list), with the TLS policy the CA client uses, the `PROV_CERT` identity read for each
//! connection and the bearer token for each stream.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use sds::Failover;

use super::{Connect, Knock, Probe, TokenFn, Upstream};
use crate::config::XdsUpstream;

/// Why the connector to istiod could not be built, or one connection not opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The discovery address does not parse (the reason names the bad entry).
    #[error("discoveryAddress: {0}")]
    Address(String),
    #[error(transparent)]
    Channel(#[from] sds::Error),
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
}

/// The proxy's [`Upstream`] for `config`. A new connection is only asked for after the previous
/// one was lost, closed or could not open a stream, so each one starts past the target the
/// previous one used: a dead or stalled istiod is tried last, and the others first.
/// The address was validated when the config was loaded; an error here names it again.
pub fn upstream(config: &XdsUpstream) -> Result<Upstream, ConnectError> {
    let failover = Failover::new(&config.address, config.plaintext)
        .map_err(|e| ConnectError::Address(e.to_string()))?;
    let mut inputs = sds::ChannelInputs::new(
        config.address.clone(),
        config.root.clone(),
        config.server_name.clone(),
    );
    inputs.plaintext = config.plaintext;
    inputs.keepalive = Some(config.keepalive);
    inputs.compliance = config.compliance;
    // A target that accepts TCP but never completes the handshake (a stopped istiod) is left
    // after the keepalive timeout, as a stalled connection would be.
    let per_target = config.keepalive.1;
    let prov_cert = config.prov_cert.clone();
    let in_use: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
    // The target of the latest connection (kept for the probe of a lost one).
    let last: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
    let last_set = last.clone();
    let connect: Connect = Arc::new(move || {
        let mut inputs = inputs.clone();
        inputs.client_identity = prov_cert.as_ref().and_then(sds::prov_cert_identity);
        let failover = failover.clone();
        let in_use = in_use.clone();
        let last = last_set.clone();
        Box::pin(async move {
            let previous = in_use
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if let Some(previous) = previous {
                failover.failed(previous);
            }
            let (channel, addr) = sds::connect_failover(&inputs, &failover, per_target).await?;
            *in_use
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(addr);
            *last
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(addr);
            Ok(channel)
        })
    });
    let last_knock = last.clone();
    let probe: Probe = Arc::new(move || {
        let addr = *last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Box::pin(async move { Some(probe(addr?).await) })
    });
    let knock: Knock = Arc::new(move || {
        let addr = *last_knock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Box::pin(async move { knock(addr?).await })
    });
    Ok(Upstream {
        connect,
        metadata: config.metadata.clone(),
        token: token(config),
        probe: Some(probe),
        knock: Some(knock),
    })
}

/// The bearer token for each stream, by the CA client's rule: none on a plaintext connection
/// (`:15010`, `controlPlaneAuthPolicy: NONE`) unless `CA_ALLOW_PLAINTEXT_TOKEN=true`, since
/// anyone on the path could read it there and replay it at istiod's TLS ports.
fn token(config: &XdsUpstream) -> TokenFn {
    let token_path = config.token_path.clone();
    if !config.plaintext || config.allow_plaintext_token {
        return Arc::new(move || sds::read_token(&token_path));
    }
    let warned = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let address = config.address.clone();
    Arc::new(move || {
        if sds::read_token(&token_path).is_some()
            && !warned.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(address = %address, token = %token_path.display(),
                "not sending the token to istiod over plaintext xDS \
                 (set CA_ALLOW_PLAINTEXT_TOKEN=true to send it anyway)");
        }
        None
    })
}

/// How long the probe of a lost connection's address waits for TCP.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(250);

/// How long after the loss the probe connects: a process being killed closes its connections
/// before its listener, so a connect at once can still be accepted by a dying istiod.
const PROBE_DELAY: std::time::Duration = std::time::Duration::from_millis(100);

/// What a TCP connect to `addr` says about the istiod there (see [`Probe`]).
async fn probe(addr: SocketAddr) -> &'static str {
    tokio::time::sleep(PROBE_DELAY).await;
    match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(_)) => "stalled",
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => "dead",
        _ => "unreachable",
    }
}

/// How long a knock waits for TCP (on loopback or a pod network a refusal takes microseconds).
const KNOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(100);

/// Whether `addr` accepts a TCP connection now (see [`Knock`]); the connection is dropped at
/// once, before any TLS.
async fn knock(addr: SocketAddr) -> Option<bool> {
    match tokio::time::timeout(KNOCK_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(_)) => Some(true),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{knock, probe};

    #[test]
    fn no_token_over_plaintext_unless_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let token_path = dir.path().join("istio-token");
        std::fs::write(&token_path, "tok").unwrap();
        let config = |plaintext, allow| crate::config::XdsUpstream {
            address: "istiod.istio-system.svc:15010".into(),
            plaintext,
            root: sds::RootSource::System,
            server_name: "istiod.istio-system.svc".into(),
            prov_cert: None,
            metadata: vec![],
            token_path: token_path.clone(),
            allow_plaintext_token: allow,
            reconnect: true,
            keepalive: sds::DEFAULT_KEEPALIVE,
            multi_stream: false,
            prefetch: false,
            compliance: sds::Compliance::None,
            proxy_config_xds: false,
            wasm: None,
        };
        let token = |plaintext, allow| (super::token(&config(plaintext, allow)))();
        assert_eq!(token(true, false), None, "plaintext: withheld");
        assert_eq!(
            token(true, true),
            Some("tok".into()),
            "CA_ALLOW_PLAINTEXT_TOKEN"
        );
        assert_eq!(token(false, false), Some("tok".into()), "TLS");
    }

    #[tokio::test]
    async fn probe_tells_a_dead_istiod_from_a_stalled_one() {
        // Listening but never serving: the stalled one.
        let stalled = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(probe(stalled.local_addr().unwrap()).await, "stalled");
        let addr = stalled.local_addr().unwrap();
        drop(stalled);
        assert_eq!(probe(addr).await, "dead");
    }

    #[tokio::test]
    async fn knock_tells_a_listening_address_from_a_closed_one() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert_eq!(knock(addr).await, Some(true));
        drop(listener);
        assert_eq!(knock(addr).await, Some(false));
    }

    /// The upstream connection dials under `COMPLIANCE_POLICY`: a server offering only X25519
    /// in TLS 1.3 is reached with no policy and refused under `pqc` (X25519MLKEM768 only) and
    /// `fips-140-2` (TLS 1.2 only).
    #[tokio::test]
    async fn the_compliance_policy_reaches_the_upstream_connection() {
        use std::sync::Arc;
        let name = "istiod.istio-system.svc";
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let mut provider = rustls::crypto::aws_lc_rs::default_provider();
        provider.kx_groups = vec![rustls::crypto::aws_lc_rs::kx_group::X25519];
        let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        tls.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = hyper::service::service_fn(|_req| async {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            http_body_util::Empty::<bytes::Bytes>::new(),
                        ))
                    });
                    let _ = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                    .await;
                });
            }
        });
        for (policy, connects) in [
            (sds::Compliance::None, true),
            (sds::Compliance::Pqc, false),
            (sds::Compliance::Fips1402, false),
        ] {
            let config = crate::config::XdsUpstream {
                address: addr.to_string(),
                plaintext: false,
                root: sds::RootSource::Pem(cert.pem().into_bytes()),
                server_name: name.into(),
                prov_cert: None,
                metadata: vec![],
                token_path: "/nonexistent/token".into(),
                allow_plaintext_token: false,
                reconnect: true,
                keepalive: (
                    std::time::Duration::from_secs(30),
                    std::time::Duration::from_secs(5),
                ),
                multi_stream: false,
                prefetch: false,
                compliance: policy,
                proxy_config_xds: false,
                wasm: None,
            };
            let up = super::upstream(&config).unwrap();
            let result = (up.connect)().await;
            assert_eq!(result.is_ok(), connects, "{policy:?}: {:?}", result.err());
        }
    }
}
