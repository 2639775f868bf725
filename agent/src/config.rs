//! Typed agent configuration: `proxy` flags + the environment (an injectable map) + ProxyConfig
//! layers, parsed and validated once. Errors name the variable or field, its value, and what was
//! expected.

mod dns;
pub mod dump;
mod env;
pub mod identity;
pub mod proxy_config;
mod status;
pub mod upstream;

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use proxy_config::{AuthPolicy, ProxyConfig, StatsMatcher, split_host_port};
pub use status::StatusConfig;
pub use upstream::XdsUpstream;

use env::Env;

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
    #[error(
        "agent configured for non-default SDS socket path: {path} but no socket found (WORKLOAD_IDENTITY_SOCKET_FILE={file:?} names a socket that an external SDS server such as SPIRE's agent must serve before pilot-agent starts; unset it to use pilot-agent's own SDS server)"
    )]
    NoExternalSocket { path: PathBuf, file: String },
    #[error("{0}")]
    Socket(sds::Error),
    #[error("invalid proxy type {0:?}: expected sidecar, router or waypoint")]
    NodeType(String),
    #[error("invalid flag --{flag}={value:?}: expected {expected}")]
    Flag {
        flag: String,
        value: String,
        expected: String,
    },
}

/// The proxy's role (`proxy sidecar|router|waypoint`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeType {
    Sidecar,
    /// Gateways (`proxy router`).
    Router,
    /// Ambient waypoints (`proxy waypoint`, Istio's waypoint template): a gateway-like proxy
    /// whose node id starts `waypoint~`.
    Waypoint,
}

impl NodeType {
    pub fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "sidecar" => Ok(NodeType::Sidecar),
            "router" => Ok(NodeType::Router),
            "waypoint" => Ok(NodeType::Waypoint),
            other => Err(Error::NodeType(other.to_string())),
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            NodeType::Sidecar => "sidecar",
            NodeType::Router => "router",
            NodeType::Waypoint => "waypoint",
        }
    }
}

/// Flags of `pilot-agent proxy` (Istio's spelling in comments).
#[derive(Debug, Clone, serde::Serialize)]
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

/// The resolv.conf the DNS proxy forwards to.
const RESOLV_CONF: &str = "/etc/resolv.conf";

