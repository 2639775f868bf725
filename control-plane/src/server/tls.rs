//! TLS for the secure gRPC port with material that follows the CA: when plug-in `cacerts` are
//! replaced, the serving certificate is re-issued by the new CA and client certificates are
//! verified against the new trust bundle (new and retained old roots), without a restart and
//! without touching established connections (Istio's istiod re-signs its own certificate the
//! same way).
//!
//! Handshakes run in their own tasks (bounded by [`HANDSHAKE_TIMEOUT`]) so a slow or silent
//! client never holds up the accept loop.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::Stream;
use proto::listen::Capped;
use proto::listen::idle::Watched;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use crate::ca::{Ca, split_pem_certs};
use crate::listen::Acceptor;

/// Longest a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Lifetime of the serving certificate.
pub const SERVING_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// TLS errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Ca(#[from] crate::ca::Error),
    #[error("serving key: {0}")]
    Key(String),
    #[error("client certificate roots: {0}")]
    Roots(String),
}

/// The serving certificate and client-certificate verifier in force.
#[derive(Debug)]
pub struct ServingTls {
    names: Vec<String>,
    cert: RwLock<Arc<CertifiedKey>>,
    verifier: RwLock<Arc<dyn ClientCertVerifier>>,
}

fn certified_key(ca: &Ca, names: &[String]) -> Result<Arc<CertifiedKey>, Error> {
    let issued = ca.issue_serving(names, SERVING_TTL)?;
    let chain: Vec<CertificateDer<'static>> = split_pem_certs(&issued.chain_pem)
        .iter()
        .filter_map(|pem| {
            let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
            Some(CertificateDer::from(p.contents))
        })
        .collect();
    let (_, key_pem) = x509_parser::pem::parse_x509_pem(issued.key_pem.as_bytes())
        .map_err(|e| Error::Key(e.to_string()))?;
    let key = PrivateKeyDer::try_from(key_pem.contents).map_err(|e| Error::Key(e.to_string()))?;
    let signing = rustls::crypto::aws_lc_rs::sign::any_supported_type(&key)
        .map_err(|e| Error::Key(e.to_string()))?;
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

fn client_verifier(ca: &Ca) -> Result<Arc<dyn ClientCertVerifier>, Error> {
    let mut roots = RootCertStore::empty();
    for pem in ca.trust_bundle() {
        let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
            .map_err(|e| Error::Roots(e.to_string()))?;
        roots
            .add(CertificateDer::from(p.contents))
            .map_err(|e| Error::Roots(e.to_string()))?;
    }
    WebPkiClientVerifier::builder(Arc::new(roots))
        .allow_unauthenticated()
        .build()
        .map_err(|e| Error::Roots(e.to_string()))
}

impl ServingTls {
    /// Issues the serving certificate for `names` from `ca`.
    pub fn new(ca: &Ca, names: Vec<String>) -> Result<Arc<ServingTls>, Error> {
        Ok(Arc::new(ServingTls {
            cert: RwLock::new(certified_key(ca, &names)?),
            verifier: RwLock::new(client_verifier(ca)?),
            names,
        }))
    }

    /// Follows a new CA: a serving certificate from it, its trust bundle for client certificates.
    /// On error the current material stays.
    pub fn update(&self, ca: &Ca) -> Result<(), Error> {
        let cert = certified_key(ca, &self.names)?;
        let verifier = client_verifier(ca)?;
        *self.cert.write().unwrap_or_else(|p| p.into_inner()) = cert;
        *self.verifier.write().unwrap_or_else(|p| p.into_inner()) = verifier;
        Ok(())
    }

    fn verifier(&self) -> Arc<dyn ClientCertVerifier> {
        self.verifier
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The rustls configuration (HTTP/2 only) drawing on this material.
    pub fn server_config(self: &Arc<Self>) -> Arc<ServerConfig> {
        let mut cfg = ServerConfig::builder()
            .with_client_cert_verifier(Arc::new(CurrentVerifier(self.clone())))
            .with_cert_resolver(Arc::new(CurrentCert(self.clone())));
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        Arc::new(cfg)
    }
}

#[derive(Debug)]
struct CurrentCert(Arc<ServingTls>);

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.0
                .cert
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

/// Delegates to the verifier in force. Client certificates are optional (a token may be sent
/// instead); no root hints are sent, so clients offer whatever certificate they hold.
#[derive(Debug)]
struct CurrentVerifier(Arc<ServingTls>);

impl ClientCertVerifier for CurrentVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0
            .verifier()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verifier().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verifier().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.verifier().supported_verify_schemes()
    }
}

/// TLS connections for tonic's `serve_with_incoming`: TCP from `acceptor`, each handshake in
/// its own task; failed or timed-out handshakes are dropped (logged at debug). Each connection
/// is [`Watched`] for its streams (serve the services through [`proto::listen::idle::Counted`]).
pub fn incoming(
    mut acceptor: Acceptor,
    config: Arc<ServerConfig>,
    cancel: CancellationToken,
) -> impl Stream<Item = std::io::Result<TlsStream<Watched<Capped<TcpStream>>>>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    let tls = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let tcp = tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tx.closed() => return,
                s = acceptor.accept() => s,
            };
            let (tls, tx) = (tls.clone(), tx.clone());
            tokio::spawn(async move {
                let peer = tcp.get_ref().peer_addr().ok();
                // The stream deadline runs from the accept, over the handshake.
                let tcp = Watched::encrypted(tcp, crate::listen::GRPC_STREAM_LIMITS);
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(peer = ?peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(peer = ?peer, "TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
