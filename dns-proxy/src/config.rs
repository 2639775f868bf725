//! Typed configuration of the DNS proxy, read once from an injectable environment map and a
//! resolv.conf file (Istio: pkg/dns/client/dns.go, pkg/istio-agent options).

use std::collections::HashMap;
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

/// Everything the DNS proxy needs; build with [`Config::from_env`] and adjust fields if needed
/// (the agent sets `domain` from `--domain`).
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
    /// The proxy's own namespace (`POD_NAMESPACE`): short names resolve in it.
    pub namespace: String,
    /// The proxy's DNS domain (`--domain`, default `<POD_NAMESPACE>.svc.cluster.local`).
    pub domain: String,
    /// Forward queries upstream before the first name table arrives instead of SERVFAIL
    /// (Istio sets it when serving `:53` as root).
    pub respond_before_sync: bool,
    /// Upper bound on queries being forwarded at once; beyond it queries get SERVFAIL.
    pub max_in_flight: usize,
    /// Upper bound on open client TCP connections; beyond it new connections are closed.
    pub max_tcp_connections: usize,
    /// Idle timeout of a client TCP connection.
    pub tcp_idle_timeout: Duration,
    /// UDP payload size advertised upstream in EDNS (Istio #61371).
    pub upstream_udp_payload: u16,
    /// The resolv.conf actually read.
    pub resolv_conf: PathBuf,
}

impl Config {
    /// Reads Istio's variables from `env` and upstreams/search domains from `resolv_conf`.
    ///
    /// `DNS_PROXY_ADDR` ending in `:53` as root sets respond-before-sync and prefers
    /// [`ISTIO_RESOLV_CONF`] when it exists; as non-root it falls back to `localhost:15053`.
    pub fn from_env(env: &HashMap<String, String>, resolv_conf: &Path) -> Result<Config, Error> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let is_root = unsafe { libc::geteuid() } == 0;
        Self::from_inputs(&Inputs {
            env,
            resolv_conf,
            is_root,
            istio_resolv_conf: Path::new(ISTIO_RESOLV_CONF),
        })
    }

    /// [`Config::from_env`] with the process facts injected.
    pub fn from_inputs(inputs: &Inputs<'_>) -> Result<Config, Error> {
        let env = inputs.env;
        let mut addr = env
            .get("DNS_PROXY_ADDR")
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| DEFAULT_PROXY_ADDR.to_string());
        let mut respond_before_sync = false;
        let mut resolv_conf = inputs.resolv_conf.to_path_buf();
        if addr.ends_with(":53") {
            if inputs.is_root {
                respond_before_sync = true;
                if inputs.istio_resolv_conf.exists() {
                    resolv_conf = inputs.istio_resolv_conf.to_path_buf();
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
            Err(e) => {
                return Err(Error::ResolvConf {
                    path: resolv_conf,
                    source: std::sync::Arc::new(e),
                });
            }
        };
        let listen_addrs = listen_addrs(&addr, &resolv.nameservers)?;
        let namespace = env.get("POD_NAMESPACE").cloned().unwrap_or_default();
        let domain = if namespace.is_empty() {
            "svc.cluster.local".to_string()
        } else {
            format!("{namespace}.svc.cluster.local")
        };
        Ok(Config {
            listen_addrs,
            upstreams: resolv.nameservers,
            search_domains: resolv.search,
            forward_timeout: parse_duration(env, "DNS_FORWARD_TIMEOUT", DEFAULT_FORWARD_TIMEOUT)?,
            forward_parallel: parse_bool(env, "DNS_FORWARD_PARALLEL", false)?,
            cache_enabled: parse_bool(env, "DNS_PROXY_CACHE", true)?,
            cache_max_entries: 10_000,
            namespace,
            domain,
            respond_before_sync,
            max_in_flight: 4096,
            max_tcp_connections: 512,
            tcp_idle_timeout: Duration::from_secs(10),
            upstream_udp_payload: 1232,
            resolv_conf,
        })
    }

    /// The domain suffix short names expand under: `domain` with its first label dropped when it
    /// is the namespace (`ns1.svc.cluster.local` → `svc.cluster.local`), as Istio.
    pub fn proxy_domain(&self) -> String {
        let domain = self.domain.trim_end_matches('.').to_ascii_lowercase();
        match domain.split_once('.') {
            Some((first, rest)) if !self.namespace.is_empty() && first == self.namespace => {
                rest.to_string()
            }
            _ => domain,
        }
    }
}

/// Process facts [`Config::from_inputs`] needs, injectable for tests.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    pub env: &'a HashMap<String, String>,
    pub resolv_conf: &'a Path,
    pub is_root: bool,
    pub istio_resolv_conf: &'a Path,
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

