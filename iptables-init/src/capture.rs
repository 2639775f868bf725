//! Istio's sidecar rule set, built from a [`Config`] into a [`RuleBuilder`]. The order of the
//! calls is the order of Istio's rules, which the conformance goldens pin byte for byte.

use crate::builder::{IP_VERSION_SPECIFIC as IPV, RuleBuilder};
use crate::config::{Config, InterceptionMode, parse_prefix, split};

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

/// Outbound CIDRs of one family, in canonical text (address not masked); shared by the
/// iptables and nftables rule sets.
#[derive(Debug, Default)]
pub(crate) struct Ranges {
    pub(crate) wildcard: bool,
    pub(crate) cidrs: Vec<String>,
    pub(crate) has_loopback: bool,
}

pub(crate) fn separate_v4_v6(list: &str) -> (Ranges, Ranges) {
    if list == "*" {
        let w = || Ranges {
            wildcard: true,
            ..Ranges::default()
        };
        return (w(), w());
    }
    let mut v4 = Ranges::default();
    let mut v6 = Ranges::default();
    for item in split(list) {
        // Validated at parse time; skip anything unparsable defensively.
        let Some((ip, bits)) = parse_prefix(item) else {
            continue;
        };
        let r = if ip.is_ipv4() { &mut v4 } else { &mut v6 };
        r.cidrs.push(format!("{ip}/{bits}"));
        if ip.is_loopback() {
            r.has_loopback = true;
        }
    }
    (v4, v6)
}

