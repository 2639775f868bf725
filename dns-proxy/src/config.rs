//! Typed configuration of the DNS proxy: what it serves, where it forwards (resolv.conf), and
//! its limits. It reads no environment: the agent builds it from Istio's variables.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::Error;

/// Default listen address, as Istio (`DNS_PROXY_ADDR`).
pub const DEFAULT_PROXY_ADDR: &str = "localhost:15053";
/// Default per-server upstream timeout (`DNS_FORWARD_TIMEOUT`).
pub const DEFAULT_FORWARD_TIMEOUT: Duration = Duration::from_secs(5);
/// resolv.conf Istio prefers when the proxy serves `:53` as root.
pub const ISTIO_RESOLV_CONF: &str = "/var/lib/istio/resolv.conf";

/// Everything the DNS proxy needs: [`Config::defaults`] or [`Config::from_resolv_conf`], then
/// the agent's config tree sets the fields from Istio's variables and `--domain`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Config {
    /// Addresses to serve on, UDP and TCP each. Port 0 picks one port (shared by all addresses).
    pub listen_addrs: Vec<SocketAddr>,
    /// Upstream nameservers from resolv.conf (`ndots`, `timeout`, `attempts` are ignored as Istio).
    pub upstreams: Vec<SocketAddr>,
    /// resolv.conf `search` list; only the first entry is used for CNAME expansion, as Istio.
    pub search_domains: Vec<String>,
    /// Timeout for one exchange with one upstream server (`DNS_FORWARD_TIMEOUT`).
    pub forward_timeout: Duration,
    /// Query every upstream at once, first success wins (`DNS_FORWARD_PARALLEL`).
    pub forward_parallel: bool,
    /// Cache upstream answers honouring their TTLs (`DNS_PROXY_CACHE`, default true).
    pub cache_enabled: bool,
    /// Maximum number of cached upstream answers.
    pub cache_max_entries: usize,
    /// Maximum bytes the cached answers take (`DNS_PROXY_CACHE_MAX_BYTES`, not in Istio;
    /// default 16 MiB): each counts its wire size, name and a fixed overhead.
    pub cache_max_bytes: usize,
    /// Serve-stale (RFC 8767; not in Istio): answers kept past their TTL and given when every
    /// upstream fails (`DNS_PROXY_SERVE_STALE`, default on; `None`: off).
    pub serve_stale: Option<crate::StalePolicy>,
    /// Refresh a cached name asked for in the last tenth of its TTL (`DNS_PROXY_PREFETCH`,
    /// default on; not in Istio).
    pub prefetch: bool,
    /// One log line per query, at info level with target `dns_access`: name, type, rcode,
    /// client, where the answer came from (table, cache, stale, upstream, local), latency
    /// (`DNS_PROXY_ACCESS_LOG`, default off; not in Istio).
    pub access_log: bool,
    /// The proxy's own namespace (`POD_NAMESPACE`): short names resolve in it.
    pub namespace: String,
    /// The proxy's DNS domain (`--domain`, default `<POD_NAMESPACE>.svc.cluster.local`).
    pub domain: String,
    /// Forward queries upstream before the first name table arrives instead of SERVFAIL
    /// (Istio sets it when serving `:53` as root).
    pub respond_before_sync: bool,
    /// Upper bound on queries being forwarded at once; beyond it queries get SERVFAIL.
    pub max_in_flight: usize,
    /// Upper bound on open client TCP connections; beyond it a new connection takes the slot
    /// of one whose client does not read its answers or that sits idle, else it is closed.
    pub max_tcp_connections: usize,
    /// Idle timeout of a client TCP connection.
    pub tcp_idle_timeout: Duration,
    /// How long one answer may wait for a TCP client to read it before its connection is
    /// closed (5 s).
    pub tcp_write_timeout: Duration,
    /// UDP payload size advertised upstream in EDNS (Istio #61371).
    pub upstream_udp_payload: u16,
    /// The resolv.conf actually read.
    pub resolv_conf: PathBuf,
}

/// The cache's default byte budget: 16 MiB, some 50,000 typical answers.
pub const DEFAULT_CACHE_MAX_BYTES: usize = 16 << 20;

impl Config {
    /// Istio's defaults, forwarding to the nameservers of `resolv` (read from `resolv_conf`):
    /// listening on `localhost:15053` (by the nameservers' families), 5 s forward timeout, cache
    /// on, domain `svc.cluster.local`. The agent's config tree sets the rest from Istio's
    /// variables (`DNS_PROXY_ADDR`, `DNS_FORWARD_*`, `DNS_PROXY_CACHE`, `--domain`).
    pub fn defaults(resolv: ResolvConf, resolv_conf: PathBuf) -> Config {
        let listen_addrs = resolve_listen_addr(DEFAULT_PROXY_ADDR, &resolv.nameservers)
            .unwrap_or_else(|_| vec![SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 15053)]);
        Config {
            listen_addrs,
            upstreams: resolv.nameservers,
            search_domains: resolv.search,
            forward_timeout: DEFAULT_FORWARD_TIMEOUT,
            forward_parallel: false,
            cache_enabled: true,
            cache_max_entries: 10_000,
            cache_max_bytes: DEFAULT_CACHE_MAX_BYTES,
            serve_stale: Some(crate::StalePolicy::default()),
            prefetch: true,
            access_log: false,
            namespace: String::new(),
            domain: "svc.cluster.local".to_string(),
            respond_before_sync: false,
            max_in_flight: 4096,
            max_tcp_connections: 512,
            tcp_idle_timeout: Duration::from_secs(10),
            tcp_write_timeout: Duration::from_secs(5),
            upstream_udp_payload: 1232,
            resolv_conf,
        }
    }

    /// [`Config::defaults`] with the nameservers and search list read from `path`.
    pub fn from_resolv_conf(path: &Path) -> Result<Config, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::ResolvConf {
            path: path.to_path_buf(),
            source: std::sync::Arc::new(e),
        })?;
        Ok(Config::defaults(
            parse_resolv_conf(&text),
            path.to_path_buf(),
        ))
    }

    /// The domain suffix short names expand under: `domain` with its first label dropped when it
    /// is the namespace (`ns1.svc.cluster.local` → `svc.cluster.local`), as Istio.
    pub fn proxy_domain(&self) -> String {
        let domain = self.domain.trim_end_matches('.').to_ascii_lowercase();
        match domain.split_once('.') {
            Some((first, rest)) if first == self.namespace => rest.to_string(),
            _ => domain,
        }
    }
}

