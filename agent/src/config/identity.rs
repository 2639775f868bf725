//! The identity sub-config ([`sds::Config`]): Istio's CA, key and certificate variables over
//! [`sds::Config::defaults`] (the one place the defaults live). The CA address defaults to the
//! discovery address when `CA_ADDR` is unset, and only then is `ISTIOD_SAN` its ServerName, as
//! Istio's agent does.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sds::ALLOW_PLAINTEXT_TOKEN_ENV;
use sds::RootSource;
use sds::{CertDir, KeyAlgorithm, LOCALHOST_SERVER_NAME, ROOT_CERT_FILE, paths};

use super::{Error, ca_provider::CaProvider, env::Env, resolve};

/// What the identity settings depend on besides the environment.
pub struct Inputs<'a> {
    pub env: Env<'a>,
    pub base_dir: &'a Path,
    /// ProxyConfig `discoveryAddress`: the CA address when `CA_ADDR` is unset.
    pub discovery_address: &'a str,
    pub namespace: &'a str,
    pub service_account: &'a str,
    pub cluster_id: &'a str,
    /// `PROV_CERT`, resolved (shared with the xDS upstream: one policy for both).
    pub prov_cert: Option<&'a CertDir>,
    /// `ISTIOD_SAN`: the CA's ServerName when `CA_ADDR` is unset (the CA is then the
    /// discovery address).
    pub istiod_san: Option<&'a str>,
    /// The configured workload socket: the SDS server's until an external server is found
    /// there at bind.
    pub socket: &'a WorkloadSocket,
    /// `FILE_MOUNTED_CERTS`: no CA; certificates from `./etc/certs`.
    pub file_mounted_certs: bool,
    /// `CA_PROVIDER`, settled: GKE's files, or the provider a CA client needs.
    pub ca_provider: &'a CaProvider,
    /// `COMPLIANCE_POLICY`, parsed once for every connection to istiod.
    pub compliance: sds::Compliance,
    /// `GRPC_KEEPALIVE_*` (interval, timeout) as a gRPC client uses them.
    pub grpc_keepalive: (Duration, Duration),
}

/// The workload identity sockets as configured. Which one the agent's SDS server listens on
/// depends on who already serves them, a runtime fact settled when the agent binds
/// (the top-level `identity` module), never while the configuration loads.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WorkloadSocket {
    /// `./var/run/secrets/workload-spiffe-uds/<WORKLOAD_IDENTITY_SOCKET_FILE>`: the socket
    /// Envoy's `sds-grpc` cluster reads `default` and `ROOTCA` from.
    pub configured: PathBuf,
    /// `WORKLOAD_IDENTITY_SOCKET_FILE` (`socket`): `configured`'s file name.
    pub file: String,
    /// `./var/run/secrets/credential-uds/files-socket`: where the agent's SDS server listens,
    /// serving file certificates only, when an external server owns `configured`.
    pub files: PathBuf,
    /// `./var/run/secrets/credential-uds/socket`: a live server there serves `sds://`
    /// credential names (node metadata `credential`).
    pub credential: PathBuf,
}

impl WorkloadSocket {
    /// The sockets under `WORKLOAD_IDENTITY_SOCKET_FILE` (a bare file name), resolved against
    /// `base_dir`; nothing on disk is looked at.
    pub fn new(base_dir: &Path, socket_file: &str) -> WorkloadSocket {
        let dir = resolve(base_dir, &format!("./{}", paths::WORKLOAD_SPIFFE_UDS));
        WorkloadSocket {
            configured: dir.join(socket_file),
            file: socket_file.to_string(),
            files: resolve(base_dir, &format!("./{}", paths::FILE_CREDENTIAL_SOCKET)),
            credential: resolve(base_dir, &format!("./{}", paths::CREDENTIAL_SOCKET)),
        }
    }

    /// Istio's default file name: the agent's own SDS server may serve it. Another name must be
    /// served by an external server.
    pub fn is_default(&self) -> bool {
        self.file == sds::DEFAULT_SOCKET_FILE
    }
}

