//! AWS: the EC2 instance metadata service (IMDS). An IMDSv2 session token first (`PUT
//! /latest/api/token`), else IMDSv1 without one, as Istio (discovery asks IMDSv1 alongside a
//! token that is late, [`detect`]); an instance whose IAM info names an `arn:aws:iam` role is
//! on AWS. It gives `aws_region`, `aws_availability_zone` and
//! `aws_instance_id`, and the locality (region, availability zone). Each request has Istio's
//! 100 ms.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::client::{self, Request};
use super::{Cloud, Locality, Platform};
use crate::config::PlatformConfig;

/// Istio's timeout for each request to the IMDS.
const TIMEOUT: Duration = Duration::from_millis(100);
/// How long discovery waits for the token before asking IMDSv1 as well.
const IMDSV1_AFTER: Duration = Duration::from_millis(10);
/// The IMDSv2 token's header, and the lifetime asked for it (Istio's 60 s).
const TOKEN_HEADER: &str = "X-aws-ec2-metadata-token";
const TOKEN_TTL_HEADER: &str = "X-aws-ec2-metadata-token-ttl-seconds";

/// An IMDSv2 token; `None` when the service gave none (IMDSv1 then).
async fn token(host: &str, deadline: Instant) -> Option<String> {
    let url = format!("http://{host}/latest/api/token");
    let req = Request {
        method: http::Method::PUT,
        url: &url,
        headers: &[(TOKEN_TTL_HEADER, "60")],
        timeout: TIMEOUT,
    };
    match client::ok(&req, deadline).await {
        Ok(a) => Some(a.text()).filter(|t| !t.is_empty()),
        Err(e) => {
            tracing::debug!(error = %e, "no IMDSv2 token: IMDSv1");
            None
        }
    }
}

/// `/latest/meta-data/<path>`, with the token when there is one.
async fn get(host: &str, path: &str, token: Option<&str>, deadline: Instant) -> Option<String> {
    let url = format!("http://{host}/latest/meta-data/{path}");
    let with_token;
    let headers: &[(&str, &str)] = match token {
        Some(t) => {
            with_token = [(TOKEN_HEADER, t)];
            &with_token
        }
        None => &[],
    };
    match client::ok(&Request::get(&url, headers, TIMEOUT), deadline).await {
        Ok(a) => Some(a.text()),
        Err(e) => {
            tracing::debug!(error = %e, "no AWS metadata");
            None
        }
    }
}

/// Whether the IAM info (`iam/info`) names an IAM role: the instance is on AWS.
fn is_aws(info: &str) -> bool {
    info.contains("arn:aws:iam")
}

/// The IAM info read with `token` (none: IMDSv1); `Some(token)` when it says AWS.
async fn identify(host: &str, token: Option<String>, deadline: Instant) -> Option<Option<String>> {
    let info = get(host, "iam/info", token.as_deref(), deadline).await?;
    is_aws(&info).then_some(token)
}

/// Whether the instance is on AWS; if so, the token it was asked with (for the metadata).
/// As Istio: an IMDSv2 token, else IMDSv1. An IMDS answers the token at once; when it has not
/// within [`IMDSV1_AFTER`] (an address that never answers, or a hop limit the answer cannot
/// cross), IMDSv1 is asked meanwhile instead of after the token's 100 ms, so a silent address
/// costs one timeout, not two.
pub(super) async fn detect(config: &PlatformConfig, deadline: Instant) -> Option<Option<String>> {
    let host = &config.endpoints.aws;
    let token = token(host, deadline);
    tokio::pin!(token);
    tokio::select! {
        t = &mut token => return identify(host, t, deadline).await,
        _ = tokio::time::sleep(IMDSV1_AFTER) => {}
    }
    let (token, v1) = tokio::join!(token, get(host, "iam/info", None, deadline));
    if v1.as_deref().is_some_and(is_aws) {
        return Some(token);
    }
    match token {
        Some(t) => identify(host, Some(t), deadline).await,
        None => None,
    }
}

/// AWS's metadata and locality. `token`: the one [`detect`] used (none: ask for one).
pub(super) async fn platform(
    config: &PlatformConfig,
    token: Option<Option<String>>,
    deadline: Instant,
) -> Platform {
    let host = &config.endpoints.aws;
    let token = match token {
        Some(t) => t,
        None => self::token(host, deadline).await,
    };
    let token = token.as_deref();
    let (region, zone, instance) = tokio::join!(
        get(host, "placement/region", token, deadline),
        get(host, "placement/availability-zone", token, deadline),
        get(host, "instance-id", token, deadline),
    );
    let (region, zone, instance) = (
        region.unwrap_or_default(),
        zone.unwrap_or_default(),
        instance.unwrap_or_default(),
    );
    let mut metadata = BTreeMap::new();
    for (key, value) in [
        ("aws_availability_zone", &zone),
        ("aws_region", &region),
        ("aws_instance_id", &instance),
    ] {
        if !value.is_empty() {
            metadata.insert(key.to_string(), value.clone());
        }
    }
    Platform {
        cloud: Some(Cloud::Aws),
        metadata,
        locality: Locality { region, zone },
        labels: BTreeMap::new(),
    }
}