/// The parts of resolv.conf the proxy uses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResolvConf {
    pub nameservers: Vec<SocketAddr>,
    pub search: Vec<String>,
}

/// Parses resolv.conf leniently (unknown lines and bad addresses are skipped, as glibc does).
pub fn parse_resolv_conf(text: &str) -> ResolvConf {
    let mut out = ResolvConf::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or_default();
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => {
                let Some(word) = words.next() else { continue };
                // Scoped IPv6 (fe80::1%eth0) keeps the address, drops the zone.
                let word = word.split('%').next().unwrap_or(word);
                match word.parse::<IpAddr>() {
                    Ok(ip) => out.nameservers.push(SocketAddr::new(ip, 53)),
                    Err(_) => {
                        tracing::warn!(nameserver = word, "skipping invalid resolv.conf nameserver")
                    }
                }
            }
            Some("search") => {
                out.search = words
                    .map(|w| w.trim_end_matches('.').to_ascii_lowercase())
                    .filter(|w| !w.is_empty())
                    .collect();
            }
            Some("domain") if out.search.is_empty() => {
                if let Some(d) = words.next() {
                    out.search = vec![d.trim_end_matches('.').to_ascii_lowercase()];
                }
            }
            _ => {}
        }
    }
    out
}

/// Resolves a `DNS_PROXY_ADDR` value into socket addresses: `localhost` becomes 127.0.0.1 when
/// any IPv4 nameserver and ::1 when any IPv6 nameserver (127.0.0.1 when there are none), as
/// Istio; an empty host is 0.0.0.0. The error says what is wrong with `addr`.
pub fn resolve_listen_addr(
    addr: &str,
    nameservers: &[SocketAddr],
) -> Result<Vec<SocketAddr>, &'static str> {
    let (host, port) = addr.rsplit_once(':').ok_or("missing port")?;
    let port: u16 = port.parse().map_err(|_| "port is not a number")?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.eq_ignore_ascii_case("localhost") {
        let mut out = Vec::new();
        if nameservers.is_empty() || nameservers.iter().any(SocketAddr::is_ipv4) {
            out.push(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port));
        }
        if nameservers.iter().any(SocketAddr::is_ipv6) {
            out.push(SocketAddr::new(Ipv6Addr::LOCALHOST.into(), port));
        }
        return Ok(out);
    }
    if host.is_empty() {
        return Ok(vec![SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port)]);
    }
    let ip: IpAddr = host
        .parse()
        .map_err(|_| "host must be localhost or an IP")?;
    Ok(vec![SocketAddr::new(ip, port)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_istio() {
        let r = parse_resolv_conf(
            "nameserver 10.96.0.10\nsearch ns1.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n",
        );
        let c = Config::defaults(r, "/etc/resolv.conf".into());
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
        assert!(!c.forward_parallel && c.cache_enabled);
        let missing = Config::from_resolv_conf(Path::new("/nonexistent/resolv.conf"))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("/nonexistent/resolv.conf"), "{missing}");
    }

    #[test]
    fn listen_addr_follows_nameserver_families() {
        let v6: Vec<SocketAddr> = vec!["[fd00::10]:53".parse().unwrap()];
        let both: Vec<SocketAddr> = vec!["10.0.0.1:53".parse().unwrap(), v6[0]];
        assert_eq!(
            resolve_listen_addr("localhost:15053", &v6).unwrap(),
            vec!["[::1]:15053".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(
            resolve_listen_addr("localhost:15053", &both).unwrap().len(),
            2
        );
        assert_eq!(
            resolve_listen_addr(":53", &[]).unwrap(),
            vec!["0.0.0.0:53".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(resolve_listen_addr("127.0.0.1", &[]), Err("missing port"));
        assert_eq!(
            resolve_listen_addr("dns.example:53", &[]),
            Err("host must be localhost or an IP")
        );
    }

    #[test]
    fn namespace_label_is_dropped_from_the_proxy_domain() {
        let mut c = Config::defaults(ResolvConf::default(), "/r".into());
        c.namespace = "ns1".into();
        c.domain = "ns1.svc.cluster.local".into();
        assert_eq!(c.proxy_domain(), "svc.cluster.local");
        c.domain = "other.svc.cluster.local".into();
        assert_eq!(c.proxy_domain(), "other.svc.cluster.local");
        // No POD_NAMESPACE: the node's domain is `.svc.cluster.local`, and its empty first
        // label is the (empty) namespace, as Istio's agent.
        c.namespace = String::new();
        c.domain = ".svc.cluster.local".into();
        assert_eq!(c.proxy_domain(), "svc.cluster.local");
    }

    #[test]
    fn resolv_conf_is_parsed_leniently() {
        let r = parse_resolv_conf(
            "# c\nnameserver bogus\nnameserver 1.1.1.1 # x\ndomain a.b\nnameserver fe80::1%eth0\n",
        );
        assert_eq!(r.nameservers.len(), 2);
        assert_eq!(r.search, vec!["a.b".to_string()]);
    }
}
