//! Client of Istio's `IstioCertificateService/CreateCertificate`.

use std::sync::Arc;

use crate::{Config, Error, Metrics};

/// Signs CSRs at the Istio CA.
#[derive(Clone)]
pub struct CaClient {
    #[allow(dead_code)]
    config: Arc<Config>,
    #[allow(dead_code)]
    metrics: Arc<Metrics>,
}

impl CaClient {
    pub fn new(config: Arc<Config>, metrics: Arc<Metrics>) -> Result<CaClient, Error> {
        Ok(CaClient { config, metrics })
    }

    /// Sends `csr_pem`; returns the certificate chain, leaf first, root last.
    pub async fn sign(&self, _csr_pem: &[u8]) -> Result<Vec<String>, Error> {
        Err(Error::Server("CA client not implemented yet".into()))
    }
}
