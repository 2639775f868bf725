//! Typed configuration read once from Istio's environment variables.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::Error;
use crate::tls::RootSource;

/// Istio's default CA address when neither `CA_ADDR` nor a discovery address is configured.
pub const DEFAULT_CA_ADDR: &str = "istiod.istio-system.svc:15012";
/// ServerName used when the CA host contains `localhost`.
pub const LOCALHOST_SERVER_NAME: &str = "istiod.istio-system.svc";

/// Relative paths, resolved against [`Config::base_dir`].
pub mod paths {
    pub const TOKEN: &str = "var/run/secrets/tokens/istio-token";
    pub const ISTIO_ROOT: &str = "var/run/secrets/istio/root-cert.pem";
    pub const ETC_CERTS: &str = "etc/certs";
    pub const WORKLOAD_SPIFFE_CREDENTIALS: &str = "var/run/secrets/workload-spiffe-credentials";
    pub const WORKLOAD_SPIFFE_UDS: &str = "var/run/secrets/workload-spiffe-uds";
    pub const CRL: &str = "var/run/secrets/istio/crl/ca-crl.pem";
}

/// File names inside a cert directory (`./etc/certs`, `PROV_CERT`, `OUTPUT_CERTS`, ...).
pub const CERT_CHAIN_FILE: &str = "cert-chain.pem";
pub const KEY_FILE: &str = "key.pem";
pub const ROOT_CERT_FILE: &str = "root-cert.pem";

