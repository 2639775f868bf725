//! The cloud platform the proxy runs on (`CLOUD_PLATFORM`, Istio's), where each cloud's
//! metadata server is, and the GCP metadata an operator may set instead of asking for it:
//! what the platform's discovery (`agent/src/platform.rs`) is given.
//!
//! `CLOUD_PLATFORM` is `aws`, `azure`, `gcp` or `none` in any case; unset, the platform is
//! discovered. A value Istio does not know is ignored by Istio's agent, which then discovers;
//! here it is warned about like any value that does not parse, and the default (discovery) is
//! used. The metadata servers can be moved (tests, proxies in front of them):
//! `GCE_METADATA_HOST` (Google's client libraries' variable), and, not in Istio,
//! `CLOUD_PLATFORM_AWS_METADATA_HOST` and `CLOUD_PLATFORM_AZURE_METADATA_HOST`; each is
//! `host[:port]`, spoken to over plain HTTP as the real servers are.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{Error, env::Env};

/// `CLOUD_PLATFORM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CloudPlatform {
    /// Unset: ask every metadata server at once.
    Discover,
    Aws,
    Azure,
    Gcp,
    /// No platform: no requests, nothing added.
    None,
}

impl CloudPlatform {
    fn parse(v: &str) -> Option<CloudPlatform> {
        match v.to_ascii_lowercase().as_str() {
            "aws" => Some(CloudPlatform::Aws),
            "azure" => Some(CloudPlatform::Azure),
            "gcp" => Some(CloudPlatform::Gcp),
            "none" => Some(CloudPlatform::None),
            _ => None,
        }
    }
}

/// AWS's instance metadata service on IPv4 and on IPv6 (Nitro instances).
pub const AWS_METADATA_V4: &str = "169.254.169.254";
pub const AWS_METADATA_V6: &str = "[fd00:ec2::254]";
/// Azure's instance metadata service.
pub const AZURE_METADATA: &str = "169.254.169.254";
/// Google's metadata server, and the name its DNS gives it.
pub const GCP_METADATA: &str = "169.254.169.254";
pub const GCP_METADATA_NAME: &str = "metadata.google.internal.";
/// The Compute Engine API (instance labels of a VM outside Kubernetes).
pub const GCP_COMPUTE_API: &str = "https://compute.googleapis.com";

/// Where the platform's facts are asked for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Endpoints {
    /// AWS's metadata server, `host[:port]`: `CLOUD_PLATFORM_AWS_METADATA_HOST`, else
    /// [`AWS_METADATA_V6`] when the proxy has an IPv6 address (as Istio), else
    /// [`AWS_METADATA_V4`].
    pub aws: String,
    /// Azure's: `CLOUD_PLATFORM_AZURE_METADATA_HOST`, else [`AZURE_METADATA`].
    pub azure: String,
    /// Google's: `GCE_METADATA_HOST`, else [`GCP_METADATA`].
    pub gcp: String,
    /// `GCE_METADATA_HOST` is set: Google's libraries then take the host for a GCE one without
    /// probing it.
    pub gcp_host_set: bool,
    /// The name whose address says "GCE" when it is [`GCP_METADATA`].
    pub gcp_dns_name: String,
    /// The Compute Engine API's base URL.
    pub gcp_compute: String,
    /// `/sys/class/dmi/id`: the machine's vendor (Azure) and product (GCE) names.
    pub dmi_dir: PathBuf,
    /// `/etc/resolv.conf`: a GKE pod's zone is in its search list.
    pub resolv_conf: PathBuf,
}

/// What platform discovery is given.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PlatformConfig {
    /// `CLOUD_PLATFORM`.
    pub cloud: CloudPlatform,
    pub endpoints: Endpoints,
    /// `KUBERNETES_SERVICE_HOST` is set: a GCE instance is not asked for its labels.
    pub kubernetes: bool,
    /// Istio's static GCP metadata: `GCP_METADATA` (`project|number|cluster|location`),
    /// `GCP_QUOTA_PROJECT` and `GCP_ZONE`, under Istio's keys (`gcp_project`, ...). Set, it is
    /// the GCP metadata and no GCP metadata server is asked for it.
    pub gcp_static: BTreeMap<String, String>,
}

