//! The bootstrap's inputs besides the node and the ProxyConfig: Envoy's xDS and SDS wiring, the
//! listeners it adds, and the options Istio's template reads.

use std::path::{Path, PathBuf};

use super::{Error, env::Env, resolve};

/// What Envoy's bootstrap is built from (with [`super::Node`] and [`super::ProxyConfig`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct BootstrapConfig {
    /// `ISTIO_BOOTSTRAP`: a template file instead of Istio's.
    pub template: String,
    /// `ISTIO_DELTA_XDS` (true): Envoy uses `DELTA_GRPC`.
    pub delta_xds: bool,
    /// `XDS_ROOT_CA` as given (the gRPC bootstrap names it).
    pub xds_root_ca: String,
    /// `ISTIO_DUAL_STACK`.
    pub dual_stack: bool,
    /// `GRPC_XDS_BOOTSTRAP`, resolved: the proxyless gRPC bootstrap the agent writes.
    pub grpc_xds_bootstrap: PathBuf,
    /// `ENVOY_SECURE_METRICS_PORT` (0: no mTLS listener for Envoy's own stats).
    pub secure_metrics_port: u16,
    /// `ENVOY_SECURE_MERGED_METRICS_PORT` (0: no mTLS listener for the merged metrics).
    pub secure_merged_metrics_port: u16,
    /// `PEER_METADATA_DISCOVERY` when set; unset, metadata discovery follows `ENABLE_HBONE`.
    pub peer_metadata_discovery: Option<bool>,
    /// `COMPLIANCE_POLICY` (`fips-140-2` limits Envoy's Google gRPC clients to TLS 1.2).
    pub compliance_policy: String,
    /// `ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL`: the 15021 listener accepts PROXY protocol.
    pub status_port_proxy_protocol: bool,
    /// `DNS_PROXY_ADDR`, reported to istiod as node metadata.
    pub dns_proxy_addr: String,
    /// `HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED` (true; false adds Envoy's runtime flag
    /// of that name as `"false"`).
    pub http_strip_fragment_from_path: bool,
}

pub fn load(env: Env<'_>, base_dir: &Path) -> Result<BootstrapConfig, Error> {
    Ok(BootstrapConfig {
        template: env.str("ISTIO_BOOTSTRAP", ""),
        delta_xds: env.bool("ISTIO_DELTA_XDS", true)?,
        xds_root_ca: env.str("XDS_ROOT_CA", ""),
        dual_stack: env.bool("ISTIO_DUAL_STACK", false)?,
        grpc_xds_bootstrap: resolve(
            base_dir,
            &env.str(
                "GRPC_XDS_BOOTSTRAP",
                "./etc/istio/proxy/grpc-bootstrap.json",
            ),
        ),
        secure_metrics_port: env.port("ENVOY_SECURE_METRICS_PORT", 0)?,
        secure_merged_metrics_port: env.port("ENVOY_SECURE_MERGED_METRICS_PORT", 0)?,
        peer_metadata_discovery: if env.is_set("PEER_METADATA_DISCOVERY") {
            Some(env.bool("PEER_METADATA_DISCOVERY", false)?)
        } else {
            None
        },
        compliance_policy: env.str("COMPLIANCE_POLICY", ""),
        status_port_proxy_protocol: env.bool("ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL", false)?,
        dns_proxy_addr: env.str("DNS_PROXY_ADDR", ""),
        http_strip_fragment_from_path: env
            .bool("HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED", true)?,
    })
}