/// Builds the full rule set for `cfg` (IPv6 rules only when `cfg.enable_ipv6`).
pub fn build(cfg: &Config) -> RuleBuilder {
    let mut b = RuleBuilder::new(cfg.enable_ipv6);
    let tproxy = cfg.inbound_interception_mode == InterceptionMode::Tproxy;
    let lo4 = cfg.host_ipv4_loopback_cidr.as_str();
    let tunnel = cfg.inbound_tunnel_port.to_string();
    let capture_port = cfg.inbound_capture_port.to_string();
    let proxy_port = cfg.proxy_port.to_string();
    let mark = cfg.inbound_tproxy_mark.to_string();

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
        b.append("PREROUTING", "nat", &["-i", nic, "-j", "RETURN"]);
        b.append("OUTPUT", "nat", &["-o", nic, "-j", "RETURN"]);
    }
    if tproxy {
        for nic in split(&cfg.exclude_interfaces) {
            b.append("PREROUTING", "mangle", &["-i", nic, "-j", "RETURN"]);
            b.append("OUTPUT", "mangle", &["-o", nic, "-j", "RETURN"]);
        }
    }
    // Virtual interfaces: short-circuit their inbound traffic.
    for nic in split(&cfg.reroute_virtual_interfaces) {
        b.insert("PREROUTING", "nat", 1, &["-i", nic, "-j", "RETURN"]);
    }

    if cfg.drop_invalid {
        b.append(
            "PREROUTING",
            "mangle",
            &["-m", "conntrack", "--ctstate", "INVALID", "-j", ISTIO_DROP],
        );
        b.append(ISTIO_DROP, "mangle", &["-j", "DROP"]);
    }

    b.append(
        ISTIO_INBOUND,
        "nat",
        &["-p", "tcp", "--dport", &tunnel, "-j", "RETURN"],
    );
    b.append(
        ISTIO_REDIRECT,
        "nat",
        &["-p", "tcp", "-j", "REDIRECT", "--to-ports", &proxy_port],
    );
    b.append(
        ISTIO_IN_REDIRECT,
        "nat",
        &["-p", "tcp", "-j", "REDIRECT", "--to-ports", &capture_port],
    );

    inbound_ports(&mut b, cfg, tproxy, &mark, &capture_port);

    b.append("OUTPUT", "nat", &["-j", ISTIO_OUTPUT]);

    for port in split(&cfg.outbound_ports_exclude) {
        b.append(
            ISTIO_OUTPUT,
            "nat",
            &["-p", "tcp", "--dport", port, "-j", "RETURN"],
        );
        b.append(
            ISTIO_OUTPUT,
            "nat",
            &["-p", "udp", "--dport", port, "-j", "RETURN"],
        );
    }

    // 127.0.0.6 / ::6: the inbound passthrough cluster's bind address.
    b.append_versioned(
        "127.0.0.6/32",
        "::6/128",
        ISTIO_OUTPUT,
        "nat",
        &["-o", "lo", "-s", IPV, "-j", "RETURN"],
    );

    let loopback_included = v4_include.has_loopback || v6_include.has_loopback;
    let dns_tunnel = format!("53,{tunnel}");
    for (owner, ids) in [
        ("--uid-owner", &cfg.proxy_uid),
        ("--gid-owner", &cfg.proxy_gid),
    ] {
        for id in split(ids) {
            // App calls back to itself through a service VIP go through Envoy inbound.
            if redirect_dns && owner == "--uid-owner" {
                b.append_versioned(
                    lo4,
                    "::1/128",
                    ISTIO_OUTPUT,
                    "nat",
                    &[
                        "-o",
                        "lo",
                        "!",
                        "-d",
                        IPV,
                        "-p",
                        "tcp",
                        "-m",
                        "multiport",
                        "!",
                        "--dports",
                        &dns_tunnel,
                        "-m",
                        "owner",
                        owner,
                        id,
                        "-j",
                        ISTIO_IN_REDIRECT,
                    ],
                );
            } else {
                b.append_versioned(
                    lo4,
                    "::1/128",
                    ISTIO_OUTPUT,
                    "nat",
                    &[
                        "-o",
                        "lo",
                        "!",
                        "-d",
                        IPV,
                        "-p",
                        "tcp",
                        "!",
                        "--dport",
                        &tunnel,
                        "-m",
                        "owner",
                        owner,
                        id,
                        "-j",
                        ISTIO_IN_REDIRECT,
                    ],
                );
            }
            // App-to-app over loopback by endpoint address is not captured, unless loopback
            // ranges were explicitly included.
            if !loopback_included {
                if redirect_dns {
                    b.append(
                        ISTIO_OUTPUT,
                        "nat",
                        &[
                            "-o", "lo", "-p", "tcp", "!", "--dport", "53", "-m", "owner", "!",
                            owner, id, "-j", "RETURN",
                        ],
                    );
                } else {
                    b.append(
                        ISTIO_OUTPUT,
                        "nat",
                        &["-o", "lo", "-m", "owner", "!", owner, id, "-j", "RETURN"],
                    );
                }
            }
            // The proxy's own traffic is never captured again.
            b.append(
                ISTIO_OUTPUT,
                "nat",
                &["-m", "owner", owner, id, "-j", "RETURN"],
            );
        }
    }

    owner_groups(&mut b, cfg);

    if redirect_dns {
        dns_redirect(&mut b, cfg);
    }

    b.append_versioned(
        lo4,
        "::1/128",
        ISTIO_OUTPUT,
        "nat",
        &["-d", IPV, "-j", "RETURN"],
    );
    for cidr in &v4_exclude.cidrs {
        b.append_v4(ISTIO_OUTPUT, "nat", &["-d", cidr, "-j", "RETURN"]);
    }
    for cidr in &v6_exclude.cidrs {
        b.append_v6(ISTIO_OUTPUT, "nat", &["-d", cidr, "-j", "RETURN"]);
    }

    for port in split(&cfg.outbound_ports_include) {
        b.append(
            ISTIO_OUTPUT,
            "nat",
            &["-p", "tcp", "--dport", port, "-j", ISTIO_REDIRECT],
        );
    }

    outbound_include(&mut b, cfg, &v4_include, false);
    outbound_include(&mut b, cfg, &v6_include, true);

    if tproxy {
        b.append(
            "PREROUTING",
            "mangle",
            &[
                "-p",
                "tcp",
                "-m",
                "mark",
                "--mark",
                &mark,
                "-j",
                "CONNMARK",
                "--save-mark",
            ],
        );
        b.append(
            "OUTPUT",
            "mangle",
            &[
                "-p", "tcp", "-o", "lo", "-m", "mark", "--mark", &mark, "-j", "RETURN",
            ],
        );
        for (owner, ids) in [
            ("--uid-owner", &cfg.proxy_uid),
            ("--gid-owner", &cfg.proxy_gid),
        ] {
            for id in split(ids) {
                b.append_versioned(
                    lo4,
                    "::1/128",
                    "OUTPUT",
                    "mangle",
                    &[
                        "!",
                        "-d",
                        IPV,
                        "-p",
                        "tcp",
                        "-o",
                        "lo",
                        "-m",
                        "owner",
                        owner,
                        id,
                        "-j",
                        "MARK",
                        "--set-mark",
                        OUTBOUND_MARK,
                    ],
                );
            }
        }
        b.append(
            "OUTPUT",
            "mangle",
            &[
                "-p",
                "tcp",
                "-m",
                "connmark",
                "--mark",
                &mark,
                "-j",
                "CONNMARK",
                "--restore-mark",
            ],
        );
        b.insert(
            ISTIO_INBOUND,
            "mangle",
            1,
            &["-p", "tcp", "-m", "mark", "--mark", &mark, "-j", "RETURN"],
        );
        b.insert_v4(
            ISTIO_INBOUND,
            "mangle",
            2,
            &[
                "-p",
                "tcp",
                "-s",
                "127.0.0.6/32",
                "-i",
                "lo",
                "-j",
                "RETURN",
            ],
        );
        b.insert_v6(
            ISTIO_INBOUND,
            "mangle",
            2,
            &["-p", "tcp", "-s", "::6/128", "-i", "lo", "-j", "RETURN"],
        );
        b.insert(
            ISTIO_INBOUND,
            "mangle",
            3,
            &[
                "-p",
                "tcp",
                "-i",
                "lo",
                "-m",
                "mark",
                "!",
                "--mark",
                OUTBOUND_MARK,
                "-j",
                "RETURN",
            ],
        );
    }
    b
}

