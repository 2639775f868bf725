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
    /// `DRAIN_FOLLOWS_APP` (not in Istio; on by default): a sidecar SIGTERMed without an
    /// earlier `/drain` keeps Envoy serving while the app's captured outbound connections are
    /// open, and stops it once none has been open for `terminationDrainDuration`
    /// (`agent/src/envoy/follow.rs`). `false` is Istio's fixed `terminationDrainDuration`;
    /// `EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true` keeps Istio's wait for zero connections.
    pub drain_follows_app: bool,
    /// `ISTIO_BOOTSTRAP_OVERRIDE`: a file merged over the generated bootstrap.
    pub bootstrap_override: String,
    /// `ENVOY_SKIP_DEPRECATED_LOGS` (true).
    pub skip_deprecated_logs: bool,
    /// `ISTIO_ENVOY_ENABLE_CORE_DUMP`.
    pub enable_core_dump: bool,
    /// `PROXY_LIFECYCLE_LOCKDOWN=true` (not in Istio; off by default): Envoy's admin API moves
    /// from TCP `proxyAdminPort` to a Unix socket (mode 0600) in the proxy's directory, and the
    /// status server's `/quitquitquit` and `/drain` answer only the proxy's uids and root.
    pub lifecycle_lockdown: bool,
    /// `ENVOY_MEMORY_OVERLOAD=true` (not in Istio; off by default): Envoy's heap bound from the
    /// container's memory limit, with an overload manager that shrinks the heap near it and
    /// stops accepting connections at it.
    pub heap_limit: Option<HeapLimit>,
    /// The environment the agent was started with, passed on to Envoy's process as it is (never
    /// read for settings, never dumped), plus `GRPC_SSL_CIPHER_SUITES` under a FIPS policy.
    #[serde(skip)]
    pub env: HashMap<String, String>,
}

/// Envoy's heap bound, worked out from the container's memory limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct HeapLimit {
    /// The container's memory limit, in bytes.
    pub container_bytes: u64,
    /// Where it came from: `cgroup` (`memory.max` / `memory.limit_in_bytes`), or `GOMEMLIMIT`
    /// (Istio's injection template sets it to the container's `limits.memory`).
    pub source: &'static str,
    /// Envoy's share ([`HEAP_SHARE_PERCENT`] of the limit; the rest is the agent's, and Envoy's
    /// code and stacks): the fixed-heap monitor's `max_heap_size_bytes`.
    pub max_heap_bytes: u64,
}

/// Envoy's heap share of the container's memory limit, in percent.
pub const HEAP_SHARE_PERCENT: u64 = 85;

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
    /// The memory limit of the agent's cgroup, when it has one.
    pub cgroup_memory_limit: Option<u64>,
    /// `COMPLIANCE_POLICY`: under the FIPS policies Envoy's Google gRPC clients get
    /// `GRPC_SSL_CIPHER_SUITES` (set over the agent's own value, as Istio's agent does).
    pub compliance: sds::Compliance,
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
        drain_follows_app: env.bool("DRAIN_FOLLOWS_APP", true)?,
        bootstrap_override: env.str("ISTIO_BOOTSTRAP_OVERRIDE", ""),
        skip_deprecated_logs: env.bool("ENVOY_SKIP_DEPRECATED_LOGS", true)?,
        enable_core_dump: env.bool("ISTIO_ENVOY_ENABLE_CORE_DUMP", false)?,
        lifecycle_lockdown: env.bool("PROXY_LIFECYCLE_LOCKDOWN", false)?,
        heap_limit: if env.bool("ENVOY_MEMORY_OVERLOAD", false)? {
            heap_limit(env, i.cgroup_memory_limit)?
        } else {
            None
        },
        env: {
            let mut envoy_env = env.vars().clone();
            if let Some((k, v)) = i.compliance.envoy_env() {
                envoy_env.insert(k.to_string(), v.to_string());
            }
            envoy_env
        },
    })
}

/// `DNS_PROXY_ADDR` names port 53 (Istio's test for "the agent serves DNS as root").
pub fn serves_dns_on_53(env: Env<'_>) -> bool {
    env.get("DNS_PROXY_ADDR")
        .is_some_and(|a| a.ends_with(":53"))
}

/// The heap bound: the cgroup's limit, else `GOMEMLIMIT`; none when neither sets one (the
/// overload manager is then left out, with a warning).
fn heap_limit(env: Env<'_>, cgroup: Option<u64>) -> Result<Option<HeapLimit>, Error> {
    let from_env = match env.get("GOMEMLIMIT") {
        None => None,
        Some(v) => parse_go_memlimit(v).ok_or_else(|| {
            env.invalid(
                "GOMEMLIMIT",
                v,
                "a byte count, optionally with a B, KiB, MiB, GiB or TiB suffix, or off",
            )
        })?,
    };
    let (container_bytes, source) = match (cgroup, from_env) {
        (Some(b), _) => (b, "cgroup"),
        (None, Some(b)) => (b, "GOMEMLIMIT"),
        (None, None) => {
            tracing::warn!(
                "ENVOY_MEMORY_OVERLOAD is set but the container has no memory limit \
                 (no cgroup limit, no GOMEMLIMIT): Envoy's heap is not bounded"
            );
            return Ok(None);
        }
    };
    Ok(Some(HeapLimit {
        container_bytes,
        source,
        max_heap_bytes: container_bytes / 100 * HEAP_SHARE_PERCENT,
    }))
}

/// Go's `GOMEMLIMIT` syntax: bytes with an optional IEC suffix; `off` is no limit (`Some(None)`).
fn parse_go_memlimit(v: &str) -> Option<Option<u64>> {
    if v == "off" {
        return Some(None);
    }
    let (digits, unit) = match v.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => v.split_at(i),
        None => (v, ""),
    };
    let shift = match unit {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        "TiB" => 40,
        _ => return None,
    };
    let n: u64 = digits.parse().ok()?;
    n.checked_mul(1 << shift).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_memlimit_syntax() {
        assert_eq!(parse_go_memlimit("268435456"), Some(Some(256 << 20)));
        assert_eq!(parse_go_memlimit("512MiB"), Some(Some(512 << 20)));
        assert_eq!(parse_go_memlimit("2GiB"), Some(Some(2 << 30)));
        assert_eq!(parse_go_memlimit("off"), Some(None));
        assert_eq!(parse_go_memlimit("512M"), None);
        assert_eq!(parse_go_memlimit("-1"), None);
        assert_eq!(parse_go_memlimit("99999999999999999999"), None);
    }
}
