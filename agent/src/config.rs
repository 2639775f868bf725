//! Typed agent configuration: `proxy` flags + the environment (an injectable map) + ProxyConfig
//! layers, parsed and validated once. Errors name the variable or field, its value, and what was
//! expected.

pub mod proxy_config;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use proxy_config::{AuthPolicy, ProxyConfig, StatsMatcher, split_host_port};

use crate::status::probe::{AppProbers, PrometheusAnnotations};

/// Configuration errors. Each names what was wrong and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid {var}={value:?}: expected {expected}")]
    Env {
        var: String,
        value: String,
        expected: String,
    },
    #[error("invalid ProxyConfig field {field}: value {value}, expected {expected}")]
    ProxyConfigField {
        field: String,
        value: String,
        expected: String,
    },
    #[error("cannot parse ProxyConfig from {source_name}: {reason}")]
    Layer { source_name: String, reason: String },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid proxy type {0:?}: expected sidecar or router")]
    NodeType(String),
    #[error("invalid flag --{flag}={value:?}: expected {expected}")]
    Flag {
        flag: String,
        value: String,
        expected: String,
    },
}

/// The proxy's role (`proxy sidecar|router`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeType {
    Sidecar,
    Router,
}

impl NodeType {
    pub fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "sidecar" => Ok(NodeType::Sidecar),
            "router" => Ok(NodeType::Router),
            other => Err(Error::NodeType(other.to_string())),
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            NodeType::Sidecar => "sidecar",
            NodeType::Router => "router",
        }
    }
}

/// Flags of `pilot-agent proxy` (Istio's spelling in comments).
#[derive(Debug, Clone)]
pub struct ProxyFlags {
    /// `--domain`
    pub domain: String,
    /// `--meshConfig`
    pub mesh_config: String,
    /// `--stsPort`
    pub sts_port: u16,
    /// `--serviceCluster`
    pub service_cluster: String,
    /// `--proxyLogLevel`
    pub proxy_log_level: String,
    /// `--proxyComponentLogLevel`
    pub proxy_component_log_level: String,
    /// `--concurrency` (legacy; overrides ProxyConfig when > 0)
    pub concurrency: u32,
    /// `--templateFile`
    pub template_file: String,
    /// `--outlierLogPath`
    pub outlier_log_path: String,
    /// `--log_as_json`
    pub log_as_json: bool,
    /// `--external-envoy` (or `ISTIO_AGENT_EXTERNAL_ENVOY=true`)
    pub external_envoy: bool,
}

impl Default for ProxyFlags {
    fn default() -> Self {
        ProxyFlags {
            domain: String::new(),
            mesh_config: "./etc/istio/config/mesh".into(),
            sts_port: 0,
            service_cluster: "istio-proxy".into(),
            proxy_log_level: "warning".into(),
            proxy_component_log_level: String::new(),
            concurrency: 0,
            template_file: String::new(),
            outlier_log_path: String::new(),
            log_as_json: false,
            external_envoy: false,
        }
    }
}

/// What [`Config::load`] reads: flags, the environment, the directory Istio's relative paths are
/// resolved against, and the host's private interface addresses.
pub struct Inputs<'a> {
    pub node_type: NodeType,
    pub flags: ProxyFlags,
    pub env: &'a HashMap<String, String>,
    pub base_dir: PathBuf,
    pub interface_ips: Vec<IpAddr>,
}

