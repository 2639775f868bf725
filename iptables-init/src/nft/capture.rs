//! Istio's sidecar capture as nftables rules, built from a [`Config`] into an
//! [`NftRuleBuilder`]. The order of the calls is the order of Istio's rules, which the
//! conformance goldens pin byte for byte; every rule counts its packets (`counter` right before
//! the final statement).

use super::builder::NftRuleBuilder;
use super::{MANGLE, NAT, RAW};
use crate::capture::{Ranges, separate_v4_v6};
use crate::config::{Config, InterceptionMode, split};

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

/// Builds the nftables rule set for `cfg` (IPv6 rules only when `cfg.enable_ipv6`).
pub fn build(cfg: &Config) -> NftRuleBuilder {
    let mut b = NftRuleBuilder::new(cfg.enable_ipv6);
    let tproxy = cfg.inbound_interception_mode == InterceptionMode::Tproxy;
    let lo4 = cfg.host_ipv4_loopback_cidr.as_str();
    let tunnel = cfg.inbound_tunnel_port;
    let mark = cfg.inbound_tproxy_mark;

    let (v4_exclude, v6_exclude) = separate_v4_v6(&cfg.outbound_ip_ranges_exclude);
    let (v4_include, v6_include) = separate_v4_v6(&cfg.outbound_ip_ranges_include);

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

    // Excluded interfaces: never captured.
    for nic in split(&cfg.exclude_interfaces) {
        b.append(NAT, PREROUTING, rule(&format!("iifname {nic}"), "return"));
        b.append(NAT, OUTPUT, rule(&format!("oifname {nic}"), "return"));
    }
    if tproxy {
        for nic in split(&cfg.exclude_interfaces) {
            b.append(
                MANGLE,
                PREROUTING,
                rule(&format!("iifname {nic}"), "return"),
            );
            b.append(MANGLE, OUTPUT, rule(&format!("oifname {nic}"), "return"));
        }
    }
    // Virtual interfaces: short-circuit their inbound traffic.
    for nic in split(&cfg.reroute_virtual_interfaces) {
        b.insert(
            NAT,
            PREROUTING,
            0,
            rule(&format!("iifname {nic}"), "return"),
        );
    }

    if cfg.drop_invalid {
        b.append(
            MANGLE,
            PREROUTING,
            rule("meta l4proto tcp ct state invalid", "jump istio-drop"),
        );
        b.append(MANGLE, ISTIO_DROP, rule("", "drop"));
    }

    b.append(
        NAT,
        ISTIO_INBOUND,
        rule(&format!("meta l4proto tcp tcp dport {tunnel}"), "return"),
    );
    b.append(
        NAT,
        ISTIO_REDIRECT,
        rule(
            "meta l4proto tcp",
            &format!("redirect to :{}", cfg.proxy_port),
        ),
    );
    b.append(
        NAT,
        ISTIO_IN_REDIRECT,
        rule(
            "meta l4proto tcp",
            &format!("redirect to :{}", cfg.inbound_capture_port),
        ),
    );

    inbound_ports(&mut b, cfg, tproxy);

    b.append(NAT, OUTPUT, rule("", "jump istio-output"));

    for port in split(&cfg.outbound_ports_exclude) {
        b.append(
            NAT,
            ISTIO_OUTPUT,
            rule(&format!("tcp dport {port}"), "return"),
        );
        b.append(
            NAT,
            ISTIO_OUTPUT,
            rule(&format!("udp dport {port}"), "return"),
        );
    }

    // 127.0.0.6 / ::6: the inbound passthrough cluster's bind address.
    b.append(
        NAT,
        ISTIO_OUTPUT,
        rule("oifname lo ip saddr 127.0.0.6/32", "return"),
    );
    b.append_v6(
        NAT,
        ISTIO_OUTPUT,
        rule("oifname lo ip6 saddr ::6/128", "return"),
    );

    let loopback_included = v4_include.has_loopback || v6_include.has_loopback;
    for (owner, ids) in [("skuid", &cfg.proxy_uid), ("skgid", &cfg.proxy_gid)] {
        // With DNS capture the proxy user's calls to port 53 are not sent to inbound; Istio
        // excludes the port set for the UID rule only.
        let ports = if redirect_dns && owner == "skuid" {
            format!("{{ 53, {tunnel} }}")
        } else {
            tunnel.to_string()
        };
        for id in split(ids) {
            // App calls back to itself through a service VIP go through Envoy inbound.
            b.append(
                NAT,
                ISTIO_OUTPUT,
                rule(
                    &format!(
                        "oifname lo meta l4proto tcp ip daddr != {lo4} tcp dport != {ports} {owner} {id}"
                    ),
                    "jump istio-in-redirect",
                ),
            );
            b.append_v6(
                NAT,
                ISTIO_OUTPUT,
                rule(
                    &format!(
                        "oifname lo meta l4proto tcp ip6 daddr != ::1/128 tcp dport != {ports} {owner} {id}"
                    ),
                    "jump istio-in-redirect",
                ),
            );
            // App-to-app over loopback by endpoint address is not captured, unless loopback
            // ranges were explicitly included.
            if !loopback_included {
                let matches = if redirect_dns {
                    format!("oifname lo meta l4proto tcp tcp dport != 53 {owner} != {id}")
                } else {
                    format!("oifname lo {owner} != {id}")
                };
                b.append(NAT, ISTIO_OUTPUT, rule(&matches, "return"));
            }
            // The proxy's own traffic is never captured again.
            b.append(NAT, ISTIO_OUTPUT, rule(&format!("{owner} {id}"), "return"));
        }
    }

    owner_groups(&mut b, cfg);

    if redirect_dns {
        dns_redirect(&mut b, cfg);
    }

    b.append(
        NAT,
        ISTIO_OUTPUT,
        rule(&format!("ip daddr {lo4}"), "return"),
    );
    b.append_v6(NAT, ISTIO_OUTPUT, rule("ip6 daddr ::1/128", "return"));
    for cidr in &v4_exclude.cidrs {
        b.append(
            NAT,
            ISTIO_OUTPUT,
            rule(&format!("ip daddr {cidr}"), "return"),
        );
    }
    for cidr in &v6_exclude.cidrs {
        b.append_v6(
            NAT,
            ISTIO_OUTPUT,
            rule(&format!("ip6 daddr {cidr}"), "return"),
        );
    }

    for port in split(&cfg.outbound_ports_include) {
        b.append(
            NAT,
            ISTIO_OUTPUT,
            rule(&format!("tcp dport {port}"), "jump istio-redirect"),
        );
    }

    outbound_include(&mut b, cfg, &v4_include, &v6_include);

    if tproxy {
        tproxy_marks(&mut b, cfg, lo4, mark);
    }
    b
}

