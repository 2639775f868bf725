//! `istio.v1.auth.IstioCertificateService/CreateCertificate`: authenticate the caller (JWT or
//! mTLS client certificate), sign its CSR for its own identity.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use proto::istio::ca::istio_certificate_service_server::IstioCertificateService;
use proto::istio::ca::{IstioCertificateRequest, IstioCertificateResponse, Roots};
use tonic::{Request, Response, Status};

use super::{Authenticator, DEFAULT_WORKLOAD_TTL, Identity, SharedCa, peer_certs};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    reason: &'static str,
}

/// CSR metrics (Istio's `citadel_server_*` names).
#[derive(Clone)]
pub struct CaMetrics {
    csr: Counter,
    issued: Counter,
    errors: Family<ErrorLabels, Counter>,
}

impl CaMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = CaMetrics {
            csr: Counter::default(),
            issued: Counter::default(),
            errors: Family::default(),
        };
        registry.register("citadel_server_csr_count", "CSRs received", m.csr.clone());
        registry.register(
            "citadel_server_success_cert_issuance_count",
            "Certificates issued",
            m.issued.clone(),
        );
        registry.register(
            "citadel_server_csr_error_count",
            "CSRs refused, by reason (authentication, csr, sign)",
            m.errors.clone(),
        );
        m
    }
}

/// The gRPC CA service.
#[derive(Clone)]
pub struct CaService {
    ca: SharedCa,
    authn: Authenticator,
    metrics: CaMetrics,
}

impl CaService {
    pub fn new(ca: SharedCa, authn: Authenticator, metrics: CaMetrics) -> Self {
        CaService { ca, authn, metrics }
    }

    /// Authenticates the caller: a client certificate issued by this CA, else a bearer token.
    fn authenticate<T>(&self, req: &Request<T>) -> Result<Identity, Status> {
        let certs = peer_certs(req.extensions());
        self.authn.authenticate(
            req.metadata().as_ref(),
            certs.as_deref().map(|c| c.as_slice()),
        )
    }
}

#[tonic::async_trait]
impl IstioCertificateService for CaService {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        self.metrics.csr.inc();
        let identity = match self.authenticate(&request) {
            Ok(id) => id,
            Err(status) => {
                self.metrics
                    .errors
                    .get_or_create(&ErrorLabels {
                        reason: "authentication",
                    })
                    .inc();
                tracing::warn!(error = %status.message(), "CSR refused: authentication");
                return Err(status);
            }
        };
        let req = request.into_inner();
        let ttl = if req.validity_duration > 0 {
            Duration::from_secs(req.validity_duration as u64)
        } else {
            DEFAULT_WORKLOAD_TTL
        };
        // The CA in force now signs, and its trust bundle goes back with the chain.
        let ca = self.ca.current();
        let bundle = ca.trust_bundle();
        let id = identity.clone();
        // Signing with RSA or P-384 CAs takes milliseconds: keep it off the reactor.
        let result = tokio::task::spawn_blocking(move || ca.sign_workload(&req.csr, &id, ttl))
            .await
            .map_err(|e| Status::internal(format!("signer task failed: {e}")))?;
        match result {
            Ok(chain) => {
                self.metrics.issued.inc();
                tracing::info!(identity = %identity, ttl_secs = ttl.as_secs(), "issued certificate");
                Ok(Response::new(IstioCertificateResponse {
                    cert_chain: chain,
                    root_cert: Some(Roots { ca_cert: bundle }),
                }))
            }
            Err(e @ (super::Error::Csr(_) | super::Error::CsrRejected(_))) => {
                self.metrics
                    .errors
                    .get_or_create(&ErrorLabels { reason: "csr" })
                    .inc();
                tracing::warn!(identity = %identity, error = %e, "CSR refused");
                Err(Status::invalid_argument(e.to_string()))
            }
            Err(e) => {
                self.metrics
                    .errors
                    .get_or_create(&ErrorLabels { reason: "sign" })
                    .inc();
                tracing::error!(identity = %identity, error = %e, "signing failed");
                Err(Status::internal(e.to_string()))
            }
        }
    }
}