/// The agent's whole configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub base_dir: PathBuf,
    pub node_type: NodeType,
    pub flags: ProxyFlags,
    pub proxy: ProxyConfig,
    /// The environment the agent was started with (node metadata, SDS and DNS read from it).
    pub env: HashMap<String, String>,
    pub pod_name: String,
    pub pod_namespace: String,
    pub service_account: String,
    pub host_ip: String,
    pub ips: Vec<IpAddr>,
    pub dns_domain: String,
    pub cluster_id: String,
    /// `ISTIO_DELTA_XDS` (default true): Envoy uses `DELTA_GRPC`.
    pub delta_xds: bool,
    /// `XDS_HEADER_<K>`: extra gRPC metadata on upstream xDS.
    pub xds_headers: Vec<(String, String)>,
    pub xds_root_ca: String,
    pub pilot_cert_provider: String,
    pub prov_cert: String,
    pub istiod_san: String,
    pub envoy_status_port: u16,
    pub envoy_prometheus_port: u16,
    pub disable_envoy: bool,
    pub exit_on_zero_active_connections: bool,
    pub minimum_drain_duration: Duration,
    /// DNS proxy enabled: (`ISTIO_META_DNS_CAPTURE` and sidecar) or `ISTIO_META_ENABLE_DNS_SERVER`.
    pub dns_enabled: bool,
    pub workload_identity_socket_file: String,
    pub istio_bootstrap: String,
    pub bootstrap_override: String,
    pub skip_deprecated_logs: bool,
    pub enable_core_dump: bool,
    pub dual_stack: bool,
    pub app_probers: AppProbers,
    /// `readinessProbe`: workload health reported to istiod.
    pub health_probe: Option<crate::status::probe::ReadinessProbe>,
    pub prometheus_annotations: Option<PrometheusAnnotations>,
    pub metrics_localhost_only: bool,
    pub merge_envoy_stats: bool,
    pub rewrite_probe_legacy_localhost: bool,
    pub grpc_xds_bootstrap: String,
    pub output_certs: String,
    pub pod_labels: BTreeMap<String, String>,
    pub pod_annotations: BTreeMap<String, String>,
    // bootstrap settings
    /// `ENVOY_SECURE_METRICS_PORT` (0: no mTLS listener for Envoy's own stats).
    pub envoy_secure_metrics_port: u16,
    /// `ENVOY_SECURE_MERGED_METRICS_PORT` (0: no mTLS listener for the merged metrics).
    pub envoy_secure_merged_metrics_port: u16,
    /// `PEER_METADATA_DISCOVERY` when set; unset, metadata discovery follows `ENABLE_HBONE`.
    pub peer_metadata_discovery: Option<bool>,
    /// `COMPLIANCE_POLICY` (`fips-140-2` limits Envoy's Google gRPC clients to TLS 1.2).
    pub compliance_policy: String,
    /// `ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL`: the 15021 listener accepts PROXY protocol.
    pub envoy_status_port_enable_proxy_protocol: bool,
    /// `DNS_PROXY_ADDR`, reported to istiod as node metadata.
    pub dns_proxy_addr: String,
    /// `GCP_METADATA` (`project|number|cluster|zone`): the GCP project a Stackdriver tracer needs.
    pub gcp_metadata: String,
    /// `HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED` (default true; false adds Envoy's
    /// runtime flag of that name as `"false"`).
    pub http_strip_fragment_from_path: bool,
}

/// Go's `strconv.ParseBool`.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go-style durations (`45s`, `1m30s`, `500ms`, `2h`, bare `0`): the same parser as the
/// identity settings use.
pub use sds::config::parse_duration;

struct Env<'a>(&'a HashMap<String, String>);

impl Env<'_> {
    fn str(&self, var: &str, default: &str) -> String {
        self.0
            .get(var)
            .cloned()
            .unwrap_or_else(|| default.to_string())
    }
    fn bool(&self, var: &str, default: bool) -> Result<bool, Error> {
        match self.0.get(var) {
            None => Ok(default),
            Some(v) if v.is_empty() => Ok(default),
            Some(v) => parse_bool(v).ok_or_else(|| Error::Env {
                var: var.into(),
                value: v.clone(),
                expected: "true or false".into(),
            }),
        }
    }
    fn port(&self, var: &str, default: u16) -> Result<u16, Error> {
        match self.0.get(var) {
            None => Ok(default),
            Some(v) if v.is_empty() => Ok(default),
            Some(v) => v.parse::<u16>().map_err(|_| Error::Env {
                var: var.into(),
                value: v.clone(),
                expected: "a port number 0-65535".into(),
            }),
        }
    }
    fn duration(&self, var: &str, default: Duration) -> Result<Duration, Error> {
        match self.0.get(var) {
            None => Ok(default),
            Some(v) if v.is_empty() => Ok(default),
            Some(v) => parse_duration(v).ok_or_else(|| Error::Env {
                var: var.into(),
                value: v.clone(),
                expected: "a duration such as 5s".into(),
            }),
        }
    }
}

/// Reads a downward-API file (`key="quoted value"` per line). A missing file is empty.
pub fn read_downward_api(path: &Path) -> Result<BTreeMap<String, String>, Error> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(source) => {
            return Err(Error::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    Ok(parse_downward_api(&text))
}

/// Parses downward-API text; malformed lines are skipped (as Istio does).
pub fn parse_downward_api(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        if let Some(v) = go_unquote(v.trim()) {
            out.insert(k.trim().to_string(), v);
        }
    }
    out
}