fn inbound_ports(b: &mut NftRuleBuilder, cfg: &Config, tproxy: bool) {
    if cfg.inbound_ports_include.is_empty() {
        return;
    }
    let mark = cfg.inbound_tproxy_mark;
    let table = if tproxy {
        b.append(
            MANGLE,
            ISTIO_DIVERT,
            rule("", &format!("meta mark set {mark}")),
        );
        b.append(MANGLE, ISTIO_DIVERT, rule("", "accept"));
        let port = cfg.inbound_capture_port;
        b.append(
            MANGLE,
            ISTIO_TPROXY,
            rule(
                &format!(
                    "meta l4proto tcp ip daddr != {} tproxy ip to :{port} meta mark set {mark}",
                    cfg.host_ipv4_loopback_cidr
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
        MANGLE
    } else {
        NAT
    };
    b.append(
        table,
        PREROUTING,
        rule("meta l4proto tcp", "jump istio-inbound"),
    );

    if cfg.inbound_ports_include == "*" {
        for port in split(&cfg.inbound_ports_exclude) {
            b.append(
                table,
                ISTIO_INBOUND,
                rule(&format!("meta l4proto tcp tcp dport {port}"), "return"),
            );
        }
        if tproxy {
            b.append(
                MANGLE,
                ISTIO_INBOUND,
                rule(
                    "meta l4proto tcp ct state related,established",
                    "jump istio-divert",
                ),
            );
            b.append(
                MANGLE,
                ISTIO_INBOUND,
                rule("meta l4proto tcp", "jump istio-tproxy"),
            );
        } else {
            b.append(
                NAT,
                ISTIO_INBOUND,
                rule("meta l4proto tcp", "jump istio-in-redirect"),
            );
        }
    } else {
        for port in split(&cfg.inbound_ports_include) {
            if tproxy {
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
    }
}

/// `ISTIO_OUTBOUND_OWNER_GROUPS` / `..._EXCLUDE`: a `*` include captures every group but the
/// excluded ones (one return per group); a list captures only those (one rule that returns
/// for any other group).
fn owner_groups(b: &mut NftRuleBuilder, cfg: &Config) {
    let include = split(&cfg.owner_groups_include);
    if cfg.owner_groups_include == "*" || include.is_empty() {
        for group in split(&cfg.owner_groups_exclude) {
            b.append(NAT, ISTIO_OUTPUT, rule(&format!("skgid {group}"), "return"));
        }
    } else {
        let matches: Vec<String> = include.iter().map(|g| format!("skgid != {g}")).collect();
        b.append(NAT, ISTIO_OUTPUT, rule(&matches.join(" "), "return"));
    }
}

fn outbound_include(b: &mut NftRuleBuilder, cfg: &Config, v4: &Ranges, v6: &Ranges) {
    let nics = split(&cfg.reroute_virtual_interfaces);
    if v4.wildcard || v6.wildcard {
        b.append(NAT, ISTIO_OUTPUT, rule("", "jump istio-redirect"));
        for nic in &nics {
            b.insert(
                NAT,
                PREROUTING,
                0,
                rule(&format!("iifname {nic}"), "jump istio-redirect"),
            );
        }
        return;
    }
    for cidr in &v4.cidrs {
        for nic in &nics {
            b.insert(
                NAT,
                PREROUTING,
                0,
                rule(
                    &format!("iifname {nic} ip daddr {cidr}"),
                    "jump istio-redirect",
                ),
            );
        }
        b.append(
            NAT,
            ISTIO_OUTPUT,
            rule(&format!("ip daddr {cidr}"), "jump istio-redirect"),
        );
    }
    for cidr in &v6.cidrs {
        for nic in &nics {
            b.insert_v6(
                NAT,
                PREROUTING,
                0,
                rule(
                    &format!("iifname {nic} ip6 daddr {cidr}"),
                    "jump istio-redirect",
                ),
            );
        }
        b.append_v6(
            NAT,
            ISTIO_OUTPUT,
            rule(&format!("ip6 daddr {cidr}"), "jump istio-redirect"),
        );
    }
}

/// TPROXY: keep the original-source mark across the connection, mark the proxy's traffic to
/// the app, and keep marked and loopback traffic out of the inbound diversion.
fn tproxy_marks(b: &mut NftRuleBuilder, cfg: &Config, lo4: &str, mark: u32) {
    b.append(
        MANGLE,
        PREROUTING,
        rule(&format!("meta l4proto tcp mark {mark}"), "ct mark set mark"),
    );
    b.append(
        MANGLE,
        OUTPUT,
        rule(
            &format!("oifname lo meta l4proto tcp mark {mark}"),
            "return",
        ),
    );
    for (owner, ids) in [("skuid", &cfg.proxy_uid), ("skgid", &cfg.proxy_gid)] {
        for id in split(ids) {
            b.append(
                MANGLE,
                OUTPUT,
                rule(
                    &format!("oifname lo meta l4proto tcp ip daddr != {lo4} {owner} {id}"),
                    &format!("meta mark set {OUTBOUND_MARK}"),
                ),
            );
            b.append_v6(
                MANGLE,
                OUTPUT,
                rule(
                    &format!("oifname lo meta l4proto tcp ip6 daddr != ::1/128 {owner} {id}"),
                    &format!("meta mark set {OUTBOUND_MARK}"),
                ),
            );
        }
    }
    b.append(
        MANGLE,
        OUTPUT,
        rule(
            &format!("meta l4proto tcp ct mark {mark}"),
            "meta mark set ct mark",
        ),
    );
    b.insert(
        MANGLE,
        ISTIO_INBOUND,
        0,
        rule(&format!("meta l4proto tcp mark {mark}"), "return"),
    );
    b.insert(
        MANGLE,
        ISTIO_INBOUND,
        1,
        rule(
            "iifname lo meta l4proto tcp ip saddr 127.0.0.6/32",
            "return",
        ),
    );
    b.insert_v6(
        MANGLE,
        ISTIO_INBOUND,
        1,
        rule("iifname lo meta l4proto tcp ip6 saddr ::6/128", "return"),
    );
    b.insert(
        MANGLE,
        ISTIO_INBOUND,
        2,
        rule(
            &format!("iifname lo meta l4proto tcp mark != {OUTBOUND_MARK}"),
            "return",
        ),
    );
}

/// DNS to the agent (nat) and the conntrack zones that keep the agent's upstream queries apart
/// from the app's queries to the agent (raw).
fn dns_redirect(b: &mut NftRuleBuilder, cfg: &Config) {
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

    // Conntrack zones: agent <-> upstream in zone 1, client <-> agent in zone 2.
    for (owner, ids) in [("skuid", &cfg.proxy_uid), ("skgid", &cfg.proxy_gid)] {
        for id in split(ids) {
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
