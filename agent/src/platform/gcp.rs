//! Google Cloud: found when `GCP_METADATA` is set, when `GCE_METADATA_HOST` is, or when the
//! metadata server answers as Google's (`Metadata-Flavor: Google`) or
//! `metadata.google.internal` resolves to it; whichever of those two answers first decides
//! unless the machine's DMI product name is Google's, which waits for either to say yes (at
//! most 5 s), as Google's client library.
//!
//! The metadata (`gcp_project`, `gcp_project_number`, `gcp_location`, `gcp_gke_cluster_name`,
//! `gcp_gke_cluster_url`, `gcp_gce_instance`, `gcp_gce_instance_id`,
//! `gcp_gce_instance_template`, `gcp_gce_instance_created_by`) is `GCP_METADATA`'s when it is
//! set, else asked of the metadata server when it is reachable, every key at once, each
//! request retried as Google's library retries. The zone is `GCP_ZONE`'s, else the one in
//! `/etc/resolv.conf`'s search list (a GKE pod's), else the metadata server's; the region is
//! the zone without its last part. Outside Kubernetes (no `KUBERNETES_SERVICE_HOST`, no cluster
//! name) the instance's labels come from the Compute API with the instance's service-account
//! token.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::Value;
use tokio::time::Instant;

use super::client::{self, Request};
use super::{Cloud, Error, Locality, Platform};
use crate::config::PlatformConfig;
use crate::config::platform::gke_cluster_url;

/// Google's client's timeout for each attempt.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Istio's bound on the zone's request.
const ZONE_TIMEOUT: Duration = Duration::from_secs(10);
/// Retries of one request (5xx, 429, timeouts, refused or reset connections), as Google's.
const RETRIES: u32 = 5;
/// The metadata server's address, which `metadata.google.internal` resolves to on GCE.
const METADATA_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254));
/// The scope the Compute API's instance read needs.
const COMPUTE_READONLY: &str = "https://www.googleapis.com/auth/compute.readonly";

/// `/computeMetadata/v1/<suffix>`, retried with jittered backoff on transient failures; 404
/// and other statuses are errors.
async fn get(config: &PlatformConfig, suffix: &str, deadline: Instant) -> Result<String, Error> {
    let url = format!(
        "http://{}/computeMetadata/v1/{suffix}",
        config.endpoints.gcp
    );
    let req = Request::get(&url, &[("Metadata-Flavor", "Google")], TIMEOUT);
    let mut pause = Duration::from_millis(100);
    let mut attempt = 0;
    loop {
        let (error, transient) = match client::send(&req, deadline).await {
            Ok(a) if a.status == 200 => return Ok(a.text()),
            Ok(a) => {
                let transient = a.status >= 500 || a.status == 429;
                let error = Error::Status {
                    url: url.clone(),
                    status: a.status,
                };
                (error, transient)
            }
            Err(e) => {
                let transient = matches!(
                    e,
                    Error::Request {
                        transient: true,
                        ..
                    }
                );
                (e, transient)
            }
        };
        if !transient || attempt == RETRIES {
            return Err(error);
        }
        let nanos = u64::try_from(pause.as_nanos()).unwrap_or(u64::MAX).max(1);
        let pause_for = Duration::from_nanos(rand::random_range(1..=nanos));
        tokio::time::sleep_until(deadline.min(Instant::now() + pause_for)).await;
        pause = (pause * 2).min(Duration::from_secs(30));
        attempt += 1;
    }
}

/// [`get`], surrounding white space trimmed.
async fn get_trimmed(
    config: &PlatformConfig,
    suffix: &str,
    deadline: Instant,
) -> Result<String, Error> {
    get(config, suffix, deadline)
        .await
        .map(|s| s.trim().to_string())
}

/// The instance's zone from the metadata server (`projects/<n>/zones/<zone>`).
async fn metadata_zone(config: &PlatformConfig, deadline: Instant) -> Result<String, Error> {
    let zone = get_trimmed(config, "instance/zone", deadline).await?;
    Ok(zone.rsplit('/').next().unwrap_or_default().to_string())
}

