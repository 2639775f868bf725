//! What the status server probes, as configuration: the app's rewritten probes
//! (`ISTIO_KUBE_APP_PROBERS`), the workload health probe (`ProxyConfig.readinessProbe`), the
//! app-metrics targets (`ISTIO_PROMETHEUS_ANNOTATIONS`) and where probes go. The status
//! server runs them.
//!
//! - `parse`: the three inputs decoded as Istio's Go agent decodes them (`gojson`: Go's
//!   case-insensitive JSON decoding).

mod gojson;
mod parse;

pub use parse::{Error, parse_probers, parse_prometheus_annotations, parse_readiness_probe};

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

/// Probes by status-server path (`/app-health/<c>/readyz`, ...).
pub type AppProbers = BTreeMap<String, AppProbe>;

/// One rewritten probe.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AppProbe {
    pub action: ProbeAction,
    /// 0: no timeout (lifecycle hooks).
    pub timeout: Duration,
}

/// What the probe does.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub enum ProbeAction {
    Http {
        path: String,
        port: u16,
        /// Parsed but not used by app probes (Istio probes the pod IP); the `Host` header the
        /// kubelet sends is forwarded instead.
        host: String,
        https: bool,
        /// Used by the VM health probe only: for app probes the kubelet sends these headers
        /// to the status port, and the status server forwards what it received.
        headers: Vec<(String, String)>,
    },
    Tcp {
        port: u16,
        host: String,
    },
    Grpc {
        port: u16,
        service: String,
    },
    /// A command run by the agent (a VM's `readinessProbe`, as Istio's `ExecProber`): healthy
    /// when it exits 0 within the timeout.
    Exec {
        command: Vec<String>,
    },
}

/// `ProxyConfig.readinessProbe` (VMs): the probe plus its schedule.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReadinessProbe {
    pub probe: AppProbe,
    pub initial_delay: Duration,
    pub period: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

/// Where app metrics are scraped from (`ISTIO_PROMETHEUS_ANNOTATIONS`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PrometheusAnnotations {
    /// `(port, path)` per target.
    pub targets: Vec<(u16, String)>,
}

/// Where rewritten app probes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// The pod IP (`INSTANCE_IP`; the loopback address when unknown).
    Ip(IpAddr),
    /// The name `localhost` (`REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION`), as Istio's agent
    /// dials it: resolved for each probe and its addresses tried in order, and `localhost:<port>`
    /// the probe's `Host` / `:authority` and TLS server name.
    Localhost,
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Destination::Ip(ip) => ip.fmt(f),
            Destination::Localhost => f.write_str("localhost"),
        }
    }
}

impl std::str::FromStr for Destination {
    type Err = std::net::AddrParseError;

    /// `localhost`, or an IP address.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "localhost" {
            return Ok(Destination::Localhost);
        }
        s.parse().map(Destination::Ip)
    }
}
