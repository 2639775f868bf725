//! RDS: one route configuration per outbound HTTP port (named after the port), with a virtual
//! host per service and the VirtualService routes that apply to it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proto::envoy::config::route::v3::{
    DirectResponseAction, HeaderMatcher, RetryPolicy, Route, RouteAction, RouteConfiguration,
    RouteMatch, VirtualHost, WeightedCluster, header_matcher::HeaderMatchSpecifier, route,
    route_action, route_match, weighted_cluster::ClusterWeight,
};
use proto::envoy::r#type::matcher::v3::{
    RegexMatcher, StringMatcher, string_matcher::MatchPattern,
};
use proto::google::protobuf::{BoolValue, UInt32Value};

use super::*;
use crate::config::kinds::{HttpMatchRequest, HttpRoute, StringMatch};
use crate::model::{Port, Service};

const DEFAULT_RETRY_ON: &str =
    "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes";

pub(super) fn generate(snap: &Snapshot, view: &ProxyView) -> Resources {
    let mut by_port: BTreeMap<u32, Vec<(&Service, &Port)>> = BTreeMap::new();
    for svc in snap.visible_services(view) {
        for port in svc.ports.iter().filter(|p| p.is_http()) {
            by_port.entry(port.number).or_default().push((svc, port));
        }
    }
    by_port
        .into_iter()
        .map(|(port, services)| {
            let rc = route_config(snap, view, port, &services);
            resource(port.to_string(), &rc)
        })
        .collect()
}

/// The other Host headers a `<name>.<ns>.svc.<domain>` host is called by from a proxy in
/// namespace `proxy_ns` (istiod's `GenerateAltVirtualHosts` for a proxy domain
/// `<proxy_ns>.svc.<domain>`): `name`, `name.ns` and `name.ns.svc` from the same namespace,
/// `name.ns` and `name.ns.svc` from another. Other hosts have none.
pub(crate) fn alt_hosts(host: &str, proxy_ns: &str, domain: &str) -> Vec<String> {
    let Some(svc_at) = host.find(".svc.") else {
        return Vec::new();
    };
    if !host.ends_with(&format!(".svc.{domain}")) {
        return Vec::new();
    }
    let Some(ns_at) = host.find('.').filter(|&i| i < svc_at) else {
        return Vec::new();
    };
    let name_ns = &host[..svc_at];
    let mut out = Vec::new();
    if &host[ns_at + 1..svc_at] == proxy_ns {
        out.push(host[..ns_at].to_string());
    }
    out.push(name_ns.to_string());
    out.push(format!("{name_ns}.svc"));
    out
}