/// Whether the metadata server answers as Google's at its address, or its name resolves to it.
/// The first probe to answer decides, unless the DMI product name is Google's: then a yes from
/// either is waited for, 5 s at most.
async fn on_gce(config: &PlatformConfig, deadline: Instant) -> bool {
    let e = &config.endpoints;
    if e.gcp_host_set {
        return true;
    }
    let product = tokio::fs::read_to_string(e.dmi_dir.join("product_name"))
        .await
        .unwrap_or_default();
    let hint = matches!(product.trim(), "Google" | "Google Compute Engine");
    let url = format!("http://{}", e.gcp);
    let mut probes: FuturesUnordered<futures::future::BoxFuture<'_, bool>> =
        FuturesUnordered::new();
    probes.push(Box::pin(async {
        let req = Request::get(&url, &[], TIMEOUT);
        client::send(&req, deadline).await.is_ok_and(|a| {
            a.headers
                .get("Metadata-Flavor")
                .is_some_and(|v| v == "Google")
        })
    }));
    probes.push(Box::pin(async {
        let lookup = tokio::net::lookup_host((e.gcp_dns_name.as_str(), 80));
        match tokio::time::timeout_at(deadline, lookup).await {
            Ok(Ok(mut addrs)) => addrs.any(|a| a.ip() == METADATA_IP),
            _ => false,
        }
    }));
    let first = probes.next().await.unwrap_or(false);
    if first || !hint {
        return first;
    }
    let wait = deadline.min(Instant::now() + Duration::from_secs(5));
    tokio::time::timeout_at(wait, probes.next())
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// Whether this is GCP: `GCP_METADATA` set, or on GCE. `Some(on_gce)` when it is.
pub(super) async fn detect(config: &PlatformConfig, deadline: Instant) -> Option<Option<bool>> {
    if !config.gcp_static.is_empty() {
        return Some(None);
    }
    on_gce(config, deadline).await.then_some(Some(true))
}

/// Whether a TCP connection to the metadata server opens (5 s), the check before its metadata
/// is asked for.
async fn reachable(config: &PlatformConfig, deadline: Instant) -> bool {
    let host = &config.endpoints.gcp;
    let addr = match host.parse::<http::uri::Authority>() {
        Ok(a) if a.port().is_some() => host.clone(),
        _ => format!("{host}:80"),
    };
    let connect = tokio::net::TcpStream::connect(addr.clone());
    match tokio::time::timeout_at(deadline.min(Instant::now() + TIMEOUT), connect).await {
        Ok(Ok(_)) => true,
        other => {
            tracing::warn!(addr = %addr, result = ?other.map(|r| r.map(|_| ())), "cannot reach the Google Instance metadata endpoint");
            false
        }
    }
}

/// The metadata: `GCP_METADATA`'s, else the metadata server's when on GCE and reachable.
async fn metadata(
    config: &PlatformConfig,
    on_gce: bool,
    deadline: Instant,
) -> BTreeMap<String, String> {
    if !config.gcp_static.is_empty() {
        return config.gcp_static.clone();
    }
    if !on_gce || !reachable(config, deadline).await {
        return BTreeMap::new();
    }
    let attribute = |name: &'static str| async move {
        get(config, &format!("instance/attributes/{name}"), deadline).await
    };
    let location = async {
        match attribute("cluster-location").await {
            Ok(l) => Ok(l),
            Err(_) => metadata_zone(config, deadline).await,
        }
    };
    let (project, number, location, cluster, name, id, template, created_by) = tokio::join!(
        get_trimmed(config, "project/project-id", deadline),
        get_trimmed(config, "project/numeric-project-id", deadline),
        location,
        attribute("cluster-name"),
        get_trimmed(config, "instance/name", deadline),
        get_trimmed(config, "instance/id", deadline),
        attribute("instance-template"),
        attribute("created-by"),
    );
    let mut md = BTreeMap::new();
    for (key, value) in [
        ("gcp_project", project),
        ("gcp_project_number", number),
        ("gcp_location", location),
        ("gcp_gke_cluster_name", cluster),
        ("gcp_gce_instance", name),
        ("gcp_gce_instance_id", id),
        ("gcp_gce_instance_template", template),
        ("gcp_gce_instance_created_by", created_by),
    ] {
        match value {
            Ok(v) => {
                md.insert(key.to_string(), v);
            }
            Err(e) => tracing::debug!(error = %e, key, "no GCP metadata"),
        }
    }
    if let (Some(p), Some(l), Some(c)) = (
        md.get("gcp_project"),
        md.get("gcp_location"),
        md.get("gcp_gke_cluster_name"),
    ) {
        let url = gke_cluster_url(p, l, c);
        md.insert("gcp_gke_cluster_url".into(), url);
    }
    md
}

