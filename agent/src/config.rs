//! Typed agent configuration: `proxy` flags + the environment (an injectable map) + ProxyConfig
//! layers, parsed and validated once. Errors name the variable or field, its value, and what was
//! expected.

mod bootstrap;
pub mod ca_provider;
mod dns;
pub mod dump;
mod env;
mod envoy;
pub mod grpc;
pub mod identity;
mod node;
pub mod platform;
pub mod probe;
pub mod proxy_config;
mod status;
pub mod upstream;

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};

pub use bootstrap::BootstrapConfig;
pub use env::Metrics as EnvMetrics;
#[cfg(test)]
pub use env::STRICT_ENV;
pub use envoy::{EnvoyConfig, HeapLimit};
pub use grpc::XdsServer;
pub use node::Node;
pub use platform::{CloudPlatform, PlatformConfig};
pub use proxy_config::{AuthPolicy, ProxyConfig, split_host_port};
pub use status::StatusConfig;
pub use upstream::XdsUpstream;

use env::{Env, Fallbacks};

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
    /// `ISTIO_KUBE_APP_PROBERS` or `ISTIO_PROMETHEUS_ANNOTATIONS` (a probe's header values
    /// left out of `value`).
    #[error("invalid {var}={value:?}: expected {source}")]
    Probe {
        var: &'static str,
        value: String,
        source: Box<probe::Error>,
    },
    /// ProxyConfig's `readinessProbe` (header values left out of `value`).
    #[error("invalid ProxyConfig field readinessProbe: value {value}, expected {source}")]
    ReadinessProbe {
        value: String,
        source: Box<probe::Error>,
    },
    #[error("cannot parse ProxyConfig from {source_name}: {reason}")]
    Layer { source_name: String, reason: String },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid proxy type {0:?}: expected sidecar, router or waypoint")]
    NodeType(String),
    /// `PROV_CERT` beside mounted certificates (`FILE_MOUNTED_CERTS`, or GKE's files).
    #[error("invalid options: PROV_CERT and {0} are mutually exclusive")]
    ProvCertExclusive(&'static str),
    #[error("CA_PROVIDER=GkeWorkloadCertificate: GKE workload certificate files ({0}) not present")]
    GkeWorkloadFiles(String),
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
    /// `--profiling` (true): `/debug/pprof/` on the status port.
    pub profiling: bool,
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
            profiling: true,
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
    /// The agent runs as root (uid 0): it may serve DNS on `:53`, and Envoy then runs as the
    /// proxy user.
    pub is_root: bool,
    /// The memory limit of the agent's cgroup (`crate::cgroup::memory_limit`), when it has one.
    pub cgroup_memory_limit: Option<u64>,
}

/// The resolv.conf the DNS proxy forwards to.
const RESOLV_CONF: &str = "/etc/resolv.conf";