fn inbound_ports(b: &mut RuleBuilder, cfg: &Config, tproxy: bool, mark: &str, capture_port: &str) {
    if cfg.inbound_ports_include.is_empty() {
        return;
    }
    let table = if tproxy {
        b.append(ISTIO_DIVERT, "mangle", &["-j", "MARK", "--set-mark", mark]);
        b.append(ISTIO_DIVERT, "mangle", &["-j", "ACCEPT"]);
        let tproxy_mark = format!("{mark}/0xffffffff");
        b.append_versioned(
            &cfg.host_ipv4_loopback_cidr,
            "::1/128",
            ISTIO_TPROXY,
            "mangle",
            &[
                "!",
                "-d",
                IPV,
                "-p",
                "tcp",
                "-j",
                "TPROXY",
                "--tproxy-mark",
                &tproxy_mark,
                "--on-port",
                capture_port,
            ],
        );
        "mangle"
    } else {
        "nat"
    };
    b.append("PREROUTING", table, &["-p", "tcp", "-j", ISTIO_INBOUND]);

    if cfg.inbound_ports_include == "*" {
        for port in split(&cfg.inbound_ports_exclude) {
            b.append(
                ISTIO_INBOUND,
                table,
                &["-p", "tcp", "--dport", port, "-j", "RETURN"],
            );
        }
        if tproxy {
            b.append(
                ISTIO_INBOUND,
                "mangle",
                &[
                    "-p",
                    "tcp",
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "RELATED,ESTABLISHED",
                    "-j",
                    ISTIO_DIVERT,
                ],
            );
            b.append(ISTIO_INBOUND, "mangle", &["-p", "tcp", "-j", ISTIO_TPROXY]);
        } else {
            b.append(
                ISTIO_INBOUND,
                "nat",
                &["-p", "tcp", "-j", ISTIO_IN_REDIRECT],
            );
        }
    } else {
        for port in split(&cfg.inbound_ports_include) {
            if tproxy {
                b.append(
                    ISTIO_INBOUND,
                    "mangle",
                    &[
                        "-p",
                        "tcp",
                        "--dport",
                        port,
                        "-m",
                        "conntrack",
                        "--ctstate",
                        "RELATED,ESTABLISHED",
                        "-j",
                        ISTIO_DIVERT,
                    ],
                );
                b.append(
                    ISTIO_INBOUND,
                    "mangle",
                    &["-p", "tcp", "--dport", port, "-j", ISTIO_TPROXY],
                );
            } else {
                b.append(
                    ISTIO_INBOUND,
                    "nat",
                    &["-p", "tcp", "--dport", port, "-j", ISTIO_IN_REDIRECT],
                );
            }
        }
    }
}

fn owner_groups(b: &mut RuleBuilder, cfg: &Config) {
    if cfg.owner_groups_include == "*" {
        for group in split(&cfg.owner_groups_exclude) {
            b.append(
                ISTIO_OUTPUT,
                "nat",
                &["-m", "owner", "--gid-owner", group, "-j", "RETURN"],
            );
        }
    } else {
        let mut params: Vec<&str> = Vec::new();
        for group in split(&cfg.owner_groups_include) {
            params.extend(["-m", "owner", "!", "--gid-owner", group]);
        }
        params.extend(["-j", "RETURN"]);
        b.append(ISTIO_OUTPUT, "nat", &params);
    }
}

fn outbound_include(b: &mut RuleBuilder, cfg: &Config, ranges: &Ranges, v6: bool) {
    let append = |b: &mut RuleBuilder, params: &[&str]| {
        if v6 {
            b.append_v6(ISTIO_OUTPUT, "nat", params);
        } else {
            b.append_v4(ISTIO_OUTPUT, "nat", params);
        }
    };
    let insert = |b: &mut RuleBuilder, params: &[&str]| {
        if v6 {
            b.insert_v6("PREROUTING", "nat", 1, params);
        } else {
            b.insert_v4("PREROUTING", "nat", 1, params);
        }
    };
    if ranges.wildcard {
        append(b, &["-j", ISTIO_REDIRECT]);
        for nic in split(&cfg.reroute_virtual_interfaces) {
            insert(b, &["-i", nic, "-j", ISTIO_REDIRECT]);
        }
    } else {
        for cidr in &ranges.cidrs {
            for nic in split(&cfg.reroute_virtual_interfaces) {
                insert(b, &["-i", nic, "-d", cidr, "-j", ISTIO_REDIRECT]);
            }
            append(b, &["-d", cidr, "-j", ISTIO_REDIRECT]);
        }
    }
}

