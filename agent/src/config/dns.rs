//! The DNS sub-config ([`dns_proxy::Config`]): `DNS_PROXY_ADDR`, `DNS_FORWARD_*`,
//! `DNS_PROXY_CACHE`; not in Istio: `DNS_PROXY_CACHE_MAX_BYTES`, `DNS_PROXY_SERVE_STALE`,
//! `DNS_PROXY_STALE_MAX`, `DNS_PROXY_STALE_TTL`, `DNS_PROXY_STALE_CLIENT_TIMER`,
//! `DNS_PROXY_PREFETCH`, `DNS_PROXY_ACCESS_LOG`; the upstreams and search list of resolv.conf,
//! and the proxy's domain (`--domain`).

use std::path::Path;
use std::time::Duration;

use dns_proxy::{
    DEFAULT_FORWARD_TIMEOUT, DEFAULT_PROXY_ADDR, parse_resolv_conf, resolve_listen_addr,
};

use super::{Error, env::Env};

/// What the DNS settings depend on besides the environment.
pub struct Inputs<'a> {
    pub env: Env<'a>,
    pub namespace: &'a str,
    /// The node's DNS domain ([`super::node::dns_domain`]: worked out once for the node id and
    /// the DNS proxy alike).
    pub domain: &'a str,
    pub resolv_conf: &'a Path,
    /// Istio's resolv.conf for an agent serving `:53` as root.
    pub istio_resolv_conf: &'a Path,
    pub is_root: bool,
}

