//! Host state the configuration depends on: local addresses (IPv6 detection), resolv.conf
//! (DNS capture) and the user database (proxy uid). Injectable so tests present any host.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;

use super::Error;

/// Where host state comes from. `None` fields are read from the running system.
#[derive(Debug, Clone)]
pub struct HostInputs {
    /// Local interface addresses in kernel order; `None` lists them with `getifaddrs`.
    pub addresses: Option<Vec<IpAddr>>,
    /// The resolver configuration to read nameservers from (normally `/etc/resolv.conf`).
    pub resolv_conf: PathBuf,
    /// User name → uid; `None` reads `/etc/passwd` (as Istio's Go binary does, not NSS).
    pub users: Option<HashMap<String, u32>>,
    /// Group name → gid; `None` reads `/etc/group`.
    pub groups: Option<HashMap<String, u32>>,
}

impl Default for HostInputs {
    fn default() -> Self {
        Self::system()
    }
}

impl HostInputs {
    /// The running system: real interfaces, `/etc/resolv.conf`, real user database.
    pub fn system() -> Self {
        Self {
            addresses: None,
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            users: None,
            groups: None,
        }
    }

    /// Local addresses, injected or listed from the kernel.
    pub(crate) fn addresses(&self) -> Result<Vec<IpAddr>, Error> {
        match &self.addresses {
            Some(a) => Ok(a.clone()),
            None => system_addresses(),
        }
    }

    /// The uid of a user name, if it exists.
    pub(crate) fn lookup_uid(&self, name: &str) -> Option<u32> {
        match &self.users {
            Some(m) => m.get(name).copied(),
            None => super::userdb::uid(std::path::Path::new("/etc/passwd"), name),
        }
    }

    /// The gid of a group name, if it exists.
    pub(crate) fn lookup_gid(&self, name: &str) -> Option<u32> {
        match &self.groups {
            Some(m) => m.get(name).copied(),
            None => super::userdb::gid(std::path::Path::new("/etc/group"), name),
        }
    }
}

/// The addresses of this network namespace's interfaces, in the kernel's order (its address
/// dump lists IPv4 addresses before IPv6 ones, each by interface index).
pub fn system_addresses() -> Result<Vec<IpAddr>, Error> {
    // One address dump over netlink; getifaddrs (which also dumps every link) when it fails.
    if let Some(addrs) = crate::netlink::addresses() {
        return Ok(addrs);
    }
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| Error::Addresses(e.to_string()))?;
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for ifa in addrs {
        let Some(addr) = ifa.address else { continue };
        if let Some(sin) = addr.as_sockaddr_in() {
            v4.push(IpAddr::V4(sin.ip()));
        } else if let Some(sin6) = addr.as_sockaddr_in6() {
            v6.push(IpAddr::V6(sin6.ip()));
        }
    }
    v4.extend(v6);
    Ok(v4)
}

fn is_link_local_multicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.octets()[..3] == [224, 0, 0],
        IpAddr::V6(a) => a.segments()[0] & 0xff0f == 0xff02,
    }
}

fn is_link_local_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => a.segments()[0] & 0xffc0 == 0xfe80,
    }
}

fn unmap(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(a) => a.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// Istio's detection: skip loopback and link-local addresses; the first remaining address
/// decides (IPv6 on if it is IPv6). With `dual_stack`, IPv6 is on if any remaining address is
/// IPv6. Returns the chosen host address and whether IPv6 is enabled.
pub fn detect_ipv6(addrs: &[IpAddr], dual_stack: bool) -> Result<(IpAddr, bool), Error> {
    let mut first: Option<IpAddr> = None;
    let mut ipv6 = false;
    for &a in addrs {
        let a = unmap(a);
        if a.is_loopback() || is_link_local_unicast(a) || is_link_local_multicast(a) {
            continue;
        }
        ipv6 = a.is_ipv6();
        if !dual_stack {
            return Ok((a, ipv6));
        }
        first.get_or_insert(a);
        if ipv6 {
            break;
        }
    }
    first.map(|a| (a, ipv6)).ok_or(Error::NoLocalIp)
}

/// Nameservers from resolv.conf text, split into IPv4 and IPv6 and written in canonical form.
/// Unparsable entries are skipped.
pub fn parse_resolv_conf(text: &str) -> (Vec<String>, Vec<String>) {
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        if fields.next() != Some("nameserver") {
            continue;
        }
        let Some(server) = fields.next() else {
            continue;
        };
        match server.parse::<IpAddr>() {
            Ok(IpAddr::V4(a)) => v4.push(a.to_string()),
            Ok(IpAddr::V6(a)) => v6.push(a.to_string()),
            Err(_) => tracing::debug!(server, "ignoring unparsable nameserver"),
        }
    }
    (v4, v6)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(s: &[&str]) -> Vec<IpAddr> {
        s.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn first_usable_address_decides() {
        let a = ips(&["127.0.0.1", "169.254.1.1", "10.0.0.1", "::1", "2001:db8::1"]);
        assert!(!detect_ipv6(&a, false).unwrap().1);
        let a = ips(&["127.0.0.1", "::1", "fe80::1", "2001:db8::240"]);
        assert_eq!(
            detect_ipv6(&a, false).unwrap(),
            ("2001:db8::240".parse().unwrap(), true)
        );
    }

    #[test]
    fn dual_stack_turns_ipv6_on_if_any() {
        let a = ips(&["10.0.0.1", "2001:db8::1"]);
        let (ip, v6) = detect_ipv6(&a, true).unwrap();
        assert_eq!(ip, "10.0.0.1".parse::<IpAddr>().unwrap());
        assert!(v6);
        assert!(!detect_ipv6(&ips(&["10.0.0.1"]), true).unwrap().1);
    }

    #[test]
    fn no_address_is_an_error() {
        let e = detect_ipv6(&ips(&["127.0.0.1", "::1", "fe80::2"]), false).unwrap_err();
        assert_eq!(e.to_string(), "no valid local IP address found");
    }

    #[test]
    fn resolv_conf_canonical_and_split() {
        let (v4, v6) = parse_resolv_conf(
            "# c\nsearch x\nnameserver 127.0.0.53\nnameserver ::127.0.0.53\nnameserver bogus\nnameserver\n",
        );
        assert_eq!(v4, ["127.0.0.53"]);
        assert_eq!(v6, ["::7f00:35"]);
    }
}
