//! The list-valued settings, parsed once into typed lists: ports, CIDRs of each family, owner
//! groups. A port keeps the text it was given (Istio copies `80, 443` into the rules as is,
//! space included); a CIDR prints in Go's canonical form (address not masked).

use std::fmt;
use std::net::IpAddr;

use super::{Error, split};

/// One port or port range (`a:b`), as given.
#[derive(Clone, PartialEq, Eq)]
pub struct Port {
    text: String,
}

impl Port {
    /// The text the rules print.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    fn parse(item: &str) -> Option<Port> {
        let ok = |p: &str| {
            matches!(p.parse::<u16>(), Ok(n) if n > 0) && p.bytes().all(|b| b.is_ascii_digit())
        };
        let trimmed = item.trim();
        let valid = match trimmed.split_once(':') {
            Some((a, b)) => ok(a) && ok(b),
            None => ok(trimmed),
        };
        valid.then(|| Port {
            text: item.to_string(),
        })
    }
}

impl fmt::Debug for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Parses a comma-separated port list (empty items dropped).
pub(super) fn ports(source: &str, v: &str) -> Result<Vec<Port>, Error> {
    split(v)
        .into_iter()
        .map(|item| {
            Port::parse(item).ok_or_else(|| {
                Error::invalid(
                    source,
                    v,
                    "a comma-separated list of ports (1-65535) or port ranges (a:b)",
                )
            })
        })
        .collect()
}

/// The inbound ports to capture (`-b`): none (empty), every port (`*`, less the excluded
/// ones) or only the listed ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboundPorts {
    /// The flag is empty: inbound traffic is not captured.
    Off,
    All,
    /// The listed ports (the list may be empty when the text was only commas: Istio still
    /// adds the jump into `ISTIO_INBOUND`).
    Only(Vec<Port>),
}

impl InboundPorts {
    pub(super) fn parse(source: &str, v: &str) -> Result<InboundPorts, Error> {
        match v {
            "" => Ok(InboundPorts::Off),
            "*" => Ok(InboundPorts::All),
            _ => ports(source, v).map(InboundPorts::Only).map_err(|_| {
                Error::invalid(
                    source,
                    v,
                    "\"*\" or a comma-separated list of ports (1-65535) or port ranges (a:b)",
                )
            }),
        }
    }
}

/// One CIDR (Go's `netip.Prefix`: the address is kept, not masked).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub bits: u8,
}

impl Cidr {
    /// Parses a CIDR the way Go's `netip.ParsePrefix` does.
    pub fn parse(s: &str) -> Option<Cidr> {
        let (addr, bits) = s.split_once('/')?;
        if bits.is_empty() || bits.len() > 3 || !bits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        if bits.len() > 1 && bits.starts_with('0') {
            return None;
        }
        let addr: IpAddr = addr.parse().ok()?;
        let bits: u8 = bits.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (bits <= max).then_some(Cidr { addr, bits })
    }
}

impl fmt::Debug for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

/// The CIDRs of one family, or every address (`*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ranges {
    pub wildcard: bool,
    pub cidrs: Vec<Cidr>,
}

impl Ranges {
    /// Whether a loopback range is listed (then app-to-app traffic over `lo` is captured).
    pub fn has_loopback(&self) -> bool {
        self.cidrs.iter().any(|c| c.addr.is_loopback())
    }
}

/// An outbound CIDR list split by family (Istio's `SeparateV4V6`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpRanges {
    pub v4: Ranges,
    pub v6: Ranges,
}

impl IpRanges {
    pub(super) fn parse(source: &str, v: &str, allow_wildcard: bool) -> Result<IpRanges, Error> {
        if v == "*" {
            if !allow_wildcard {
                return Err(Error::invalid(
                    source,
                    v,
                    "a comma-separated list of CIDRs (the wildcard \"*\" is not allowed for exclusions)",
                ));
            }
            let all = Ranges {
                wildcard: true,
                cidrs: Vec::new(),
            };
            return Ok(IpRanges {
                v4: all.clone(),
                v6: all,
            });
        }
        let mut ranges = IpRanges::default();
        for item in split(v) {
            let cidr = Cidr::parse(item).ok_or_else(|| {
                Error::invalid(
                    source,
                    v,
                    format!(
                        "a comma-separated list of CIDRs such as 10.0.0.0/8; {item:?} is not one"
                    ),
                )
            })?;
            let family = if cidr.addr.is_ipv4() {
                &mut ranges.v4
            } else {
                &mut ranges.v6
            };
            family.cidrs.push(cidr);
        }
        Ok(ranges)
    }

