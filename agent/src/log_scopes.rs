//! Istio's `--log_output_level` (`scope:level,scope:level,...`) onto tracing: each of the
//! agent's Istio scopes names the modules (tracing targets) that do its work here, and a scope's
//! level becomes a filter directive for them. As Istio: `default` is everything no other scope
//! covers, `all` sets every scope, a scope not named keeps `info` (`grpc` is `none` in the
//! flag's default), an unknown scope is ignored, and a level other than `debug`, `info`,
//! `warn`, `error`, `fatal` or `none` (or an item with two colons) is an error.

use std::collections::BTreeMap;

/// Istio's scopes in the agent (`pilot-agent --help` lists them) and the targets that log what
/// each covers here. Scopes with no part here (`klog`: no Kubernetes client; `validation`,
/// `gcecred`, `mockcred`) are accepted and have no target.
pub const SCOPES: &[(&str, &[&str])] = &[
    // The ADS stream itself: requests, responses, subscriptions replayed on reconnect.
    (
        "ads",
        &[
            "agent::xds_proxy::relay",
            "agent::xds_proxy::subscriptions",
            "agent::xds_proxy::codec",
        ],
    ),
    // The CA calls' retries and backoff.
    ("ca", &["sds::manager::rotation"]),
    // The secret cache.
    ("cache", &["sds::manager"]),
    // The Istio CA client and its connection.
    ("citadelclient", &["sds::ca", "sds::tls"]),
    ("dns", &["dns_proxy"]),
    // gRPC and HTTP/2 libraries.
    ("grpc", &["tonic", "h2", "hyper", "hyper_util", "tower"]),
    ("healthcheck", &["agent::health"]),
    ("klog", &[]),
    ("monitoring", &["agent::status::stats"]),
    ("probes", &["agent::status::probe"]),
    ("sds", &["sds::server"]),
    // Identity as a whole; the scopes above are narrower and win for their modules.
    ("security", &["sds"]),
    // Trust bundles and certificate parsing.
    ("spiffe", &["sds::pem", "sds::x509"]),
    ("validation", &[]),
    // Wasm modules fetched and cached for ECDS.
    ("wasm", &["agent::xds_proxy::wasm"]),
    ("gcecred", &[]),
    ("mockcred", &[]),
    ("xdsproxy", &["agent::xds_proxy"]),
];

/// The scope of everything no other scope covers; Istio's lines leave its name out.
pub const DEFAULT_SCOPE: &str = "default";

/// The Istio scope an event of `target` belongs to: the scope naming the longest module path
/// that contains `target`, else [`DEFAULT_SCOPE`].
pub fn scope_of(target: &str) -> &'static str {
    let covers = |module: &str| {
        target == module
            || target
                .strip_prefix(module)
                .is_some_and(|rest| rest.starts_with("::"))
    };
    SCOPES
        .iter()
        .flat_map(|(scope, modules)| modules.iter().map(move |m| (*scope, *m)))
        .filter(|(_, m)| covers(m))
        .max_by_key(|(_, m)| m.len())
        .map_or(DEFAULT_SCOPE, |(scope, _)| scope)
}

/// A `--log_output_level` Istio refuses.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("invalid output level format '{0}' (expected <scope>:<level>)")]
    Format(String),
    #[error("invalid output level '{0}' (expected debug, info, warn, error, fatal or none)")]
    Level(String),
}

fn level(name: &str) -> Result<&'static str, Error> {
    Ok(match name {
        "debug" => "debug",
        "info" => "info",
        "warn" => "warn",
        "error" | "fatal" => "error",
        "none" => "off",
        other => return Err(Error::Level(other.to_string())),
    })
}