/// OS CA bundles, first existing wins (`file-root:system`, `CA_ROOT_CA=SYSTEM` falls back to
/// the platform verifier instead).
pub const SYSTEM_ROOT_CANDIDATES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Workload key type (`ECC_SIGNATURE_ALGORITHM`, `ECC_CURVE`, `WORKLOAD_RSA_KEY_SIZE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum KeyAlgorithm {
    /// RSA with this many bits (2048, 3072 or 4096).
    Rsa(u32),
    EcdsaP256,
    EcdsaP384,
}

/// A directory holding `cert-chain.pem`, `key.pem` and `root-cert.pem`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CertDir {
    pub cert_chain: PathBuf,
    pub key: PathBuf,
    pub root: PathBuf,
}

impl CertDir {
    /// The standard Istio file names inside `dir`.
    pub fn istio(dir: &Path) -> CertDir {
        CertDir {
            cert_chain: dir.join(CERT_CHAIN_FILE),
            key: dir.join(KEY_FILE),
            root: dir.join(ROOT_CERT_FILE),
        }
    }
}

/// Everything the identity crate needs, parsed and validated once.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Config {
    /// Directory Istio's relative paths are resolved against (`/` in a pod).
    pub base_dir: PathBuf,
    /// `TRUST_DOMAIN` (cluster.local).
    pub trust_domain: String,
    /// `POD_NAMESPACE`.
    pub namespace: String,
    /// `SERVICE_ACCOUNT`.
    pub service_account: String,
    /// `CA_ADDR` (host:port); the agent may overwrite it with the discovery address.
    pub ca_addr: String,
    /// True when `CA_ADDR` ends in `:15010` (Istio's plaintext port).
    pub ca_plaintext: bool,
    /// Root the CA's serving certificate is verified against (`CA_ROOT_CA` and fallbacks).
    pub ca_root: RootSource,
    /// TLS ServerName for the CA (`ISTIOD_SAN`, else from the CA host).
    pub ca_server_name: String,
    /// `PROV_CERT`: client identity directory for the CA connection (VMs).
    pub prov_cert: Option<CertDir>,
    /// `ISTIO_META_CLUSTER_ID`, sent as the `ClusterID` header.
    pub cluster_id: String,
    /// `CA_HEADER_<K>=<V>`, sent as extra gRPC metadata, sorted by key.
    pub ca_headers: Vec<(String, String)>,
    /// `ISTIO_META_CERT_SIGNER`, sent as CSR body metadata `CertSigner`.
    pub cert_signer: String,
    /// `./var/run/secrets/tokens/istio-token`, re-read on every CA call.
    pub token_path: PathBuf,
    /// `SECRET_TTL` (24h): requested certificate validity.
    pub secret_ttl: Duration,
    /// `SECRET_GRACE_PERIOD_RATIO` (0.5).
    pub grace_ratio: f64,
    /// `SECRET_GRACE_PERIOD_RATIO_JITTER` (0.01).
    pub grace_ratio_jitter: f64,
    /// Workload key type.
    pub key_algorithm: KeyAlgorithm,
    /// `PKCS8_KEY`: `PRIVATE KEY` PEM instead of `RSA PRIVATE KEY`/`EC PRIVATE KEY`.
    pub pkcs8_key: bool,
    /// `OUTPUT_CERTS`: directory the workload key, chain and root are written to on change.
    pub output_certs: Option<PathBuf>,
    /// Mode of the `OUTPUT_CERTS` files: 0644 in Kubernetes (`KUBERNETES_SERVICE_HOST` set: the
    /// pod's other containers, such as a proxyless gRPC app, read them), else 0600 (Istio).
    pub output_certs_mode: u32,
    /// The SDS Unix socket (`./var/run/secrets/workload-spiffe-uds/<WORKLOAD_IDENTITY_SOCKET_FILE>`).
    pub socket_path: PathBuf,
    /// `./etc/certs`: used for `default`/`ROOTCA` when the files are present and non-empty.
    pub etc_certs: CertDir,
    /// When set, `default` and `ROOTCA` come only from these files and the CA is never called
    /// (`FILE_MOUNTED_CERTS=true` uses `./etc/certs`; a complete
    /// `./var/run/secrets/workload-spiffe-credentials/` also selects this mode).
    pub file_mounted_certs: Option<CertDir>,
    /// `FILE_DEBOUNCE_DURATION` (100ms): initial backoff when re-reading changed files.
    pub file_debounce: Duration,
    /// CRL file added to `ROOTCA` when it exists and `PILOT_ENABLE_CA_CRL` is true.
    pub crl_path: Option<PathBuf>,
    /// Maximum backoff between failed CA refreshes (not an Istio variable; 60 s).
    pub max_backoff: Duration,
    /// HTTP/2 keepalive (interval, timeout) on the CA channel; Istio dials with 30s/10s.
    pub grpc_keepalive: Option<(Duration, Duration)>,
}

/// See [`Config::output_certs_mode`].
pub fn output_certs_mode(in_kubernetes: bool) -> u32 {
    if in_kubernetes { 0o644 } else { 0o600 }
}

fn get<'a>(env: &'a HashMap<String, String>, key: &str) -> Option<&'a str> {
    env.get(key).map(|s| s.trim()).filter(|s| !s.is_empty())
}

fn invalid(var: &str, value: &str, expected: &str) -> Error {
    Error::Config {
        var: var.to_string(),
        value: value.to_string(),
        expected: expected.to_string(),
    }
}

fn parse_bool(env: &HashMap<String, String>, var: &str, default: bool) -> Result<bool, Error> {
    match get(env, var) {
        None => Ok(default),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "1" | "t" | "true" => Ok(true),
            "0" | "f" | "false" => Ok(false),
            _ => Err(invalid(var, v, "a boolean (true/false)")),
        },
    }
}

fn parse_ratio(env: &HashMap<String, String>, var: &str, default: f64) -> Result<f64, Error> {
    match get(env, var) {
        None => Ok(default),
        Some(v) => match v.parse::<f64>() {
            Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
            _ => Err(invalid(var, v, "a number between 0 and 1")),
        },
    }
}

fn parse_dur(
    env: &HashMap<String, String>,
    var: &str,
    default: Duration,
) -> Result<Duration, Error> {
    match get(env, var) {
        None => Ok(default),
        Some(v) => parse_duration(v)
            .ok_or_else(|| invalid(var, v, "a Go duration such as 24h, 90m, 10s or 100ms")),
    }
}

/// Parses a Go duration (`24h`, `1h30m`, `10s`, `100ms`, `1.5s`, `0`).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(Duration::ZERO);
    }
    if s.is_empty() || s.starts_with('-') {
        return None;
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return None;
        }
        let num: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += num * unit;
    }
    if !total.is_finite() || total > u64::MAX as f64 / 2.0 {
        return None;
    }
    Some(Duration::from_secs_f64(total))
}

/// `localhost` hosts map to `istiod.istio-system.svc`; otherwise the host part of `addr`.
fn server_name_for(addr: &str) -> String {
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

fn non_empty_file(p: &Path) -> bool {
    std::fs::metadata(p).map(|m| m.len() > 0).unwrap_or(false)
}

impl Config {
    /// Reads Istio's variables from `env`; relative paths resolve against `base_dir`.
    pub fn from_env(env: &HashMap<String, String>, base_dir: &Path) -> Result<Config, Error> {
        let base = |rel: &str| base_dir.join(rel);
        let resolve = |p: &str| {
            let p = Path::new(p);
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                base_dir.join(p)
            }
        };

        let ca_addr = get(env, "CA_ADDR").unwrap_or(DEFAULT_CA_ADDR).to_string();
        let ca_plaintext = ca_addr.ends_with(":15010");
        let prov_cert = get(env, "PROV_CERT").map(|d| CertDir::istio(&resolve(d)));

        let provider = get(env, "PILOT_CERT_PROVIDER").unwrap_or("istiod");
        let ca_root = match get(env, "CA_ROOT_CA") {
            Some(v) if v.eq_ignore_ascii_case("SYSTEM") => RootSource::System,
            Some(v) => RootSource::File(resolve(v)),
            None if provider == "custom" => {
                RootSource::File(base(paths::ETC_CERTS).join(ROOT_CERT_FILE))
            }
            None if prov_cert.is_some() => RootSource::File(
                prov_cert
                    .as_ref()
                    .map(|p| p.root.clone())
                    .unwrap_or_default(),
            ),
            None if provider == "none" && !ca_plaintext => {
                return Err(invalid(
                    "PILOT_CERT_PROVIDER",
                    provider,
                    "a provider with a root CA (istiod, kubernetes, custom) or CA_ROOT_CA set, since CA_ADDR uses TLS",
                ));
            }
            None => RootSource::File(base(paths::ISTIO_ROOT)),
        };
        let ca_server_name = get(env, "ISTIOD_SAN")
            .map(str::to_string)
            .unwrap_or_else(|| server_name_for(&ca_addr));

        let mut ca_headers: Vec<(String, String)> = env
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix("CA_HEADER_")
                    .filter(|h| !h.is_empty())
                    .map(|h| (h.to_string(), v.clone()))
            })
            .collect();
        ca_headers.sort();
        for (k, v) in &ca_headers {
            if tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(
                k.to_ascii_lowercase().as_bytes(),
            )
            .is_err()
                || tonic::metadata::MetadataValue::<tonic::metadata::Ascii>::try_from(v.as_str())
                    .is_err()
            {
                return Err(invalid(
                    &format!("CA_HEADER_{k}"),
                    v,
                    "an ASCII gRPC header name and value",
                ));
            }
        }

        let pkcs8_key = parse_bool(env, "PKCS8_KEY", false)?;
        let key_algorithm = match get(env, "ECC_SIGNATURE_ALGORITHM") {
            None => {
                let bits = match get(env, "WORKLOAD_RSA_KEY_SIZE") {
                    None => 2048,
                    Some(v) => match v.parse::<u32>() {
                        Ok(b @ (2048 | 3072 | 4096)) => b,
                        _ => {
                            return Err(invalid(
                                "WORKLOAD_RSA_KEY_SIZE",
                                v,
                                "2048, 3072 or 4096 (below 2048 is insecure)",
                            ));
                        }
                    },
                };
                KeyAlgorithm::Rsa(bits)
            }
            Some("ECDSA") => match get(env, "ECC_CURVE").unwrap_or("P256") {
                "P256" => KeyAlgorithm::EcdsaP256,
                "P384" => KeyAlgorithm::EcdsaP384,
                other => return Err(invalid("ECC_CURVE", other, "P256 or P384")),
            },
            Some(other) => {
                return Err(invalid(
                    "ECC_SIGNATURE_ALGORITHM",
                    other,
                    "ECDSA or empty (RSA)",
                ));
            }
        };

        let secret_ttl = parse_dur(env, "SECRET_TTL", Duration::from_secs(24 * 3600))?;
        if secret_ttl < Duration::from_secs(1) {
            return Err(invalid(
                "SECRET_TTL",
                get(env, "SECRET_TTL").unwrap_or(""),
                "at least 1s",
            ));
        }

        let output_certs = get(env, "OUTPUT_CERTS").map(resolve);
        let etc_certs = CertDir::istio(&base(paths::ETC_CERTS));
        let spiffe_creds = CertDir::istio(&base(paths::WORKLOAD_SPIFFE_CREDENTIALS));
        let file_mounted_certs = if parse_bool(env, "FILE_MOUNTED_CERTS", false)? {
            Some(etc_certs.clone())
        } else if non_empty_file(&spiffe_creds.cert_chain)
            && non_empty_file(&spiffe_creds.key)
            && non_empty_file(&spiffe_creds.root)
        {
            Some(spiffe_creds)
        } else {
            None
        };

        let socket_file = get(env, "WORKLOAD_IDENTITY_SOCKET_FILE").unwrap_or("socket");
        if socket_file.contains('/') {
            return Err(invalid(
                "WORKLOAD_IDENTITY_SOCKET_FILE",
                socket_file,
                "a file name without '/'",
            ));
        }

        Ok(Config {
            base_dir: base_dir.to_path_buf(),
            trust_domain: get(env, "TRUST_DOMAIN")
                .unwrap_or("cluster.local")
                .to_string(),
            namespace: get(env, "POD_NAMESPACE").unwrap_or("").to_string(),
            service_account: get(env, "SERVICE_ACCOUNT").unwrap_or("").to_string(),
            ca_addr,
            ca_plaintext,
            ca_root,
            ca_server_name,
            prov_cert,
            cluster_id: get(env, "ISTIO_META_CLUSTER_ID").unwrap_or("").to_string(),
            ca_headers,
            cert_signer: get(env, "ISTIO_META_CERT_SIGNER").unwrap_or("").to_string(),
            token_path: base(paths::TOKEN),
            secret_ttl,
            grace_ratio: parse_ratio(env, "SECRET_GRACE_PERIOD_RATIO", 0.5)?,
            grace_ratio_jitter: parse_ratio(env, "SECRET_GRACE_PERIOD_RATIO_JITTER", 0.01)?,
            key_algorithm,
            pkcs8_key,
            output_certs,
            output_certs_mode: output_certs_mode(get(env, "KUBERNETES_SERVICE_HOST").is_some()),
            socket_path: base(paths::WORKLOAD_SPIFFE_UDS).join(socket_file),
            etc_certs,
            file_mounted_certs,
            file_debounce: parse_dur(env, "FILE_DEBOUNCE_DURATION", Duration::from_millis(100))?,
            crl_path: if parse_bool(env, "PILOT_ENABLE_CA_CRL", true)? {
                Some(base(paths::CRL))
            } else {
                None
            },
            max_backoff: Duration::from_secs(60),
            grpc_keepalive: Some(crate::tls::DEFAULT_KEEPALIVE),
        })
    }

    /// `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`.
    pub fn spiffe_id(&self) -> String {
        format!(
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }

    /// Sets the CA address (e.g. to the discovery address when `CA_ADDR` is unset) and derives
    /// the plaintext flag and ServerName as `from_env` does, keeping an `ISTIOD_SAN` override.
    pub fn set_ca_addr(&mut self, addr: &str, istiod_san: Option<&str>) {
        self.ca_addr = addr.to_string();
        self.ca_plaintext = addr.ends_with(":15010");
        self.ca_server_name = istiod_san
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .unwrap_or_else(|| server_name_for(addr));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_match_istio() {
        let c = Config::from_env(&env(&[]), Path::new("/b")).expect("defaults parse");
        assert_eq!(c.trust_domain, "cluster.local");
        assert_eq!(c.secret_ttl, Duration::from_secs(86400));
        assert_eq!(c.grace_ratio, 0.5);
        assert_eq!(c.grace_ratio_jitter, 0.01);
        assert_eq!(c.key_algorithm, KeyAlgorithm::Rsa(2048));
        assert_eq!(
            c.ca_root,
            RootSource::File("/b/var/run/secrets/istio/root-cert.pem".into())
        );
        assert_eq!(c.ca_server_name, "istiod.istio-system.svc");
        assert!(!c.ca_plaintext);
        assert_eq!(
            c.socket_path,
            Path::new("/b/var/run/secrets/workload-spiffe-uds/socket")
        );
        assert_eq!(
            c.token_path,
            Path::new("/b/var/run/secrets/tokens/istio-token")
        );
        assert!(c.file_mounted_certs.is_none());
    }

    #[test]
    fn parses_ca_and_key_settings() {
        let c = Config::from_env(
            &env(&[
                ("CA_ADDR", "localhost:15010"),
                ("CA_HEADER_X-Tenant", "t1"),
                ("ECC_SIGNATURE_ALGORITHM", "ECDSA"),
                ("ECC_CURVE", "P384"),
                ("SECRET_TTL", "1h30m"),
                ("TRUST_DOMAIN", "td"),
                ("POD_NAMESPACE", "ns1"),
                ("SERVICE_ACCOUNT", "sa1"),
                ("CA_ROOT_CA", "SYSTEM"),
            ]),
            Path::new("/b"),
        )
        .expect("parses");
        assert!(c.ca_plaintext);
        assert_eq!(c.ca_server_name, "istiod.istio-system.svc");
        assert_eq!(
            c.ca_headers,
            vec![("X-Tenant".to_string(), "t1".to_string())]
        );
        assert_eq!(c.key_algorithm, KeyAlgorithm::EcdsaP384);
        assert_eq!(c.secret_ttl, Duration::from_secs(5400));
        assert_eq!(c.ca_root, RootSource::System);
        assert_eq!(c.spiffe_id(), "spiffe://td/ns/ns1/sa/sa1");
    }

    #[test]
    fn rejects_bad_values_naming_the_variable() {
        for (k, v) in [
            ("WORKLOAD_RSA_KEY_SIZE", "1024"),
            ("ECC_SIGNATURE_ALGORITHM", "ED25519"),
            ("SECRET_TTL", "soon"),
            ("SECRET_GRACE_PERIOD_RATIO", "2"),
            ("PKCS8_KEY", "maybe"),
        ] {
            let err = Config::from_env(&env(&[(k, v)]), Path::new("/b")).expect_err(k);
            let msg = err.to_string();
            assert!(msg.contains(k) && msg.contains(v), "{msg}");
        }
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("100ms"), Some(Duration::from_millis(100)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2h3m4s"), Some(Duration::from_secs(7384)));
        assert_eq!(parse_duration("10"), None);
        assert_eq!(parse_duration("-1s"), None);
    }

    #[test]
    fn server_name_from_addr() {
        assert_eq!(server_name_for("istiod.foo.svc:15012"), "istiod.foo.svc");
        assert_eq!(server_name_for("[::1]:15012"), "::1");
        assert_eq!(server_name_for("https://ca.example:443"), "ca.example");
    }
}
