//! The capture phases as iptables rules.

use super::{
    DNS_PORT, ISTIO_DIVERT, ISTIO_DROP, ISTIO_IN_REDIRECT, ISTIO_INBOUND, ISTIO_OUTPUT,
    ISTIO_OUTPUT_DNS, ISTIO_REDIRECT, ISTIO_TPROXY, OUTBOUND_MARK, Owner, Phases, Plan,
};
use crate::builder::{IP_VERSION_SPECIFIC as IPV, RuleBuilder};
use crate::config::{InboundPorts, Ranges};

impl Owner {
    fn flag(self) -> &'static str {
        match self {
            Owner::Uid => "--uid-owner",
            Owner::Gid => "--gid-owner",
        }
    }
}

impl Phases for RuleBuilder {
    fn short_circuit_exclude_interfaces(&mut self, p: &Plan) {
        for nic in &p.cfg.exclude_interfaces {
            self.append("PREROUTING", "nat", &["-i", nic, "-j", "RETURN"]);
            self.append("OUTPUT", "nat", &["-o", nic, "-j", "RETURN"]);
        }
        if p.tproxy {
            for nic in &p.cfg.exclude_interfaces {
                self.append("PREROUTING", "mangle", &["-i", nic, "-j", "RETURN"]);
                self.append("OUTPUT", "mangle", &["-o", nic, "-j", "RETURN"]);
            }
        }
    }

    fn short_circuit_kube_internal_interface(&mut self, p: &Plan) {
        for nic in &p.cfg.reroute_virtual_interfaces {
            self.insert("PREROUTING", "nat", 1, &["-i", nic, "-j", "RETURN"]);
        }
    }

    fn drop_invalid(&mut self, _: &Plan) {
        self.append(
            "PREROUTING",
            "mangle",
            &["-m", "conntrack", "--ctstate", "INVALID", "-j", ISTIO_DROP],
        );
        self.append(ISTIO_DROP, "mangle", &["-j", "DROP"]);
    }

    fn redirect_chains(&mut self, p: &Plan) {
        let cfg = p.cfg;
        let tunnel = cfg.inbound_tunnel_port.to_string();
        let proxy_port = cfg.proxy_port.to_string();
        let capture_port = cfg.inbound_capture_port.to_string();
        self.append(
            ISTIO_INBOUND,
            "nat",
            &["-p", "tcp", "--dport", &tunnel, "-j", "RETURN"],
        );
        self.append(
            ISTIO_REDIRECT,
            "nat",
            &["-p", "tcp", "-j", "REDIRECT", "--to-ports", &proxy_port],
        );
        self.append(
            ISTIO_IN_REDIRECT,
            "nat",
            &["-p", "tcp", "-j", "REDIRECT", "--to-ports", &capture_port],
        );
    }

