//! Istio's sidecar capture as nftables rules: the phases of [`crate::capture`] (Istio's
//! istio-nftables `Run`) into an [`NftRuleBuilder`]. Every rule counts its packets (`counter`
//! right before the final statement).

use super::builder::NftRuleBuilder;
use super::{MANGLE, NAT, RAW};
use crate::capture::{Owner, Phases, Plan};
use crate::config::{Config, InboundPorts};

pub const PREROUTING: &str = "prerouting";
pub const OUTPUT: &str = "output";
pub const ISTIO_INBOUND: &str = "istio-inbound";
pub const ISTIO_REDIRECT: &str = "istio-redirect";
pub const ISTIO_IN_REDIRECT: &str = "istio-in-redirect";
pub const ISTIO_OUTPUT: &str = "istio-output";
pub const ISTIO_OUTPUT_DNS: &str = "istio-output-dns";
pub const ISTIO_DIVERT: &str = "istio-divert";
pub const ISTIO_TPROXY: &str = "istio-tproxy";
pub const ISTIO_DROP: &str = "istio-drop";

/// Mark on packets from the proxy to the app in TPROXY mode.
const OUTBOUND_MARK: &str = "1338";
/// The agent's DNS listener.
const DNS_PORT: &str = "15053";

/// `<matches> counter <statement>`.
fn rule(matches: &str, statement: &str) -> String {
    if matches.is_empty() {
        format!("counter {statement}")
    } else {
        format!("{matches} counter {statement}")
    }
}

impl Owner {
    fn meta(self) -> &'static str {
        match self {
            Owner::Uid => "skuid",
            Owner::Gid => "skgid",
        }
    }
}

/// Builds the nftables rule set for `cfg` (IPv6 rules only when `cfg.enable_ipv6`).
pub fn build(cfg: &Config) -> NftRuleBuilder {
    let mut b = NftRuleBuilder::new(cfg.enable_ipv6);
    crate::capture::run(&mut b, cfg);
    b
}

impl Phases for NftRuleBuilder {
    fn short_circuit_exclude_interfaces(&mut self, p: &Plan) {
        for nic in &p.cfg.exclude_interfaces {
            self.append(NAT, PREROUTING, rule(&format!("iifname {nic}"), "return"));
            self.append(NAT, OUTPUT, rule(&format!("oifname {nic}"), "return"));
        }
        if p.tproxy {
            for nic in &p.cfg.exclude_interfaces {
                self.append(
                    MANGLE,
                    PREROUTING,
                    rule(&format!("iifname {nic}"), "return"),
                );
                self.append(MANGLE, OUTPUT, rule(&format!("oifname {nic}"), "return"));
            }
        }
    }

    fn short_circuit_kube_internal_interface(&mut self, p: &Plan) {
        for nic in &p.cfg.reroute_virtual_interfaces {
            self.insert(
                NAT,
                PREROUTING,
                0,
                rule(&format!("iifname {nic}"), "return"),
            );
        }
    }

    fn drop_invalid(&mut self, _: &Plan) {
        self.append(
            MANGLE,
            PREROUTING,
            rule("meta l4proto tcp ct state invalid", "jump istio-drop"),
        );
        self.append(MANGLE, ISTIO_DROP, rule("", "drop"));
    }

    fn redirect_chains(&mut self, p: &Plan) {
        let cfg = p.cfg;
        self.append(
            NAT,
            ISTIO_INBOUND,
            rule(
                &format!("meta l4proto tcp tcp dport {}", cfg.inbound_tunnel_port),
                "return",
            ),
        );
        self.append(
            NAT,
            ISTIO_REDIRECT,
            rule(
                "meta l4proto tcp",
                &format!("redirect to :{}", cfg.proxy_port),
            ),
        );
        self.append(
            NAT,
            ISTIO_IN_REDIRECT,
            rule(
                "meta l4proto tcp",
                &format!("redirect to :{}", cfg.inbound_capture_port),
            ),
        );
    }