/// Go's `strconv.Unquote` for double-quoted strings (the escapes Kubernetes emits).
pub fn go_unquote(s: &str) -> Option<String> {
    let inner = s.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let e = chars.next()?;
        out.push(go_escape(e, &mut chars)?);
    }
    Some(out)
}

/// One Go string escape after its backslash: `e` is the escape letter and `rest` yields what
/// follows it (the hex digits of `\x`, `\u`, `\U` are taken from it). `None` for an unknown
/// escape or bad hex.
pub(crate) fn go_escape(e: char, rest: &mut impl Iterator<Item = char>) -> Option<char> {
    Some(match e {
        'n' => '\n',
        't' => '\t',
        'r' => '\r',
        '\\' => '\\',
        '"' => '"',
        '\'' => '\'',
        'a' => '\x07',
        'b' => '\x08',
        'f' => '\x0c',
        'v' => '\x0b',
        'x' | 'u' | 'U' => {
            let n = match e {
                'x' => 2,
                'u' => 4,
                _ => 8,
            };
            let hex: String = rest.take(n).collect();
            char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?
        }
        _ => return None,
    })
}

impl Config {
    /// Resolves one of Istio's relative paths (`./etc/...`) against the base directory;
    /// absolute paths stay as they are.
    pub fn path(&self, p: &str) -> PathBuf {
        resolve(&self.base_dir, p)
    }

    /// `<configPath>/XDS`: the xDS proxy's socket.
    pub fn xds_socket(&self) -> PathBuf {
        self.path(&self.proxy.config_path).join("XDS")
    }

    /// `./var/run/secrets/workload-spiffe-uds/<WORKLOAD_IDENTITY_SOCKET_FILE>`: the SDS socket.
    pub fn sds_socket(&self) -> PathBuf {
        self.path("./var/run/secrets/workload-spiffe-uds")
            .join(&self.workload_identity_socket_file)
    }

    /// The service node id `<type>~<ip>~<pod>.<ns>~<domain>`.
    pub fn node_id(&self) -> String {
        let ip = self
            .ips
            .first()
            .map(|i| i.to_string())
            .unwrap_or_else(|| "127.0.0.1".into());
        format!(
            "{}~{}~{}.{}~{}",
            self.node_type.as_str(),
            ip,
            self.pod_name,
            self.pod_namespace,
            self.dns_domain
        )
    }

    /// Envoy's `--concurrency` (0: not passed).
    pub fn concurrency(&self) -> u32 {
        self.proxy.concurrency.unwrap_or(0)
    }

    /// Whether the agent launches Envoy itself.
    pub fn launches_envoy(&self) -> bool {
        !self.disable_envoy && !self.flags.external_envoy
    }

