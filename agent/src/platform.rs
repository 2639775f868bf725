//! The cloud platform the proxy runs on, as Istio's agent finds it: named by `CLOUD_PLATFORM`,
//! else discovered by asking AWS's, Google's and Azure's metadata servers at once. What it
//! finds reaches the bootstrap's node: `PLATFORM_METADATA`, the locality when no pod label
//! gives one, and a GCE instance's labels when it runs outside Kubernetes (the bootstrap's
//! node metadata takes them).
//!
//! The agent starts the search ([`Pending::start`]) before it binds its listeners and waits for
//! it only where a bootstrap is written; the whole search is bounded ([`BOUND`]), each request
//! by its own timeout as in Istio (AWS 100 ms, Azure and Google 5 s). Without a route to a
//! metadata server every request fails at once, so nothing is waited for.
//!
//! Parts: [`aws`], [`azure`] and [`gcp`], one per cloud; `client` their one HTTP client.

mod aws;
mod azure;
mod client;
mod gcp;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use crate::config::{CloudPlatform, PlatformConfig};

/// How long the platform may take in all, discovery and metadata alike (Istio's bound on
/// discovery).
pub const BOUND: Duration = Duration::from_secs(5);
/// Past the bound, what is still running is cut without its answers.
const SLACK: Duration = Duration::from_millis(50);

/// A request to a metadata server that failed (logged at debug: off a cloud, they all fail).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No answer. `transient`: a timeout, a refused or reset connection, an answer cut short
    /// (what Google's client retries).
    #[error("{url}: {reason}")]
    Request {
        url: String,
        reason: String,
        transient: bool,
    },
    #[error("{url}: HTTP status {status}")]
    Status { url: String, status: u16 },
}

/// The cloud found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cloud {
    Aws,
    Azure,
    Gcp,
}

impl Cloud {
    pub fn as_str(self) -> &'static str {
        match self {
            Cloud::Aws => "aws",
            Cloud::Azure => "azure",
            Cloud::Gcp => "gcp",
        }
    }
}

/// The platform's locality (clouds have no sub-zone).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Locality {
    pub region: String,
    pub zone: String,
}

/// What the platform tells the bootstrap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Platform {
    /// `None`: no platform (`CLOUD_PLATFORM=none`, or none found).
    pub cloud: Option<Cloud>,
    /// `PLATFORM_METADATA` (`aws_region`, `gcp_project`, `azure_name`, ...).
    pub metadata: BTreeMap<String, String>,
    /// Used when no pod label names a locality.
    pub locality: Locality,
    /// The instance's labels, added to the static labels; only a GCE instance outside
    /// Kubernetes has them (as Istio).
    pub labels: BTreeMap<String, String>,
}

impl Platform {
    /// No platform: nothing added.
    pub fn none() -> Platform {
        Platform::default()
    }
}

/// The platform `config` names, or the one discovered, within `bound`.
pub async fn discover(config: &PlatformConfig, bound: Duration) -> Platform {
    let started = Instant::now();
    let deadline = started + bound;
    let search = async {
        match config.cloud {
            CloudPlatform::None => Platform::none(),
            CloudPlatform::Aws => aws::platform(config, None, deadline).await,
            CloudPlatform::Azure => azure::platform(config, deadline).await,
            CloudPlatform::Gcp => gcp::platform(config, None, deadline).await,
            CloudPlatform::Discover => detect(config, deadline).await,
        }
    };
    // Every request, retry and wait ends by the deadline, so what answered by then is kept;
    // this is the net under them.
    let platform = match tokio::time::timeout_at(deadline + SLACK, search).await {
        Ok(p) => p,
        Err(_) => {
            tracing::info!(
                bound = ?bound,
                "timed out waiting for platform detection, treating it as unknown"
            );
            Platform::none()
        }
    };
    tracing::info!(
        platform = platform.cloud.map_or("none", Cloud::as_str),
        elapsed = ?started.elapsed(),
        metadata = ?platform.metadata,
        region = %platform.locality.region,
        zone = %platform.locality.zone,
        "cloud platform"
    );
    platform
}

/// What a cloud's detection learnt that its metadata requests reuse.
enum Detected {
    /// AWS, with the IMDSv2 token it was found with (none: IMDSv1).
    Aws(Option<String>),
    Azure,
    /// GCP, and whether a metadata server answered (`None`: `GCP_METADATA` named it, none was
    /// asked).
    Gcp(Option<bool>),
}

/// Asks each cloud at once; the first that answers is the platform.
async fn detect(config: &PlatformConfig, deadline: Instant) -> Platform {
    let mut probes: FuturesUnordered<BoxFuture<'_, Option<Detected>>> = FuturesUnordered::new();
    probes.push(Box::pin(async {
        aws::detect(config, deadline).await.map(Detected::Aws)
    }));
    probes.push(Box::pin(async {
        gcp::detect(config, deadline).await.map(Detected::Gcp)
    }));
    probes.push(Box::pin(async {
        azure::detect(config).await.then_some(Detected::Azure)
    }));
    while let Some(found) = probes.next().await {
        let Some(found) = found else { continue };
        drop(probes);
        return match found {
            Detected::Aws(token) => {
                tracing::info!("platform detected is AWS");
                aws::platform(config, Some(token), deadline).await
            }
            Detected::Azure => {
                tracing::info!("platform detected is Azure");
                azure::platform(config, deadline).await
            }
            Detected::Gcp(on_gce) => {
                tracing::info!("platform detected is GCP");
                gcp::platform(config, on_gce, deadline).await
            }
        };
    }
    Platform::none()
}

/// The platform being found, started once and awaited by whoever writes a bootstrap.
#[derive(Clone)]
pub struct Pending(Shared<BoxFuture<'static, Arc<Platform>>>);

impl Pending {
    /// Starts the search on the runtime (within [`BOUND`]).
    pub fn start(config: PlatformConfig) -> Pending {
        let task = tokio::spawn(async move { discover(&config, BOUND).await });
        Pending(
            async move { Arc::new(task.await.unwrap_or_default()) }
                .boxed()
                .shared(),
        )
    }

    /// The platform, once found.
    pub async fn get(&self) -> Arc<Platform> {
        self.0.clone().await
    }
}

#[cfg(test)]
pub(crate) mod standin;
#[cfg(test)]
mod tests;
