//! NDS: the DNS proxy's `NameTable` (host → VIPs) for proxies with `DNS_CAPTURE`.

use proto::istio::nds::{NameTable, name_table::NameInfo};

use super::*;
use crate::config::kinds::Resolution;

pub(super) fn generate(snap: &Snapshot, view: &ProxyView) -> Resources {
    let mut table = NameTable::default();
    if view.dns_capture {
        for svc in snap.visible_services(view) {
            if svc.host.starts_with('*') {
                continue;
            }
            let mut ips: Vec<String> = snap
                .vips_for(view, svc)
                .into_iter()
                .filter(|v| !v.contains('/'))
                .collect();
            if ips.is_empty() && svc.resolution == Resolution::None {
                // Headless-style: answer with the endpoints themselves.
                ips = svc
                    .endpoints
                    .iter()
                    .filter(|e| e.address.parse::<std::net::IpAddr>().is_ok())
                    .map(|e| e.address.clone())
                    .collect();
            }
            if ips.is_empty() {
                continue;
            }
            table.table.insert(
                svc.host.clone(),
                NameInfo {
                    ips,
                    registry: "External".into(),
                    ..Default::default()
                },
            );
        }
    }
    vec![resource("", &table)]
}
