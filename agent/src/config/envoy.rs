//! Envoy's process and lifecycle: whether the agent launches it, as whom, its admin-side ports,
//! and how it drains.

use std::collections::HashMap;
use std::time::Duration;

use super::{Error, ProxyFlags, env::Env};

/// How the agent runs Envoy.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EnvoyConfig {
    /// `DISABLE_ENVOY` (proxyless gRPC): no Envoy, certificates go to `OUTPUT_CERTS`.
    pub disabled: bool,
    /// `--external-envoy` or `ISTIO_AGENT_EXTERNAL_ENVOY`: Envoy runs, but someone else starts it.
    pub external: bool,
    /// Envoy runs as the proxy user (1337) because the agent runs as root to serve DNS on
    /// `:53` (Istio's `AgentIsRoot`).
    pub run_as_proxy_user: bool,
    /// `ENVOY_STATUS_PORT` (15021).
    pub status_port: u16,
    /// `ENVOY_PROMETHEUS_PORT` (15090).
    pub prometheus_port: u16,
    /// `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`.
    pub exit_on_zero_active_connections: bool,
    /// `MINIMUM_DRAIN_DURATION` (5 s).
    pub minimum_drain_duration: Duration,
    /// `ISTIO_BOOTSTRAP_OVERRIDE`: a file merged over the generated bootstrap.
    pub bootstrap_override: String,
    /// `ENVOY_SKIP_DEPRECATED_LOGS` (true).
    pub skip_deprecated_logs: bool,
    /// `ISTIO_ENVOY_ENABLE_CORE_DUMP`.
    pub enable_core_dump: bool,
    /// The environment the agent was started with, passed on to Envoy's process as it is (never
    /// read for settings, never dumped).
    #[serde(skip)]
    pub env: HashMap<String, String>,
}

impl EnvoyConfig {
    /// Whether the agent launches Envoy itself.
    pub fn launched(&self) -> bool {
        !self.disabled && !self.external
    }
}

/// What Envoy's settings depend on besides the environment.
pub struct Inputs<'a> {
    pub env: Env<'a>,
    pub flags: &'a ProxyFlags,
    /// The agent's effective uid is 0.
    pub is_root: bool,
}

pub fn load(i: Inputs<'_>) -> Result<EnvoyConfig, Error> {
    let env = i.env;
    Ok(EnvoyConfig {
        disabled: env.bool("DISABLE_ENVOY", false)?,
        external: i.flags.external_envoy || env.bool("ISTIO_AGENT_EXTERNAL_ENVOY", false)?,
        run_as_proxy_user: i.is_root && serves_dns_on_53(env),
        status_port: env.port("ENVOY_STATUS_PORT", 15021)?,
        prometheus_port: env.port("ENVOY_PROMETHEUS_PORT", 15090)?,
        exit_on_zero_active_connections: env.bool("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", false)?,
        minimum_drain_duration: env.duration(
            "MINIMUM_DRAIN_DURATION",
            Duration::from_secs(5),
            Duration::ZERO,
        )?,
        bootstrap_override: env.str("ISTIO_BOOTSTRAP_OVERRIDE", ""),
        skip_deprecated_logs: env.bool("ENVOY_SKIP_DEPRECATED_LOGS", true)?,
        enable_core_dump: env.bool("ISTIO_ENVOY_ENABLE_CORE_DUMP", false)?,
        env: env.0.clone(),
    })
}

/// `DNS_PROXY_ADDR` names port 53 (Istio's test for "the agent serves DNS as root").
pub fn serves_dns_on_53(env: Env<'_>) -> bool {
    env.get("DNS_PROXY_ADDR")
        .is_some_and(|a| a.ends_with(":53"))
}
