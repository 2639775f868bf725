//! Several istiod addresses for one connection: every entry of the address (Istio's one
//! `host:port`, or a comma-separated list, which Istio does not take) resolved to all its IPs
//! (A and AAAA, or a hosts entry with several), tried in order. A connection that fails or is
//! lost moves the next one to the address after it; the address in use is kept while it works.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tonic::transport::Uri;

/// A bad address, or one that resolves to nothing. Entries are named as given.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid address {entry:?}: {source} (expected host:port)")]
    Uri {
        entry: String,
        #[source]
        source: tonic::codegen::http::uri::InvalidUri,
    },
    #[error("invalid address {entry:?}: no host (expected host:port)")]
    NoHost { entry: String },
    #[error("invalid address {entry:?}: port {port:?} (expected host:port)")]
    Port { entry: String, port: String },
    #[error("no address in {address:?} (expected host:port)")]
    Empty { address: String },
    /// Every entry failed to resolve; one `entry: reason` per entry.
    #[error("cannot resolve {}", .failures.join("; "))]
    Unresolved { failures: Vec<String> },
}

/// One address to dial: the IP and port, and the list entry it came from (`https://host:port`
/// form), which stays the gRPC `:authority`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub addr: SocketAddr,
    pub origin: Uri,
}

impl Target {
    /// The URI a channel dials: the entry's scheme and the resolved IP.
    pub fn dial_uri(&self) -> String {
        let scheme = self.origin.scheme_str().unwrap_or("https");
        format!("{scheme}://{}", self.addr)
    }
}

/// The entries of an address: Istio's single `host:port` (or `http(s)://host:port`), or a
/// comma-separated list of them (surrounding spaces ignored, empty entries skipped).
pub fn address_entries(address: &str) -> Vec<&str> {
    address
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect()
}

/// An entry as a URI with a scheme (`https`, or `http` when `plaintext`) and a port (the
/// scheme's default when the entry has none, as tonic would dial it).
pub fn entry_uri(entry: &str, plaintext: bool) -> Result<Uri, Error> {
    let scheme = if plaintext { "http" } else { "https" };
    let with_scheme = if entry.contains("://") {
        entry.to_string()
    } else {
        format!("{scheme}://{entry}")
    };
    let uri: Uri = with_scheme.parse().map_err(|source| Error::Uri {
        entry: entry.into(),
        source,
    })?;
    if uri.host().is_none_or(str::is_empty) {
        return Err(Error::NoHost {
            entry: entry.into(),
        });
    }
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
    let after_host = authority.rsplit_once(']').map_or(authority, |(_, p)| p);
    if let Some((_, port)) = after_host.rsplit_once(':')
        && port.parse::<u16>().is_err()
    {
        return Err(Error::Port {
            entry: entry.into(),
            port: port.into(),
        });
    }
    Ok(uri)
}

/// The addresses of one upstream (xDS or CA) and which of them to try first. Cheap to clone;
/// clones share the position.
#[derive(Clone, Debug)]
pub struct Failover {
    origins: Arc<Vec<Uri>>,
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    /// The targets of the last resolution, in order.
    last: Vec<SocketAddr>,
    /// The target to try first (the one in use, or the one after a failed one).
    preferred: Option<SocketAddr>,
}

impl Failover {
    /// The entries of `address` (see [`address_entries`]); an error names the bad entry.
    pub fn new(address: &str, plaintext: bool) -> Result<Failover, Error> {
        let origins = address_entries(address)
            .into_iter()
            .map(|e| entry_uri(e, plaintext))
            .collect::<Result<Vec<_>, _>>()?;
        if origins.is_empty() {
            return Err(Error::Empty {
                address: address.into(),
            });
        }
        Ok(Failover {
            origins: Arc::new(origins),
            state: Arc::default(),
        })
    }

    /// More than one entry was given.
    pub(crate) fn is_list(&self) -> bool {
        self.origins.len() > 1
    }

