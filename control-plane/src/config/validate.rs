//! Validation of each Istio kind's spec, one function per kind; an error names the field
//! (below `spec.`) and what was expected.

use std::net::IpAddr;

use super::kinds::*;
use super::{DocError, Spec, export_to, is_dns_label_path};

fn is_host(s: &str) -> bool {
    let s = s.strip_prefix("*.").unwrap_or(s);
    // A fully qualified name may end in a dot, as Istio's validation allows.
    let s = if s.len() > 1 {
        s.strip_suffix('.').unwrap_or(s)
    } else {
        s
    };
    s == "*"
        || (!s.is_empty()
            && s.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            }))
}

fn check_port(field: &str, n: u32) -> Result<(), DocError> {
    if (1..=65535).contains(&n) {
        Ok(())
    } else {
        Err((field.to_string(), format!("{n} is not a port (1-65535)")))
    }
}

pub(super) fn check_duration(field: &str, s: &Option<String>) -> Result<(), DocError> {
    if let Some(s) = s {
        go_syntax::parse_duration(s).map_err(|why| {
            let expected = go_syntax::DURATION_EXPECTED;
            (
                field.to_string(),
                format!("{s:?} is not {expected} ({why})"),
            )
        })?;
    }
    Ok(())
}

const PROTOCOLS: [&str; 10] = [
    "HTTP", "HTTP2", "HTTPS", "GRPC", "TCP", "TLS", "MONGO", "MYSQL", "REDIS", "UDP",
];

/// Checks one object's spec; the error names the field (below `spec.`) and what was expected.
pub(super) fn spec(spec: &Spec) -> Result<(), DocError> {
    match spec {
        Spec::ServiceEntry(se) => service_entry(se),
        Spec::WorkloadEntry(we) => {
            if we.address.is_empty() {
                return Err(("address".into(), "required".into()));
            }
            workload_entry(we, Resolution::Static)
        }
        Spec::VirtualService(vs) => virtual_service(vs),
        Spec::DestinationRule(dr) => destination_rule(dr),
        Spec::PeerAuthentication(pa) => peer_authentication(pa),
        Spec::Sidecar(sc) => sidecar(sc),
        // Checked while parsing (control-plane/src/config/kube.rs).
        Spec::Service(_)
        | Spec::EndpointSlice(_)
        | Spec::Endpoints(_)
        | Spec::Pod(_)
        | Spec::Namespace(_) => Ok(()),
    }
}

fn service_entry(se: &ServiceEntry) -> Result<(), DocError> {
    if se.hosts.is_empty() {
        return Err(("hosts".into(), "at least one host is required".into()));
    }
    for (i, h) in se.hosts.iter().enumerate() {
        if !is_host(h) || h == "*" {
            return Err((format!("hosts[{i}]"), format!("{h:?} is not a host name")));
        }
    }
    for (i, a) in se.addresses.iter().enumerate() {
        let ip = a.split('/').next().unwrap_or(a);
        if ip.parse::<IpAddr>().is_err() {
            return Err((
                format!("addresses[{i}]"),
                format!("{a:?} is not an IP or CIDR"),
            ));
        }
    }
    service_entry_ports(se)?;
    if se.workload_selector.is_some() && !se.endpoints.is_empty() {
        return Err((
            "workloadSelector".into(),
            "cannot be combined with endpoints".into(),
        ));
    }
    for (i, e) in se.endpoints.iter().enumerate() {
        workload_entry(e, se.resolution).map_err(|(f, r)| (format!("endpoints[{i}].{f}"), r))?;
    }
    if matches!(se.resolution, Resolution::Static)
        && se.endpoints.is_empty()
        && se.workload_selector.is_none()
    {
        return Err((
            "endpoints".into(),
            "resolution STATIC needs endpoints or a workloadSelector".into(),
        ));
    }
    export_to::check("exportTo", &se.export_to)
}

fn service_entry_ports(se: &ServiceEntry) -> Result<(), DocError> {
    if se.ports.is_empty() {
        return Err(("ports".into(), "at least one port is required".into()));
    }
    for (i, p) in se.ports.iter().enumerate() {
        check_port(&format!("ports[{i}].number"), p.number)?;
        if let Some(t) = p.target_port {
            check_port(&format!("ports[{i}].targetPort"), t)?;
        }
        if let Some(proto) = &p.protocol
            && !PROTOCOLS.contains(&proto.to_ascii_uppercase().as_str())
        {
            return Err((
                format!("ports[{i}].protocol"),
                format!("unknown protocol {proto:?} (expected one of {PROTOCOLS:?})"),
            ));
        }
    }
    Ok(())
}

fn virtual_service(vs: &VirtualService) -> Result<(), DocError> {
    if vs.hosts.is_empty() {
        return Err(("hosts".into(), "at least one host is required".into()));
    }
    export_to::check("exportTo", &vs.export_to)?;
    for (i, h) in vs.hosts.iter().enumerate() {
        if !is_host(h) {
            return Err((format!("hosts[{i}]"), format!("{h:?} is not a host name")));
        }
    }
    for (i, r) in vs.http.iter().enumerate() {
        http_route(r).map_err(|(f, reason)| (format!("http[{i}].{f}"), reason))?;
    }
    Ok(())
}