/// The agent's whole configuration: one typed tree, parsed and validated once by
/// [`Config::load`], grouped by what each part configures. Each component takes its own
/// sub-config; none reads the environment again. The logged tree and `/debug/config_dump` are
/// this tree, serialized ([`dump`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// The directory Istio's relative paths (`./etc/istio/...`) are resolved against.
    pub base_dir: PathBuf,
    /// `pilot-agent proxy` flags.
    pub flags: ProxyFlags,
    /// The merged ProxyConfig (dumped as its layers merged, credentials redacted).
    #[serde(serialize_with = "dump::proxy_config")]
    pub proxy: ProxyConfig,
    /// Who the proxy is: role, pod, IPs, domain, cluster.
    pub node: Node,
    /// Envoy's process and lifecycle.
    pub envoy: EnvoyConfig,
    /// Envoy's bootstrap inputs.
    pub bootstrap: BootstrapConfig,
    /// The workload identity sockets as configured; who serves them is settled at bind.
    pub workload_socket: identity::WorkloadSocket,
    /// `CA_PROVIDER`, settled; whether it needs a CA client is known at bind (not with an
    /// external SDS server or mounted certificates).
    pub ca_provider: ca_provider::CaProvider,
    /// Workload identity: CA client, certificates, SDS on the configured workload socket,
    /// `OUTPUT_CERTS`. An external SDS server found at bind moves the agent's own to
    /// file certificates only (the top-level `identity` module).
    pub identity: sds::Config,
    /// The DNS proxy, when enabled (`ISTIO_META_DNS_CAPTURE` for sidecars, or
    /// `ISTIO_META_ENABLE_DNS_SERVER`).
    pub dns: Option<dns_proxy::Config>,
    /// The xDS proxy's connection to istiod.
    pub upstream: XdsUpstream,
    /// The XDS socket's gRPC server (Envoy's side of the xDS proxy).
    pub xds_server: XdsServer,
    /// The status server (probes, app metrics, workload health).
    pub status: StatusConfig,
    /// `CLOUD_PLATFORM` and the metadata servers the platform is discovered from.
    pub platform: PlatformConfig,
    /// The variables whose value did not parse and whose default was used instead (warned
    /// about at load; counted in `istio_agent_env_parse_errors_total`).
    pub env_fallbacks: Vec<String>,
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
    /// A sidecar's configuration from `env` alone, rooted at `dir` (tests).
    #[cfg(test)]
    pub(crate) fn sidecar_for_test(
        dir: &Path,
        env: &HashMap<String, String>,
    ) -> Result<Config, Error> {
        Config::load(Inputs {
            node_type: NodeType::Sidecar,
            flags: ProxyFlags::default(),
            env,
            base_dir: dir.to_path_buf(),
            interface_ips: vec![],
            is_root: false,
            cgroup_memory_limit: None,
        })
    }

    /// Resolves one of Istio's relative paths (`./etc/...`) against the base directory;
    /// absolute paths stay as they are.
    pub fn path(&self, p: &str) -> PathBuf {
        resolve(&self.base_dir, p)
    }

    /// `<configPath>/XDS`: the xDS proxy's socket.
    pub fn xds_socket(&self) -> PathBuf {
        self.path(&self.proxy.config_path).join("XDS")
    }

    /// The service node id `<type>~<ip>~<pod>.<ns>~<domain>`.
    pub fn node_id(&self) -> String {
        self.node.id()
    }

    /// Envoy's `--concurrency` (0: not passed).
    pub fn concurrency(&self) -> u32 {
        self.proxy.concurrency.unwrap_or(0)
    }

    /// Loads and validates everything; the first invalid value is the error. A typed
    /// environment value that does not parse is warned about and replaced by its default, as
    /// Istio's agent does (an error under `ISTIO_AGENT_STRICT_ENV=true`).
    pub fn load(inputs: Inputs<'_>) -> Result<Config, Error> {
        let fallbacks = Fallbacks::new(inputs.env);
        let env = Env::new(inputs.env, &fallbacks);
        let base_dir = inputs.base_dir;
        let flags = inputs.flags;
        let pod_annotations =
            read_downward_api(&resolve(&base_dir, "./etc/istio/pod/annotations"))?;
        let pod_labels = read_downward_api(&resolve(&base_dir, "./etc/istio/pod/labels"))?;
        let proxy = load_proxy_config(env, &base_dir, &flags, &pod_annotations)?;
        let node = node::load(node::Inputs {
            env,
            kind: inputs.node_type,
            domain: &flags.domain,
            interface_ips: inputs.interface_ips,
            pod_labels,
            pod_annotations,
        })?;
        let dns_enabled = dns_enabled(env, node.kind)?;
        let workload_socket = workload_socket(env, &base_dir)?;
        let istiod = Istiod::load(env, &base_dir, &proxy.discovery_address)?;
        let identity = istiod.identity(&node, &workload_socket)?;
        let ca_provider = istiod.ca_provider.clone();
        let envoy = envoy::load(envoy::Inputs {
            env,
            flags: &flags,
            is_root: inputs.is_root,
            cgroup_memory_limit: inputs.cgroup_memory_limit,
            compliance: istiod.compliance,
        })?;
        let proxyless = envoy.disabled || env.get("ISTIO_META_GENERATOR") == Some("grpc");
        let upstream = istiod.upstream(&proxy, &node, &identity, proxyless)?;
        let xds_server = XdsServer::load(env, &istiod.keepalive)?;
        let dns = if dns_enabled {
            Some(dns::load(dns::Inputs {
                env,
                namespace: &node.pod_namespace,
                domain: &node.dns_domain,
                resolv_conf: Path::new(RESOLV_CONF),
                istio_resolv_conf: Path::new(dns_proxy::ISTIO_RESOLV_CONF),
                is_root: inputs.is_root,
            })?)
        } else {
            None
        };
        let status = status::load(env, &proxy, flags.profiling)?;
        let bootstrap = bootstrap::load(env, &base_dir)?;
        let platform = platform::load(env, node.ips.iter().any(IpAddr::is_ipv6))?;
        let env_fallbacks = fallbacks.into_variables();

        Ok(Config {
            base_dir,
            flags,
            proxy,
            node,
            envoy,
            bootstrap,
            workload_socket,
            ca_provider,
            identity,
            dns,
            upstream,
            xds_server,
            status,
            platform,
            env_fallbacks,
        })
    }
}