/// Resolves `DNS_PROXY_ADDR` into socket addresses: `localhost` becomes 127.0.0.1 when any IPv4
/// nameserver and ::1 when any IPv6 nameserver (127.0.0.1 when there are none), as Istio.
fn listen_addrs(addr: &str, nameservers: &[SocketAddr]) -> Result<Vec<SocketAddr>, Error> {
    let bad = |why: &str| Error::InvalidEnv {
        name: "DNS_PROXY_ADDR",
        value: addr.to_string(),
        expected: format!("host:port ({why})"),
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("missing port"))?;
    let port: u16 = port.parse().map_err(|_| bad("port is not a number"))?;
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
        .map_err(|_| bad("host must be localhost or an IP"))?;
    Ok(vec![SocketAddr::new(ip, port)])
}

fn parse_bool(
    env: &HashMap<String, String>,
    name: &'static str,
    default: bool,
) -> Result<bool, Error> {
    match env.get(name).map(|v| v.trim()) {
        None | Some("") => Ok(default),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "1" | "t" | "true" | "yes" | "on" => Ok(true),
            "0" | "f" | "false" | "no" | "off" => Ok(false),
            _ => Err(Error::InvalidEnv {
                name,
                value: v.to_string(),
                expected: "a boolean (true/false)".to_string(),
            }),
        },
    }
}

fn parse_duration(
    env: &HashMap<String, String>,
    name: &'static str,
    default: Duration,
) -> Result<Duration, Error> {
    match env.get(name).map(|v| v.trim()) {
        None | Some("") => Ok(default),
        Some(v) => parse_go_duration(v).ok_or_else(|| Error::InvalidEnv {
            name,
            value: v.to_string(),
            expected: "a positive Go duration such as 5s, 500ms or 1m30s".to_string(),
        }),
    }
}

/// Parses Go's `time.ParseDuration` syntax (positive values only).
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let mut rest = s;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_end);
        let value: f64 = num.parse().ok()?;
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += value * scale;
        rest = tail;
    }
    if total > 0.0 && total.is_finite() && total < 1e9 {
        Some(Duration::from_secs_f64(total))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn defaults_follow_istio() {
        let r = resolv(
            "nameserver 10.96.0.10\nsearch ns1.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n",
        );
        let c = Config::from_env(&env(&[("POD_NAMESPACE", "ns1")]), r.path()).expect("config");
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
        assert_eq!(c.domain, "ns1.svc.cluster.local");
        assert_eq!(c.proxy_domain(), "svc.cluster.local");
    }

    #[test]
    fn localhost_binds_by_nameserver_family() {
        let r = resolv("nameserver fd00::10\n");
        let c = Config::from_env(&env(&[]), r.path()).expect("config");
        assert_eq!(
            c.listen_addrs,
            vec!["[::1]:15053".parse::<SocketAddr>().unwrap()]
        );
        let r = resolv("nameserver 10.0.0.1\nnameserver fd00::10\n");
        let c = Config::from_env(&env(&[]), r.path()).expect("config");
        assert_eq!(c.listen_addrs.len(), 2);
    }

    #[test]
    fn env_overrides_and_errors_name_the_variable() {
        let r = resolv("nameserver 10.0.0.1\n");
        let c = Config::from_env(
            &env(&[
                ("DNS_FORWARD_TIMEOUT", "1500ms"),
                ("DNS_FORWARD_PARALLEL", "true"),
                ("DNS_PROXY_CACHE", "false"),
                ("DNS_PROXY_ADDR", "127.0.0.2:0"),
            ]),
            r.path(),
        )
        .expect("config");
        assert_eq!(c.forward_timeout, Duration::from_millis(1500));
        assert!(c.forward_parallel && !c.cache_enabled);
        assert_eq!(
            c.listen_addrs,
            vec!["127.0.0.2:0".parse::<SocketAddr>().unwrap()]
        );
        let e = Config::from_env(&env(&[("DNS_FORWARD_TIMEOUT", "soon")]), r.path()).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("DNS_FORWARD_TIMEOUT") && msg.contains("soon"),
            "{msg}"
        );
    }

    #[test]
    fn port_53_depends_on_root() {
        let r = resolv("nameserver 10.0.0.1\n");
        let istio = resolv("nameserver 10.0.0.2\n");
        let e = env(&[("DNS_PROXY_ADDR", "localhost:53")]);
        let inputs = Inputs {
            env: &e,
            resolv_conf: r.path(),
            is_root: false,
            istio_resolv_conf: istio.path(),
        };
        let c = Config::from_inputs(&inputs).expect("config");
        assert_eq!(c.listen_addrs[0].port(), 15053);
        assert!(!c.respond_before_sync);
        let c = Config::from_inputs(&Inputs {
            is_root: true,
            ..inputs
        })
        .expect("config");
        assert_eq!(c.listen_addrs[0].port(), 53);
        assert!(c.respond_before_sync);
        assert_eq!(c.upstreams[0].ip().to_string(), "10.0.0.2");
    }

    #[test]
    fn resolv_conf_is_parsed_leniently() {
        let r = parse_resolv_conf(
            "# c\nnameserver bogus\nnameserver 1.1.1.1 # x\ndomain a.b\nnameserver fe80::1%eth0\n",
        );
        assert_eq!(r.nameservers.len(), 2);
        assert_eq!(r.search, vec!["a.b".to_string()]);
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("-1s"), None);
        assert_eq!(parse_go_duration("0s"), None);
    }
}