/// One `http[i]` entry of a VirtualService (fields named below it).
fn http_route(r: &HttpRoute) -> Result<(), DocError> {
    if r.route.is_empty() {
        return Err((
            "route".into(),
            "at least one destination is required".into(),
        ));
    }
    for (j, d) in r.route.iter().enumerate() {
        if !is_host(&d.destination.host) {
            return Err((
                format!("route[{j}].destination.host"),
                format!("{:?} is not a host name", d.destination.host),
            ));
        }
        if let Some(p) = &d.destination.port {
            check_port(&format!("route[{j}].destination.port.number"), p.number)?;
        }
    }
    if r.route.len() > 1 && r.route.iter().map(|d| d.weight.unwrap_or(0)).sum::<u32>() == 0 {
        return Err((
            "route".into(),
            "weights are required with several destinations".into(),
        ));
    }
    check_duration("timeout", &r.timeout)?;
    if let Some(rt) = &r.retries {
        check_duration("retries.perTryTimeout", &rt.per_try_timeout)?;
    }
    for (j, m) in r.matches.iter().enumerate() {
        if let Some(u) = &m.uri {
            string_match(format!("match[{j}].uri"), u)?;
        }
        for (h, s) in &m.headers {
            string_match(format!("match[{j}].headers.{h}"), s)?;
        }
    }
    Ok(())
}

fn string_match(field: String, s: &StringMatch) -> Result<(), DocError> {
    let n = [&s.exact, &s.prefix, &s.regex]
        .iter()
        .filter(|x| x.is_some())
        .count();
    if n == 1 {
        Ok(())
    } else {
        Err((
            field,
            "exactly one of exact, prefix, regex is required".into(),
        ))
    }
}

fn destination_rule(dr: &DestinationRule) -> Result<(), DocError> {
    if !is_host(&dr.host) {
        return Err(("host".into(), format!("{:?} is not a host name", dr.host)));
    }
    export_to::check("exportTo", &dr.export_to)?;
    traffic_policy("trafficPolicy", &dr.traffic_policy)?;
    let mut names = std::collections::BTreeSet::new();
    for (i, s) in dr.subsets.iter().enumerate() {
        if !is_dns_label_path(&s.name) {
            return Err((
                format!("subsets[{i}].name"),
                format!("{:?} is not a DNS-1123 name", s.name),
            ));
        }
        if !names.insert(&s.name) {
            return Err((
                format!("subsets[{i}].name"),
                format!("duplicate subset {:?}", s.name),
            ));
        }
        traffic_policy(&format!("subsets[{i}].trafficPolicy"), &s.traffic_policy)?;
    }
    Ok(())
}

fn traffic_policy(field: &str, tp: &Option<TrafficPolicy>) -> Result<(), DocError> {
    if let Some(tp) = tp
        && let Some(cp) = &tp.connection_pool
        && let Some(tcp) = &cp.tcp
    {
        check_duration(
            &format!("{field}.connectionPool.tcp.connectTimeout"),
            &tcp.connect_timeout,
        )?;
    }
    Ok(())
}

fn peer_authentication(pa: &PeerAuthentication) -> Result<(), DocError> {
    for p in pa.port_level_mtls.keys() {
        check_port(&format!("portLevelMtls.{p}"), *p)?;
    }
    if !pa.port_level_mtls.is_empty() && pa.selector.is_none() {
        return Err(("portLevelMtls".into(), "requires a selector".into()));
    }
    Ok(())
}

fn sidecar(sc: &Sidecar) -> Result<(), DocError> {
    for (i, e) in sc.egress.iter().enumerate() {
        if e.hosts.is_empty() {
            return Err((
                format!("egress[{i}].hosts"),
                "at least one host is required".into(),
            ));
        }
        for (j, h) in e.hosts.iter().enumerate() {
            let ok = h
                .split_once('/')
                .is_some_and(|(ns, host)| !ns.is_empty() && is_host(host));
            if !ok {
                return Err((
                    format!("egress[{i}].hosts[{j}]"),
                    format!("{h:?} is not namespace/host"),
                ));
            }
        }
    }
    Ok(())
}

fn workload_entry(we: &WorkloadEntry, resolution: Resolution) -> Result<(), DocError> {
    let dns = matches!(resolution, Resolution::Dns | Resolution::DnsRoundRobin);
    if !we.address.is_empty() && !dns && we.address.parse::<IpAddr>().is_err() {
        return Err((
            "address".into(),
            format!("{:?} is not an IP address", we.address),
        ));
    }
    for (name, p) in &we.ports {
        check_port(&format!("ports.{name}"), *p)?;
    }
    if let Some(w) = we.weight
        && w == 0
    {
        return Err(("weight".into(), "must be positive".into()));
    }
    Ok(())
}