/// A `host[:port]` as an HTTP authority (no scheme, path or user).
fn authority(v: &str) -> Option<String> {
    let a: http::uri::Authority = v.parse().ok()?;
    (!a.host().is_empty() && !a.as_str().contains('@')).then(|| a.as_str().to_string())
}

/// Istio's URL of a GKE cluster (`gcp_gke_cluster_url`).
pub fn gke_cluster_url(project: &str, location: &str, cluster: &str) -> String {
    format!(
        "https://container.googleapis.com/v1/projects/{project}/locations/{location}/clusters/{cluster}"
    )
}

/// Reads `var` as a metadata server's `host[:port]`; `default` when unset or not one.
fn host(env: Env<'_>, var: &str, default: &str) -> Result<String, Error> {
    env.parse(var, default.to_string(), "host[:port]", authority)
}

/// Istio's static GCP metadata (its `GCPStaticMetadata`): nothing unless `GCP_METADATA` is set;
/// its four parts only when there are four.
fn gcp_static(env: Env<'_>) -> BTreeMap<String, String> {
    let mut md = BTreeMap::new();
    let Some(gcpm) = env.get("GCP_METADATA") else {
        return md;
    };
    let parts: Vec<&str> = gcpm.split('|').collect();
    if let [project, number, cluster, location] = parts[..] {
        for (k, v) in [
            ("gcp_project", project),
            ("gcp_project_number", number),
            ("gcp_gke_cluster_name", cluster),
            ("gcp_location", location),
        ] {
            md.insert(k.to_string(), v.to_string());
        }
        md.insert(
            "gcp_gke_cluster_url".into(),
            gke_cluster_url(project, location, cluster),
        );
    }
    if let Some(quota) = env.get("GCP_QUOTA_PROJECT") {
        md.insert("gcp_quota_project".into(), quota.to_string());
    }
    if let Some(zone) = env.get("GCP_ZONE") {
        md.insert("gcp_zone".into(), zone.to_string());
    }
    md
}

/// Reads the platform's settings. `ipv6`: the proxy has an IPv6 address (AWS is then asked on
/// its IPv6 address, as Istio).
pub fn load(env: Env<'_>, ipv6: bool) -> Result<PlatformConfig, Error> {
    let cloud = env.parse(
        "CLOUD_PLATFORM",
        CloudPlatform::Discover,
        "aws, azure, gcp or none (unset: discover)",
        CloudPlatform::parse,
    )?;
    let aws_default = if ipv6 {
        AWS_METADATA_V6
    } else {
        AWS_METADATA_V4
    };
    let gcp = host(env, "GCE_METADATA_HOST", "")?;
    Ok(PlatformConfig {
        cloud,
        endpoints: Endpoints {
            aws: host(env, "CLOUD_PLATFORM_AWS_METADATA_HOST", aws_default)?,
            azure: host(env, "CLOUD_PLATFORM_AZURE_METADATA_HOST", AZURE_METADATA)?,
            gcp_host_set: !gcp.is_empty(),
            gcp: if gcp.is_empty() {
                GCP_METADATA.to_string()
            } else {
                gcp
            },
            gcp_dns_name: GCP_METADATA_NAME.into(),
            gcp_compute: GCP_COMPUTE_API.into(),
            dmi_dir: PathBuf::from("/sys/class/dmi/id"),
            resolv_conf: PathBuf::from(super::RESOLV_CONF),
        },
        kubernetes: env.is_set("KUBERNETES_SERVICE_HOST"),
        gcp_static: gcp_static(env),
    })
}