    fn handle_inbound_ports_include(&mut self, p: &Plan) {
        let cfg = p.cfg;
        if cfg.inbound_ports_include == InboundPorts::Off {
            return;
        }
        let table = if p.tproxy {
            inbound_tproxy_mode(self, p);
            MANGLE
        } else {
            NAT
        };
        self.append(
            table,
            PREROUTING,
            rule("meta l4proto tcp", "jump istio-inbound"),
        );
        match &cfg.inbound_ports_include {
            InboundPorts::All => {
                for port in &cfg.inbound_ports_exclude {
                    self.append(
                        table,
                        ISTIO_INBOUND,
                        rule(&format!("meta l4proto tcp tcp dport {port}"), "return"),
                    );
                }
                if p.tproxy {
                    self.append(
                        MANGLE,
                        ISTIO_INBOUND,
                        rule(
                            "meta l4proto tcp ct state related,established",
                            "jump istio-divert",
                        ),
                    );
                    self.append(
                        MANGLE,
                        ISTIO_INBOUND,
                        rule("meta l4proto tcp", "jump istio-tproxy"),
                    );
                } else {
                    self.append(
                        NAT,
                        ISTIO_INBOUND,
                        rule("meta l4proto tcp", "jump istio-in-redirect"),
                    );
                }
            }
            InboundPorts::Only(ports) => {
                for port in ports {
                    inbound_port(self, p, port.as_str());
                }
            }
            InboundPorts::Off => {}
        }
    }

    fn outbound_port_exclusions(&mut self, p: &Plan) {
        self.append(NAT, OUTPUT, rule("", "jump istio-output"));
        for port in &p.cfg.outbound_ports_exclude {
            for proto in ["tcp", "udp"] {
                self.append(
                    NAT,
                    ISTIO_OUTPUT,
                    rule(&format!("{proto} dport {port}"), "return"),
                );
            }
        }
        // 127.0.0.6 / ::6: the inbound passthrough cluster's bind address.
        self.append(
            NAT,
            ISTIO_OUTPUT,
            rule("oifname lo ip saddr 127.0.0.6/32", "return"),
        );
        self.append_v6(
            NAT,
            ISTIO_OUTPUT,
            rule("oifname lo ip6 saddr ::6/128", "return"),
        );
    }

    fn proxy_owner_rules(&mut self, p: &Plan) {
        let lo4 = p.cfg.host_ipv4_loopback_cidr.as_str();
        let tunnel = p.cfg.inbound_tunnel_port;
        for (owner, ids) in p.owners() {
            // With DNS capture the proxy user's calls to port 53 are not sent to inbound;
            // Istio excludes the port set for the UID rule only.
            let ports = if p.redirect_dns && owner == Owner::Uid {
                format!("{{ 53, {tunnel} }}")
            } else {
                tunnel.to_string()
            };
            let owner = owner.meta();
            for id in ids {
                // App calls back to itself through a service VIP go through Envoy inbound.
                self.append(
                    NAT,
                    ISTIO_OUTPUT,
                    rule(
                        &format!(
                            "oifname lo meta l4proto tcp ip daddr != {lo4} tcp dport != {ports} {owner} {id}"
                        ),
                        "jump istio-in-redirect",
                    ),
                );
                self.append_v6(
                    NAT,
                    ISTIO_OUTPUT,
                    rule(
                        &format!(
                            "oifname lo meta l4proto tcp ip6 daddr != ::1/128 tcp dport != {ports} {owner} {id}"
                        ),
                        "jump istio-in-redirect",
                    ),
                );
                // App-to-app over loopback by endpoint address is not captured, unless
                // loopback ranges were explicitly included.
                if !p.loopback_included {
                    let matches = if p.redirect_dns {
                        format!("oifname lo meta l4proto tcp tcp dport != 53 {owner} != {id}")
                    } else {
                        format!("oifname lo {owner} != {id}")
                    };
                    self.append(NAT, ISTIO_OUTPUT, rule(&matches, "return"));
                }
                // The proxy's own traffic is never captured again.
                self.append(NAT, ISTIO_OUTPUT, rule(&format!("{owner} {id}"), "return"));
            }
        }
    }