/// The agent's whole configuration: one typed tree, parsed and validated once by
/// [`Config::load`]. Each component takes its own sub-config (`identity`, `dns`, `upstream`,
/// `status`, the bootstrap fields); none reads the environment again.
#[derive(Debug, Clone)]
pub struct Config {
    pub base_dir: PathBuf,
    pub node_type: NodeType,
    pub flags: ProxyFlags,
    pub proxy: ProxyConfig,
    /// The environment the agent was started with, passed on to Envoy's process as it is
    /// (never read for settings: those are the typed fields).
    pub envoy_env: HashMap<String, String>,
    /// `ISTIO_META_*` and `ISTIO_METAJSON_*` variables, sorted by name: the node metadata's
    /// inputs from the environment.
    pub meta_env: Vec<(String, String)>,
    pub pod_name: String,
    pub pod_namespace: String,
    pub service_account: String,
    pub host_ip: String,
    /// `INSTANCE_IP`, when it is an IP.
    pub instance_ip: Option<IpAddr>,
    pub ips: Vec<IpAddr>,
    pub dns_domain: String,
    pub cluster_id: String,
    /// `ISTIO_DELTA_XDS` (default true): Envoy uses `DELTA_GRPC`.
    pub delta_xds: bool,
    /// `XDS_ROOT_CA` as given (the gRPC bootstrap names it).
    pub xds_root_ca: String,
    pub envoy_status_port: u16,
    pub envoy_prometheus_port: u16,
    pub disable_envoy: bool,
    pub exit_on_zero_active_connections: bool,
    pub minimum_drain_duration: Duration,
    pub workload_identity_socket_file: String,
    /// The workload socket as settled at start (an external SDS server such as SPIRE's?).
    pub workload_socket: identity::WorkloadSocket,
    pub istio_bootstrap: String,
    pub bootstrap_override: String,
    pub skip_deprecated_logs: bool,
    pub enable_core_dump: bool,
    /// The agent runs as root to serve DNS on `:53` (uid 0 and `DNS_PROXY_ADDR` ending in
    /// `:53`, Istio's `AgentIsRoot`): Envoy then runs as 1337 and gets the SDS socket.
    pub agent_is_root: bool,
    pub dual_stack: bool,
    pub metrics_localhost_only: bool,
    pub grpc_xds_bootstrap: String,
    pub output_certs: String,
    pub pod_labels: BTreeMap<String, String>,
    pub pod_annotations: BTreeMap<String, String>,
    /// Workload identity: CA client, certificates, SDS.
    pub identity: sds::Config,
    /// The DNS proxy, when enabled (`ISTIO_META_DNS_CAPTURE` for sidecars, or
    /// `ISTIO_META_ENABLE_DNS_SERVER`).
    pub dns: Option<dns_proxy::Config>,
    /// The xDS proxy's connection to istiod.
    pub upstream: XdsUpstream,
    /// The status server (probes, app metrics, workload health).
    pub status: StatusConfig,
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

/// The host's private IPs for `INSTANCE_IPS`, without those of the interfaces the pod annotation
/// `traffic.sidecar.istio.io/excludeInterfaces` names (comma-separated), as Istio; duplicates
/// dropped, order kept. A host with no address outside loopback gives `127.0.0.1` and `::1`.
pub fn private_ips(
    base_dir: &Path,
    interfaces: Vec<(String, IpAddr)>,
) -> Result<Vec<IpAddr>, Error> {
    let annotations = read_downward_api(&resolve(base_dir, "./etc/istio/pod/annotations"))?;
    let excluded: Vec<&str> = annotations
        .get("traffic.sidecar.istio.io/excludeInterfaces")
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    if interfaces.is_empty() {
        // No address but on loopback: Istio's agent substitutes these (no exclusion applies).
        return Ok(vec![
            IpAddr::from([127, 0, 0, 1]),
            IpAddr::from(Ipv6Addr::LOCALHOST),
        ]);
    }
    let mut out = Vec::new();
    for (name, ip) in interfaces {
        if !excluded.contains(&name.as_str()) && !out.contains(&ip) {
            out.push(ip);
        }
    }
    Ok(out)
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
        if let Some(v) = go_syntax::unquote(v.trim()) {
            out.insert(k.trim().to_string(), v);
        }
    }
    out
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
        self.identity.socket_path.clone()
    }

    /// The service node id `<type>~<ip>~<pod>.<ns>~<domain>`.
    pub fn node_id(&self) -> String {
        let ip = self.ips.first().map(|i| i.to_string()).unwrap_or_default();
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
        if let Some(pc) = env.raw("PROXY_CONFIG") {
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
            let cpu = env.u32("ISTIO_CPU_LIMIT", 0)?;
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
        // "0" turns the status server off, as Istio.
        if let Some(port) = pod_annotations.get("status.sidecar.istio.io/port") {
            proxy.status_port =
                port.trim()
                    .parse::<u16>()
                    .map_err(|_| Error::ProxyConfigField {
                        field: "status.sidecar.istio.io/port".into(),
                        value: port.clone(),
                        expected: "a port in 0-65535 (0: no status server)".into(),
                    })?;
        }

        // Proxy IPs: INSTANCE_IP first, then the host's ([`private_ips`]). None at all (no
        // INSTANCE_IP, every interface excluded) leaves the node ID's IP empty, as Istio's.
        let mut ips = Vec::new();
        let instance_ip = env
            .get("INSTANCE_IP")
            .and_then(|i| i.parse::<IpAddr>().ok());
        ips.extend(instance_ip);
        for ip in inputs.interface_ips {
            if !ips.contains(&ip) {
                ips.push(ip);
            }
        }

        let dns_domain = if flags.domain.is_empty() {
            format!("{pod_namespace}.svc.cluster.local")
        } else {
            flags.domain.clone()
        };

        let dns_capture = env.bool("ISTIO_META_DNS_CAPTURE", false)?
            || proxy
                .proxy_metadata
                .get("ISTIO_META_DNS_CAPTURE")
                .and_then(|v| go_syntax::parse_bool(v).ok())
                .unwrap_or(false);
        let dns_server = env.bool("ISTIO_META_ENABLE_DNS_SERVER", false)?;
        let dns_enabled = (dns_capture && inputs.node_type == NodeType::Sidecar) || dns_server;

        let workload_identity_socket_file = env.str("WORKLOAD_IDENTITY_SOCKET_FILE", "socket");
        if workload_identity_socket_file.contains('/') {
            return Err(env.invalid(
                "WORKLOAD_IDENTITY_SOCKET_FILE",
                &workload_identity_socket_file,
                "a bare file name",
            ));
        }
        let workload_socket = identity::workload_socket(&base_dir, &workload_identity_socket_file)?;

        // Shared by the CA client and the xDS upstream: one PROV_CERT, one ISTIOD_SAN.
        let prov_cert = env
            .get("PROV_CERT")
            .map(|d| sds::CertDir::istio(&resolve(&base_dir, d)));
        let istiod_san = env.get("ISTIOD_SAN");
        let service_account = env.str("SERVICE_ACCOUNT", "");
        let cluster_id = env.str("ISTIO_META_CLUSTER_ID", "");

        let identity = identity::load(identity::Inputs {
            env,
            base_dir: &base_dir,
            discovery_address: &proxy.discovery_address,
            namespace: &pod_namespace,
            service_account: &service_account,
            cluster_id: &cluster_id,
            prov_cert: prov_cert.as_ref(),
            istiod_san,
            socket: &workload_socket,
        })?;
        let upstream = upstream::load(upstream::Inputs {
            env,
            base_dir: &base_dir,
            discovery_address: &proxy.discovery_address,
            auth_policy: proxy.control_plane_auth_policy,
            cluster_id: &cluster_id,
            prov_cert: prov_cert.as_ref(),
            istiod_san,
            // One rule for the token on both connections to istiod.
            allow_plaintext_token: identity.allow_plaintext_token,
        })?;
        let is_root = nix::unistd::geteuid().is_root();
        let dns = if dns_enabled {
            Some(dns::load(dns::Inputs {
                env,
                namespace: &pod_namespace,
                domain: &flags.domain,
                resolv_conf: Path::new(RESOLV_CONF),
                istio_resolv_conf: Path::new(dns_proxy::ISTIO_RESOLV_CONF),
                is_root,
            })?)
        } else {
            None
        };
        let status = status::load(env, &proxy)?;

        Ok(Config {
            node_type: inputs.node_type,
            pod_name: env.str("POD_NAME", ""),
            service_account,
            host_ip: env.str("HOST_IP", ""),
            instance_ip,
            cluster_id,
            delta_xds: env.bool("ISTIO_DELTA_XDS", true)?,
            xds_root_ca: env.str("XDS_ROOT_CA", ""),
            envoy_status_port: env.port("ENVOY_STATUS_PORT", 15021)?,
            envoy_prometheus_port: env.port("ENVOY_PROMETHEUS_PORT", 15090)?,
            disable_envoy: env.bool("DISABLE_ENVOY", false)?,
            exit_on_zero_active_connections: env.bool("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", false)?,
            minimum_drain_duration: env.duration(
                "MINIMUM_DRAIN_DURATION",
                Duration::from_secs(5),
                Duration::ZERO,
            )?,
            workload_identity_socket_file,
            workload_socket,
            istio_bootstrap: env.str("ISTIO_BOOTSTRAP", ""),
            bootstrap_override: env.str("ISTIO_BOOTSTRAP_OVERRIDE", ""),
            skip_deprecated_logs: env.bool("ENVOY_SKIP_DEPRECATED_LOGS", true)?,
            enable_core_dump: env.bool("ISTIO_ENVOY_ENABLE_CORE_DUMP", false)?,
            agent_is_root: is_root
                && env
                    .get("DNS_PROXY_ADDR")
                    .is_some_and(|a| a.ends_with(":53")),
            dual_stack: env.bool("ISTIO_DUAL_STACK", false)?,
            metrics_localhost_only: env.bool("METRICS_LOCALHOST_ACCESS_ONLY", false)?,
            grpc_xds_bootstrap: env.str(
                "GRPC_XDS_BOOTSTRAP",
                "./etc/istio/proxy/grpc-bootstrap.json",
            ),
            output_certs: env.str("OUTPUT_CERTS", ""),
            envoy_env: inputs.env.clone(),
            meta_env: {
                let mut m: Vec<(String, String)> = inputs
                    .env
                    .iter()
                    .filter(|(k, _)| {
                        k.starts_with("ISTIO_META_") || k.starts_with("ISTIO_METAJSON_")
                    })
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                m.sort();
                m
            },
            pod_namespace,
            ips,
            dns_domain,
            proxy,
            flags,
            base_dir,
            pod_labels,
            pod_annotations,
            identity,
            dns,
            upstream,
            status,
            // bootstrap settings
            envoy_secure_metrics_port: env.port("ENVOY_SECURE_METRICS_PORT", 0)?,
            envoy_secure_merged_metrics_port: env.port("ENVOY_SECURE_MERGED_METRICS_PORT", 0)?,
            peer_metadata_discovery: if env.is_set("PEER_METADATA_DISCOVERY") {
                Some(env.bool("PEER_METADATA_DISCOVERY", false)?)
            } else {
                None
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
mod tests;