fn dns_redirect(b: &mut RuleBuilder, cfg: &Config) {
    let v4 = &cfg.dns_servers_v4;
    let v6 = &cfg.dns_servers_v6;
    let all = cfg.capture_all_dns;
    b.append("OUTPUT", "raw", &["-j", ISTIO_OUTPUT_DNS]);
    if all || !v4.is_empty() {
        b.append_v4(ISTIO_OUTPUT, "nat", &["-j", ISTIO_OUTPUT_DNS]);
    }
    if all || !v6.is_empty() {
        b.append_v6(ISTIO_OUTPUT, "nat", &["-j", ISTIO_OUTPUT_DNS]);
    }
    // Queries to port 53 (every one, or those to resolv.conf's servers) go to the agent's DNS
    // proxy: TCP first, then UDP (Istio spells the target `--to-ports` for one and
    // `--to-port` for the other).
    let per_family: [(&[String], u8, bool); 2] = [(v4, 32, false), (v6, 128, true)];
    for (proto, to) in [("tcp", "--to-ports"), ("udp", "--to-port")] {
        let redirect = |dest: Option<&str>| {
            let mut rule = vec!["-p", proto, "--dport", "53"];
            if let Some(d) = dest {
                rule.extend(["-d", d]);
            }
            rule.extend(["-j", "REDIRECT", to, DNS_PORT]);
            rule.into_iter().map(str::to_string).collect::<Vec<_>>()
        };
        if all {
            b.append(ISTIO_OUTPUT_DNS, "nat", &as_strs(&redirect(None)));
            continue;
        }
        for (servers, prefix, is_v6) in per_family {
            for s in servers {
                let d = format!("{s}/{prefix}");
                append_family(
                    b,
                    is_v6,
                    ISTIO_OUTPUT_DNS,
                    "nat",
                    &as_strs(&redirect(Some(&d))),
                );
            }
        }
    }

    // Conntrack zones: agent <-> upstream in zone 1, client <-> agent in zone 2.
    for (owner, ids) in [
        ("--uid-owner", &cfg.proxy_uid),
        ("--gid-owner", &cfg.proxy_gid),
    ] {
        for id in split(ids) {
            b.append(
                ISTIO_OUTPUT_DNS,
                "raw",
                &[
                    "-p", "udp", "--dport", "53", "-m", "owner", owner, id, "-j", "CT", "--zone",
                    "1",
                ],
            );
            b.append(
                ISTIO_OUTPUT_DNS,
                "raw",
                &[
                    "-p", "udp", "--sport", DNS_PORT, "-m", "owner", owner, id, "-j", "CT",
                    "--zone", "2",
                ],
            );
        }
    }
    if all {
        b.append("PREROUTING", "raw", &["-j", ISTIO_INBOUND]);
        b.append(
            ISTIO_OUTPUT_DNS,
            "raw",
            &["-p", "udp", "--dport", "53", "-j", "CT", "--zone", "2"],
        );
        b.append(
            ISTIO_INBOUND,
            "raw",
            &["-p", "udp", "--sport", "53", "-j", "CT", "--zone", "1"],
        );
    } else {
        for (servers, prefix, is_v6) in per_family {
            if !servers.is_empty() {
                append_family(b, is_v6, "PREROUTING", "raw", &["-j", ISTIO_INBOUND]);
            }
            for s in servers {
                let a = format!("{s}/{prefix}");
                append_family(
                    b,
                    is_v6,
                    ISTIO_OUTPUT_DNS,
                    "raw",
                    &[
                        "-p", "udp", "--dport", "53", "-d", &a, "-j", "CT", "--zone", "2",
                    ],
                );
                append_family(
                    b,
                    is_v6,
                    ISTIO_INBOUND,
                    "raw",
                    &[
                        "-p", "udp", "--sport", "53", "-s", &a, "-j", "CT", "--zone", "1",
                    ],
                );
            }
        }
    }
}

/// Appends a rule for one family only.
fn append_family(b: &mut RuleBuilder, v6: bool, chain: &str, table: &str, rule: &[&str]) {
    if v6 {
        b.append_v6(chain, table, rule);
    } else {
        b.append_v4(chain, table, rule);
    }
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}