    /// A `*` include captures every group but the excluded ones (one return per group); a
    /// list captures only those (one rule that returns for any other group).
    fn handle_capture_by_owner_group(&mut self, p: &Plan) {
        let groups = &p.cfg.owner_groups;
        match groups.include.as_deref() {
            Some(include) if !include.is_empty() => {
                let matches: Vec<String> =
                    include.iter().map(|g| format!("skgid != {g}")).collect();
                self.append(NAT, ISTIO_OUTPUT, rule(&matches.join(" "), "return"));
            }
            _ => {
                for group in &groups.exclude {
                    self.append(NAT, ISTIO_OUTPUT, rule(&format!("skgid {group}"), "return"));
                }
            }
        }
    }

    fn setup_dns_redir(&mut self, p: &Plan) {
        dns_redirect(self, p);
        dns_conntrack_zones(self, p);
    }

    fn outbound_ip_exclusions(&mut self, p: &Plan) {
        let cfg = p.cfg;
        self.append(
            NAT,
            ISTIO_OUTPUT,
            rule(
                &format!("ip daddr {}", cfg.host_ipv4_loopback_cidr),
                "return",
            ),
        );
        self.append_v6(NAT, ISTIO_OUTPUT, rule("ip6 daddr ::1/128", "return"));
        for cidr in &cfg.outbound_ip_ranges_exclude.v4.cidrs {
            self.append(
                NAT,
                ISTIO_OUTPUT,
                rule(&format!("ip daddr {cidr}"), "return"),
            );
        }
        for cidr in &cfg.outbound_ip_ranges_exclude.v6.cidrs {
            self.append_v6(
                NAT,
                ISTIO_OUTPUT,
                rule(&format!("ip6 daddr {cidr}"), "return"),
            );
        }
    }

    fn handle_outbound_ports_include(&mut self, p: &Plan) {
        for port in &p.cfg.outbound_ports_include {
            self.append(
                NAT,
                ISTIO_OUTPUT,
                rule(&format!("tcp dport {port}"), "jump istio-redirect"),
            );
        }
    }

    fn handle_outbound_include_rules(&mut self, p: &Plan) {
        let include = &p.cfg.outbound_ip_ranges_include;
        let nics = &p.cfg.reroute_virtual_interfaces;
        if include.v4.wildcard || include.v6.wildcard {
            self.append(NAT, ISTIO_OUTPUT, rule("", "jump istio-redirect"));
            for nic in nics {
                self.insert(
                    NAT,
                    PREROUTING,
                    0,
                    rule(&format!("iifname {nic}"), "jump istio-redirect"),
                );
            }
            return;
        }
        for cidr in &include.v4.cidrs {
            for nic in nics {
                self.insert(
                    NAT,
                    PREROUTING,
                    0,
                    rule(
                        &format!("iifname {nic} ip daddr {cidr}"),
                        "jump istio-redirect",
                    ),
                );
            }
            self.append(
                NAT,
                ISTIO_OUTPUT,
                rule(&format!("ip daddr {cidr}"), "jump istio-redirect"),
            );
        }
        for cidr in &include.v6.cidrs {
            for nic in nics {
                self.insert_v6(
                    NAT,
                    PREROUTING,
                    0,
                    rule(
                        &format!("iifname {nic} ip6 daddr {cidr}"),
                        "jump istio-redirect",
                    ),
                );
            }
            self.append_v6(
                NAT,
                ISTIO_OUTPUT,
                rule(&format!("ip6 daddr {cidr}"), "jump istio-redirect"),
            );
        }
    }