/// The zone a GKE pod's resolv.conf names in its search list
/// (`<region>-<zone>.c.<project>.internal`).
fn zone_from_resolv_conf(text: &str) -> Option<String> {
    text.split('\n').find_map(search_line_zone)
}

/// The zone of one `search` line: the last search domain of the form
/// `<a>-<b>-<c>.c.<project>.internal`, `<a>-<b>-<c>` being the zone.
fn search_line_zone(line: &str) -> Option<String> {
    if !line.starts_with("search") {
        return None;
    }
    let spaces = line.bytes().enumerate().skip(6).filter(|(_, b)| *b == b' ');
    let spaces: Vec<usize> = spaces.map(|(i, _)| i).collect();
    spaces
        .into_iter()
        .rev()
        .find_map(|i| zone_at(&line[i + 1..]))
}

/// `s` starting with `<a>-<b>-<c>.c.<project>.internal` (none of a, b, c empty or holding a
/// dash; the project without a dot): `<a>-<b>-<c>`, the longest such.
fn zone_at(s: &str) -> Option<String> {
    let first = s.find('-').filter(|&i| i > 0)?;
    let second = first + 1 + s[first + 1..].find('-').filter(|&i| i > 0)?;
    let third = second + 1;
    let end = s[third..].find('-').map_or(s.len(), |i| third + i);
    (third + 1..=end)
        .rev()
        .filter(|&k| s.is_char_boundary(k))
        .find(|&k| {
            s[k..].strip_prefix(".c.").is_some_and(|rest| {
                rest.find('.')
                    .is_some_and(|dot| dot > 0 && rest[dot..].starts_with(".internal"))
            })
        })
        .map(|k| s[..k].to_string())
}

/// A zone's region: `<a>-<b>` of a zone `<a>-<b>-<c>`.
fn zone_to_region(zone: &str) -> Option<String> {
    let parts: Vec<&str> = zone.split('-').collect();
    match parts[..] {
        [a, b, c] if !a.is_empty() && !b.is_empty() && !c.is_empty() => Some(format!("{a}-{b}")),
        _ => None,
    }
}

/// The zone: `GCP_ZONE` (with `GCP_METADATA`), the resolv.conf search list, the metadata server.
async fn zone(config: &PlatformConfig, deadline: Instant) -> Option<String> {
    if let Some(z) = config.gcp_static.get("gcp_zone").filter(|z| !z.is_empty()) {
        return Some(z.clone());
    }
    let resolv = tokio::fs::read_to_string(&config.endpoints.resolv_conf)
        .await
        .unwrap_or_default();
    if let Some(z) = zone_from_resolv_conf(&resolv) {
        return Some(z);
    }
    let deadline = deadline.min(Instant::now() + ZONE_TIMEOUT);
    match metadata_zone(config, deadline).await {
        Ok(z) => Some(z),
        Err(e) => {
            tracing::warn!(error = %e, "Error fetching GCP zone from the metadata server");
            None
        }
    }
}