/// Builds the DNS proxy's config.
///
/// `DNS_PROXY_ADDR` ending in `:53` as root sets respond-before-sync and prefers Istio's own
/// resolv.conf when it exists; as non-root it falls back to `localhost:15053`, as Istio.
pub fn load(i: Inputs<'_>) -> Result<dns_proxy::Config, Error> {
    let env = i.env;
    let mut addr = env.str("DNS_PROXY_ADDR", DEFAULT_PROXY_ADDR);
    let mut respond_before_sync = false;
    let mut resolv_conf = i.resolv_conf.to_path_buf();
    if addr.ends_with(":53") {
        if i.is_root {
            respond_before_sync = true;
            if i.istio_resolv_conf.exists() {
                resolv_conf = i.istio_resolv_conf.to_path_buf();
            }
        } else {
            tracing::error!(
                addr = %addr,
                "DNS_PROXY_ADDR on port 53 needs root; falling back to {DEFAULT_PROXY_ADDR}"
            );
            addr = DEFAULT_PROXY_ADDR.to_string();
        }
    }
    let resolv = match std::fs::read_to_string(&resolv_conf) {
        Ok(text) => parse_resolv_conf(&text),
        Err(source) => {
            return Err(Error::Read {
                path: resolv_conf,
                source,
            });
        }
    };
    let listen_addrs = resolve_listen_addr(&addr, &resolv.nameservers)
        .map_err(|why| env.invalid("DNS_PROXY_ADDR", &addr, &format!("host:port ({why})")))?;
    let mut config = dns_proxy::Config::defaults(resolv, resolv_conf);
    config.listen_addrs = listen_addrs;
    config.respond_before_sync = respond_before_sync;
    config.namespace = i.namespace.to_string();
    config.domain = i.domain.to_string();
    config.forward_timeout = env.duration(
        "DNS_FORWARD_TIMEOUT",
        DEFAULT_FORWARD_TIMEOUT,
        Duration::from_nanos(1),
    )?;
    config.forward_parallel = env.bool("DNS_FORWARD_PARALLEL", false)?;
    config.cache_enabled = env.bool("DNS_PROXY_CACHE", true)?;
    let stale = dns_proxy::StalePolicy::default();
    config.serve_stale = if env.bool("DNS_PROXY_SERVE_STALE", true)? {
        Some(dns_proxy::StalePolicy {
            max_stale: env.duration("DNS_PROXY_STALE_MAX", stale.max_stale, Duration::ZERO)?,
            stale_ttl: env.duration(
                "DNS_PROXY_STALE_TTL",
                stale.stale_ttl,
                Duration::from_secs(1),
            )?,
            client_timer: env.duration(
                "DNS_PROXY_STALE_CLIENT_TIMER",
                stale.client_timer,
                Duration::ZERO,
            )?,
        })
    } else {
        None
    };
    config.prefetch = env.bool("DNS_PROXY_PREFETCH", true)?;
    config.access_log = env.bool("DNS_PROXY_ACCESS_LOG", false)?;
    config.cache_max_bytes = env.u32(
        "DNS_PROXY_CACHE_MAX_BYTES",
        u32::try_from(dns_proxy::DEFAULT_CACHE_MAX_BYTES).unwrap_or(u32::MAX),
    )? as usize;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::net::SocketAddr;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn resolv(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().expect("tempfile");
        std::fs::write(f.path(), text).expect("write resolv.conf");
        f
    }

    fn load_with(
        e: &HashMap<String, String>,
        resolv_conf: &Path,
        istio: &Path,
        is_root: bool,
        domain: &str,
    ) -> Result<dns_proxy::Config, Error> {
        let namespace = e.get("POD_NAMESPACE").map(String::as_str).unwrap_or("");
        let fallbacks = super::super::env::Fallbacks::new(e);
        load(Inputs {
            env: Env::new(e, &fallbacks),
            namespace,
            domain: &super::super::node::dns_domain(domain, namespace),
            resolv_conf,
            istio_resolv_conf: istio,
            is_root,
        })
    }

    fn simple(e: &HashMap<String, String>, r: &Path) -> Result<dns_proxy::Config, Error> {
        load_with(e, r, Path::new("/nonexistent/resolv.conf"), false, "")
    }

    #[test]
    fn defaults_follow_istio() {
        let r = resolv(
            "nameserver 10.96.0.10\nsearch ns1.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n",
        );
        let c = simple(&env(&[("POD_NAMESPACE", "ns1")]), r.path()).expect("config");
        assert_eq!(
            c.listen_addrs,
            vec!["127.0.0.1:15053".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(
            c.upstreams,
            vec!["10.96.0.10:53".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(c.search_domains[0], "ns1.svc.cluster.local");
        assert_eq!(c.forward_timeout, Duration::from_secs(5));
        assert!(!c.forward_parallel);
        assert!(c.cache_enabled);
        assert_eq!(c.cache_max_bytes, 16 << 20);
        assert_eq!(c.domain, "ns1.svc.cluster.local");
        assert_eq!(c.proxy_domain(), "svc.cluster.local");
    }

    #[test]
    fn domain_flag_reaches_the_proxy() {
        let r = resolv("nameserver 10.0.0.1\n");
        let e = env(&[("POD_NAMESPACE", "ns1")]);
        let c = load_with(&e, r.path(), Path::new("/x"), false, "ns1.svc.corp.example").unwrap();
        assert_eq!(c.domain, "ns1.svc.corp.example");
        assert_eq!(c.proxy_domain(), "svc.corp.example");
    }

    #[test]
    fn localhost_binds_by_nameserver_family() {
        let r = resolv("nameserver fd00::10\n");
        let c = simple(&env(&[]), r.path()).expect("config");
        assert_eq!(
            c.listen_addrs,
            vec!["[::1]:15053".parse::<SocketAddr>().unwrap()]
        );
        let r = resolv("nameserver 10.0.0.1\nnameserver fd00::10\n");
        let c = simple(&env(&[]), r.path()).expect("config");
        assert_eq!(c.listen_addrs.len(), 2);
    }

    #[test]
    fn env_overrides_and_errors_name_the_variable() {
        let r = resolv("nameserver 10.0.0.1\n");
        let c = simple(
            &env(&[
                ("DNS_FORWARD_TIMEOUT", "1500ms"),
                ("DNS_FORWARD_PARALLEL", "true"),
                ("DNS_PROXY_CACHE", "false"),
                ("DNS_PROXY_ADDR", "127.0.0.2:0"),
                ("DNS_PROXY_CACHE_MAX_BYTES", "1048576"),
            ]),
            r.path(),
        )
        .expect("config");
        assert_eq!(c.forward_timeout, Duration::from_millis(1500));
        assert!(c.forward_parallel && !c.cache_enabled);
        assert_eq!(c.cache_max_bytes, 1 << 20);
        assert_eq!(
            c.listen_addrs,
            vec!["127.0.0.2:0".parse::<SocketAddr>().unwrap()]
        );
        // An address is refused in both modes; typed values only in strict mode (else the
        // default, as Istio).
        let defaults = simple(&env(&[]), r.path()).expect("config");
        for (k, v) in [
            ("DNS_PROXY_ADDR", "127.0.0.1"),
            ("DNS_PROXY_ADDR", "dns.example:53x"),
        ] {
            let msg = simple(&env(&[(k, v)]), r.path()).unwrap_err().to_string();
            assert!(msg.contains(k) && msg.contains(v), "{msg}");
        }
        for (k, v) in [
            ("DNS_FORWARD_TIMEOUT", "soon"),
            ("DNS_FORWARD_TIMEOUT", "0s"),
            ("DNS_PROXY_CACHE", "maybe"),
            ("DNS_PROXY_CACHE_MAX_BYTES", "16MiB"),
            ("DNS_PROXY_SERVE_STALE", "sometimes"),
            ("DNS_PROXY_STALE_TTL", "10ms"),
            ("DNS_PROXY_STALE_MAX", "a day"),
            ("DNS_PROXY_STALE_CLIENT_TIMER", "soon"),
            ("DNS_PROXY_PREFETCH", "2"),
        ] {
            let strict = env(&[(k, v), (crate::config::STRICT_ENV, "true")]);
            let msg = simple(&strict, r.path()).unwrap_err().to_string();
            assert!(msg.contains(k) && msg.contains(v), "{msg}");
            let c = simple(&env(&[(k, v)]), r.path()).expect("the default, as Istio");
            assert_eq!(c.forward_timeout, defaults.forward_timeout, "{k}={v}");
            assert_eq!(c.cache_enabled, defaults.cache_enabled, "{k}={v}");
            assert_eq!(c.cache_max_bytes, defaults.cache_max_bytes, "{k}={v}");
            assert_eq!(c.serve_stale, defaults.serve_stale, "{k}={v}");
            assert_eq!(c.prefetch, defaults.prefetch, "{k}={v}");
        }
        let missing = simple(&env(&[]), Path::new("/nonexistent/resolv.conf"))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("/nonexistent/resolv.conf"), "{missing}");
    }

    /// Serve-stale and prefetch are on by default (not in Istio) with RFC 8767's figures, and
    /// each has its knob.
    #[test]
    fn serve_stale_and_prefetch_knobs() {
        let r = resolv("nameserver 10.0.0.1\n");
        let c = simple(&env(&[]), r.path()).expect("config");
        let stale = c.serve_stale.expect("on by default");
        assert_eq!(stale.max_stale, Duration::from_secs(86_400));
        assert_eq!(stale.stale_ttl, Duration::from_secs(30));
        assert_eq!(stale.client_timer, Duration::from_millis(1800));
        assert!(c.prefetch);
        let c = simple(
            &env(&[
                ("DNS_PROXY_STALE_MAX", "2h"),
                ("DNS_PROXY_STALE_TTL", "5s"),
                ("DNS_PROXY_STALE_CLIENT_TIMER", "500ms"),
                ("DNS_PROXY_PREFETCH", "false"),
            ]),
            r.path(),
        )
        .expect("config");
        let stale = c.serve_stale.expect("on");
        assert_eq!(
            (stale.max_stale, stale.stale_ttl, stale.client_timer),
            (
                Duration::from_secs(7200),
                Duration::from_secs(5),
                Duration::from_millis(500)
            )
        );
        assert!(!c.prefetch);
        assert!(!c.access_log, "the access log is opt-in");
        let c = simple(&env(&[("DNS_PROXY_ACCESS_LOG", "true")]), r.path()).expect("config");
        assert!(c.access_log);
        let c = simple(&env(&[("DNS_PROXY_SERVE_STALE", "false")]), r.path()).expect("config");
        assert_eq!(c.serve_stale, None);
    }

    #[test]
    fn port_53_depends_on_root() {
        let r = resolv("nameserver 10.0.0.1\n");
        let istio = resolv("nameserver 10.0.0.2\n");
        let e = env(&[("DNS_PROXY_ADDR", "localhost:53")]);
        let c = load_with(&e, r.path(), istio.path(), false, "").expect("config");
        assert_eq!(c.listen_addrs[0].port(), 15053);
        assert!(!c.respond_before_sync);
        let c = load_with(&e, r.path(), istio.path(), true, "").expect("config");
        assert_eq!(c.listen_addrs[0].port(), 53);
        assert!(c.respond_before_sync);
        assert_eq!(c.upstreams[0].ip().to_string(), "10.0.0.2");
    }
}
