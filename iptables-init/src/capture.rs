//! Istio's sidecar capture: the phases of Istio's `Run` (tools/istio-iptables/pkg/capture/run.go,
//! and its twin in istio-nftables), in Istio's order, which both rule sets follow: iptables
//! (`capture/iptables.rs`, into a [`RuleBuilder`]) and nftables (`nft/capture.rs`). The order of
//! the rules is pinned byte for byte by the conformance goldens.

mod iptables;

use crate::builder::RuleBuilder;
use crate::config::{Config, InterceptionMode};

pub const ISTIO_OUTPUT: &str = "ISTIO_OUTPUT";
pub const ISTIO_OUTPUT_DNS: &str = "ISTIO_OUTPUT_DNS";
pub const ISTIO_INBOUND: &str = "ISTIO_INBOUND";
pub const ISTIO_DIVERT: &str = "ISTIO_DIVERT";
pub const ISTIO_TPROXY: &str = "ISTIO_TPROXY";
pub const ISTIO_REDIRECT: &str = "ISTIO_REDIRECT";
pub const ISTIO_IN_REDIRECT: &str = "ISTIO_IN_REDIRECT";
pub const ISTIO_DROP: &str = "ISTIO_DROP";

/// Mark on packets from the proxy to the app in TPROXY mode.
pub const OUTBOUND_MARK: &str = "1338";
/// The agent's DNS listener.
pub const DNS_PORT: &str = "15053";

/// What `Run` works out before its first rule.
pub(crate) struct Plan<'a> {
    pub(crate) cfg: &'a Config,
    pub(crate) tproxy: bool,
    /// `REDIRECT_DNS`, unless there is nothing to capture (no `CAPTURE_ALL_DNS`, no
    /// nameserver).
    pub(crate) redirect_dns: bool,
    /// A loopback range is among the included outbound ranges: app-to-app traffic over `lo`
    /// is captured too.
    pub(crate) loopback_included: bool,
}

impl<'a> Plan<'a> {
    pub(crate) fn new(cfg: &'a Config) -> Plan<'a> {
        let mut redirect_dns = cfg.redirect_dns;
        if redirect_dns
            && !cfg.capture_all_dns
            && cfg.dns_servers_v4.is_empty()
            && cfg.dns_servers_v6.is_empty()
        {
            tracing::warn!(
                "REDIRECT_DNS is set, but CAPTURE_ALL_DNS is false, and no DNS servers provided. DNS capture disabled."
            );
            redirect_dns = false;
        }
        Plan {
            cfg,
            tproxy: cfg.inbound_interception_mode == InterceptionMode::Tproxy,
            redirect_dns,
            loopback_included: cfg.outbound_ip_ranges_include.has_loopback(),
        }
    }

    /// The proxy's owner match (`uid`, `gid`) with its ids, users first.
    pub(crate) fn owners(&self) -> [(Owner, &'a [String]); 2] {
        [
            (Owner::Uid, &self.cfg.proxy_uids),
            (Owner::Gid, &self.cfg.proxy_gids),
        ]
    }
}

/// Whose traffic an owner match selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    Uid,
    Gid,
}

/// The phases of Istio's capture, named as Istio's `Run` names them (or, where it has no
/// helper, as its comment there says); [`run`] calls them in Istio's order.
pub(crate) trait Phases {
    /// Excluded interfaces: never captured (also in mangle with TPROXY).
    fn short_circuit_exclude_interfaces(&mut self, p: &Plan);
    /// Virtual interfaces (`-k`): their inbound traffic is not captured.
    fn short_circuit_kube_internal_interface(&mut self, p: &Plan);
    /// `--drop-invalid`: out-of-window packets are dropped, not reset.
    fn drop_invalid(&mut self, p: &Plan);
    /// The tunnel port's return and the two redirect chains (outbound, inbound).
    fn redirect_chains(&mut self, p: &Plan);
    fn handle_inbound_ports_include(&mut self, p: &Plan);
    /// The jump from OUTPUT, the excluded outbound ports, the inbound passthrough's source.
    fn outbound_port_exclusions(&mut self, p: &Plan);
    /// The proxy's own traffic: calls back to the app through a VIP go inbound, the rest is
    /// never captured again.
    fn proxy_owner_rules(&mut self, p: &Plan);
    fn handle_capture_by_owner_group(&mut self, p: &Plan);
    fn setup_dns_redir(&mut self, p: &Plan);
    /// Loopback destinations and the excluded outbound ranges return.
    fn outbound_ip_exclusions(&mut self, p: &Plan);
    fn handle_outbound_ports_include(&mut self, p: &Plan);
    fn handle_outbound_include_rules(&mut self, p: &Plan);
    /// TPROXY: the original-source mark kept across the connection, the proxy's traffic to the
    /// app marked, marked and loopback traffic kept out of the inbound diversion.
    fn tproxy_marks(&mut self, p: &Plan);
}

/// Istio's `Run`: every phase, in Istio's order.
pub(crate) fn run(rules: &mut impl Phases, cfg: &Config) {
    let p = Plan::new(cfg);
    rules.short_circuit_exclude_interfaces(&p);
    rules.short_circuit_kube_internal_interface(&p);
    if cfg.drop_invalid {
        rules.drop_invalid(&p);
    }
    rules.redirect_chains(&p);
    rules.handle_inbound_ports_include(&p);
    rules.outbound_port_exclusions(&p);
    rules.proxy_owner_rules(&p);
    rules.handle_capture_by_owner_group(&p);
    if p.redirect_dns {
        rules.setup_dns_redir(&p);
    }
    rules.outbound_ip_exclusions(&p);
    rules.handle_outbound_ports_include(&p);
    rules.handle_outbound_include_rules(&p);
    if p.tproxy {
        rules.tproxy_marks(&p);
    }
}

/// Builds the iptables rule set for `cfg` (IPv6 rules only when `cfg.enable_ipv6`).
pub fn build(cfg: &Config) -> RuleBuilder {
    let mut b = RuleBuilder::new(cfg.enable_ipv6);
    run(&mut b, cfg);
    b
}
