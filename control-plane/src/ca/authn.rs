//! Who is calling on the secure gRPC port: a client certificate issued by this CA (its SPIFFE
//! identity), else a bearer token (`authorization: Bearer <JWT>`) signed by the issuer key. One
//! check for the CA (`CreateCertificate`) and for ADS streams, as istiod runs the same
//! authenticators for both.

use std::sync::Arc;

use http::HeaderMap;
use rustls::pki_types::CertificateDer;
use tonic::Status;

use super::{Identity, TokenIssuer, identity_from_cert};

/// Authenticates callers of the secure port.
#[derive(Clone)]
pub struct Authenticator {
    tokens: Arc<TokenIssuer>,
    trust_domain: String,
    audience: String,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("trust_domain", &self.trust_domain)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    pub fn new(tokens: Arc<TokenIssuer>, trust_domain: &str, audience: &str) -> Self {
        Authenticator {
            tokens,
            trust_domain: trust_domain.to_string(),
            audience: audience.to_string(),
        }
    }

    /// The caller's identity from its verified client certificate chain (leaf first; the TLS
    /// handshake already checked it against this CA's roots) or its `authorization` header.
    /// `UNAUTHENTICATED` without either or with a bad one; `PERMISSION_DENIED` for a
    /// certificate of another trust domain.
    pub fn authenticate(
        &self,
        headers: &HeaderMap,
        peer_certs: Option<&[CertificateDer<'static>]>,
    ) -> Result<Identity, Status> {
        if let Some(leaf) = peer_certs.and_then(|c| c.first()) {
            let id = identity_from_cert(leaf.as_ref())
                .map_err(|e| Status::unauthenticated(format!("client certificate: {e}")))?;
            if id.trust_domain != self.trust_domain {
                return Err(Status::permission_denied(format!(
                    "client certificate identity {id} is outside trust domain {}",
                    self.trust_domain
                )));
            }
            return Ok(id);
        }
        let Some(auth) = headers.get("authorization") else {
            return Err(Status::unauthenticated(
                "no credentials: send `authorization: Bearer <token>` or a client certificate issued by this CA",
            ));
        };
        let auth = auth
            .to_str()
            .map_err(|_| Status::unauthenticated("authorization header is not ASCII"))?;
        let token = auth
            .strip_prefix("Bearer ")
            .or_else(|| auth.strip_prefix("bearer "))
            .ok_or_else(|| Status::unauthenticated("authorization header is not `Bearer <token>`"))?
            .trim();
        let (ns, sa) = self
            .tokens
            .verify(token, &self.audience)
            .map_err(|e| Status::unauthenticated(format!("token rejected: {e}")))?;
        Ok(Identity::new(&self.trust_domain, &ns, &sa))
    }
}

/// The verified client certificate chain of a request on the secure port, from the connection
/// info tonic puts in its extensions (a TLS connection around a [`Watched`] one).
///
/// [`Watched`]: proto::listen::idle::Watched
pub fn peer_certs(ext: &http::Extensions) -> Option<Arc<Vec<CertificateDer<'static>>>> {
    ext.get::<tonic::transport::server::TlsConnectInfo<proto::listen::idle::Streams>>()
        .and_then(|i| i.peer_certs())
}