/// Istio's TLS ServerName for istiod (CA and xDS alike): `ISTIOD_SAN` when set, else the host of
/// `addr`, and `istiod.istio-system.svc` for a host containing `localhost` (port-forwarding).
/// For a comma-separated list of addresses (not Istio), the first one's host: every istiod of
/// the list serves a certificate for the same name.
pub fn istiod_server_name(addr: &str, istiod_san: Option<&str>) -> String {
    if let Some(san) = istiod_san {
        return san.to_string();
    }
    let addr = first_entry(addr);
    let no_scheme = addr.split_once("://").map(|(_, r)| r).unwrap_or(addr);
    let host = if let Some(rest) = no_scheme.strip_prefix('[') {
        rest.split(']').next().unwrap_or(rest)
    } else {
        match no_scheme.rsplit_once(':') {
            Some((h, _)) => h,
            None => no_scheme,
        }
    };
    if host.contains("localhost") {
        LOCALHOST_SERVER_NAME.to_string()
    } else {
        host.to_string()
    }
}

/// Istio's plaintext port: no TLS to a `CA_ADDR` or `discoveryAddress` ending in `:15010` (for a
/// list, its first address: one policy for all).
pub fn is_plaintext_addr(addr: &str) -> bool {
    first_entry(addr).ends_with(":15010")
}

/// The first address of a comma-separated list (Istio's single address as it is).
fn first_entry(addr: &str) -> &str {
    sds::address_entries(addr).first().copied().unwrap_or(addr)
}

/// `WORKLOAD_RSA_KEY_SIZE`'s default (Istio's).
const DEFAULT_RSA_BITS: u32 = 2048;

fn non_empty_file(p: &Path) -> bool {
    std::fs::metadata(p).map(|m| m.len() > 0).unwrap_or(false)
}

/// Builds the identity config from Istio's variables, starting from [`sds::Config::defaults`].
pub fn load(i: Inputs<'_>) -> Result<sds::Config, Error> {
    let env = i.env;
    let d = sds::Config::defaults(i.base_dir);

    // `ISTIOD_SAN` names the CA only when the CA is the discovery address (as Istio's agent):
    // an explicit `CA_ADDR` is verified by its own host name.
    let (ca_addr, ca_san) = match env.get("CA_ADDR") {
        Some(addr) => (addr.to_string(), None),
        None if !i.discovery_address.is_empty() => (i.discovery_address.to_string(), i.istiod_san),
        None => (d.ca_addr.clone(), i.istiod_san),
    };
    let ca_plaintext = is_plaintext_addr(&ca_addr);

    let ca_root = ca_root(&i, &d, ca_plaintext)?;
    let ca_headers = ca_headers(&env)?;
    let key_algorithm = key_algorithm(&env, &d)?;
    let file_mounted_certs = file_mounted_certs(&i, &d);

    let crl_enabled = env.bool("PILOT_ENABLE_CA_CRL", d.crl_path.is_some())?;
    Ok(sds::Config {
        trust_domain: env.str("TRUST_DOMAIN", &d.trust_domain),
        namespace: i.namespace.to_string(),
        service_account: i.service_account.to_string(),
        ca_server_name: istiod_server_name(&ca_addr, ca_san),
        ca_addr,
        ca_plaintext,
        ca_root,
        prov_cert: i.prov_cert.cloned(),
        cluster_id: i.cluster_id.to_string(),
        ca_headers,
        cert_signer: env.str("ISTIO_META_CERT_SIGNER", &d.cert_signer),
        secret_ttl: env.duration("SECRET_TTL", d.secret_ttl, Duration::from_secs(1))?,
        grace_ratio: env.ratio("SECRET_GRACE_PERIOD_RATIO", d.grace_ratio)?,
        grace_ratio_jitter: env.ratio("SECRET_GRACE_PERIOD_RATIO_JITTER", d.grace_ratio_jitter)?,
        key_algorithm,
        pkcs8_key: env.bool("PKCS8_KEY", d.pkcs8_key)?,
        output_certs: env.get("OUTPUT_CERTS").map(|p| resolve(i.base_dir, p)),
        output_certs_mode: sds::output_certs_mode(env.is_set("KUBERNETES_SERVICE_HOST")),
        socket_path: i.socket.configured.clone(),
        file_mounted_certs,
        file_debounce: env.duration("FILE_DEBOUNCE_DURATION", d.file_debounce, Duration::ZERO)?,
        crl_path: d.crl_path.clone().filter(|_| crl_enabled),
        allow_plaintext_token: env.bool(ALLOW_PLAINTEXT_TOKEN_ENV, d.allow_plaintext_token)?,
        compliance: i.compliance,
        grpc_keepalive: Some(i.grpc_keepalive),
        ..d
    })
}