    /// Loads and validates everything; the first invalid value is the error.
    pub fn load(inputs: Inputs<'_>) -> Result<Config, Error> {
        let env = Env(inputs.env);
        let base_dir = inputs.base_dir;
        let mut flags = inputs.flags;
        if env.bool("ISTIO_AGENT_EXTERNAL_ENVOY", false)? {
            flags.external_envoy = true;
        }
        let pod_namespace = env.str("POD_NAMESPACE", "");
        let pod_annotations =
            read_downward_api(&resolve(&base_dir, "./etc/istio/pod/annotations"))?;
        let pod_labels = read_downward_api(&resolve(&base_dir, "./etc/istio/pod/labels"))?;

        // ProxyConfig layers.
        let mut raw = proxy_config::defaults();
        let mesh_path = resolve(&base_dir, &flags.mesh_config);
        match std::fs::read_to_string(&mesh_path) {
            Ok(text) => {
                let mesh = proxy_config::parse_layer(&mesh_path.display().to_string(), &text)?;
                if let Some(dc) = mesh.get("defaultConfig").cloned() {
                    if !dc.is_object() && !dc.is_null() {
                        return Err(Error::Layer {
                            source_name: mesh_path.display().to_string(),
                            reason: "defaultConfig is not a mapping".into(),
                        });
                    }
                    if dc.is_object() {
                        proxy_config::merge(&mut raw, dc);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(Error::Read {
                    path: mesh_path,
                    source,
                });
            }
        }
        if let Some(pc) = inputs.env.get("PROXY_CONFIG") {
            proxy_config::merge(&mut raw, proxy_config::parse_layer("PROXY_CONFIG", pc)?);
        }
        if let Some(pc) = pod_annotations.get("proxy.istio.io/config") {
            proxy_config::merge(
                &mut raw,
                proxy_config::parse_layer("annotation proxy.istio.io/config", pc)?,
            );
        }
        let mut proxy = ProxyConfig::from_value(raw)?;
        if proxy.concurrency.is_none() {
            let cpu = env.str("ISTIO_CPU_LIMIT", "0");
            let cpu: u32 = cpu.trim().parse().map_err(|_| Error::Env {
                var: "ISTIO_CPU_LIMIT".into(),
                value: cpu.clone(),
                expected: "a non-negative integer".into(),
            })?;
            if cpu > 0 {
                proxy.concurrency = Some(cpu);
            }
        }
        if flags.concurrency > 0 {
            proxy.concurrency = Some(flags.concurrency);
        }
        if proxy.service_cluster.is_empty() {
            proxy.service_cluster = flags.service_cluster.clone();
        }
        if let Some(addr) = pod_annotations.get("sidecar.istio.io/discoveryAddress") {
            if split_host_port(addr).is_none() {
                return Err(Error::ProxyConfigField {
                    field: "sidecar.istio.io/discoveryAddress".into(),
                    value: addr.clone(),
                    expected: "host:port".into(),
                });
            }
            proxy.discovery_address = addr.clone();
        }
        if let Some(port) = pod_annotations.get("status.sidecar.istio.io/port") {
            proxy.status_port = port.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                Error::ProxyConfigField {
                    field: "status.sidecar.istio.io/port".into(),
                    value: port.clone(),
                    expected: "a port in 1-65535".into(),
                }
            })?;
        }

        // Proxy IPs: INSTANCE_IP first, then the private interface addresses.
        let mut ips = Vec::new();
        let instance_ip = env.str("INSTANCE_IP", "");
        if let Ok(ip) = instance_ip.parse::<IpAddr>() {
            ips.push(ip);
        }
        for ip in inputs.interface_ips {
            if !ips.contains(&ip) {
                ips.push(ip);
            }
        }
        if ips.is_empty() {
            ips.push(IpAddr::from([127, 0, 0, 1]));
            ips.push("::1".parse().map_err(|_| Error::NodeType("::1".into()))?);
        }

        let dns_domain = if flags.domain.is_empty() {
            format!("{pod_namespace}.svc.cluster.local")
        } else {
            flags.domain.clone()
        };

        let mut xds_headers: Vec<(String, String)> = inputs
            .env
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix("XDS_HEADER_")
                    .filter(|h| !h.is_empty())
                    .map(|h| (h.to_string(), v.clone()))
            })
            .collect();
        xds_headers.sort();

        let dns_capture = env.bool("ISTIO_META_DNS_CAPTURE", false)?
            || proxy
                .proxy_metadata
                .get("ISTIO_META_DNS_CAPTURE")
                .and_then(|v| parse_bool(v))
                .unwrap_or(false);
        let dns_server = env.bool("ISTIO_META_ENABLE_DNS_SERVER", false)?;
        let dns_enabled = (dns_capture && inputs.node_type == NodeType::Sidecar) || dns_server;

        let workload_identity_socket_file = env.str("WORKLOAD_IDENTITY_SOCKET_FILE", "socket");
        if workload_identity_socket_file.is_empty() || workload_identity_socket_file.contains('/') {
            return Err(Error::Env {
                var: "WORKLOAD_IDENTITY_SOCKET_FILE".into(),
                value: workload_identity_socket_file,
                expected: "a bare file name".into(),
            });
        }

        let app_probers = crate::status::probe::parse_probers(
            inputs
                .env
                .get("ISTIO_KUBE_APP_PROBERS")
                .map(String::as_str)
                .unwrap_or(""),
        )
        .map_err(|reason| Error::Env {
            var: "ISTIO_KUBE_APP_PROBERS".into(),
            value: env.str("ISTIO_KUBE_APP_PROBERS", ""),
            expected: reason,
        })?;
        let prometheus_annotations = match inputs.env.get("ISTIO_PROMETHEUS_ANNOTATIONS") {
            None => None,
            Some(v) => crate::status::probe::parse_prometheus_annotations(v, proxy.status_port)
                .map_err(|reason| Error::Env {
                    var: "ISTIO_PROMETHEUS_ANNOTATIONS".into(),
                    value: v.clone(),
                    expected: reason,
                })?,
        };

        let health_probe = match &proxy.readiness_probe {
            None => None,
            Some(v) => Some(crate::status::probe::parse_readiness_probe(v).map_err(
                |expected| Error::ProxyConfigField {
                    field: "readinessProbe".into(),
                    value: v.to_string(),
                    expected,
                },
            )?),
        };

        Ok(Config {
            health_probe,
            node_type: inputs.node_type,
            pod_name: env.str("POD_NAME", ""),
            service_account: env.str("SERVICE_ACCOUNT", ""),
            host_ip: env.str("HOST_IP", ""),
            cluster_id: env.str("ISTIO_META_CLUSTER_ID", ""),
            delta_xds: env.bool("ISTIO_DELTA_XDS", true)?,
            xds_root_ca: env.str("XDS_ROOT_CA", ""),
            pilot_cert_provider: env.str("PILOT_CERT_PROVIDER", "istiod"),
            prov_cert: env.str("PROV_CERT", ""),
            istiod_san: env.str("ISTIOD_SAN", ""),
            envoy_status_port: env.port("ENVOY_STATUS_PORT", 15021)?,
            envoy_prometheus_port: env.port("ENVOY_PROMETHEUS_PORT", 15090)?,
            disable_envoy: env.bool("DISABLE_ENVOY", false)?,
            exit_on_zero_active_connections: env.bool("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", false)?,
            minimum_drain_duration: env
                .duration("MINIMUM_DRAIN_DURATION", Duration::from_secs(5))?,
            dns_enabled,
            workload_identity_socket_file,
            istio_bootstrap: env.str("ISTIO_BOOTSTRAP", ""),
            bootstrap_override: env.str("ISTIO_BOOTSTRAP_OVERRIDE", ""),
            skip_deprecated_logs: env.bool("ENVOY_SKIP_DEPRECATED_LOGS", true)?,
            enable_core_dump: env.bool("ISTIO_ENVOY_ENABLE_CORE_DUMP", false)?,
            dual_stack: env.bool("ISTIO_DUAL_STACK", false)?,
            app_probers,
            prometheus_annotations,
            metrics_localhost_only: env.bool("METRICS_LOCALHOST_ACCESS_ONLY", false)?,
            merge_envoy_stats: env.bool("PILOT_AGENT_MERGE_ENVOY_STATS", true)?,
            rewrite_probe_legacy_localhost: env
                .bool("REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION", false)?,
            grpc_xds_bootstrap: env.str(
                "GRPC_XDS_BOOTSTRAP",
                "./etc/istio/proxy/grpc-bootstrap.json",
            ),
            output_certs: env.str("OUTPUT_CERTS", ""),
            env: inputs.env.clone(),
            pod_namespace,
            ips,
            dns_domain,
            xds_headers,
            proxy,
            flags,
            base_dir,
            pod_labels,
            pod_annotations,
            // bootstrap settings
            envoy_secure_metrics_port: env.port("ENVOY_SECURE_METRICS_PORT", 0)?,
            envoy_secure_merged_metrics_port: env.port("ENVOY_SECURE_MERGED_METRICS_PORT", 0)?,
            peer_metadata_discovery: match inputs.env.get("PEER_METADATA_DISCOVERY") {
                None => None,
                Some(_) => Some(env.bool("PEER_METADATA_DISCOVERY", false)?),
            },
            compliance_policy: env.str("COMPLIANCE_POLICY", ""),
            envoy_status_port_enable_proxy_protocol: env
                .bool("ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL", false)?,
            dns_proxy_addr: env.str("DNS_PROXY_ADDR", ""),
            gcp_metadata: env.str("GCP_METADATA", ""),
            http_strip_fragment_from_path: env
                .bool("HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED", true)?,
        })
    }
}

