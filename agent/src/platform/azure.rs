//! Azure: a machine whose DMI vendor is "Microsoft Corporation" is on Azure (no request); the
//! instance metadata service (`/metadata/instance`, header `Metadata: true`) is asked for its
//! newest API version, then for the instance document of that version (at least 2019-08-15).
//! It gives `azure_name`, `azure_location`, `azure_vmId` and each tag as `azure_<tag>`, and the
//! locality (location, zone). Each request has Istio's 5 s.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::time::Instant;

use super::client::{self, Request};
use super::{Cloud, Locality, Platform};
use crate::config::PlatformConfig;

/// Istio's timeout for each request.
const TIMEOUT: Duration = Duration::from_secs(5);
/// The API version asked for unless the service names a newer one.
const DEFAULT_API_VERSION: &str = "2019-08-15";
const VENDOR: &str = "Microsoft Corporation";
/// Istio's prefix of every key.
const PREFIX: &str = "azure_";

/// Whether the machine's vendor is Microsoft.
pub(super) async fn detect(config: &PlatformConfig) -> bool {
    let path = config.endpoints.dmi_dir.join("sys_vendor");
    match tokio::fs::read_to_string(&path).await {
        Ok(vendor) => vendor.contains(VENDOR),
        Err(e) => {
            tracing::debug!(error = %e, path = %path.display(), "no DMI vendor");
            false
        }
    }
}

/// `/metadata/instance?<query>` as a JSON object; an empty one when there is no answer or it
/// is not JSON (the status is not looked at: the version list comes with a 400).
async fn instance(config: &PlatformConfig, query: &str, deadline: Instant) -> Map<String, Value> {
    let url = format!(
        "http://{}/metadata/instance?{query}",
        config.endpoints.azure
    );
    let req = Request::get(&url, &[("Metadata", "true")], TIMEOUT);
    match client::send(&req, deadline).await {
        Ok(a) => match serde_json::from_slice::<Value>(&a.body) {
            Ok(Value::Object(m)) => m,
            _ => {
                tracing::warn!(url = %url, "Azure metadata is not a JSON object");
                Map::new()
            }
        },
        Err(e) => {
            tracing::debug!(error = %e, "no Azure metadata");
            Map::new()
        }
    }
}

/// The newest version `versions` (the service's answer without a version) names, if newer
/// than the default.
fn api_version(versions: &Map<String, Value>) -> String {
    let newest = versions
        .get("newest-versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .max();
    match newest {
        Some(v) if v > DEFAULT_API_VERSION => v.to_string(),
        _ => DEFAULT_API_VERSION.to_string(),
    }
}

/// The instance's tags as `azure_<name>`: `tagsList` when there is one, else `tags`
/// (`name:value;name2:value2`; a name without `:` has an empty value).
fn tags(compute: &Map<String, Value>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(list) = compute.get("tagsList") {
        // A list that is not one of {name, value} strings gives no tags, and no fallback.
        let text = |tag: &Value, k: &str| match tag.get(k) {
            None | Some(Value::Null) => Some(String::new()),
            Some(v) => v.as_str().map(str::to_string),
        };
        let parsed: Option<Vec<(String, String)>> = list.as_array().and_then(|l| {
            l.iter()
                .map(|tag| {
                    tag.as_object()?;
                    Some((text(tag, "name")?, text(tag, "value")?))
                })
                .collect()
        });
        for (name, value) in parsed.unwrap_or_default() {
            out.insert(format!("{PREFIX}{name}"), value);
        }
        return out;
    }
    let tags = compute
        .get("tags")
        .and_then(Value::as_str)
        .unwrap_or_default();
    for tag in tags.split(';').filter(|_| !tags.is_empty()) {
        let (name, value) = tag.split_once(':').unwrap_or((tag, ""));
        out.insert(format!("{PREFIX}{name}"), value.to_string());
    }
    out
}

/// Azure's metadata and locality from the instance document's `compute` object.
pub(super) fn from_document(document: &Map<String, Value>) -> Platform {
    let empty = Map::new();
    let compute = document
        .get("compute")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let field = |k: &str| -> String {
        compute
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let mut metadata = BTreeMap::new();
    for (key, value) in [
        ("name", field("name")),
        ("location", field("location")),
        ("vmId", field("vmId")),
    ] {
        if !value.is_empty() {
            metadata.insert(format!("{PREFIX}{key}"), value);
        }
    }
    metadata.extend(tags(compute));
    Platform {
        cloud: Some(Cloud::Azure),
        metadata,
        locality: Locality {
            region: field("location"),
            zone: field("zone"),
        },
        labels: BTreeMap::new(),
    }
}

/// Azure's metadata and locality.
pub(super) async fn platform(config: &PlatformConfig, deadline: Instant) -> Platform {
    let versions = instance(config, "", deadline).await;
    let version = api_version(&versions);
    let document = instance(config, &format!("api-version={version}"), deadline).await;
    from_document(&document)
}