    /// Every entry resolved to all its IPs, in entry order then resolver order (duplicates
    /// dropped), rotated so that the preferred target comes first. An entry that does not
    /// resolve is skipped (logged); the error lists every entry when none resolves.
    pub(crate) async fn targets(&self) -> Result<Vec<Target>, Error> {
        let mut out: Vec<Target> = Vec::new();
        let mut errors = Vec::new();
        for origin in self.origins.iter() {
            let host = origin.host().unwrap_or_default();
            let host = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host);
            let port = origin
                .port_u16()
                .unwrap_or(if origin.scheme_str() == Some("http") {
                    80
                } else {
                    443
                });
            match tokio::net::lookup_host((host, port)).await {
                Ok(addrs) => {
                    for addr in addrs {
                        if !out.iter().any(|t| t.addr == addr) {
                            out.push(Target {
                                addr,
                                origin: origin.clone(),
                            });
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(address = %origin, error = %e, "cannot resolve an istiod address");
                    errors.push(format!("{origin}: {e}"));
                }
            }
        }
        if out.is_empty() {
            return Err(Error::Unresolved { failures: errors });
        }
        let mut state = self.lock();
        state.last = out.iter().map(|t| t.addr).collect();
        if let Some(i) = state
            .preferred
            .and_then(|p| out.iter().position(|t| t.addr == p))
        {
            out.rotate_left(i);
        }
        Ok(out)
    }

    /// `addr` works: keep using it.
    pub(crate) fn succeeded(&self, addr: SocketAddr) {
        self.lock().preferred = Some(addr);
    }

    /// `addr` failed (could not connect, or its connection was lost or stalled): the next
    /// attempt starts with the target after it, when it was the one to try first.
    pub fn failed(&self, addr: SocketAddr) {
        let mut state = self.lock();
        if state.preferred.is_some_and(|p| p != addr) {
            return;
        }
        let next = state
            .last
            .iter()
            .position(|a| *a == addr)
            .map(|i| state.last[(i + 1) % state.last.len()]);
        state.preferred = next;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn entries_split_on_commas() {
        assert_eq!(
            address_entries("istiod.istio-system.svc:15012"),
            ["istiod.istio-system.svc:15012"]
        );
        assert_eq!(address_entries(" a:1 , [::1]:2,,"), ["a:1", "[::1]:2"]);
        assert!(address_entries(" , ").is_empty());
    }

    #[test]
    fn entry_uris_get_a_scheme_and_bad_entries_are_named() {
        assert_eq!(
            entry_uri("h:15012", false).unwrap().to_string(),
            "https://h:15012/"
        );
        assert_eq!(
            entry_uri("h:15010", true).unwrap().to_string(),
            "http://h:15010/"
        );
        assert_eq!(
            entry_uri("http://h:1", false).unwrap().scheme_str(),
            Some("http")
        );
        let e = entry_uri("h:port", false).unwrap_err().to_string();
        assert!(e.contains("\"h:port\"") && e.contains("host:port"), "{e}");
        let e = Failover::new("a:1,:2", false).unwrap_err().to_string();
        assert!(e.contains("\":2\""), "{e}");
        assert!(Failover::new(" ,", false).is_err());
    }

    #[tokio::test]
    async fn targets_keep_order_and_fail_over_past_a_failed_one() {
        let f = Failover::new("127.0.0.2:7, 127.0.0.3:7,[::1]:7,127.0.0.2:7", false).unwrap();
        assert!(f.is_list());
        let order = |t: Vec<Target>| t.into_iter().map(|t| t.addr).collect::<Vec<_>>();
        let (a, b, c) = (addr("127.0.0.2:7"), addr("127.0.0.3:7"), addr("[::1]:7"));
        assert_eq!(order(f.targets().await.unwrap()), [a, b, c]);
        // The first fails: the second is tried first from now on, and kept while it works.
        f.failed(a);
        assert_eq!(order(f.targets().await.unwrap()), [b, c, a]);
        f.succeeded(b);
        f.failed(a);
        assert_eq!(order(f.targets().await.unwrap()), [b, c, a]);
        // The last one failing wraps around.
        f.succeeded(c);
        f.failed(c);
        assert_eq!(order(f.targets().await.unwrap()), [a, b, c]);
        let t = &f.targets().await.unwrap()[0];
        assert_eq!(t.dial_uri(), "https://127.0.0.2:7");
        assert_eq!(t.origin.to_string(), "https://127.0.0.2:7/");
    }

    #[tokio::test]
    async fn a_name_resolves_to_its_ips() {
        // localhost is in every hosts file; no query leaves the machine.
        let f = Failover::new("localhost:9", false).unwrap();
        assert!(!f.is_list());
        let t = f.targets().await.unwrap();
        assert!(!t.is_empty());
        assert!(
            t.iter()
                .all(|t| t.addr.ip().is_loopback() && t.addr.port() == 9)
        );
        assert_eq!(t[0].origin.host(), Some("localhost"));
    }
}
