//! `CA_PROVIDER`: where the workload certificate comes from, settled as Istio's agent settles it
//! at start. `Citadel` (the default) is Istio's CA protocol to `CA_ADDR`; `GkeWorkloadCertificate`
//! reads GKE's mounted workload certificate files and calls no CA; a `CA_ADDR` under
//! `googleapis.com` selects `GoogleCA`. Open-source Istio's agent registers only `Citadel`, so
//! any other provider is an error when the agent binds, but only when a CA client is needed (no
//! mounted certificates and no external SDS server; settled in the agent's `identity` module).

use std::path::Path;

use sds::CertDir;
use sds::paths;

use super::{Error, env::Env};

/// `CA_PROVIDER`'s default and the one provider with a CA client.
pub const CITADEL: &str = "Citadel";
/// The provider that reads GKE's workload certificate files.
pub const GKE_WORKLOAD_CERTIFICATE: &str = "GkeWorkloadCertificate";
/// The provider Istio's agent picks for a `CA_ADDR` under `googleapis.com`.
pub const GOOGLE_CA: &str = "GoogleCA";

/// GKE's file names in `./var/run/secrets/workload-spiffe-credentials`.
const GKE_CERT_CHAIN: &str = "certificates.pem";
const GKE_KEY: &str = "private_key.pem";
const GKE_ROOT: &str = "ca_certificates.pem";

/// The settled provider.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum CaProvider {
    /// Istio's CA protocol (`CA_ADDR`).
    Citadel,
    /// GKE's mounted files: file-mounted certificates, no CA.
    GkeWorkloadCertificate(CertDir),
    /// A name with no CA client in Istio's open-source agent (`GoogleCA` included).
    Unregistered(String),
}

/// What the provider depends on besides `CA_PROVIDER`.
pub struct Inputs<'a> {
    pub env: Env<'a>,
    pub base_dir: &'a Path,
    /// ProxyConfig `discoveryAddress`: the CA address when `CA_ADDR` is unset.
    pub discovery_address: &'a str,
    /// `PROV_CERT` is set.
    pub prov_cert: bool,
    /// `FILE_MOUNTED_CERTS=true`.
    pub file_mounted_certs: bool,
}

/// Settles `CA_PROVIDER` with Istio's checks: GKE's files must exist and exclude `PROV_CERT`;
/// `PROV_CERT` and `FILE_MOUNTED_CERTS` exclude each other.
pub fn load(i: Inputs<'_>) -> Result<CaProvider, Error> {
    let name = i.env.str("CA_PROVIDER", CITADEL);
    if name == GKE_WORKLOAD_CERTIFICATE {
        return gke(&i);
    }
    if i.prov_cert && i.file_mounted_certs {
        return Err(Error::ProvCertExclusive("FILE_MOUNTED_CERTS"));
    }
    let ca_addr = i.env.get("CA_ADDR").unwrap_or(i.discovery_address);
    Ok(if ca_addr.contains("googleapis.com") {
        CaProvider::Unregistered(GOOGLE_CA.to_string())
    } else if name == CITADEL {
        CaProvider::Citadel
    } else {
        CaProvider::Unregistered(name)
    })
}

fn gke(i: &Inputs<'_>) -> Result<CaProvider, Error> {
    let dir = i.base_dir.join(paths::WORKLOAD_SPIFFE_CREDENTIALS);
    let files = CertDir {
        cert_chain: dir.join(GKE_CERT_CHAIN),
        key: dir.join(GKE_KEY),
        root: dir.join(GKE_ROOT),
    };
    let missing: Vec<String> = [&files.cert_chain, &files.key, &files.root]
        .into_iter()
        .filter(|p| !p.exists())
        .map(|p| p.display().to_string())
        .collect();
    if !missing.is_empty() {
        return Err(Error::GkeWorkloadFiles(missing.join(", ")));
    }
    if i.prov_cert {
        return Err(Error::ProvCertExclusive(
            "FILE_MOUNTED_CERTS of GKE workload cert",
        ));
    }
    Ok(CaProvider::GkeWorkloadCertificate(files))
}

impl CaProvider {
    /// GKE's files, when they are the workload certificate.
    pub fn mounted_files(&self) -> Option<&CertDir> {
        match self {
            CaProvider::GkeWorkloadCertificate(files) => Some(files),
            _ => None,
        }
    }

    /// The provider's name when it has no CA client (only `Citadel` has one).
    pub fn unregistered(&self) -> Option<&str> {
        match self {
            CaProvider::Unregistered(name) => Some(name),
            _ => None,
        }
    }
}