    fn tproxy_marks(&mut self, p: &Plan) {
        let lo4 = p.cfg.host_ipv4_loopback_cidr.as_str();
        let mark = p.cfg.inbound_tproxy_mark;
        self.append(
            MANGLE,
            PREROUTING,
            rule(&format!("meta l4proto tcp mark {mark}"), "ct mark set mark"),
        );
        self.append(
            MANGLE,
            OUTPUT,
            rule(
                &format!("oifname lo meta l4proto tcp mark {mark}"),
                "return",
            ),
        );
        for (owner, ids) in p.owners() {
            let owner = owner.meta();
            for id in ids {
                self.append(
                    MANGLE,
                    OUTPUT,
                    rule(
                        &format!("oifname lo meta l4proto tcp ip daddr != {lo4} {owner} {id}"),
                        &format!("meta mark set {OUTBOUND_MARK}"),
                    ),
                );
                self.append_v6(
                    MANGLE,
                    OUTPUT,
                    rule(
                        &format!("oifname lo meta l4proto tcp ip6 daddr != ::1/128 {owner} {id}"),
                        &format!("meta mark set {OUTBOUND_MARK}"),
                    ),
                );
            }
        }
        self.append(
            MANGLE,
            OUTPUT,
            rule(
                &format!("meta l4proto tcp ct mark {mark}"),
                "meta mark set ct mark",
            ),
        );
        self.insert(
            MANGLE,
            ISTIO_INBOUND,
            0,
            rule(&format!("meta l4proto tcp mark {mark}"), "return"),
        );
        self.insert(
            MANGLE,
            ISTIO_INBOUND,
            1,
            rule(
                "iifname lo meta l4proto tcp ip saddr 127.0.0.6/32",
                "return",
            ),
        );
        self.insert_v6(
            MANGLE,
            ISTIO_INBOUND,
            1,
            rule("iifname lo meta l4proto tcp ip6 saddr ::6/128", "return"),
        );
        self.insert(
            MANGLE,
            ISTIO_INBOUND,
            2,
            rule(
                &format!("iifname lo meta l4proto tcp mark != {OUTBOUND_MARK}"),
                "return",
            ),
        );
    }
}

/// TPROXY's divert and tproxy chains (Istio's `handleInboundTProxyMode`).
fn inbound_tproxy_mode(b: &mut NftRuleBuilder, p: &Plan) {
    let mark = p.cfg.inbound_tproxy_mark;
    let port = p.cfg.inbound_capture_port;
    b.append(
        MANGLE,
        ISTIO_DIVERT,
        rule("", &format!("meta mark set {mark}")),
    );
    b.append(MANGLE, ISTIO_DIVERT, rule("", "accept"));
    b.append(
        MANGLE,
        ISTIO_TPROXY,
        rule(
            &format!(
                "meta l4proto tcp ip daddr != {} tproxy ip to :{port} meta mark set {mark}",
                p.cfg.host_ipv4_loopback_cidr
            ),
            "accept",
        ),
    );
    b.append_v6(
        MANGLE,
        ISTIO_TPROXY,
        rule(
            &format!(
                "meta l4proto tcp ip6 daddr != ::1/128 tproxy ip6 to :{port} meta mark set {mark}"
            ),
            "accept",
        ),
    );
}

/// One listed inbound port: diverted (TPROXY) or redirected.
fn inbound_port(b: &mut NftRuleBuilder, p: &Plan, port: &str) {
    if p.tproxy {
        b.append(
            MANGLE,
            ISTIO_INBOUND,
            rule(
                &format!("meta l4proto tcp ct state related,established tcp dport {port}"),
                "jump istio-divert",
            ),
        );
        b.append(
            MANGLE,
            ISTIO_INBOUND,
            rule(
                &format!("meta l4proto tcp tcp dport {port}"),
                "jump istio-tproxy",
            ),
        );
    } else {
        b.append(
            NAT,
            ISTIO_INBOUND,
            rule(
                &format!("meta l4proto tcp tcp dport {port}"),
                "jump istio-in-redirect",
            ),
        );
    }
}