    fn handle_inbound_ports_include(&mut self, p: &Plan) {
        let cfg = p.cfg;
        if cfg.inbound_ports_include == InboundPorts::Off {
            return;
        }
        let table = if p.tproxy {
            inbound_tproxy_mode(self, p);
            "mangle"
        } else {
            "nat"
        };
        self.append("PREROUTING", table, &["-p", "tcp", "-j", ISTIO_INBOUND]);
        match &cfg.inbound_ports_include {
            InboundPorts::All => {
                for port in &cfg.inbound_ports_exclude {
                    self.append(
                        ISTIO_INBOUND,
                        table,
                        &["-p", "tcp", "--dport", port.as_str(), "-j", "RETURN"],
                    );
                }
                if p.tproxy {
                    self.append(
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
                    self.append(ISTIO_INBOUND, "mangle", &["-p", "tcp", "-j", ISTIO_TPROXY]);
                } else {
                    self.append(
                        ISTIO_INBOUND,
                        "nat",
                        &["-p", "tcp", "-j", ISTIO_IN_REDIRECT],
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
        self.append("OUTPUT", "nat", &["-j", ISTIO_OUTPUT]);
        for port in &p.cfg.outbound_ports_exclude {
            for proto in ["tcp", "udp"] {
                self.append(
                    ISTIO_OUTPUT,
                    "nat",
                    &["-p", proto, "--dport", port.as_str(), "-j", "RETURN"],
                );
            }
        }
        // 127.0.0.6 / ::6: the inbound passthrough cluster's bind address.
        self.append_versioned(
            "127.0.0.6/32",
            "::6/128",
            ISTIO_OUTPUT,
            "nat",
            &["-o", "lo", "-s", IPV, "-j", "RETURN"],
        );
    }

    fn proxy_owner_rules(&mut self, p: &Plan) {
        let lo4 = p.cfg.host_ipv4_loopback_cidr.as_str();
        let tunnel = p.cfg.inbound_tunnel_port.to_string();
        let dns_tunnel = format!("53,{tunnel}");
        for (owner, ids) in p.owners() {
            let owner = owner.flag();
            for id in ids {
                let id = id.as_str();
                // App calls back to itself through a service VIP go through Envoy inbound;
                // with DNS capture the proxy user's calls to port 53 do not.
                let ports: &[&str] = if p.redirect_dns && owner == "--uid-owner" {
                    &["-m", "multiport", "!", "--dports", &dns_tunnel]
                } else {
                    &["!", "--dport", &tunnel]
                };
                let mut rule = vec!["-o", "lo", "!", "-d", IPV, "-p", "tcp"];
                rule.extend(ports);
                rule.extend(["-m", "owner", owner, id, "-j", ISTIO_IN_REDIRECT]);
                self.append_versioned(lo4, "::1/128", ISTIO_OUTPUT, "nat", &rule);
                // App-to-app over loopback by endpoint address is not captured, unless
                // loopback ranges were explicitly included.
                if !p.loopback_included {
                    let rule: &[&str] = if p.redirect_dns {
                        &[
                            "-o", "lo", "-p", "tcp", "!", "--dport", "53", "-m", "owner", "!",
                            owner, id, "-j", "RETURN",
                        ]
                    } else {
                        &["-o", "lo", "-m", "owner", "!", owner, id, "-j", "RETURN"]
                    };
                    self.append(ISTIO_OUTPUT, "nat", rule);
                }
                // The proxy's own traffic is never captured again.
                self.append(
                    ISTIO_OUTPUT,
                    "nat",
                    &["-m", "owner", owner, id, "-j", "RETURN"],
                );
            }
        }
    }

    fn handle_capture_by_owner_group(&mut self, p: &Plan) {
        let groups = &p.cfg.owner_groups;
        match &groups.include {
            None => {
                for group in &groups.exclude {
                    self.append(
                        ISTIO_OUTPUT,
                        "nat",
                        &["-m", "owner", "--gid-owner", group, "-j", "RETURN"],
                    );
                }
            }
            Some(include) => {
                let mut params: Vec<&str> = Vec::new();
                for group in include {
                    params.extend(["-m", "owner", "!", "--gid-owner", group]);
                }
                params.extend(["-j", "RETURN"]);
                self.append(ISTIO_OUTPUT, "nat", &params);
            }
        }
    }

    fn setup_dns_redir(&mut self, p: &Plan) {
        dns_redirect(self, p);
        dns_conntrack_zones(self, p);
    }

    fn outbound_ip_exclusions(&mut self, p: &Plan) {
        let cfg = p.cfg;
        self.append_versioned(
            &cfg.host_ipv4_loopback_cidr,
            "::1/128",
            ISTIO_OUTPUT,
            "nat",
            &["-d", IPV, "-j", "RETURN"],
        );
        for cidr in &cfg.outbound_ip_ranges_exclude.v4.cidrs {
            self.append_v4(
                ISTIO_OUTPUT,
                "nat",
                &["-d", &cidr.to_string(), "-j", "RETURN"],
            );
        }
        for cidr in &cfg.outbound_ip_ranges_exclude.v6.cidrs {
            self.append_v6(
                ISTIO_OUTPUT,
                "nat",
                &["-d", &cidr.to_string(), "-j", "RETURN"],
            );
        }
    }

    fn handle_outbound_ports_include(&mut self, p: &Plan) {
        for port in &p.cfg.outbound_ports_include {
            self.append(
                ISTIO_OUTPUT,
                "nat",
                &["-p", "tcp", "--dport", port.as_str(), "-j", ISTIO_REDIRECT],
            );
        }
    }

    fn handle_outbound_include_rules(&mut self, p: &Plan) {
        let include = &p.cfg.outbound_ip_ranges_include;
        outbound_include(self, p, &include.v4, false);
        outbound_include(self, p, &include.v6, true);
    }

    fn tproxy_marks(&mut self, p: &Plan) {
        let lo4 = p.cfg.host_ipv4_loopback_cidr.as_str();
        let mark = p.cfg.inbound_tproxy_mark.to_string();
        let mark = mark.as_str();
        self.append(
            "PREROUTING",
            "mangle",
            &[
                "-p",
                "tcp",
                "-m",
                "mark",
                "--mark",
                mark,
                "-j",
                "CONNMARK",
                "--save-mark",
            ],
        );
        self.append(
            "OUTPUT",
            "mangle",
            &[
                "-p", "tcp", "-o", "lo", "-m", "mark", "--mark", mark, "-j", "RETURN",
            ],
        );
        for (owner, ids) in p.owners() {
            for id in ids {
                self.append_versioned(
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
                        owner.flag(),
                        id,
                        "-j",
                        "MARK",
                        "--set-mark",
                        OUTBOUND_MARK,
                    ],
                );
            }
        }
        self.append(
            "OUTPUT",
            "mangle",
            &[
                "-p",
                "tcp",
                "-m",
                "connmark",
                "--mark",
                mark,
                "-j",
                "CONNMARK",
                "--restore-mark",
            ],
        );
        tproxy_inbound_returns(self, mark);
    }
}

/// TPROXY: what `ISTIO_INBOUND` lets through first: marked traffic, the inbound
/// passthrough's source, loopback traffic the proxy did not mark.
fn tproxy_inbound_returns(b: &mut RuleBuilder, mark: &str) {
    b.insert(
        ISTIO_INBOUND,
        "mangle",
        1,
        &["-p", "tcp", "-m", "mark", "--mark", mark, "-j", "RETURN"],
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

/// TPROXY's divert and tproxy chains (nftables' `handleInboundTProxyMode`).
fn inbound_tproxy_mode(b: &mut RuleBuilder, p: &Plan) {
    let mark = p.cfg.inbound_tproxy_mark.to_string();
    let capture_port = p.cfg.inbound_capture_port.to_string();
    b.append(ISTIO_DIVERT, "mangle", &["-j", "MARK", "--set-mark", &mark]);
    b.append(ISTIO_DIVERT, "mangle", &["-j", "ACCEPT"]);
    let tproxy_mark = format!("{mark}/0xffffffff");
    b.append_versioned(
        &p.cfg.host_ipv4_loopback_cidr,
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
            &capture_port,
        ],
    );
}

/// One listed inbound port: diverted (TPROXY) or redirected.
fn inbound_port(b: &mut RuleBuilder, p: &Plan, port: &str) {
    if p.tproxy {
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

fn outbound_include(b: &mut RuleBuilder, p: &Plan, ranges: &Ranges, v6: bool) {
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
    let nics = &p.cfg.reroute_virtual_interfaces;
    if ranges.wildcard {
        append(b, &["-j", ISTIO_REDIRECT]);
        for nic in nics {
            insert(b, &["-i", nic, "-j", ISTIO_REDIRECT]);
        }
    } else {
        for cidr in &ranges.cidrs {
            let cidr = cidr.to_string();
            for nic in nics {
                insert(b, &["-i", nic, "-d", &cidr, "-j", ISTIO_REDIRECT]);
            }
            append(b, &["-d", &cidr, "-j", ISTIO_REDIRECT]);
        }
    }
}

/// DNS to the agent: the jumps into `ISTIO_OUTPUT_DNS` and its redirects, TCP first, then UDP
/// (Istio spells the target `--to-ports` for one and `--to-port` for the other).
fn dns_redirect(b: &mut RuleBuilder, p: &Plan) {
    let cfg = p.cfg;
    let all = cfg.capture_all_dns;
    b.append("OUTPUT", "raw", &["-j", ISTIO_OUTPUT_DNS]);
    if all || !cfg.dns_servers_v4.is_empty() {
        b.append_v4(ISTIO_OUTPUT, "nat", &["-j", ISTIO_OUTPUT_DNS]);
    }
    if all || !cfg.dns_servers_v6.is_empty() {
        b.append_v6(ISTIO_OUTPUT, "nat", &["-j", ISTIO_OUTPUT_DNS]);
    }
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
        for (servers, prefix, is_v6) in per_family(p) {
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
}

/// Conntrack zones: agent <-> upstream in zone 1, client <-> agent in zone 2 (Istio's
/// `addDNSConntrackZones`).
fn dns_conntrack_zones(b: &mut RuleBuilder, p: &Plan) {
    for (owner, ids) in p.owners() {
        let owner = owner.flag();
        for id in ids {
            let id = id.as_str();
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
    if p.cfg.capture_all_dns {
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
        return;
    }
    for (servers, prefix, is_v6) in per_family(p) {
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

/// The nameservers of each family with their host prefix length.
fn per_family<'a>(p: &Plan<'a>) -> [(&'a [String], u8, bool); 2] {
    [
        (&p.cfg.dns_servers_v4, 32, false),
        (&p.cfg.dns_servers_v6, 128, true),
    ]
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