/// The CA's root: `CA_ROOT_CA` (a file or `SYSTEM`), else what the cert provider implies.
fn ca_root(i: &Inputs<'_>, d: &sds::Config, ca_plaintext: bool) -> Result<RootSource, Error> {
    let env = &i.env;
    let provider = env.get("PILOT_CERT_PROVIDER").unwrap_or("istiod");
    Ok(match env.get("CA_ROOT_CA") {
        Some(v) if v.eq_ignore_ascii_case("SYSTEM") => RootSource::System,
        Some(v) => RootSource::File(resolve(i.base_dir, v)),
        None if provider == "custom" => {
            RootSource::File(i.base_dir.join(paths::ETC_CERTS).join(ROOT_CERT_FILE))
        }
        None if i.prov_cert.is_some() => {
            RootSource::File(i.prov_cert.map(|p| p.root.clone()).unwrap_or_default())
        }
        None if provider == "none" && !ca_plaintext => {
            return Err(env.invalid(
                "PILOT_CERT_PROVIDER",
                provider,
                "a provider with a root CA (istiod, kubernetes, custom) or CA_ROOT_CA set, since CA_ADDR uses TLS",
            ));
        }
        None => d.ca_root.clone(),
    })
}

/// `CA_HEADER_*`: gRPC metadata for the CA's requests, each an ASCII header name and value.
fn ca_headers(env: &Env<'_>) -> Result<Vec<(String, String)>, Error> {
    let ca_headers = env.prefixed("CA_HEADER_");
    for (k, v) in &ca_headers {
        let name_ok = tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(
            k.to_ascii_lowercase().as_bytes(),
        )
        .is_ok();
        let value_ok =
            tonic::metadata::MetadataValue::<tonic::metadata::Ascii>::try_from(v.as_str()).is_ok();
        if !name_ok || !value_ok {
            return Err(env.invalid(
                &format!("CA_HEADER_{k}"),
                v,
                "an ASCII gRPC header name and value",
            ));
        }
    }
    Ok(ca_headers)
}

/// The workload key's algorithm: `ECC_SIGNATURE_ALGORITHM` with `ECC_CURVE`, else RSA of
/// `WORKLOAD_RSA_KEY_SIZE` bits.
fn key_algorithm(env: &Env<'_>, d: &sds::Config) -> Result<KeyAlgorithm, Error> {
    Ok(match env.get("ECC_SIGNATURE_ALGORITHM") {
        None if !env.is_set("WORKLOAD_RSA_KEY_SIZE") => d.key_algorithm,
        // Not a number: Istio's 2048 (warned); a number other than these is refused.
        None => match env.u32("WORKLOAD_RSA_KEY_SIZE", DEFAULT_RSA_BITS)? {
            b @ (2048 | 3072 | 4096) => KeyAlgorithm::Rsa(b),
            _ => {
                return Err(env.invalid(
                    "WORKLOAD_RSA_KEY_SIZE",
                    env.get("WORKLOAD_RSA_KEY_SIZE").unwrap_or_default(),
                    "2048, 3072 or 4096 (below 2048 is insecure)",
                ));
            }
        },
        Some("ECDSA") => match env.get("ECC_CURVE").unwrap_or("P256") {
            "P256" => KeyAlgorithm::EcdsaP256,
            "P384" => KeyAlgorithm::EcdsaP384,
            other => return Err(env.invalid("ECC_CURVE", other, "P256 or P384")),
        },
        Some(other) => {
            return Err(env.invalid("ECC_SIGNATURE_ALGORITHM", other, "ECDSA or empty (RSA)"));
        }
    })
}

/// Certificates from files instead of a CA: the platform's mounted ones, `/etc/certs` when
/// asked, or complete SPIFFE credentials in the workload's credential folder.
fn file_mounted_certs(i: &Inputs<'_>, d: &sds::Config) -> Option<CertDir> {
    let spiffe_creds = CertDir::istio(&i.base_dir.join(paths::WORKLOAD_SPIFFE_CREDENTIALS));
    if let Some(gke) = i.ca_provider.mounted_files() {
        Some(gke.clone())
    } else if i.file_mounted_certs {
        Some(d.etc_certs.clone())
    } else if non_empty_file(&spiffe_creds.cert_chain)
        && non_empty_file(&spiffe_creds.key)
        && non_empty_file(&spiffe_creds.root)
    {
        Some(spiffe_creds)
    } else {
        None
    }
}