/// DNS to the agent: the jumps into `istio-output-dns` and its redirects.
fn dns_redirect(b: &mut NftRuleBuilder, p: &Plan) {
    let cfg = p.cfg;
    let v4 = &cfg.dns_servers_v4;
    let v6 = &cfg.dns_servers_v6;
    let all = cfg.capture_all_dns;
    let to_agent = format!("redirect to :{DNS_PORT}");
    b.append(RAW, OUTPUT, rule("", "jump istio-output-dns"));
    if all || !v4.is_empty() || !v6.is_empty() {
        b.append(NAT, ISTIO_OUTPUT, rule("", "jump istio-output-dns"));
    }
    for proto in ["tcp", "udp"] {
        if all {
            let matches = if proto == "tcp" {
                "meta l4proto tcp tcp dport 53".to_string()
            } else {
                "udp dport 53".to_string()
            };
            b.append(NAT, ISTIO_OUTPUT_DNS, rule(&matches, &to_agent));
            continue;
        }
        for s in v4 {
            b.append(
                NAT,
                ISTIO_OUTPUT_DNS,
                rule(&format!("ip daddr {s}/32 {proto} dport 53"), &to_agent),
            );
        }
        for s in v6 {
            b.append_v6(
                NAT,
                ISTIO_OUTPUT_DNS,
                rule(&format!("ip6 daddr {s}/128 {proto} dport 53"), &to_agent),
            );
        }
    }
}

/// Conntrack zones (raw): agent <-> upstream in zone 1, client <-> agent in zone 2 (Istio's
/// `addDNSConntrackZones`).
fn dns_conntrack_zones(b: &mut NftRuleBuilder, p: &Plan) {
    let cfg = p.cfg;
    let v4 = &cfg.dns_servers_v4;
    let v6 = &cfg.dns_servers_v6;
    let all = cfg.capture_all_dns;
    for (owner, ids) in p.owners() {
        let owner = owner.meta();
        for id in ids {
            b.append(
                RAW,
                ISTIO_OUTPUT_DNS,
                rule(&format!("udp dport 53 meta {owner} {id}"), "ct zone set 1"),
            );
            b.append(
                RAW,
                ISTIO_OUTPUT_DNS,
                rule(
                    &format!("udp sport {DNS_PORT} meta {owner} {id}"),
                    "ct zone set 2",
                ),
            );
        }
    }
    if all {
        b.append(RAW, PREROUTING, rule("", "jump istio-inbound"));
        b.append(RAW, ISTIO_OUTPUT_DNS, rule("udp dport 53", "ct zone set 2"));
        b.append(RAW, ISTIO_INBOUND, rule("udp sport 53", "ct zone set 1"));
        return;
    }
    if !v4.is_empty() || !v6.is_empty() {
        b.append(RAW, PREROUTING, rule("", "jump istio-inbound"));
    }
    for s in v4 {
        b.append(
            RAW,
            ISTIO_OUTPUT_DNS,
            rule(&format!("udp dport 53 ip daddr {s}/32"), "ct zone set 2"),
        );
        b.append(
            RAW,
            ISTIO_INBOUND,
            rule(&format!("udp sport 53 ip saddr {s}/32"), "ct zone set 1"),
        );
    }
    for s in v6 {
        b.append_v6(
            RAW,
            ISTIO_OUTPUT_DNS,
            rule(&format!("udp dport 53 ip6 daddr {s}/128"), "ct zone set 2"),
        );
        b.append_v6(
            RAW,
            ISTIO_INBOUND,
            rule(&format!("udp sport 53 ip6 saddr {s}/128"), "ct zone set 1"),
        );
    }
}