fn route_config(
    snap: &Snapshot,
    view: &ProxyView,
    port: u32,
    services: &[(&Service, &Port)],
) -> RouteConfiguration {
    let mut used_domains = BTreeSet::new();
    let mut vhosts = Vec::new();
    for (svc, p) in services {
        let mut domains = vec![svc.host.clone(), format!("{}:{}", svc.host, p.number)];
        for alt in alt_hosts(&svc.host, &view.namespace, &snap.mesh.dns_domain) {
            domains.push(format!("{alt}:{}", p.number));
            domains.push(alt);
        }
        for vip in snap.vips_for(view, svc) {
            if !vip.contains('/') {
                domains.push(vip.clone());
                domains.push(format!("{vip}:{}", p.number));
            }
        }
        domains.retain(|d| used_domains.insert(d.clone()));
        if domains.is_empty() {
            continue;
        }
        vhosts.push(VirtualHost {
            name: format!("{}:{}", svc.host, p.number),
            domains,
            routes: routes_for(snap, &view.namespace, svc, p),
            include_request_attempt_count: true,
            ..Default::default()
        });
    }
    let fallback = if snap.mesh.allow_any {
        VirtualHost {
            name: "allow_any".into(),
            domains: vec!["*".into()],
            routes: vec![Route {
                name: "allow_any".into(),
                r#match: Some(prefix_match("/")),
                action: Some(route::Action::Route(RouteAction {
                    cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(
                        PASSTHROUGH_CLUSTER.into(),
                    )),
                    timeout: Some(duration(Duration::ZERO)),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }
    } else {
        VirtualHost {
            name: "block_all".into(),
            domains: vec!["*".into()],
            routes: vec![Route {
                name: "block_all".into(),
                r#match: Some(prefix_match("/")),
                action: Some(route::Action::DirectResponse(DirectResponseAction {
                    status: 502,
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }
    };
    vhosts.push(fallback);
    RouteConfiguration {
        name: port.to_string(),
        virtual_hosts: vhosts,
        validate_clusters: Some(BoolValue { value: false }),
        ..Default::default()
    }
}

fn prefix_match(p: &str) -> RouteMatch {
    RouteMatch {
        path_specifier: Some(route_match::PathSpecifier::Prefix(p.into())),
        ..Default::default()
    }
}

fn string_matcher(m: &StringMatch) -> Option<StringMatcher> {
    let pattern = if let Some(e) = &m.exact {
        MatchPattern::Exact(e.clone())
    } else if let Some(p) = &m.prefix {
        MatchPattern::Prefix(p.clone())
    } else {
        MatchPattern::SafeRegex(RegexMatcher {
            regex: m.regex.clone()?,
            ..Default::default()
        })
    };
    Some(StringMatcher {
        match_pattern: Some(pattern),
        ..Default::default()
    })
}

fn route_match(m: &HttpMatchRequest) -> RouteMatch {
    let path_specifier = match &m.uri {
        Some(StringMatch { exact: Some(e), .. }) => route_match::PathSpecifier::Path(e.clone()),
        Some(StringMatch {
            prefix: Some(p), ..
        }) => route_match::PathSpecifier::Prefix(p.clone()),
        Some(StringMatch { regex: Some(r), .. }) => {
            route_match::PathSpecifier::SafeRegex(RegexMatcher {
                regex: r.clone(),
                ..Default::default()
            })
        }
        _ => route_match::PathSpecifier::Prefix("/".into()),
    };
    RouteMatch {
        path_specifier: Some(path_specifier),
        headers: m
            .headers
            .iter()
            .filter_map(|(name, sm)| {
                Some(HeaderMatcher {
                    name: name.to_ascii_lowercase(),
                    header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(
                        string_matcher(sm)?,
                    )),
                    ..Default::default()
                })
            })
            .collect(),
        ..Default::default()
    }
}

fn default_retry() -> RetryPolicy {
    RetryPolicy {
        retry_on: DEFAULT_RETRY_ON.into(),
        num_retries: Some(UInt32Value { value: 2 }),
        retriable_status_codes: vec![503],
        ..Default::default()
    }
}

fn action(domain: &str, svc: &Service, port: &Port, r: &HttpRoute) -> RouteAction {
    let cluster_of = |d: &crate::config::kinds::Destination| {
        let host = if d.host.contains('.') || d.host == svc.host {
            d.host.clone()
        } else {
            // Short names resolve in the service's namespace.
            format!("{}.{}.svc.{domain}", d.host, svc.namespace)
        };
        let p = d.port.as_ref().map(|p| p.number).unwrap_or(port.number);
        outbound_cluster_name(p, &d.subset, &host)
    };
    let dests: Vec<_> = r
        .route
        .iter()
        .filter(|d| r.route.len() == 1 || d.weight.unwrap_or(0) > 0)
        .collect();
    let cluster_specifier = if dests.len() == 1 {
        route_action::ClusterSpecifier::Cluster(cluster_of(&dests[0].destination))
    } else {
        route_action::ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: dests
                .iter()
                .map(|d| ClusterWeight {
                    name: cluster_of(&d.destination),
                    weight: Some(UInt32Value {
                        value: d.weight.unwrap_or(0),
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
    };
    let timeout = r
        .timeout
        .as_deref()
        .and_then(|t| go_syntax::parse_duration(t).ok())
        .unwrap_or(Duration::ZERO);
    let retry_policy = match &r.retries {
        None => Some(default_retry()),
        Some(rt) if rt.attempts == 0 => None,
        Some(rt) => Some(RetryPolicy {
            retry_on: rt
                .retry_on
                .clone()
                .unwrap_or_else(|| DEFAULT_RETRY_ON.into()),
            num_retries: Some(UInt32Value { value: rt.attempts }),
            per_try_timeout: rt
                .per_try_timeout
                .as_deref()
                .and_then(|t| go_syntax::parse_duration(t).ok())
                .map(duration),
            retriable_status_codes: vec![503],
            ..Default::default()
        }),
    };
    RouteAction {
        cluster_specifier: Some(cluster_specifier),
        timeout: Some(duration(timeout)),
        retry_policy,
        ..Default::default()
    }
}

/// The routes to `svc`'s `port` for proxies in `proxy_ns` (their exported VirtualServices).
pub(super) fn routes_for(
    snap: &Snapshot,
    proxy_ns: &str,
    svc: &Service,
    port: &Port,
) -> Vec<Route> {
    let mut routes = Vec::new();
    if let Some(vs) = snap.virtual_services_for(proxy_ns, &svc.host).first() {
        for (i, r) in vs.http.iter().enumerate() {
            let act = action(&snap.mesh.dns_domain, svc, port, r);
            let name = if r.name.is_empty() {
                format!("route-{i}")
            } else {
                r.name.clone()
            };
            let matches: Vec<RouteMatch> = if r.matches.is_empty() {
                vec![prefix_match("/")]
            } else {
                r.matches.iter().map(route_match).collect()
            };
            for m in matches {
                routes.push(Route {
                    name: name.clone(),
                    r#match: Some(m),
                    action: Some(route::Action::Route(act.clone())),
                    ..Default::default()
                });
            }
        }
    }
    if routes.is_empty() {
        routes.push(Route {
            name: "default".into(),
            r#match: Some(prefix_match("/")),
            action: Some(route::Action::Route(RouteAction {
                cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(
                    outbound_cluster_name(port.number, "", &svc.host),
                )),
                timeout: Some(duration(Duration::ZERO)),
                retry_policy: Some(default_retry()),
                ..Default::default()
            })),
            ..Default::default()
        });
    }
    routes
}