/// The instance's labels from the Compute API, read with the instance's service-account token
/// (5 s in all).
async fn labels(
    config: &PlatformConfig,
    md: &BTreeMap<String, String>,
    deadline: Instant,
) -> BTreeMap<String, String> {
    let deadline = deadline.min(Instant::now() + TIMEOUT);
    let key = |k: &str| md.get(k).map(String::as_str).unwrap_or_default();
    let (project, location, instance) = (
        key("gcp_project"),
        key("gcp_location"),
        key("gcp_gce_instance"),
    );
    let scope =
        url::form_urlencoded::byte_serialize(COMPUTE_READONLY.as_bytes()).collect::<String>();
    let token = match get(
        config,
        &format!("instance/service-accounts/default/token?scopes={scope}"),
        deadline,
    )
    .await
    {
        Ok(t) => serde_json::from_str::<Value>(&t)
            .ok()
            .and_then(|v| v["access_token"].as_str().map(str::to_string)),
        Err(e) => {
            tracing::warn!(error = %e, "failed to find default credentials");
            None
        }
    };
    let Some(token) = token else {
        return BTreeMap::new();
    };
    let url = format!(
        "{}/compute/v1/projects/{project}/zones/{location}/instances/{instance}",
        config.endpoints.gcp_compute
    );
    let bearer = format!("Bearer {token}");
    let headers = [("Authorization", bearer.as_str())];
    let req = Request::get(&url, &headers, TIMEOUT);
    match client::send(&req, deadline).await {
        Ok(a) => serde_json::from_slice::<Value>(&a.body)
            .ok()
            .and_then(|v| serde_json::from_value(v["labels"].clone()).ok())
            .unwrap_or_default(),
        Err(e) => {
            tracing::warn!(error = %e, "unable to retrieve instance labels");
            BTreeMap::new()
        }
    }
}

/// GCP's metadata, locality and (outside Kubernetes) instance labels. `on_gce`: what
/// [`detect`] found, if it looked.
pub(super) async fn platform(
    config: &PlatformConfig,
    on_gce: Option<bool>,
    deadline: Instant,
) -> Platform {
    let on_gce = async {
        match on_gce {
            Some(known) => known,
            None if config.gcp_static.is_empty() => self::on_gce(config, deadline).await,
            None => false,
        }
    };
    let metadata = async { metadata(config, on_gce.await, deadline).await };
    let (metadata, zone) = tokio::join!(metadata, zone(config, deadline));
    let locality = match zone.as_deref().map(|z| (z, zone_to_region(z))) {
        Some((z, Some(region))) => Locality {
            region,
            zone: z.to_string(),
        },
        Some((z, None)) => {
            tracing::warn!(zone = %z, "Error fetching GCP region from zone");
            Locality::default()
        }
        None => Locality::default(),
    };
    let kubernetes = config.kubernetes
        || metadata
            .get("gcp_gke_cluster_name")
            .is_some_and(|c| !c.is_empty());
    let labels = if kubernetes {
        BTreeMap::new()
    } else {
        labels(config, &metadata, deadline).await
    };
    Platform {
        cloud: Some(Cloud::Gcp),
        metadata,
        locality,
        labels,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Istio's cases of the resolv.conf zone (`TestZoneFromResolvConfData`) and of the region.
    #[test]
    fn zone_from_the_search_list_and_region_from_the_zone() {
        let cases = [
            (
                "domain us-central1-c.c.test-proj.internal\nsearch us-central1-c.c.test-proj.internal. c.test-proj.internal. google.internal.\nnameserver 8.8.8.8\n",
                Some("us-central1-c"),
            ),
            (
                "search httpbin.svc.cluster.local svc.cluster.local cluster.local us-central1-f.c.test-proj.internal c.test-proj.internal google.internal\nnameserver 34.118.224.10\noptions ndots:5",
                Some("us-central1-f"),
            ),
            (
                "nameserver 34.118.224.10\noptions ndots:5\nsearch httpbin.svc.cluster.local svc.cluster.local cluster.local us-central1-f.c.test-proj.internal",
                Some("us-central1-f"),
            ),
            (
                "nameserver 34.118.224.10\noptions ndots:5\nsearch httpbin.svc.cluster.local svc.cluster.local cluster.local us-central1-f.c.test-proj.internal ",
                Some("us-central1-f"),
            ),
            (
                "nameserver 34.118.224.10\noptions ndots:5\nsearch httpbin.svc.cluster.local svc.cluster.local cluster.local\ndomain us-central1-f.c.test-proj.internal ",
                None,
            ),
            ("search a-b.c.p.internal", None),
            (
                "searchx europe-west1-b.c.p.internal",
                Some("europe-west1-b"),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(zone_from_resolv_conf(text).as_deref(), want, "{text:?}");
        }
        assert_eq!(
            zone_to_region("us-central1-f").as_deref(),
            Some("us-central1")
        );
        assert_eq!(zone_to_region("us-central1"), None);
        assert_eq!(zone_to_region("abcd"), None);
        assert_eq!(zone_to_region("a--c"), None);
    }
}