/// The tracing filter for `output_level`: the `default` scope's level, then one directive per
/// target of every other scope.
pub fn filter(output_level: &str) -> Result<String, Error> {
    let mut levels: BTreeMap<&str, &'static str> = SCOPES
        .iter()
        .map(|(scope, _)| (*scope, "info"))
        .chain([("default", "info")])
        .collect();
    for item in output_level.split(',').filter(|i| !i.is_empty()) {
        let (scope, name) = match item.split(':').collect::<Vec<_>>()[..] {
            [l] => ("default", l),
            [s, l] => (s, l),
            _ => return Err(Error::Format(item.to_string())),
        };
        let l = level(name)?;
        if scope == "all" {
            levels.values_mut().for_each(|v| *v = l);
        } else if let Some(v) = levels.get_mut(scope) {
            *v = l;
        }
    }
    let mut out = vec![levels["default"].to_string()];
    for (scope, targets) in SCOPES {
        out.extend(targets.iter().map(|t| format!("{t}={}", levels[scope])));
    }
    Ok(out.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The directive of `target` in `filter`'s output, or the base level.
    fn level_of(filter: &str, target: &str) -> String {
        filter
            .split(',')
            .find_map(|d| d.strip_prefix(&format!("{target}=")))
            .unwrap_or_else(|| filter.split(',').next().unwrap())
            .to_string()
    }

    #[test]
    fn each_scope_sets_its_targets() {
        for (scope, targets) in SCOPES {
            let f = filter(&format!("default:warn,{scope}:debug")).unwrap();
            assert!(f.starts_with("warn,"), "{f}");
            for t in *targets {
                assert_eq!(level_of(&f, t), "debug", "{scope} -> {t}: {f}");
            }
            // The other scopes keep info.
            for (other, others) in SCOPES {
                for t in others.iter().filter(|t| !targets.contains(t)) {
                    assert_eq!(level_of(&f, t), "info", "{other} with {scope}:debug");
                }
            }
        }
    }

    #[test]
    fn all_default_unknown_and_order_as_istio() {
        let f = filter("all:debug,dns:error").unwrap();
        assert!(f.starts_with("debug,"), "{f}");
        assert_eq!(level_of(&f, "dns_proxy"), "error");
        assert_eq!(level_of(&f, "agent::xds_proxy"), "debug");
        // Later items win, `all` included.
        let f = filter("dns:error,all:warn").unwrap();
        assert_eq!(level_of(&f, "dns_proxy"), "warn");
        // A bare level is the default scope's; an unknown scope is ignored.
        let f = filter("debug,nosuchscope:error").unwrap();
        assert!(f.starts_with("debug,"), "{f}");
        assert!(!f.contains("nosuchscope"), "{f}");
        // The flag's default: grpc off, the rest info.
        let f = filter("default:info,grpc:none").unwrap();
        assert_eq!(level_of(&f, "h2"), "off");
        assert_eq!(level_of(&f, "sds::ca"), "info");
        assert_eq!(filter("none").unwrap().split(',').next(), Some("off"));
        assert_eq!(filter("fatal").unwrap().split(',').next(), Some("error"));
    }

    #[test]
    fn events_are_named_by_the_narrowest_scope() {
        assert_eq!(scope_of("sds::manager::rotation"), "ca");
        assert_eq!(scope_of("sds::manager::output_certs"), "cache");
        assert_eq!(scope_of("sds::manager"), "cache");
        assert_eq!(scope_of("sds::server"), "sds");
        assert_eq!(scope_of("sds::ca"), "citadelclient");
        assert_eq!(scope_of("sds::csr"), "security");
        assert_eq!(scope_of("dns_proxy::forward::pool"), "dns");
        assert_eq!(scope_of("agent::xds_proxy::streams"), "xdsproxy");
        assert_eq!(scope_of("agent::xds_proxy::relay"), "ads");
        assert_eq!(scope_of("agent::health"), "healthcheck");
        assert_eq!(scope_of("agent::xds_proxy::wasm::fetch"), "wasm");
        assert_eq!(scope_of("h2::codec"), "grpc");
        // A module path is matched whole: `hyper_util` is not `hyper`'s, `sdsx` not `sds`'s.
        assert_eq!(scope_of("hyper_util::client"), "grpc");
        assert_eq!(scope_of("sdsx"), DEFAULT_SCOPE);
        assert_eq!(scope_of("agent::app"), DEFAULT_SCOPE);
    }

    #[test]
    fn bad_levels_and_formats_are_refused_as_istio() {
        assert_eq!(
            filter("default:warning"),
            Err(Error::Level("warning".into()))
        );
        assert_eq!(filter("x"), Err(Error::Level("x".into())));
        assert_eq!(filter("a:b:c"), Err(Error::Format("a:b:c".into())));
        // An unknown scope with a bad level is refused too (the level is checked first).
        assert_eq!(filter("nosuch:loud"), Err(Error::Level("loud".into())));
    }

    /// Every target is one of ours: a module of this workspace (its file exists) or a library.
    #[test]
    fn targets_are_real_modules() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for (scope, targets) in SCOPES {
            for t in *targets {
                let mut parts = t.split("::");
                let krate = parts.next().unwrap();
                let dir = match krate {
                    "agent" => "agent",
                    "sds" => "sds",
                    "dns_proxy" => "dns-proxy",
                    _ => continue,
                };
                let rest: Vec<&str> = parts.collect();
                let file = if rest.is_empty() {
                    root.join(dir).join("src/lib.rs")
                } else {
                    root.join(dir)
                        .join("src")
                        .join(format!("{}.rs", rest.join("/")))
                };
                assert!(file.is_file(), "{scope}: {t} ({} missing)", file.display());
            }
        }
    }

    /// The filter gates events as the scopes say, through tracing's own filter.
    #[test]
    fn the_filter_gates_events_by_scope() {
        let sink = crate::log_capture::Sink::default();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                filter("default:warn,xdsproxy:debug,citadelclient:error").unwrap(),
            ))
            .with_writer(sink.make_writer())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!(target: "agent::xds_proxy::streams", "xds-debug-shown");
            tracing::info!(target: "agent::app", "default-info-hidden");
            tracing::warn!(target: "agent::app", "default-warn-shown");
            tracing::warn!(target: "sds::ca", "ca-warn-hidden");
            tracing::error!(target: "sds::ca", "ca-error-shown");
            tracing::info!(target: "dns_proxy::forward", "dns-info-shown");
        });
        let out = sink.text();
        for shown in [
            "xds-debug-shown",
            "default-warn-shown",
            "ca-error-shown",
            "dns-info-shown",
        ] {
            assert!(out.contains(shown), "{shown} missing: {out}");
        }
        assert!(!out.contains("hidden"), "{out}");
    }
}