/// Resolves `p` against `base` unless it is absolute.
pub fn resolve(base: &Path, p: &str) -> PathBuf {
    let path = Path::new(p);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(p.strip_prefix("./").unwrap_or(p))
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

    fn load(dir: &Path, e: &HashMap<String, String>) -> Result<Config, Error> {
        Config::load(Inputs {
            node_type: NodeType::Sidecar,
            flags: ProxyFlags::default(),
            env: e,
            base_dir: dir.to_path_buf(),
            interface_ips: vec!["198.18.0.9".parse().unwrap()],
        })
    }

    #[test]
    fn injected_env_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let e = env(&[
            ("POD_NAME", "app-1"),
            ("POD_NAMESPACE", "ns1"),
            ("INSTANCE_IP", "198.18.0.2"),
            ("PROXY_CONFIG", "{}"),
            ("ISTIO_CPU_LIMIT", "2"),
            ("XDS_HEADER_X-Foo", "bar"),
        ]);
        let c = load(dir.path(), &e).unwrap();
        assert_eq!(
            c.node_id(),
            "sidecar~198.18.0.2~app-1.ns1~ns1.svc.cluster.local"
        );
        assert_eq!(c.ips.len(), 2);
        assert_eq!(c.concurrency(), 2);
        assert!(c.delta_xds);
        assert_eq!(
            c.xds_headers,
            vec![("X-Foo".to_string(), "bar".to_string())]
        );
        assert_eq!(c.xds_socket(), dir.path().join("etc/istio/proxy/XDS"));
        assert_eq!(
            c.sds_socket(),
            dir.path()
                .join("var/run/secrets/workload-spiffe-uds/socket")
        );
        assert_eq!(c.proxy.status_port, 15020);
    }

    #[test]
    fn layering_order_mesh_env_annotation() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc/istio/config")).unwrap();
        std::fs::create_dir_all(dir.path().join("etc/istio/pod")).unwrap();
        std::fs::write(
            dir.path().join("etc/istio/config/mesh"),
            "defaultConfig:\n  discoveryAddress: mesh:1\n  drainDuration: 7s\n  statusPort: 15100\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("etc/istio/pod/annotations"),
            "proxy.istio.io/config=\"statusPort: 15300\\nconcurrency: 3\\n\"\nother=\"x\"\n",
        )
        .unwrap();
        let e = env(&[(
            "PROXY_CONFIG",
            r#"{"discoveryAddress":"env:2","statusPort":15200}"#,
        )]);
        let c = load(dir.path(), &e).unwrap();
        assert_eq!(c.proxy.discovery_address, "env:2");
        assert_eq!(c.proxy.drain_duration, Duration::from_secs(7));
        assert_eq!(c.proxy.status_port, 15300);
        assert_eq!(c.concurrency(), 3);
        assert_eq!(c.pod_annotations["other"], "x");
    }

    #[test]
    fn invalid_values_name_variable_and_value() {
        let dir = tempfile::tempdir().unwrap();
        for (k, v, needle) in [
            ("ISTIO_DELTA_XDS", "maybe", "ISTIO_DELTA_XDS"),
            ("PROXY_CONFIG", "statusPort: abc", "statusPort"),
            ("PROXY_CONFIG", "{", "PROXY_CONFIG"),
            ("ENVOY_STATUS_PORT", "99999", "ENVOY_STATUS_PORT"),
            (
                "MINIMUM_DRAIN_DURATION",
                "5 parsecs",
                "MINIMUM_DRAIN_DURATION",
            ),
            ("ISTIO_KUBE_APP_PROBERS", "{bad", "ISTIO_KUBE_APP_PROBERS"),
            (
                "PROXY_CONFIG",
                "readinessProbe: {exec: {}}",
                "readinessProbe",
            ),
        ] {
            let err = load(dir.path(), &env(&[(k, v)])).unwrap_err().to_string();
            assert!(err.contains(needle), "{k}={v}: {err}");
        }
    }

    #[test]
    fn dns_capture_only_for_sidecars() {
        let dir = tempfile::tempdir().unwrap();
        let e = env(&[("ISTIO_META_DNS_CAPTURE", "true")]);
        assert!(load(dir.path(), &e).unwrap().dns_enabled);
        let c = Config::load(Inputs {
            node_type: NodeType::Router,
            flags: ProxyFlags::default(),
            env: &e,
            base_dir: dir.path().to_path_buf(),
            interface_ips: vec![],
        })
        .unwrap();
        assert!(!c.dns_enabled);
        assert_eq!(c.node_id(), "router~127.0.0.1~.~.svc.cluster.local");
    }

    #[test]
    fn durations_and_unquote() {
        assert_eq!(parse_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("5"), None);
        assert_eq!(parse_duration("s"), None);
        assert_eq!(
            go_unquote(r#""a\"b\nc\u00e9""#).as_deref(),
            Some("a\"b\ncé")
        );
        assert_eq!(go_unquote("noquotes"), None);
        assert_eq!(go_unquote(r#""bad\q""#), None);
    }
}