/// Whether the DNS proxy runs: from the environment only, as Istio's agent (the injector renders
/// the mesh's proxyMetadata as env, and a template may override it after: grpc-agent's
/// `ISTIO_META_DNS_CAPTURE=false`, the last of two equal names winning in a pod's env).
fn dns_enabled(env: Env<'_>, kind: NodeType) -> Result<bool, Error> {
    let dns_capture = env.bool("ISTIO_META_DNS_CAPTURE", false)?;
    let dns_server = env.bool("ISTIO_META_ENABLE_DNS_SERVER", false)?;
    Ok((dns_capture && kind == NodeType::Sidecar) || dns_server)
}

/// The workload identity sockets under `WORKLOAD_IDENTITY_SOCKET_FILE` (a bare file name).
fn workload_socket(env: Env<'_>, base_dir: &Path) -> Result<identity::WorkloadSocket, Error> {
    let socket_file = env.str("WORKLOAD_IDENTITY_SOCKET_FILE", "socket");
    if socket_file.contains('/') {
        return Err(env.invalid(
            "WORKLOAD_IDENTITY_SOCKET_FILE",
            &socket_file,
            "a bare file name",
        ));
    }
    Ok(identity::WorkloadSocket::new(base_dir, &socket_file))
}

/// What the two connections to istiod (the CA client and the xDS upstream) share: one
/// `PROV_CERT`, one `ISTIOD_SAN` (the CA's name only when the CA is the discovery address),
/// the mounted certificates, one TLS policy and one keepalive.
struct Istiod<'a> {
    env: Env<'a>,
    base_dir: &'a Path,
    discovery_address: &'a str,
    prov_cert: Option<sds::CertDir>,
    istiod_san: Option<&'a str>,
    ca_provider: ca_provider::CaProvider,
    /// `FILE_MOUNTED_CERTS`, or GKE's files (mounted certificates too).
    file_mounted_certs: bool,
    /// For every connection the agent makes to istiod, and Envoy's share.
    compliance: sds::Compliance,
    /// For every gRPC connection, made or served (`GRPC_KEEPALIVE_*`).
    keepalive: grpc::Keepalive,
}

impl<'a> Istiod<'a> {
    fn load(env: Env<'a>, base_dir: &'a Path, discovery_address: &'a str) -> Result<Self, Error> {
        let prov_cert = env
            .get("PROV_CERT")
            .map(|d| sds::CertDir::istio(&resolve(base_dir, d)));
        let ca_provider = ca_provider::load(ca_provider::Inputs {
            env,
            base_dir,
            discovery_address,
            prov_cert: prov_cert.is_some(),
            file_mounted_certs: env.bool("FILE_MOUNTED_CERTS", false)?,
        })?;
        let file_mounted_certs =
            env.bool("FILE_MOUNTED_CERTS", false)? || ca_provider.mounted_files().is_some();
        Ok(Istiod {
            env,
            base_dir,
            discovery_address,
            prov_cert,
            istiod_san: env.get("ISTIOD_SAN"),
            ca_provider,
            file_mounted_certs,
            compliance: compliance_policy(env),
            keepalive: grpc::Keepalive::load(env)?,
        })
    }

    /// The CA client's and the SDS server's settings.
    fn identity(
        &self,
        node: &Node,
        socket: &identity::WorkloadSocket,
    ) -> Result<sds::Config, Error> {
        identity::load(identity::Inputs {
            env: self.env,
            base_dir: self.base_dir,
            discovery_address: self.discovery_address,
            namespace: &node.pod_namespace,
            service_account: &node.service_account,
            cluster_id: &node.cluster_id,
            prov_cert: self.prov_cert.as_ref(),
            istiod_san: self.istiod_san,
            socket,
            file_mounted_certs: self.file_mounted_certs,
            ca_provider: &self.ca_provider,
            compliance: self.compliance,
            grpc_keepalive: self.keepalive.client(),
        })
    }

    /// The xDS upstream's settings; `identity`'s rule for the token holds on both connections.
    fn upstream(
        &self,
        proxy: &ProxyConfig,
        node: &Node,
        identity: &sds::Config,
        proxyless: bool,
    ) -> Result<XdsUpstream, Error> {
        upstream::load(upstream::Inputs {
            env: self.env,
            base_dir: self.base_dir,
            discovery_address: self.discovery_address,
            auth_policy: proxy.control_plane_auth_policy,
            cluster_id: &node.cluster_id,
            prov_cert: self.prov_cert.as_ref(),
            istiod_san: self.istiod_san,
            allow_plaintext_token: identity.allow_plaintext_token,
            proxyless,
            file_mounted: self.file_mounted_certs.then_some(&proxy.proxy_metadata),
            compliance: self.compliance,
            grpc_keepalive: self.keepalive.client(),
        })
    }
}