    /// Whether either family lists a loopback range.
    pub fn has_loopback(&self) -> bool {
        self.v4.has_loopback() || self.v6.has_loopback()
    }
}

/// `ISTIO_OUTBOUND_OWNER_GROUPS` (include) and `..._EXCLUDE`, as Istio's `InterceptFilter`
/// reads them: include `*` means every group but the excluded ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerGroups {
    /// `None` for `*`.
    pub include: Option<Vec<String>>,
    pub exclude: Vec<String>,
}

const MAX_OWNER_GROUPS_INCLUDE: usize = 64;
const INCLUDE_VAR: &str = "ISTIO_OUTBOUND_OWNER_GROUPS";
const EXCLUDE_VAR: &str = "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE";

impl OwnerGroups {
    pub(super) fn parse(include: &str, exclude: &str) -> Result<OwnerGroups, Error> {
        let include = if include == "*" {
            None
        } else {
            let n = split(include).len();
            if n > MAX_OWNER_GROUPS_INCLUDE {
                return Err(Error::invalid(
                    INCLUDE_VAR,
                    include,
                    format!("at most {MAX_OWNER_GROUPS_INCLUDE} groups, got {n}"),
                ));
            }
            Some(group_names(INCLUDE_VAR, include)?)
        };
        // `*` passes the name check and is printed as given.
        let exclude = if exclude == "*" {
            vec![exclude.to_string()]
        } else {
            group_names(EXCLUDE_VAR, exclude)?
        };
        Ok(OwnerGroups { include, exclude })
    }
}

/// Every group in an owner-group list must be a group name or gid: they become words of
/// iptables-restore and `nft -f` input, where a space, newline, quote or `;` would add words,
/// rules or whole lines of the caller's choosing. Names follow `useradd`'s rule: letters,
/// digits, `.`, `_`, `-` (not first), an optional trailing `$`, at most 32 characters.
fn group_names(var: &str, list: &str) -> Result<Vec<String>, Error> {
    let mut out = Vec::new();
    for group in split(list) {
        let body = group.strip_suffix('$').unwrap_or(group);
        let valid = group.len() <= 32
            && !body.is_empty()
            && !body.starts_with('-')
            && body
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'));
        if !valid {
            return Err(Error::invalid(
                var,
                list,
                format!(
                    "comma-separated group names or gids (letters, digits, '.', '_', '-'; \
                     at most 32 characters); {group:?} is not one"
                ),
            ));
        }
        out.push(group.to_string());
    }
    Ok(out)
}

/// Interface names (at most 15 printable characters, no `/` or `:`).
pub(super) fn interfaces(source: &str, v: &str) -> Result<Vec<String>, Error> {
    split(v)
        .into_iter()
        .map(|item| {
            let ok = item.len() < 16
                && item
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':');
            if ok {
                Ok(item.to_string())
            } else {
                Err(Error::invalid(
                    source,
                    item,
                    "interface names (at most 15 printable characters, no '/' or ':')",
                ))
            }
        })
        .collect()
}

/// User or group ids: numbers, or names that exist on the host.
pub(super) fn ids(
    source: &str,
    v: &str,
    exists: impl Fn(&str) -> bool,
    expected: &str,
) -> Result<Vec<String>, Error> {
    split(v)
        .into_iter()
        .map(|item| {
            let numeric = item.bytes().all(|b| b.is_ascii_digit()) && item.parse::<u32>().is_ok();
            if numeric || exists(item) {
                Ok(item.to_string())
            } else {
                Err(Error::invalid(source, item, expected))
            }
        })
        .collect()
}
