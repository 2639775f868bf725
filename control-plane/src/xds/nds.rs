//! NDS: the DNS proxy's `NameTable` for proxies with `DNS_CAPTURE`, built as istiod's
//! `BuildNameTable` builds it.
//!
//! For each service the proxy sees: its addresses for the proxy ([`Snapshot::vips_for`], IPs
//! only: CIDRs are left out), wildcard hosts included. A service without one is headless: if
//! its resolution is NONE and it has ports, it answers with its endpoints' addresses (ready
//! ones, or all with `publishNotReadyAddresses`), and each endpoint with a `subdomain` gets
//! its own `<hostname>.<subdomain>.<ns>.svc.<domain>` entry; otherwise it has no entry. A
//! Kubernetes Service's entry carries registry `Kubernetes`, its namespace and short name, from
//! which the DNS proxy answers `name` (own namespace only), `name.ns` and `name.ns.svc`; a
//! ServiceEntry's carries registry `External`. A host already in the table from a
//! ServiceEntry is taken over by a Kubernetes Service, or gets another ServiceEntry's IPs
//! appended.

use std::collections::BTreeSet;
use std::net::IpAddr;

use proto::istio::nds::{NameTable, name_table::NameInfo};

use super::*;
use crate::config::kinds::Resolution;
use crate::model::{Registry, Service};

pub(super) fn generate(snap: &Snapshot, view: &ProxyView) -> Resources {
    let table = if view.dns_capture {
        name_table(snap, view)
    } else {
        NameTable::default()
    };
    vec![resource("", &table)]
}

fn is_ip(s: &str) -> bool {
    s.parse::<IpAddr>().is_ok()
}

/// The name table of `view` (istiod's `BuildNameTable`).
pub(crate) fn name_table(snap: &Snapshot, view: &ProxyView) -> NameTable {
    let mut table = NameTable::default();
    for svc in snap.visible_services(view) {
        let vips = snap.vips_for(view, svc);
        // No address at all (istiod's 0.0.0.0): headless. CIDRs are addresses, but no answer.
        let headless = vips.is_empty();
        let mut ips: Vec<String> = vips.into_iter().filter(|v| is_ip(v)).collect();
        if headless && svc.resolution == Resolution::None && !svc.ports.is_empty() {
            ips = headless_ips(&mut table, svc);
        }
        if ips.is_empty() {
            continue; // no address to answer with
        }
        let k8s = svc.registry == Registry::Kubernetes;
        match table.table.get_mut(&svc.host) {
            None => {
                table.table.insert(svc.host.clone(), info(svc, ips));
            }
            Some(existing) if existing.registry != Registry::Kubernetes.as_str() => {
                if k8s {
                    *existing = info(svc, ips);
                } else {
                    existing.ips.extend(ips);
                }
            }
            Some(_) => {} // a Kubernetes Service's entry stays
        }
    }
    table
}

fn info(svc: &Service, ips: Vec<String>) -> NameInfo {
    let mut ni = NameInfo {
        ips,
        registry: svc.registry.as_str().into(),
        ..Default::default()
    };
    if svc.registry == Registry::Kubernetes {
        ni.namespace = svc.namespace.clone();
        ni.shortname = svc.name.clone();
    }
    ni
}

/// A headless service's endpoint addresses; adds its pods' own names to `table` on the way.
fn headless_ips(table: &mut NameTable, svc: &Service) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut ips = Vec::new();
    let mut pods: Vec<(String, String, Vec<String>)> = Vec::new();
    for ep in &svc.endpoints {
        if !is_ip(&ep.address) || !(ep.healthy || svc.publish_not_ready) {
            continue;
        }
        if !seen.insert(ep.address.clone()) {
            continue;
        }
        if !ep.subdomain.is_empty()
            && let Some((_, rest)) = svc.host.split_once('.')
        {
            let short = format!("{}.{}", ep.hostname, ep.subdomain);
            let host = format!("{short}.{rest}");
            match pods.iter_mut().find(|(h, _, _)| *h == host) {
                Some((_, _, v)) => v.push(ep.address.clone()),
                None => pods.push((host, short, vec![ep.address.clone()])),
            }
        }
        ips.push(ep.address.clone());
    }
    for (host, short, pod_ips) in pods {
        table.table.insert(
            host,
            NameInfo {
                ips: pod_ips,
                registry: svc.registry.as_str().into(),
                namespace: svc.namespace.clone(),
                shortname: short,
                ..Default::default()
            },
        );
    }
    ips
}