/// `COMPLIANCE_POLICY`. A value Istio does not know is warned about and restricts nothing, as
/// in Istio's agent (which warns and goes on without a restriction).
fn compliance_policy(env: Env<'_>) -> sds::Compliance {
    let value = env.str("COMPLIANCE_POLICY", "");
    sds::Compliance::parse(&value).unwrap_or_else(|| {
        tracing::warn!(
            value = %value,
            "unknown COMPLIANCE_POLICY (expected fips-140-2, fips-140-3 or pqc): no TLS restriction applied"
        );
        sds::Compliance::None
    })
}

/// The ProxyConfig layers merged in Istio's order (defaults, mesh config `defaultConfig`,
/// `PROXY_CONFIG`, the `proxy.istio.io/config` annotation), then the settings that override
/// them (`ISTIO_CPU_LIMIT`, `--concurrency`, `--serviceCluster`, the discovery address and
/// status port annotations).
fn load_proxy_config(
    env: Env<'_>,
    base_dir: &Path,
    flags: &ProxyFlags,
    pod_annotations: &BTreeMap<String, String>,
) -> Result<ProxyConfig, Error> {
    let mut raw = proxy_config::defaults();
    if let Some(dc) = mesh_default_config(&resolve(base_dir, &flags.mesh_config))? {
        proxy_config::merge(&mut raw, dc);
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
    if let Some(provider) = proxy.raw.get("privateKeyProvider").filter(|v| !v.is_null()) {
        // Istio hands Envoy the workload key through CryptoMB or QAT (builds of Envoy with
        // those extensions); this agent serves the key inline (docs/differences.md).
        tracing::warn!(
            field = "privateKeyProvider",
            value = %provider,
            "ProxyConfig privateKeyProvider is not supported: the workload key is served to Envoy inline, without the CryptoMB/QAT provider"
        );
    }
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
    apply_annotations(&mut proxy, pod_annotations)?;
    Ok(proxy)
}

/// The mesh config's `defaultConfig` (none when the file or the field is missing).
fn mesh_default_config(mesh_path: &Path) -> Result<Option<serde_json::Value>, Error> {
    let text = match std::fs::read_to_string(mesh_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(Error::Read {
                path: mesh_path.to_path_buf(),
                source,
            });
        }
    };
    let mesh = proxy_config::parse_layer(&mesh_path.display().to_string(), &text)?;
    match mesh.get("defaultConfig") {
        Some(dc) if dc.is_object() => Ok(Some(dc.clone())),
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(_) => Err(Error::Layer {
            source_name: mesh_path.display().to_string(),
            reason: "defaultConfig is not a mapping".into(),
        }),
    }
}

/// The pod's `sidecar.istio.io/discoveryAddress` and `status.sidecar.istio.io/port`, used as
/// Istio's agent uses them: the address as written (warned about when it is not host:port; the
/// connection then fails and says so), a status port that is not a number logged and read as 0
/// (no status server).
fn apply_annotations(
    proxy: &mut ProxyConfig,
    pod_annotations: &BTreeMap<String, String>,
) -> Result<(), Error> {
    if let Some(addr) = pod_annotations.get("sidecar.istio.io/discoveryAddress") {
        if split_host_port(addr).is_none() {
            tracing::warn!(
                annotation = "sidecar.istio.io/discoveryAddress",
                value = %addr,
                "not host:port; used as written, as Istio's agent does"
            );
        }
        proxy.discovery_address = addr.clone();
    }
    if let Some(port) = pod_annotations.get("status.sidecar.istio.io/port") {
        proxy.status_port = match go_atoi(port) {
            Some(p) => u16::try_from(p).map_err(|_| Error::ProxyConfigField {
                field: "status.sidecar.istio.io/port".into(),
                value: port.clone(),
                expected: "a port in 0-65535 (0: no status server)".into(),
            })?,
            None => {
                tracing::error!(
                    annotation = "status.sidecar.istio.io/port",
                    value = %port,
                    "not a number: read as 0 (no status server), as Istio's agent does"
                );
                0
            }
        };
    }
    Ok(())
}

/// Go's `strconv.Atoi` (an optional sign, decimal digits, no spaces), `None` where it fails.
fn go_atoi(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
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
